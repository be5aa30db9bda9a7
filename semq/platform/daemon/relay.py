"""``semq platform run``: the relay, a thin trio shell around PlatformCore.
Knows who is online, forwards, stores, delivers stored copies when their
target connects, relays end-to-end acks and inquiries, asks about stored
copies delivered but not acked.

What crosses into the store thread is data: a snapshot of the targets'
room (``_room``) and, for the frames that leave before a commit, the
daemon's one ``ForwardPort`` (STYLE, "data crosses the thread boundary, not
closures")."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Final

import trio

from semq.identity.crypto import CryptoError
from semq.identity.security import PlatformSecurity
from semq.session.admission import Admission, raise_descriptor_limit
from semq.session.ports import BatchObserver, DrainSignal
from semq.session.reader import Handler, SessionReader, first_exception
from semq.session.transport import ByteBudget, ConnectionClosed, FrameStream
from semq.settings.bounds import (
    FD_RESERVE,
    PLATFORM_BUFFER_MIB_PER_ORG,
    PLATFORM_HANDSHAKES,
    PLATFORM_HELLO_S,
    PLATFORM_MAX_CONNECTIONS,
    PLATFORM_PRE_AUTH_BYTES,
)
from semq.store.db import STORE_ERRORS
from semq.store.gate import StoreGate
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    CertRequest,
    CertResponse,
    Crl,
    Endpoint,
    Error,
    Frame,
    Hello,
    Kind,
    Nack,
    NodeType,
    PeerAnnounce,
    PeerInfo,
    PeerLookup,
    ProtocolError,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    SaveFwd,
    Welcome,
    encode_frame,
    frame_save_fwd,
)
from semq.umxt_protocol.units import MAX_UNITS, route_of, route_org

from ..core import PlatformCore, PlatformOutput, Room

__all__ = ["ForwardPort", "PlatformDaemon", "PlatformSettings", "Session"]

log = logging.getLogger("semq.platform")


@dataclass
class PlatformSettings:
    host: str = "127.0.0.1"
    port: int = 7410
    window: int = 4096  # stored copies in flight to one node without its ACK
    batch: int = 512
    high_water: int = 16 * 1024 * 1024  # bytes queued for one node before it counts as offline
    hello_timeout: float = PLATFORM_HELLO_S
    idle_timeout: float = 60.0
    max_frame: int = DEFAULT_MAX_FRAME
    # Connections one organization may hold at once (its certificate's, from
    # the TLS handshake on; without security, from HELLO). A node needs
    # one; more while it reconnects.
    max_connections_per_org: int = 4
    # Units one organization's node may run (semq.umxt_protocol.units): what its HELLO
    # may claim at most; each unit granted to it (semq platform register
    # --units) holds a connection, one more each beyond the first.
    max_units_per_org: int = 8
    # The listener's bounds (semq.settings.bounds): connections in all, connections
    # not authenticated yet, descriptors kept for the relay's own use, and
    # the bytes one organization's connections may buffer together.
    max_connections: int = PLATFORM_MAX_CONNECTIONS
    max_handshakes: int = PLATFORM_HANDSHAKES
    fd_reserve: int = FD_RESERVE
    max_buffer_per_org: int = PLATFORM_BUFFER_MIB_PER_ORG << 20
    housekeeping_interval: float = 3600.0
    # Mutual TLS 1.3 and the certificate directory (semq.identity.security); None = plain TCP.
    security: PlatformSecurity | None = None
    crl_check_interval: float = 2.0


_SLICE = 1 << 20  # bytes per write to a node
_ANNOUNCE_EVERY: Final = 1.0  # s: at most one direct-link announcement recorded per session per second
_HEADER_MIN: Final = 6  # bytes frame_save_fwd reads at least (a shorter string is no frame: stored, refused there)
_DISCARD: Final = int(SaveFwd.DISCARD)
_IDLE_LOOK = 30.0  # s: an idle session's safety look at the store


@dataclass
class _Admitted:
    """Which organization a connection was admitted as (Admission), once known."""

    org: str | None = None


@dataclass
class _Seen:
    """What the platform saw of a connection: the host it came from (a
    direct-link announcement may ask for it) and the fingerprint of the
    certificate it presented."""

    host: str | None
    fingerprint: str = ""


def _peer_host(stream: trio.abc.Stream) -> str | None:
    sock = getattr(stream, "socket", None)
    try:
        return str(sock.getpeername()[0]) if sock is not None else None
    except (OSError, IndexError):
        return None


class Session:
    """One connected node: its outgoing queue (bounded by high_water: a slow
    node gets its documents stored, not buffered) and its delivery window."""

    def __init__(self, endpoint: Endpoint, fs: FrameStream, window: int) -> None:
        self.endpoint = endpoint
        self.fs = fs
        self.queue: list[bytes] = []
        self.queued = 0
        self.window = self.max_window = window
        self.in_flight = 0
        # Stored copies may wait for this node: true at the start, set when
        # something is stored for it, cleared when a claim finds nothing.
        self.pending = True
        self.wake_writer = trio.Event()
        self.wake_deliver = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.seen = _Seen(None)
        self.announced_at = -1e9  # when its last direct-link announcement was recorded (trio time)

    def enqueue(self, data: Sequence[bytes]) -> None:
        if data:
            self.queue.extend(data)
            self.queued += sum(map(len, data))
            self.wake_writer.set()


Forwards = Mapping[Endpoint, list[bytes]]


class ForwardPort:
    """The daemon's RelayPort (semq.session.ports): the store thread puts
    the frames for online targets here before its batch's commit; they go
    into a memory channel that the sessions drain on the event loop
    (``PlatformDaemon._drain_forwards``). It holds a trio token and the
    channel's send end, nothing of the daemon. ``put`` does not wait for the
    event loop (``run_sync_soon``, not ``from_thread.run_sync``): the commit
    goes on while the frames travel."""

    def __init__(self, token: trio.lowlevel.TrioToken, channel: trio.MemorySendChannel[Forwards]) -> None:
        self._token = token
        self._channel = channel

    def put(self, frames: Forwards) -> None:
        """On the store thread."""
        try:
            self._token.run_sync_soon(self._send, frames)
        except trio.RunFinishedError:
            pass  # the relay has stopped: lost as on a broken connection

    def _send(self, frames: Forwards) -> None:
        # On the event loop, outside any task: it must not raise (the
        # channel's buffer is unbounded; each item is one batch's frames).
        try:
            self._channel.send_nowait(frames)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


class PlatformDaemon:
    def __init__(self, core: PlatformCore, settings: PlatformSettings) -> None:
        self.core = core
        self.s = settings
        self.gate = StoreGate()
        self.sessions: dict[Endpoint, Session] = {}
        # Who may hold a connection (semq.session.admission). ``grants``: the units
        # granted to each organization seen (PlatformCore.units_granted), for
        # its allowance.
        self.admission = Admission("platform", total=settings.max_connections, handshakes=settings.max_handshakes,
                                   per_identity=self._allowance, reserve=settings.fd_reserve)
        self.grants: dict[str, int] = {}
        self.budgets: dict[str, ByteBudget] = {}  # organization -> its connections' byte budget
        self.port: int | None = None
        self.stats = {"connections": 0, "frames_in": 0, "refused": 0, "tls_refused": 0}
        self.ssl_context = settings.security.ssl_context() if settings.security else None
        self._ca_lock = trio.Lock()  # one reload of the CA state at a time (_ca_check)
        # semq.ops sets these when the daemon runs from the CLI.
        self.drain: DrainSignal | None = None  # 'semq admin drain': no new sessions or deliveries
        self.metrics: BatchObserver | None = None
        # The frames the store thread forwards before a commit (_forwarder).
        self._forward_port: ForwardPort | None = None
        self._forwards_in: trio.MemoryReceiveChannel[Forwards] | None = None
        self._drain_lock = trio.Lock()

    def _room(self, msgs: Sequence[RawFrame] = ()) -> Room:
        """The snapshot a store call routes by (core.Room): each connected
        target's room below the high-water mark, taken now, on the event
        loop. With more sessions than frames, only the targets of ``msgs``
        (the sessions' count must not cost every batch). Taken before the
        call waits for the gate, it may be a few batches old by the time the
        call runs: a target's queue may pass its high-water mark by what the
        batches waiting for the gate forward, each bounded by its reader."""
        sessions, hw = self.sessions, self.s.high_water
        if msgs and len(sessions) > len(msgs):
            targets = {m.target for m in msgs}
            return MappingProxyType({t: hw - s.queued for t in targets if (s := sessions.get(t)) is not None})
        return MappingProxyType({ep: hw - s.queued for ep, s in sessions.items()})

    def _forwarder(self) -> ForwardPort:
        """The daemon's one ForwardPort, made on first use (it needs the
        running event loop's token)."""
        if self._forward_port is None:
            send, self._forwards_in = trio.open_memory_channel[Forwards](math.inf)
            self._forward_port = ForwardPort(trio.lowlevel.current_trio_token(), send)
        return self._forward_port

    async def _drain_forwards(self) -> None:
        """Every session runs this; one at a time holds the lock and hands
        the port's frames to their targets' queues, so batches keep their
        order, and frames are drained whenever any session is connected
        (only a session's batch puts any). A session that ends hands over
        to the next: an item is taken whole or left in the channel."""
        self._forwarder()
        assert self._forwards_in is not None
        async with self._drain_lock:
            async for forwards in self._forwards_in:
                self._enqueue_forwards(forwards)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; ``task_status`` gets the bound port."""
        raise_descriptor_limit()
        # The grants known now: the units of a node of several may all
        # connect before any of them said HELLO (which reads its grant again).
        self.grants.update(await self.gate.run(self.core.granted))
        listeners = await trio.open_tcp_listeners(self.s.port, host=self.s.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("platform %s listening on %s:%s", self.core.me, self.s.host, self.port)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._inquirer)
                nursery.start_soon(self._housekeeping)
                if self.s.security is not None:
                    nursery.start_soon(self._watch_crl)
                if self.core.presence is not None:
                    await self.gate.run(self.core.join_cluster, f"{self.s.host}:{self.port}")
                    if self.s.security is not None:
                        await self.gate.run(self.core.share_ca, self.s.security.pdir / "ca")
                        await self._ca_check()
                    nursery.start_soon(self._sweeper)
                    nursery.start_soon(self._wake_listener)
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self.port)
        finally:
            if self.core.presence is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.gate.run(self.core.leave_cluster)
                    except STORE_ERRORS as e:
                        log.warning("leaving the cluster: %s (the others take this instance as gone"
                                    " when its heartbeat stops)", e)

    async def _tls(self, stream: trio.abc.Stream) -> tuple[trio.abc.Stream, str, str] | None:
        """Mutual TLS 1.3: a certificate not issued by our CA, expired or
        revoked is refused at the handshake. Returns the stream, the
        organization the client certificate names and its fingerprint, or
        None (closed)."""
        assert self.ssl_context is not None and self.s.security is not None
        tls = trio.SSLStream(stream, self.ssl_context, server_side=True)
        try:
            with trio.fail_after(self.s.hello_timeout):
                await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
            org = self.s.security.peer_org(der)
            fp = hashlib.sha256(der).hexdigest() if der else ""
        except (trio.BrokenResourceError, trio.TooSlowError, CryptoError) as e:
            self.stats["tls_refused"] += 1
            log.warning("TLS handshake refused: %s", e.__cause__ or e)
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()
            return None
        return tls, org, fp

    async def _handle(self, stream: trio.abc.Stream) -> None:
        self.stats["connections"] += 1
        adm = self.admission
        if adm.enter() is not None:  # (said in the log, rate-limited)
            self.stats["connections_refused"] = self.stats.get("connections_refused", 0) + 1
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()
            return
        admitted = _Admitted()
        try:
            await self._connection(stream, admitted)
        finally:
            adm.leave(admitted.org)

    async def _connection(self, stream: trio.abc.Stream, admitted: _Admitted) -> None:
        bound: str | None = None
        seen = _Seen(_peer_host(stream))
        if self.ssl_context is not None:
            res = await self._tls(stream)
            if res is None:
                return
            stream, bound, seen.fingerprint = res
        # Until its HELLO is accepted, a peer gets no more than a small frame.
        fs = FrameStream(stream, max_frame=min(PLATFORM_PRE_AUTH_BYTES, self.s.max_frame))
        if bound is not None and not await self._admit(fs, bound, admitted):
            return
        await self._serve(fs, bound, seen, admitted)

    def _allowance(self, org: str) -> int:
        """Connections ``org`` may hold: ``max_connections_per_org``, one more
        per unit granted beyond the first (never what its HELLO says)."""
        units = min(self.grants.get(org, 1), self.s.max_units_per_org)
        return self.s.max_connections_per_org + units - 1

    async def _admit(self, fs: FrameStream, org: str, admitted: _Admitted) -> bool:
        """Count the connection for ``org`` (Admission), or refuse it."""
        why = self.admission.admit(org)
        if why is not None:
            self.stats["connections_refused"] = self.stats.get("connections_refused", 0) + 1
            await fs.send_error(self.core.me, Endpoint.org(org), ResultCode.TOO_MANY_CONNECTIONS, why)
            return False
        admitted.org = org
        return True

    def _budget(self, org: str) -> ByteBudget:
        b = self.budgets.get(org)
        if b is None:
            b = self.budgets[org] = ByteBudget(max(self.s.max_buffer_per_org, self.s.max_frame))
        return b

    async def _serve(self, fs: FrameStream, bound: str | None, seen: _Seen, admitted: _Admitted) -> None:
        try:
            with trio.fail_after(self.s.hello_timeout):
                first = await fs.receive_batch()
        except trio.TooSlowError:
            await fs.send_error(self.core.me, None, ResultCode.HANDSHAKE_TIMEOUT, "no HELLO within the time limit")
            return
        except RemoteProtocolError as e:
            await fs.send_error(self.core.me, None, e.code, str(e))
            return
        except ConnectionClosed:
            await fs.aclose()
            return
        hello = first[0]
        if hello.kind is not Kind.HELLO:
            await fs.send_error(self.core.me, hello.source, ResultCode.NOT_AUTHENTICATED,
                                f"first frame must be HELLO, not {hello.kind.name}")
            return
        try:
            body = hello.frame().body
            assert isinstance(body, Hello)
        except ProtocolError as e:
            await fs.send_error(self.core.me, hello.source, e.code, str(e))
            return
        ep = hello.source
        if ep.node_type is not NodeType.ORGANIZATION:
            await fs.send_error(self.core.me, ep, ResultCode.AUTH_FAILED,
                                f"only organizations connect here, not a {ep.node_type.name.lower()} ({ep})")
            return
        if bound is None and not await self._admit(fs, ep.node_id, admitted):
            return  # (without TLS the organization is known from HELLO on)
        await self._session(fs, ep, hello, body, first, bound, seen)

    async def _session(self, fs: FrameStream, org: Endpoint, hello: RawFrame, body: Hello, first: list[RawFrame],
                       bound: str | None, seen: _Seen) -> None:
        if bound is not None and org != Endpoint.org(bound):
            # An organization can only speak as itself (SPEC "Security").
            log.warning("certificate of %s used to claim %s: refused", bound, org)
            await fs.send_error(self.core.me, org, ResultCode.AUTH_FAILED,
                                f"the TLS certificate names organization {bound}, not {org}")
            return
        if body.units > min(MAX_UNITS, self.s.max_units_per_org):
            await fs.send_error(self.core.me, org, ResultCode.INVALID_FIELD,
                                f"units {body.units} exceeds the {min(MAX_UNITS, self.s.max_units_per_org)}"
                                " an organization may run here (max_units_per_org)")
            return
        # Each unit of a node is its own session, under its route (semq.umxt_protocol.units).
        ep = route_of(org, body.semq_id)
        try:
            # The units an organization runs are the operator's grant, never
            # its own say: its HELLO cannot raise its connection allowance.
            granted = self.grants[org.node_id] = await self.gate.run(self.core.units_granted, org)
            if body.units > granted:
                await fs.send_error(self.core.me, org, ResultCode.INVALID_FIELD,
                                    f"units {body.units} exceeds the {granted} unit(s) organization {org.node_id}"
                                    f" is granted here; the platform's operator grants more with 'semq platform"
                                    f" register {org.node_id} --units {body.units}'")
                return
            allowed = hello.origin == org and await self.gate.run(self.core.connected, ep, body.units)
        except STORE_ERRORS as e:
            log.error("%s cannot be admitted now: store error: %s", ep, e)
            await fs.send_error(self.core.me, ep, ResultCode.INTERNAL_ERROR,
                                "the platform's store is unavailable; try again later")
            return
        if not allowed:
            await fs.send_error(self.core.me, ep, ResultCode.AUTH_FAILED, f"{ep} may not connect here")
            return
        if self.drain is not None and self.drain.requested:
            await fs.send_error(self.core.me, ep, ResultCode.SHUTTING_DOWN, "the platform is draining; try later")
            return
        old = self.sessions.get(ep)
        if old is not None:
            log.info("%s connected again; closing its older session", ep)
            old.cancel_scope.cancel()
        session = Session(ep, fs, min(self.s.window, body.window))
        session.seen = seen
        self.sessions[ep] = session
        # An accepted session: documents up to the frame limit, what its
        # organization's connections buffer together within their budget.
        fs.decoder.max_frame_size = self.s.max_frame
        fs.budget = self._budget(org.node_id)
        log.info("%s online", ep)
        try:
            await fs.send(encode_frame(Frame(kind=Kind.WELCOME, source=self.core.me, target=route_org(ep),
                                             body=Welcome(window=self.s.window, server_time_ms=now_ms(),
                                                          session_id=self.stats["connections"]))))
            if self.s.security is not None:
                # The node applies revocations that happened while it was away.
                session.enqueue([self._crl_frame(route_org(ep))])
            with session.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, session, nursery.cancel_scope)
                    nursery.start_soon(self._deliverer, session)
                    nursery.start_soon(self._drain_forwards)
                    await self._reader(session).run(first[1:])
        except* ConnectionClosed:
            pass  # (also BYE, and a node that spoke for another organization: told why)
        except* RemoteProtocolError as eg:
            err = first_exception(eg)
            assert isinstance(err, RemoteProtocolError)
            log.warning("%s sent bad bytes (code %d): %s", ep, err.code, err)
            await fs.send_error(self.core.me, ep, err.code, str(err))
        except* trio.TooSlowError:
            await fs.send_error(self.core.me, ep, ResultCode.IDLE_TIMEOUT,
                                f"nothing received for {self.s.idle_timeout:.0f} s")
        except* Exception:
            # A bug must cost one connection, never the relay.
            log.exception("session of %s failed", ep)
            await fs.send_error(self.core.me, ep, ResultCode.INTERNAL_ERROR, "internal error")
        finally:
            if self.sessions.get(ep) is session:
                del self.sessions[ep]
                with trio.CancelScope(shield=True):
                    await self.gate.run(self.core.disconnected, ep)
                log.info("%s offline", ep)
            await fs.aclose()
            budget = self.budgets.get(org.node_id)
            if budget is not None and not len(budget):
                del self.budgets[org.node_id]

    def _reader(self, session: Session) -> SessionReader:
        """The session's reader (semq.session.reader): what the relay
        registers. A node's ERROR is not logged (a node must not fill the
        relay's log); a PONG goes through the session's queue, like every
        frame the relay writes."""
        org = route_org(session.endpoint)  # (the endpoint: the route of the node's unit, semq.umxt_protocol.units)

        async def send(frame: bytes) -> None:
            session.enqueue([frame])

        handlers: dict[Kind, Handler] = {
            Kind.HELLO: self._hello_again,
            Kind.CERT_REQUEST: partial(self._cert_request, session),
            Kind.PEER_ANNOUNCE: partial(self._peer_announce, session),
            Kind.PEER_LOOKUP: partial(self._peer_lookup, session),
        }
        return SessionReader(session.fs, me=self.core.me, peer=org, name=str(session.endpoint),
                             messages=partial(self._messages, session), handlers=handlers, send=send,
                             idle=self.s.idle_timeout, log_errors=False, log=log)

    @staticmethod
    async def _hello_again(_raw: RawFrame) -> None:
        raise RemoteProtocolError("HELLO on an established session", ResultCode.UNEXPECTED_FRAME)

    async def _cert_request(self, session: Session, raw: RawFrame) -> None:
        req = raw.frame().body
        assert isinstance(req, CertRequest)
        session.enqueue([await self._cert_response(route_org(session.endpoint), req.endpoint)])

    async def _peer_announce(self, session: Session, raw: RawFrame) -> None:
        ann = raw.frame().body
        assert isinstance(ann, PeerAnnounce)
        now = trio.current_time()
        if now - session.announced_at < _ANNOUNCE_EVERY:
            # A node renews at a third of the lifetime: more than one a
            # second is a loop or a flood, not worth a write each.
            self.stats["announce_ignored"] = self.stats.get("announce_ignored", 0) + 1
            return
        session.announced_at = now
        try:
            await self.gate.run(self.core.announce_peer, route_org(session.endpoint), ann, session.seen.host,
                                session.seen.fingerprint)
        except STORE_ERRORS as e:  # the node announces again within its lifetime
            log.error("direct-link addresses of %s not recorded: store error: %s", session.endpoint, e)

    async def _peer_lookup(self, session: Session, raw: RawFrame) -> None:
        look = raw.frame().body
        assert isinstance(look, PeerLookup)
        org = route_org(session.endpoint)
        try:
            info = await self.gate.run(self.core.lookup_peer, org, look.endpoint)
        except STORE_ERRORS as e:
            log.error("direct-link look-up of %s for %s failed: store error: %s", look.endpoint, session.endpoint, e)
            info = PeerInfo(endpoint=look.endpoint, code=ResultCode.STORE_ERROR)
        session.enqueue([encode_frame(Frame(kind=Kind.PEER_INFO, source=self.core.me, target=org, body=info))])

    async def _messages(self, session: Session, msgs: list[RawFrame]) -> None:
        """One batch of a node's message frames: one store transaction."""
        msgs = self._incoming(session, msgs)
        msgs = self._over_window(session, msgs)
        if not msgs:
            return
        ep = session.endpoint
        org = route_org(ep)
        self.stats["frames_in"] += len(msgs)
        t0 = time.perf_counter()
        out = await self.gate.run(self.core.handle, ep, msgs, self._room(msgs), None, self._forwarder())
        if self.metrics is not None:
            self.metrics.observe_batch(len(msgs), time.perf_counter() - t0)
        self._dispatch(out)
        errors = [encode_frame(Frame(kind=Kind.ERROR, source=self.core.me, target=org,
                                     body=Error(code=code, message=text[:1024])))
                  for code, text in out.errors]
        for code, text in out.errors:
            self.stats["refused"] += 1
            log.warning("refused from %s (%s): %s", ep, code.name, text)
        if any(code is ResultCode.SOURCE_MISMATCH for code, _ in out.errors):
            # An organization speaks only as itself: say why, then close
            # (written directly: the writer task is about to be cancelled).
            with trio.move_on_after(2):
                await session.fs.send(b"".join([*session.queue, *errors]))
            raise ConnectionClosed(f"{ep} spoke for another organization: closed")
        session.enqueue(errors)

    def _incoming(self, session: Session, msgs: list[RawFrame]) -> list[RawFrame]:
        """The message frames a node sent, before they are handled. Here,
        all of them; a test tool's dishonest relay (semq.testing.dishonest)
        drops, alters and forges here, as a relay operator could."""
        return msgs

    def _over_window(self, session: Session, msgs: list[RawFrame]) -> list[RawFrame]:
        """Seed 004 flow control: a node may have at most ``window`` DATA
        frames unacknowledged; the platform acks each batch after its commit,
        so everything in one read beyond the window is over it. Those are
        refused with OVER_WINDOW (nothing stored) and the node slows down."""
        data = [m for m in msgs if m.kind is Kind.DATA]
        if len(data) <= self.s.window:
            return msgs
        over = set(map(id, data[self.s.window:]))
        nacks = []
        for m in data[self.s.window:]:
            try:
                lk0 = m.data_prefix()[0]
            except RemoteProtocolError:
                continue
            nacks.append(encode_frame(Frame(kind=Kind.NACK, source=self.core.me, target=route_org(session.endpoint),
                                            body=Nack(lk0=lk0, code=ResultCode.OVER_WINDOW,
                                                      message=f"over the window of {self.s.window} frames"))))
        self.stats["over_window"] = self.stats.get("over_window", 0) + len(nacks)
        log.warning("%s sent %d DATA frames beyond its window of %d", session.endpoint, len(over), self.s.window)
        session.enqueue(nacks)
        return [m for m in msgs if id(m) not in over]

    def _enqueue_forwards(self, forwards: Forwards) -> None:
        for target, data in forwards.items():
            s = self.sessions.get(target)
            if s is not None:
                s.enqueue(data)

    def _dispatch(self, out: PlatformOutput) -> None:
        for target, data in out.sends.items():
            s = self.sessions.get(target)
            if s is not None:
                s.enqueue(data)
        for target, n in out.credit.items():
            s = self.sessions.get(target)
            if s is not None and n:
                s.in_flight = max(0, s.in_flight - n)
                # Additive increase back to the agreed window after a decrease.
                s.window = min(s.max_window, s.window + n // 8 + 1)
                s.wake_deliver.set()
        for target, n in out.over_window.items():
            s = self.sessions.get(target)
            if s is not None and n:
                # Multiplicative decrease: the node is over its window.
                s.window = max(16, s.window // 2)
                self.stats["over_window_in"] = self.stats.get("over_window_in", 0) + n
                log.warning("%s refused %d copies over its window: delivery window now %d", target, n, s.window)
        for target in out.stored_for:
            s = self.sessions.get(target)
            if s is not None:
                s.pending = True
                s.wake_deliver.set()

    async def _writer(self, session: Session, scope: trio.CancelScope) -> None:
        try:
            while True:
                await session.wake_writer.wait()
                session.wake_writer = trio.Event()
                q = session.queue
                while q:
                    # ~1 MiB per send: coalesced, yet never a second copy of a
                    # whole queue; ``queued`` (what high_water bounds) counts
                    # a slice until it is written.
                    end, size = 0, 0
                    while end < len(q) and size < _SLICE:
                        size += len(q[end])
                        end += 1
                    chunk = b"".join(q[:end])
                    del q[:end]
                    await session.fs.send(chunk)
                    session.queued -= size
                if session.in_flight < session.window:
                    session.wake_deliver.set()
        finally:
            scope.cancel()

    async def _deliverer(self, session: Session) -> None:
        """SPEC P.2: stored copies go out when their target is connected, in
        batches, at most ``window`` unacknowledged."""
        while True:
            room = session.window - session.in_flight
            if self.drain is not None and self.drain.requested:
                room = 0  # draining: deliver no more stored copies; acks still come in
            if session.pending and room > 0 and session.queued < self.s.high_water // 2:
                frames, n = await self.gate.run(self.core.claim_stored, session.endpoint, min(self.s.batch, room),
                                                self.s.high_water // 2)
                if frames:
                    session.in_flight += n
                    session.enqueue(frames)
                    continue
                # Nothing stored for it now: no more store calls for an idle
                # node until something is stored for it (``pending``), bar a
                # slow safety look now and then.
                session.pending = False
            session.wake_deliver = trio.Event()
            with trio.move_on_after(_IDLE_LOOK):
                await session.wake_deliver.wait()
                continue
            session.pending = True

    def _wake(self, targets: Sequence[Endpoint]) -> None:
        """Stored frames wait for these targets (held here): deliver."""
        for ep in targets:
            s = self.sessions.get(ep)
            if s is not None:
                s.pending = True
                s.wake_deliver.set()

    async def _sweeper(self) -> None:
        """Several instances on one store (semq.platform.cluster): every
        SWEEP_S the heartbeat, the look for frames stored for the
        organizations held here (the guarantee behind the wake-ups), and the
        end of sessions a newer connection at another instance took over."""
        from ..cluster import SWEEP_S

        while True:
            await trio.sleep(SWEEP_S)
            try:
                waiting, fenced = await self.gate.run(self.core.cluster_tick)
            except STORE_ERRORS as e:
                log.error("cluster heartbeat: store error, retrying: %s", e)
                continue
            self._wake(waiting)
            for ep in fenced:
                s = self.sessions.get(ep)
                if s is not None:
                    log.info("%s connected to another instance; closing its session here", ep)
                    s.cancel_scope.cancel()

    async def _wake_listener(self) -> None:
        """Wake-ups from other instances that stored frames for organizations
        held here (LISTEN on the instance's own connection)."""
        from ..cluster import WakeListener

        assert self.core.presence is not None
        listener = WakeListener(self.core.store_url, self.core.presence.instance)
        try:
            while True:
                got = await trio.to_thread.run_sync(listener.wait, 1.0, abandon_on_cancel=True)
                self._wake([ep for ep, frame in got if frame is None])
                await self._hopped([(ep, frame) for ep, frame in got if frame is not None])
        finally:
            listener.close()

    async def _hopped(self, frames: Sequence[tuple[Endpoint, bytes]]) -> None:
        """Frames another instance handed over for organizations held here:
        into their sessions' queues, like the frames this instance forwards.
        Those for a target no longer here, or whose queue is over its
        high-water mark, are stored for it instead (flow control stores,
        never buffers), and it is woken wherever it is."""
        hw = self.s.high_water
        later: list[bytes] = []
        dropped = 0
        for ep, frame in frames:
            s = self.sessions.get(ep)
            if s is not None and s.queued < hw:
                s.enqueue([frame])
                self.stats["hops_in"] = self.stats.get("hops_in", 0) + 1
            elif len(frame) >= _HEADER_MIN and frame_save_fwd(frame) == _DISCARD:
                # SaveFwd 1 is forwarded now or dropped, never stored: its
                # origin has its ACK_FWD and asks the target, which answers
                # that it lacks it (reported dropped, 301). Stored, it would
                # reach the target after that answer: delivered, yet
                # reported dropped.
                dropped += 1
            else:
                later.append(frame)
        if dropped:
            self.stats["hops_dropped"] = self.stats.get("hops_dropped", 0) + dropped
        if not later:
            return
        try:
            stored_for = await self.gate.run(self.core.store_handed_over, later)
        except (*STORE_ERRORS, RemoteProtocolError) as e:
            # Lost as a frame handed to a connection that died: its origin's
            # inquiry finds the target lacks it (ACK_FWD promised nothing).
            # Bytes that are no frame (written on the channel by something
            # else) cost this batch, never the instance.
            self.stats["hops_dropped"] = self.stats.get("hops_dropped", 0) + len(later)
            log.error("frames handed over by another instance: %d not stored: %s", len(later), e)
            return
        self.stats["hops_stored"] = self.stats.get("hops_stored", 0) + len(later)
        self._wake(list(stored_for))

    async def _inquirer(self) -> None:
        step = max(0.05, min(1.0, self.core.inquiry_ms / 3000))
        while True:
            await trio.sleep(step)
            try:
                sends = await self.gate.run(self.core.inquiries, self._room())
            except STORE_ERRORS as e:
                # Disk full, corrupt page: keep relaying what can be; retry later.
                log.error("inquiries: store error, retrying: %s", e)
                await trio.sleep(5)
                continue
            for target, data in sends.items():
                s = self.sessions.get(target)
                if s is not None:
                    s.enqueue(data)

    async def _cert_response(self, to: Endpoint, about: Endpoint) -> bytes:
        """The answer to a CERT_REQUEST: the usable certificates the CA
        issued; or, for an organization without one, why: CERT_REVOKED,
        AUTH_FAILED (expired), UNKNOWN_CERTIFICATE (known here, none
        issued yet) — the node's documents to it wait — or UNKNOWN_TARGET
        (the platform does not know it: they fail)."""
        sec = self.s.security
        body: CertResponse | None
        if sec is None:
            body = CertResponse(endpoint=about, code=ResultCode.UNKNOWN_CERTIFICATE)
        else:
            body = sec.cert_response(about)
            if body is None:
                # Perhaps enrolled a moment ago by another process (semq
                # platform enroll, node init --enroll-from): the CA issued
                # it, so it is served from then on, not from our next look.
                await self._ca_check()
                body = sec.cert_response(about)
            if body is None:
                known = about.node_type is NodeType.ORGANIZATION and await self.gate.run(self.core.is_known, about)
                body = CertResponse(endpoint=about,
                                    code=ResultCode.UNKNOWN_CERTIFICATE if known else ResultCode.UNKNOWN_TARGET)
        return encode_frame(Frame(kind=Kind.CERT_RESPONSE, source=self.core.me, target=to, body=body))

    def _crl_frame(self, to: Endpoint) -> bytes:
        assert self.s.security is not None
        return encode_frame(Frame(kind=Kind.CRL, source=self.core.me, target=to,
                                  body=Crl(der=self.s.security.crl_der)))

    async def _watch_crl(self) -> None:
        """``semq platform revoke`` / ``enroll`` rewrite the CA files; pick
        them up without a restart (_ca_check)."""
        while True:
            await trio.sleep(self.s.crl_check_interval)
            if self.core.pg:  # another instance's enrollments and revocations, through the store
                try:
                    await self.gate.run(self.core.share_ca, self.s.security.pdir / "ca")  # type: ignore[union-attr]
                except (*STORE_ERRORS, OSError) as e:
                    log.error("sharing the CA state through the store: %s", e)
            await self._ca_check()

    async def _ca_check(self) -> None:
        """If the CA's state changed (two stats; or its revocation list is
        due for re-signing): reload it — new TLS context, new directory —
        and tell every connected node: the new revocation list (CRL frame)
        and, for each organization whose usable certificates changed (a
        rollover, an enrollment, a revocation), its new CERT_RESPONSE, so
        senders stop sealing to a revoked key and pick up a new one within
        seconds. Sessions of revoked organizations are closed."""
        sec = self.s.security
        assert sec is not None
        async with self._ca_lock:
            if not sec.changed():
                return
            before, crl_before = dict(sec.fingerprints), sec.crl_der
            try:
                await trio.to_thread.run_sync(sec.reload)
            except (OSError, CryptoError) as e:
                # e.g. a file half-restored by hand, a full disk: keep serving
                # with what we hold, look again at the next check.
                log.error("cannot reload the CA state: %s", e)
                return
            self.ssl_context = sec.ssl_context()
            after = sec.fingerprints
            changed = sorted(o for o in before.keys() | after.keys() if before.get(o) != after.get(o))
            revoked = sec.revoked_orgs()
            answers = [sec.cert_response(Endpoint.org(o)) for o in changed]
            for ep, session in list(self.sessions.items()):
                if ep.node_id in revoked:
                    log.warning("%s is revoked: closing its session", ep)
                    session.enqueue([encode_frame(Frame(kind=Kind.ERROR, source=self.core.me, target=route_org(ep),
                                                        body=Error(code=ResultCode.CERT_REVOKED,
                                                                   message="certificate revoked")))])
                    session.cancel_scope.deadline = trio.current_time() + 1
                    continue
                push = [self._crl_frame(route_org(ep))] if sec.crl_der != crl_before else []
                push += [encode_frame(Frame(kind=Kind.CERT_RESPONSE, source=self.core.me, target=route_org(ep), body=a))
                         for a in answers if a is not None]
                session.enqueue(push)
            log.info("CA state reloaded (%d revoked organizations; certificates changed for %s)", len(revoked),
                     ", ".join(changed) or "none")

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.s.housekeeping_interval)
            try:
                await self.gate.run(self.core.housekeeping)
            except STORE_ERRORS as e:
                log.error("housekeeping: store error: %s", e)
