"""Housekeeping of a node's store: bounded tables (SPEC "Cleanup"), each
owner cleaning its own, and the counts ``semq status`` shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from .batch import NodeContext
from .engine import SendState
from .large.outgoing import LargeOut
from .origin.outbox import LIVE_IDS, Outbox, OutboxFilter
from .origin.receipts import Receipts
from .receiver.inbox import Inbox
from .receiver.pending_ack import PendingAcks
from .receiver.role import DEDUP_RETENTION_MS, Receiver

__all__ = ["FAILED_RETENTION_MS", "INBOX_READ_RETENTION_MS", "Housekeeping"]

FAILED_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
INBOX_READ_RETENTION_MS: Final = 24 * 3600 * 1000
_SEND_STATES: Final = {int(s): s for s in SendState}
_CONFIRMED_OR_FAILED: Final = (int(SendState.SS_ACK2), int(SendState.SS_FAILED))


class Housekeeping:
    """Retention over every owner, and the store's counts."""

    def __init__(self, ctx: NodeContext, outbox: Outbox, receipts: Receipts, large_out: LargeOut, inbox: Inbox,
                 pending_acks: PendingAcks, receiver: Receiver) -> None:
        self.ctx = ctx
        self.outbox, self.receipts, self.large_out = outbox, receipts, large_out
        self.inbox, self.pending_acks, self.receiver = inbox, pending_acks, receiver

    def clean(self) -> int:
        """Dedup rows past the retention, failed rows past theirs, consumed
        inbox rows after a day, large documents' files no longer needed,
        receipts after theirs, inside the caller's transaction. Returns
        rows removed."""
        ts = self.ctx.now()
        # (A failed ordered document stays until its gap notice is queued.)
        n = self.outbox.clean_failed(ts - FAILED_RETENTION_MS)
        # Large documents' files (semq.node.large): a consumed one's with its
        # row; ours once their row is gone (confirmed, or failed and purged);
        # a transfer to us idle longer than the duplicate suppression
        # remembers (its origin gave up long ago).
        removed, gone = self.inbox.clean(ts - DEDUP_RETENTION_MS, ts - INBOX_READ_RETENTION_MS)
        n += removed + self.large_out.clean(LIVE_IDS)
        idle, files = self.receiver.large.clean(ts - DEDUP_RETENTION_MS)
        n += idle
        base = Path(self.ctx.path).parent
        for p in [*gone, *files]:
            (base / p).unlink(missing_ok=True)  # (an absolute path stays itself)
        return n + self.receipts.clean(ts, LIVE_IDS)

    def state_counts(self) -> dict[str, int]:
        """Pending-send rows per state name (an unknown state by its
        number), the deferred states counted where they are."""
        return {(_SEND_STATES[s].name if s in _SEND_STATES else str(s)): n
                for s, n in self.outbox.state_counts().items()}

    def counts(self) -> dict[str, Any]:
        return {
            "outbox": self.state_counts(),
            "pending_ack": self.pending_acks.count(),
            "inbox_unread": self.inbox.count(unread=True),
            "inbox_total": self.inbox.count(),
            "dedup": self.inbox.dedup_count(),
            "oldest_unconfirmed_ms": self.outbox.oldest(OutboxFilter(not_states=_CONFIRMED_OR_FAILED)),
            # Ordered channels holding documents back (semq.node.receiver.channels).
            "channels_waiting": [{"origin": w.origin, "channel": w.channel, "held": w.held, "waits_for": w.lk0,
                                  "since_ms": w.since_ms, "text": w.describe()}
                                 for w in self.receiver.channels.waiting()],
        }
