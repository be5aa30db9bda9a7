"""The origin's side of large documents (semq.node.large).

The manifest is an outbox row like any document's (``large=1``): claimed,
sealed, signed, acknowledged and confirmed by ACK2 with a receipt through the
usual machinery. Its content stays in the file ``large_out.path`` names,
and its chunks are made from that file when they are sent — never stored
twice, never held whole in memory.

The receiver drives the chunks: its CHUNK_ACK(through) says every chunk
below ``through`` is written and synced there (the first, through=0,
answers the manifest). The daemon's ``LargeSender`` keeps at most
``window`` bytes of each document in flight beyond that, and interleaves
the chunks of all documents under way (by priority, then in turn) with the
session's other frames, a chunk at a time. A CHUNK_ACK with code RESUME
(semq.node.large_in) rewinds it to the receiver's ``through``: after a
restart of either node or a cut connection the transfer goes on from what
both sides have, not from zero. With no answer for a while, it sends the
next chunk the receiver lacks alone, as a probe (the receiver answers it
whatever it holds).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import trio

from semq.umxt_protocol import (
    LK0,
    Chunk,
    ChunkAck,
    Endpoint,
    Frame,
    Kind,
    NodeType,
    RawFrame,
    ResultCode,
    encode_frame,
)

from .batch import Batch, NodeContext
from .engine import SendState
from .large import ChunkSealer, Manifest
from .writebehind import columns

if TYPE_CHECKING:
    from semq.session.transport import FrameStream
    from semq.store.gate import StoreGate

    from .core import NodeCore

__all__ = ["WINDOW_BYTES", "LargeSender", "Outgoing", "chunk_ack", "confirmed", "pending", "stored_manifests"]

log = logging.getLogger("semq.node.large")

# Bytes of one document in flight beyond what its receiver committed: four
# of its acknowledgements (semq.node.large_in.ACK_EVERY_BYTES), so that the
# pipe never empties while one makes its way back (scripts/bench large, 1 GiB:
# +15% over 8 MiB; 32 MiB with acks every 8 MiB was no faster).
WINDOW_BYTES: Final = 16 << 20
TOTAL_WINDOW_BYTES: Final = 32 << 20  # ... and of all documents together, on one session
STALL_S: Final = 5.0  # no answer for this long with chunks in flight: probe
STALL_MAX_S: Final = 120.0  # ... doubling up to this
_RESUME: Final = ResultCode.UNEXPECTED_FRAME  # (semq.node.large_in.RESUME)
_SENT_STATES: Final = tuple(int(s) for s in (SendState.SS_SENT, SendState.SS_ACK_FWD, SendState.SS_ACK))


@dataclass(frozen=True)
class Outgoing:
    """One large document of ours, as the sender needs it."""

    record_id: int
    lk0: LK0
    target: Endpoint
    priority: int
    path: Path
    manifest: Manifest


class _Row(NamedTuple):
    """A large document's pending-send row with its ``large_out`` row."""

    id: int
    target_type: int
    target_id: str
    priority: int
    state: int
    path: str
    manifest: bytes


_SELECT: Final = (f"SELECT {columns(_Row)} FROM (SELECT o.id, o.target_type, o.target_id, o.priority, o.state,"
                  " l.path, l.manifest FROM outbox o JOIN large_out l ON l.id = o.id)")


def _outgoing(ctx: NodeContext, r: _Row) -> Outgoing:
    p = Path(r.path)
    if not p.is_absolute():
        p = Path(ctx.path).parent / p
    return Outgoing(record_id=r.id, lk0=ctx.lk0(r.id),
                    target=Endpoint(node_type=NodeType(r.target_type), node_id=r.target_id),
                    priority=r.priority, path=p, manifest=Manifest.decode(r.manifest))


def chunk_ack(ctx: NodeContext, b: Batch, raw: RawFrame) -> None:
    """A CHUNK_ACK from a receiver, in the batch's transaction: for one of
    our large documents still open, addressed to that receiver, it goes to
    the sender (``b.out.chunk_acks``); anything else is ignored (an
    organization cannot steer another's transfer)."""
    frame = raw.frame()
    body = frame.body
    assert isinstance(body, ChunkAck)
    lk0 = body.lk0
    if lk0.endpoint != ctx.me or lk0.semq_id != ctx.unit:
        return
    found = ctx.conn.execute(_SELECT + " WHERE id=?", (lk0.record_id,)).fetchone()
    if found is None:
        return
    row = _Row._make(found)
    stored = frame.origin.node_type is NodeType.PLATFORM  # "chunk through-1 is stored here"
    if not stored and row.target_id != frame.origin.node_id:
        return
    if body.code not in (ResultCode.OK, _RESUME):
        return  # (a whole document is refused with a signed NACK, not here)
    if not stored:
        # Its receiver is working on it: the manifest's inquiry waits (asked
        # now, it would hear "not received" and send the manifest again,
        # one more attempt, for a transfer that is going well).
        ctx.conn.execute("UPDATE outbox SET due_ms=max(coalesce(due_ms, 0), ?), inquiries=0 WHERE id=?",
                         (b.ts + ctx.inquiry_ms, row.id))
    b.out.chunk_acks.append((_outgoing(ctx, row), body.through, body.code == _RESUME and not stored, stored))


def stored_manifests(ctx: NodeContext, b: Batch, record_ids: list[int]) -> None:
    """ACK_SAVE for these rows: those that are large documents start
    sending their chunks to the platform, which keeps them for the
    receiver (``b.out.chunk_acks``, as from the platform: no credit yet)."""
    if not record_ids or ctx.conn.execute("SELECT 1 FROM large_out LIMIT 1").fetchone() is None:
        return
    marks = ",".join("?" * len(record_ids))
    for found in ctx.conn.execute(_SELECT + f" WHERE id IN ({marks})", record_ids):
        b.out.chunk_acks.append((_outgoing(ctx, _Row._make(found)), 0, False, True))


def confirmed(ctx: NodeContext, record_ids: list[int]) -> None:
    """ACK2 (with its receipt, with security) for these rows: the copies of
    those that are large documents go now, not at the next housekeeping
    (nothing is sent from them again: the document is delivered)."""
    if not record_ids or ctx.conn.execute("SELECT 1 FROM large_out LIMIT 1").fetchone() is None:
        return
    marks = ",".join("?" * len(record_ids))
    done = ctx.conn.execute(f"SELECT id, path FROM large_out WHERE id IN ({marks})", record_ids).fetchall()
    if not done:
        return
    ctx.conn.executemany("DELETE FROM large_out WHERE id=?", [(i,) for i, _ in done])
    base = Path(ctx.path).parent
    for _, path in done:
        (base / path).unlink(missing_ok=True)


def pending(ctx: NodeContext) -> list[Outgoing]:
    """Our large documents whose manifest has been sent and that are not
    confirmed yet: the transfers a new session takes up."""
    held = ctx.held.sent  # (sent rows whose state is held in memory are SS_INIT on disk)
    rows = map(_Row._make, ctx.conn.execute(_SELECT))
    return [_outgoing(ctx, r) for r in rows if r.state in _SENT_STATES or r.id in held]


@dataclass(eq=False)
class _Transfer:
    doc: Outgoing
    through: int = 0  # the receiver has every chunk below this
    kept: int = 0  # ... or the platform keeps them for it (it is away)
    kept_count: int = 0  # chunks the platform said it keeps
    next: int = 0  # the next chunk to send
    sent_max: int = 0  # chunks below this were sent at least once
    resent: int = 0  # chunks sent again (after a rewind)
    probing: bool = True  # one chunk at a time until the receiver answers
    answered: float = 0.0  # when we last heard from the receiver (trio clock)
    stall: float = STALL_S
    sealer: ChunkSealer | None = field(default=None, repr=False)
    fd: int = -1

    def frame(self, me: Endpoint, index: int) -> bytes:
        """Chunk ``index`` as a frame (on a worker thread: read, compress, seal)."""
        d = self.doc
        m = d.manifest
        if self.sealer is None:
            self.sealer = ChunkSealer(d.lk0, m)
        if self.fd < 0:
            self.fd = os.open(d.path, os.O_RDONLY)
        want = m.chunk_len(index)
        content = os.pread(self.fd, want, index * m.chunk_size)
        if len(content) != want:
            raise OSError(f"{d.path}: {len(content)} bytes at chunk {index} where {want} were expected"
                          " (the file was changed)")
        flags, payload = self.sealer.seal(index, content)
        return encode_frame(Frame(kind=Kind.CHUNK, source=me, target=d.target, priority=d.priority,
                                  body=Chunk(lk0=d.lk0, index=index, flags=flags, payload=payload)))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LargeSender:
    """The chunks of our large documents under way, sent over the platform
    session (one ``run`` per session); the transfers outlive sessions."""

    def __init__(self, core: NodeCore, gate: StoreGate, window_bytes: int = WINDOW_BYTES) -> None:
        self.core = core
        self.gate = gate
        self.window_bytes = window_bytes
        self.transfers: dict[int, _Transfer] = {}
        self._wake = trio.Event()
        self.stats = {"chunks_sent": 0, "chunks_resent": 0, "chunks_kept_by_platform": 0, "large_bytes_sent": 0}
        self._events: list[dict[str, Any]] = []  # written to the event log by ``run`` (through the gate)

    # ------------------------------------------------------------ answers

    def acked(self, acks: list[tuple[Outgoing, int, bool, bool]]) -> None:
        """CHUNK_ACKs the core took (on the event loop, after their batch):
        (document, through, resume, stored) — ``stored``: from the platform,
        which keeps chunk ``through - 1`` for an absent receiver."""
        now = trio.current_time()
        done: list[dict[str, Any]] = []
        for doc, through, resume, stored in acks:
            t = self.transfers.get(doc.record_id)
            if t is None:
                t = self.transfers[doc.record_id] = _Transfer(doc=doc)
            t.answered = now
            t.probing = False
            if stored:
                self.stats["chunks_kept_by_platform"] += int(through > 0)
                t.kept_count += int(through > 0)
                if through - 1 <= max(t.through, t.kept):
                    t.kept = max(t.kept, through)  # the platform holds every chunk below
                continue
            if through >= doc.manifest.chunks:
                done.append({"event": "large_sent", "lk0": str(doc.lk0), "target": doc.target.node_id,
                             "chunks": doc.manifest.chunks, "resent": t.resent, "kept": t.kept_count,
                             "size": doc.manifest.size})
                t.close()
                del self.transfers[doc.record_id]
                continue
            if through > t.through:
                t.stall = STALL_S
            if resume:
                if t.next != through:
                    log.info("%s: the receiver has %d of %d chunks; going on from there", doc.lk0, through,
                             doc.manifest.chunks)
                t.through = t.next = through
            else:
                t.through = max(t.through, through)
                t.next = max(t.next, t.through)
        self._events.extend(done)
        self._wake.set()

    def forget(self, record_ids: list[int]) -> None:
        """Documents that ended otherwise (refused, purged): stop sending."""
        for rid in record_ids:
            t = self.transfers.pop(rid, None)
            if t is not None:
                t.close()

    # ------------------------------------------------------------ a session

    async def run(self, fs: FrameStream) -> None:
        """Send chunks over ``fs`` until cancelled (the session ends). Every
        transfer under way starts with a probe: what the receiver holds is
        not known after a new session."""
        docs = await self.gate.run(pending, self.core.ctx)
        known = {d.record_id for d in docs}
        for rid in [r for r in self.transfers if r not in known]:
            self.forget([rid])
        now = trio.current_time()
        for d in docs:
            t = self.transfers.get(d.record_id)
            if t is None:
                t = self.transfers[d.record_id] = _Transfer(doc=d)
            t.next = t.through
            t.probing = True
            t.answered = now
        me = self.core.me
        while True:
            if self._events:
                records, self._events = self._events, []
                await self.gate.run(self._log, records)
            t = self._pick()
            if t is None:
                await self._idle()
                continue
            index = t.next
            t.next += 1
            if index < t.sent_max:
                t.resent += 1
                self.stats["chunks_resent"] += 1
            t.sent_max = max(t.sent_max, t.next)
            try:
                data = await trio.to_thread.run_sync(t.frame, me, index)
            except OSError as e:
                log.error("large document %s cannot be read: %s", t.doc.lk0, e)
                self.forget([t.doc.record_id])
                continue
            await fs.send(data)
            self.stats["chunks_sent"] += 1
            self.stats["large_bytes_sent"] += len(data)

    def _pick(self) -> _Transfer | None:
        """The next transfer with room in its window: highest priority
        first, in turn among equals (the one picked goes to the back)."""
        window = self.window_bytes
        in_flight = sum((t.next - max(t.through, t.kept)) * t.doc.manifest.chunk_size
                        for t in self.transfers.values())
        if in_flight >= TOTAL_WINDOW_BYTES:
            return None  # (every document's chunks together: the session's byte window)
        best: _Transfer | None = None
        for t in self.transfers.values():
            m = t.doc.manifest
            if t.next >= m.chunks:
                continue
            room = 1 if t.probing else max(2, window // m.chunk_size)
            if t.next - max(t.through, t.kept) >= room:
                continue
            if best is None or t.doc.priority > best.doc.priority:
                best = t
        if best is not None:
            rid = best.doc.record_id
            del self.transfers[rid]
            self.transfers[rid] = best  # to the back of the turn
        return best

    async def _idle(self) -> None:
        """Until an answer comes, or the oldest silence becomes a stall
        (then the transfer probes: its next missing chunk, alone)."""
        self._wake = trio.Event()
        now = trio.current_time()
        waiting = [t for t in self.transfers.values() if t.next > max(t.through, t.kept)]
        deadline = min((t.answered + t.stall for t in waiting), default=now + 3600)
        with trio.move_on_at(deadline):
            await self._wake.wait()
            return
        now = trio.current_time()
        for t in waiting:
            if now >= t.answered + t.stall:
                base = max(t.through, t.kept)
                log.info("%s: no answer from %s for %.0f s; asking with chunk %d", t.doc.lk0,
                         t.doc.target.node_id, t.stall, base)
                t.next = base
                t.probing = True
                t.answered = now
                t.stall = min(STALL_MAX_S, t.stall * 2)

    def _log(self, records: list[dict[str, Any]]) -> None:
        log_ = self.core.ctx.log
        if log_ is None:
            return
        ts = self.core.ctx.now()
        me = self.core.me.node_id
        log_.write([{"ts": ts, "role": "origin", "source": me, **r} for r in records])

    def status(self) -> list[dict[str, Any]]:
        return [{"lk0": str(t.doc.lk0), "target": t.doc.target.node_id, "size": t.doc.manifest.size,
                 "chunks": t.doc.manifest.chunks, "through": t.through, "resent": t.resent}
                for t in self.transfers.values()]
