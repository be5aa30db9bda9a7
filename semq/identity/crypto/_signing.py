"""Document signatures: the origin signs, the receiver verifies before the
document reaches the inbox (SPEC "Security": signatures belong to the
application layer).

The signature travels inside AppData: the plaintext the application handed
over becomes a **signed container** (below), which is then sealed (or, with
--no-encrypt, sent as it is). Inside the seal, the relay cannot even see who
signed.

Document digest (what a signature and a receipt are about)::

    digest = SHA-256("SEMQ-DOC-v1" 0x00 || len(aad) u32 || aad || salt || SHA-256(body))

``salt`` is 16 bytes chosen by the origin and carried only inside the
container, so a digest seen in a receipt or a batch path reveals nothing about
a guessable body: a node makes it with ``document_salt`` (HMAC under a key
of its own: every copy of a document it sends has the same digest), the
library draws random ones when not given salts.

Signed container (docs/security.md "Signed container")::

    "SQD1"          4   magic
    mode            1   1 single, 2 batch
    signer key id   16  SHA-256(Ed25519 public key)[:16]
    salt            16
    signature       64  Ed25519
    -- mode 2 only:
    batch size n    4   u32
    leaf index      4   u32
    path length m   1
    path            32*m
    --
    body length     4   u32
    body

Mode 1 signs ``"SEMQ-SIG-DOC-v1" 0x00 || digest``. Mode 2 signs
``"SEMQ-SIG-BATCH-v1" 0x00 || n u32 || root`` of a Merkle tree whose leaves
are the digests of n documents: one Ed25519 signature for the whole batch,
each document still verifiable on its own with its path; a
``SignatureCache`` on the receiver verifies each batch signature once.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from ._aad import aad_source_id, parse_document_aad
from ._errors import BadSignature, UnknownCertificate
from ._merkle import HASH_SIZE, MerkleTree, leaf_hash, root_from_path
from ._pki import KEY_ID_SIZE, NodeCertificate, key_id
from ._wire import U32, Reader, WireError

__all__ = [
    "CONTAINER_MAGIC",
    "MAX_SIGN_BATCH",
    "SignatureCache",
    "SignedDocument",
    "VerifiedDocument",
    "document_digest",
    "document_salt",
    "sign_document",
    "sign_documents",
    "verify_document",
]

CONTAINER_MAGIC: Final = b"SQD1"
MODE_SINGLE: Final = 1
MODE_BATCH: Final = 2
SALT_SIZE: Final = 16
SIGNATURE_SIZE: Final = 64
MAX_SIGN_BATCH: Final = 65_536  # documents under one batch signature: paths of <= 16 hashes

_DIGEST_PREFIX: Final = b"SEMQ-DOC-v1\x00"
_SIG_DOC: Final = b"SEMQ-SIG-DOC-v1\x00"
_SIG_BATCH: Final = b"SEMQ-SIG-BATCH-v1\x00"
_SALT_PREFIX: Final = b"SEMQ-SALT-v1\x00"


def document_digest(aad: bytes, body: bytes, salt: bytes) -> bytes:
    """The 32-byte digest of a document: binds its header (``aad``), the
    origin's ``salt`` and the body. What signatures and receipts are about;
    the origin stores it with the pending-send row to check the receipt."""
    return hashlib.sha256(
        _DIGEST_PREFIX + U32.pack(len(aad)) + aad + salt + hashlib.sha256(body).digest()
    ).digest()


@dataclass(frozen=True, slots=True)
class SignedDocument:
    """What the origin sends (``container``, the new AppData plaintext) and
    keeps (``digest``, to verify the receiver's receipt)."""

    container: bytes
    digest: bytes


@dataclass(frozen=True, slots=True)
class VerifiedDocument:
    """A container whose signature verified: the application's ``body``, its
    ``digest`` (to put in the receipt), the ``signer`` certificate, and the
    size of the batch the signature covered (1 for a single signature), and
    whether it arrived sealed (set by open_document; False from
    verify_document, which never sees the seal)."""

    body: bytes
    digest: bytes
    signer: NodeCertificate
    batch_size: int = 1
    encrypted: bool = False

    @property
    def org(self) -> str:
        return self.signer.org


def _container(mode: int, kid: bytes, salt: bytes, signature: bytes, extra: bytes,
               body: bytes) -> bytes:
    return b"".join((CONTAINER_MAGIC, bytes((mode,)), kid, salt, signature, extra,
                     U32.pack(len(body)), body))


def document_salt(key: bytes, aad: bytes) -> bytes:
    """The salt a node gives the document whose header is ``aad``:
    HMAC-SHA256 under the node's own secret ``key``, so every copy of one
    document it sends (a resend signs it again) has the same salt and so the
    same digest — a receipt for any copy names the digest the origin keeps —
    while nobody without the key can predict it (what the salt is for)."""
    return document_salts(key, (aad,))[0]


def document_salts(key: bytes, aads: Sequence[bytes]) -> list[bytes]:
    """``document_salt`` for many documents, ``HMAC-SHA256(key,
    "SEMQ-SALT-v1" 0x00 || aad)[:16]`` each (docs/security.md), with the
    key's HMAC state (and the prefix) computed once for the batch (1.2
    instead of 1.8 us per document)."""
    base = hmac.new(key, _SALT_PREFIX, hashlib.sha256)
    out = []
    for aad in aads:
        h = base.copy()
        h.update(aad)
        out.append(h.digest()[:SALT_SIZE])
    return out


def _salt(salt: bytes | None) -> bytes:
    if salt is None:
        return os.urandom(SALT_SIZE)
    if len(salt) != SALT_SIZE:
        raise ValueError(f"salt of {len(salt)} bytes is not {SALT_SIZE}")
    return bytes(salt)


def sign_document(body: bytes, *, aad: bytes, signing_key: ed25519.Ed25519PrivateKey,
                  salt: bytes | None = None) -> SignedDocument:
    """Sign one document: the container (mode 1) and its digest. ``salt``:
    16 bytes (``document_salt``), random when not given."""
    salt = _salt(salt)
    digest = document_digest(aad, body, salt)
    sig = signing_key.sign(_SIG_DOC + digest)
    kid = key_id(signing_key.public_key())
    return SignedDocument(_container(MODE_SINGLE, kid, salt, sig, b"", bytes(body)), digest)


def sign_documents(items: Sequence[tuple[bytes, bytes]], *,
                   signing_key: ed25519.Ed25519PrivateKey,
                   salts: Sequence[bytes] | None = None) -> list[SignedDocument]:
    """Sign many documents, given as ``(aad, body)`` pairs, with one Ed25519
    signature over the Merkle root of their digests (mode 2; a single item
    gets mode 1). Returns one SignedDocument per item, in order; each verifies
    on its own. ``salts``: one per item (``document_salt``), random when not
    given. Raises ValueError for more than MAX_SIGN_BATCH items."""
    return [SignedDocument(c, d) for c, d in _sign_many(items, signing_key, salts)]


def _sign_many(items: Sequence[tuple[bytes, bytes]], signing_key: ed25519.Ed25519PrivateKey,
               salts: Sequence[bytes] | None = None) -> list[tuple[bytes, bytes]]:
    """sign_documents as (container, digest) pairs."""
    if len(items) > MAX_SIGN_BATCH:
        raise ValueError(f"batch of {len(items)} documents exceeds the {MAX_SIGN_BATCH} limit")
    if salts is not None and len(salts) != len(items):
        raise ValueError(f"{len(salts)} salts for {len(items)} documents")
    if len(items) == 1:
        aad, body = items[0]
        one = sign_document(body, aad=aad, signing_key=signing_key, salt=salts[0] if salts else None)
        return [(one.container, one.digest)]
    if not items:
        return []
    n = len(items)
    if salts is None:
        rnd = os.urandom(SALT_SIZE * n)  # one read for the batch: n independent salts
        salts = [rnd[i:i + SALT_SIZE] for i in range(0, SALT_SIZE * n, SALT_SIZE)]
    else:
        salts = [_salt(x) for x in salts]
    digests = [document_digest(aad, body, s) for (aad, body), s in zip(items, salts, strict=True)]
    sha256 = hashlib.sha256
    tree = MerkleTree([sha256(b"\x00" + d).digest() for d in digests])  # leaf_hash
    sig = signing_key.sign(_SIG_BATCH + U32.pack(n) + tree.root)
    kid = key_id(signing_key.public_key())
    head = CONTAINER_MAGIC + bytes((MODE_BATCH,)) + kid
    n_bytes = U32.pack(n)
    pack = U32.pack
    out = []
    for i, ((_, body), salt, digest, path) in enumerate(
            zip(items, salts, digests, tree.joined_paths(), strict=True)):
        b = bytes(body)
        out.append((b"".join((head, salt, sig, n_bytes, pack(i),
                              _PATH_LEN[len(path) // HASH_SIZE], path, pack(len(b)), b)),
                    digest))
    return out


# Proven Merkle nodes of one batch: (level, index) -> (node hash, the joined
# siblings from that level up to the root).
_Nodes = dict[tuple[int, int], tuple[bytes, bytes]]


class SignatureCache:
    """Remembers up to ``size`` (key, signed message, signature) triples that
    verified, so the n documents of a batch cost one Ed25519 verification.
    Only successes are stored; thread-safe.

    For batch signatures it also keeps the Merkle nodes *proven* under each
    verified root — every node on an inclusion path that hashed up to a root
    whose signature verified, siblings included — keyed by (signer key,
    signature, batch size) and position (level, index), each with the joined
    siblings of its own way up to the root. A later document of the same
    batch hashes up until it meets one of them and then compares the rest of
    its path with those siblings in one comparison: exactly the answer of
    hashing its whole path (the same siblings give the same root), with about
    one hash per document instead of log2 n. At most ``max_nodes`` nodes are
    kept (oldest batches go first; each holds up to 16 x 32 bytes of path)."""

    def __init__(self, size: int = 4096, max_nodes: int = 1 << 15) -> None:
        self.size = size
        self.max_nodes = max_nodes
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()
        self._proven: OrderedDict[tuple[bytes, bytes, int], _Nodes] = OrderedDict()
        self._proven_count = 0

    def _proven_nodes(self, raw: bytes, signature: bytes, n: int) -> _Nodes | None:
        with self._lock:
            return self._proven.get((raw, signature, n))

    def _prove(self, raw: bytes, signature: bytes, n: int, nodes: _Nodes) -> None:
        """Add ``nodes`` (from a path that verified under this signature)."""
        key = (raw, signature, n)
        with self._lock:
            known = self._proven.get(key)
            if known is None:
                known = self._proven[key] = {}
            before = len(known)
            known.update(nodes)
            self._proven_count += len(known) - before
            self._proven.move_to_end(key)
            while self._proven_count > self.max_nodes and len(self._proven) > 1:
                _, old = self._proven.popitem(last=False)
                self._proven_count -= len(old)

    def verify(self, public_key: ed25519.Ed25519PublicKey, signature: bytes,
               message: bytes) -> None:
        """Raise cryptography's InvalidSignature unless the signature verifies."""
        self._verify(public_key, public_key.public_bytes_raw(), signature, message)

    def _verify(self, public_key: ed25519.Ed25519PublicKey, raw: bytes, signature: bytes,
                message: bytes) -> None:
        # Keyed on the exact bytes of (public key, signature, signed message).
        k = (raw, bytes(signature), bytes(message))
        with self._lock:
            if k in self._seen:
                self._seen.move_to_end(k)
                return
        public_key.verify(signature, message)
        with self._lock:
            self._seen[k] = None
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)


@dataclass(frozen=True, slots=True)
class _Parsed:
    mode: int
    kid: bytes
    salt: bytes
    signature: bytes
    n: int
    index: int
    path: bytes  # the inclusion path, its hashes joined
    body: bytes


_HEAD_SIZE: Final = 4 + 1 + KEY_ID_SIZE + SALT_SIZE + SIGNATURE_SIZE  # 101
_BATCH_POS: Final = struct.Struct(">IIB")  # batch size, leaf index, path length
_PATH_AT: Final = _HEAD_SIZE + _BATCH_POS.size  # 110
_PATH_LEN: Final = [bytes((m,)) for m in range(256)]


def _parse_fast(c: bytes) -> tuple[int, bytes, bytes, bytes, int, int, bytes, bytes] | None:
    """``_parse`` of a well-formed container without a Reader: the same
    result, or None when anything is off (``_parse`` then says what)."""
    size = len(c)
    if size < _HEAD_SIZE + 4 or c[:4] != CONTAINER_MAGIC:
        return None
    mode = c[4]
    if mode == MODE_SINGLE:
        (length,) = U32.unpack_from(c, _HEAD_SIZE)
        if _HEAD_SIZE + 4 + length != size:
            return None
        return (mode, c[5:21], c[21:37], c[37:_HEAD_SIZE], 1, 0, b"", c[_HEAD_SIZE + 4:])
    if mode != MODE_BATCH or size < _PATH_AT + 4:
        return None
    n, index, m = _BATCH_POS.unpack_from(c, _HEAD_SIZE)
    end = _PATH_AT + HASH_SIZE * m
    if end + 4 > size or not 2 <= n <= MAX_SIGN_BATCH or index >= n:
        return None
    (length,) = U32.unpack_from(c, end)
    if end + 4 + length != size:
        return None
    return (mode, c[5:21], c[21:37], c[37:_HEAD_SIZE], n, index, c[_PATH_AT:end], c[end + 4:])


def _parse(container: bytes) -> _Parsed:
    r = Reader(container)
    if r.take(4, "container magic") != CONTAINER_MAGIC:
        raise WireError(f"AppData of {len(container)} bytes is not a signed container (SQD1)")
    mode = r.u8("container mode")
    kid = r.take(KEY_ID_SIZE, "signer key id")
    salt = r.take(SALT_SIZE, "salt")
    sig = r.take(SIGNATURE_SIZE, "signature")
    n, index, path = 1, 0, b""
    if mode == MODE_BATCH:
        n = r.u32("batch size")
        index = r.u32("leaf index")
        m = r.u8("path length")
        path = r.take(HASH_SIZE * m, "inclusion path")
        if not 2 <= n <= MAX_SIGN_BATCH or index >= n:
            raise WireError(f"batch position {index} of {n} is outside 2..{MAX_SIGN_BATCH}")
    elif mode != MODE_SINGLE:
        raise WireError(f"container mode {mode} is not 1 (single) or 2 (batch)")
    length = r.u32("body length")
    body = r.take(length, "body")
    r.end("signed container")
    return _Parsed(mode, kid, salt, sig, n, index, path, body)


def _lk0_text(aad: bytes) -> str:
    try:
        return str(parse_document_aad(aad).lk0)
    except WireError:
        return "(unparsable header)"


def _signer_cert(certs: Sequence[NodeCertificate], kid: bytes) -> NodeCertificate | None:
    """The first of ``certs`` whose signing key id is ``kid``."""
    for cert in certs:
        if cert.signing_key_id == kid:
            return cert
    return None


def verify_document(
    container: bytes,
    *,
    aad: bytes,
    signer_certs: Sequence[NodeCertificate],
    cache: SignatureCache | None = None,
) -> VerifiedDocument:
    """Verify a signed container against the document's ``aad`` and the
    certificates of its origin (``signer_certs``: the verified certificates of
    the organization in the AAD's source, e.g. CertificateDirectory.lookup).
    Returns the body. Raises BadSignature (BAD_SIGNATURE) for a malformed
    container, a bad signature, a changed header or body, or a signer that is
    not the AAD's source; UnknownCertificate (UNKNOWN_CERTIFICATE) when the
    signer key is not among ``signer_certs`` (refresh the directory and
    retry: the origin may have rolled over)."""
    return _verify(container, aad, signer_certs, cache, False)


def _verify(container: bytes, aad: bytes, signer_certs: Sequence[NodeCertificate],
            cache: SignatureCache | None, encrypted: bool) -> VerifiedDocument:
    """verify_document, with the VerifiedDocument's ``encrypted`` flag."""
    container = bytes(container)
    try:
        parsed = _parse_fast(container)
        if parsed is None:
            q = _parse(container)
            parsed = (q.mode, q.kid, q.salt, q.signature, q.n, q.index, q.path, q.body)
        source = aad_source_id(aad)
    except WireError as e:
        raise BadSignature(f"document is not verifiable: {e}") from None
    mode, kid, salt, signature, n, index, path, body = parsed
    cert = _signer_cert(signer_certs, kid)
    if cert is None:
        known = ", ".join(f"{c.org}:{c.signing_key_id.hex()}" for c in signer_certs) or "none"
        raise UnknownCertificate(
            f"document from org {source} is signed by key {kid.hex()}, which is not among"
            f" the known certificates [{known}]"
        )
    if cert.org != source:
        raise BadSignature(
            f"document from org {source} is signed by org {cert.org}'s key {kid.hex()}"
        )
    digest = document_digest(aad, body, salt)
    nodes: _Nodes | None = None
    if mode == MODE_SINGLE:
        message = _SIG_DOC + digest
    else:
        leaf = leaf_hash(digest)
        if cache is not None:
            proven = cache._proven_nodes(cert.signing_key_raw, signature, n)
            if proven is not None:
                found = _reaches_proven(proven, leaf, index, n, path)
                if found is not None:
                    if found:  # the nodes it computed on the way are proven now too
                        cache._prove(cert.signing_key_raw, signature, n, found)
                    return VerifiedDocument(body, digest, cert, n, encrypted)
            nodes = {}
        try:
            if nodes is None:
                root = root_from_path(leaf, index, n, [path[i:i + HASH_SIZE]
                                                       for i in range(0, len(path), HASH_SIZE)])
            else:
                root = _walk(leaf, index, n, path, nodes)
        except ValueError as e:
            raise BadSignature(
                f"document from org {source}: batch inclusion path invalid: {e}"
            ) from None
        message = _SIG_BATCH + U32.pack(n) + root
    try:
        if cache is not None:
            cache._verify(cert.signing_public_key, cert.signing_key_raw, signature, message)
        else:
            cert.signing_public_key.verify(signature, message)
    except InvalidSignature:
        raise BadSignature(
            f"signature of document {_lk0_text(aad)} by org {cert.org}"
            f" (key {kid.hex()}) does not verify: body or header changed, or forged"
        ) from None
    if nodes and cache is not None:
        cache._prove(cert.signing_key_raw, signature, n, nodes)
    return VerifiedDocument(body, digest, cert, n, encrypted)


# One pending document of _verify_batches: (leaf index, caller's position,
# digest, joined path, body, signer certificate, sealed).
_Member = tuple[int, int, bytes, bytes, bytes, NodeCertificate, bool]


def _verify_batches(docs: Sequence[tuple[int, bytes, bytes, Sequence[NodeCertificate], bool]],
                    cache: SignatureCache | None) -> dict[int, VerifiedDocument]:
    """Verify together the documents of each batch signature in ``docs``
    (``(position, container, aad, signer_certs, sealed)``), the whole batch
    or part of it: the tree's nodes above them hashed once
    (``_members_root``), one signature check (cached). Returns the verified
    ones by position, each exactly what ``_verify`` returns for it.
    Anything else — a single signature, a container that does not parse, a
    signer that is not known or not the source, a path that disagrees, a
    signature that does not verify — is left out: the caller checks those
    one by one with ``_verify``, which says what is wrong."""
    groups: dict[tuple[bytes, bytes, int], list[_Member]] = {}
    for pos, container, aad, certs, sealed in docs:
        p = _parse_fast(container)
        if p is None or p[0] != MODE_BATCH:
            continue
        _, kid, salt, signature, n, index, path, body = p
        cert = _signer_cert(certs, kid)
        if cert is None:
            continue
        try:
            if cert.org != aad_source_id(aad):
                continue
        except WireError:
            continue
        member = (index, pos, document_digest(aad, body, salt), path, body, cert, sealed)
        key = (cert.signing_key_raw, signature, n)
        group = groups.get(key)
        if group is None:
            groups[key] = [member]
        else:
            group.append(member)
    done: dict[int, VerifiedDocument] = {}
    for (raw, signature, n), members in groups.items():
        root = _members_root(n, members)
        if root is None:
            continue
        message = _SIG_BATCH + U32.pack(n) + root
        public = members[0][5].signing_public_key  # (every member's: the same raw key)
        try:
            if cache is not None:
                cache._verify(public, raw, signature, message)
            else:
                public.verify(signature, message)
        except InvalidSignature:
            continue
        for _, pos, digest, _, body, cert, sealed in members:
            done[pos] = VerifiedDocument(body, digest, cert, n, sealed)
    return done


def _members_root(n: int, members: list[_Member]) -> bytes | None:
    """The root of a batch of ``n`` from the members at hand (any subset of
    its leaves), each node hashed once: level by level, a node's sibling is
    the node computed from other members or, where no member lies under it,
    the hash a member's inclusion path gives for it. Then every member's
    path must be exactly the siblings of its way up — so each member's own
    walk up its path (``root_from_path``) gives this root too. None when
    they disagree (two leaves at one position, a path too short, a path
    that is not its way up): the caller checks those one by one."""
    sha256 = _sha256
    level: dict[int, bytes] = {}
    way: dict[int, tuple[bytes, int]] = {}  # a member's path under each node, hashes used so far
    for index, _, digest, path, *_rest in members:
        leaf = sha256(b"\x00" + digest).digest()  # leaf_hash
        if level.setdefault(index, leaf) != leaf:
            return None
        way[index] = (path, 0)
    if len(level) == n:  # the whole batch: its tree, built level by level
        tree = MerkleTree([level[i] for i in range(n)])
        paths = tree.joined_paths()
        if any(m[3] != paths[m[0]] for m in members):
            return None
        return tree.root
    siblings: list[tuple[list[int], dict[int, bytes]]] = []  # per level: its nodes, their siblings
    size = n
    while size > 1:
        up: dict[int, bytes] = {}
        up_way: dict[int, tuple[bytes, int]] = {}
        sib_of: dict[int, bytes] = {}
        nodes = sorted(level)
        for pos in nodes:
            h = level[pos]
            parent = pos >> 1
            sib = pos ^ 1
            path, k = way[pos]
            if sib >= size:  # the last node of an odd level moves up unchanged
                up[parent], up_way[parent] = h, (path, k)
                continue
            s = level.get(sib)
            if s is None:
                s = path[k * HASH_SIZE:(k + 1) * HASH_SIZE]
                if len(s) != HASH_SIZE:
                    return None
            sib_of[pos] = s
            if parent not in up:
                up[parent] = sha256(b"\x01" + (s + h if pos & 1 else h + s)).digest()
                up_way[parent] = (path, k + 1)
        siblings.append((nodes, sib_of))
        level, way = up, up_way
        size = (size + 1) >> 1
    # Each node's expected path up (its siblings' hashes joined), top down;
    # a node without a sibling adds nothing to it.
    above: dict[int, bytes] = {0: b""}
    for nodes, sib_of in reversed(siblings):
        get = sib_of.get
        above = {pos: get(pos, b"") + above[pos >> 1] for pos in nodes}
    for index, _, _, path, *_rest in members:
        if above.get(index) != path:
            return None
    return level[0]


_sha256 = hashlib.sha256


def _climb(proven: _Nodes, leaf: bytes, index: int, n: int, path: bytes
           ) -> tuple[bytes, int, int, int, list[tuple[int, int, int, bytes]]]:
    """Hash ``leaf`` at ``index`` of ``n`` up its ``path`` (joined hashes)
    over the tree MerkleTree builds (an odd last node moves up unchanged: the
    RFC 9162 tree), until the root or a node of ``proven`` with the same
    value. Returns (node, level, index at that level, path hashes used, the
    chain below it as (level, index, hashes used, node)). Raises ValueError
    for a position outside the tree or a path too short for it."""
    if not 0 <= index < n:
        raise ValueError(f"leaf index {index} is outside 0..{n - 1}")
    if len(path) % HASH_SIZE:
        raise ValueError(f"inclusion path of {len(path)} bytes is not whole hashes")
    m = len(path) // HASH_SIZE
    pos, size, level, k, r = index, n, 0, 0, leaf
    get = proven.get
    chain: list[tuple[int, int, int, bytes]] = []
    while size > 1:
        known = get((level, pos))
        if known is not None and known[0] == r:
            break
        chain.append((level, pos, k, r))
        sib = pos ^ 1
        if sib < size:
            if k >= m:
                raise ValueError(f"inclusion path of {m} hashes is too short")
            p = path[k * HASH_SIZE:(k + 1) * HASH_SIZE]
            k += 1
            r = _sha256(b"\x01" + p + r).digest() if pos & 1 else _sha256(b"\x01" + r + p).digest()
        pos >>= 1
        size = (size + 1) >> 1
        level += 1
    return r, level, pos, k, chain


def _walk(leaf: bytes, index: int, n: int, path: bytes, nodes: _Nodes) -> bytes:
    """``root_from_path`` with ``path`` the joined hashes, recording every
    node it passes and every sibling into ``nodes``. Raises ValueError for a
    path of the wrong length for that position."""
    r, level, _, k, chain = _climb({}, leaf, index, n, path)
    if k * HASH_SIZE != len(path):
        raise ValueError(f"inclusion path of {len(path) // HASH_SIZE} hashes is too long")
    _record(nodes, chain, path, n)
    nodes[(level, 0)] = (r, b"")
    return r


def _record(nodes: _Nodes, chain: list[tuple[int, int, int, bytes]], path: bytes, n: int) -> None:
    """Record the chain nodes and their siblings with their ways up: a chain
    node's way up is the rest of the path; its sibling's is the chain node,
    then the rest of the path above it."""
    for level, pos, k, r in chain:
        rest = path[k * HASH_SIZE:]
        nodes[(level, pos)] = (r, rest)
        sib = pos ^ 1
        if sib < (n + (1 << level) - 1) >> level:  # the level's size
            nodes[(level, sib)] = (rest[:HASH_SIZE], r + rest[HASH_SIZE:])


def _reaches_proven(proven: _Nodes, leaf: bytes, index: int, n: int, path: bytes) -> _Nodes | None:
    """Whether ``leaf`` at ``index`` with ``path`` (joined hashes) gives the
    batch's root, decided with the nodes already proven under it (see
    SignatureCache): hash up until a proven node, then the rest of the path
    must be that node's way up — exactly the answer of hashing the whole
    path, without most of the hashing. Returns the nodes it computed below
    the proven one (proven now too; empty when the leaf itself was), or None
    when the path does not lead there: the caller then checks the whole path
    against the signature, which decides."""
    try:
        r, level, pos, k, chain = _climb(proven, leaf, index, n, path)
    except ValueError:
        return None
    known = proven.get((level, pos))
    if known is None or known[0] != r or path[k * HASH_SIZE:] != known[1]:
        return None
    new: _Nodes = {}
    if chain:
        _record(new, chain, path, n)
    return new
