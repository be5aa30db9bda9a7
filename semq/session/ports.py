"""The narrow interfaces between layers, as protocols: what the daemons
need of the operations layer (semq.ops), and the one way frames leave a
core's store thread for the wire (``FramePort`` for a node's documents,
``RelayPort`` for the frames a relay forwards).

The daemons sit below ops (ops starts them, reads their state and drives
them); they know ops only through these narrow interfaces, which the ops
objects satisfy structurally (semq.ops.admin.DrainControl,
semq.ops.metrics.Metrics). tests/test_layering.py keeps it so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from semq.umxt_protocol import Endpoint

__all__ = ["BatchObserver", "DrainSignal", "FramePort", "InboxSignal", "RelayPort"]


class DrainSignal(Protocol):
    """``semq admin drain``: once requested, a daemon takes no new work."""

    @property
    def requested(self) -> bool: ...


class BatchObserver(Protocol):
    """Metrics of the daemon's store transactions."""

    def observe_batch(self, size: int, seconds: float) -> None: ...


class InboxSignal(Protocol):
    """Told by a node daemon, on its trio thread, each time a commit put
    documents into its inbox (after the commit: durable before announced);
    semq.ops.waiters answers the clients waiting for them."""

    def arrived(self) -> None: ...


class FramePort(Protocol):
    """Where a core, on the store thread, hands encoded frames that may
    leave before its transaction commits (they promise nothing: documents,
    never acks). The daemon's implementation passes them to its trio side
    as data; the core holds no nursery and no daemon closure."""

    def put(self, frames: list[bytes]) -> None: ...


class RelayPort(Protocol):
    """Where a relay core puts the frames for online targets before its
    commit: documents and relayed frames, which promise nothing on its side
    (the acks that do wait for the commit). Called on the store thread;
    must not block on the event loop."""

    def put(self, frames: Mapping[Endpoint, list[bytes]]) -> None: ...
