"""What the platform core's roles share for one call: who is online
(``Room``, a snapshot taken on the event loop), what the call produced
(``PlatformOutput``) and its working state (``PlatformBatch``), made by the
facade (semq.platform.core) for one transaction and dropped after it; and
the event records the roles write the same way."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from semq.umxt_protocol import (
    FLAG_KEY_SEALED,
    LK0,
    AckEntry,
    Endpoint,
    Frame,
    Kind,
    RawFrame,
    ResultCode,
    encode_frame,
)

__all__ = ["Events", "PlatformBatch", "PlatformOutput", "Room", "event", "reach", "received"]

Room = Mapping[Endpoint, int]
"""Which targets are online, as data: for each connected target, the bytes
its outgoing queue may still take before its high-water mark (zero or less:
full, so offline for routing: flow control stores, never buffers). A target
absent is offline. The daemon takes it on the event loop just before a store
call; ``handle`` subtracts what its own batch forwards."""

Events = list[dict[str, Any]]


@dataclass
class PlatformOutput:
    """What a call produced: frames to send (after the commit, which has
    happened when the call returns) and what the daemon does next."""

    sends: dict[Endpoint, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    errors: list[tuple[ResultCode, str]] = field(default_factory=list)
    stored_for: set[Endpoint] = field(default_factory=set)  # targets with new stored copies
    credit: dict[Endpoint, int] = field(default_factory=lambda: defaultdict(int))  # acked deliveries
    # Stored copies a node refused with OVER_WINDOW (seed 004): deliver slower.
    over_window: dict[Endpoint, int] = field(default_factory=lambda: defaultdict(int))
    # Bytes forwarded to each target so far in this batch: an ``online`` check
    # may add them to the target's queue (the high-water mark bounds the
    # queue plus what this batch is about to put in it).
    forward_bytes: dict[Endpoint, int] = field(default_factory=lambda: defaultdict(int))
    # Documents and relayed frames for online targets. They promise nothing
    # on our side (no ack depends on them), so they may leave before the
    # batch's commit (``handle(forward=...)``); otherwise they join ``sends``.
    forwards: dict[Endpoint, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    # Frames for targets held by another instance (PostgreSQL store), by
    # instance: handed over one hop at the batch's commit (semq.platform.cluster).
    hops: dict[str, list[tuple[Endpoint, bytes]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, target: Endpoint, frame: Frame) -> None:
        self.sends[target].append(encode_frame(frame))


def reach(room: Room, forwarded: Mapping[Endpoint, int]) -> Callable[[Endpoint], bool]:
    """``online`` over a snapshot, for one call on the store thread: a
    target with room left after what the call forwarded to it so far."""
    get, sent = room.get, forwarded.get

    def online(ep: Endpoint) -> bool:
        r = get(ep)
        return r is not None and sent(ep, 0) < r
    return online


@dataclass
class PlatformBatch:
    """One call's working state, in one transaction: its time, its output,
    who is online, the event records and the acks to send after the commit
    (per kind and peer: ACK_FWD and ACK_SAVE to origins, REACK to targets)."""

    ts: int
    out: PlatformOutput
    online: Callable[[Endpoint], bool]
    events: Events = field(default_factory=list)
    acks: defaultdict[tuple[Kind, Endpoint], list[AckEntry]] = field(default_factory=lambda: defaultdict(list))


def event(raw: RawFrame, lk0: LK0, ts: int, name: str, **extra: Any) -> dict[str, Any]:
    """An event record about the document ``lk0`` of ``raw`` (docs/events.md)."""
    return {"ts": ts, "event": name, "lk0": str(lk0), "source": lk0.endpoint.node_id,
            "target": raw.target.node_id, **extra}


_APP_KEY_FIELDS: Final = ("domain", "data_type", "subtype", "key")
_NO_APP_KEY: Final = ("", "", "", "")


def received(raw: RawFrame, lk0_text: str, source: str, target: str, created: int, ts: int) -> dict[str, Any]:
    """The ``received`` event: with the message's attributes, logged once (docs/events.md)."""
    ak = raw.app_key_parts()
    domain, data_type, subtype, key = ak or _NO_APP_KEY
    ev = {"ts": ts, "event": "received", "lk0": lk0_text, "source": source, "target": target,
          "save_fwd": raw.save_fwd, "ack2": raw.ack2, "reliable": raw.reliable,
          "priority": raw.priority, "created_ms": created, "size": len(raw.raw),
          "domain": domain, "data_type": data_type, "subtype": subtype, "key": key}
    if ak is None or raw.flags & FLAG_KEY_SEALED:
        # A body too short to hold its AppKey, or (the default) one whose
        # AppKey is sealed inside: logged without one (a del never resizes).
        for name in _APP_KEY_FIELDS:
            del ev[name]
    return ev
