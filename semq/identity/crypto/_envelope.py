"""End-to-end encryption of AppData (SPEC "Security": AppData is encrypted with
a fresh session key, the session key is encrypted with the receiver's public
key; the platform relays what it cannot read).

Scheme (docs/security.md "Session key blob"):

* a 32-byte **file key** K is wrapped to each recipient X25519 key: a fresh
  ephemeral X25519 key, KEK = HKDF-SHA256(shared secret, salt = ephemeral
  public || recipient public, info "SEMQ-v1 key wrap"), AES-256-GCM(KEK,
  zero nonce — the KEK is used once) over K with the blob header (magic,
  suite) and key id as associated data;
* each document gets 16 fresh random bytes (the blob's ``salt``) and AppData
  is AES-256-GCM encrypted with associated data = the document AAD (the header
  fields that name it) and the whole blob. The suite byte says how the
  content key and nonce come from K and the salt:

  - suite 2 (what this code seals): content key = HKDF-SHA256(K, no salt,
    info "SEMQ-v2 content"), one per file key; nonce = the salt's first 12
    bytes. A sealer with a reused K pays one HKDF per epoch and keeps the
    cipher object; per document it draws 16 random bytes and runs the AEAD.
  - suite 1 (still opened; sealed with ``suite=1``): content key || nonce =
    HKDF-SHA256(K, salt, info "SEMQ-v1 content") per document: six SHA-256
    per document, which were most of the cost of sealing a 1 KiB document.

  Both give every document of an epoch a unique (key, nonce) pair: suite 1 a
  key of its own, suite 2 a random 96-bit nonce under the epoch's key; an
  epoch is at most ``MAX_EPOCH_USES`` documents, far below the 2^32
  invocations NIST SP 800-38D allows one key with random nonces.

``seal`` / ``open_`` draw a fresh K per document. ``Sealer`` / ``Opener``
amortize the public-key work (MEASUREMENTS: ~7k wraps/s cap a process): a
Sealer reuses one K and its wraps per recipient key set for an epoch (time and
use bounded); each document's blob is self-contained, so any single document
opens on its own. An Opener remembers unwrapped keys by the wrap bytes, so it
does one X25519 per epoch, not per document.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from semq.umxt_protocol import MAX_SESSION_KEY

from ._errors import DecryptError
from ._pki import KEY_ID_SIZE, NodeCertificate, key_id
from ._wire import U32

__all__ = [
    "BLOB_HEADER_SIZE",
    "BLOB_MAGIC",
    "MAX_EPOCH_USES",
    "MAX_RECIPIENT_KEYS",
    "SUITE_EPOCH_KEY",
    "SUITE_X25519_AES256GCM",
    "WRAP_SIZE",
    "Opener",
    "Sealer",
    "blob_key_ids",
    "open_",
    "seal",
]

BLOB_MAGIC: Final = b"SQK1"
SUITE_X25519_AES256GCM: Final = 1  # X25519 + HKDF-SHA256 wrap, AES-256-GCM, content key per document
SUITE_EPOCH_KEY: Final = 2  # the same wrap; one content key per file key, random nonce per document
SUITES: Final = (SUITE_X25519_AES256GCM, SUITE_EPOCH_KEY)
MAX_EPOCH_USES: Final = 1 << 24  # documents under one file key (random 96-bit nonces: NIST allows 2^32)
SALT_SIZE: Final = 16
FILE_KEY_SIZE: Final = 32
BLOB_HEADER_SIZE: Final = 4 + 1 + SALT_SIZE + 1  # magic, suite, salt, count
WRAP_SIZE: Final = KEY_ID_SIZE + 32 + FILE_KEY_SIZE + 16  # key id, ephemeral public, AEAD(K)
MAX_RECIPIENT_KEYS: Final = 16  # old + new certificates of a few recipients; 1558 bytes
assert BLOB_HEADER_SIZE + MAX_RECIPIENT_KEYS * WRAP_SIZE <= MAX_SESSION_KEY

_WRAP_INFO: Final = b"SEMQ-v1 key wrap"
_CONTENT_INFO: Final = b"SEMQ-v1 content"
_CONTENT_INFO_V2: Final = b"SEMQ-v2 content"
_ZERO_NONCE: Final = bytes(12)
_HASH_LEN: Final = 32


# HMAC-SHA256 (RFC 2104) spelled out over hashlib: the same bytes as
# hmac.digest, at about half the cost for the short keys and messages of a
# per-document key derivation (OpenSSL's one-shot HMAC has a high fixed cost).
_BLOCK: Final = 64
_IPAD: Final = bytes(x ^ 0x36 for x in range(256))
_OPAD: Final = bytes(x ^ 0x5C for x in range(256))
_ZERO_BLOCK: Final = bytes(_BLOCK)
_sha256 = hashlib.sha256


def _pads(key: bytes) -> tuple[bytes, bytes]:
    """(key XOR ipad, key XOR opad), the key zero-padded to the block size."""
    if len(key) > _BLOCK:
        key = _sha256(key).digest()
    key = bytes(key) + _ZERO_BLOCK[len(key):]
    return key.translate(_IPAD), key.translate(_OPAD)


def _hmac_sha256(key: bytes, msg: bytes) -> bytes:
    ipad, opad = _pads(key)
    return _sha256(opad + _sha256(ipad + msg).digest()).digest()


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869): the same bytes as cryptography's HKDF,
    without building an object per document."""
    ipad, opad = _pads(_hmac_sha256(salt, ikm))  # extract: PRK = HMAC(salt, IKM)
    out = b""
    block = b""
    i = 1
    while len(out) < length:
        block = _sha256(opad + _sha256(ipad + block + info + bytes((i,))).digest()).digest()
        out += block
        i += 1
    return out[:length]


_CONTENT_T1: Final = b"SEMQ-v1 content\x01"
_CONTENT_T2: Final = b"SEMQ-v1 content\x02"


def _content_key(file_key: bytes, salt: bytes) -> bytes:
    """``_hkdf(file_key, salt, _CONTENT_INFO, 44)`` (content key || nonce),
    unrolled: the salt differs per document, so nothing here can be cached."""
    ipad, opad = _pads(salt)
    prk = _sha256(opad + _sha256(ipad + file_key).digest()).digest() + _ZERO_BLOCK[32:]
    ipad, opad = prk.translate(_IPAD), prk.translate(_OPAD)
    t1 = _sha256(opad + _sha256(ipad + _CONTENT_T1).digest()).digest()
    return t1 + _sha256(opad + _sha256(ipad + t1 + _CONTENT_T2).digest()).digest()[:12]


def _epoch_cipher(file_key: bytes) -> AESGCM:
    """Suite 2: the content cipher of a file key (one HKDF per epoch)."""
    return AESGCM(_hkdf(file_key, b"", _CONTENT_INFO_V2, 32))


_BLOB_HEADS: Final = {suite: BLOB_MAGIC + bytes((suite,)) for suite in SUITES}
_BLOB_HEAD: Final = _BLOB_HEADS[SUITE_X25519_AES256GCM]
_COUNT: Final = [bytes((i,)) for i in range(256)]


def _check_suite(suite: int) -> None:
    if suite not in SUITES:
        raise ValueError(f"session key suite {suite} is not one of {SUITES}")


def _wrap(file_key: bytes, recipient: x25519.X25519PublicKey, suite: int) -> bytes:
    kid = key_id(recipient)
    eph = x25519.X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes_raw()
    shared = eph.exchange(recipient)
    kek = _hkdf(shared, eph_pub + recipient.public_bytes_raw(), _WRAP_INFO, 32)
    wrapped = AESGCM(kek).encrypt(_ZERO_NONCE, file_key, _wrap_aad(kid, suite))
    return kid + eph_pub + wrapped


def _wrap_aad(kid: bytes, suite: int) -> bytes:
    return _BLOB_HEADS[suite] + kid


def _unwrap(entry: bytes, private: x25519.X25519PrivateKey, suite: int) -> bytes:
    kid = entry[:KEY_ID_SIZE]
    eph_raw = entry[KEY_ID_SIZE:KEY_ID_SIZE + 32]
    wrapped = entry[KEY_ID_SIZE + 32:]
    try:
        shared = private.exchange(x25519.X25519PublicKey.from_public_bytes(eph_raw))
        kek = _hkdf(shared, eph_raw + private.public_key().public_bytes_raw(), _WRAP_INFO, 32)
        return AESGCM(kek).decrypt(_ZERO_NONCE, wrapped, _wrap_aad(kid, suite))
    except (InvalidTag, ValueError):
        raise DecryptError(
            f"session key wrap for key {kid.hex()} failed authentication (tampered blob)"
        ) from None


def _recipients(keys: Sequence[x25519.X25519PublicKey]) -> list[x25519.X25519PublicKey]:
    seen: dict[bytes, x25519.X25519PublicKey] = {}
    for k in keys:
        if not isinstance(k, x25519.X25519PublicKey):
            raise TypeError(f"recipient key must be an X25519PublicKey, not {type(k).__name__}")
        seen.setdefault(key_id(k), k)
    _check_count(len(seen))
    return list(seen.values())


def _check_count(n: int) -> None:
    if not n:
        raise ValueError("no recipient key: a sealed document needs at least one")
    if n > MAX_RECIPIENT_KEYS:
        raise ValueError(
            f"{n} recipient keys exceed the {MAX_RECIPIENT_KEYS}-key limit of a session key blob"
        )


def _encrypt(file_key: bytes, wraps: bytes, count: int, app_data: bytes,
             aad: bytes) -> tuple[bytes, bytes]:
    """Suite 1: a content key and nonce derived per document."""
    salt = os.urandom(SALT_SIZE)
    blob = _BLOB_HEAD + salt + _COUNT[count] + wraps
    okm = _content_key(file_key, salt)
    ct = AESGCM(okm[:32]).encrypt(okm[32:], bytes(app_data),
                                  U32.pack(len(aad)) + aad + blob)
    return blob, ct


_BLOB_HEAD_V2: Final = _BLOB_HEADS[SUITE_EPOCH_KEY]


def _encrypt_v2(cipher: AESGCM, wraps: bytes, count: int, app_data: bytes,
                aad: bytes, salt: bytes | None = None) -> tuple[bytes, bytes]:
    """Suite 2: the epoch's cipher, the nonce from 16 fresh random bytes
    (``salt``: drawn by the caller for a batch, else here)."""
    if salt is None:
        salt = os.urandom(SALT_SIZE)
    blob = _BLOB_HEAD_V2 + salt + _COUNT[count] + wraps
    ct = cipher.encrypt(salt[:12], bytes(app_data), U32.pack(len(aad)) + aad + blob)
    return blob, ct


def seal(app_data: bytes, *, recipient_enc_public_keys: Sequence[x25519.X25519PublicKey],
         aad: bytes, suite: int = SUITE_EPOCH_KEY) -> tuple[bytes, bytes]:
    """Encrypt ``app_data`` for every key in ``recipient_enc_public_keys``
    (the receiver's X25519 keys: old and new certificate during a rollover),
    bound to ``aad`` (see document_aad). Returns ``(session_key_blob,
    ciphertext)`` for Data.session_key / Data.app_data; the blob is at most
    BLOB_HEADER_SIZE + 16 * WRAP_SIZE = 1558 bytes. A fresh file key per call.
    Raises ValueError for no key, more than MAX_RECIPIENT_KEYS keys or an
    unknown ``suite``."""
    _check_suite(suite)
    recipients = _recipients(recipient_enc_public_keys)
    file_key = os.urandom(FILE_KEY_SIZE)
    wraps = b"".join(_wrap(file_key, r, suite) for r in recipients)
    if suite == SUITE_EPOCH_KEY:
        return _encrypt_v2(_epoch_cipher(file_key), wraps, len(recipients), app_data, aad)
    return _encrypt(file_key, wraps, len(recipients), app_data, aad)


def _parse_blob(blob: bytes) -> tuple[bytes, list[bytes]]:
    n = len(blob)
    if n < BLOB_HEADER_SIZE or blob[:4] != BLOB_MAGIC:
        raise DecryptError(f"session key blob of {n} bytes does not start with {BLOB_MAGIC!r}")
    if blob[4] not in SUITES:
        raise DecryptError(f"session key blob uses suite {blob[4]}; this node knows suites 1 and 2")
    count = blob[BLOB_HEADER_SIZE - 1]
    want = BLOB_HEADER_SIZE + count * WRAP_SIZE
    if count == 0 or count > MAX_RECIPIENT_KEYS or n != want:
        raise DecryptError(
            f"session key blob of {n} bytes with {count} wraps is malformed"
            f" (want {want} bytes, 1..{MAX_RECIPIENT_KEYS} wraps)"
        )
    salt = blob[5:5 + SALT_SIZE]
    wraps = [blob[i:i + WRAP_SIZE] for i in range(BLOB_HEADER_SIZE, n, WRAP_SIZE)]
    return salt, wraps


def blob_key_ids(blob: bytes) -> list[bytes]:
    """The key ids a session key blob has wraps for (DecryptError if malformed)."""
    return [w[:KEY_ID_SIZE] for w in _parse_blob(blob)[1]]


def _select(wraps: list[bytes], mine: dict[bytes, x25519.X25519PrivateKey]
            ) -> tuple[bytes, x25519.X25519PrivateKey]:
    for w in wraps:
        priv = mine.get(w[:KEY_ID_SIZE])
        if priv is not None:
            return w, priv
    theirs = ", ".join(w[:KEY_ID_SIZE].hex() for w in wraps)
    ours = ", ".join(k.hex() for k in mine) or "none"
    raise DecryptError(
        f"session key blob is for keys [{theirs}], this node holds [{ours}]:"
        " encrypted for another recipient or a certificate this node no longer has"
    )


def _decrypt(file_key: bytes, salt: bytes, blob: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    """Suite 1."""
    okm = _content_key(file_key, salt)
    try:
        return AESGCM(okm[:32]).decrypt(okm[32:], bytes(ciphertext),
                                        U32.pack(len(aad)) + aad + blob)
    except InvalidTag:
        raise _tampered(ciphertext) from None


def _decrypt_v2(cipher: AESGCM, blob: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    """Suite 2: the nonce is the first 12 bytes of the blob's salt."""
    try:
        return cipher.decrypt(blob[5:17], bytes(ciphertext), U32.pack(len(aad)) + aad + blob)
    except InvalidTag:
        raise _tampered(ciphertext) from None


def _tampered(ciphertext: bytes) -> DecryptError:
    return DecryptError(
        f"ciphertext of {len(ciphertext)} bytes failed authentication: tampered, or the"
        " header fields it is bound to (LK0, source, target, AppKey, SaveFwd) changed")


def _key_map(keys: Sequence[x25519.X25519PrivateKey]) -> dict[bytes, x25519.X25519PrivateKey]:
    return {key_id(k.public_key()): k for k in keys}


def open_(session_key_blob: bytes, ciphertext: bytes, *,
          recipient_enc_private_keys: Sequence[x25519.X25519PrivateKey], aad: bytes) -> bytes:
    """Decrypt what ``seal`` produced, with whichever of our X25519 keys the
    blob has a wrap for, checking ``aad``. Returns the plaintext. Raises
    DecryptError (code DECRYPT_FAILED) for a malformed or tampered blob, a
    tampered ciphertext, a different aad, or no wrap for any of our keys."""
    blob = bytes(session_key_blob)
    salt, wraps = _parse_blob(blob)
    entry, priv = _select(wraps, _key_map(recipient_enc_private_keys))
    file_key = _unwrap(entry, priv, blob[4])
    if blob[4] == SUITE_EPOCH_KEY:
        return _decrypt_v2(_epoch_cipher(file_key), blob, ciphertext, aad)
    return _decrypt(file_key, salt, blob, ciphertext, aad)


@dataclass(slots=True)
class _Epoch:
    file_key: bytes
    wraps: bytes
    cipher: AESGCM | None  # suite 2: the content cipher of file_key
    created: float
    uses: int = 1


class Sealer:
    """``seal`` with the public-key work amortized: one file key and its wraps
    per set of recipient keys, renewed after ``max_age`` seconds or
    ``max_uses`` documents (whichever first, at most MAX_EPOCH_USES). Each
    document still gets 16 fresh random bytes: its own content key (suite 1)
    or its own nonce under the epoch's content key (suite 2, the default).
    Thread-safe: daemons call it from worker threads. Holding the file keys in
    memory is no worse than holding our own private keys; ``clear()`` forgets
    them (e.g. on shutdown)."""

    def __init__(self, *, max_age: float = 3600.0, max_uses: int = 100_000,
                 max_entries: int = 4096, clock: Callable[[], float] = time.monotonic,
                 suite: int = SUITE_EPOCH_KEY) -> None:
        _check_suite(suite)
        if not 1 <= max_uses <= MAX_EPOCH_USES:
            raise ValueError(f"max_uses {max_uses} is outside 1..{MAX_EPOCH_USES}")
        self.max_age = max_age
        self.max_uses = max_uses
        self.max_entries = max_entries
        self.suite = suite
        self._clock = clock
        self._lock = threading.Lock()
        self._epochs: OrderedDict[tuple[bytes, ...], _Epoch] = OrderedDict()

    def _epoch(self, recipients: list[x25519.X25519PublicKey]) -> _Epoch:
        return self._epoch_ids(tuple(sorted(key_id(r) for r in recipients)), recipients)

    def _epoch_ids(self, ids: tuple[bytes, ...], recipients: list[x25519.X25519PublicKey],
                   uses: int = 1) -> _Epoch:
        """The current epoch for these recipient key ids with room for
        ``uses`` more documents (1..max_uses), counted as used; a new one when
        the current is too old or too full."""
        now = self._clock()
        with self._lock:
            e = self._epochs.get(ids)
            if e is not None and now - e.created < self.max_age and e.uses + uses <= self.max_uses:
                e.uses += uses
                self._epochs.move_to_end(ids)
                return e
        file_key = os.urandom(FILE_KEY_SIZE)
        wraps = b"".join(_wrap(file_key, r, self.suite) for r in recipients)
        cipher = _epoch_cipher(file_key) if self.suite == SUITE_EPOCH_KEY else None
        e = _Epoch(file_key, wraps, cipher, now, uses)
        with self._lock:
            self._epochs[ids] = e
            self._epochs.move_to_end(ids)
            while len(self._epochs) > self.max_entries:
                self._epochs.popitem(last=False)
        return e

    def _seal_epoch(self, e: _Epoch, count: int, app_data: bytes, aad: bytes) -> tuple[bytes, bytes]:
        if e.cipher is not None:
            return _encrypt_v2(e.cipher, e.wraps, count, app_data, aad)
        return _encrypt(e.file_key, e.wraps, count, app_data, aad)

    def seal(self, app_data: bytes, *, recipient_enc_public_keys: Sequence[x25519.X25519PublicKey],
             aad: bytes) -> tuple[bytes, bytes]:
        """Like the module function ``seal`` (same format, same errors)."""
        recipients = _recipients(recipient_enc_public_keys)
        return self._seal_epoch(self._epoch(recipients), len(recipients), app_data, aad)

    def _seal_certs(self, app_data: bytes, certs: Sequence[NodeCertificate],
                    aad: bytes) -> tuple[bytes, bytes]:
        """``seal`` to the encryption keys of ``certs``, with the key ids the
        certificates already hold (what ``_recipients`` and ``_epoch`` would
        hash again per document). Same bytes, same errors."""
        return self._seal_certs_many(certs, [(app_data, aad)])[0]

    def _seal_certs_many(self, certs: Sequence[NodeCertificate],
                         docs: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``_seal_certs`` for many ``(app_data, aad)`` to the same ``certs``:
        the recipients are worked out and the epoch taken once per
        ``max_uses`` documents, not once per document."""
        seen: dict[bytes, x25519.X25519PublicKey] = {}
        for c in certs:
            k = c.encryption_public_key
            if not isinstance(k, x25519.X25519PublicKey):
                raise TypeError(
                    f"recipient key must be an X25519PublicKey, not {type(k).__name__}")
            seen.setdefault(c.encryption_key_id, k)
        count = len(seen)
        _check_count(count)
        recipients = list(seen.values())
        ids = tuple(sorted(seen))
        out: list[tuple[bytes, bytes]] = []
        for i in range(0, len(docs), self.max_uses):
            chunk = docs[i:i + self.max_uses]
            e = self._epoch_ids(ids, recipients, len(chunk))
            if e.cipher is not None:
                cipher, wraps = e.cipher, e.wraps
                rnd = os.urandom(SALT_SIZE * len(chunk))  # one read for the batch: independent salts
                out.extend([_encrypt_v2(cipher, wraps, count, app_data, aad, rnd[j:j + SALT_SIZE])
                            for j, (app_data, aad) in zip(range(0, len(rnd), SALT_SIZE), chunk, strict=True)])
            else:
                out.extend([_encrypt(e.file_key, e.wraps, count, app_data, aad) for app_data, aad in chunk])
        return out

    def clear(self) -> None:
        """Forget every epoch: the next document to each recipient set starts a new one."""
        with self._lock:
            self._epochs.clear()


class Opener:
    """``open_`` for one node's keys, remembering up to ``cache_size``
    unwrapped file keys (and, for suite 2, their content cipher) by the exact
    bytes of the blob's suite and wraps, so documents of one sender epoch cost
    one X25519 in total. The cache only memoizes a check that passed (same
    wrap bytes, same key, same result); the content AEAD still runs per
    document. Thread-safe."""

    def __init__(self, recipient_enc_private_keys: Sequence[x25519.X25519PrivateKey], *,
                 cache_size: int = 4096) -> None:
        self._keys = _key_map(recipient_enc_private_keys)
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, bytes | AESGCM] = OrderedDict()

    @property
    def key_ids(self) -> list[bytes]:
        return list(self._keys)

    def open(self, session_key_blob: bytes, ciphertext: bytes, *, aad: bytes) -> bytes:
        """Like the module function ``open_`` (same errors)."""
        blob = bytes(session_key_blob)
        n = len(blob)
        # A well-formed blob (what _parse_blob accepts) whose suite and wraps
        # (all of them, exact bytes) we unwrapped before: same wraps, same
        # keys, same file key. Anything else takes the full path below.
        if n > BLOB_HEADER_SIZE and blob[:4] == BLOB_MAGIC and blob[4] in SUITES:
            count = blob[BLOB_HEADER_SIZE - 1]
            if 0 < count <= MAX_RECIPIENT_KEYS and n == BLOB_HEADER_SIZE + count * WRAP_SIZE:
                cache_key = blob[4:5] + blob[BLOB_HEADER_SIZE:]
                with self._lock:
                    got = self._cache.get(cache_key)
                    if got is not None:
                        self._cache.move_to_end(cache_key)
                if isinstance(got, AESGCM):
                    return _decrypt_v2(got, blob, ciphertext, aad)
                if got is not None:
                    return _decrypt(got, blob[5:5 + SALT_SIZE], blob, ciphertext, aad)
        salt, wraps = _parse_blob(blob)
        entry, priv = _select(wraps, self._keys)
        suite = blob[4]
        file_key = _unwrap(entry, priv, suite)
        value: bytes | AESGCM = _epoch_cipher(file_key) if suite == SUITE_EPOCH_KEY else file_key
        with self._lock:
            self._cache[blob[4:5] + blob[BLOB_HEADER_SIZE:]] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if isinstance(value, AESGCM):
            return _decrypt_v2(value, blob, ciphertext, aad)
        return _decrypt(file_key, salt, blob, ciphertext, aad)
