"""The origin's side of large documents on the store thread
(semq.node.large.manifest says what one is).

The manifest is an outbox row like any document's (``large=1``): claimed,
sealed, signed, acknowledged and confirmed by ACK2 with a receipt through the
usual machinery. Its content stays in the file ``large_out.path`` names,
and its chunks are made from that file when they are sent — never stored
twice, never read whole into memory.

Here: which of our large documents are under way, and what a batch's
CHUNK_ACK, ACK_SAVE and ACK2 mean for them (``b.out.chunk_acks``, for the
daemon's chunk sender, semq.node.daemon.large_sender, which runs on the event loop
and sends the chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol, TypeVar

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
from .manifest import Manifest

__all__ = ["WINDOW_BYTES", "DocRow", "LargeOut", "OutboxView", "Outgoing"]

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


R = TypeVar("R", bound=tuple[Any, ...])


class DocRow(NamedTuple):
    """What the chunk sender needs of a large document's pending-send row."""

    id: int
    target_type: int
    target_id: str
    priority: int
    state: int  # the real state (a deferred one from memory)


class OutboxView(Protocol):
    """What this owner asks of the pending-send table's
    (semq.node.origin.outbox.Outbox), passed in by NodeCore."""

    def by_ids(self, row: type[R], ids: Sequence[int]) -> dict[int, R]: ...

    def postpone_inquiry(self, rid: int, until_ms: int) -> None: ...


class LargeOut:
    """Our large documents' content (``large_out``: one row per manifest
    row of the outbox, naming its file) until the document is confirmed."""

    def __init__(self, ctx: NodeContext, outbox: OutboxView) -> None:
        self.ctx = ctx
        self.outbox = outbox
        self.base = Path(ctx.path).parent  # rows name files relative to it (a restore may move it)

    def _outgoing(self, r: DocRow, path: str, manifest: bytes) -> Outgoing:
        p = Path(path)
        if not p.is_absolute():
            p = self.base / p
        return Outgoing(record_id=r.id, lk0=self.ctx.lk0(r.id),
                        target=Endpoint(node_type=NodeType(r.target_type), node_id=r.target_id),
                        priority=r.priority, path=p, manifest=Manifest.decode(manifest))

    def _with_rows(self, kept: Sequence[tuple[int, str, bytes]]) -> list[tuple[DocRow, str, bytes]]:
        """Our rows ``kept`` (id, path, manifest) with their pending-send rows."""
        rows = self.outbox.by_ids(DocRow, [i for i, _, _ in kept])
        return [(rows[i], path, m) for i, path, m in kept if i in rows]

    def accepted(self, docs: Sequence[tuple[int, str, bytes, int, int]]) -> None:
        """Documents accepted as large (record id, path relative to the
        store's directory, manifest, size, time), in the accepting transaction."""
        self.ctx.conn.executemany("INSERT INTO large_out (id, path, manifest, size, created_ms) VALUES (?,?,?,?,?)",
                                  docs)

    def chunk_ack(self, b: Batch, raw: RawFrame) -> None:
        """A CHUNK_ACK from a receiver, in the batch's transaction: for one of
        our large documents still open, addressed to that receiver, it goes to
        the sender (``b.out.chunk_acks``); anything else is ignored (an
        organization cannot steer another's transfer)."""
        ctx = self.ctx
        frame = raw.frame()
        body = frame.body
        assert isinstance(body, ChunkAck)
        lk0 = body.lk0
        if lk0.endpoint != ctx.me or lk0.semq_id != ctx.unit:
            return
        kept = ctx.conn.execute("SELECT id, path, manifest FROM large_out WHERE id=?", (lk0.record_id,)).fetchall()
        found = self._with_rows(kept)
        if not found:
            return
        row, path, manifest = found[0]
        stored = frame.origin.node_type is NodeType.PLATFORM  # "chunk through-1 is stored here"
        if not stored and row.target_id != frame.origin.node_id:
            return
        if body.code not in (ResultCode.OK, _RESUME):
            return  # (a whole document is refused with a signed NACK, not here)
        if not stored:
            # Its receiver is working on it: the manifest's inquiry waits (asked
            # now, it would hear "not received" and send the manifest again,
            # one more attempt, for a transfer that is going well).
            self.outbox.postpone_inquiry(row.id, b.ts + ctx.inquiry_ms)
        b.out.chunk_acks.append((self._outgoing(row, path, manifest), body.through,
                                 body.code == _RESUME and not stored, stored))

    def _any(self) -> bool:
        """Whether we have a large document at all (the acks of every batch ask)."""
        return self.ctx.conn.execute("SELECT 1 FROM large_out LIMIT 1").fetchone() is not None

    def stored_manifests(self, b: Batch, record_ids: list[int]) -> None:
        """ACK_SAVE for these rows: those that are large documents start
        sending their chunks to the platform, which keeps them for the
        receiver (``b.out.chunk_acks``, as from the platform: no credit yet)."""
        if not record_ids or not self._any():
            return
        marks = ",".join("?" * len(record_ids))
        kept = self.ctx.conn.execute(f"SELECT id, path, manifest FROM large_out WHERE id IN ({marks})",
                                     record_ids).fetchall()
        for row, path, manifest in self._with_rows(kept):
            b.out.chunk_acks.append((self._outgoing(row, path, manifest), 0, False, True))

    def confirmed(self, record_ids: list[int]) -> None:
        """ACK2 (with its receipt, with security) for these rows: the copies of
        those that are large documents go now, not at the next housekeeping
        (nothing is sent from them again: the document is delivered)."""
        if not record_ids or not self._any():
            return
        marks = ",".join("?" * len(record_ids))
        done = self.ctx.conn.execute(f"SELECT id, path FROM large_out WHERE id IN ({marks})", record_ids).fetchall()
        self._forget(done)

    def _forget(self, done: Sequence[tuple[int, str]]) -> None:
        if not done:
            return
        self.ctx.conn.executemany("DELETE FROM large_out WHERE id=?", [(i,) for i, _ in done])
        for _, path in done:
            (self.base / path).unlink(missing_ok=True)  # (an absolute path stays itself)

    def pending(self) -> list[Outgoing]:
        """Our large documents whose manifest has been sent and that are not
        confirmed yet: the transfers a new session takes up."""
        kept = self.ctx.conn.execute("SELECT id, path, manifest FROM large_out").fetchall()
        return [self._outgoing(r, path, m) for r, path, m in self._with_rows(kept) if r.state in _SENT_STATES]

    def sizes(self, record_ids: Sequence[int]) -> dict[int, int]:
        """The content's size of those of ``record_ids`` that are large documents."""
        if not record_ids:
            return {}
        marks = ",".join("?" * len(record_ids))
        return {int(i): int(n) for i, n in self.ctx.conn.execute(
            f"SELECT id, size FROM large_out WHERE id IN ({marks})", list(record_ids))}

    def clean(self, live_ids_sql: str) -> int:
        """The rows and files of documents whose pending-send row is gone
        (``live_ids_sql``, the outbox's: confirmed, or failed and purged).
        Returns rows removed."""
        done = self.ctx.conn.execute(f"SELECT id, path FROM large_out WHERE id NOT IN ({live_ids_sql})").fetchall()
        self._forget(done)
        return len(done)
