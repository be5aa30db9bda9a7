"""Housekeeping of a node's store: bounded tables (SPEC "Cleanup") and the
counts ``semq status`` shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from .batch import NodeContext
from .engine import SendState
from .origin.receipts import RECEIPT_RETENTION_MS
from .receiver.channels import waiting_channels
from .receiver.role import DEDUP_RETENTION_MS

__all__ = ["FAILED_RETENTION_MS", "INBOX_READ_RETENTION_MS", "Housekeeping"]

FAILED_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
INBOX_READ_RETENTION_MS: Final = 24 * 3600 * 1000
_SEND_STATES: Final = {int(s): s for s in SendState}
_SS_FAILED: Final = int(SendState.SS_FAILED)
_DONE: Final = f"{int(SendState.SS_ACK2)}, {_SS_FAILED}"


class Housekeeping:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def clean(self) -> int:
        """Dedup rows past the retention, failed rows past theirs, consumed
        inbox rows after a day, receipts after theirs, inside the caller's
        transaction. Returns rows removed."""
        ts = self.ctx.now()
        conn = self.ctx.conn
        n = conn.execute("DELETE FROM dedup WHERE received_ms < ?", (ts - DEDUP_RETENTION_MS,)).rowcount
        # (A failed ordered document stays until its gap notice is queued.)
        n += conn.execute(f"DELETE FROM outbox WHERE state={_SS_FAILED} AND state_ms < ?"
                          " AND NOT (channel != '' AND gap = 0)", (ts - FAILED_RETENTION_MS,)).rowcount
        # Large documents' files (semq.node.large): a consumed one's with its
        # row; ours once their row is gone (confirmed, or failed and purged);
        # a transfer to us idle longer than the duplicate suppression
        # remembers (its origin gave up long ago).
        gone = [p for (p,) in conn.execute("SELECT path FROM inbox WHERE path IS NOT NULL AND consumed_ms IS NOT NULL"
                                           " AND consumed_ms < ?", (ts - INBOX_READ_RETENTION_MS,))]
        n += conn.execute("DELETE FROM inbox WHERE consumed_ms IS NOT NULL AND consumed_ms < ?",
                          (ts - INBOX_READ_RETENTION_MS,)).rowcount
        done = conn.execute("SELECT id, path FROM large_out WHERE id NOT IN (SELECT id FROM outbox)").fetchall()
        gone += [p for _, p in done]
        conn.executemany("DELETE FROM large_out WHERE id=?", [(i,) for i, _ in done])
        idle = conn.execute("SELECT id, path FROM large_in WHERE updated_ms < ?",
                            (ts - DEDUP_RETENTION_MS,)).fetchall()
        gone += [p for _, p in idle]
        conn.executemany("DELETE FROM large_in WHERE id=?", [(i,) for i, _ in idle])
        n += len(done) + len(idle)
        base = Path(self.ctx.path).parent
        for p in gone:
            (base / p).unlink(missing_ok=True)  # (an absolute path stays itself)
        n += conn.execute(
            "DELETE FROM receipts WHERE received_ms < ? AND (received_ms > 0 OR record_id NOT IN"
            " (SELECT id FROM outbox))", (ts - RECEIPT_RETENTION_MS,)
        ).rowcount
        # A batch's rows share its received_ms: they go together.
        conn.execute("DELETE FROM receipt_batches WHERE received_ms < ?", (ts - RECEIPT_RETENTION_MS,))
        return n

    def state_counts(self) -> dict[str, int]:
        """Pending-send rows per state name (an unknown state by its
        number), the held states counted where they are."""
        on_disk = {(_SEND_STATES[s].name if s in _SEND_STATES else str(s)): n
                   for s, n in self.ctx.conn.execute("SELECT state, count(*) FROM outbox GROUP BY state")}
        return self.ctx.held.state_counts(on_disk)

    def pending_ack_count(self) -> int:
        """Pending-ack rows, those held in memory included."""
        return int(self.ctx.conn.execute("SELECT count(*) FROM inbound").fetchone()[0]) + self.ctx.held.unconfirmed()

    def counts(self) -> dict[str, Any]:
        c = self.ctx.conn
        oldest = c.execute(f"SELECT min(created_ms) FROM outbox WHERE state NOT IN ({_DONE})").fetchone()[0]
        return {
            "outbox": self.state_counts(),
            "pending_ack": self.pending_ack_count(),
            "inbox_unread": c.execute("SELECT count(*) FROM inbox WHERE consumed_ms IS NULL").fetchone()[0],
            "inbox_total": c.execute("SELECT count(*) FROM inbox").fetchone()[0],
            "dedup": c.execute("SELECT count(*) FROM dedup").fetchone()[0],
            "oldest_unconfirmed_ms": oldest,
            # Ordered channels holding documents back (semq.node.receiver.channels).
            "channels_waiting": [{"origin": w.origin, "channel": w.channel, "held": w.held, "waits_for": w.lk0,
                                  "since_ms": w.since_ms, "text": w.describe()}
                                 for w in waiting_channels(c, self.ctx.unit)],
        }
