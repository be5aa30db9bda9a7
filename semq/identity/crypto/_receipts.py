"""Signed delivery receipts: the receiver's Ed25519 signature over a document's
digest and LK0, carried by ACK2 (``Ack.receipt``); the origin keeps it as
proof of delivery (like an AS2 MDN). A batch receipt signs the Merkle root of
many (LK0, digest) pairs once, for ``AckBatch.receipt``; the origin turns it
into one individually provable receipt per document (``receipt_proofs``).

Layout (docs/security.md "Receipts"), big-endian::

    "SQR1"          4   magic
    form            1   1 single, 2 batch (root only), 3 batch proof (one document)
    signer key id   16  SHA-256(receiver's Ed25519 public key)[:16]
    time_ms         8   u64, receiver's clock when it signed
    signature       64
    -- form 1:  LK0 | digest 32
    -- form 2:  n u32 | root 32
    -- form 3:  n u32 | root 32 | LK0 | digest 32 | index u32 | m u8 | path 32*m

    LK0 = node_type u8, id_len u8, id, semq_id u16, semq_db_id u16, record_id u64

Form 1 signs ``"SEMQ-RECEIPT-v1" 0x00 || key id || time_ms || LK0 || digest``.
Forms 2 and 3 sign ``"SEMQ-RECEIPT-BATCH-v1" 0x00 || key id || time_ms || n ||
root``, the root of the Merkle tree with leaves ``LK0 || digest`` in the
order of the AckBatch entries. A form-3 receipt is a form-2 receipt plus
one leaf and its path: it verifies on its own, years later, with the
receiver's certificate.

A **refusal** is the opposite statement, carried by the NACK a target sends
when a document does not reach its inbox (expired, stale, does not open or
verify): the target's signature over the LK0 and the result code, so that
neither the relay nor anyone else can make an origin believe its document
was refused, nor hide which code the target gave::

    "SQF1"          4   magic
    signer key id   16
    time_ms         8   u64
    signature       64  over "SEMQ-REFUSAL-v1" 0x00 || key id || time_ms || code u16 || LK0
    code            2   u16, the ResultCode
    LK0
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from semq.umxt_protocol import LK0, MAX_ACK_BATCH, AckEntry, Endpoint, ResultCode, lk0_from_wire

from ._errors import BadSignature, UnknownCertificate
from ._merkle import HASH_SIZE, MerkleTree, leaf_hash, root_from_path
from ._pki import KEY_ID_SIZE, NodeCertificate, key_id
from ._wire import U16, U32, U64, Reader, WireError, encode_lk0

__all__ = [
    "MAX_RECEIPT",
    "MAX_RECEIPT_BATCH",
    "RECEIPT_MAGIC",
    "REFUSAL_MAGIC",
    "ReceiptForm",
    "ReceiptInfo",
    "RefusalInfo",
    "ack_entry_lk0",
    "make_batch_receipt",
    "make_receipt",
    "make_refusal",
    "receipt_proofs",
    "verify_batch_receipt",
    "verify_receipt",
    "verify_refusal",
]

RECEIPT_MAGIC: Final = b"SQR1"
MAX_RECEIPT: Final = 4096  # Ack.receipt / AckBatch.receipt limit (umxt_protocol)
MAX_RECEIPT_BATCH: Final = MAX_ACK_BATCH  # entries under one batch receipt
_SIG_ONE: Final = b"SEMQ-RECEIPT-v1\x00"
_SIG_BATCH: Final = b"SEMQ-RECEIPT-BATCH-v1\x00"
REFUSAL_MAGIC: Final = b"SQF1"
_SIG_REFUSAL: Final = b"SEMQ-REFUSAL-v1\x00"
_DIGEST_SIZE: Final = 32
_SIGNATURE_SIZE: Final = 64


class ReceiptForm(IntEnum):
    """Receipt forms (the byte after the magic)."""

    SINGLE = 1  # one document, on ACK2
    BATCH = 2  # root over many documents, on ACK_BATCH of ACK2s
    BATCH_PROOF = 3  # one document's share of a batch receipt, kept by the origin


@dataclass(frozen=True, slots=True)
class ReceiptInfo:
    """A receipt that verified: who signed (``signer``, its ``org``), when
    they say they signed (``time_ms``), and what it covers."""

    form: ReceiptForm
    signer: NodeCertificate
    time_ms: int
    batch_size: int
    lk0: LK0 | None  # None for a BATCH receipt (it covers ``batch_size`` documents)
    digest: bytes | None

    @property
    def org(self) -> str:
        return self.signer.org


def ack_entry_lk0(entry: AckEntry, origin: Endpoint) -> LK0:
    """The LK0 of the document an ACK2 entry of an AckBatch confirms, as the
    origin ``origin`` (who receives the batch) names it: its own endpoint and
    the entry's dest_semq_id / dest_semq_db_id / dest_ref_id. The manifest of
    a batch receipt is ``[(ack_entry_lk0(e, me), stored digest) for e in
    batch.entries]``."""
    # The codec's constructor for values read off the wire (unsigned by
    # layout; zero is refused through LK0's own validation).
    return lk0_from_wire(origin, entry.dest_semq_id, entry.dest_semq_db_id, entry.dest_ref_id)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_digest(digest: bytes) -> bytes:
    if not isinstance(digest, bytes | bytearray) or len(digest) != _DIGEST_SIZE:
        raise ValueError(f"document digest must be {_DIGEST_SIZE} bytes")
    return bytes(digest)


def _head(form: ReceiptForm, kid: bytes, time_ms: int) -> bytes:
    return RECEIPT_MAGIC + bytes((form,)) + kid + U64.pack(time_ms)


def make_receipt(document_digest: bytes, lk0: LK0,
                 receiver_signing_key: ed25519.Ed25519PrivateKey, *,
                 time_ms: int | None = None) -> bytes:
    """The receiver's signed receipt for one document (form 1, at most 203
    bytes with the longest node id: fits Ack.receipt). ``document_digest`` is VerifiedDocument.digest."""
    t = _now_ms() if time_ms is None else time_ms
    kid = key_id(receiver_signing_key.public_key())
    payload = encode_lk0(lk0) + _check_digest(document_digest)
    sig = receiver_signing_key.sign(_SIG_ONE + kid + U64.pack(t) + payload)
    return _head(ReceiptForm.SINGLE, kid, t) + sig + payload


def _leaves(entries: Sequence[tuple[LK0, bytes]]) -> list[bytes]:
    sha256 = hashlib.sha256
    out = []
    for lk0, d in entries:
        if type(d) is not bytes or len(d) != _DIGEST_SIZE:
            d = _check_digest(d)
        out.append(sha256(b"\x00" + encode_lk0(lk0) + d).digest())  # leaf_hash
    return out


# The tree of the last batch whose receipt was checked: the origin calls
# verify_batch_receipt and then receipt_proofs with the same entries, which
# would build the same tree twice. Keyed on the exact bytes of all leaves
# (the tree is a function of them).
_last_tree: tuple[bytes, MerkleTree] | None = None


def _tree(entries: Sequence[tuple[LK0, bytes]]) -> MerkleTree:
    global _last_tree
    leaves = _leaves(entries)
    joined = b"".join(leaves)
    last = _last_tree
    if last is not None and last[0] == joined:
        return last[1]
    tree = MerkleTree(leaves)
    _last_tree = (joined, tree)
    return tree


def make_batch_receipt(entries: Sequence[tuple[LK0, bytes]],
                       receiver_signing_key: ed25519.Ed25519PrivateKey, *,
                       time_ms: int | None = None) -> bytes:
    """One signed receipt (form 2, 129 bytes) for many documents, given as
    ``(lk0, digest)`` in the order of the AckBatch entries that carry it.
    Raises ValueError for 0 or more than MAX_RECEIPT_BATCH entries."""
    if not 1 <= len(entries) <= MAX_RECEIPT_BATCH:
        raise ValueError(f"batch receipt of {len(entries)} entries is outside 1..{MAX_RECEIPT_BATCH}")
    t = _now_ms() if time_ms is None else time_ms
    kid = key_id(receiver_signing_key.public_key())
    root = MerkleTree(_leaves(entries)).root
    payload = U32.pack(len(entries)) + root
    sig = receiver_signing_key.sign(_SIG_BATCH + kid + U64.pack(t) + payload)
    return _head(ReceiptForm.BATCH, kid, t) + sig + payload


@dataclass(frozen=True, slots=True)
class _Parsed:
    form: ReceiptForm
    kid: bytes
    time_ms: int
    signature: bytes
    n: int = 1
    root: bytes = b""
    lk0: LK0 | None = None
    digest: bytes | None = None
    index: int = 0
    path: tuple[bytes, ...] = ()


def _parse(receipt: bytes) -> _Parsed:
    if len(receipt) > MAX_RECEIPT:
        raise WireError(f"receipt of {len(receipt)} bytes exceeds the {MAX_RECEIPT}-byte limit")
    r = Reader(receipt)
    if r.take(4, "receipt magic") != RECEIPT_MAGIC:
        raise WireError(f"{len(receipt)} bytes are not a SEMQ receipt (SQR1)")
    try:
        form = ReceiptForm(r.u8("receipt form"))
    except ValueError:
        raise WireError("receipt form is not 1, 2 or 3") from None
    kid = r.take(KEY_ID_SIZE, "signer key id")
    t = r.u64("time")
    sig = r.take(_SIGNATURE_SIZE, "signature")
    if form is ReceiptForm.SINGLE:
        lk0 = r.lk0("receipt LK0")
        digest = r.take(_DIGEST_SIZE, "digest")
        r.end("receipt")
        return _Parsed(form, kid, t, sig, lk0=lk0, digest=digest)
    n = r.u32("batch size")
    root = r.take(HASH_SIZE, "root")
    if not 1 <= n <= MAX_RECEIPT_BATCH:
        raise WireError(f"batch size {n} is outside 1..{MAX_RECEIPT_BATCH}")
    if form is ReceiptForm.BATCH:
        r.end("batch receipt")
        return _Parsed(form, kid, t, sig, n=n, root=root)
    lk0 = r.lk0("receipt LK0")
    digest = r.take(_DIGEST_SIZE, "digest")
    index = r.u32("leaf index")
    m = r.u8("path length")
    path = tuple(r.take(HASH_SIZE, "inclusion path") for _ in range(m))
    r.end("receipt")
    return _Parsed(form, kid, t, sig, n=n, root=root, lk0=lk0, digest=digest, index=index,
                   path=path)


def _signer(p: _Parsed, certs: Sequence[NodeCertificate]) -> NodeCertificate:
    cert = next((c for c in certs if c.signing_key_id == p.kid), None)
    if cert is None:
        known = ", ".join(f"{c.org}:{c.signing_key_id.hex()}" for c in certs) or "none"
        raise UnknownCertificate(
            f"receipt is signed by key {p.kid.hex()}, which is not among the receiver's"
            f" certificates [{known}]"
        )
    return cert


def _verify_sig(p: _Parsed, cert: NodeCertificate, message: bytes, what: str) -> None:
    try:
        cert.signing_public_key.verify(p.signature, message)
    except InvalidSignature:
        raise BadSignature(
            f"{what} signed by org {cert.org} (key {p.kid.hex()}) does not verify: forged or altered"
        ) from None


def _batch_message(p: _Parsed) -> bytes:
    return _SIG_BATCH + p.kid + U64.pack(p.time_ms) + U32.pack(p.n) + p.root


def verify_receipt(receipt: bytes, *, digest: bytes, lk0: LK0,
                   receiver_certs: Sequence[NodeCertificate]) -> ReceiptInfo:
    """Verify a single receipt (form 1, from ACK2) or a batch proof (form 3)
    for the document ``lk0`` whose digest the origin stored, against the
    receiver's certificates (CertificateDirectory.lookup of the target; for
    an old receipt, certificates verified at its time). Raises BadSignature
    (BAD_SIGNATURE) if malformed, forged, or about another document or digest;
    UnknownCertificate if the signer key is not among ``receiver_certs``."""
    try:
        p = _parse(bytes(receipt))
        if p.form is ReceiptForm.BATCH:
            raise WireError("a batch receipt (form 2) needs verify_batch_receipt with its entries")
    except WireError as e:
        raise BadSignature(f"receipt for {lk0} is not verifiable: {e}") from None
    if p.lk0 != lk0 or p.digest != digest:
        raise BadSignature(f"receipt names document {p.lk0}, not {lk0} with the digest sent")
    cert = _signer(p, receiver_certs)
    if p.form is ReceiptForm.SINGLE:
        message = _SIG_ONE + p.kid + U64.pack(p.time_ms) + encode_lk0(lk0) + digest
    else:
        try:
            root = root_from_path(leaf_hash(encode_lk0(lk0) + digest), p.index, p.n, p.path)
        except ValueError as e:
            raise BadSignature(f"receipt for {lk0}: batch inclusion path invalid: {e}") from None
        if root != p.root:
            raise BadSignature(f"receipt for {lk0}: the document is not in the signed batch")
        message = _batch_message(p)
    _verify_sig(p, cert, message, f"receipt for {lk0}")
    return ReceiptInfo(p.form, cert, p.time_ms, p.n, lk0, p.digest)


def verify_batch_receipt(receipt: bytes, *, entries: Sequence[tuple[LK0, bytes]],
                         receiver_certs: Sequence[NodeCertificate]) -> ReceiptInfo:
    """Verify a batch receipt (form 2, from AckBatch.receipt) over ``entries``
    — ``(lk0, digest)`` for each AckBatch entry, in order, the LK0 built from
    the entry's dest_* fields and the origin's endpoint, the digest from the
    origin's store. Raises BadSignature if any document, digest or the order
    differs, or the signature is forged; UnknownCertificate as verify_receipt."""
    try:
        p = _parse(bytes(receipt))
        if p.form is not ReceiptForm.BATCH:
            raise WireError(f"receipt form {int(p.form)} is not a batch receipt (2)")
    except WireError as e:
        raise BadSignature(f"batch receipt is not verifiable: {e}") from None
    if p.n != len(entries):
        raise BadSignature(f"batch receipt covers {p.n} documents, the batch holds {len(entries)}")
    cert = _signer(p, receiver_certs)
    try:
        root = _tree(entries).root
    except ValueError as e:
        raise BadSignature(f"batch receipt entries are invalid: {e}") from None
    if root != p.root:
        raise BadSignature(
            f"batch receipt of {p.n} documents does not match these documents and digests"
        )
    _verify_sig(p, cert, _batch_message(p), f"batch receipt of {p.n} documents")
    return ReceiptInfo(p.form, cert, p.time_ms, p.n, None, None)


def receipt_proofs(batch_receipt: bytes, entries: Sequence[tuple[LK0, bytes]]) -> list[bytes]:
    """Split a batch receipt into one form-3 receipt per entry (same order),
    each verifiable alone with verify_receipt. Verify the batch receipt first
    (verify_batch_receipt); this only rearranges bytes. Each is at most 788
    bytes (a 64-character node id, 100000 entries: 17 path hashes). Raises ValueError if the receipt is not form 2 or the entries do
    not match its root."""
    try:
        p = _parse(bytes(batch_receipt))
    except WireError as e:
        raise ValueError(f"batch receipt is malformed: {e}") from None
    if p.form is not ReceiptForm.BATCH:
        raise ValueError(f"receipt form {int(p.form)} is not a batch receipt (2)")
    tree = _tree(entries)
    if tree.size != p.n or tree.root != p.root:
        raise ValueError(f"entries do not match the batch receipt of {p.n} documents")
    head = _head(ReceiptForm.BATCH_PROOF, p.kid, p.time_ms) + p.signature + U32.pack(p.n) + p.root
    pack = U32.pack
    return [b"".join((head, encode_lk0(lk0), bytes(digest), pack(i),
                      bytes((len(path) // HASH_SIZE,)), path))
            for i, ((lk0, digest), path) in enumerate(zip(entries, tree.joined_paths(),
                                                           strict=True))]


@dataclass(frozen=True, slots=True)
class RefusalInfo:
    """A refusal that verified: the target ``signer`` refused ``lk0`` with
    ``code`` at its clock's ``time_ms``."""

    signer: NodeCertificate
    time_ms: int
    lk0: LK0
    code: ResultCode

    @property
    def org(self) -> str:
        return self.signer.org


def _refusal_message(kid: bytes, time_ms: int, code: int, lk0: LK0) -> bytes:
    return _SIG_REFUSAL + kid + U64.pack(time_ms) + U16.pack(code) + encode_lk0(lk0)


def make_refusal(lk0: LK0, code: ResultCode, receiver_signing_key: ed25519.Ed25519PrivateKey, *,
                 time_ms: int | None = None) -> bytes:
    """The target's signed statement that the document ``lk0`` did not reach
    its inbox, and why (``code``): at most 183 bytes, for Nack.proof."""
    t = _now_ms() if time_ms is None else time_ms
    kid = key_id(receiver_signing_key.public_key())
    sig = receiver_signing_key.sign(_refusal_message(kid, t, int(code), lk0))
    return REFUSAL_MAGIC + kid + U64.pack(t) + sig + U16.pack(int(code)) + encode_lk0(lk0)


def verify_refusal(proof: bytes, *, lk0: LK0, code: ResultCode,
                   receiver_certs: Sequence[NodeCertificate]) -> RefusalInfo:
    """Check a NACK's signed refusal: it names ``lk0`` and ``code`` and is
    signed by one of ``receiver_certs`` (the target's). Raises BadSignature
    if it is missing, malformed, about another document or code, or forged;
    UnknownCertificate if the signer key is not among ``receiver_certs``."""
    try:
        r = Reader(bytes(proof))
        if r.take(4, "refusal magic") != REFUSAL_MAGIC:
            raise WireError(f"{len(proof)} bytes are not a SEMQ refusal (SQF1)")
        kid = r.take(KEY_ID_SIZE, "signer key id")
        t = r.u64("time")
        sig = r.take(_SIGNATURE_SIZE, "signature")
        got_code = r.u16("code")
        got_lk0 = r.lk0("refusal LK0")
        r.end("refusal")
    except WireError as e:
        raise BadSignature(f"refusal of {lk0} is not verifiable: {e}") from None
    if got_lk0 != lk0 or got_code != int(code):
        raise BadSignature(f"refusal names {got_lk0} with code {got_code}, not {lk0} with {int(code)}")
    cert = _signer(_Parsed(ReceiptForm.SINGLE, kid, t, sig), receiver_certs)
    _verify_sig(_Parsed(ReceiptForm.SINGLE, kid, t, sig), cert, _refusal_message(kid, t, got_code, lk0),
                f"refusal of {lk0}")
    return RefusalInfo(cert, t, lk0, ResultCode(got_code))
