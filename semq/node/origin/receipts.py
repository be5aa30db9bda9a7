"""Proofs: the digests our documents were signed with, the receivers'
signed receipts that confirm them, and the targets' signed refusals
(SPEC "What a receipt proves"; docs/security.md).

An ACK2 confirms a document only with the receiver's receipt over exactly
the digest we signed; a target's NACK fails it only with the target's
signature over (LK0, code). Receipts are kept a year (``RECEIPT_RETENTION_MS``)
so that ``semq messages --receipt`` can show a self-standing proof.
"""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from semq.identity.crypto import (
    CryptoError,
    ack_entry_lk0,
    document_aad_fields,
    document_digest,
    document_salt,
    enclose_app_key,
    receipt_proofs,
    verify_batch_receipt,
    verify_refusal,
)
from semq.store.db import rows_by_id
from semq.umxt_protocol import (
    LK0,
    AckEntry,
    Endpoint,
    Nack,
    NodeType,
    ResultCode,
)

from ..batch import Batch, Events, NodeContext, Output
from .documents import document_flags
from .outbox import Outbox

__all__ = ["RECEIPT_RETENTION_MS", "Receipts", "write_digests"]

RECEIPT_RETENTION_MS: Final = 400 * 24 * 3600 * 1000  # proofs of delivery: over a year
_LK0_REF: Final = struct.Struct(">HHQ")  # semq_id, semq_db_id, record_id of a batch receipt's entry


class _Signed(NamedTuple):
    """What ``signed_form`` reads of a pending-send row."""

    id: int
    target_type: int
    target_id: str
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    domain: str
    data_type: str
    subtype: str
    key: str
    created_ms: int
    expires_ms: int | None
    encrypt: int
    clear_key: int
    app_data: bytes
    envelope: bytes | None
    channel: str
    large: int


def write_digests(conn: sqlite3.Connection, rows: Iterable[tuple[int, str, bytes]]) -> None:
    """The digests (record id, target, digest) our documents were signed
    with, kept apart from the pending-send rows: a receipt may come after an
    inquiry answer has cleaned the row. A copy's digest is its first's
    (deterministic salts), so an existing row stays. (The outbox writes them
    with the row's state that needs them: semq.node.origin.outbox.)"""
    conn.executemany(
        "INSERT OR IGNORE INTO receipts (record_id, target_id, digest, receipt, verified, received_ms)"
        " VALUES (?, ?, ?, x'', 0, 0)", rows)


class Receipts:
    """The origin's proofs of delivery and refusal."""

    def __init__(self, ctx: NodeContext, outbox: Outbox) -> None:
        self.ctx = ctx
        self.outbox = outbox  # the digests deferred with a claimed row's SS_SENT, and the rows themselves
        self._salt_key: bytes | None = None  # read by the first claim with security

    def salt_key(self) -> bytes:
        """The key the salts of our signed documents are made with
        (crypto.document_salt): every copy of a document gets the same salt,
        so the same digest, whichever copy the receiver's receipt is about.
        Made once and kept in the store's ``meta`` table, in a transaction
        of its own: a resend after a restart, or after the signing key
        rolled over, still has its first copy's digest."""
        if self._salt_key is None:
            with self.ctx.db.atomic():
                self.ctx.conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('document_salt_key', ?)",
                                      (os.urandom(32).hex(),))
                row = self.ctx.conn.execute("SELECT value FROM meta WHERE key='document_salt_key'").fetchone()
            self._salt_key = bytes.fromhex(row[0])
        return self._salt_key

    def keep(self, entries: Sequence[AckEntry], receiver: Endpoint, receipt: bytes, ts: int,
             out: Output) -> set[int]:
        """Verify a batch receipt against the digests we signed and keep it
        once for the batch; each document's self-standing proof is derived
        from it on request (``proof``, ``semq messages --receipt``).
        Returns the record ids it proves delivered: all of the batch's, or
        none. A receipt that does not verify (but is one for these
        documents) is kept marked unverified, and proves nothing."""
        ctx = self.ctx
        assert ctx.sec is not None
        ids = [e.dest_ref_id for e in entries]
        if any(e.dest_semq_id != ctx.unit or e.dest_semq_db_id != 1 for e in entries):
            return set()  # not records of this store
        digests = self.digests_of(ids)
        if len(digests) != len(set(ids)):
            return set()  # not documents we signed (or past the receipts' retention)
        manifest = [(ack_entry_lk0(e, ctx.me), digests[e.dest_ref_id]) for e in entries]
        verified = 0
        certs = ctx.sec.certs(receiver)
        if not certs:
            out.missing.add(receiver)  # asked for; the target's next answer verifies
        try:
            verify_batch_receipt(receipt, entries=manifest, receiver_certs=certs)
            verified = 1
        except CryptoError:
            try:  # kept unverified only if it is at least a receipt for these documents
                receipt_proofs(receipt, manifest)
            except (CryptoError, ValueError):
                return set()
        # Once per batch: the signed root and the LK0s in order; each
        # document's row points at it (its proof is derived when asked for).
        cur = ctx.conn.execute(
            "INSERT INTO receipt_batches (receiver, receipt, lk0s, received_ms) VALUES (?,?,?,?)",
            (receiver.node_id, receipt,
             b"".join([_LK0_REF.pack(lk.semq_id, lk.semq_db_id, lk.record_id) for lk, _ in manifest]), ts))
        batch_id = int(cur.lastrowid or 0)
        # One write per document: a new row for a digest deferred in memory, the
        # row's receipt columns for one written before (its digest kept).
        ctx.conn.executemany(
            "INSERT INTO receipts (record_id, target_id, digest, receipt, verified, received_ms, batch_id,"
            " batch_index) VALUES (?, ?, ?, x'', ?, ?, ?, ?) ON CONFLICT (record_id) DO UPDATE SET"
            " target_id=excluded.target_id, receipt=x'', verified=excluded.verified,"
            " received_ms=excluded.received_ms, batch_id=excluded.batch_id, batch_index=excluded.batch_index"
            " WHERE receipts.verified <= excluded.verified",  # (an unverified receipt never replaces a proof)
            [(lk.record_id, receiver.node_id, d, verified, ts, batch_id, i) for i, (lk, d) in enumerate(manifest)],
        )
        self.outbox.digests_written(ids)
        return set(ids) if verified else set()

    def proven(self, b: Batch, entries: Sequence[AckEntry], peer: Endpoint, receipt: bytes) -> Sequence[AckEntry]:
        """The entries of an ACK2 from ``peer`` that its receipt proves (its
        signed receipt for exactly these documents and digests: ``keep``).
        Entries it does not cover change nothing (counted, logged, reported
        once): their rows ask the target again."""
        proven = self.keep(entries, peer, receipt, b.ts, b.out) if receipt else set()
        if len(proven) == len(entries):
            return entries
        bad = [e for e in entries if e.dest_ref_id not in proven]
        b.out.bad_receipts += len(bad)
        me = self.ctx.me.node_id
        b.events.extend({"ts": b.ts, "role": "origin", "event": "bad_receipt",
                         "lk0": f"{me}/{e.dest_semq_id}/{e.dest_semq_db_id}/{e.dest_ref_id}",
                         "source": me, "target": peer.node_id, "code": int(ResultCode.BAD_RECEIPT)}
                        for e in bad[:100])
        b.out.errors.append((ResultCode.BAD_RECEIPT, f"ACK2 from {peer} for {len(bad)} document(s) without a receipt"
                                                     " that verifies: left open"))
        return [e for e in entries if e.dest_ref_id in proven]

    def digests_of(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The digests our documents ``ids`` were signed with: deferred with
        their SS_SENT, else from ``receipts``, else (a crash lost the deferred
        digest of a row still pending) made again from the row: its salt
        is deterministic, so it is the digest the document was signed with."""
        conn = self.ctx.conn
        out, rest = self.outbox.deferred_digests(ids)
        if rest:
            out.update(rows_by_id(conn, "SELECT record_id, digest FROM receipts", rest, key="record_id"))
        missing = [rid for rid in rest if rid not in out]
        if missing:
            # The store's salt key as it is (never made here: without one,
            # no document of ours was signed with a deterministic salt).
            salt_key = self._salt_key
            if salt_key is None:
                row = conn.execute("SELECT value FROM meta WHERE key='document_salt_key'").fetchone()
                salt_key = bytes.fromhex(row[0]) if row else None
            if salt_key is not None:
                for rid, row in self.outbox.by_ids(_Signed, missing).items():
                    aad, body = self.signed_form(**row._asdict())
                    out[rid] = document_digest(aad, body, document_salt(salt_key, aad))
        return out

    def signed_form(self, *, id: int, target_type: int, target_id: str, save_fwd: int, ack2: int,
                    reliable: int, priority: int, domain: str, data_type: str, subtype: str, key: str,
                    created_ms: int, expires_ms: int | None, encrypt: int, clear_key: int,
                    app_data: bytes, envelope: bytes | None = None, channel: str = "",
                    large: int = 0) -> tuple[bytes, bytes]:
        """(AAD, signed body) of one of our documents, from its pending-send
        row, as the claim made them when it was sent (with security, an
        ``encrypt`` row is sent sealed, its AppKey inside unless
        ``clear_key``): with the salt, its digest."""
        me = self.ctx.me
        sealed = bool(encrypt) and not clear_key
        flags = document_flags(bool(reliable), bool(ack2), bool(encrypt), sealed, envelope is not None,
                               bool(channel), bool(large))
        if envelope is not None:
            app_data = envelope + app_data
        target = Endpoint(node_type=NodeType(target_type), node_id=target_id)
        if sealed:
            aad = document_aad_fields(me, self.ctx.unit, 1, id, me, target, "", "", "", "", save_fwd, flags, priority,
                                      created_ms, expires_ms)
            return aad, enclose_app_key(domain, data_type, subtype, key, app_data)
        return document_aad_fields(me, self.ctx.unit, 1, id, me, target, domain, data_type, subtype, key, save_fwd,
                                   flags, priority, created_ms, expires_ms), app_data

    def proof(self, record_id: int) -> tuple[str, bytes, bytes, int] | None:
        """(receiver, digest, self-standing receipt, received_ms) of one of our
        documents, or None when no receipt is kept. A receipt of a batch is
        turned into the document's own proof (form 3) here."""
        conn = self.ctx.conn
        row = conn.execute(
            "SELECT target_id, digest, receipt, received_ms, batch_id, batch_index FROM receipts"
            " WHERE record_id=? AND (receipt != x'' OR batch_id IS NOT NULL)", (record_id,)).fetchone()
        if row is None:
            return None
        target, digest, receipt, received_ms, batch_id, index = row
        if receipt:
            return target, digest, receipt, received_ms
        b = conn.execute("SELECT receipt, lk0s FROM receipt_batches WHERE id=?", (batch_id,)).fetchone()
        if b is None:
            return None
        signed_root, lk0s = b
        refs = [_LK0_REF.unpack_from(lk0s, i) for i in range(0, len(lk0s), _LK0_REF.size)]
        ids = [rid for _, _, rid in refs]
        digests: dict[int, bytes] = dict(rows_by_id(conn, "SELECT record_id, digest FROM receipts", ids,
                                                    key="record_id"))
        if len(digests) != len(set(ids)):
            return None  # a document of the batch is past retention: the proof cannot be rebuilt
        entries = [(LK0(endpoint=self.ctx.me, semq_id=s, semq_db_id=d, record_id=r), digests[r]) for s, d, r in refs]
        return target, digest, receipt_proofs(signed_root, entries)[index], received_ms

    def refusal_verifies(self, target: Endpoint, nack: Nack, ts: int, out: Output, events: Events) -> bool:
        """Whether a target's NACK carries its signed refusal of the document
        with that code (security on). One that does not changes nothing:
        logged, counted, the row stays open and is asked about again."""
        sec = self.ctx.sec
        assert sec is not None
        certs = sec.certs(target)
        try:
            if not certs:
                raise CryptoError(f"no certificate of {target} to check it with yet")
            verify_refusal(nack.proof, lk0=nack.lk0, code=nack.code, receiver_certs=certs)
            return True
        except CryptoError as e:
            if not certs:
                out.missing.add(target)
            out.bad_refusals += 1
            events.append({"ts": ts, "role": "origin", "event": "bad_refusal", "lk0": str(nack.lk0),
                           "source": self.ctx.me.node_id, "target": target.node_id, "code": int(nack.code),
                           "detail": str(e)[:200]})
            out.errors.append((ResultCode.BAD_SIGNATURE, f"refusal of {nack.lk0} from {target} ignored: {e}"))
            return False

    def keep_refusal(self, record_id: int, target: Endpoint, nack: Nack, ts: int) -> None:
        self.ctx.conn.execute("INSERT OR REPLACE INTO refusals (record_id, target_id, code, proof,"
                              " received_ms) VALUES (?,?,?,?,?)",
                              (record_id, target.node_id, int(nack.code), nack.proof, ts))

    def refusers(self, ids: Sequence[int]) -> dict[int, str]:
        """Who refused which of our documents ``ids`` (a target's signed refusal)."""
        return dict(rows_by_id(self.ctx.conn, "SELECT record_id, target_id FROM refusals", ids, key="record_id"))

    def verified(self, record_id: int) -> tuple[bool, int] | None:
        """(verified, received_ms) of the receipt row of one of our
        documents (None: none yet)."""
        for verified, received_ms in self.ctx.conn.execute(
                "SELECT verified, received_ms FROM receipts WHERE record_id=?", (record_id,)):
            return bool(verified), int(received_ms)
        return None

    def recently_for(self, org: str, newest: int) -> bool:
        """Whether one of the ``newest`` receipt rows is of a document for ``org``."""
        return self.ctx.conn.execute("SELECT 1 FROM (SELECT target_id AS o FROM receipts ORDER BY record_id DESC"
                                     " LIMIT ?) WHERE o=? LIMIT 1", (newest, org)).fetchone() is not None

    def clean(self, ts: int, live_ids_sql: str) -> int:
        """Receipts past their retention (digests without a receipt only once
        their row is gone: ``live_ids_sql``, the outbox's), and the batches
        whose documents went with them. Returns rows removed."""
        n = int(self.ctx.conn.execute(
            "DELETE FROM receipts WHERE received_ms < ? AND (received_ms > 0 OR record_id NOT IN"
            f" ({live_ids_sql}))", (ts - RECEIPT_RETENTION_MS,)).rowcount)
        # A batch's rows share its received_ms: they go together.
        self.ctx.conn.execute("DELETE FROM receipt_batches WHERE received_ms < ?", (ts - RECEIPT_RETENTION_MS,))
        return n

