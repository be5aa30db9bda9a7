"""The origin's side of large documents on the store thread
(semq.node.large.manifest says what one is).

The manifest is an outbox row like any document's (``large=1``): claimed,
sealed, signed, acknowledged and confirmed by ACK2 with a receipt through the
usual machinery. Its content stays in the file ``large_out.path`` names,
and its chunks are made from that file when they are sent — never stored
twice, never held whole in memory.

Here: which of our large documents are under way, and what a batch's
CHUNK_ACK, ACK_SAVE and ACK2 mean for them (``b.out.chunk_acks``, for the
daemon's chunk sender, semq.node.large_sender, which runs on the event loop
and sends the chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

from semq.umxt_protocol import (
    LK0,
    ChunkAck,
    Endpoint,
    NodeType,
    RawFrame,
    ResultCode,
)

from ..batch import Batch, NodeContext
from ..engine import SendState
from ..writebehind import columns
from .manifest import Manifest

__all__ = ["WINDOW_BYTES", "Outgoing", "chunk_ack", "confirmed", "pending", "stored_manifests"]

# Bytes of one document in flight beyond what its receiver committed: four
# of its acknowledgements (semq.node.large.incoming.ACK_EVERY_BYTES), so that the
# pipe never empties while one makes its way back (scripts/bench large, 1 GiB:
# +15% over 8 MiB; 32 MiB with acks every 8 MiB was no faster).
WINDOW_BYTES: Final = 16 << 20
_RESUME: Final = ResultCode.UNEXPECTED_FRAME  # (semq.node.large.incoming.RESUME)
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
