"""Ordered channels, the receiver's side (SPEC "Ordered channels"; the
chain rules are in semq.node.envelope; the origin's side, its numbering and
gap notices, is semq.node.origin.channels).

``ChannelsIn.place`` decides, inside the batch's transaction, whether a
newly received ordered document goes to the inbox now (it follows the one
handed over last) or is held in ``channel_held``; a document that closes a
gap releases the held ones that follow it, in order. A held document is in
the store, so it is acknowledged like any other.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Final

from ..batch import NodeContext
from ..envelope import Envelope
from .inbox import INBOX_COLUMNS, InboxValues

__all__ = ["MAX_HELD_PER_ORIGIN", "ChannelWait", "ChannelsIn", "waiting_channels"]

_HELD_INSERT: Final = f"INSERT INTO channel_held (prev, pos, {INBOX_COLUMNS}) VALUES ({','.join('?' * 21)})"
_HELD_NEXT: Final = (f"SELECT id, pos, {INBOX_COLUMNS} FROM channel_held WHERE origin_id=? AND channel=? AND prev=?"
                     f" ORDER BY id LIMIT 1")
# Documents of one origin a receiver holds back at most, over all its
# channels: an enrolled organization must not fill the store with
# documents that name predecessors that never come. Past it an ordered
# document that would be held is refused OVER_WINDOW (its origin sends it
# again later, when the gap may have closed).
MAX_HELD_PER_ORIGIN: Final = 100_000


class ChannelsIn:
    """The receiver's ordered channels (``channel_in``: where each is;
    ``channel_held``: the documents held back), one batch at a time (the
    state read in a batch is dropped at its start: a rolled-back batch
    leaves none)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self._state: dict[tuple[str, str], list[int]] = {}  # (origin, channel) -> [last_pos, held]
        self._dirty: set[tuple[str, str]] = set()

    def begin(self) -> None:
        self._state.clear()
        self._dirty.clear()

    def _get(self, k: tuple[str, str]) -> list[int]:
        st = self._state.get(k)
        if st is None:
            r = self.ctx.conn.execute("SELECT last_pos, held FROM channel_in WHERE origin_id=? AND channel=?", k).fetchone()
            last, held = r if r else (0, 0)
            st = self._state[k] = [int(last), int(held)]
        return st

    def would_hold(self, origin_id: str, env: Envelope) -> bool:
        """Whether a new document of ``env``'s channel would be held now."""
        return env.prev != self._get((origin_id, env.channel))[0]

    def held_from(self, origin_id: str) -> int:
        """How many documents of ``origin_id`` are held, over its channels
        (this batch's changes included)."""
        held = {ch: int(n) for ch, n in self.ctx.conn.execute(
            "SELECT channel, held FROM channel_in WHERE origin_id=? AND held > 0", (origin_id,))}
        for (o, ch), (_, n) in self._state.items():
            if o == origin_id:
                held[ch] = n
        return sum(held.values())

    def place(self, origin_id: str, env: Envelope, pos: int, row: InboxValues) -> list[InboxValues]:
        """The inbox rows to write now, in order: ``row`` and the held ones
        it releases, or none (``row`` is held: it does not follow the last
        one handed over). ``pos``: the document's place (its record id; a
        gap notice's is the failed document's)."""
        conn = self.ctx.conn
        k = (origin_id, env.channel)
        st = self._get(k)
        self._dirty.add(k)
        if env.prev != st[0]:
            conn.execute(_HELD_INSERT, (env.prev, pos, *row))
            st[1] += 1
            return []
        out = [row]
        st[0] = pos
        while st[1] > 0:
            r = conn.execute(_HELD_NEXT, (*k, st[0])).fetchone()
            if r is None:
                break
            held_id, next_pos, *values = r
            conn.execute("DELETE FROM channel_held WHERE id=?", (held_id,))
            st[1] -= 1
            st[0] = int(next_pos)
            out.append(tuple(values))
        return out

    def flush(self, ts: int) -> None:
        """Write the channels this batch moved (in its transaction)."""
        if self._dirty:
            self.ctx.conn.executemany(
                "INSERT OR REPLACE INTO channel_in (origin_id, channel, last_pos, held, moved_ms) VALUES (?,?,?,?,?)",
                [(*k, *self._state[k], ts) for k in self._dirty])
            self._dirty.clear()

    def waiting(self) -> list[ChannelWait]:
        """The channels of this store that hold documents back."""
        return waiting_channels(self.ctx.conn, self.ctx.unit)

    def held_channel(self, origin_id: str, semq_id: int, semq_db_id: int, record_id: int) -> str | None:
        """The ordered channel that holds the document with this LK0 back,
        or None: it is not held here."""
        row = self.ctx.conn.execute(
            "SELECT channel FROM channel_held WHERE origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=?",
            (origin_id, semq_id, semq_db_id, record_id)).fetchone()
        return None if row is None else str(row[0])

    def held_by_origin(self) -> dict[str, int]:
        """How many documents each organization's ordered channels hold back."""
        return {str(o): int(n) for o, n in self.ctx.conn.execute(
            "SELECT origin_id, sum(held) FROM channel_in WHERE held > 0 GROUP BY origin_id")}


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelWait:
    """An ordered channel that holds documents back."""

    origin: str
    channel: str
    held: int
    last: int  # the record id handed over last (0: none yet)
    waits_for: int  # the record id the earliest held document follows
    since_ms: int  # when the channel last moved
    unit: int = 1

    @property
    def lk0(self) -> str:
        return f"{self.origin}/1/1/{self.waits_for}"

    def describe(self) -> str:
        return (f"channel {self.channel} from {self.origin} waits for LK0 {self.lk0}"
                f" ({self.held} document{'s' if self.held != 1 else ''} held)")



def waiting_channels(conn: sqlite3.Connection, unit: int = 1) -> list[ChannelWait]:
    """The channels of this store that hold documents back, and what each
    waits for: the document the earliest held one follows."""
    out = []
    for origin, channel, last, held, moved in conn.execute(
            "SELECT origin_id, channel, last_pos, held, moved_ms FROM channel_in WHERE held > 0"
            " ORDER BY origin_id, channel").fetchall():
        r = conn.execute(
            "SELECT min(prev) FROM channel_held h WHERE origin_id=? AND channel=? AND NOT EXISTS"
            " (SELECT 1 FROM channel_held p WHERE p.origin_id=h.origin_id AND p.channel=h.channel AND p.pos=h.prev)",
            (origin, channel)).fetchone()
        out.append(ChannelWait(origin=origin, channel=channel, held=int(held), last=int(last),
                               waits_for=int(r[0] or 0), since_ms=int(moved), unit=unit))
    return out
