"""Sign-then-seal in one call: what a node does to a document before it goes
into the pending-send table, and what the receiver does before the inbox.

    origin:   body --sign_document--> container --seal--> (session_key, app_data)
    receiver: (session_key, app_data) --open_--> container --verify_document--> body

The signature covers the AAD, so a receiver that re-seals a document to a
third party cannot pass it off as sent to that party (the target inside the
signed digest still names the first receiver).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from semq.umxt_protocol import AppKey, ProtocolError, read_app_key

from ._envelope import Opener, Sealer, open_, seal
from ._errors import BadSignature, CryptoError, DecryptError
from ._pki import NodeCertificate
from ._signing import (
    SignatureCache,
    SignedDocument,
    VerifiedDocument,
    _sign_many,
    _verify,
    _verify_batches,
    sign_document,
)

__all__ = [
    "ProtectedDocument",
    "enclose_app_key",
    "open_document",
    "open_documents",
    "protect_document",
    "protect_documents",
    "split_app_key",
]


class ProtectedDocument(NamedTuple):
    """What goes into a DATA frame (``app_data``, ``session_key``; Encrypt=1
    iff ``session_key``) and what the origin keeps (``digest``). A named
    tuple: an origin makes one per document it sends."""

    app_data: bytes
    session_key: bytes
    digest: bytes

    @property
    def encrypt(self) -> bool:
        return bool(self.session_key)


def enclose_app_key(domain: str, data_type: str, subtype: str, key: str, body: bytes) -> bytes:
    """The body a document is signed and sealed with when its AppKey travels
    inside it (DATA flag "AppKey sealed"): the four parts, each u8 length +
    UTF-8 (as in the DATA header), then the application's document. The
    relay routes without the AppKey; only the two organizations read it.
    The parts are at most 255 bytes each (AppKey checks it when a document
    is accepted; IndexError otherwise)."""
    d, t, s, k = domain.encode(), data_type.encode(), subtype.encode(), key.encode()
    n = _BYTE
    return b"".join((n[len(d)], d, n[len(t)], t, n[len(s)], s, n[len(k)], k, body))


_BYTE: Final = tuple(bytes((i,)) for i in range(256))


def split_app_key(body: bytes) -> tuple[AppKey, bytes]:
    """The AppKey and the document of a body made by ``enclose_app_key``
    (after it verified). Raises BadSignature for bytes that are not: the
    origin signed something else than its header says."""
    try:
        app_key, pos = read_app_key(body, 0)
    except (IndexError, ProtocolError) as e:
        raise BadSignature(f"the sealed AppKey of the document is malformed: {e}") from None
    return app_key, body[pos:]


def _seal(signed: SignedDocument, aad: bytes, recipients: Sequence[NodeCertificate] | None,
          sealer: Sealer | None) -> ProtectedDocument:
    if recipients is None:
        return ProtectedDocument(signed.container, b"", signed.digest)
    if sealer is not None:
        blob, ct = sealer._seal_certs(signed.container, recipients, aad)
    else:
        keys = [c.encryption_public_key for c in recipients]
        blob, ct = seal(signed.container, recipient_enc_public_keys=keys, aad=aad)
    return ProtectedDocument(ct, blob, signed.digest)


def protect_document(
    body: bytes,
    *,
    aad: bytes,
    signing_key: ed25519.Ed25519PrivateKey,
    recipients: Sequence[NodeCertificate] | None,
    sealer: Sealer | None = None,
) -> ProtectedDocument:
    """Sign ``body`` and seal it to every certificate in ``recipients`` (the
    target's CertificateDirectory.lookup: old and new during a rollover).
    ``recipients=None`` means --no-encrypt: signed, **not end-to-end
    private** (the relay can read it). ``sealer`` amortizes key wrapping.
    Raises ValueError for an empty or too long recipient list."""
    signed = sign_document(body, aad=aad, signing_key=signing_key)
    return _seal(signed, aad, recipients, sealer)


def protect_documents(
    items: Sequence[tuple[bytes, bytes, Sequence[NodeCertificate] | None]],
    *,
    signing_key: ed25519.Ed25519PrivateKey,
    sealer: Sealer | None = None,
    salts: Sequence[bytes] | None = None,
) -> list[ProtectedDocument]:
    """``protect_document`` for many ``(aad, body, recipients)`` at once with
    one batch signature (sign_documents); each result still verifies alone.
    Documents to the same recipients (the same sequence object: a node looks
    the target's certificates up once per batch) are sealed together.
    ``salts``: as sign_documents."""
    signed = _sign_many([(aad, body) for aad, body, _ in items], signing_key, salts)
    out = [ProtectedDocument(c, b"", d) for c, d in signed]
    groups: dict[int, list[int]] = {}
    for i, (aad, _, recipients) in enumerate(items):
        if recipients is None:
            continue
        if sealer is None:
            out[i] = _seal(SignedDocument(*signed[i]), aad, recipients, None)
        else:
            groups.setdefault(id(recipients), []).append(i)
    for idx in groups.values():
        recipients = items[idx[0]][2]
        assert recipients is not None and sealer is not None
        sealed = sealer._seal_certs_many(recipients, [(signed[i][0], items[i][0]) for i in idx])
        for i, (blob, ct) in zip(idx, sealed, strict=True):
            out[i] = ProtectedDocument(ct, blob, signed[i][1])
    return out


def open_document(
    app_data: bytes,
    session_key: bytes,
    *,
    aad: bytes,
    keys: Opener | Sequence[x25519.X25519PrivateKey],
    signer_certs: Sequence[NodeCertificate],
    cache: SignatureCache | None = None,
    require_encryption: bool = False,
) -> VerifiedDocument:
    """Open (if ``session_key`` is set) and verify a document; return its body
    with ``encrypted`` telling whether it came sealed. ``keys``: an Opener or
    our X25519 private keys; ``signer_certs``: the origin's certificates.
    Raises DecryptError (DECRYPT_FAILED) — also for a plaintext document when
    ``require_encryption`` — BadSignature (BAD_SIGNATURE) or
    UnknownCertificate (UNKNOWN_CERTIFICATE); nothing may reach the inbox then."""
    container = _container(app_data, session_key, aad, keys, require_encryption)
    return _verify(container, aad, signer_certs, cache, bool(session_key))


def _container(app_data: bytes, session_key: bytes, aad: bytes,
               keys: Opener | Sequence[x25519.X25519PrivateKey], require_encryption: bool) -> bytes:
    """The signed container inside a document: opened if sealed. Raises
    DecryptError."""
    if session_key:
        if isinstance(keys, Opener):
            return keys.open(session_key, app_data, aad=aad)
        return open_(session_key, app_data, recipient_enc_private_keys=keys, aad=aad)
    if require_encryption:
        raise DecryptError("document arrived unencrypted (Encrypt=0) but this node requires"
                           " end-to-end encryption")
    return bytes(app_data)


def open_documents(
    items: Sequence[tuple[bytes, bytes, bytes, Sequence[NodeCertificate]]],
    *,
    keys: Opener | Sequence[x25519.X25519PrivateKey],
    cache: SignatureCache | None = None,
    require_encryption: bool = False,
) -> list[VerifiedDocument | CryptoError]:
    """``open_document`` for many ``(app_data, session_key, aad,
    signer_certs)`` at once, e.g. the DATA of one received batch. Returns,
    in order, what ``open_document`` returns for each or the CryptoError it
    raises (the same class and words). The documents of one batch signature
    at hand, all of the batch or a part, are checked together
    (``_verify_batches``: each node of the signed tree hashed once, one
    signature check) instead of a walk up every path; any other document,
    or any that does not check out that way, is checked on its own."""
    out: list[VerifiedDocument | CryptoError | None] = [None] * len(items)
    opened: list[tuple[int, bytes, bytes, Sequence[NodeCertificate], bool]] = []
    for pos, (app_data, session_key, aad, signer_certs) in enumerate(items):
        try:
            container = _container(app_data, session_key, aad, keys, require_encryption)
        except CryptoError as e:
            out[pos] = e
            continue
        opened.append((pos, container, aad, signer_certs, bool(session_key)))
    done = _verify_batches(opened, cache)
    for pos, container, aad, signer_certs, sealed in opened:
        got: VerifiedDocument | CryptoError | None = done.get(pos)
        if got is None:
            try:
                got = _verify(container, aad, signer_certs, cache, sealed)
            except CryptoError as e:
                got = e
        out[pos] = got
    return out  # type: ignore[return-value]  # (every position set above)
