"""The narrow interfaces between layers, as protocols: what the daemons
need of the operations layer (semq.ops), and the one way frames leave a
core's store thread for the wire (``FramePort``).

The daemons sit below ops (ops starts them, reads their state and drives
them); they know ops only through these narrow interfaces, which the ops
objects satisfy structurally (semq.ops.admin.DrainControl,
semq.ops.metrics.Metrics). tests/test_layering.py keeps it so."""

from __future__ import annotations

from typing import Protocol

__all__ = ["BatchObserver", "DrainSignal", "FramePort"]


class DrainSignal(Protocol):
    """``semq admin drain``: once requested, a daemon takes no new work."""

    @property
    def requested(self) -> bool: ...


class BatchObserver(Protocol):
    """Metrics of the daemon's store transactions."""

    def observe_batch(self, size: int, seconds: float) -> None: ...


class FramePort(Protocol):
    """Where a core, on the store thread, hands encoded frames that may
    leave before its transaction commits (they promise nothing: documents,
    never acks). The daemon's implementation passes them to its trio side
    as data; the core holds no nursery and no daemon closure."""

    def put(self, frames: list[bytes]) -> None: ...
