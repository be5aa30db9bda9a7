"""One direct link between two nodes, and what the links need of their
node (``LinkHost``): the narrow interface through which semq.node.daemon.direct
and semq.node.daemon.listener reach the daemon — and all they may use of it.

A link's frames are read by the session layer (semq.session.reader), both
directions alike (``read_link``): every frame must come from the peer the
link is with (``SOURCE_MISMATCH`` otherwise, and the link closes), the
documents and acks are handled as from the platform in one transaction
per batch (``LinkHost.absorb(direct=peer)``), and the answers go back on
the link."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from semq.session.ports import FramePort
from semq.session.reader import SessionReader, first_exception
from semq.session.transport import FrameStream
from semq.tracking.events import now_ms
from semq.umxt_protocol import Endpoint, RawFrame, RemoteProtocolError, ResultCode

from .watch import StoreWatch

if TYPE_CHECKING:
    from semq.identity.security import NodeSecurity

    from ..batch import Output

__all__ = ["WILDCARDS", "Link", "LinkHost", "LinkRefused", "LinkSettings", "close_stream", "read_link", "why"]

log = logging.getLogger("semq.node.direct")

WILDCARDS: Final = ("0.0.0.0", "::", "")  # a listening host that is every address


class LinkSettings(Protocol):
    """The node's settings a link reads (live: a reload changes ``window``)."""

    window: int  # documents in flight on a link without their answer (and our HELLO's window)
    batch: int  # rows claimed per transaction
    poll_interval: float  # s between looks at the pending-send table when idle
    ping_interval: float  # s between the dialler's PINGs


class LinkHost(Protocol):
    """What the direct links need of the node daemon that runs them
    (semq.node.daemon.node.NodeDaemon), and nothing more."""

    @property
    def me(self) -> Endpoint:
        """This node."""

    @property
    def sec(self) -> NodeSecurity | None:
        """Its keys, CA, pins and the certificates held (None: security off,
        no links). Read live: a reload replaces it."""

    @property
    def s(self) -> LinkSettings: ...

    @property
    def draining(self) -> bool:
        """``semq admin drain``: claim nothing new."""

    @property
    def watch(self) -> StoreWatch:
        """The daemon's look at its store (one for every sender)."""

    async def absorb(self, msgs: list[RawFrame], direct: Endpoint | None = None) -> Output:
        """Apply a batch of message frames that came on the link with
        ``direct`` in one transaction; the answers are in ``out.data``."""

    async def claim_for(self, target: str, limit: int, port: FramePort) -> Output:
        """Claim up to ``limit`` documents to ``target`` (one transaction),
        their DATA handed to ``port`` before the commit."""

    async def send_again(self, ids: Collection[int]) -> int:
        """Documents sent on a link that broke before their answer: sent
        again on whichever path is up. Returns how many."""

    async def pending_targets(self) -> set[str]:
        """Organizations our waiting documents go to."""

    async def ask_platform(self, missing: set[Endpoint]) -> None:
        """Ask the platform for these organizations' certificates (when a
        platform session is up)."""

    async def look_up(self, org: str) -> bool:
        """Ask the platform where ``org`` listens (PEER_LOOKUP; the answer
        comes to ``DirectLinks.on_info``). False: no platform session."""

    def sent_direct(self, n: int) -> None:
        """Count ``n`` documents sent on a link."""

    def wake(self) -> None:
        """Something changed for the senders (a link up or down)."""


class LinkRefused(Exception):
    """A direct link that must not be used (the wrong organization, an
    untrusted certificate, refused by the listener): one line saying why."""


@dataclass
class Link:
    """One direct link, for ``semq status``."""

    peer: str
    direction: str  # "out" (we dial, our documents go) or "in" (it dialled us)
    address: str
    state: str = "connecting"
    since_ms: int = field(default_factory=now_ms)
    sent: int = 0
    received: int = 0
    error: str = ""
    window: int = 0
    in_flight: int = 0
    ids: set[int] = field(default_factory=set)  # our documents sent on it, no answer yet
    wake: trio.Event = field(default_factory=trio.Event)

    def view(self) -> dict[str, Any]:
        return {"peer": self.peer, "direction": self.direction, "address": self.address, "state": self.state,
                "since_ms": self.since_ms, "sent": self.sent, "received": self.received, "error": self.error,
                "in_flight": self.in_flight}


async def read_link(host: LinkHost, link: Link, peer: Endpoint, fs: FrameStream, first: list[RawFrame],
                    idle: float) -> None:
    """Frames from the peer of a link (either direction), read by the
    session layer (module docstring). Ends as its reader does: by the
    exception that ended the link."""
    me = host.me

    async def only_from_peer(batch: list[RawFrame]) -> list[RawFrame]:
        for raw in batch:
            if raw.source != peer or raw.origin != peer:
                e = RemoteProtocolError(f"{raw.kind.name} claims source {raw.source} / origin {raw.origin}"
                                        f" on the direct link of {peer}", ResultCode.SOURCE_MISMATCH)
                log.warning("direct link of %s closed: %s", peer, e)
                await fs.send_error(me, peer, e.code, str(e))
                raise e
        return batch

    async def messages(msgs: list[RawFrame]) -> None:
        link.received += len(msgs)
        out = await host.absorb(msgs, peer)
        if out.missing:  # (a certificate to verify an origin's signature)
            await host.ask_platform(out.missing)
        if out.settled_ids:
            link.ids.difference_update(out.settled_ids)
            link.in_flight = max(0, link.in_flight - out.settled)
            link.wake.set()
        await fs.send(b"".join(out.data))

    reader = SessionReader(fs, me=me, peer=peer, name=str(peer), messages=messages, screen=only_from_peer,
                           idle=idle, log=log)
    await reader.run(first)


def why(exc: BaseException) -> str:
    """What a link's error says: the first exception inside (nested)
    exception groups, not "Exceptions from Trio nursery"; its type when it
    has no message."""
    exc = first_exception(exc)
    return str(exc) or type(exc).__name__


async def close_stream(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
