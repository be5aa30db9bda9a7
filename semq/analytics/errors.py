"""The one error type the analytics commands show to the user as `error: ...`."""

from __future__ import annotations

__all__ = ["ReportError"]


class ReportError(Exception):
    """A mistake in what the user asked for or gave us (no logs, bad time, no Java).

    The CLI prints its message as one line and exits 2; anything else is a bug
    and keeps its traceback.
    """
