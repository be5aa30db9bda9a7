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
from typing import Any

import trio

from semq.identity.crypto import CryptoError, peer_certificate
from semq.session.early import EarlySends
from semq.session.reader import ping_every
from semq.session.transport import ConnectionClosed, FrameStream
from semq.settings.config import Address, parse_hostport
from semq.store.db import STORE_ERRORS
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    Endpoint,
    Error,
    Frame,
    Hello,
    Kind,
    PeerAnnounce,
    PeerInfo,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    Welcome,
    encode_frame,
)

from .link import WILDCARDS, Link, LinkHost, LinkRefused, read_link
from .link import why as error_text
from .listener import DirectListener
from .settings import DirectSettings

__all__ = ["DirectLinks"]

log = logging.getLogger("semq.node.direct")


class _Idle(Exception):
    """A link we dialled has had nothing to carry for a while: closed."""


class DirectLinks:
    """The direct links of one node daemon: its listener, its announcement,
    the links it dials to the targets of its documents, and the links
    others dialled."""

    def __init__(self, host: LinkHost, settings: DirectSettings) -> None:
        self.host = host
        self.s = settings
        self.out: dict[str, Link] = {}  # target -> the link we dial (or try to)
        self.inbound: list[Link] = []
        self.failed: dict[str, tuple[float, float, str]] = {}  # target -> (retry at, delay, why)
        self.wanted: set[str] = set()  # targets our documents went to (prefer) or wait for (only)
        self.info: dict[str, PeerInfo] = {}
        self._answers: dict[str, trio.Event] = {}
        self._manager_wake = trio.Event()
        self.stats = {"links_out": 0, "links_in": 0, "refused_in": 0, "failed_out": 0, "sent_again": 0}
        self._contexts: tuple[Any, Any] | None = None
        # Our listener (semq.node.daemon.listener): the links others dial.
        self.listener = DirectListener(host, settings, self.inbound, self.stats, self._tls)

    # ------------------------------------------------------------ for the daemon

    @property
    def enabled(self) -> bool:
        """Direct links need the node's certificate (mutual TLS)."""
        return self.host.sec is not None

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

    @property
    def bound(self) -> Address | None:
        """Where the listener listens (its port when 0 was asked); None: not listening."""
        return self.listener.bound

    def announcement(self) -> PeerAnnounce | None:
        """What a platform session announces (PEER_ANNOUNCE; None: not listening)."""
        bound = self.bound
        if bound is None:
            return None
        addresses = list(self.s.announce)
        observe = not addresses or bound.host in WILDCARDS
        if not addresses and bound.host not in WILDCARDS:
            addresses = [str(bound)]
        if not addresses:
            addresses = [f"0.0.0.0:{bound.port}"]  # the platform fills in the host it sees
        return PeerAnnounce(ttl_s=self.s.announce_ttl, addresses=tuple(addresses), observe=observe,
                            allowed=self.s.allowed)

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
            "listener": self.listener.admission.snapshot() if self.bound else None,
            **self.stats,
        }

    # ------------------------------------------------------------ running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            task_status.started()
            await trio.sleep_forever()
        async with trio.open_nursery() as nursery:
            if self.s.listen is not None:
                await nursery.start(self.listener.run)
            task_status.started()
            if self.s.policy != "never":
                nursery.start_soon(self._manager, nursery)
                if self.s.policy == "only":
                    nursery.start_soon(self._discover)

    def _tls(self) -> tuple[Any, Any]:
        if self._contexts is None:
            sec = self.host.sec
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
                targets = await self.host.pending_targets()
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
        ev = self._answers.setdefault(target, trio.Event())
        if await self.host.look_up(target):
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
            sec = self.host.sec
            assert sec is not None
            if not sec.certs(target):
                # Asked for here: with policy only (or documents that never
                # went through the platform) no claim has asked for it.
                await self.host.ask_platform({Endpoint.org(target)})
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
                self.host.wake()
                try:
                    await self._outbound(link, fs, rest)
                except* (ConnectionClosed, OSError, trio.BrokenResourceError) as eg:
                    why = f"the link broke: {error_text(eg)}"
                except* RemoteProtocolError as eg:
                    why = f"protocol error: {error_text(eg)}"
                except* trio.TooSlowError:
                    why = f"nothing heard for {self.s.idle_timeout:.0f} s"
                except* _Idle as eg:
                    why = f"closed, {error_text(eg)}"
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
                        n = await self.host.send_again(ids)
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
            self.host.wake()

    async def _connect(self, address: str, target: str) -> tuple[FrameStream, list[RawFrame], int]:
        host, port = parse_hostport(address)
        _, client = self._tls()
        sec = self.host.sec
        assert sec is not None
        me = self.host.me
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
                                                 body=Hello(window=self.host.s.window, software="semq-node"))))
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
        return fs, first[1:], min(self.host.s.window, w.window)

    # ------------------------------------------------------------ a link we dialled

    async def _outbound(self, link: Link, fs: FrameStream, first: list[RawFrame]) -> None:
        peer = Endpoint.org(link.peer)
        async with trio.open_nursery() as nursery:
            port = EarlySends()
            nursery.start_soon(port.run, fs)
            nursery.start_soon(read_link, self.host, link, peer, fs, first, self.s.idle_timeout)
            nursery.start_soon(ping_every, fs, self.host.me, peer, self.host.s.ping_interval)
            await self._sender(link, fs, port)

    async def _sender(self, link: Link, fs: FrameStream, port: EarlySends) -> None:
        """Claims the target's documents while the window has room. Returns
        (closing the link) after ``idle_close`` s with nothing to send and
        nothing in flight: the next document relayed to the target brings
        the link back."""
        host, watch = self.host, self.host.watch
        last = trio.current_time()
        while True:
            # Both made before the claim: a poke while the claim runs on the
            # store thread sets this event (one made after the claim replaced
            # it, and the poke was lost), and a commit after this version was
            # read (an application accepting documents) ends the wait below.
            link.wake = trio.Event()
            seen = watch.version()
            room = link.window - link.in_flight
            if host.draining:
                room = 0
            if room > 0:
                out = await host.claim_for(link.peer, min(host.s.batch, room), port)
                if out.missing:
                    await host.ask_platform(out.missing)
                n = out.early + len(out.data)
                if n:
                    link.ids.update(out.sent_ids)
                    link.in_flight += len(out.sent_ids)  # (best-effort documents are never answered)
                    link.sent += n
                    host.sent_direct(n)
                    await fs.send(b"".join(out.data))
                    last = trio.current_time()
                    continue
            if not link.in_flight and trio.current_time() - last >= self.s.idle_close:
                self.wanted.discard(link.peer)
                raise _Idle(f"nothing sent for {self.s.idle_close:.0f} s")
            with trio.move_on_after(host.s.poll_interval):
                if room > 0:  # the table had nothing for the link: watch it for new rows (semq.node.daemon.watch)
                    await watch.wait(link.wake, seen)
                else:  # the window is full: only acks (a wake) make room
                    await link.wake.wait()
