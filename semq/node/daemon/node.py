"""``semq node run``: the organization's daemon, a thin trio shell around
NodeCore. Connects to the platform with reconnect and backoff, sends SS_INIT
rows in batches, applies every ack, runs inquiries, answers them; runs the
direct links (semq.node.daemon.direct), which know it only as their
``LinkHost`` (semq.node.daemon.link).

The platform session is read by the session layer (semq.session.reader):
the node registers its handler of a batch's message frames (``_messages``),
its screen (stored copies over our window, ``_over_window``) and its
session kinds (CERT_RESPONSE and CRL: semq.node.daemon.certificates;
PEER_INFO: the direct links).

The platform may be several identical instances (one shared store): the
node is given their addresses and fails over between them
(``NodeDaemon._connect_forever``)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from semq.session.early import EarlySends
from semq.session.ports import BatchObserver, DrainSignal, FramePort, InboxSignal
from semq.session.reader import Handler, SessionIdle, SessionReader, first_exception, ping_every
from semq.session.transport import ConnectionClosed, FrameStream
from semq.settings.config import Address
from semq.store.db import STORE_ERRORS
from semq.store.gate import StoreGate
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    LK0,
    Endpoint,
    Error,
    Frame,
    FrameDecoder,
    Hello,
    Kind,
    Nack,
    PeerInfo,
    PeerLookup,
    PresenceQuery,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    Welcome,
    encode_frame,
)

from ..batch import Output
from ..core import NodeCore
from .certificates import Certificates
from .direct import DirectLinks
from .large_sender import LargeSender
from .presence import PartnerPresence
from .settings import INITIAL_DELAY, NodeSettings
from .watch import StoreWatch

if TYPE_CHECKING:
    from semq.identity.security import NodeSecurity

__all__ = ["GAP_POLL", "LOCAL_POLL", "QUOTA_PAUSE", "QUOTA_PAUSE_MAX", "NodeDaemon", "copies_over"]

log = logging.getLogger("semq.node")

T = TypeVar("T")

QUOTA_PAUSE = 2.0  # s before documents to a target go again after QUOTA_EXCEEDED
QUOTA_PAUSE_MAX = 60.0
LOCAL_POLL = 0.2  # s between looks for documents to this node's own users while the platform is away
GAP_POLL = 1.0  # s between looks for failed ordered documents to announce


def _jitter(delay: float) -> float:
    """``delay`` times 0.5..1.5: nodes cut off together do not all come
    back at the same instant."""
    return delay * (0.5 + random.random())


def copies_over(batch: list[RawFrame], limit: int) -> list[tuple[RawFrame, LK0]]:
    """The stored copies (DATA with an LK1) of one read beyond the first
    ``limit``, with their LK0s. Our HELLO announced a window: the number of
    stored copies the platform may have in flight to us without our ACK; we
    ACK each read after its commit, so the copies beyond the window in one
    read are over it. Forwarded documents (no LK1) are bounded upstream by
    their origin's window and the platform's per-node high-water mark, not
    by this window."""
    if sum(m.kind is Kind.DATA for m in batch) <= limit:
        return []  # the common case: no prefix parsed
    # A long read of forwarded documents (an origin sending faster than we
    # store): count the LK1s before parsing every prefix. Every copy counted
    # below is counted here too, so within the limit here is within it below.
    if sum(1 for m in batch if m.kind is Kind.DATA and m.lk1_record_id()) <= limit:
        return []
    copies = []
    for m in batch:
        if m.kind is Kind.DATA:
            try:
                lk0, lk1, _, _ = m.data_prefix()
            except RemoteProtocolError:
                continue  # malformed: refused when handled
            if lk1 is not None:
                copies.append((m, lk0))
    return copies[limit:]


class NodeDaemon:
    def __init__(self, core: NodeCore, settings: NodeSettings) -> None:
        self.core = core
        self.s = settings
        self.gate = StoreGate()
        self.connected = False
        self.disconnected_ms: int | None = None  # when the platform session ended (None: never had one)
        self.address: Address | None = None  # the platform address connected now
        self._welcomed_at: float | None = None  # when the current session got WELCOME
        self.in_flight = 0
        self._wake = trio.Event()
        self.sessions = 0
        self.stats = {"sent": 0, "received": 0, "delivered": 0, "refused": 0}
        self.granted = self.window = self.platform_window = settings.window
        self.told_window = settings.window  # the window our HELLO announced
        # Targets whose documents the platform refused for our storage quota:
        # target -> (resume at, the pause that led there); the pause doubles
        # while the quota stays used up, up to QUOTA_PAUSE_MAX.
        self.over_quota: dict[str, tuple[float, float]] = {}
        # The certificates of other organizations (asked, applied, waited for).
        self.certs = Certificates(core, settings, self._store, self._wake_senders)
        # Other processes' commits (an application's send): one look for every sender.
        self.watch = StoreWatch(core.path, settings)
        # semq.ops sets these when the daemon runs from the CLI.
        self.drain: DrainSignal | None = None  # 'semq admin drain': claim nothing new
        self.metrics: BatchObserver | None = None
        self.inbox_signal: InboxSignal | None = None  # told after a commit put documents into the inbox
        self.platform_fs: FrameStream | None = None  # the platform session's stream, while there is one
        self.links = DirectLinks(self, settings.direct)
        self.presence = PartnerPresence()  # what the platform said of our partners (semq partners)
        self.large = LargeSender(core, self.gate)  # chunks of our large documents (semq.node.daemon.large_sender)
        self.edge: Any = None  # the edge's sender and listener (semq.edge.daemon.service), when set

    async def _store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store call through the daemon's gate (the one the daemon holds
        now: tests put one of their own in its place)."""
        return await self.gate.run(fn, *args, **kwargs)

    def _wake_senders(self) -> None:
        self._wake.set()

    def set_window(self, window: int) -> None:
        """A new configured window (reload): applies to the current session
        too, still bounded by what the platform granted."""
        self.s.window = window
        self.granted = min(window, self.platform_window)
        self.window = min(self.window, self.granted)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()
        self.links.poke()

    async def run(self, *, task_status: trio.TaskStatus[Address | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. Reconnects forever with jittered backoff.
        Started once the direct-link listener (if any) listens: its
        address is the start value (None without one)."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.links.run)  # a port in use stops the start, with its address
                task_status.started(self.links.bound)
                await self._run()
        finally:
            self.watch.close()

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._housekeeping)
            # Transactional check-backs, dead-letter sweep (semq.node.daemon.background):
            # through this daemon's own core and store gate, never a second
            # connection to the same store.
            from .background import run_background_tasks

            nursery.start_soon(partial(run_background_tasks, self.core, gate=self.gate))
            nursery.start_soon(self._local_offline)
            nursery.start_soon(self._gaps)
            if self.s.edge is not None:  # AS2 / AS4 partners (semq.edge.daemon)
                from semq.edge.daemon.service import EdgeService

                self.edge = EdgeService(self.core, self._store, self.s.edge, arrived=self._edge_arrived)
                await nursery.start(self.edge.run)
            await self._connect_forever()

    def _edge_arrived(self) -> None:
        if self.inbox_signal is not None:
            self.inbox_signal.arrived()

    async def _connect_forever(self) -> None:
        """Dial the platform's addresses in turn, for ever. A failed attempt
        (no connection, no WELCOME, or a session shorter than steady_after)
        moves on to the next address at once; after a whole round of
        failures the node waits, jittered, INITIAL_DELAY doubling up to
        backoff_max. After a steady session the next round starts at the
        address that worked, after INITIAL_DELAY. A store error is not the
        platform's fault: the same address again, after the backoff."""
        delay = INITIAL_DELAY
        here = self.s.addresses[0]
        failed = 0  # failed attempts in this round
        while True:
            addresses = self.s.addresses  # a reload may change them
            if here not in addresses:
                here, failed = addresses[0], 0
            self._welcomed_at = None
            why: BaseException | str = "the session ended"
            store_failed = False
            try:
                await self._session(here)
            except* SessionIdle:
                log.warning("no traffic from the platform for %.0f s: reconnecting", self.s.idle_timeout)
                why = "nothing received in time"
            except* trio.TooSlowError:
                why = "no answer in time"  # connect_timeout or hello_timeout
            except* (OSError, ConnectionClosed) as eg:
                why = str(first_exception(eg)) or "the connection closed"
            except* STORE_ERRORS as eg:
                # Disk full, read-only, locked: keep everything, retry later.
                log.error("store error, retrying: %s", first_exception(eg))
                store_failed = True
            except* RemoteProtocolError as eg:
                e = first_exception(eg)
                assert isinstance(e, RemoteProtocolError)
                log.warning("protocol error from platform %s (code %d): %s", here, e.code, e)
                why = e
            if self.connected or self.disconnected_ms is None:
                self.disconnected_ms = now_ms()  # the platform is away since (semq.ops.why)
            self.connected = False
            self.address = None
            welcomed = self._welcomed_at
            if store_failed:
                wait = _jitter(delay)
                delay = min(self.s.backoff_max, delay * 2)
            elif welcomed is not None and trio.current_time() - welcomed >= self.s.steady_after:
                delay, failed = INITIAL_DELAY, 0
                wait = _jitter(delay)
                log.info("platform %s gone: %s; reconnecting in %.2f s", here, why, wait)
            else:
                failed += 1
                nxt = addresses[(addresses.index(here) + 1) % len(addresses)]
                what = ("unreachable" if welcomed is None
                        else f"gone after {trio.current_time() - welcomed:.1f} s")
                if failed < len(addresses):
                    log.info("platform %s %s: %s; trying %s", here, what, why, nxt)
                    here = nxt
                    continue
                wait = _jitter(delay)
                whole = f" (a round of all {len(addresses)} addresses failed)" if len(addresses) > 1 else ""
                log.info("platform %s %s: %s; trying %s in %.2f s%s", here, what, why, nxt, wait, whole)
                here, failed = nxt, 0
                delay = min(self.s.backoff_max, delay * 2)
            await trio.sleep(wait)

    async def _session(self, address: Address) -> None:
        with trio.fail_after(self.s.connect_timeout):
            stream: trio.abc.Stream
            if self.s.connect is not None:
                stream = await self.s.connect(address)
            else:
                stream = await trio.open_tcp_stream(address.host, address.port)
            if self.s.ssl_context is not None:
                # Checked against the address dialled: each platform
                # instance's certificate names its own.
                tls = trio.SSLStream(stream, self.s.ssl_context, server_hostname=address.host)
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as e:
                    await stream.aclose()
                    raise OSError(f"TLS handshake with the platform failed: {e.__cause__ or e}") from e
                stream = tls
        fs = FrameStream(stream)
        try:
            me = self.core.me
            self.told_window = self.s.window
            await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=me, target=self.core.platform,
                                             body=Hello(semq_id=self.core.unit, units=self.s.units,
                                                        window=self.told_window, software="semq-node"))))
            with trio.fail_after(self.s.hello_timeout):
                first = await fs.receive_batch()
            welcome = first[0]
            if welcome.kind is Kind.ERROR:
                err = welcome.frame().body
                assert isinstance(err, Error)
                raise RemoteProtocolError(f"platform refused the session: {err.message}", err.code)
            if welcome.kind is not Kind.WELCOME:
                raise RemoteProtocolError(f"expected WELCOME, got {welcome.kind.name}", ResultCode.UNEXPECTED_FRAME)
            self.core.platform = welcome.source
            w = welcome.frame().body
            assert isinstance(w, Welcome)
            self.platform_window = w.window
            self.granted = min(self.s.window, w.window)  # the platform's window bounds ours
            self.window = self.granted
            await self.gate.run(self.core.reconnected)
            self.connected = True
            self.address = address
            self._welcomed_at = trio.current_time()
            self.in_flight = 0
            self.certs.new_session()  # a new session: ask at once again
            self.sessions += 1
            log.info("connected to %s at %s", welcome.source, address)
            self.platform_fs = fs
            async with trio.open_nursery() as nursery:
                early = EarlySends()  # the claims' FramePort: DATA leaves before the commit
                nursery.start_soon(self._announcer, fs)
                nursery.start_soon(early.run, fs)
                nursery.start_soon(self._reader(fs).run, first[1:])
                nursery.start_soon(self._sender, fs, early)
                nursery.start_soon(self.large.run, fs)
                # Large documents coming in: their origins go on from what we hold.
                await fs.send(b"".join(await self.gate.run(self.core.receiver.large.resume_acks)))
                nursery.start_soon(self._inquirer, fs)
                nursery.start_soon(ping_every, fs, me, self.core.platform, self.s.ping_interval)
                if self.core.sec is not None:
                    nursery.start_soon(self.certs.refresher, fs)
        finally:
            self.platform_fs = None
            await fs.aclose()

    async def _announcer(self, fs: FrameStream) -> None:
        """Where our listener is, told to the platform at the start of each
        session and renewed at a third of its lifetime."""
        while True:
            body = self.links.announcement()
            if body is not None:
                await fs.send(encode_frame(Frame(kind=Kind.PEER_ANNOUNCE, source=self.core.me,
                                                 target=self.core.platform, body=body)))
            await trio.sleep(max(1.0, self.links.s.announce_ttl / 3))

    async def ask_platform(self, missing: set[Endpoint]) -> None:
        """Certificate requests for ``missing`` (from a direct link's batch),
        through the platform session when there is one (without one,
        nothing is marked asked: the next session's claims ask at once)."""
        fs = self.platform_fs
        if fs is None:
            return
        frames = self.certs.ask(missing)
        if frames:
            try:
                await fs.send(frames)
            except ConnectionClosed:
                self.certs.not_asked(missing)

    async def absorb(self, msgs: list[RawFrame], direct: Endpoint | None = None) -> Output:
        """Apply message frames (from the platform or a direct link) in one
        transaction; counts and logs what came of them. The caller sends
        ``out.data`` back on the link they came on; ``direct``: the
        organization of the direct link they came on."""
        self.stats["received"] += len(msgs)
        t0 = time.perf_counter()
        out = await self.gate.run(partial(self.core.handle, msgs, direct=direct))
        if self.metrics is not None:
            self.metrics.observe_batch(len(msgs), time.perf_counter() - t0)
        for code, text in out.errors:
            self.stats["refused"] += 1
            log.warning("frame refused (%s): %s", code.name, text)
        self.stats["delivered"] += out.delivered
        if out.delivered and self.inbox_signal is not None:
            # Committed when gate.run returned: a client woken now finds them.
            self.inbox_signal.arrived()
        if out.bad_receipts or out.bad_refusals:
            # An ACK2 or a refusal the target did not sign: the
            # documents stay open (counted; the frames are logged above).
            self.stats["bad_receipts"] = self.stats.get("bad_receipts", 0) + out.bad_receipts
            self.stats["bad_refusals"] = self.stats.get("bad_refusals", 0) + out.bad_refusals
        self.certs.defer(out.deferred)
        return out

    def _reader(self, fs: FrameStream) -> SessionReader:
        """The platform session's reader (semq.session.reader): what a node
        registers for its platform session."""
        handlers: dict[Kind, Handler] = {Kind.CERT_RESPONSE: self.certs.response, Kind.CRL: self.certs.crl,
                                         Kind.PEER_INFO: self._peer_info, Kind.PRESENCE: self.presence.answer}
        return SessionReader(fs, me=self.core.me, peer=self.core.platform, name="platform",
                             messages=partial(self._messages, fs), handlers=handlers,
                             screen=partial(self._screen, fs), idle=self.s.idle_timeout, log=log)

    async def _screen(self, fs: FrameStream, batch: list[RawFrame]) -> list[RawFrame]:
        """Stored copies beyond our window are refused before anything of
        the batch is handled (_over_window)."""
        batch, nacks = self._over_window(batch)
        if nacks:
            await fs.send(nacks)
        return batch

    async def _peer_info(self, raw: RawFrame) -> None:
        info = raw.frame().body
        assert isinstance(info, PeerInfo)
        self.links.on_info(info)

    async def _messages(self, fs: FrameStream, msgs: list[RawFrame]) -> None:
        """One batch of message frames from the platform: one transaction."""
        out = await self.absorb(msgs)
        if out.chunk_acks:
            self.large.acked(out.chunk_acks)
        direct = self.links.settled(out.settled_ids) if out.settled_ids else 0
        self.in_flight = max(0, self.in_flight - (out.settled - direct))
        if out.over_window:
            # Multiplicative decrease; _sender grows it back slowly.
            self.window = max(16, self.window // 2)
            log.warning("platform says over the window: window now %d", self.window)
        if out.settled:
            self._wake.set()
        if out.over_quota:
            now = trio.current_time()
            for target in out.over_quota:
                _, pause = self.over_quota.get(target, (0.0, QUOTA_PAUSE / 2))
                pause = min(QUOTA_PAUSE_MAX, pause * 2)
                self.over_quota[target] = (now + pause, pause)
            log.warning("the platform's storage quota for our documents is used up: documents to %s"
                        " wait and go again later", ", ".join(sorted(out.over_quota)))
        await fs.send(b"".join(out.data) + self.certs.ask(out.missing))

    def _over_window(self, batch: list[RawFrame]) -> tuple[list[RawFrame], bytes]:
        """Seed 004 flow control, this side (``copies_over``): the stored
        copies beyond our window in one read are refused with OVER_WINDOW,
        nothing stored; the platform puts them back in its queue and halves
        its delivery window. Returns the rest of the batch and the NACKs."""
        limit = self.told_window
        over = copies_over(batch, limit)
        if not over:
            return batch, b""
        nacks = [encode_frame(Frame(kind=Kind.NACK, source=self.core.me, target=self.core.platform,
                                    body=Nack(lk0=lk0, code=ResultCode.OVER_WINDOW,
                                              message=f"over the window of {limit} frames")))
                 for _, lk0 in over]
        skip = {id(m) for m, _ in over}
        self.stats["over_window"] = self.stats.get("over_window", 0) + len(nacks)
        log.warning("the platform sent %d stored copies beyond our window of %d: refused with OVER_WINDOW",
                    len(over), limit)
        return [m for m in batch if id(m) not in skip], b"".join(nacks)

    async def _sender(self, fs: FrameStream, early: EarlySends) -> None:
        while True:
            room = self.window - self.in_flight
            if self.draining:
                room = 0  # draining: acks for what is in flight still come in
            drained = False  # the table had nothing to claim: watch it for new rows
            if room > 0 and self.links.s.policy == "only" and self.links.enabled:
                room = 0  # every document waits for a direct link: only watch for new ones
                drained = True
            if room > 0:
                now = trio.current_time()
                skip = self.certs.skip(now)
                if self.over_quota:
                    # (Remembered one pause past its end: a refusal then doubles it.)
                    self.over_quota = {t: v for t, v in self.over_quota.items() if v[0] + v[1] > now}
                    skip |= {t for t, (until, _) in self.over_quota.items() if until > now}
                direct = self.links.up_targets()  # their documents go over their direct links
                out = await self.gate.run(self.core.claim, min(self.s.batch, room), skip | direct, early)
                if out.local:
                    await self.loopback(out.local)
                if out.targets:
                    self.links.consider(out.targets)
                ask = self.certs.ask(out.missing)
                if ask:
                    await fs.send(ask)
                n = out.early + len(out.data)
                if n:
                    self.window = min(self.granted, self.window + n // 8 + 1)
                    self.in_flight += n
                    self.stats["sent"] += n
                    await fs.send(b"".join(out.data))
                    continue
                drained = True
            self._wake = trio.Event()
            with trio.move_on_after(self.s.poll_interval):
                if drained:
                    await self._wait_for_work()
                else:  # the window is full: only acks (a wake) make room
                    await self._wake.wait()

    async def _wait_for_work(self) -> None:
        """Until woken (acks settled, a certificate came, a reload) or another
        process committed to the store (an application's ``semq send``:
        semq.node.daemon.watch), which may have documents for the links too."""
        if await self.watch.wait(self._wake, self.watch.version(), keep_pace=True):
            self.links.poke()  # new documents may be for a direct link

    async def _inquirer(self, fs: FrameStream) -> None:
        step = max(0.05, min(1.0, self.core.inquiry_ms / 3000))
        while True:
            await trio.sleep(step)
            out = await self.gate.run(self.core.inquiries)
            await fs.send(b"".join(out.data))

    async def loopback(self, data: list[bytes]) -> None:
        """Documents for users of this node itself (a claim's ``out.local``):
        received here as from a direct link to ourselves — the same
        pending-send and inbox tables, states, ACK2 and receipt — without
        leaving the process. DATA, then the ACK2 it brings back.

        Shielded: the claim holds these documents in flight, and nothing
        else answers them — a platform session ending meanwhile (its sender
        called this) must not leave them waiting for an inquiry that goes
        to a platform that may be away."""
        dec = FrameDecoder()
        dec.receive_data(b"".join(data))
        with trio.CancelScope(shield=True):
            for _ in range(3):  # DATA -> ACK2 -> nothing further
                raws = list(dec)
                if not raws:
                    return
                out = await self.absorb(raws, direct=self.core.me)
                dec.receive_data(b"".join(out.data))

    async def _local_offline(self) -> None:
        """While no platform session runs (or its sender claims nothing:
        direct = "only"), the documents for this node's own users are
        claimed here."""
        me = self.core.me.node_id
        seen: int | None = None  # the store's data_version at the last claim
        while True:
            idle = not self.connected or (self.links.s.policy == "only" and self.links.enabled)
            if idle and not self.draining:
                # Only when something was committed since the last look (an
                # application's send): no write lock five times a second on
                # an idle node, and the states held in memory stay there.
                version = self.watch.version()
                if version is None or version != seen:
                    seen = version
                    out = await self.gate.run(partial(self.core.claim, self.s.batch, only=me, write_held=False))
                    if out.local:
                        await self.loopback(out.local)
                        continue
            await trio.sleep(LOCAL_POLL)

    async def _gaps(self) -> None:
        """Failed ordered documents get their gap notices (semq.node.origin.channels)."""
        while True:
            await trio.sleep(GAP_POLL)
            if await self.gate.run(self.core.announce_gaps):
                self.wake()

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.s.housekeeping_interval)
            await self.gate.run(self.core.housekeeping)


    # ------------------------------------------------------------ LinkHost (semq.node.daemon.link)

    @property
    def me(self) -> Endpoint:
        return self.core.me

    @property
    def sec(self) -> NodeSecurity | None:
        return self.core.sec

    @property
    def draining(self) -> bool:
        return self.drain is not None and self.drain.requested

    async def claim_for(self, target: str, limit: int, port: FramePort) -> Output:
        return await self.gate.run(partial(self.core.claim, limit, frozenset(), port, only=target))

    async def send_again(self, ids: Collection[int]) -> int:
        return await self.gate.run(self.core.send_again, ids)

    async def pending_targets(self) -> set[str]:
        return await self.gate.run(self.core.pending_targets)

    async def look_up(self, org: str) -> bool:
        fs = self.platform_fs
        if fs is None:
            return False
        try:
            await fs.send(encode_frame(Frame(kind=Kind.PEER_LOOKUP, source=self.core.me, target=self.core.platform,
                                             body=PeerLookup(endpoint=Endpoint.org(org)))))
        except ConnectionClosed:
            return False
        return True

    async def ask_presence(self, orgs: Sequence[str]) -> bool:
        """Send a PRESENCE_QUERY naming ``orgs`` (semq.node.daemon.presence);
        False without a platform session."""
        fs = self.platform_fs
        if fs is None or not self.connected:
            return False
        try:
            await fs.send(encode_frame(Frame(kind=Kind.PRESENCE_QUERY, source=self.core.me,
                                             target=self.core.platform, body=PresenceQuery(orgs=tuple(orgs)))))
        except ConnectionClosed:
            return False
        return True

    def sent_direct(self, n: int) -> None:
        self.stats["sent"] += n
        self.stats["sent_direct"] = self.stats.get("sent_direct", 0) + n
