"""The receiver's side of large documents (semq.node.large).

A manifest that opened and verified like any document starts a transfer: a
``large_in`` row and a file in ``large/in/`` of the store's directory; the
origin is told with CHUNK_ACK(through=0) and sends the chunks. Each chunk
that opens (AES-GCM under the manifest's key, its index and the manifest
bound) is written at its place; the chunks below ``through`` are on disk,
synced, and ``through`` committed in the batch's transaction, before the
CHUNK_ACK that says so leaves (durable before acknowledged). The content
is hashed as it comes, in order; after a restart the committed prefix is
hashed again once.

When the last chunk is in and the content's SHA-256 is the manifest's, the
document is delivered exactly as a one-frame document is (dedup row, inbox
row naming the file, ACK2 with a receipt over the manifest, which the origin
signed) in the same transaction. A content that does not match, or a
transfer that keeps getting chunks that do not open, is refused with a
signed NACK, like any refused document.

A chunk out of order is not written. After a gap (one lost on a cut
connection or in a restart) the origin is told to go on from what we have
with a CHUNK_ACK whose code is RESUME (semq.node.large.outgoing rewinds to it);
a copy of one we have (a probe, a resend) is answered with an ordinary
CHUNK_ACK saying where we are.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol

from semq.identity.crypto import ensure_private_directory
from semq.settings.bounds import DEFERRED_CHUNK_BYTES
from semq.store.db import StoreFileError
from semq.umxt_protocol import (
    LK0,
    AckEntry,
    AckFlag,
    AppKey,
    Chunk,
    ChunkAck,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    NodeType,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
)

from ..batch import Batch, NodeContext
from ..envelope import NO_ENVELOPE, Envelope, encode_envelope, split_envelope
from ..rows import columns
from .manifest import ChunkError, ChunkOpener, Manifest, hash_prefix
from .outgoing import WINDOW_BYTES

__all__ = ["ACK_EVERY_BYTES", "ALL_CHUNKS", "MAX_BAD_CHUNKS", "RESUME", "Delivery", "LargeIn"]

# Chunks are synced and acknowledged every this many bytes (and at the end):
# a quarter of the origin's window (large_out.WINDOW_BYTES), so it never waits.
ACK_EVERY_BYTES: Final = 4 << 20
# Chunks that do not open, per transfer, before the document is refused: a
# relay that alters one is answered by the origin sending it again; one that
# alters every copy gets the document refused rather than resent for ever.
MAX_BAD_CHUNKS: Final = 16
# The CHUNK_ACK code that asks the origin to send again from ``through``.
RESUME: Final = ResultCode.UNEXPECTED_FRAME
# A gap at the same place is answered with RESUME again (the origin's copy
# after its rewind was lost too) only once more chunks came past it than the
# origin had in flight when it rewound — its window, or what is left of the
# document after the gap if that is less (those were sent before the RESUME
# reached it, and on a slow link they take long to drain: a timer alone
# would rewind the origin again and again while they do) — and no sooner
# than this long after the last RESUME.
RESUME_AGAIN_MS: Final = 2000
ALL_CHUNKS: Final = 0xFFFF_FFFF  # CHUNK_ACK through: "delivered already, stop"
# Bytes of chunks kept in memory while their origin's certificate is asked
# for (the manifest waits for it too).
MAX_DEFERRED_BYTES: Final = DEFERRED_CHUNK_BYTES
# A refused transfer is remembered this long: its manifest sent again before
# the origin heard the refusal (an inquiry crossing the NACK) is refused
# again, rather than starting a transfer its origin will never feed.
REFUSED_HOLD_MS: Final = 60_000
_REFUSED_KEPT: Final = 1024  # refusals remembered at most (the oldest go first)
_OPEN_FILES: Final = 64  # transfers kept open (file, hasher) at once; others reopen when a chunk comes


class Delivery(Protocol):
    """What the receiver does for a large document (semq.node.receiver.role.Receiver,
    passed in: this package sits below the roles)."""

    def refuse(self, b: Batch, frame: Frame, d: Data, code: ResultCode, detail: str) -> None:
        """Refuse the document (a signed NACK to its origin)."""
        ...

    def deliver_large(self, b: Batch, frame: Frame, d: Data, digest: bytes | None, signer: str, ak: AppKey,
                      env: Envelope, size: int, key: tuple[int, str, int, int, int], path: str) -> None:
        """Deliver the whole document, its content in ``path`` (relative to
        the store's directory), as a one-frame document is delivered."""
        ...

    def delivered(self, key: tuple[int, str, int, int, int]) -> bool:
        """Whether the document with that LK0 was received already."""
        ...


@dataclass
class _Transfer:
    row_id: int
    key: tuple[int, str, int, int, int]
    lk0: LK0
    manifest: Manifest
    path: Path
    through: int  # committed
    bad: int
    opener: ChunkOpener
    fd: int = -1
    hasher: hashlib._Hash | None = None
    written: int = 0  # chunks written (>= through; synced and committed at the batch's end)
    acked: int = -1  # the ``through`` last told to the origin
    resume: bool = False  # tell the origin to go on from ``written`` (one was lost)
    answer: bool = False  # tell the origin where we are (it sent one we have)
    resumed_at: int = -1  # the ``written`` of the last RESUME, and when (ms)
    resumed_ms: int = 0
    past_gap: int = 0  # chunks that came past the gap since the last RESUME
    refused: bool = False


class _Progress(NamedTuple):
    """What taking a transfer up again reads of its ``large_in`` row."""

    id: int
    path: str
    manifest: bytes
    through: int
    bad: int


class _Kept(NamedTuple):
    """What delivering a whole document reads of its ``large_in`` row."""

    frame: bytes
    digest: bytes | None
    signer: str
    domain: str
    data_type: str
    subtype: str
    key: str
    envelope: bytes | None


_PROGRESS: Final = columns(_Progress)
_KEPT: Final = columns(_Kept)


class LargeIn:
    """Transfers of large documents to this node, for the Receiver."""

    def __init__(self, ctx: NodeContext, receiver: Delivery, max_size: int) -> None:
        self.ctx = ctx
        self.receiver = receiver
        self.max_size = max_size
        self.base = Path(ctx.path).parent  # rows name files relative to it (a restore may move it)
        self.dir = self.base / "large" / "in"
        self._open: dict[tuple[int, str, int, int, int], _Transfer] = {}
        self._deferred: dict[Endpoint, int] = {}  # bytes of chunks waiting with their origin's certificate
        self._touched: dict[int, _Transfer] = {}
        self._refused: dict[tuple[int, str, int, int, int], tuple[int, ResultCode, str]] = {}

    # ------------------------------------------------------------ a manifest

    def manifest(self, b: Batch, frame: Frame, d: Data, doc: bytes, digest: bytes | None, signer: str,
                 ak: AppKey, env: Envelope) -> None:
        """A verified manifest of a document not delivered yet: start its
        transfer (or, for one already going, tell the origin where it is)."""
        lk0 = d.lk0
        key = (int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        self._deferred.pop(lk0.endpoint, None)
        t = self._load(key)
        refused = self._refused.get(key) if t is None else None
        if refused is not None and b.ts - refused[0] < REFUSED_HOLD_MS:
            self.receiver.refuse(b, frame, d, refused[1], f"large document: {refused[2]}")
            return
        if t is None:
            try:
                m = Manifest.decode(doc)
            except ChunkError as e:
                self.receiver.refuse(b, frame, d, e.code, f"large document manifest: {e}")
                return
            if m.size > self.max_size:
                self.receiver.refuse(b, frame, d, ResultCode.TOO_LARGE,
                                      f"large document of {m.size} bytes exceeds this node's limit of"
                                      f" {self.max_size} bytes (max_document_mib)")
                return
            if env.channel:
                self.receiver.refuse(b, frame, d, ResultCode.INVALID_FIELD,
                                      f"ordered channel {env.channel}: a large document cannot be ordered")
                return
            if d.expires_ms is not None and d.expires_ms <= b.ts:
                self.receiver.refuse(b, frame, d, ResultCode.EXPIRED, f"the document expired at {d.expires_ms}")
                return
            ensure_private_directory(self.dir)  # large/ and large/in/, each 0700
            path = self.dir / f"{key[1]}_{key[2]}_{key[3]}_{key[4]}.doc"
            # The frame is kept to deliver the document as it came, once whole;
            # a stored copy's LK1 is settled now (the ACK below), not then.
            kept = encode_frame(replace(frame, body=replace(d, lk1=None)))
            cur = self.ctx.conn.execute(
                "INSERT INTO large_in (origin_type, origin_id, semq_id, semq_db_id, record_id, path, manifest,"
                " frame, digest, signer, domain, data_type, subtype, key, envelope, started_ms, updated_ms)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (*key, path.relative_to(self.base).as_posix(), m.encode(), kept, digest, signer, ak.domain,
                 ak.data_type, ak.subtype, ak.key, None if env is NO_ENVELOPE else encode_envelope(env), b.ts, b.ts))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            t = _Transfer(row_id=int(cur.lastrowid or 0), key=key, lk0=lk0, manifest=m, path=path, through=0,
                          bad=0, opener=ChunkOpener(lk0, m), fd=fd, written=0)
            t.hasher = hashlib.sha256()
            self._keep(t)
            b.events.append({"ts": b.ts, "role": "receiver", "event": "large_started", "lk0": str(lk0),
                             "source": lk0.endpoint.node_id, "target": self.ctx.me.node_id, "size": m.size,
                             "chunks": m.chunks})
        # Where we are: the first time "send from 0"; a manifest sent again
        # (its origin asks about its ACK2, or started again) is told how far
        # we are, which the chunks it sends since are not to undo.
        t.answer = True
        self._touched[t.row_id] = t
        if d.lk1 is not None:  # a stored copy: the platform may let it go, the row has it
            b.acks[(Kind.ACK, frame.source)].append(AckEntry(
                self.ctx.unit, 1, 0, d.lk1.semq_id, d.lk1.semq_db_id, d.lk1.record_id, int(AckFlag.PLATFORM), 0))

    # ------------------------------------------------------------ chunks

    def chunk(self, b: Batch, raw: RawFrame) -> None:
        frame = raw.frame()
        c = frame.body
        assert isinstance(c, Chunk)
        lk0 = c.lk0
        key = (int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        t = self._load(key)
        if t is None:
            origin = lk0.endpoint
            sec = self.ctx.sec
            if sec is not None and not self.receiver.delivered(key) and not sec.certs(origin):
                # Its manifest waits for the origin's certificate (first
                # contact): the chunks wait with it, up to a bound; past it
                # they are dropped and the origin sends them again when told.
                size = len(raw.raw)
                if self._deferred.get(origin, 0) + size <= MAX_DEFERRED_BYTES:
                    self._deferred[origin] = self._deferred.get(origin, 0) + size
                    b.out.deferred.append(raw)
                    b.out.missing.add(origin)
                return
            if key in b.known or self.receiver.delivered(key):
                # Whole and delivered: the origin may stop (its ACK2 follows
                # through the usual inquiries if it was lost).
                b.out.add(Frame(kind=Kind.CHUNK_ACK, source=self.ctx.me, target=lk0.endpoint,
                                body=ChunkAck(lk0=lk0, through=ALL_CHUNKS)))
            # Otherwise its manifest has not come (yet): the origin sends
            # again once it hears from us.
            return
        if t.refused:
            return
        self._touched[t.row_id] = t
        if c.index < t.written:
            t.answer = True  # a copy again (a probe, or a rewind's): say where we are
            return
        if c.index > t.written:
            # One before it was lost: go on from what we have. Said once per
            # gap (the chunks that were in flight behind the lost one come
            # too, and the origin must not go back once for each).
            t.past_gap += 1
            in_flight = min(WINDOW_BYTES // t.manifest.chunk_size, t.manifest.chunks - t.written - 1)
            if t.resumed_at != t.written or (t.past_gap > in_flight and b.ts - t.resumed_ms > RESUME_AGAIN_MS):
                self._resume(t, b.ts)
            return
        try:
            content = t.opener.open(c.index, c.flags, c.payload)
        except ChunkError as e:
            t.bad += 1
            self._resume(t, b.ts)
            b.events.append({"ts": b.ts, "role": "receiver", "event": "bad_chunk", "lk0": str(lk0),
                             "source": lk0.endpoint.node_id, "target": self.ctx.me.node_id,
                             "index": c.index, "code": int(e.code), "detail": str(e)[:200]})
            b.out.errors.append((e.code, f"large document {lk0}: {e}"))
            if t.bad >= MAX_BAD_CHUNKS:
                self._refuse(b, t, e.code, f"{t.bad} chunks did not open; the last: {e}")
            return
        self._ensure_open(t)
        view = memoryview(content)
        pos = c.index * t.manifest.chunk_size
        while view:
            n = os.pwrite(t.fd, view, pos)
            view = view[n:]
            pos += n
        assert t.hasher is not None
        t.hasher.update(content)
        t.written += 1

    @staticmethod
    def _resume(t: _Transfer, ts: int) -> None:
        t.resume = True
        t.resumed_at = t.written
        t.resumed_ms = ts
        t.past_gap = 0

    # ------------------------------------------------------------ the batch's end

    def finish(self, b: Batch) -> None:
        """Inside the batch's transaction, before its commit: sync and
        record the progress of the transfers this batch touched, queue
        their CHUNK_ACKs (sent after the commit), deliver the whole ones."""
        if not self._touched:
            return
        touched, self._touched = self._touched, {}
        for t in touched.values():
            if t.refused:
                continue
            m = t.manifest
            m_every = max(1, ACK_EVERY_BYTES // m.chunk_size)
            done = t.written == m.chunks
            progress = t.written - t.through
            if progress and (done or progress >= m_every or t.resume):
                os.fdatasync(t.fd)
                t.through = t.written
                self.ctx.conn.execute("UPDATE large_in SET through=?, bad=?, updated_ms=? WHERE id=?",
                                      (t.through, t.bad, b.ts, t.row_id))
            if done:
                self._complete(b, t)
                b.out.add(Frame(kind=Kind.CHUNK_ACK, source=self.ctx.me, target=t.lk0.endpoint,
                                body=ChunkAck(lk0=t.lk0, through=m.chunks)))
                continue
            if t.through != t.acked or t.resume or t.answer:
                b.out.add(Frame(kind=Kind.CHUNK_ACK, source=self.ctx.me, target=t.lk0.endpoint,
                                body=ChunkAck(lk0=t.lk0, through=t.through,
                                              code=RESUME if t.resume else ResultCode.OK)))
                t.acked = t.through
                t.resume = t.answer = False

    def _complete(self, b: Batch, t: _Transfer) -> None:
        m = t.manifest
        assert t.hasher is not None
        r = _Kept._make(self.ctx.conn.execute(f"SELECT {_KEPT} FROM large_in WHERE id=?", (t.row_id,)).fetchone())
        frame, d = _frame_of(r.frame)
        if d.expires_ms is not None and d.expires_ms <= b.ts:
            self._refuse(b, t, ResultCode.EXPIRED, f"the document expired at {d.expires_ms}, before it was whole")
            return
        if t.hasher.digest() != m.sha256:
            self._refuse(b, t, ResultCode.DIGEST_MISMATCH,
                         f"the content's SHA-256 {t.hasher.hexdigest()} is not the manifest's {m.sha256.hex()}")
            return
        ak = AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key)
        env = NO_ENVELOPE if r.envelope is None else split_envelope(r.envelope)[0]
        self._close(t)
        self.ctx.conn.execute("DELETE FROM large_in WHERE id=?", (t.row_id,))
        self.receiver.deliver_large(b, frame, d, r.digest, r.signer, ak, env, m.size, t.key,
                                    t.path.relative_to(self.base).as_posix())
        b.events.append({"ts": b.ts, "role": "receiver", "event": "large_complete", "lk0": str(t.lk0),
                         "source": t.lk0.endpoint.node_id, "target": self.ctx.me.node_id, "size": m.size})

    def refuse_transfer(self, b: Batch, lk0: LK0, code: ResultCode, detail: str) -> None:
        """Refuse the transfer of ``lk0``'s document, if one is under way
        (a chunk of it could not be handled: NodeCore._quarantine)."""
        t = self._load((int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id,
                        lk0.record_id))
        if t is not None and not t.refused:
            self._refuse(b, t, code, detail)

    def _refuse(self, b: Batch, t: _Transfer, code: ResultCode, detail: str) -> None:
        """The whole document refused: its row and file go, its origin gets
        a signed NACK (Receiver._refuse) and fails the document."""
        kept = [f for (f,) in self.ctx.conn.execute("SELECT frame FROM large_in WHERE id=?", (t.row_id,))]
        t.refused = True
        self._refused.pop(t.key, None)
        self._refused[t.key] = (b.ts, code, detail)
        while len(self._refused) > _REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        self._close(t)
        t.path.unlink(missing_ok=True)
        self.ctx.conn.execute("DELETE FROM large_in WHERE id=?", (t.row_id,))
        for f in kept:
            frame, d = _frame_of(f)
            self.receiver.refuse(b, frame, d, code, f"large document: {detail}")

    # ------------------------------------------------------------ sessions and failures

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Around a batch's transaction (inside it): if it does not commit,
        what this batch wrote is forgotten (``rolled_back``)."""
        try:
            yield
        except OSError as e:
            # Disk full, an I/O error: the store's error, not the network's
            # (the daemon keeps everything and tries again later).
            self.rolled_back()
            full = " (disk full)" if e.errno == errno.ENOSPC else ""
            raise StoreFileError(f"large documents in {self.dir}: {e.strerror or e}{full};"
                                 " nothing of this batch was acknowledged") from e
        except BaseException:
            self.rolled_back()
            raise

    def resume_acks(self) -> list[bytes]:
        """At the start of a session: a CHUNK_ACK (RESUME) for every
        transfer under way, so that each origin goes on from what we have."""
        out = []
        for oid_type, oid, s, db, rid, through in self.ctx.conn.execute(
                "SELECT origin_type, origin_id, semq_id, semq_db_id, record_id, through FROM large_in"):
            lk0 = LK0(endpoint=Endpoint(node_type=NodeType(oid_type), node_id=oid), semq_id=s, semq_db_id=db,
                      record_id=rid)
            out.append(encode_frame(Frame(kind=Kind.CHUNK_ACK, source=self.ctx.me, target=lk0.endpoint,
                                          body=ChunkAck(lk0=lk0, through=through, code=RESUME))))
        return out

    def rolled_back(self) -> None:
        """The batch's transaction did not commit: forget what was written
        since (reloaded from the rows when the next chunk comes)."""
        for t in list(self._open.values()):
            self._close(t)
        self._open.clear()
        self._touched.clear()

    def close(self) -> None:
        self.rolled_back()

    def in_progress(self) -> list[dict[str, Any]]:
        """Transfers under way (status)."""
        return [{"lk0": f"{oid}/{s}/{db}/{rid}", "size": Manifest.decode(mb).size, "chunks": Manifest.decode(mb).chunks,
                 "through": through, "started_ms": started}
                for oid, s, db, rid, mb, through, started in self.ctx.conn.execute(
                    "SELECT origin_id, semq_id, semq_db_id, record_id, manifest, through, started_ms FROM large_in")]

    # ------------------------------------------------------------ rows and files

    def _load(self, key: tuple[int, str, int, int, int]) -> _Transfer | None:
        t = self._open.get(key)
        if t is not None:
            return t
        found = self.ctx.conn.execute(
            f"SELECT {_PROGRESS} FROM large_in WHERE origin_type=? AND origin_id=? AND"
            " semq_id=? AND semq_db_id=? AND record_id=?", key).fetchone()
        if found is None:
            return None
        row = _Progress._make(found)
        lk0 = LK0(endpoint=Endpoint(node_type=NodeType(key[0]), node_id=key[1]), semq_id=key[2],
                  semq_db_id=key[3], record_id=key[4])
        m = Manifest.decode(row.manifest)
        t = _Transfer(row_id=row.id, key=key, lk0=lk0, manifest=m, path=self.base / row.path, through=row.through,
                      bad=row.bad, opener=ChunkOpener(lk0, m), written=row.through, acked=-1)
        self._keep(t)
        return t

    def _ensure_open(self, t: _Transfer) -> None:
        if t.fd >= 0 and t.hasher is not None:
            return
        if t.fd < 0:
            t.fd = os.open(t.path, os.O_RDWR | os.O_CREAT, 0o600)
        # A transfer taken up again (a restart): hash what is committed once.
        t.hasher = hash_prefix(t.fd, t.through * t.manifest.chunk_size)
        t.written = t.through

    def _keep(self, t: _Transfer) -> None:
        if len(self._open) >= _OPEN_FILES:
            oldest = next(iter(self._open.values()))
            if oldest.row_id not in self._touched:
                self._close(oldest)
        self._open[t.key] = t

    def _close(self, t: _Transfer) -> None:
        if t.fd >= 0:
            os.close(t.fd)
            t.fd = -1
        t.hasher = None
        self._open.pop(t.key, None)

    def clean(self, before_ms: int) -> tuple[int, list[str]]:
        """Transfers idle since before ``before_ms`` (their origin gave up
        long ago), forgotten: rows removed, and their files to remove."""
        idle = self.ctx.conn.execute("SELECT id, path FROM large_in WHERE updated_ms < ?", (before_ms,)).fetchall()
        self.ctx.conn.executemany("DELETE FROM large_in WHERE id=?", [(i,) for i, _ in idle])
        return len(idle), [p for _, p in idle]


def _frame_of(kept: bytes) -> tuple[Frame, Data]:
    dec = FrameDecoder()
    dec.receive_data(kept)
    raws = list(dec)
    if len(raws) != 1:
        raise RemoteProtocolError("a kept manifest frame does not decode", ResultCode.STORE_ERROR)
    frame = raws[0].frame()
    d = frame.body
    assert isinstance(d, Data)
    return frame, d
