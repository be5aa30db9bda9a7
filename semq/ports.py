"""What the daemons need of the operations layer (semq.ops), as protocols.

The daemons sit below ops (ops starts them, reads their state and drives
them); they know ops only through these narrow interfaces, which the ops
objects satisfy structurally (semq.ops.admin.DrainControl,
semq.ops.metrics.Metrics). tests/test_layering.py keeps it so."""

from __future__ import annotations

from typing import Protocol

__all__ = ["BatchObserver", "DrainSignal"]


class DrainSignal(Protocol):
    """``semq admin drain``: once requested, a daemon takes no new work."""

    @property
    def requested(self) -> bool: ...


class BatchObserver(Protocol):
    """Metrics of the daemon's store transactions."""

    def observe_batch(self, size: int, seconds: float) -> None: ...
