"""Direct links between nodes, with the platform as directory and fallback.

A node may listen (``direct_listen``). It announces where over its platform
connection (PEER_ANNOUNCE, renewed within its lifetime), and the platform
tells an origin that asks (PEER_LOOKUP, PEER_INFO) if the target allows it.
The origin then dials the target with mutual TLS, both sides presenting the
certificates the platform CA issued them, and speaks UMX-T as to the
platform: HELLO, WELCOME, DATA, acks. What each side checks:

- the listener: the dialler's certificate verifies against the CA and the
  revocation list held, it names the organization the HELLO claims, the
  organization is allowed (``direct_from``), and every frame on the link
  comes from it (SOURCE_MISMATCH otherwise);
- the dialler: the listener's certificate names the organization it meant
  to reach and is one this node already holds and trusts for it (the
  certificates its documents are sealed to): a relay that lied about the
  address gets a connection that fails, never a document.

Same frames, same states, same tables. The receiver answers every reliable
document that came over a direct link with ACK2 (on a direct link the
end-to-end acknowledgement is also the transport's, seed 2.2), and that
ACK2 gets no REACK2 (``NodeCore.handle(direct=...)``). Documents sent on a
link that breaks before their ACK2 go back to SS_INIT and are sent again on
whichever path is up; the receiver's duplicate suppression keeps the
application's view exactly once. SaveFwd 1 ones are written forwarded
(SS_ACK_FWD) when claimed for a link, and confirmed with the target by
inquiry, as after a relay's forward (``Origin.claim``). A
link that cannot be made in ``timeout`` (2 s) is tried again after
``retry`` s, doubling up to ``retry_max``; meanwhile documents go through
the platform (policy ``prefer``), or wait (``only``). Links carry
documents one way: from the dialler; the listener answers on them. A
node sends its own documents to a node that dialled it over a link of its
own, if that one listens.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from semq.identity.crypto import CryptoError, peer_certificate
from semq.session.admission import Admission, raise_descriptor_limit
from semq.session.early import EarlySends
from semq.session.reader import SessionReader, ping_every
from semq.session.transport import ByteBudget, ConnectionClosed, FrameStream
from semq.settings.bounds import (
    DIRECT_HANDSHAKES,
    DIRECT_HELLO_S,
    DIRECT_MAX_LINKS,
    DIRECT_MAX_LINKS_PER_ORG,
    DIRECT_PRE_AUTH_BYTES,
    FD_RESERVE,
    PLATFORM_BUFFER_MIB_PER_ORG,
)
from semq.settings.config import Address, parse_hostport
from semq.store.db import STORE_ERRORS
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    Endpoint,
    Error,
    Frame,
    Hello,
    Kind,
    PeerAnnounce,
    PeerInfo,
    PeerLookup,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    Welcome,
    encode_frame,
)

if TYPE_CHECKING:
    from .node import NodeDaemon

__all__ = ["DirectLinks", "DirectSettings", "LinkRefused"]

log = logging.getLogger("semq.node.direct")

_WILDCARDS = ("0.0.0.0", "::", "")


@dataclass
class DirectSettings:
    policy: str = "prefer"  # prefer | never | only
    listen: Address | None = None  # None: no listener
    announce: list[str] = field(default_factory=list)  # addresses to announce; [] = the listening one
    allowed: tuple[str, ...] = ()  # organizations that may connect; () = all
    timeout: float = 2.0  # s for a look-up, or a connection up to WELCOME
    retry: float = 10.0  # s before a target is tried again after a failure; doubles
    retry_max: float = 120.0
    steady_after: float = 5.0  # a link up this long was steady: after it breaks, tried again at once
    announce_ttl: int = 300  # s an announcement lives at the platform; renewed at a third of it
    idle_timeout: float = 45.0  # s without a frame before a link is given up (the dialler pings)
    idle_close: float = 600.0  # s without a document to send before a link we dialled is closed
    # The listener's bounds (semq.settings.bounds): links in all, links of one
    # organization, links not authenticated yet, the time to authenticate,
    # descriptors kept for the node's own use, and the bytes one
    # organization's links may buffer together.
    max_links: int = DIRECT_MAX_LINKS
    max_links_per_org: int = DIRECT_MAX_LINKS_PER_ORG
    handshakes: int = DIRECT_HANDSHAKES
    hello_timeout: float = DIRECT_HELLO_S
    fd_reserve: int = FD_RESERVE
    max_buffer_per_org: int = PLATFORM_BUFFER_MIB_PER_ORG << 20


class _Idle(Exception):
    """A link we dialled has had nothing to carry for a while: closed."""


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


class DirectLinks:
    """The direct links of one node daemon: its listener, its announcement,
    the links it dials to the targets of its documents, and the links
    others dialled."""

    def __init__(self, daemon: NodeDaemon, settings: DirectSettings) -> None:
        self.d = daemon
        self.s = settings
        self.out: dict[str, Link] = {}  # target -> the link we dial (or try to)
        self.inbound: list[Link] = []
        self.failed: dict[str, tuple[float, float, str]] = {}  # target -> (retry at, delay, why)
        self.wanted: set[str] = set()  # targets our documents went to (prefer) or wait for (only)
        self.info: dict[str, PeerInfo] = {}
        self._answers: dict[str, trio.Event] = {}
        self.bound: Address | None = None  # where the listener listens (its port when 0 was asked)
        self._poke = trio.Event()
        self._manager_wake = trio.Event()
        self.stats = {"links_out": 0, "links_in": 0, "refused_in": 0, "failed_out": 0, "sent_again": 0}
        # Who may hold a link to our listener (semq.session.admission), and the bytes
        # each organization's links buffer together.
        self.admission = Admission("direct-link listener", total=settings.max_links,
                                   handshakes=settings.handshakes, per_identity=lambda _org: self.s.max_links_per_org,
                                   reserve=settings.fd_reserve)
        self.budgets: dict[str, ByteBudget] = {}
        self._contexts: tuple[Any, Any] | None = None
        self._watch: sqlite3.Connection | None = None  # read-only, for PRAGMA data_version (_store_version)
        self._watch_off = False  # watching is off, or the store cannot be opened read-only

    # ------------------------------------------------------------ for the daemon

    @property
    def enabled(self) -> bool:
        """Direct links need the node's certificate (mutual TLS)."""
        return self.d.core.sec is not None

    def up_targets(self) -> frozenset[str]:
        """Targets with a direct link up: the platform path leaves their documents to it."""
        return frozenset(t for t, link in self.out.items() if link.state == "up")

    def consider(self, targets: set[str]) -> None:
        """Targets our documents just went to (through the platform): worth a direct link."""
        if self.s.policy == "never" or not self.enabled:
            return
        new = targets - self.wanted
        if new:
            self.wanted |= new
            self._manager_wake.set()

    def poke(self) -> None:
        """Something changed (new documents, acks): the link senders look again."""
        self._poke.set()
        for link in self.out.values():
            link.wake.set()

    def settled(self, ids: list[int]) -> int:
        """Answers that came through the platform for documents sent on our
        links (a receiver that had to ask for our certificate answers them
        there): their window credit goes back to their link, not to the
        platform's. Returns how many were the links'."""
        n = 0
        for link in self.out.values():
            mine = link.ids.intersection(ids)
            if mine:
                link.ids -= mine
                link.in_flight = max(0, link.in_flight - len(mine))
                link.wake.set()
                n += len(mine)
        return n

    def on_info(self, info: PeerInfo) -> None:
        org = info.endpoint.node_id
        self.info[org] = info
        ev = self._answers.pop(org, None)
        if ev is not None:
            ev.set()

    def announcement(self) -> bytes | None:
        """The PEER_ANNOUNCE for a platform session (None: not listening)."""
        if self.bound is None:
            return None
        addresses = list(self.s.announce)
        observe = not addresses or self.bound.host in _WILDCARDS
        if not addresses and self.bound.host not in _WILDCARDS:
            addresses = [str(self.bound)]
        if not addresses:
            addresses = [f"0.0.0.0:{self.bound.port}"]  # the platform fills in the host it sees
        me = self.d.core.me
        return encode_frame(Frame(kind=Kind.PEER_ANNOUNCE, source=me, target=self.d.core.platform,
                                  body=PeerAnnounce(ttl_s=self.s.announce_ttl, addresses=tuple(addresses),
                                                    observe=observe, allowed=self.s.allowed)))

    def snapshot(self) -> dict[str, Any]:
        try:
            now = trio.current_time()
        except RuntimeError:  # (outside the daemon's run)
            now = 0.0
        return {
            "policy": self.s.policy,
            "listening": str(self.bound) if self.bound else None,
            "links": [link.view() for link in [*self.out.values(), *self.inbound]],
            "waiting": {t: {"retry_in_s": round(max(0.0, at - now), 1), "why": why}
                        for t, (at, _, why) in self.failed.items() if t not in self.up_targets()},
            "listener": self.admission.snapshot() if self.bound else None,
            **self.stats,
        }

    # ------------------------------------------------------------ running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            task_status.started()
            await trio.sleep_forever()
        try:
            async with trio.open_nursery() as nursery:
                if self.s.listen is not None:
                    await nursery.start(self._listen)
                task_status.started()
                if self.s.policy != "never":
                    nursery.start_soon(self._manager, nursery)
                    if self.s.policy == "only":
                        nursery.start_soon(self._discover)
        finally:
            if self._watch is not None:
                self._watch.close()
                self._watch = None

    def _tls(self) -> tuple[Any, Any]:
        if self._contexts is None:
            sec = self.d.core.sec
            assert sec is not None
            self._contexts = sec.direct_contexts()
        return self._contexts

    async def _manager(self, nursery: trio.Nursery) -> None:
        """Dial every wanted target that has no link and is not waiting to be tried again."""
        while True:
            now = trio.current_time()
            for target in sorted(self.wanted):
                if target in self.out:
                    continue
                if target in self.failed and self.failed[target][0] > now:
                    continue
                self.out[target] = Link(target, "out", "")
                nursery.start_soon(self._dial, target)
            self._manager_wake = trio.Event()
            with trio.move_on_after(0.5):
                await self._manager_wake.wait()

    async def _discover(self) -> None:
        """Policy ``only``: the platform path takes nothing, so the targets
        waiting for a link are read from the store."""
        while True:
            try:
                targets = await self.d.gate.run(self.d.core.pending_targets)
            except STORE_ERRORS as e:
                log.error("store error while looking for documents to send directly: %s", e)
                targets = set()
            self.consider(targets)
            await trio.sleep(max(1.0, self.s.retry / 4))

    def _fail(self, target: str, why: str, *, steady: bool = False) -> None:
        _, delay, _ = self.failed.get(target, (0.0, self.s.retry / 2, ""))
        delay = 1.0 if steady else min(self.s.retry_max, delay * 2)
        self.failed[target] = (trio.current_time() + delay, delay, why)
        link = self.out.pop(target, None)
        if link is not None:
            link.state = "down"
        self._manager_wake.set()

    async def _lookup(self, target: str) -> PeerInfo | None:
        """Where ``target`` listens: from the platform (asked now when
        connected, else what it said before, while it holds)."""
        fs = self.d.platform_fs
        if fs is not None:
            ev = self._answers.setdefault(target, trio.Event())
            me = self.d.core.me
            try:
                await fs.send(encode_frame(Frame(kind=Kind.PEER_LOOKUP, source=me, target=self.d.core.platform,
                                                 body=PeerLookup(endpoint=Endpoint.org(target)))))
            except ConnectionClosed:
                pass
            else:
                with trio.move_on_after(self.s.timeout):
                    await ev.wait()
        info = self.info.get(target)
        if info is not None and info.code is ResultCode.OK and info.expires_ms <= now_ms():
            return None
        return info

    async def _dial(self, target: str) -> None:
        link = self.out[target]
        up_at: float | None = None
        idle = False
        why = "no address"
        try:
            info = await self._lookup(target)
            if info is None:
                why = "the platform did not say where it listens (not connected, or no answer)"
                return
            if info.code is not ResultCode.OK:
                why = {ResultCode.NO_DIRECT_ADDRESS: "it does not listen for direct links",
                       ResultCode.DIRECT_NOT_ALLOWED: "it does not accept direct links from us",
                       ResultCode.UNKNOWN_TARGET: "the platform does not know it"}.get(
                    info.code, f"look-up answered {info.code.name}")
                return
            sec = self.d.core.sec
            assert sec is not None
            if not sec.certs(target):
                # Asked for here: with policy only (or documents that never
                # went through the platform) no claim has asked for it.
                await self.d.ask_platform({Endpoint.org(target)})
                with trio.move_on_after(self.s.timeout):
                    while not sec.certs(target):
                        await trio.sleep(0.05)
            if not sec.certs(target):
                why = "no certificate of it held yet"
                return
            errors = []
            for address in info.addresses:
                link.address = address
                try:
                    fs, rest, window = await self._connect(address, target)
                except (OSError, ConnectionClosed, trio.TooSlowError, LinkRefused, CryptoError,
                        RemoteProtocolError, trio.BrokenResourceError, ValueError) as e:
                    text = "no answer in time" if isinstance(e, trio.TooSlowError) else str(e) or type(e).__name__
                    errors.append(f"{address}: {text}")
                    if isinstance(e, LinkRefused):
                        log.warning("direct link to %s at %s refused: %s", target, address, e)
                    continue
                up_at = trio.current_time()
                self.failed.pop(target, None)
                self.stats["links_out"] += 1
                link.state, link.since_ms, link.window, link.error = "up", now_ms(), window, ""
                log.info("direct link to %s at %s up", target, address)
                self.d.wake()
                try:
                    await self._outbound(link, fs, rest)
                except* (ConnectionClosed, OSError, trio.BrokenResourceError) as eg:
                    why = f"the link broke: {_why(eg)}"
                except* RemoteProtocolError as eg:
                    why = f"protocol error: {_why(eg)}"
                except* trio.TooSlowError:
                    why = f"nothing heard for {self.s.idle_timeout:.0f} s"
                except* _Idle as eg:
                    why = f"closed, {_why(eg)}"
                    idle = True
                else:
                    why = "the link closed"
                finally:
                    await fs.aclose()
                return
            why = "; ".join(errors) or "no address announced"
        finally:
            link.state = "down"
            link.error = why
            ids, link.ids = link.ids, set()
            steady = up_at is not None and trio.current_time() - up_at >= self.s.steady_after
            if up_at is None:
                self.stats["failed_out"] += 1
            if idle:
                self.out.pop(target, None)
                self.failed.pop(target, None)
            else:
                self._fail(target, why, steady=steady)
            if ids:
                with trio.CancelScope(shield=True):
                    try:
                        n = await self.d.gate.run(self.d.core.send_again, ids)
                    except STORE_ERRORS as e:  # they stay SS_SENT: their inquiries bring them again
                        log.error("store error after the direct link to %s broke: %s", target, e)
                        n = 0
                self.stats["sent_again"] += n
            if up_at is not None:
                log.info("direct link to %s down (%s); %d document(s) in flight go again, through the"
                         " platform until it is back", target, why, len(ids))
            else:
                log.info("no direct link to %s: %s; documents go through the platform%s", target, why,
                         "" if self.s.policy == "prefer" else " (policy: they wait)")
            self.d.wake()

    async def _connect(self, address: str, target: str) -> tuple[FrameStream, list[RawFrame], int]:
        host, port = parse_hostport(address)
        _, client = self._tls()
        sec = self.d.core.sec
        assert sec is not None
        me = self.d.core.me
        with trio.fail_after(self.s.timeout):
            stream = await trio.open_tcp_stream(host, port)
            tls = trio.SSLStream(stream, client, server_hostname=None)
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as e:
                await stream.aclose()
                raise OSError(f"TLS handshake failed: {e.__cause__ or e}") from e
            fs = FrameStream(tls)
            try:
                cert = peer_certificate(tls.getpeercert(binary_form=True), ca=sec.ca, crl=sec.directory.crl)
                if cert.org != target:
                    raise LinkRefused(f"the listener presented organization {cert.org}'s certificate, not {target}'s")
                if cert.fingerprint not in {c.fingerprint for c in sec.certs(target)}:
                    raise LinkRefused(f"the listener's certificate {cert.fingerprint[:16]}... is not one this node"
                                      f" holds for {target}")
                await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=me, target=Endpoint.org(target),
                                                 body=Hello(window=self.d.s.window, software="semq-node"))))
                first = await fs.receive_batch()
            except BaseException:
                await fs.aclose()
                raise
        welcome = first[0]
        if welcome.kind is Kind.ERROR:
            err = welcome.frame().body
            assert isinstance(err, Error)
            await fs.aclose()
            raise LinkRefused(f"{err.code.name}: {err.message}")
        if welcome.kind is not Kind.WELCOME or welcome.source != Endpoint.org(target):
            await fs.aclose()
            raise LinkRefused(f"expected WELCOME from {target}, got {welcome.kind.name} from {welcome.source}")
        w = welcome.frame().body
        assert isinstance(w, Welcome)
        return fs, first[1:], min(self.d.s.window, w.window)

    # ------------------------------------------------------------ a link we dialled

    async def _outbound(self, link: Link, fs: FrameStream, first: list[RawFrame]) -> None:
        peer = Endpoint.org(link.peer)
        async with trio.open_nursery() as nursery:
            port = EarlySends()
            nursery.start_soon(port.run, fs)
            nursery.start_soon(self._reader, link, peer, fs, first)
            nursery.start_soon(ping_every, fs, self.d.core.me, peer, self.d.s.ping_interval)
            await self._sender(link, fs, port)

    async def _sender(self, link: Link, fs: FrameStream, port: EarlySends) -> None:
        """Claims the target's documents while the window has room. Returns
        (closing the link) after ``idle_close`` s with nothing to send and
        nothing in flight: the next document relayed to the target brings
        the link back."""
        d = self.d
        last = trio.current_time()
        while True:
            # Both made before the claim: a poke while the claim runs on the
            # store thread sets this event (one made after the claim replaced
            # it, and the poke was lost), and a commit after this version was
            # read (an application accepting documents) ends the wait below.
            link.wake = trio.Event()
            seen = self._store_version()
            room = link.window - link.in_flight
            if d.drain is not None and d.drain.requested:
                room = 0
            if room > 0:
                out = await d.gate.run(partial(d.core.claim, min(d.s.batch, room), frozenset(), port,
                                               only=link.peer))
                if out.missing:
                    await d.ask_platform(out.missing)
                n = out.early + len(out.data)
                if n:
                    link.ids.update(out.sent_ids)
                    link.in_flight += len(out.sent_ids)  # (best-effort documents are never answered)
                    link.sent += n
                    d.stats["sent"] += n
                    d.stats["sent_direct"] = d.stats.get("sent_direct", 0) + n
                    await fs.send(b"".join(out.data))
                    last = trio.current_time()
                    continue
            if not link.in_flight and trio.current_time() - last >= self.s.idle_close:
                self.wanted.discard(link.peer)
                raise _Idle(f"nothing sent for {self.s.idle_close:.0f} s")
            with trio.move_on_after(d.s.poll_interval):
                if room > 0:  # the table had nothing for the link: watch it for new rows
                    await self._wait_for_documents(link, seen)
                else:  # the window is full: only acks (a wake) make room
                    await link.wake.wait()

    def _store_version(self) -> int | None:
        """``PRAGMA data_version`` of a read-only connection of our own to the
        store: it changes whenever another connection commits (an
        application's ``semq send``, this daemon's store thread). None when
        not watching (``watch_interval`` 0, or no read-only connection)."""
        if self._watch_off or self.d.s.watch_interval <= 0:
            return None
        try:
            if self._watch is None:
                uri = Path(self.d.core.path).resolve().as_uri() + "?mode=ro"  # percent-encoded
                self._watch = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=0)
            return int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error as e:
            log.warning("direct links cannot watch the store for new documents (%s): they look every %g s",
                        e, self.d.s.poll_interval)
            self._watch_off = True
            return None

    async def _wait_for_documents(self, link: Link, seen: int | None) -> None:
        """Until poked, or the store changed since ``seen`` (read before the
        claim that found nothing). Looked at every ``watch_interval``,
        stretched by half per look up to ``watch_max``, as the platform
        path's sender does; the caller bounds it with ``poll_interval``.

        Why the link watches for itself: it was woken only by pokes, and the
        one for new documents came from the platform path's watcher, which
        with every document going direct stops looking (nothing wakes it, its
        interval stretches to ``watch_max`` = ``poll_interval``, and the
        outer limit always ends the wait first). Documents fed while A ran
        waited for the 50 ms poll: at half load (scripts/bench e2e
        --direct, docs/benchmarks.md) queued -> sent p90 48 ms direct,
        against 16 ms through the platform."""
        if seen is None:
            await link.wake.wait()
            return
        every = self.d.s.watch_interval
        while True:
            with trio.move_on_after(every):
                await link.wake.wait()
                return
            now = self._store_version()
            if now is None:
                await link.wake.wait()
                return
            if now != seen:
                return
            every = min(self.d.s.watch_max, every * 1.5)

    async def _reader(self, link: Link, peer: Endpoint, fs: FrameStream, first: list[RawFrame]) -> None:
        """Frames from the peer of a link (either direction), read by the
        session layer (semq.session.reader): each must come from it;
        documents and acks are handled as from the platform, the answers go
        back on the link."""
        me = self.d.core.me

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
            out = await self.d.absorb(msgs, peer)
            if out.missing:  # (a certificate to verify an origin's signature)
                await self.d.ask_platform(out.missing)
            if out.settled_ids:
                link.ids.difference_update(out.settled_ids)
                link.in_flight = max(0, link.in_flight - out.settled)
                link.wake.set()
            await fs.send(b"".join(out.data))

        reader = SessionReader(fs, me=me, peer=peer, name=str(peer), messages=messages, screen=only_from_peer,
                               idle=self.s.idle_timeout, log=log)
        await reader.run(first)

    # ------------------------------------------------------------ our listener

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listen = self.s.listen
        assert listen is not None
        host = None if listen.host in _WILDCARDS else listen.host
        try:
            listeners = await trio.open_tcp_listeners(listen.port, host=host)
        except OSError as e:
            raise OSError(f"cannot listen for direct links on {listen}: {e.strerror or e} (another node may"
                          " be running there)") from e
        port = listeners[0].socket.getsockname()[1]
        self.bound = Address(listen.host, port)
        raise_descriptor_limit()
        log.info("listening for direct links on %s", self.bound)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._accept, listeners)
            task_status.started()

    async def _accept(self, stream: trio.SocketStream) -> None:
        adm = self.admission
        if adm.enter() is not None:  # (said in the log, rate-limited)
            self.stats["refused_in"] += 1
            await _close(stream)
            return
        org: list[str] = []  # the organization it was admitted as, once it is
        try:
            await self._serve(stream, org)
        except Exception:
            # A bug must cost one link, never the node.
            log.exception("direct link failed")
            await _close(stream)
        finally:
            adm.leave(org[0] if org else None)

    async def _serve(self, stream: trio.SocketStream, admitted: list[str]) -> None:
        """One link dialled to us: TLS, then (within ``hello_timeout`` of
        the connect, both together) the allow-list and the organization's
        allowance checked on its certificate before any frame is read, then
        a HELLO of at most DIRECT_PRE_AUTH_BYTES; only an accepted link
        reads documents, within its organization's byte budget."""
        try:
            peer_host = str(stream.socket.getpeername()[0])
        except OSError:
            peer_host = "?"
        server, _ = self._tls()
        sec = self.d.core.sec
        assert sec is not None
        me = self.d.core.me
        deadline = trio.current_time() + self.s.hello_timeout
        tls = trio.SSLStream(stream, server, server_side=True)
        try:
            with trio.fail_at(deadline):
                await tls.do_handshake()
            cert = peer_certificate(tls.getpeercert(binary_form=True), ca=sec.ca, crl=sec.directory.crl)
        except (trio.BrokenResourceError, trio.TooSlowError, CryptoError) as e:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s refused at the TLS handshake: %s", peer_host, e.__cause__ or e)
            await _close(stream)
            return
        fs = FrameStream(tls, max_frame=DIRECT_PRE_AUTH_BYTES)
        org = Endpoint.org(cert.org)
        refusal = None
        if self.s.allowed and cert.org not in self.s.allowed:
            # Right after the handshake: an organization we do not accept
            # gets no frame read at all.
            refusal = (ResultCode.DIRECT_NOT_ALLOWED, f"{me} does not accept direct links from {cert.org}")
        elif (why := self.admission.admit(cert.org)) is not None:
            refusal = (ResultCode.TOO_MANY_CONNECTIONS, why)
        else:
            admitted.append(cert.org)
        if refusal is not None:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) refused: %s", cert.org, peer_host, refusal[1])
            await fs.send_error(me, org, *refusal)
            return
        try:
            with trio.fail_at(deadline):
                first = await fs.receive_batch()
        except (trio.TooSlowError, ConnectionClosed, RemoteProtocolError) as e:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) closed before its HELLO: %s", org, peer_host, e)
            await fs.aclose()
            return
        hello = first[0]
        refusal = None
        if hello.kind is not Kind.HELLO:
            refusal = (ResultCode.NOT_AUTHENTICATED, f"first frame must be HELLO, not {hello.kind.name}")
        elif hello.source != org or hello.origin != org:
            refusal = (ResultCode.AUTH_FAILED, f"the TLS certificate names organization {cert.org}, not"
                                               f" {hello.source}")
        elif hello.target != me:
            refusal = (ResultCode.UNEXPECTED_FRAME, f"this is {me}, not {hello.target}")
        elif not sec.certs(cert.org):
            # Its documents could not be opened: they would wait in memory
            # for its certificate (lost if we stop), and an inquiry meanwhile
            # would be answered "not received" (a SaveFwd 1 one is then
            # reported dropped, and delivered when the certificate comes:
            # scripts/chaos --seed 2 --direct). A restarted node holds none
            # until the platform sends them: ask, and take the link once held.
            await self.d.ask_platform({org})
            with trio.move_on_after(self.s.timeout / 2):
                while not sec.certs(cert.org):
                    await trio.sleep(0.05)
            if not sec.certs(cert.org):
                refusal = (ResultCode.UNKNOWN_CERTIFICATE, f"{me} holds no certificate of {cert.org} yet (asked"
                                                           " the platform)")
        if refusal is not None:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) refused: %s", cert.org, peer_host, refusal[1])
            await fs.send_error(me, org, *refusal)
            return
        # Accepted: documents up to the frame limit, within the budget its
        # organization's links share.
        fs.decoder.max_frame_size = DEFAULT_MAX_FRAME
        budget = self.budgets.get(cert.org)
        if budget is None:
            budget = self.budgets[cert.org] = ByteBudget(max(self.s.max_buffer_per_org, DEFAULT_MAX_FRAME))
        fs.budget = budget
        link = Link(cert.org, "in", peer_host, state="up")
        self.inbound.append(link)
        self.stats["links_in"] += 1
        log.info("direct link from %s (%s) up", cert.org, peer_host)
        try:
            await fs.send(encode_frame(Frame(kind=Kind.WELCOME, source=me, target=org,
                                             body=Welcome(window=self.d.s.window, server_time_ms=now_ms()))))
            await self._reader(link, org, fs, first[1:])
        except* (ConnectionClosed, OSError, trio.BrokenResourceError, RemoteProtocolError, trio.TooSlowError) as eg:
            link.error = _why(eg)
        finally:
            link.state = "down"
            self.inbound.remove(link)
            log.info("direct link from %s down%s", cert.org, f": {link.error}" if link.error else "")
            await fs.aclose()
            if not len(budget):
                self.budgets.pop(cert.org, None)


def _why(exc: BaseException) -> str:
    """What a link's error says: the first exception inside (nested)
    exception groups, not "Exceptions from Trio nursery"; its type when it
    has no message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


async def _close(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

