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
import struct
from collections.abc import Sequence
from typing import Final

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
from semq.store.db import rows_by_id, split_held
from semq.umxt_protocol import (
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_ENVELOPE,
    FLAG_KEY_SEALED,
    FLAG_LARGE,
    FLAG_ORDERED,
    FLAG_RELIABLE,
    LK0,
    AckEntry,
    Endpoint,
    Nack,
    NodeType,
    ResultCode,
)

from ..batch import Events, NodeContext, Output
from ..writebehind import write_digests

__all__ = ["RECEIPT_RETENTION_MS", "Receipts", "document_flags"]

RECEIPT_RETENTION_MS: Final = 400 * 24 * 3600 * 1000  # proofs of delivery: over a year
_LK0_REF: Final = struct.Struct(">HHQ")  # semq_id, semq_db_id, record_id of a batch receipt's entry


def document_flags(reliable: bool, ack2: bool, encrypt: bool, key_sealed: bool, envelope: bool = False,
                   ordered: bool = False, large: bool = False) -> int:
    """The DATA header flags a document is sent with (its AAD binds them)."""
    return ((FLAG_RELIABLE if reliable else 0) | (FLAG_ACK2 if ack2 else 0)
            | (FLAG_ENCRYPT if encrypt else 0) | (FLAG_KEY_SEALED if key_sealed else 0)
            | (FLAG_ENVELOPE if envelope else 0) | (FLAG_ORDERED if ordered else 0)
            | (FLAG_LARGE if large else 0))


# What ``signed_form`` reads of a pending-send row.
_SIGNED_FIELDS: Final = ("id", "target_type", "target_id", "save_fwd", "ack2", "reliable", "priority", "domain",
                         "data_type", "subtype", "key", "created_ms", "expires_ms", "encrypt", "clear_key",
                         "app_data", "envelope", "channel", "large")


class Receipts:
    """The origin's proofs of delivery and refusal."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
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
        # One write per document: a new row for a digest held in memory, the
        # row's receipt columns for one written before (its digest kept).
        ctx.conn.executemany(
            "INSERT INTO receipts (record_id, target_id, digest, receipt, verified, received_ms, batch_id,"
            " batch_index) VALUES (?, ?, ?, x'', ?, ?, ?, ?) ON CONFLICT (record_id) DO UPDATE SET"
            " target_id=excluded.target_id, receipt=x'', verified=excluded.verified,"
            " received_ms=excluded.received_ms, batch_id=excluded.batch_id, batch_index=excluded.batch_index"
            " WHERE receipts.verified <= excluded.verified",  # (an unverified receipt never replaces a proof)
            [(lk.record_id, receiver.node_id, d, verified, ts, batch_id, i) for i, (lk, d) in enumerate(manifest)],
        )
        held = ctx.held.sent
        for rid in ids:  # written: nothing left to write when the SS_SENT leaves memory
            h = held.get(rid)
            if h is not None and h.digest is not None:
                held[rid] = h.written()
        return set(ids) if verified else set()

    def digests_of(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The digests our documents ``ids`` were signed with: held with
        their SS_SENT, else from ``receipts``, else (a crash lost the held
        digest of a row still pending) made again from the row: its salt
        is deterministic, so it is the digest the document was signed with."""
        conn = self.ctx.conn
        hits, rest = split_held(ids, self.ctx.held.sent)
        out: dict[int, bytes] = {}
        for rid, h in hits:
            if h.digest is not None:
                out[rid] = h.digest
            else:
                rest.append(rid)
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
                for row in rows_by_id(conn, f"SELECT {', '.join(_SIGNED_FIELDS)} FROM outbox", missing):
                    fields = dict(zip(_SIGNED_FIELDS, row, strict=True))
                    aad, body = self.signed_form(**fields)
                    out[fields["id"]] = document_digest(aad, body, document_salt(salt_key, aad))
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
        documents, or None when no receipt is held. A receipt of a batch is
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

    def write_digests(self, rows: Sequence[tuple[int, str, bytes]]) -> None:
        write_digests(self.ctx.conn, rows)

