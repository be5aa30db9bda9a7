"""What ``semq report latency`` was asked: :class:`ReportOptions`.

A module of its own, below every job of the report: :mod:`.latency` runs
the jobs with it and :mod:`.legs` and :mod:`.aggregates` read it, so it
cannot live in any of them without an import loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ReportOptions"]


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """What `semq report latency` was asked."""

    since_ms: int | None = None
    until_ms: int | None = None
    stuck_after_ms: int = 3_600_000
    progress: Callable[[str], None] = lambda _msg: None
    # Also collect the per-message table ("messages": legs, outcome, place of
    # every message). For tests and small logs: it brings every row to the driver.
    with_messages: bool = False
