"""The daemon's sender of our large documents' chunks (trio): the half of
semq.node.large.outgoing that runs on the event loop, over the platform
session (docs/large-documents.md).

The receiver drives the chunks: its CHUNK_ACK(through) says every chunk
below ``through`` is written and synced there (the first, through=0,
answers the manifest). ``LargeSender`` keeps at most ``window`` bytes of
each document in flight beyond that, and interleaves the chunks of all
documents under way (by priority, then in turn) with the session's other
frames, a chunk at a time. A CHUNK_ACK with code RESUME
(semq.node.large.incoming) rewinds it to the receiver's ``through``: after
a restart of either node or a cut connection the transfer goes on from what
both sides have, not from zero. With no answer for a while, it sends the
next chunk the receiver lacks alone, as a probe (the receiver answers it
whatever it holds).

What the store thread does for it (the rows of the documents under way,
the CHUNK_ACKs a batch took) is semq.node.large.outgoing; this module only
moves bytes and runs the reads through the daemon's store gate.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio

from semq.umxt_protocol import Chunk, Endpoint, Frame, Kind, encode_frame

from ..large.manifest import ChunkSealer
from ..large.outgoing import WINDOW_BYTES, Outgoing

if TYPE_CHECKING:
    from semq.session.transport import FrameStream
    from semq.store.gate import StoreGate

    from ..core import NodeCore

__all__ = ["STALL_MAX_S", "STALL_S", "TOTAL_WINDOW_BYTES", "LargeSender"]

log = logging.getLogger("semq.node.large")

TOTAL_WINDOW_BYTES: Final = 32 << 20  # bytes in flight of all documents together, on one session
STALL_S: Final = 5.0  # no answer for this long with chunks in flight: probe
STALL_MAX_S: Final = 120.0  # ... doubling up to this


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
                    t.kept = max(t.kept, through)  # the platform keeps every chunk below
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
        docs = await self.gate.run(self.core.large_out.pending)
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
