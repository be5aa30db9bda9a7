"""The platform's synchronous core: routing, stored copies, acks and
inquiries, one transaction per batch. The trio daemon (semq.platform.daemon)
owns the connections and calls this on its one store thread; every frame
in an Output may be sent because the method has committed when it returns.

Only data crosses into the store thread: which targets are online is a
snapshot (``Room``) taken on the event loop before the call, and the frames
that may leave before the commit go out through a ``RelayPort`` (STYLE,
"data crosses the thread boundary, not closures"). A stored copy changes
state only as ``STORED_TABLE`` says (semq.platform.engine), and the SQL
names states and kinds through their IntEnums.

The relay never parses a DATA body beyond its fixed prefix: it routes on the
header and forwards the bytes (MEASUREMENTS: "a relay only needs to route")."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final, NamedTuple

from peewee import SqliteDatabase

from semq.node.engine import OperatorAction, TransitionRefused
from semq.session.ports import RelayPort
from semq.store.db import (
    HOLD_MS,
    STORE_ERRORS,
    HeldWrites,
    SendOrder,
    delete_by_id,
    rows_by_id,
    split_held,
    take_held,
    translate,
)
from semq.store.pg import PgDatabase, is_pg_url, redact, store_connection
from semq.tracking.events import EventLog, now_ms
from semq.umxt_protocol import (
    FLAG_KEY_SEALED,
    FLAG_ORDERED,
    HEADER_SIZE,
    LK0,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    Chunk,
    ChunkAck,
    Endpoint,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Inquiry,
    InquiryAnswer,
    InquiryFlag,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    NodeType,
    PeerAnnounce,
    PeerInfo,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
    frame_save_fwd,
    lk1_from_wire,
    relay_bytes,
    relay_frame_bytes,
)
from semq.umxt_protocol.units import UNIT_SEP, holder, route_of, route_org, unit_for

from .cafiles import share_ca
from .chunks import CHUNK_DIR, MAX_KEPT_FILES, ChunkFiles, chunk_file_name
from .cluster import HOP_MAX_FRAME, LIVE_MS, Presence
from .engine import (
    STORED_TABLE,
    Route,
    StoredEvent,
    StoredState,
    route,
    state_answer,
    stored_operator_step,
    stored_step,
)
from .nodes import Nodes
from .peers import Peers, observed_addresses
from .seen import SEEN_RETENTION_MS, SeenAction, SeenDocuments
from .store import SENT_COPIES, open_platform_store

__all__ = ["PlatformCore", "PlatformOutput", "Room"]

Room = Mapping[Endpoint, int]
"""Which targets are online, as data: for each connected target, the bytes
its outgoing queue may still take before its high-water mark (zero or less:
full, so offline for routing: flow control stores, never buffers). A target
absent is offline. The daemon takes it on the event loop just before a store
call; ``handle`` subtracts what its own batch forwards."""


MAX_INQUIRY_BACKOFF_MS: Final = 15 * 60 * 1000
# (CHUNK and CHUNK_ACK: a large document's content and its receiver's
# progress, semq.node.large; relayed like an ACK2, never opened.)
_RELAYED: Final = frozenset({Kind.ACK2, Kind.REACK2, Kind.INQUIRY, Kind.INQUIRY_RESP, Kind.ACK_BATCH, Kind.NACK,
                             Kind.CHUNK, Kind.CHUNK_ACK})
_FORWARDED, _STORED, _DROPPED = int(SeenAction.FORWARDED), int(SeenAction.STORED), int(SeenAction.DROPPED)
_PLATFORM_FLAG: Final = int(AckFlag.PLATFORM)
_FORWARDED_FLAG: Final = int(ForwardFlag.FORWARDED)
_STORED_FLAG: Final = int(ForwardFlag.STORED)
_LOOKUP_CHUNK: Final = 1000  # documents per look-up of earlier copies (5 parameters each)
_ANALYZE_ROWS: Final = 5000  # (PostgreSQL) copies stored before the statistics are refreshed
_ANALYZE_S: Final = 10.0
_QUOTA_RECOUNT_S: Final = 2.0  # how often an organization at its quota is counted again
_UNITS_READ_S: Final = 0.5  # clustered: how often an organization's number of units is read again


class _Store(NamedTuple):
    """A DATA routed to STORE, waiting for _flush_stores."""

    raw: RawFrame
    sender: Endpoint | None  # None: handed over by another instance (its origin has its ACK_FWD)
    target: Endpoint  # the route of the target's unit that holds it (semq.umxt_protocol.units)
    lk0: LK0
    key: tuple[int, str, int, int, int]
    expires: int | None
    ts: int


@dataclass
class PlatformOutput:
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


_STORED_STATES: Final = {int(s): s for s in StoredState}
_DATA: Final = int(Kind.DATA)
_SS_INIT: Final = int(StoredState.SS_INIT)  # a new copy's state, and a waiting one's

# The state changes written by SQL, decided by STORED_TABLE once, here.
# DELIVERED: a waiting copy handed to its target (claim_stored holds the
# change in memory, write_held writes it).
_UNDELIVERED: Final = StoredState.SS_INIT
_DELIVERED: Final = stored_step(_UNDELIVERED, StoredEvent.DELIVERED)
# RECONNECTED: (from, to) of every state the target's new session moves.
_ON_RECONNECT: Final = tuple((int(s), int(n)) for (s, e), n in STORED_TABLE.items()
                             if e is StoredEvent.RECONNECTED and n is not s)

_WRITE_DELIVERED: Final = (f"UPDATE stored SET state={int(_DELIVERED)}, attempts=?, last_sent_ms=?"
                           f" WHERE id=? AND state={int(_UNDELIVERED)}")
_WAITING: Final = f"kind={_DATA} AND state={_SS_INIT}"  # stored documents not delivered
_FLAGS_AT: Final = 4  # a frame's flags byte (docs/protocol.md "Header")


class _Held(NamedTuple):
    """A delivered copy whose DELIVERED is held in memory (SS_INIT on disk):
    when, the attempts with this one, and what ``_settle`` needs of its row,
    so the target's ack does not read it again."""

    sent_ms: int
    attempts: int
    target_type: int
    target_id: str
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int


class _Claimed(NamedTuple):
    """A row claim_stored reads to deliver."""

    id: int
    kind: int
    frame: bytes
    expires_ms: int | None
    attempts: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    priority: int
    ref: str | None  # a kept chunk's file (semq.platform.chunks); frame is empty
    ref_offset: int | None
    ref_length: int | None


_HELD_SENT_MS: Final = _Held._fields.index("sent_ms")
_CLAIM_SELECT: Final = f"SELECT {', '.join(_Claimed._fields)} FROM stored"
_CLAIMED_PRIORITY: Final = _Claimed._fields.index("priority")
# Named rows made without the Python frame of their __new__ or _make (one of
# each per delivered copy); _CLAIM_SELECT reads exactly _Claimed's fields.
_new: Final = tuple.__new__
_make_claimed: Final = partial(_new, _Claimed)
_SIZE: Final = "coalesce(ref_length, length(frame))"  # a stored frame's size (a kept chunk's is in its file)
_CLAIM_WHERE: Final = f"target_type=? AND target_id=? AND state={_SS_INIT}"  # a target's frames waiting


_APP_KEY_FIELDS: Final = ("domain", "data_type", "subtype", "key")
_NO_APP_KEY: Final = ("", "", "", "")

# route() by its inputs (a handful of combinations): one look-up per DATA.
_ROUTES: dict[tuple[bool, bool, int, bool, bool], tuple[Route, ResultCode]] = {}


def _reach(room: Room, forwarded: Mapping[Endpoint, int]) -> Callable[[Endpoint], bool]:
    """``online`` over a snapshot, for one call on the store thread: a
    target with room left after what the call forwarded to it so far."""
    get, sent = room.get, forwarded.get

    def online(ep: Endpoint) -> bool:
        r = get(ep)
        return r is not None and sent(ep, 0) < r
    return online


class PlatformCore(HeldWrites):
    def __init__(
        self,
        store_path: Path | str,
        platform_id: str = "platform",
        *,
        events_dir: Path | None = None,
        create: bool = False,
        synchronous: str = "FULL",
        inquiry_interval: float = 15.0,
        auto_register: bool = True,
        check: bool = False,
        quota_bytes: int = 0,
        instance: str = "",
    ) -> None:
        # The store: an SQLite file, or a PostgreSQL database (a URL) that
        # several instances of this platform share (semq.platform.cluster).
        self.pg = is_pg_url(store_path)
        self.store_url = str(store_path) if self.pg else ""
        self.path: Path | str = redact(str(store_path)) if self.pg else Path(store_path)
        self.me = Endpoint.platform(platform_id)
        # Bytes of stored documents one organization may have here at once
        # (0: no limit). A DATA to store past it is refused QUOTA_EXCEEDED;
        # its origin keeps it and sends it again later.
        self.quota_bytes = quota_bytes
        # origin -> [an upper bound of its stored bytes, time it was counted
        # (monotonic s)]: counted from the table when a document would take it
        # over the quota and the count is older than _QUOTA_RECOUNT_S, and
        # raised by every document stored since. Deletions only lower the
        # truth, so the bound never lets an organization past its quota.
        self._usage: dict[tuple[int, str], list[float]] = {}
        self.db: SqliteDatabase | PgDatabase = open_platform_store(
            store_path, create=create, synchronous=synchronous, check=check)
        # Chunks of large documents kept for absent receivers: in files, by
        # reference (SQLite); rows of the shared store (PostgreSQL).
        self.chunks: ChunkFiles | None = None if self.pg else ChunkFiles(Path(store_path).parent / CHUNK_DIR)
        self.conn, self.dialect = store_connection(self.db)
        # Several instances on one PostgreSQL store: who holds which
        # organization's connection (None on SQLite: one process).
        self.presence: Presence | None = Presence(self.conn, instance) if self.pg and instance else None
        self.peers = Peers(self.conn)
        self._stored_since_analyze = 0
        self._analyzed_at = 0.0
        # SQLite's scalar min() is PostgreSQL's LEAST().
        self._least = "LEAST" if self.pg else "min"
        # Rows a claim reads are locked, skipping those another instance's
        # claim holds (PostgreSQL; SQLite has one writer).
        self._claim_lock = "TRUE FOR UPDATE SKIP LOCKED" if self.pg else ""
        self.inquiry_ms = int(inquiry_interval * 1000)
        self.auto_register = auto_register
        self.log = EventLog(events_dir, f"platform:{platform_id}", "platform") if events_dir else None
        self.seen = SeenDocuments(self.conn, self.dialect)
        # Stored copies delivered whose SS_SENT is not written yet (SS_INIT
        # on disk), by id, oldest first (claim_stored says why); and where
        # each target's claims read its send order from (after those).
        self._held_sent: dict[int, _Held] = {}
        self._order = SendOrder("stored")
        # DATA of this batch to store, written by _flush_stores in one go.
        self._stores: list[_Store] = []
        self.nodes = Nodes(self.conn, clustered=self.presence is not None)
        self.known = self.nodes.known
        self.units = self.nodes.units
        self._routes: dict[tuple[Endpoint, int], Endpoint] = {}

    def load_units(self) -> None:
        """Read the organizations' unit counts again (another instance of a
        clustered platform may have learnt one from a HELLO)."""
        self.nodes.load_units()

    def _units_of(self, target: Endpoint) -> int | None:
        return self.nodes.units_of(target)

    def _route(self, target: Endpoint, lk0: LK0, ordered: bool = False) -> Endpoint:
        """Where a document for ``target`` goes: the route of the unit that
        holds it (the target itself for an organization of one unit). A
        document of an ordered channel (DATA flag Ordered) goes to unit 1:
        one store keeps the channel's order (semq.node.channels)."""
        n = self._units_of(target)
        if n is None:
            return target
        return self._unit_route(target, 1 if ordered else holder(lk0, n))

    def _unit_route(self, org: Endpoint, unit: int) -> Endpoint:
        """route_of, one Endpoint per unit (looked up per document)."""
        r = self._routes.get((org, unit))
        if r is None:
            if len(self._routes) > 100_000:
                self._routes.clear()
            r = self._routes[(org, unit)] = route_of(org, unit)
        return r

    def _relay_routes(self, raw: RawFrame) -> list[tuple[Endpoint, RawFrame]]:
        """Where an ack, inquiry or answer for ``raw.target`` goes: to the
        unit of the record it names (semq.umxt_protocol.units), split per unit when its
        items are about several (an inquiry about documents held by
        different units). A batch with a receipt is never split (the
        receiver signed it whole): the node sends one per unit."""
        target = raw.target
        n = self._units_of(target)
        if n is None:
            return [(target, raw)]
        frame = raw.frame()
        body = frame.body
        groups: dict[int, list[Any]] = defaultdict(list)
        parts: dict[int, AckBatch | Inquiry | InquiryResp]
        if isinstance(body, AckBatch):
            if body.receipt:
                return [(route_of(target, min(max(body.entries[0].dest_semq_id, 1), n)) if body.entries
                         else target, raw)]
            for e in body.entries:
                groups[min(max(e.dest_semq_id, 1), n)].append(e)
            parts = {u: replace(body, entries=tuple(es)) for u, es in groups.items()}
        elif isinstance(body, Ack):
            return [(route_of(target, min(max(body.entry.dest_semq_id, 1), n)), raw)]
        elif isinstance(body, Inquiry):
            for lk in body.items:
                groups[unit_for(target, lk, n)].append(lk)
            parts = {u: replace(body, items=tuple(items)) for u, items in groups.items()}
        elif isinstance(body, InquiryResp):
            state = body.topic is InquiryTopic.STATE
            for a in body.answers:
                u = unit_for(target, a.lk0, n)
                groups[u].append(a)
                if state and u != 1:
                    # An origin's answer about a receiver's pending ack: the
                    # unit its LK0 picks, and unit 1, which keeps the ordered
                    # channels (the documents of one are there, whatever
                    # unit their LK0 picks). The unit without the row ignores it.
                    groups[1].append(a)
            parts = {u: replace(body, answers=tuple(answers)) for u, answers in groups.items()}
        elif isinstance(body, (Nack, Chunk, ChunkAck)):
            return [(route_of(target, unit_for(target, body.lk0, n)), raw)]
        else:
            return [(target, raw)]
        if len(parts) == 1:
            return [(route_of(target, next(iter(parts))), raw)]
        dec = FrameDecoder()
        dec.receive_data(b"".join(encode_frame(replace(frame, body=b)) for b in parts.values()))
        return [(route_of(target, u), r) for u, r in zip(parts, dec, strict=True)]

    def set_units(self, org: Endpoint, units: int) -> None:
        """``org`` runs ``units`` units (its HELLO says so), inside the
        caller's transaction."""
        if self.nodes.set_units(org, units):
            self._reroute_waiting(org, units)

    def _reroute_waiting(self, org: Endpoint, units: int) -> None:
        """``org`` now runs ``units`` units: its stored documents not yet
        delivered go to the unit each one's LK0 picks among them (stored
        before its first HELLO as a node of several units, they wait for
        unit 1). Delivered ones stay with the unit that has them. Documents
        of ordered channels stay with (or go to) unit 1."""
        pattern = org.node_id + UNIT_SEP + "%"
        rows = self.conn.execute(
            f"SELECT id, origin_type, origin_id, semq_id, semq_db_id, record_id, target_id, frame FROM stored"
            f" WHERE target_type=? AND (target_id=? OR target_id LIKE ?) AND {_WAITING}",
            (int(org.node_type), org.node_id, pattern)).fetchall()
        moves = []
        for rid, ot, oid, sid, did, rec, tid, frame in rows:
            if rid in self._held_sent:
                continue  # (delivered: its SS_SENT is held in memory)
            lk0 = LK0(endpoint=Endpoint(node_type=ot, node_id=oid), semq_id=sid, semq_db_id=did, record_id=rec)
            ordered = len(frame) > _FLAGS_AT and bool(bytes(frame[_FLAGS_AT:_FLAGS_AT + 1])[0] & FLAG_ORDERED)
            want = route_of(org, 1 if ordered else holder(lk0, units)).node_id
            if want != tid:
                moves.append((want, rid))
        if moves:
            self.conn.executemany(f"UPDATE stored SET target_id=? WHERE id=? AND {_WAITING}", moves)
            self._order.forget()

    def close(self) -> None:
        try:
            self.write_held_now()
        except STORE_ERRORS:
            pass  # lost as in a crash: the copies are SS_INIT and go again (the target deduplicates)
        if self.log:
            self.log.close()
        if self.chunks is not None:
            self.chunks.close()
        self.db.close()

    def _drop_held(self) -> None:
        # A transaction that did not commit: the copies held go again.
        self._held_sent.clear()
        self._order.forget()

    def held(self) -> bool:
        """Whether anything is held in memory (write_held would write)."""
        return bool(self._held_sent)

    def held_count(self) -> int:
        """Delivered copies whose SS_SENT is held (SS_INIT on disk)."""
        return len(self._held_sent)

    def write_held(self, before_ms: int | None = None) -> None:
        """Inside the caller's transaction: the SS_SENT of delivered copies
        still SS_INIT on disk (all, or those delivered at or before
        ``before_ms``), as claim_stored wrote it before the hold."""
        if before_ms is None:
            self._order.forget()
        items = take_held(self._held_sent, before_ms, _HELD_SENT_MS)
        if items:
            self.conn.executemany(_WRITE_DELIVERED, [(h.attempts, h.sent_ms, rid) for rid, h in items])

    def _emit(self, records: list[dict[str, Any]]) -> None:
        if self.log and records:
            self.log.write(records)

    # ------------------------------------------------------------ nodes

    def register(self, node_ids: Sequence[str], units: int | None = None) -> None:
        """Make organizations known (again, if revoked); ``units``: grant
        each that many units (semq.umxt_protocol.units), else an organization new here is
        granted one and a known one keeps its grant."""
        ts = now_ms()
        try:
            with self.db.atomic("IMMEDIATE"):
                self.nodes.register(node_ids, units, ts)
        except STORE_ERRORS as e:
            raise translate(e, self.path, "platform store") from e

    def granted(self) -> dict[str, int]:
        """The organizations granted more than one unit, and how many."""
        return self.nodes.granted()

    def units_granted(self, org: Endpoint) -> int:
        """How many units the operator granted ``org`` (1 unless granted
        more): what its HELLO may claim, and what its connection allowance
        counts (semq.settings.bounds)."""
        return self.nodes.units_granted(org)

    def is_known(self, ep: Endpoint) -> bool:
        """Registered and not revoked. The set is a cache of the nodes table:
        an organization enrolled or registered by another process while the
        relay runs (``semq platform enroll``, ``node init --enroll-from``) is
        found there on its first use."""
        return self.nodes.is_known(ep)

    def connected(self, ep: Endpoint, units: int = 1) -> bool:
        """A node completed HELLO (``ep``: the route of its unit, semq.umxt_protocol.units;
        ``units``: how many its organization runs). Returns False if it is
        not allowed. Its in-flight stored copies go again (SPEC P.2; it
        deduplicates)."""
        ts = now_ms()
        org = route_org(ep)
        with self._tx():
            self.write_held()  # the attempts of the copies in flight, before they go again
            if not self.nodes.is_known(org):
                if not self.auto_register:
                    return False
                self.nodes.admit(org, ts)
            self.nodes.connected(org, ts)
            self.set_units(org, units)
            for was, now in _ON_RECONNECT:  # (no chains in the table: one UPDATE each)
                self.conn.execute("UPDATE stored SET state=? WHERE target_type=? AND target_id=? AND state=?",
                                  (now, int(ep.node_type), ep.node_id, was))
            if self.presence is not None:
                self.presence.attach(ep)  # this instance holds it now (fencing any other)
        self._emit([{"ts": ts, "event": "node_online", "node": ep.node_id}])
        return True

    def disconnected(self, ep: Endpoint) -> None:
        if self.presence is not None:
            # Its copies delivered from here whose SS_SENT is held are
            # SS_INIT on disk: they go again wherever it reconnects.
            tt = int(ep.node_type)
            for rid in [r for r, h in self._held_sent.items() if h.target_type == tt and h.target_id == ep.node_id]:
                del self._held_sent[rid]
            self._order.forget()
            try:
                with self._tx():
                    self.presence.detach(ep)
            except STORE_ERRORS:
                # The store is away: the row stays until a newer connection
                # takes it over or this instance's sweep removes it.
                pass
        self._emit([{"ts": now_ms(), "event": "node_offline", "node": ep.node_id}])

    # ------------------------------------------------------------ direct links

    def announce_peer(self, ep: Endpoint, body: PeerAnnounce, observed_host: str | None, fingerprint: str) -> None:
        """``ep`` listens for direct links (PEER_ANNOUNCE; ttl 0 withdraws):
        recorded in the store, shared by every instance (semq.platform.peers)."""
        ts = now_ms()
        with self._tx():
            if body.ttl_s == 0:
                self.peers.withdraw(ep)
            else:
                self.peers.announce(ep, observed_addresses(body, observed_host), body.allowed,
                                    fingerprint, ts + body.ttl_s * 1000, ts)
        self._emit([{"ts": ts, "event": "peer_announced", "node": ep.node_id, "ttl_s": body.ttl_s}])

    def announced(self) -> list[dict[str, Any]]:
        """The organizations that announced direct-link addresses, live or expired."""
        return self.peers.listing(now_ms())

    def lookup_peer(self, asker: Endpoint, about: Endpoint) -> PeerInfo:
        """The answer to ``asker``'s PEER_LOOKUP about ``about``."""
        return self.peers.lookup(asker, about, now_ms(), self.is_known(about))

    # ------------------------------------------------------------ instances

    def join_cluster(self, address: str) -> None:
        """This instance starts serving at ``address`` (PostgreSQL store)."""
        if self.presence is not None:
            with self._tx():
                self.presence.register(address)

    def leave_cluster(self) -> None:
        if self.presence is not None:
            with self._tx():
                self.presence.leave()

    def share_ca(self, ca_dir: Path) -> list[str]:
        """PostgreSQL store: the CA's public files made the same here and
        in the store (semq.platform.cafiles.share_ca). Returns the names
        written into ``ca_dir``."""
        if not self.pg:
            return []
        with self._tx():
            return share_ca(self.conn, ca_dir)

    def cluster_tick(self) -> tuple[list[Endpoint], list[Endpoint]]:
        """The heartbeat and the sweep (every SWEEP_S): the organizations
        held here with frames waiting in the store, and those held here
        whose presence a newer connection elsewhere has taken (to close)."""
        if self.presence is None:
            return [], []
        with self._tx():
            self.presence.heartbeat()
            self.presence.forget_stale()
            held_here, params = self.presence.held_here()
            waiting = [Endpoint(node_type=NodeType(tt), node_id=i) for tt, i in self.conn.execute(
                f"SELECT t.node_type, t.node_id FROM ({held_here}) t WHERE EXISTS"
                " (SELECT 1 FROM stored s WHERE s.target_type=t.node_type AND s.target_id=t.node_id"
                f" AND s.state={_SS_INIT})", params).fetchall()]
            fenced = [ep for ep in list(self.presence.epochs) if not self.presence.holds(ep)]
            self.load_units()  # (learnt from a HELLO at another instance)
        self._fresh_statistics()
        return waiting, fenced

    def _fresh_statistics(self) -> None:
        """PostgreSQL plans by the table's statistics, which autovacuum
        refreshes at most once a minute: a backlog that grows by thousands
        of copies a second is planned as a tiny table meanwhile (scans for
        look-ups that should use an index). ANALYZE ``stored`` when this
        instance stored ANALYZE_ROWS copies since the last one (a sample of
        at most 30,000 rows: tens of ms), at most every ANALYZE_S."""
        now = time.monotonic()
        if self._stored_since_analyze >= _ANALYZE_ROWS and now - self._analyzed_at >= _ANALYZE_S:
            self._stored_since_analyze = 0
            self._analyzed_at = now
            try:
                self.conn.execute("ANALYZE stored")
            except STORE_ERRORS:
                pass  # next time

    # ------------------------------------------------------------ frames

    def handle(self, sender: Endpoint, frames: Sequence[RawFrame], room: Room,
               out: PlatformOutput | None = None, port: RelayPort | None = None) -> PlatformOutput:
        """Route and apply a batch of frames from ``sender`` (one transaction).
        ``room`` is the daemon's snapshot of who is online; what this batch
        forwards to a target counts against its room.
        ``port``, when given, gets the frames for online targets before the
        commit, so they travel while it waits for the disk: a forwarded
        document is no promise of ours (ACK_FWD, which is, waits for the
        commit); if the commit fails, the origin's inquiry and the receiver's
        duplicate suppression make it whole. Without it, they are in
        ``out.sends``."""
        out = PlatformOutput() if out is None else out
        online = _reach(room, out.forward_bytes)
        ts = now_ms()
        events: list[dict[str, Any]] = []
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] = defaultdict(list)
        self.seen.begin()  # `seen` rows of this batch, written in one statement
        self._stores = []
        store_ctx = (out, events, acks)
        # ``sender`` is the route of the connection's unit (semq.umxt_protocol.units): acks
        # go back to it; the frames speak as its organization.
        org_ep = route_org(sender)
        with self._tx():
            if self._held_sent:
                self.write_held(ts - HOLD_MS)
            for raw in frames:
                # An organization speaks only as itself: transport source and
                # application origin are the connection's (the decoder hands
                # out one Endpoint object per distinct header, hence ``is``
                # first: the dataclass comparison is Python code).
                src, org = raw.source, raw.origin
                if (src is not org_ep and src != org_ep) or (org is not org_ep and org != org_ep):
                    msg = f"{raw.kind.name} claims source {raw.source} / origin {raw.origin} on the connection of {sender}"
                    out.errors.append((ResultCode.SOURCE_MISMATCH, msg))
                    events.append({"ts": ts, "event": "refused", "code": int(ResultCode.SOURCE_MISMATCH),
                                   "node": sender.node_id, "detail": msg})
                    continue
                try:
                    if raw.target == self.me:
                        self._flush_stores(*store_ctx)  # an inquiry in the same batch reads them
                        self.seen.flush()
                        self._for_me(sender, raw, ts, out, events, acks)
                    elif raw.kind is Kind.DATA:
                        self._data(sender, raw, ts, out, events, acks, online)
                    elif raw.kind in _RELAYED:
                        self._relay(raw, ts, out, events, online, sender)
                    else:
                        raise RemoteProtocolError(
                            f"{raw.kind.name} for {raw.target} cannot be relayed", ResultCode.UNEXPECTED_FRAME)
                except RemoteProtocolError as e:
                    out.errors.append((e.code, str(e)))
            self._flush_stores(*store_ctx)
            self.seen.flush()
            if self.chunks is not None:
                self.chunks.sync()  # the chunks kept, on disk before the rows naming them commit
            if self.presence is not None:
                if out.stored_for:
                    self.presence.wake(out.stored_for)  # targets held by another instance: NOTIFY at commit
                if out.hops:
                    self.presence.hand_over(out.hops)  # (delivered at commit, never before)
                    out.hops = defaultdict(list)
            if out.forwards:
                if port is not None:
                    port.put(out.forwards)
                else:
                    for target, data in out.forwards.items():
                        out.sends[target].extend(data)
                out.forwards = defaultdict(list)
            for (kind, target), entries in acks.items():
                for i in range(0, len(entries), 10_000):
                    out.add(target, Frame(kind=Kind.ACK_BATCH, source=self.me, target=route_org(target),
                                          body=AckBatch(ack_kind=kind, entries=tuple(entries[i:i + 10_000]))))
        self._emit(events)
        return out

    def _flush_stores(self, out: PlatformOutput, events: list[dict[str, Any]],
                      acks: dict[tuple[Kind, Endpoint], list[AckEntry]]) -> None:
        """Store the DATA ``_data`` routed to STORE since the last flush: one
        look-up of earlier copies still waiting (a resend whose ACK_SAVE was
        lost gets the same LK1, as does a copy repeated in the batch) and one
        executemany of the new rows, whose ids are assigned here (the one
        writer, inside its transaction) so the ACK_SAVE can name them. Per
        document, a SELECT and an INSERT cost ~15 us of the platform's ~42."""
        stores, self._stores = self._stores, []
        if not stores:
            return
        found: dict[tuple[Any, ...], int] = {}
        for rows in self._earlier_copies(stores):
            for rid, *copy_key in rows:
                if rid not in self._held_sent:  # delivered (SS_SENT held in memory): a new copy, as for SS_SENT
                    found.setdefault(tuple(copy_key), int(rid))
        new_ids: list[int] = []
        new_rows: list[tuple[Any, ...]] = []
        for st in stores:
            raw, target, key = st.raw, st.target, st.key
            copy_key = (*key, int(target.node_type), target.node_id)
            lk1_id = found.get(copy_key, 0)
            if not lk1_id:
                if not new_ids:
                    new_ids = self.dialect.new_ids(self.conn, "stored", len(stores))
                lk1_id = found[copy_key] = new_ids.pop()
                new_rows.append((lk1_id, int(target.node_type), target.node_id, *key, raw.priority, st.expires,
                                 st.ts, raw.raw))
            self.seen.add((*key, _STORED, lk1_id, st.ts))
            lk0 = st.lk0
            if raw.reliable and st.sender is not None:  # (best effort, or handed over: stored, not acked)
                acks[(Kind.ACK_SAVE, st.sender)].append(AckEntry(
                    1, 1, lk1_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id, _PLATFORM_FLAG, _STORED_FLAG))
            out.stored_for.add(target)
            events.append(self._event(raw, lk0, st.ts, "stored", lk1=f"1/1/{lk1_id}"))
        if new_rows:
            self._stored_since_analyze += len(new_rows)
            self.conn.executemany(
                "INSERT INTO stored (id, target_type, target_id, kind, origin_type, origin_id, semq_id,"
                " semq_db_id, record_id, state, priority, expires_ms, stored_ms, frame)"
                f" VALUES (?,?,?,{_DATA},?,?,?,?,?,{_SS_INIT},?,?,?,?)", new_rows)

    def _earlier_copies(self, stores: Sequence[_Store]) -> Iterator[list[Any]]:
        """Rows (id, origin_type, origin_id, semq_id, semq_db_id, record_id,
        target_type, target_id) of copies still waiting with the keys of
        ``stores``. SQLite: a join from the keys (row values IN (VALUES ...)
        would scan the table). PostgreSQL: per origin store, its record ids
        as one array, which the planner reads through the index on the
        origin's key whatever its statistics say; the join from VALUES
        compared every waiting row with every key while the table's
        statistics were young (2.6 s per batch of 512 at 20,000 stored,
        scripts/bench pgplatform)."""
        if self.pg:
            groups: dict[tuple[int, str, int, int], list[int]] = defaultdict(list)
            for st in stores:
                groups[st.key[:4]].append(st.key[4])
            for (t, o, s, d), records in groups.items():
                yield self.conn.execute(
                    "SELECT id, origin_type, origin_id, semq_id, semq_db_id, record_id, target_type, target_id"
                    " FROM stored WHERE origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=?"
                    f" AND record_id = ANY(?::bigint[]) AND {_WAITING}", (t, o, s, d, records)).fetchall()
            return
        for i in range(0, len(stores), _LOOKUP_CHUNK):
            chunk = stores[i:i + _LOOKUP_CHUNK]
            yield self.conn.execute(
                "WITH k(t, o, s, d, r) AS (VALUES " + ",".join(["(?,?,?,?,?)"] * len(chunk)) + ")"
                " SELECT id, origin_type, origin_id, semq_id, semq_db_id, record_id, target_type, target_id"
                " FROM k CROSS JOIN stored ON origin_type=k.t AND origin_id=k.o AND semq_id=k.s"
                f" AND semq_db_id=k.d AND record_id=k.r WHERE {_WAITING}",
                [v for st in chunk for v in st.key],
            ).fetchall()

    @staticmethod
    def _event(raw: RawFrame, lk0: LK0, ts: int, event: str, **extra: Any) -> dict[str, Any]:
        return {"ts": ts, "event": event, "lk0": str(lk0), "source": lk0.endpoint.node_id,
                "target": raw.target.node_id, **extra}

    @staticmethod
    def _received(raw: RawFrame, lk0_text: str, source: str, target: str, created: int, ts: int) -> dict[str, Any]:
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

    def _data(
        self, sender: Endpoint, raw: RawFrame, ts: int, out: PlatformOutput, events: list[dict[str, Any]],
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]], online: Callable[[Endpoint], bool],
    ) -> None:
        lk0, _lk1, created, expires = raw.data_prefix()
        target = raw.target
        dest = (target if not self.units and self.presence is None
                else self._route(target, lk0, bool(raw.flags & FLAG_ORDERED)))
        reliable = raw.reliable
        save_fwd = raw.save_fwd
        on = online(dest)
        hop = None
        if not on and self.presence is not None:
            hop = self.presence.elsewhere(dest)
            if hop is not None:
                # Held by another instance (semq.platform.cluster): handed to
                # it one hop at the commit, as to a connection of our own; a
                # frame too large for a hop goes through the store (woken at
                # commit), whatever its SaveFwd.
                if len(raw.raw) <= HOP_MAX_FRAME:
                    on = True
                else:
                    hop, save_fwd, reliable = None, 3, True
        rk = (self.is_known(target), on, save_fwd, reliable, expires is not None and expires <= ts)
        decided = _ROUTES.get(rk)
        if decided is None:
            decided = _ROUTES[rk] = route(known=rk[0], online=rk[1], save_fwd=rk[2], reliable=rk[3],
                                          expired=rk[4])
        where, code = decided
        origin = lk0.endpoint
        key = (int(origin.node_type), origin.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        lk0_text = str(lk0)
        events.append(self._received(raw, lk0_text, origin.node_id, target.node_id, created, ts))
        if where is Route.FORWARD:
            b = relay_frame_bytes(raw.raw, self.me)
            if hop is not None:
                out.hops[hop].append((dest, b))
            else:
                out.forwards[dest].append(b)
                out.forward_bytes[dest] += len(b)
            if reliable:
                self.seen.add((*key, _FORWARDED, 0, ts))
                acks[(Kind.ACK_FWD, sender)].append(AckEntry(
                    1, 1, 0, lk0.semq_id, lk0.semq_db_id, lk0.record_id, _PLATFORM_FLAG, _FORWARDED_FLAG))
            events.append({"ts": ts, "event": "forwarded", "lk0": lk0_text, "source": origin.node_id,
                           "target": target.node_id})
        elif where is Route.STORE:  # written, acked and logged by _flush_stores
            if self.quota_bytes and not self._quota_allows(key[0], key[1], len(raw.raw)):
                text = (f"organization {origin.node_id} has {self.quota_bytes >> 20} MiB of documents stored here,"
                        " its quota: kept by the origin, sent again later")
                out.add(sender, Frame(kind=Kind.NACK, source=self.me, target=route_org(sender),
                                      body=Nack(lk0=lk0, code=ResultCode.QUOTA_EXCEEDED, message=text)))
                events.append(self._event(raw, lk0, ts, "refused", code=int(ResultCode.QUOTA_EXCEEDED)))
                return
            self._stores.append(_Store(raw, sender, dest, lk0, key, expires, ts))
        elif where is Route.DROP and self.seen.forwarded_before(key):
            # A copy sent again whose first copy this platform forwarded (its
            # origin lost the ACK_FWD, e.g. in a crash): forwarded is the
            # answer, not dropped; the origin asks the target whether it
            # arrived (SaveFwd 1: reported dropped only if it did not).
            acks[(Kind.ACK_FWD, sender)].append(AckEntry(
                1, 1, 0, lk0.semq_id, lk0.semq_db_id, lk0.record_id, _PLATFORM_FLAG, _FORWARDED_FLAG))
            events.append({"ts": ts, "event": "forwarded", "lk0": lk0_text, "source": origin.node_id,
                           "target": target.node_id, "detail": "forwarded before"})
        elif where in (Route.DROP, Route.REFUSE):
            self.seen.add((*key, _DROPPED, 0, ts))
            text = {ResultCode.UNKNOWN_TARGET: f"target {target} is not known to the platform",
                    ResultCode.EXPIRED: "the document expired before it could be delivered",
                    }.get(code, f"target {target} is offline and SaveFwd=1: discarded")
            out.add(sender, Frame(kind=Kind.NACK, source=self.me, target=route_org(sender),
                                  body=Nack(lk0=lk0, code=code, message=text)))
            events.append(self._event(raw, lk0, ts, "dropped" if where is Route.DROP else "refused",
                                      code=int(code)))
        else:  # DISCARD: best effort, never acked (SPEC: Reliable=0)
            events.append(self._event(raw, lk0, ts, "dropped", code=int(code)))

    def _quota_allows(self, origin_type: int, origin_id: str, size: int) -> bool:
        """Whether ``size`` more bytes of ``origin_id``'s documents fit its
        quota (and count them if so)."""
        key = (origin_type, origin_id)
        u = self._usage.get(key)
        now = time.monotonic()
        if u is None or (u[0] + size > self.quota_bytes and now - u[1] >= _QUOTA_RECOUNT_S):
            (stored,) = self.conn.execute(
                "SELECT coalesce(sum(coalesce(ref_length, length(frame))), 0) FROM stored WHERE origin_type=?"
                f" AND origin_id=? AND kind IN ({_DATA}, {int(Kind.CHUNK)})", key).fetchone()
            pending = sum(len(st.raw.raw) for st in self._stores if st.key[0] == origin_type and st.key[1] == origin_id)
            u = self._usage[key] = [stored + pending, now]
        if u[0] + size > self.quota_bytes:
            return False
        u[0] += size
        return True

    def _relay(self, raw: RawFrame, ts: int, out: PlatformOutput, events: list[dict[str, Any]],
               online: Callable[[Endpoint], bool], sender: Endpoint | None = None) -> None:
        """SPEC P.4: acks and inquiries between nodes travel like SaveFwd=3
        messages: forwarded, or stored while the target is offline. A
        large document's chunk stored here is acknowledged to its origin
        (a CHUNK_ACK from the platform, after the commit): it may send the
        rest while its receiver is away (semq.node.large_out)."""
        if UNIT_SEP in raw.target.node_id:  # a unit's route is the platform's, never a frame's target
            raise RemoteProtocolError(f"{raw.kind.name} for unknown target {raw.target}", ResultCode.UNKNOWN_TARGET)
        for target, part in (self._relay_routes(raw) if self.units or self.presence is not None
                             else ((raw.target, raw),)):
            hop = None
            if online(target):
                b = relay_bytes(part, self.me)
                out.forwards[target].append(b)
                out.forward_bytes[target] += len(b)
            elif (self.presence is not None and len(raw.raw) <= HOP_MAX_FRAME
                  and (hop := self.presence.elsewhere(target)) is not None):
                out.hops[hop].append((target, relay_bytes(part, self.me)))
            elif self.is_known(part.target):
                if raw.kind is Kind.CHUNK:
                    self._keep_chunk(part, ts, target, out, events, sender)
                else:
                    out.stored_for.add(target)
                    self._store_relayed(part, ts, target)
            else:
                raise RemoteProtocolError(f"{part.kind.name} for unknown target {part.target}",
                                          ResultCode.UNKNOWN_TARGET)

    def _keep_chunk(self, raw: RawFrame, ts: int, target: Endpoint, out: PlatformOutput,
                    events: list[dict[str, Any]], sender: Endpoint | None) -> None:
        """A large document's chunk for a target that is away: kept (in a
        file, by reference, on SQLite) within its origin's quota, and the
        origin told so after the commit (it may send the rest meanwhile).
        Past the quota it is not kept and not acknowledged: the origin
        sends it again when the receiver asks."""
        c = raw.frame().body
        assert isinstance(c, Chunk)
        o = raw.origin
        name = chunk_file_name(c.lk0, target)
        if self.chunks is not None and not self.chunks.has(name) and self._kept_files(o) >= MAX_KEPT_FILES:
            # One file per document: an organization cannot spend the
            # platform's inodes with chunks of many tiny "documents".
            events.append({"ts": ts, "event": "refused", "lk0": str(c.lk0), "source": o.node_id,
                           "target": target.node_id, "code": int(ResultCode.QUOTA_EXCEEDED),
                           "detail": f"chunk {c.index} not kept: {MAX_KEPT_FILES} large documents of"
                                     f" {o.node_id} are kept here already"})
            return
        if self.quota_bytes and not self._quota_allows(int(o.node_type), o.node_id, len(raw.raw)):
            # (A few per minute at most: the origin's window stops it, and it
            # sends again only when its probe backs off or the receiver asks.)
            events.append({"ts": ts, "event": "refused", "lk0": str(c.lk0), "source": o.node_id,
                           "target": target.node_id, "code": int(ResultCode.QUOTA_EXCEEDED),
                           "detail": f"chunk {c.index} not kept: over the quota of {self.quota_bytes >> 20} MiB"})
            return
        out.stored_for.add(target)
        if self.chunks is None:
            self._store_relayed(raw, ts, target)
        else:
            offset = self.chunks.append(name, raw.raw)
            lk = c.lk0
            self.conn.execute(
                "INSERT INTO stored (target_type, target_id, kind, origin_type, origin_id, semq_id, semq_db_id,"
                " record_id, state, priority, stored_ms, frame, ref, ref_offset, ref_length)"
                f" VALUES (?,?,?,?,?,?,?,?,{_SS_INIT},?,?,?,?,?,?)",
                (int(target.node_type), target.node_id, int(Kind.CHUNK), int(o.node_type), o.node_id,
                 lk.semq_id, lk.semq_db_id, lk.record_id, raw.priority, ts, b"", name, offset, len(raw.raw)))
        if sender is not None:
            out.add(sender, Frame(kind=Kind.CHUNK_ACK, source=self.me, target=route_org(sender),
                                  body=ChunkAck(lk0=c.lk0, through=c.index + 1)))

    def _kept_files(self, origin: Endpoint) -> int:
        """How many documents of ``origin`` have chunks kept in files here."""
        return int(self.conn.execute("SELECT count(DISTINCT ref) FROM stored WHERE origin_type=? AND origin_id=?"
                                     " AND ref IS NOT NULL", (int(origin.node_type), origin.node_id)).fetchone()[0])

    def _store_relayed(self, raw: RawFrame, ts: int, target: Endpoint) -> None:
        """An ack or inquiry kept for its target (SPEC P.4; ``target``: the
        route of the target's unit it is for)."""
        self.conn.execute(
            "INSERT INTO stored (target_type, target_id, kind, origin_type, origin_id, state, priority,"
            f" stored_ms, frame) VALUES (?,?,?,?,?,{_SS_INIT},?,?,?)",
            (int(target.node_type), target.node_id, int(raw.kind), int(raw.origin.node_type),
             raw.origin.node_id, raw.priority, ts, raw.raw),
        )

    def store_handed_over(self, frames: Sequence[bytes]) -> set[Endpoint]:
        """Frames another instance handed over (semq.platform.cluster) that
        this one cannot give to their targets now (the target left, or its
        queue is over its high-water mark): stored for them, as a document
        for an offline target is, in one transaction. The origin of a
        document already has its ACK_FWD, so none gets an ACK_SAVE; its
        ``seen`` row now says STORED with the copy's LK1, which is what its
        inquiry learns. Returns the targets with new stored frames (woken
        here, or at the instance that holds them now)."""
        ts = now_ms()
        out = PlatformOutput()
        events: list[dict[str, Any]] = []
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] = defaultdict(list)
        self.seen.begin()
        self._stores = []
        dec = FrameDecoder()
        dec.receive_data(b"".join(frames))
        raws = list(dec)  # (bytes that are no frame raise here, before any transaction)
        with self._tx():
            for raw in raws:
                if raw.kind is Kind.DATA:
                    lk0, _lk1, _created, expires = raw.data_prefix()
                    o = lk0.endpoint
                    key = (int(o.node_type), o.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
                    self._stores.append(_Store(raw, None, self._route(raw.target, lk0, bool(raw.flags & FLAG_ORDERED)),
                                               lk0, key, expires, ts))
                elif raw.kind in _RELAYED:
                    for target, part in self._relay_routes(raw):
                        out.stored_for.add(target)
                        self._store_relayed(part, ts, target)
            self._flush_stores(out, events, acks)
            self.seen.flush()
            if self.presence is not None and out.stored_for:
                self.presence.wake(out.stored_for)  # (one that moved on to a third instance)
        self._emit(events)
        return out.stored_for

    def _for_me(
        self, sender: Endpoint, raw: RawFrame, ts: int, out: PlatformOutput, events: list[dict[str, Any]],
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]],
    ) -> None:
        frame = raw.frame()
        body = frame.body
        entries: Sequence[AckEntry] = ()
        if isinstance(body, AckBatch) and body.ack_kind is Kind.ACK:
            entries = body.entries
        elif isinstance(body, Ack) and frame.kind is Kind.ACK:
            entries = (body.entry,)
        if entries:
            ids = [e.dest_ref_id for e in entries]
            gone = self._settle(ids, StoredEvent.ACK, sender, ts, events)
            out.credit[sender] += gone
            for e in entries:
                acks[(Kind.REACK, sender)].append(AckEntry(
                    1, 1, e.dest_ref_id, e.src_semq_id, e.src_semq_db_id, e.src_ref_id, int(AckFlag.PLATFORM), 0))
            return
        if isinstance(body, Nack) and body.code is ResultCode.OVER_WINDOW:
            # The node refused a copy beyond its window (seed 004): a stored
            # one goes back to the queue and out again, at a smaller window.
            # A forwarded one is not ours to keep: its origin's inquiry finds
            # the target lacks it and sends it again.
            lk = body.lk0
            ids = [rid for (rid,) in self.conn.execute(
                "SELECT id FROM stored WHERE origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=?"
                f" AND record_id=? AND kind={_DATA} AND target_type=? AND target_id=?",
                (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id,
                 int(sender.node_type), sender.node_id),
            )]
            out.credit[sender] += self._settle(ids, StoredEvent.TARGET_LACKS, sender, ts, events)
            out.over_window[sender] += 1
            if ids:
                out.stored_for.add(sender)
            return
        if isinstance(body, Inquiry):
            answers: list[InquiryAnswer] = []
            if body.topic is InquiryTopic.RECEIVED:
                # FORWARDED: handed to the target's connection; STORED: a copy
                # waits here for delivery; RECEIVED: stored, delivered, and the
                # target ACKed its copy (so only the target has it now).
                for lk in body.items:
                    if lk.endpoint != route_org(sender):  # (sender: the asking unit's route)
                        # Only a document's origin learns its fate here
                        # (metadata stays between the two parties).
                        answers.append(InquiryAnswer(lk, InquiryResult.NO_RECORD))
                        continue
                    action, lk1 = self.seen.action(
                        (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id)
                    ) or (None, 0)
                    result = InquiryResult.NOT_RECEIVED
                    if action == _FORWARDED:
                        result = InquiryResult.FORWARDED
                    elif action == _STORED:
                        held = self.conn.execute(f"SELECT 1 FROM stored WHERE id=? AND kind={_DATA}",
                                                 (lk1,)).fetchone()
                        result = InquiryResult.STORED if held else InquiryResult.RECEIVED
                    answers.append(InquiryAnswer(lk, result))
            else:
                for lk in body.items:
                    # Only the copy's target asks about it (by its LK1).
                    state = next((_STORED_STATES[n] for (n,) in self.conn.execute(
                        f"SELECT state FROM stored WHERE id=? AND kind={_DATA} AND target_type=? AND target_id=?",
                        (lk.record_id, int(sender.node_type), sender.node_id))), None)
                    answers.append(InquiryAnswer(lk, state_answer(state)))
                gone = self._settle([lk.record_id for lk in body.items], StoredEvent.TARGET_ASKS, sender, ts, events)
                out.credit[sender] += gone
            out.add(sender, Frame(kind=Kind.INQUIRY_RESP, source=self.me, target=route_org(sender),
                                  body=InquiryResp(topic=body.topic, answers=tuple(answers),
                                                   flag=InquiryFlag.FROM_PLATFORM)))
            return
        if isinstance(body, InquiryResp) and body.topic is InquiryTopic.RECEIVED:
            got: list[int] = []
            lacks: list[int] = []
            for lk, result in body.answers:
                for (rid,) in self.conn.execute(
                    "SELECT id FROM stored WHERE origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=?"
                    f" AND record_id=? AND kind={_DATA} AND target_type=? AND target_id=?",
                    (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id,
                     int(sender.node_type), sender.node_id),
                ).fetchall():
                    (got if result is InquiryResult.RECEIVED else lacks).append(rid)
            out.credit[sender] += self._settle(got, StoredEvent.TARGET_HAS, sender, ts, events)
            self._settle(lacks, StoredEvent.TARGET_LACKS, sender, ts, events)
            if lacks:
                out.stored_for.add(sender)
        # PING, PONG, WINDOW, ... are the daemon's; anything else is ignored.

    def _settle(self, ids: Sequence[int], event: StoredEvent, sender: Endpoint, ts: int,
                events: list[dict[str, Any]]) -> int:
        """Apply an event to stored DATA rows of ``sender``; SS_ACK rows are
        deleted (SPEC P.2). Returns how many in-flight rows were settled."""
        settled = 0
        held = self._held_sent
        # A delivered copy whose SS_SENT is held is SS_INIT on disk, and
        # the rest of what is needed never changes: from memory, if it is
        # the sender's (a stored DATA row, like the SELECT's). The rest are
        # read by row id: the unary + keeps SQLite off the delivery index on
        # target (a walk over every stored copy of the target).
        # id -> (state, origin_id, semq_id, semq_db_id, record_id)
        found: dict[int, tuple[int, str, int, int, int]] = {}
        ids_read: Sequence[int] = ids
        if held:
            hits, ids_read = split_held(ids, held)
            tt, tid = int(sender.node_type), sender.node_id
            for rid, h in hits:
                if h.target_type == tt and h.target_id == tid:
                    found[rid] = (_SS_INIT, h.origin_id, h.semq_id, h.semq_db_id, h.record_id)
        if ids_read:
            found.update({rid: (state, oid, s, d, r) for rid, state, oid, s, d, r in rows_by_id(
                self.conn, "SELECT id, state, origin_id, semq_id, semq_db_id, record_id FROM stored", ids_read,
                where=f"+kind={_DATA} AND +target_type=? AND +target_id=?",
                params=(int(sender.node_type), sender.node_id))})
        deletes: list[int] = []
        updates: list[tuple[int, int]] = []
        sent_updates: list[tuple[int, int, int, int]] = []
        for rid in ids:
            row = found.pop(rid, None)  # an id twice in one batch: applied once
            if row is None:
                continue
            state_no, oid, s, d, r = row
            sent_at = held.pop(rid, None) if held else None
            state = _STORED_STATES[state_no]
            if sent_at is not None and state is _UNDELIVERED:
                state = _DELIVERED  # its DELIVERED held in memory, not written
            nxt = stored_step(state, event)
            if nxt is state:
                if sent_at is not None:
                    held[rid] = sent_at
                continue
            if nxt is StoredState.SS_INIT:
                self._order.forget()  # to be delivered again: the claims must read it
            lk0, lk1, src, tgt = f"{oid}/{s}/{d}/{r}", f"1/1/{rid}", oid, sender.node_id
            if nxt is StoredState.SS_ACK:
                deletes.append(rid)
                # (Literals: merging a shared dict into each costs twice as much.)
                events.append({"ts": ts, "event": "acked", "lk0": lk0, "source": src, "target": tgt, "lk1": lk1})
                events.append({"ts": ts, "event": "cleaned", "lk0": lk0, "source": src, "target": tgt, "lk1": lk1})
                settled += state is StoredState.SS_SENT
            else:
                if sent_at is not None:  # its held delivery is written with the new state
                    sent_updates.append((int(nxt), sent_at.attempts, sent_at.sent_ms, rid))
                else:
                    updates.append((int(nxt), rid))
                settled += state is StoredState.SS_SENT and nxt is StoredState.SS_INIT
        delete_by_id(self.conn, "stored", deletes)
        self.conn.executemany("UPDATE stored SET state=? WHERE id=?", updates)
        self.conn.executemany("UPDATE stored SET state=?, attempts=?, last_sent_ms=? WHERE id=?", sent_updates)
        return settled

    # ------------------------------------------------------------ delivery

    def claim_stored(self, target: Endpoint, limit: int, max_bytes: int = 8 << 20) -> tuple[list[bytes], int]:
        """SPEC P.2: up to ``limit`` stored frames for ``target`` (priority
        first, then acceptance order), and no more than ``max_bytes`` of them
        (but at least one), with LK1 set, marked SS_SENT and committed.
        Relayed acks/inquiries are deleted as they go (their ends ask again
        if they are lost). Returns (frames, DATA count). The byte bound keeps
        a batch of large documents from being read into memory at once."""
        ts = now_ms()
        events: list[dict[str, Any]] = []
        out: list[bytes] = []
        n_data = 0
        held = self._held_sent
        target_type = int(target.node_type)
        where, params = _CLAIM_WHERE, (target_type, target.node_id)
        with self._tx():
            if self.presence is not None and not self.presence.holds(target):
                return out, 0  # a newer connection elsewhere holds it (fenced)
            if held:
                self.write_held(ts - HOLD_MS)  # (may empty it)
            # The ids in send order with their frames' sizes first (length()
            # reads no blob), then only the frames within the byte bound.
            if held:
                ids, levels = self._order.ids(self.conn, where, params, limit, held, scope=target)
                sizes = dict(rows_by_id(self.conn, f"SELECT id, {_SIZE} FROM stored", ids))
            else:
                self._order.forget()
                order = self.conn.execute(
                    f"SELECT id, {_SIZE} FROM stored WHERE {where} ORDER BY priority DESC, id LIMIT ?",
                    (*params, limit)).fetchall()
                ids, sizes = [i for i, _ in order], dict(order)
                levels = []
            total, n = 0, 0
            while n < len(ids) and (n == 0 or total + sizes[ids[n]] <= max_bytes):
                total += sizes[ids[n]]
                n += 1
            ids = ids[:n]
            found = {r.id: r for r in map(_make_claimed, rows_by_id(self.conn, _CLAIM_SELECT, ids,
                                                                     where=self._claim_lock))}
            rows = [found[i] for i in ids if i in found]
            if not held:
                levels = SendOrder.levels(rows, _CLAIMED_PRIORITY)
            if not rows:
                return out, 0
            # The blobs were decoded and checked when they came in: spliced
            # as they are (header rewritten, LK1 set, CRC recomputed).
            gone: list[int] = []
            refs: set[str] = set()
            for rid, kind, blob, expires, attempts, oid, s, d, r, _prio, ref, ref_offset, ref_length in rows:
                if kind != Kind.DATA:
                    gone.append(rid)
                    if ref is None:
                        out.append(relay_frame_bytes(blob, self.me))
                    elif self.chunks is not None and ref_offset is not None and ref_length is not None:
                        refs.add(ref)
                        kept = self.chunks.read(ref, ref_offset, ref_length)
                        if kept is not None:  # (else its receiver asks its origin for it again)
                            out.append(relay_bytes(kept, self.me))
                    continue
                lk0 = f"{oid}/{s}/{d}/{r}"
                if expires is not None and expires <= ts:
                    gone.append(rid)
                    events.append({"ts": ts, "event": "expired", "lk0": lk0, "source": oid,
                                   "target": target.node_id, "code": int(ResultCode.EXPIRED)})
                    continue
                out.append(relay_frame_bytes(blob, self.me, lk1_from_wire(1, 1, rid)))
                # SS_SENT held in memory, not written: the target's ACK
                # deletes the copy a fraction of a second later, and the
                # UPDATE of a row with its 1 KiB frame was the largest part
                # of a delivery (py-spy: 11% of the platform draining).
                # Nothing we sent depends on it: lost in a crash, the copy is
                # SS_INIT and goes again (the target deduplicates). Written
                # after HOLD_MS (write_held: by handle, claims, inquiries, a
                # reconnect, the operator's commands and close).
                held[rid] = _new(_Held, (ts, attempts + 1, target_type, target.node_id, oid, s, d, r))
                n_data += 1
                events.append({"ts": ts, "event": "delivered", "lk0": lk0, "source": oid,
                               "target": target.node_id, "lk1": f"1/1/{rid}", "attempt": attempts + 1,
                               "save_fwd": frame_save_fwd(blob), "size": len(blob)})
            delete_by_id(self.conn, "stored", gone)
            self._order.advance(levels, held, set(gone), scope=target)
            unused = [f for f in refs if self.conn.execute("SELECT 1 FROM stored WHERE ref=? LIMIT 1",
                                                           (f,)).fetchone() is None]
        if unused and self.chunks is not None:
            self.chunks.drop(unused)  # (after the commit: a rollback keeps the rows and their file)
        self._emit(events)
        return out, n_data

    def inquiries(self, room: Room) -> dict[Endpoint, list[bytes]]:
        """SPEC P.3: ask online targets (``room``: who is online) about
        stored copies delivered but not acked after
        the interval (doubling per unanswered inquiry, max 15 min)."""
        ts = now_ms()
        online = _reach(room, {})
        sends: dict[Endpoint, list[bytes]] = defaultdict(list)
        with self._tx():
            # A held copy must not be missed by an inquiry due now.
            self.write_held(ts - min(HOLD_MS, self.inquiry_ms // 2))
            self._order.forget()  # copies another process put back to SS_INIT
            mine: str = ""
            mine_params: tuple[str, ...] = ()
            if self.presence is not None:  # only about the organizations this instance holds
                mine = (" AND (target_type, target_id) IN"
                        " (SELECT node_type, node_id FROM presence WHERE instance=?)")
                mine_params = (self.presence.instance,)
            rows = self.conn.execute(
                "SELECT id, target_type, target_id, origin_type, origin_id, semq_id, semq_db_id, record_id"
                f" FROM stored INDEXED BY stored_sent WHERE {SENT_COPIES} AND"
                f" last_sent_ms + {self._least}(?, ? * (1 << {self._least}(inquiries, 6))) <= ?{mine} LIMIT 4000",
                (MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, ts, *mine_params),
            ).fetchall()
            groups: dict[Endpoint, list[LK0]] = defaultdict(list)
            asked = []
            for rid, tt, tid, ot, oid, s, d, r in rows:
                target = Endpoint(node_type=tt, node_id=tid)
                if not online(target):
                    continue
                groups[target].append(LK0(endpoint=Endpoint(node_type=ot, node_id=oid), semq_id=s,
                                          semq_db_id=d, record_id=r))
                asked.append((ts, rid))
            self.conn.executemany("UPDATE stored SET last_sent_ms=?, inquiries=inquiries+1 WHERE id=?", asked)
        for target, lks in groups.items():
            for i in range(0, len(lks), 1000):
                sends[target].append(encode_frame(Frame(
                    kind=Kind.INQUIRY, source=self.me, target=route_org(target),
                    body=Inquiry(topic=InquiryTopic.RECEIVED, items=tuple(lks[i:i + 1000]),
                                 flag=InquiryFlag.FROM_PLATFORM))))
        return sends

    def operator_apply(self, action: OperatorAction, rows: Sequence[tuple[int, int]]) -> list[int]:
        """The operator's requeue / resend / purge of stored copies (``rows``:
        (id, state as read in the caller's transaction, with the held
        writes written)), as STORED_OPERATOR_TABLE says; a copy in a state
        the action does not apply to is left as it is. Returns the ids it
        applied to."""
        deletes, moves, done = [], [], []
        for rid, state_no in rows:
            try:
                nxt = stored_operator_step(StoredState(state_no), action, record=rid)
            except (ValueError, TransitionRefused):  # ValueError: a state this version does not know
                continue
            done.append(rid)
            if nxt is None:
                deletes.append((rid, state_no))
            else:
                moves.append((int(nxt), rid, state_no))
        self.conn.executemany("DELETE FROM stored WHERE id=? AND state=?", deletes)
        self.conn.executemany("UPDATE stored SET state=?, inquiries=0 WHERE id=? AND state=?", moves)
        if moves:
            self._order.forget()  # copies to be delivered again: the claims must read them
        return done

    def housekeeping(self) -> int:
        """Rows past their retention: ``seen`` after SEEN_RETENTION_MS, and
        direct-link announcements a day after they expired (until then the
        status shows them expired: a listener that went away)."""
        ts = now_ms()
        with self.db.atomic("IMMEDIATE"):
            n = self.seen.expire(ts - SEEN_RETENTION_MS)
            n += self.peers.expire(ts - 86_400_000)
            referenced = {f for (f,) in self.conn.execute("SELECT DISTINCT ref FROM stored WHERE ref IS NOT NULL")}
        if self.chunks is not None:
            n += self.chunks.sweep(referenced)  # files whose rows went another way (purge, crash)
        return n

    # ------------------------------------------------------------ status

    def counts(self) -> dict[str, Any]:
        c = self.conn
        (relayed,) = c.execute(f"SELECT count(*) FROM stored WHERE kind NOT IN ({_DATA}, {int(Kind.CHUNK)})").fetchone()
        seen = self.seen.count()
        per_target = {
            f"{tid}": {"stored": n, "oldest_ms": oldest}
            for tid, n, oldest in c.execute(
                f"SELECT target_id, count(*), min(stored_ms) FROM stored WHERE kind={_DATA} GROUP BY target_id")
        }
        out: dict[str, Any] = {
            "known_nodes": sorted(ep.node_id for ep in self.known),
            "stored": per_target,
            "relayed_waiting": relayed,
            "seen": seen,
            "direct": self.announced(),
        }
        (chunks, chunk_bytes) = c.execute(
            f"SELECT count(*), coalesce(sum(coalesce(ref_length, length(frame))), 0) FROM stored"
            f" WHERE kind={int(Kind.CHUNK)}").fetchone()
        out["chunks_kept"] = {"chunks": chunks, "bytes": int(chunk_bytes)}
        if self.pg:
            out["store"] = str(self.path)  # (the URL without its password)
            out["instances"] = self.instances()
        return out

    def instances(self) -> list[dict[str, Any]]:
        """PostgreSQL store: the instances running on it (heartbeat within
        LIVE_MS, else listed as gone) and how many organizations each holds."""
        if self.presence is None:
            return [{"id": r.id, "address": r.address, "pid": r.pid, "heartbeat_ms": r.heartbeat_ms,
                     "alive": now_ms() - r.heartbeat_ms <= LIVE_MS, "holds": r.holds, "this": False}
                    for r in Presence(self.conn, "").instances()]
        ts = now_ms()
        return [{"id": r.id, "address": r.address, "pid": r.pid, "heartbeat_ms": r.heartbeat_ms,
                 "alive": ts - r.heartbeat_ms <= LIVE_MS, "holds": r.holds, "this": r.id == self.presence.instance}
                for r in self.presence.instances()]


_ = (HEADER_SIZE, NodeType)
