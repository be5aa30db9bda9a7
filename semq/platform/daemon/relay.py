"""``semq platform run``: the relay, a thin trio shell around PlatformCore.
Knows who is online, forwards, stores, delivers stored copies when their
target connects, relays end-to-end acks and inquiries, asks about stored
copies delivered but not acked.

What crosses into the store thread is data: a snapshot of the targets'
room (``_room``) and, for the frames that leave before a commit, the
daemon's one ``ForwardPort`` (STYLE, "data crosses the thread boundary, not
closures").

A connection comes in through the ``Door`` (semq.platform.daemon.door: TLS,
admission, HELLO); an accepted one is a ``Session`` (its queue and writer,
semq.platform.daemon.session) read by the session layer
(semq.session.reader), with what the relay registers (``_reader``); the
CA's state is the ``CaWatch``'s (semq.platform.daemon.ca)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Final, TypeVar

import trio

from semq.session.admission import raise_descriptor_limit
from semq.session.ports import BatchObserver, DrainSignal
from semq.session.reader import Handler, SessionReader, first_exception
from semq.session.transport import ByteBudget, ConnectionClosed, FrameStream
from semq.store.db import STORE_ERRORS
from semq.store.gate import StoreGate
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    CertRequest,
    Endpoint,
    Error,
    Frame,
    Hello,
    Kind,
    Nack,
    PeerAnnounce,
    PeerInfo,
    PeerLookup,
    PresenceQuery,
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
from .ca import CaWatch
from .door import Door
from .session import ForwardPort, Forwards, Seen, Session
from .settings import PlatformSettings

__all__ = ["PlatformDaemon"]

log = logging.getLogger("semq.platform")

T = TypeVar("T")


_ANNOUNCE_EVERY: Final = 1.0  # s: at most one direct-link announcement recorded per session per second
_PRESENCE_EVERY: Final = 2.0  # s: at most one PRESENCE_QUERY answered per session (docs/security.md)
_HEADER_MIN: Final = 6  # bytes frame_save_fwd reads at least (a shorter string is no frame: stored, refused there)
_DISCARD: Final = int(SaveFwd.DISCARD)
_IDLE_LOOK = 30.0  # s: an idle session's safety look at the store


class PlatformDaemon:
    def __init__(self, core: PlatformCore, settings: PlatformSettings) -> None:
        self.core = core
        self.s = settings
        self.gate = StoreGate()
        self.sessions: dict[Endpoint, Session] = {}
        self.grants: dict[str, int] = {}  # units granted to each organization seen (PlatformCore.units_granted)
        self.budgets: dict[str, ByteBudget] = {}  # organization -> its connections' byte budget
        self.port: int | None = None
        self.stats = {"connections": 0, "frames_in": 0, "refused": 0, "tls_refused": 0}
        self.ca = CaWatch(settings, core, self._store, self.sessions)
        # A connection's way in (TLS, who may hold a connection: semq.session.admission; HELLO).
        self.door = Door(settings, core, self.ca, self.grants, self.stats, self._session)
        self.admission = self.door.admission
        # semq.ops sets these when the daemon runs from the CLI.
        self.drain: DrainSignal | None = None  # 'semq admin drain': no new sessions or deliveries
        self.metrics: BatchObserver | None = None
        # The frames the store thread forwards before a commit (_forwarder).
        self._forward_port: ForwardPort | None = None
        self._forwards_in: trio.MemoryReceiveChannel[Forwards] | None = None
        self._drain_lock = trio.Lock()

    async def _store(self, fn: Callable[..., T], *args: Any) -> T:
        """A store call through the relay's gate (the one it holds now:
        tests put one of their own in its place)."""
        return await self.gate.run(fn, *args)

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
                    nursery.start_soon(self.ca.watch)
                if self.core.presence is not None:
                    await self.gate.run(self.core.join_cluster, f"{self.s.host}:{self.port}")
                    if self.s.security is not None:
                        await self.gate.run(self.core.share_ca, self.s.security.pdir / "ca")
                        await self.ca.check()
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

    async def _handle(self, stream: trio.abc.Stream) -> None:
        """One connection the listener accepted (through the Door)."""
        await self.door.handle(stream)

    def _budget(self, org: str) -> ByteBudget:
        b = self.budgets.get(org)
        if b is None:
            b = self.budgets[org] = ByteBudget(max(self.s.max_buffer_per_org, self.s.max_frame))
        return b

    async def _session(self, fs: FrameStream, org: Endpoint, hello: RawFrame, body: Hello, first: list[RawFrame],
                       bound: str | None, seen: Seen) -> None:
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
                session.enqueue([self.ca.crl_frame(route_org(ep))])
            with session.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.write)
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
            Kind.PRESENCE_QUERY: partial(self._presence_query, session),
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
        session.enqueue([await self.ca.cert_response(route_org(session.endpoint), req.endpoint)])

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

    async def _presence_query(self, session: Session, raw: RawFrame) -> None:
        """Whether the organizations a node names are online (PRESENCE).
        One query per session every _PRESENCE_EVERY s: more are ignored
        (the node answers its operator from what it was told last)."""
        query = raw.frame().body
        assert isinstance(query, PresenceQuery)
        now = trio.current_time()
        if now - session.asked_at < _PRESENCE_EVERY:
            self.stats["presence_ignored"] = self.stats.get("presence_ignored", 0) + 1
            return
        session.asked_at = now
        asked = set(query.orgs)
        here: dict[str, int] = {}
        for ep, s in self.sessions.items():  # (bounded: one query per session every _PRESENCE_EVERY s)
            org = route_org(ep).node_id
            if org in asked:
                here[org] = min(here.get(org, s.since_ms), s.since_ms)
        try:
            answer = await self.gate.run(self.core.presence_of, query.orgs, here)
        except STORE_ERRORS as e:
            log.error("presence of %d organizations for %s not answered: store error: %s", len(asked),
                      session.endpoint, e)
            return
        session.enqueue([encode_frame(Frame(kind=Kind.PRESENCE, source=self.core.me,
                                            target=route_org(session.endpoint), body=answer))])

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

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(self.s.housekeeping_interval)
            try:
                await self.gate.run(self.core.housekeeping)
            except STORE_ERRORS as e:
                log.error("housekeeping: store error: %s", e)
