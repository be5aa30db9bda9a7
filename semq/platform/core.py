"""The platform's synchronous core: routing, stored copies, acks and
inquiries, one transaction per batch. The trio daemon (semq.platform.daemon)
owns the connections and calls this on its one store thread; every frame
in an output may be sent because the method has committed when it returns.

A small facade, as the node's (semq.node.core), over the owners of the
store's tables — ``StoredCopies`` (``stored``), ``SeenDocuments``
(``seen``), ``Nodes`` (``nodes``), ``Presence`` (``presence``,
``instances``), ``Peers`` (``peers``), the CA's files (``ca_files``) — and
the roles that use them: the ``Router`` (documents and relayed frames for
other organizations), ``Inquiries`` (what is addressed to the platform,
and its own rounds of inquiries), the ``Quota`` and the console's
``Operator`` (docs/architecture.md, "The platform's tables and their
owners"). The facade owns the transaction, reads the clock once per call,
dispatches a batch's frames by kind, and writes the event records after
the commit.

Only data crosses into the store thread: which targets are online is a
snapshot (``Room``) taken on the event loop before the call, and the frames
that may leave before the commit go out through a ``RelayPort`` (STYLE,
"data crosses the thread boundary, not closures")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from peewee import SqliteDatabase

from semq.node.engine import OperatorAction
from semq.session.ports import RelayPort
from semq.store.db import HOLD_MS, STORE_ERRORS, HeldWrites, translate
from semq.store.pg import PgDatabase, is_pg_url, redact, store_connection
from semq.tracking.events import EventLog, now_ms
from semq.umxt_protocol import (
    AckBatch,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    PeerAnnounce,
    PeerInfo,
    PresenceEntry,
    PresenceState,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
)
from semq.umxt_protocol import Presence as PresenceAnswer
from semq.umxt_protocol.units import route_org

from .batch import Events, PlatformBatch, PlatformOutput, Room, reach
from .cafiles import share_ca
from .chunks import CHUNK_DIR, ChunkFiles
from .cluster import LIVE_MS, Presence
from .copies import StoredCopies
from .inquiries import Inquiries
from .nodes import Nodes
from .operator import Operator
from .peers import Peers, observed_addresses
from .quota import Quota
from .routing import RELAYED, Router
from .seen import SEEN_RETENTION_MS, SeenDocuments
from .store import open_platform_store

__all__ = ["PlatformCore", "PlatformOutput", "Room"]

_ACKS_PER_FRAME: Final = 10_000  # entries of one ACK_BATCH
_PEERS_KEPT_MS: Final = 86_400_000  # an expired direct-link announcement is listed this long, then removed
_NOBODY: Final[Room] = {}


class PlatformCore(HeldWrites):
    """The platform's store and SEMQ rules. Not thread-safe: one caller at
    a time (the daemon's store gate)."""

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
        self.db: SqliteDatabase | PgDatabase = open_platform_store(
            store_path, create=create, synchronous=synchronous, check=check)
        self.conn, self.dialect = store_connection(self.db)
        # Chunks of large documents kept for absent receivers: in files, by
        # reference (SQLite); rows of the shared store (PostgreSQL: a file
        # on one instance's disk is invisible to the others).
        self.chunks: ChunkFiles | None = None if self.pg else ChunkFiles(Path(store_path).parent / CHUNK_DIR)
        # Several instances on one PostgreSQL store: who holds which
        # organization's connection (None unless this process is an
        # instance serving on it: semq.platform.cluster).
        self._cluster: Presence | None = Presence(self.conn, instance) if self.pg else None
        self.presence: Presence | None = self._cluster if instance else None
        self.auto_register = auto_register
        self.log = EventLog(events_dir, f"platform:{platform_id}", "platform") if events_dir else None
        self.seen = SeenDocuments(self.conn, self.dialect)
        self.copies = StoredCopies(self.conn, self.dialect, self.me, self.seen, self.chunks)
        self.nodes = Nodes(self.conn, clustered=self.presence is not None)
        self.peers = Peers(self.conn)
        # Bytes of stored documents one organization may have here at once
        # (0: no limit): past it a DATA to store is refused QUOTA_EXCEEDED.
        self.quota = Quota(self.copies, quota_bytes)
        self.router = Router(self.me, self.nodes, self.copies, self.seen, self.quota, self.chunks, self.presence)
        self.inquiry = Inquiries(self.me, self.copies, int(inquiry_interval * 1000))
        self.operator = Operator(self.copies, self.seen, self.nodes, self.write_held_now, self._tx)
        # How each frame kind is handled within a batch: a frame for another
        # organization is routed (kinds not here cannot be relayed), one for
        # the platform itself is its own (kinds not there are ignored).
        self._dispatch: dict[Kind, Callable[[PlatformBatch, Endpoint, RawFrame], None]] = {
            Kind.DATA: self.router.data, **{k: self.router.relay for k in RELAYED}}
        self._mine = self.inquiry.handlers

    # What changes at run time (a reload), and the owners' caches by their old names.

    @property
    def quota_bytes(self) -> int:
        return self.quota.limit

    @quota_bytes.setter
    def quota_bytes(self, value: int) -> None:
        self.quota.limit = value

    @property
    def inquiry_ms(self) -> int:
        return self.inquiry.inquiry_ms

    @inquiry_ms.setter
    def inquiry_ms(self, value: int) -> None:
        self.inquiry.inquiry_ms = value

    @property
    def known(self) -> set[Endpoint]:
        """The organizations known (a cache of the ``nodes`` table: semq.platform.nodes)."""
        return self.nodes.known

    @property
    def units(self) -> dict[Endpoint, int]:
        """The organizations that run several units, and how many."""
        return self.nodes.units

    # ------------------------------------------------------------ what is held

    def held(self) -> bool:
        """Whether anything is held in memory (write_held would write)."""
        return self.copies.held()

    def held_count(self) -> int:
        """Delivered copies whose SS_SENT is held (SS_INIT on disk)."""
        return self.copies.held_count()

    def write_held(self, before_ms: int | None = None) -> None:
        """Inside the caller's transaction: the SS_SENT of delivered copies
        still SS_INIT on disk (all, or those delivered at or before
        ``before_ms``), as claim_stored wrote it before the hold."""
        self.copies.write_held(before_ms)

    def _drop_held(self) -> None:
        # A transaction that did not commit: the copies held go again, and
        # the batch's rows were never written.
        self.copies.drop_held()
        self.seen.begin()

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

    def _emit(self, records: Events) -> None:
        if self.log and records:
            self.log.write(records)

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
        b = PlatformBatch(now_ms(), out, reach(room, out.forward_bytes))
        ts, me, mine, dispatch, other = b.ts, self.me, self._mine, self._dispatch, self.inquiry.other
        # ``sender`` is the route of the connection's unit (semq.umxt_protocol.units): acks
        # go back to it; the frames speak as its organization.
        org_ep = route_org(sender)
        with self._tx():
            self.copies.begin(b)
            self.seen.begin()
            if self.copies.held():
                self.copies.write_held(ts - HOLD_MS)
            for raw in frames:
                # An organization speaks only as itself: transport source and
                # application origin are the connection's (the decoder hands
                # out one Endpoint object per distinct header, hence ``is``
                # first: the dataclass comparison is Python code).
                src, org = raw.source, raw.origin
                if (src is not org_ep and src != org_ep) or (org is not org_ep and org != org_ep):
                    msg = f"{raw.kind.name} claims source {raw.source} / origin {raw.origin} on the connection of {sender}"
                    out.errors.append((ResultCode.SOURCE_MISMATCH, msg))
                    b.events.append({"ts": ts, "event": "refused", "code": int(ResultCode.SOURCE_MISMATCH),
                                     "node": sender.node_id, "detail": msg})
                    continue
                try:
                    if raw.target == me:
                        mine.get(raw.kind, other)(b, sender, raw)
                    else:
                        handler = dispatch.get(raw.kind)
                        if handler is None:
                            raise RemoteProtocolError(f"{raw.kind.name} for {raw.target} cannot be relayed",
                                                      ResultCode.UNEXPECTED_FRAME)
                        handler(b, sender, raw)
                except RemoteProtocolError as e:
                    out.errors.append((e.code, str(e)))
            self.copies.flush(last=True)  # (their ``seen`` rows with them: before the table's own)
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
            for (kind, target), entries in b.acks.items():
                for i in range(0, len(entries), _ACKS_PER_FRAME):
                    out.add(target, Frame(kind=Kind.ACK_BATCH, source=me, target=route_org(target),
                                          body=AckBatch(ack_kind=kind, entries=tuple(entries[i:i + _ACKS_PER_FRAME]))))
        self._emit(b.events)
        return out

    def store_handed_over(self, frames: Sequence[bytes]) -> set[Endpoint]:
        """Frames another instance handed over (semq.platform.cluster) that
        this one cannot give to their targets now (the target left, or its
        queue is over its high-water mark): stored for them, as a document
        for an offline target is, in one transaction. The origin of a
        document already has its ACK_FWD, so none gets an ACK_SAVE; its
        ``seen`` row now says STORED with the copy's LK1, which is what its
        inquiry learns. Returns the targets with new stored frames (woken
        here, or at the instance that holds them now)."""
        b = PlatformBatch(now_ms(), PlatformOutput(), reach(_NOBODY, {}))
        dec = FrameDecoder()
        dec.receive_data(b"".join(frames))
        raws = list(dec)  # (bytes that are no frame raise here, before any transaction)
        with self._tx():
            self.copies.begin(b)
            self.seen.begin()
            for raw in raws:
                self.router.handed_over(b, raw)
            self.copies.flush(last=True)
            self.seen.flush()
            if self.presence is not None and b.out.stored_for:
                self.presence.wake(b.out.stored_for)  # (one that moved on to a third instance)
        self._emit(b.events)
        return b.out.stored_for

    # ------------------------------------------------------------ delivery

    def claim_stored(self, target: Endpoint, limit: int, max_bytes: int = 8 << 20) -> tuple[list[bytes], int]:
        """SPEC P.2: up to ``limit`` stored frames for ``target`` (priority
        first, then acceptance order), and no more than ``max_bytes`` of them
        (but at least one), with LK1 set, marked SS_SENT and committed.
        Relayed acks/inquiries are deleted as they go (their ends ask again
        if they are lost). Returns (frames, DATA count). The byte bound keeps
        a batch of large documents from being read into memory at once."""
        ts = now_ms()
        with self._tx():
            if self.presence is not None and not self.presence.holds(target):
                return [], 0  # a newer connection elsewhere holds it (fenced)
            out, n_data, events, unused = self.copies.claim(target, limit, max_bytes, ts)
        if unused and self.chunks is not None:
            self.chunks.drop(unused)  # (after the commit: a rollback keeps the rows and their file)
        self._emit(events)
        return out, n_data

    def inquiries(self, room: Room) -> dict[Endpoint, list[bytes]]:
        """SPEC P.3: ask online targets (``room``: who is online) about
        stored copies delivered but not acked after
        the interval (doubling per unanswered inquiry, max 15 min)."""
        ts = now_ms()
        with self._tx():
            # Clustered: only about the organizations this instance holds.
            groups = self.inquiry.round(ts, reach(room, {}),
                                        None if self.presence is None else self.presence.held_here())
        return self.inquiry.frames(groups)

    def operator_apply(self, action: OperatorAction, rows: Sequence[tuple[int, int]]) -> list[int]:
        """The operator's requeue / resend / purge of stored copies, inside
        the caller's transaction (semq.platform.copies.StoredCopies.operator_apply)."""
        return self.copies.operator_apply(action, rows)

    def housekeeping(self) -> int:
        """Rows past their retention: ``seen`` after SEEN_RETENTION_MS, and
        direct-link announcements a day after they expired (until then the
        status shows them expired: a listener that went away)."""
        ts = now_ms()
        with self.db.atomic("IMMEDIATE"):
            n = self.seen.expire(ts - SEEN_RETENTION_MS)
            n += self.peers.expire(ts - _PEERS_KEPT_MS)
            referenced = self.copies.refs()
        if self.chunks is not None:
            n += self.chunks.sweep(referenced)  # files whose rows went another way (purge, crash)
        return n

    # ------------------------------------------------------------ nodes

    def register(self, node_ids: Sequence[str], units: int | None = None) -> None:
        """Make organizations known (again, if revoked); ``units``: grant
        each that many units (semq.umxt_protocol.units), else an organization new here is
        granted one and a known one keeps its grant. Raises StoreError."""
        ts = now_ms()
        try:
            with self.db.atomic("IMMEDIATE"):
                self.nodes.register(node_ids, units, ts)
        except STORE_ERRORS as e:
            raise translate(e, self.path, "platform store") from e

    def revoke(self, node_id: str) -> None:
        """The organization ``node_id`` is no longer known here (``semq
        platform revoke``: its certificates are the CA's to revoke).
        Raises StoreError."""
        try:
            with self._tx():
                self.nodes.revoke(node_id)
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

    def load_units(self) -> None:
        """Read the organizations' unit counts again (another instance of a
        clustered platform may have learnt one from a HELLO)."""
        self.nodes.load_units()

    def set_units(self, org: Endpoint, units: int) -> None:
        """``org`` runs ``units`` units (its HELLO says so), inside the
        caller's transaction: its waiting documents are spread over them."""
        if self.nodes.set_units(org, units):
            self.router.spread(org, units)

    def connected(self, ep: Endpoint, units: int = 1) -> bool:
        """A node completed HELLO (``ep``: the route of its unit, semq.umxt_protocol.units;
        ``units``: how many its organization runs). Returns False if it is
        not allowed. Its in-flight stored copies go again (SPEC P.2; it
        deduplicates)."""
        ts = now_ms()
        org = route_org(ep)
        with self._tx():
            self.copies.write_held()  # the attempts of the copies in flight, before they go again
            if not self.nodes.is_known(org):
                if not self.auto_register:
                    return False
                self.nodes.admit(org, ts)
            self.nodes.connected(org, ts)
            self.set_units(org, units)
            self.copies.reconnected(ep)
            if self.presence is not None:
                self.presence.attach(ep)  # this instance holds it now (fencing any other)
        self._emit([{"ts": ts, "event": "node_online", "node": ep.node_id}])
        return True

    def disconnected(self, ep: Endpoint) -> None:
        try:
            with self._tx():
                # The last time it was seen: what a PRESENCE answer says of it.
                self.nodes.connected(route_org(ep), now_ms())
        except STORE_ERRORS:
            pass  # its connection time stays the last seen
        if self.presence is not None:
            self.copies.forget_target(ep)
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
        return self.peers.lookup(asker, about, now_ms(), self.nodes.is_known(about))

    def presence_of(self, orgs: Sequence[str], here: Mapping[str, int]) -> PresenceAnswer:
        """The answer to a PRESENCE_QUERY naming ``orgs``; ``here``: the
        organizations connected to this instance, and since when (the
        relay's sessions). An organization not known here (or revoked) is
        UNKNOWN and nothing more; the others ONLINE since their connection
        began (here, or at another live instance of a clustered platform)
        or OFFLINE since they were last seen (docs/security.md "What
        presence tells")."""
        seen = self.nodes.last_seen(orgs)
        away = [o for o in orgs if o in seen and o not in here]
        elsewhere = self.presence.online_since(away) if self.presence is not None and away else {}
        ts = now_ms()
        entries = []
        for org in orgs:
            since = here.get(org) or elsewhere.get(org)
            if org not in seen:
                entries.append(PresenceEntry(org, PresenceState.UNKNOWN, 0, 0))
            elif since:
                entries.append(PresenceEntry(org, PresenceState.ONLINE, since, ts))
            else:
                entries.append(PresenceEntry(org, PresenceState.OFFLINE, seen[org], seen[org]))
        return PresenceAnswer(entries=tuple(entries))

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
            waiting = self.copies.waiting_among(self.presence.held_here())
            fenced = [ep for ep in list(self.presence.epochs) if not self.presence.holds(ep)]
            self.nodes.load_units()  # (learnt from a HELLO at another instance)
        self.copies.refresh_statistics()
        return waiting, fenced

    # ------------------------------------------------------------ status

    def counts(self) -> dict[str, Any]:
        """What ``semq status`` and the console show of the store."""
        totals = self.copies.totals()
        out: dict[str, Any] = {
            "known_nodes": sorted(ep.node_id for ep in self.nodes.known),
            "stored": {t: {"stored": n, "oldest_ms": oldest} for t, (n, oldest) in totals.per_target.items()},
            "relayed_waiting": totals.relayed,
            "seen": self.seen.count(),
            "direct": self.announced(),
            "chunks_kept": {"chunks": totals.chunks, "bytes": totals.chunk_bytes},
        }
        if self.pg:
            out["store"] = str(self.path)  # (the URL without its password)
            out["instances"] = self.instances()
        return out

    def instances(self) -> list[dict[str, Any]]:
        """PostgreSQL store: the instances running on it (heartbeat within
        LIVE_MS, else listed as gone) and how many organizations each holds."""
        if self._cluster is None:
            return []
        ts = now_ms()
        this = self.presence.instance if self.presence is not None else None
        return [{"id": r.id, "address": r.address, "pid": r.pid, "heartbeat_ms": r.heartbeat_ms,
                 "alive": ts - r.heartbeat_ms <= LIVE_MS, "holds": r.holds, "this": r.id == this}
                for r in self._cluster.instances()]
