"""The relay's routing (SPEC P.1, P.4): ``route()`` (semq.platform.engine)
applied to each DATA for another organization — forwarded to its target's
connection, stored for it, dropped or refused — and acks and inquiries
between nodes forwarded or kept like SaveFwd 3 documents.

Owns no table: a copy to store is queued with ``StoredCopies``, what became
of a document is recorded with ``SeenDocuments``, who is known and who runs
several units is asked of ``Nodes``, who is held by another instance of a
clustered platform of ``Presence``.

The relay never parses a DATA body beyond its fixed prefix: it routes on
the header and forwards the bytes (MEASUREMENTS: "a relay only needs to
route"). A frame is routed to a unit's route (semq.umxt_protocol.units)
when its organization runs several."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any, Final

from semq.umxt_protocol import (
    FLAG_ORDERED,
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
    InquiryResp,
    InquiryTopic,
    Kind,
    Nack,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
    relay_bytes,
    relay_frame_bytes,
)
from semq.umxt_protocol.units import UNIT_SEP, holder, route_of, route_org, unit_for

from .batch import PlatformBatch, event, received
from .chunks import MAX_KEPT_FILES, ChunkFiles, chunk_file_name
from .cluster import HOP_MAX_FRAME, Presence
from .copies import NewCopy, StoredCopies
from .engine import Route, route
from .nodes import Nodes
from .quota import Quota
from .seen import SeenAction, SeenDocuments

__all__ = ["RELAYED", "Router"]

# Frames relayed between nodes like SaveFwd 3 documents (SPEC P.4). (CHUNK
# and CHUNK_ACK: a large document's content and its receiver's progress,
# semq.node.large; relayed like an ACK2, never opened.)
RELAYED: Final = frozenset({Kind.ACK2, Kind.REACK2, Kind.INQUIRY, Kind.INQUIRY_RESP, Kind.ACK_BATCH, Kind.NACK,
                            Kind.CHUNK, Kind.CHUNK_ACK})
_FORWARDED: Final = int(SeenAction.FORWARDED)
_DROPPED: Final = int(SeenAction.DROPPED)
_PLATFORM_FLAG: Final = int(AckFlag.PLATFORM)
_FORWARDED_FLAG: Final = int(ForwardFlag.FORWARDED)
_ROUTES_MAX: Final = 100_000  # routes of units cached before the cache is emptied

# route() by its inputs (a handful of combinations): one look-up per DATA.
_ROUTES: dict[tuple[bool, bool, int, bool, bool], tuple[Route, ResultCode]] = {}


class Router:
    """Frames from one organization for another, inside the batch's
    transaction (the platform's store thread)."""

    def __init__(self, me: Endpoint, nodes: Nodes, copies: StoredCopies, seen: SeenDocuments, quota: Quota,
                 chunks: ChunkFiles | None, presence: Presence | None) -> None:
        self.me = me
        self.nodes = nodes
        self.copies = copies
        self.seen = seen
        self.quota = quota
        self.chunks = chunks
        self.presence = presence
        # Read per document: bound once (Nodes never rebinds them).
        self._known = nodes.known
        self._units = nodes.units
        self._routes: dict[tuple[Endpoint, int], Endpoint] = {}

    # ------------------------------------------------------------ units

    def route(self, target: Endpoint, lk0: LK0, ordered: bool = False) -> Endpoint:
        """Where a document for ``target`` goes: the route of the unit that
        holds it (the target itself for an organization of one unit). A
        document of an ordered channel (DATA flag Ordered) goes to unit 1:
        one store keeps the channel's order (semq.node.origin.channels)."""
        n = self.nodes.units_of(target)
        if n is None:
            return target
        return self._unit_route(target, 1 if ordered else holder(lk0, n))

    def _unit_route(self, org: Endpoint, unit: int) -> Endpoint:
        """route_of, one Endpoint per unit (looked up per document)."""
        r = self._routes.get((org, unit))
        if r is None:
            if len(self._routes) > _ROUTES_MAX:
                self._routes.clear()
            r = self._routes[(org, unit)] = route_of(org, unit)
        return r

    def spread(self, org: Endpoint, units: int) -> None:
        """``org`` now runs ``units`` units: its stored documents not yet
        delivered go to the unit each one's LK0 picks among them (stored
        before its first HELLO as a node of several units, they wait for
        unit 1). Delivered ones stay with the unit that has them. Documents
        of ordered channels stay with (or go to) unit 1."""
        self.copies.retarget([(want, rid) for rid, lk0, tid, ordered in self.copies.undelivered_of(org)
                              if (want := route_of(org, 1 if ordered else holder(lk0, units)).node_id) != tid])

    def relay_routes(self, raw: RawFrame) -> list[tuple[Endpoint, RawFrame]]:
        """Where an ack, inquiry or answer for ``raw.target`` goes: to the
        unit of the record it names (semq.umxt_protocol.units), split per unit when its
        items are about several (an inquiry about documents held by
        different units). A batch with a receipt is never split (the
        receiver signed it whole): the node sends one per unit."""
        target = raw.target
        n = self.nodes.units_of(target)
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

    # ------------------------------------------------------------ documents

    def data(self, b: PlatformBatch, sender: Endpoint, raw: RawFrame) -> None:
        """SPEC P.1: a DATA from ``sender`` (the route of the connection's
        unit) forwarded, stored (written by ``StoredCopies.flush``, which
        acks and logs it), dropped or refused, as ``route()`` says."""
        lk0, _lk1, created, expires = raw.data_prefix()
        target = raw.target
        ts, out, presence = b.ts, b.out, self.presence
        dest = (target if not self._units and presence is None
                else self.route(target, lk0, bool(raw.flags & FLAG_ORDERED)))
        reliable = raw.reliable
        save_fwd = raw.save_fwd
        on = b.online(dest)
        hop = None
        if not on and presence is not None:
            hop = presence.elsewhere(dest)
            if hop is not None:
                # Held by another instance (semq.platform.cluster): handed to
                # it one hop at the commit, as to a connection of our own; a
                # frame too large for a hop goes through the store (woken at
                # commit), whatever its SaveFwd.
                if len(raw.raw) <= HOP_MAX_FRAME:
                    on = True
                else:
                    hop, save_fwd, reliable = None, 3, True
        rk = (target in self._known or self.nodes.is_known(target), on, save_fwd, reliable,
              expires is not None and expires <= ts)
        decided = _ROUTES.get(rk)
        if decided is None:
            decided = _ROUTES[rk] = route(known=rk[0], online=rk[1], save_fwd=rk[2], reliable=rk[3],
                                          expired=rk[4])
        where, code = decided
        origin = lk0.endpoint
        key = (int(origin.node_type), origin.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        lk0_text = str(lk0)
        events = b.events
        events.append(received(raw, lk0_text, origin.node_id, target.node_id, created, ts))
        if where is Route.FORWARD:
            fb = relay_frame_bytes(raw.raw, self.me)
            if hop is not None:
                out.hops[hop].append((dest, fb))
            else:
                out.forwards[dest].append(fb)
                out.forward_bytes[dest] += len(fb)
            if reliable:
                self.seen.add((*key, _FORWARDED, 0, ts))
                b.acks[(Kind.ACK_FWD, sender)].append(AckEntry(
                    1, 1, 0, lk0.semq_id, lk0.semq_db_id, lk0.record_id, _PLATFORM_FLAG, _FORWARDED_FLAG))
            events.append({"ts": ts, "event": "forwarded", "lk0": lk0_text, "source": origin.node_id,
                           "target": target.node_id})
        elif where is Route.STORE:
            if self.quota.limit and not self.quota.allows(key[0], key[1], len(raw.raw)):
                text = (f"organization {origin.node_id} has {self.quota.limit >> 20} MiB of documents stored"
                        " here, its quota: kept by the origin, sent again later")
                out.add(sender, Frame(kind=Kind.NACK, source=self.me, target=route_org(sender),
                                      body=Nack(lk0=lk0, code=ResultCode.QUOTA_EXCEEDED, message=text)))
                events.append(event(raw, lk0, ts, "refused", code=int(ResultCode.QUOTA_EXCEEDED)))
                return
            self.copies.queue(NewCopy(raw, sender, dest, lk0, key, expires, ts))
        elif where is Route.DROP and self.seen.forwarded_before(key):
            # A copy sent again whose first copy this platform forwarded (its
            # origin lost the ACK_FWD, e.g. in a crash): forwarded is the
            # answer, not dropped; the origin asks the target whether it
            # arrived (SaveFwd 1: reported dropped only if it did not).
            b.acks[(Kind.ACK_FWD, sender)].append(AckEntry(
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
            events.append(event(raw, lk0, ts, "dropped" if where is Route.DROP else "refused", code=int(code)))
        else:  # DISCARD: best effort, never acked (SPEC: Reliable=0)
            events.append(event(raw, lk0, ts, "dropped", code=int(code)))

    def relay(self, b: PlatformBatch, sender: Endpoint | None, raw: RawFrame) -> None:
        """SPEC P.4: acks and inquiries between nodes travel like SaveFwd=3
        messages: forwarded, or stored while the target is offline. A
        large document's chunk stored here is acknowledged to its origin
        (a CHUNK_ACK from the platform, after the commit): it may send the
        rest while its receiver is away (semq.node.large.outgoing)."""
        if UNIT_SEP in raw.target.node_id:  # a unit's route is the platform's, never a frame's target
            raise RemoteProtocolError(f"{raw.kind.name} for unknown target {raw.target}", ResultCode.UNKNOWN_TARGET)
        out, presence, online = b.out, self.presence, b.online
        for target, part in (self.relay_routes(raw) if self._units or presence is not None
                             else ((raw.target, raw),)):
            hop = None
            if online(target):
                fb = relay_bytes(part, self.me)
                out.forwards[target].append(fb)
                out.forward_bytes[target] += len(fb)
            elif (presence is not None and len(raw.raw) <= HOP_MAX_FRAME
                  and (hop := presence.elsewhere(target)) is not None):
                out.hops[hop].append((target, relay_bytes(part, self.me)))
            elif self.nodes.is_known(part.target):
                if raw.kind is Kind.CHUNK:
                    self._keep_chunk(b, part, target, sender)
                else:
                    out.stored_for.add(target)
                    self.copies.keep_relayed(part, b.ts, target)
            else:
                raise RemoteProtocolError(f"{part.kind.name} for unknown target {part.target}",
                                          ResultCode.UNKNOWN_TARGET)

    def _keep_chunk(self, b: PlatformBatch, raw: RawFrame, target: Endpoint, sender: Endpoint | None) -> None:
        """A large document's chunk for a target that is away: kept (in a
        file, by reference, on SQLite) within its origin's quota, and the
        origin told so after the commit (it may send the rest meanwhile).
        Past the quota it is not kept and not acknowledged: the origin
        sends it again when the receiver asks."""
        c = raw.frame().body
        assert isinstance(c, Chunk)
        o, ts = raw.origin, b.ts
        name = chunk_file_name(c.lk0, target)
        if self.chunks is not None and not self.chunks.has(name) and self.copies.kept_files(o) >= MAX_KEPT_FILES:
            # One file per document: an organization cannot spend the
            # platform's inodes with chunks of many tiny "documents".
            b.events.append({"ts": ts, "event": "refused", "lk0": str(c.lk0), "source": o.node_id,
                             "target": target.node_id, "code": int(ResultCode.QUOTA_EXCEEDED),
                             "detail": f"chunk {c.index} not kept: {MAX_KEPT_FILES} large documents of"
                                       f" {o.node_id} are kept here already"})
            return
        if self.quota.limit and not self.quota.allows(int(o.node_type), o.node_id, len(raw.raw)):
            # (A few per minute at most: the origin's window stops it, and it
            # sends again only when its probe backs off or the receiver asks.)
            b.events.append({"ts": ts, "event": "refused", "lk0": str(c.lk0), "source": o.node_id,
                             "target": target.node_id, "code": int(ResultCode.QUOTA_EXCEEDED),
                             "detail": f"chunk {c.index} not kept: over the quota of {self.quota.limit >> 20} MiB"})
            return
        b.out.stored_for.add(target)
        if self.chunks is None:
            self.copies.keep_relayed(raw, ts, target)
        else:
            self.copies.keep_chunk(raw, ts, target, c.lk0, name, self.chunks.append(name, raw.raw))
        if sender is not None:
            b.out.add(sender, Frame(kind=Kind.CHUNK_ACK, source=self.me, target=route_org(sender),
                                    body=ChunkAck(lk0=c.lk0, through=c.index + 1)))

    def handed_over(self, b: PlatformBatch, raw: RawFrame) -> None:
        """A frame another instance handed over (semq.platform.cluster) that
        cannot go to its target now: stored for it, as a document for an
        offline target is. A document's origin has its ACK_FWD already: it
        gets no ACK_SAVE (``NewCopy.sender`` None)."""
        if raw.kind is Kind.DATA:
            lk0, _lk1, _created, expires = raw.data_prefix()
            o = lk0.endpoint
            key = (int(o.node_type), o.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
            self.copies.queue(NewCopy(raw, None, self.route(raw.target, lk0, bool(raw.flags & FLAG_ORDERED)),
                                      lk0, key, expires, b.ts))
        elif raw.kind in RELAYED:
            for target, part in self.relay_routes(raw):
                b.out.stored_for.add(target)
                self.copies.keep_relayed(part, b.ts, target)

