"""``semq node run``: the organization's daemon, a thin trio shell around
NodeCore. Connects to the platform with reconnect and backoff, sends SS_INIT
rows in batches, applies every ack, runs inquiries, answers them.

The platform may be several identical instances (one shared store): the
node is given their addresses and fails over between them
(``NodeDaemon._connect_forever``)."""

from __future__ import annotations

import logging
import math
import random
import sqlite3
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from semq.identity.crypto import CryptoError
from semq.session.ports import BatchObserver, DrainSignal, InboxSignal
from semq.session.transport import ConnectionClosed, FramePump, FrameStream
from semq.settings.config import Address
from semq.store.db import STORE_ERRORS
from semq.store.gate import StoreGate
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    CertRequest,
    CertResponse,
    Crl,
    Endpoint,
    Error,
    Frame,
    FrameDecoder,
    Hello,
    Kind,
    Nack,
    NodeType,
    PeerInfo,
    Ping,
    Pong,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    Welcome,
    encode_frame,
)

from .batch import Output
from .core import NodeCore
from .direct import DirectLinks, DirectSettings
from .large_sender import LargeSender

if TYPE_CHECKING:
    from semq.identity.security import CertAnswer

__all__ = ["NodeDaemon", "NodeSettings"]

log = logging.getLogger("semq.node")

QUOTA_PAUSE = 2.0  # s before documents to a target go again after QUOTA_EXCEEDED
QUOTA_PAUSE_MAX = 60.0
LOCAL_POLL = 0.2  # s between looks for documents to this node's own users while the platform is away
GAP_POLL = 1.0  # s between looks for failed ordered documents to announce


INITIAL_DELAY = 0.1  # s before reconnecting after a steady session; doubles each failed round


@dataclass
class NodeSettings:
    # The platform's addresses (semq.settings.config.parse_platform_addresses), tried
    # in turn: the next one when connecting fails or a session ends early.
    addresses: list[Address] = field(default_factory=lambda: [Address("127.0.0.1", 7410)])
    window: int = 4096  # DATA frames in flight without platform ack
    units: int = 1  # the node's units (semq.umxt_protocol.units); this one is the core's ``unit``
    # Rows claimed per transaction. 1024 rather than 512: one claim commit
    # (fsync) and one ACK batch per 1,024 documents; scripts/bench e2e,
    # alternated: store +9%, online +5%, full-load p50 47 -> 81-92 ms,
    # half load unchanged (batches are small there); 2048 added ~4% online,
    # nothing to store, and doubled full-load latency again.
    batch: int = 1024
    poll_interval: float = 0.05  # s between looks at the pending-send table when idle
    connect_timeout: float = 5.0
    hello_timeout: float = 10.0
    ping_interval: float = 10.0
    idle_timeout: float = 45.0
    backoff_max: float = 5.0
    # A session that got WELCOME and lasted this long (s) proves its address:
    # after it the node dials that address again first, after INITIAL_DELAY.
    # A shorter one counts as a failed attempt, so a platform that welcomes
    # and drops at once is not redialled ten times a second.
    steady_after: float = 5.0
    housekeeping_interval: float = 3600.0
    # How to reach the platform at an address: None = TCP. Tests pass a
    # function returning one end of trio.testing.memory_stream_pair().
    connect: Callable[[Address], Awaitable[trio.abc.Stream]] | None = None
    # Mutual TLS 1.3 (semq.identity.security.NodeSecurity.ssl_context()); None = plain TCP.
    ssl_context: ssl.SSLContext | None = None
    # Certificates (security on). A document to an organization without a
    # usable, trusted certificate waits: asked again after cert_retry s,
    # doubling up to cert_retry_max (the platform also pushes a new one).
    cert_retry: float = 5.0
    cert_retry_max: float = 300.0
    # Direct links to other nodes (semq.node.direct): listening, policy, retries.
    direct: DirectSettings = field(default_factory=DirectSettings)
    cert_refresh: float = 300.0  # s between look-ups of every organization held (besides the pushes)
    pins_check: float = 1.0  # s between looks at pins.json ('semq node trust' from another process)
    # s between looks at the store's data_version while idle: a document an
    # application writes into the store (another process) is claimed within
    # this, not within poll_interval. 0 = off.
    watch_interval: float = 0.002
    watch_max: float = 0.05  # ... stretched up to this while nothing changes

    @property
    def host(self) -> str:
        """The first platform address's host (``NodeDaemon.address`` is the
        one connected now)."""
        return self.addresses[0].host

    @property
    def port(self) -> int:
        """The first platform address's port."""
        return self.addresses[0].port


def _jitter(delay: float) -> float:
    """``delay`` times 0.5..1.5: nodes cut off together do not all come
    back at the same instant."""
    return delay * (0.5 + random.random())


def _first(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in ``eg``, out of any nested groups (the
    session's nurseries nest them)."""
    e: BaseException = eg
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


class EarlySends:
    """The claims' FramePort (semq.session.ports) for one session: the DATA frames
    a claim hands over on the store thread, just before its commit, are
    passed to the event loop as data and written by the session's
    ``_early_sender``. A session that is over drops them: the rows go again
    in the next one."""

    def __init__(self, token: trio.lowlevel.TrioToken, chunks: trio.MemorySendChannel[bytes]) -> None:
        self._token = token
        self._chunks = chunks

    def put(self, frames: list[bytes]) -> None:
        chunk = b"".join(frames)
        try:
            self._token.run_sync_soon(self._queue, chunk)
        except trio.RunFinishedError:
            pass

    def _queue(self, chunk: bytes) -> None:
        try:
            self._chunks.send_nowait(chunk)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the session is over


class NodeDaemon:
    def __init__(self, core: NodeCore, settings: NodeSettings) -> None:
        self.core = core
        self.s = settings
        self.gate = StoreGate()
        self.connected = False
        self.address: Address | None = None  # the platform address connected now
        self._welcomed_at: float | None = None  # when the current session got WELCOME
        self.in_flight = 0
        self._wake = trio.Event()
        self.sessions = 0
        self.stats = {"sent": 0, "received": 0, "delivered": 0, "refused": 0}
        self.granted = self.window = self.platform_window = settings.window
        self.told_window = settings.window  # the window our HELLO announced
        self.asked: dict[Endpoint, float] = {}  # certificate look-ups in flight: endpoint -> when
        # Targets whose documents the platform refused for our storage quota:
        # target -> (resume at, the pause that led there); the pause doubles
        # while the quota stays used up, up to QUOTA_PAUSE_MAX.
        self.over_quota: dict[str, tuple[float, float]] = {}
        self.retry: dict[Endpoint, float] = {}  # s until an organization without a usable certificate is asked again
        self.waiting: dict[Endpoint, ResultCode] = {}  # organizations our documents wait for, and why
        self._certs_limiter = trio.CapacityLimiter(1)  # certificate and pin work, off the event loop
        self.deferred: list[RawFrame] = []  # DATA waiting for its origin's certificate
        # The claims' FramePort of the current session: DATA leaves before the commit.
        self._early: EarlySends | None = None
        self._watch: sqlite3.Connection | None = None  # see _wait_for_work
        self._watch_every = settings.watch_interval
        # semq.ops sets these when the daemon runs from the CLI.
        self.drain: DrainSignal | None = None  # 'semq admin drain': claim nothing new
        self.metrics: BatchObserver | None = None
        self.inbox_signal: InboxSignal | None = None  # told after a commit put documents into the inbox
        self.platform_fs: FrameStream | None = None  # the platform session's stream, while there is one
        self.links = DirectLinks(self, settings.direct)
        self.large = LargeSender(core, self.gate)  # chunks of our large documents (semq.node.large_out)

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
            if self._watch is not None:
                self._watch.close()
                self._watch = None

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._housekeeping)
            # Transactional check-backs, dead-letter sweep (semq.node.background):
            # through this daemon's own core and store gate, never a second
            # connection to the same store.
            from .background import run_background_tasks

            nursery.start_soon(partial(run_background_tasks, self.core, gate=self.gate))
            nursery.start_soon(self._local_offline)
            nursery.start_soon(self._gaps)
            await self._connect_forever()

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
            except* trio.TooSlowError:
                why = "no answer in time"  # connect_timeout or hello_timeout
            except* (OSError, ConnectionClosed) as eg:
                why = str(_first(eg)) or "the connection closed"
            except* STORE_ERRORS as eg:
                # Disk full, read-only, locked: keep everything, retry later.
                log.error("store error, retrying: %s", _first(eg))
                store_failed = True
            except* RemoteProtocolError as eg:
                e = _first(eg)
                assert isinstance(e, RemoteProtocolError)
                log.warning("protocol error from platform %s (code %d): %s", here, e.code, e)
                why = e
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
            self.asked.clear()
            self.retry.clear()  # a new session: ask at once again
            self.sessions += 1
            log.info("connected to %s at %s", welcome.source, address)
            self.last_rx = trio.current_time()
            self.platform_fs = fs
            early_send, early_receive = trio.open_memory_channel[bytes](math.inf)  # bounded by the window
            async with early_send, early_receive, trio.open_nursery() as nursery:
                self._early = EarlySends(trio.lowlevel.current_trio_token(), early_send)
                nursery.start_soon(self._announcer, fs)
                nursery.start_soon(self._early_sender, fs, early_receive)
                nursery.start_soon(self._reader, fs, first[1:], nursery.cancel_scope)
                nursery.start_soon(self._sender, fs)
                nursery.start_soon(self.large.run, fs)
                # Large documents coming in: their origins go on from what we hold.
                await fs.send(b"".join(await self.gate.run(self.core.receiver.large.resume_acks)))
                nursery.start_soon(self._inquirer, fs)
                nursery.start_soon(self._pinger, fs, nursery.cancel_scope)
                if self.core.sec is not None:
                    nursery.start_soon(self._refresher, fs)
        finally:
            self.platform_fs = None
            await fs.aclose()

    async def _announcer(self, fs: FrameStream) -> None:
        """Where our listener is, told to the platform at the start of each
        session and renewed at a third of its lifetime."""
        while True:
            frame = self.links.announcement()
            if frame is not None:
                await fs.send(frame)
            await trio.sleep(max(1.0, self.links.s.announce_ttl / 3))

    async def ask_platform(self, missing: set[Endpoint]) -> None:
        """Certificate requests for ``missing`` (from a direct link's batch),
        through the platform session when there is one (without one,
        nothing is marked asked: the next session's claims ask at once)."""
        fs = self.platform_fs
        if fs is None:
            return
        frames = self._ask(missing)
        if frames:
            try:
                await fs.send(frames)
            except ConnectionClosed:
                for ep in missing:  # not asked after all
                    self.asked.pop(ep, None)

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
        # Bounded: beyond it the origin's inquiry brings them again.
        self.deferred = (self.deferred + out.deferred)[-10_000:]
        return out

    async def _reader(self, fs: FrameStream, pending: list[RawFrame], scope: trio.CancelScope) -> None:
        try:
            pump = FramePump(fs)
            async with trio.open_nursery() as reading:
                reading.start_soon(pump.run)
                await self._read_loop(fs, pump, pending)
        finally:
            scope.cancel()

    async def _read_loop(self, fs: FrameStream, pump: FramePump, pending: list[RawFrame]) -> None:
        batch = pending
        while True:
            if not batch:
                batch = await pump.take()
            self.last_rx = trio.current_time()
            batch, nacks = self._over_window(batch)
            if nacks:
                await fs.send(nacks)
            msgs = []
            for raw in batch:
                if raw.kind.is_message:
                    msgs.append(raw)
                elif raw.kind is Kind.PING:
                    ping = raw.frame().body
                    assert isinstance(ping, Ping)
                    await fs.send(encode_frame(Frame(kind=Kind.PONG, source=self.core.me, target=raw.source,
                                                     body=Pong(nonce=ping.nonce, time_ms=now_ms()))))
                elif raw.kind is Kind.ERROR:
                    err = raw.frame().body
                    assert isinstance(err, Error)
                    log.warning("platform says %s (%d): %s", err.code.name, err.code, err.message)
                elif raw.kind is Kind.BYE:
                    raise ConnectionClosed("platform said BYE")
                elif raw.kind is Kind.CERT_RESPONSE:
                    if await self._certificates(raw):
                        msgs, self.deferred = self.deferred + msgs, []
                elif raw.kind is Kind.CRL:
                    await self._crl(raw)
                elif raw.kind is Kind.PEER_INFO:
                    info = raw.frame().body
                    assert isinstance(info, PeerInfo)
                    self.links.on_info(info)
            batch = []
            if msgs:
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
                await fs.send(b"".join(out.data) + self._ask(out.missing))

    def _over_window(self, batch: list[RawFrame]) -> tuple[list[RawFrame], bytes]:
        """Seed 004 flow control, this side. Our HELLO announced a window:
        the number of stored copies (DATA with an LK1) the platform may have
        in flight to us without our ACK. We ACK each read after its commit,
        so stored copies beyond the window in one read are over it: refused
        with OVER_WINDOW, nothing stored; the platform puts them back in its
        queue and halves its delivery window. Forwarded documents (no LK1)
        are bounded upstream by their origin's window and the platform's
        per-node high-water mark, not by this window."""
        limit = self.told_window
        if sum(m.kind is Kind.DATA for m in batch) <= limit:
            return batch, b""  # the common case: no prefix parsed
        # A long read of forwarded documents (an origin sending faster than
        # we store): count the LK1s before parsing every prefix. Every copy
        # counted below is counted here too, so within the limit here is
        # within it below.
        if sum(1 for m in batch if m.kind is Kind.DATA and m.lk1_record_id()) <= limit:
            return batch, b""
        copies = []
        for m in batch:
            if m.kind is Kind.DATA:
                try:
                    lk0, lk1, _, _ = m.data_prefix()
                except RemoteProtocolError:
                    continue  # malformed: refused when handled
                if lk1 is not None:
                    copies.append((m, lk0))
        if len(copies) <= limit:
            return batch, b""
        over = copies[limit:]
        nacks = [encode_frame(Frame(kind=Kind.NACK, source=self.core.me, target=self.core.platform,
                                    body=Nack(lk0=lk0, code=ResultCode.OVER_WINDOW,
                                              message=f"over the window of {limit} frames")))
                 for _, lk0 in over]
        skip = {id(m) for m, _ in over}
        self.stats["over_window"] = self.stats.get("over_window", 0) + len(nacks)
        log.warning("the platform sent %d stored copies beyond our window of %d: refused with OVER_WINDOW",
                    len(over), limit)
        return [m for m in batch if id(m) not in skip], b"".join(nacks)

    async def _sender(self, fs: FrameStream) -> None:
        while True:
            room = self.window - self.in_flight
            if self.drain is not None and self.drain.requested:
                room = 0  # draining: acks for what is in flight still come in
            drained = False  # the table had nothing to claim: watch it for new rows
            if room > 0 and self.links.s.policy == "only" and self.links.enabled:
                room = 0  # every document waits for a direct link: only watch for new ones
                drained = True
            if room > 0:
                now = trio.current_time()
                skip = frozenset(ep.node_id for ep, t in self.asked.items() if now - t < self._retry_after(ep))
                if self.over_quota:
                    # (Remembered one pause past its end: a refusal then doubles it.)
                    self.over_quota = {t: v for t, v in self.over_quota.items() if v[0] + v[1] > now}
                    skip |= {t for t, (until, _) in self.over_quota.items() if until > now}
                direct = self.links.up_targets()  # their documents go over their direct links
                out = await self.gate.run(self.core.claim, min(self.s.batch, room), skip | direct, self._early)
                if out.local:
                    await self.loopback(out.local)
                if out.targets:
                    self.links.consider(out.targets)
                ask = self._ask(out.missing)
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
        process committed to the store (``PRAGMA data_version`` of a
        read-only connection changes when any other connection commits: an
        application's ``semq send``). A few microseconds per look on the
        event loop; the claim itself stays on the store thread."""
        watch = self._watcher()
        if watch is None:
            await self._wake.wait()
            return
        try:
            seen = watch.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            self._watch = None
            await self._wake.wait()
            return
        # Every watch_interval right after activity, stretched by half at each
        # look that finds nothing, up to watch_max: a burst of sends is seen
        # within milliseconds, an idle node looks 20 times a second.
        every = self._watch_every
        while not self._wake.is_set():
            with trio.move_on_after(every):
                await self._wake.wait()
                break
            try:
                if watch.execute("PRAGMA data_version").fetchone()[0] != seen:
                    self.links.poke()  # new documents may be for a direct link
                    break
            except sqlite3.Error:
                self._watch = None
                await self._wake.wait()
                return
            every = min(self.s.watch_max, every * 1.5)
            self._watch_every = every
        else:
            return
        self._watch_every = self.s.watch_interval

    def _watcher(self) -> sqlite3.Connection | None:
        """The read-only connection for data_version (opened once; None when
        watching is off or the store cannot be opened that way)."""
        if self.s.watch_interval <= 0:
            return None
        if self._watch is None:
            try:
                uri = Path(self.core.path).resolve().as_uri() + "?mode=ro"  # percent-encoded
                self._watch = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=0)
            except sqlite3.Error:
                self.s.watch_interval = 0
                return None
        return self._watch

    @staticmethod
    async def _early_sender(fs: FrameStream, chunks: trio.MemoryReceiveChannel[bytes]) -> None:
        """Writes the DATA the claims handed to ``EarlySends`` on the store
        thread, in order, while their commits wait for the disk
        (NodeCore.claim says why that is safe)."""
        async for chunk in chunks:
            await fs.send(chunk)

    def _retry_after(self, ep: Endpoint) -> float:
        return self.retry.get(ep, self.s.cert_retry)

    def _ask(self, missing: set[Endpoint]) -> bytes:
        """CERT_REQUEST frames for certificates not asked for recently (an
        organization that had none usable is asked again with backoff)."""
        now = trio.current_time()
        frames = []
        for ep in missing:
            if now - self.asked.get(ep, -1e9) >= self._retry_after(ep):
                self.asked[ep] = now
                frames.append(self._request(ep))
        return b"".join(frames)

    def _request(self, ep: Endpoint) -> bytes:
        return encode_frame(Frame(kind=Kind.CERT_REQUEST, source=self.core.me, target=self.core.platform,
                                  body=CertRequest(endpoint=ep)))

    async def _certificates(self, raw: RawFrame) -> bool:
        """Apply a CERT_RESPONSE (asked for, or pushed by the platform after
        a rollover, an enrollment or a revocation): every certificate is
        verified against the CA and the revocation list and filtered
        through the pins (NodeSecurity.accept_response, in a worker
        thread). True if the organization now has usable certificates;
        otherwise our documents to it wait, or fail if the platform does
        not know it (_no_certificate)."""
        body = raw.frame().body
        assert isinstance(body, CertResponse)
        sec = self.core.sec
        if sec is None:
            return False
        ep = body.endpoint
        held = ep.node_type is NodeType.ORGANIZATION and bool(sec.directory.certificates(ep))
        if not (held or ep in self.asked or ep in self.waiting):
            return False  # a push about an organization we have nothing to do with
        try:
            answer = await trio.to_thread.run_sync(sec.accept_response, body, limiter=self._certs_limiter)
        except (OSError, ValueError) as e:
            # pins.json cannot be written (disk full) or read (damaged): use
            # nothing we could not pin; asked again later.
            log.error("certificates of %s not applied: %s", ep, e)
            return False
        self._log_answer(answer)
        if answer.code is not ResultCode.OK:
            await self._no_certificate(ep, answer)
            return False
        self.asked.pop(ep, None)
        self.retry.pop(ep, None)
        if self.waiting.pop(ep, None) is not None:
            from semq.identity.security import WAITING_CODES

            await self.gate.run(self.core.wait_target, ep, ResultCode.OK, WAITING_CODES)
            log.info("%s has a usable certificate again: its documents go", ep)
        self._wake.set()
        return True

    def _log_answer(self, answer: CertAnswer) -> None:
        adm = answer.admission
        if adm is None:
            return
        org = answer.endpoint.node_id
        for c, how in adm.pinned:
            if adm.pinned_before:
                log.warning("new certificate of organization %s accepted and pinned: fingerprint %s (serial"
                            " 0x%x), %s", org, c.fingerprint, c.serial, how)
            else:
                log.info("certificate of organization %s pinned on first use: fingerprint %s (serial 0x%x)",
                         org, c.fingerprint, c.serial)
        for c, why in adm.new_refusals:
            log.warning("certificate of organization %s NOT TRUSTED (%s): fingerprint %s (serial 0x%x) is %s;"
                        " it is not used (pinned: %s). If %s really has new keys, compare this fingerprint"
                        " with them out of band, then run: semq node trust %s %s",
                        org, ResultCode.CERT_NOT_TRUSTED.name, c.fingerprint, c.serial, why,
                        ", ".join(adm.pinned_before) or "none", org, org, c.fingerprint)

    async def _no_certificate(self, ep: Endpoint, answer: CertAnswer) -> None:
        """No usable, trusted certificate of ``ep``. An organization the
        platform does not know (UNKNOWN_TARGET): our documents to it fail,
        like UNKNOWN_TARGET without security. A known one (no certificate
        yet, revoked without a successor, expired, not trusted here): a
        passing condition — our SaveFwd 2/3 documents to it stay SS_INIT
        with the reason as their code and are retried with backoff;
        SaveFwd 1 ones fail as they would offline. Documents from it
        cannot be verified: dropped; its inquiries bring them again."""
        from semq.identity.security import WAITING_CODES

        code = answer.code
        detail = answer.detail or f"no usable certificate for {ep}"
        if code is ResultCode.UNKNOWN_TARGET:
            n = await self.gate.run(self.core.fail_target, ep, code, detail)
            waiting = 0
            self.waiting.pop(ep, None)
        else:
            if int(code) not in WAITING_CODES:
                code = ResultCode.UNKNOWN_CERTIFICATE
            n = await self.gate.run(partial(self.core.fail_target, ep, code, detail, save_fwd=1))
            waiting = await self.gate.run(self.core.wait_target, ep, code, WAITING_CODES)
            delay = min(self.s.cert_retry_max, 2 * self.retry[ep]) if ep in self.retry else self.s.cert_retry
            self.retry[ep] = delay
            self.asked[ep] = trio.current_time()
            if self.waiting.get(ep) is not code:
                log.warning("documents to %s wait for a certificate: %s (%s); asking again in %.0f s, then"
                            " less often", ep, code.name, detail, delay)
            self.waiting[ep] = code
        before = len(self.deferred)
        self.deferred = [d for d in self.deferred if d.origin != ep]
        if n or waiting or before != len(self.deferred):
            log.warning("no certificate for %s (%s): %d document(s) to it failed, %d marked waiting, %d from it"
                        " dropped", ep, code.name, n, waiting, before - len(self.deferred))

    async def _crl(self, raw: RawFrame) -> None:
        """The platform's revocation list: checked against the CA and applied
        if newer than ours (then kept for the next start). Senders stop
        sealing to a revoked certificate at the next claim."""
        sec = self.core.sec
        if sec is None:
            return
        body = raw.frame().body
        assert isinstance(body, Crl)
        try:
            applied = await trio.to_thread.run_sync(sec.apply_crl, body.der, limiter=self._certs_limiter)
        except (CryptoError, OSError) as e:
            log.warning("revocation list from the platform not applied: %s", e)
            return
        if applied:
            crl = sec.directory.crl
            log.info("revocation list applied (%d revoked certificate(s))", len(list(crl)) if crl else 0)
            self._wake.set()

    async def _refresher(self, fs: FrameStream) -> None:
        """The pull side of certificate updates (the platform pushes them
        too): every cert_refresh s, from the start of a session, ask for the
        certificates of every organization held; and when pins.json changes
        (``semq node trust`` in another process) read it again and ask for
        the organizations whose pins changed."""
        sec = self.core.sec
        assert sec is not None
        me = self.core.me.node_id
        last = -1e18
        while True:
            now = trio.current_time()
            if now - last >= self.s.cert_refresh:
                last = now
                orgs = [Endpoint.org(o) for o in sec.directory.orgs() if o != me]
                if orgs:
                    await fs.send(b"".join(self._request(ep) for ep in orgs))
            if sec.pins.changed():
                before = sec.pins.snapshot()
                try:
                    await trio.to_thread.run_sync(sec.pins.reload, limiter=self._certs_limiter)
                except (ValueError, OSError) as e:
                    log.error("%s", e)
                else:
                    after = sec.pins.snapshot()
                    changed = sorted(o for o in before.keys() | after.keys() if before.get(o) != after.get(o))
                    if changed:
                        log.info("pins changed for %s: asking for their certificates again", ", ".join(changed))
                        eps = [Endpoint.org(o) for o in changed]
                        for ep in eps:
                            self.retry.pop(ep, None)
                        await fs.send(b"".join(self._request(ep) for ep in eps))
            await trio.sleep(self.s.pins_check)

    async def _inquirer(self, fs: FrameStream) -> None:
        step = max(0.05, min(1.0, self.core.inquiry_ms / 3000))
        while True:
            await trio.sleep(step)
            out = await self.gate.run(self.core.inquiries)
            await fs.send(b"".join(out.data))

    async def _pinger(self, fs: FrameStream, scope: trio.CancelScope) -> None:
        nonce = 0
        while True:
            await trio.sleep(self.s.ping_interval)
            if trio.current_time() - self.last_rx > self.s.idle_timeout:
                log.warning("no traffic from the platform for %.0f s: reconnecting", self.s.idle_timeout)
                scope.cancel()
                return
            nonce += 1
            await fs.send(encode_frame(Frame(kind=Kind.PING, source=self.core.me, target=self.core.platform,
                                             body=Ping(nonce=nonce, time_ms=now_ms()))))

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
            if idle and not (self.drain is not None and self.drain.requested):
                # Only when something was committed since the last look (an
                # application's send): no write lock five times a second on
                # an idle node, and the states held in memory stay there.
                version = None
                watch = self._watcher()
                if watch is not None:
                    try:
                        version = int(watch.execute("PRAGMA data_version").fetchone()[0])
                    except sqlite3.Error:
                        version = None
                if version is None or version != seen:
                    seen = version
                    out = await self.gate.run(partial(self.core.claim, self.s.batch, only=me, write_held=False))
                    if out.local:
                        await self.loopback(out.local)
                        continue
            await trio.sleep(LOCAL_POLL)

    async def _gaps(self) -> None:
        """Failed ordered documents get their gap notices (semq.node.channels)."""
        while True:
            await trio.sleep(GAP_POLL)
            if await self.gate.run(self.core.announce_gaps):
                self.wake()

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.s.housekeeping_interval)
            await self.gate.run(self.core.housekeeping)


_ = Endpoint
