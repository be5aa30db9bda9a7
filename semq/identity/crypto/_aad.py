"""The associated data of a document: the header fields that name it.

Both the AEAD of a sealed document and the origin's signature cover these
bytes, so the relay can neither move a ciphertext to another LK0, source or
target, nor change its AppKey, SaveFwd, Reliable, Ack2, priority, creation
time or expiry, without the receiver noticing (DecryptError /
BadSignature). Only LK1 (the relay's own locator) and the transport source
are the relay's to set. Replay of the same frame is caught by the receiver's
duplicate suppression on LK0, which the relay cannot change, and, past its
retention, by the signed creation time (the receiver refuses it: STALE).

Layout (docs/security.md, "Associated data"), all big-endian::

    "SEMQ-AAD-v2" 0x00            12 bytes, domain separation
    LK0     node_type u8, id_len u8, id (ASCII), semq_id u16, semq_db_id u16, record_id u64
    source  node_type u8, id_len u8, id      -- the application origin, not the relay
    target  node_type u8, id_len u8, id
    AppKey  4 x (len u8, UTF-8)              -- domain, data_type, subtype, key (the header's:
                                                empty when the AppKey is sealed inside AppData)
    SaveFwd u8
    flags   u8                               -- the DATA header's Reliable, Ack2, Encrypt, AppKey sealed
    priority u8
    created_ms u64, expires_ms u64 (0 = none)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from semq.umxt_protocol import LK0, AppKey, Data, Endpoint, Frame, Kind, RawFrame, SaveFwd

from ._wire import _LK0_TAIL, U8, Reader, WireError, encode_app_key, encode_endpoint, encode_lk0

__all__ = [
    "AAD_PREFIX",
    "BOUND_FLAGS",
    "DocumentHeader",
    "aad_source_id",
    "document_aad",
    "document_aad_fields",
    "document_aad_template",
    "frame_aad",
    "parse_document_aad",
    "raw_frame_aad",
]

AAD_PREFIX: Final = b"SEMQ-AAD-v2\x00"
# The first layout (no flags, priority or times), still parsed so that what
# was signed over it can be named in errors; nodes build only v2.
_AAD_V1: Final = b"SEMQ-AAD-v1\x00"
_SAVE_FWD: Final = {int(v): bytes((int(v),)) for v in SaveFwd}
# The header flags a document binds: Reliable, Ack2, Encrypt, AppKey sealed,
# Envelope, Ordered, Large (docs/protocol.md "Flags"; LAYER_MASK is 0 on
# every DATA). A relay that strips Large gets the manifest refused, never
# delivered as a document of its own.
BOUND_FLAGS: Final = 0xFE
_TAIL: Final = struct.Struct(">BBBQQ")  # SaveFwd, flags, priority, created_ms, expires_ms
_TIMES: Final = struct.Struct(">QQ")


def _tail(save_fwd: int, flags: int, priority: int, created_ms: int, expires_ms: int | None) -> bytes:
    try:
        return _TAIL.pack(int(SaveFwd(save_fwd)), flags & BOUND_FLAGS, priority, created_ms, expires_ms or 0)
    except struct.error as e:
        raise ValueError(f"document header out of range: {e}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentHeader:
    """The fields ``document_aad`` binds, as parsed back from the bytes."""

    lk0: LK0
    source: Endpoint
    target: Endpoint
    app_key: AppKey
    save_fwd: SaveFwd
    flags: int = 0
    priority: int = 0
    created_ms: int = 0
    expires_ms: int | None = None


def document_aad(lk0: LK0, source: Endpoint, target: Endpoint, app_key: AppKey,
                 save_fwd: SaveFwd | int, *, flags: int = 0, priority: int = 0, created_ms: int = 0,
                 expires_ms: int | None = None) -> bytes:
    """The associated data for the document ``lk0`` sent by ``source`` (the
    application-level origin: ``Frame.origin``, never the relaying platform)
    to ``target``, with the DATA header's ``flags`` (the bits of
    BOUND_FLAGS count), ``priority``, creation time and expiry.
    Deterministic: origin and receiver compute it from the same header
    fields and get the same bytes. Raises ValueError for a value out of
    range."""
    try:
        sf = int(save_fwd)
    except (TypeError, ValueError):
        sf = int(SaveFwd(save_fwd))  # words the error
    return b"".join((
        AAD_PREFIX,
        encode_lk0(lk0),
        encode_endpoint(source),
        encode_endpoint(target),
        encode_app_key(app_key),
        _tail(sf, flags, priority, created_ms, expires_ms),
    ))


def document_aad_template(lk0_endpoint: Endpoint, source: Endpoint, target: Endpoint, domain: str,
                          data_type: str, subtype: str, key: str, save_fwd: int, flags: int,
                          priority: int) -> Callable[[int, int, int, int, int | None], bytes]:
    """``document_aad_fields`` with all but the LK0's three ids and the two
    times fixed: a function of (semq_id, semq_db_id, record_id, created_ms,
    expires_ms) giving the same bytes. The documents an origin claims for
    one target under one AppKey differ only in those, so a batch builds the
    rest once (~0.3 us a document instead of ~1.1). Raises ValueError for a
    value out of range (the returned function struct.error, for its own)."""
    sf = _SAVE_FWD.get(save_fwd)
    if sf is None:
        sf = bytes((int(SaveFwd(save_fwd)),))
    d, t, st, k = (domain.encode(), data_type.encode(), subtype.encode(), key.encode())
    head = AAD_PREFIX + encode_endpoint(lk0_endpoint)
    mid = b"".join((
        encode_endpoint(source), encode_endpoint(target),
        U8.pack(len(d)), d, U8.pack(len(t)), t, U8.pack(len(st)), st, U8.pack(len(k)), k, sf,
        bytes((flags & BOUND_FLAGS, priority)),
    ))
    pack, times = _LK0_TAIL.pack, _TIMES.pack

    def aad(semq_id: int, semq_db_id: int, record_id: int, created_ms: int, expires_ms: int | None) -> bytes:
        return head + pack(semq_id, semq_db_id, record_id) + mid + times(created_ms, expires_ms or 0)

    return aad


def document_aad_fields(lk0_endpoint: Endpoint, semq_id: int, semq_db_id: int, record_id: int,
                        source: Endpoint, target: Endpoint, domain: str, data_type: str,
                        subtype: str, key: str, save_fwd: int, flags: int, priority: int,
                        created_ms: int, expires_ms: int | None) -> bytes:
    """``document_aad`` from the fields themselves (the same bytes): what an
    origin claiming a batch of rows computes per document, without building
    an LK0 and an AppKey for each (their validation happened when the
    document was accepted). Raises ValueError / struct.error for a value
    out of range."""
    return document_aad_template(lk0_endpoint, source, target, domain, data_type, subtype, key,
                                 save_fwd, flags, priority)(semq_id, semq_db_id, record_id, created_ms,
                                                            expires_ms)


def frame_aad(frame: Frame) -> bytes:
    """``document_aad`` of a DATA frame, from its header: LK0, AppKey and
    times from the body, ``origin`` (not the transport ``source``), target,
    SaveFwd, flags and priority. Raises TypeError for a frame that is not
    DATA."""
    body = frame.body
    if not isinstance(body, Data):
        raise TypeError(f"{frame.kind.name} frame carries no document; only DATA has an AAD")
    return document_aad(body.lk0, frame.origin, frame.target, body.app_key, frame.save_fwd,
                        flags=frame.flags, priority=frame.priority, created_ms=body.created_ms,
                        expires_ms=body.expires_ms)




def raw_frame_aad(raw: RawFrame) -> bytes:
    """``frame_aad`` of a decoded DATA frame, assembled from its bytes
    (``RawFrame.aad_parts``: the LK0's ids, the times and the header's
    AppKey have the AAD's encoding). The same bytes as ``frame_aad(raw.frame())`` (property-tested)
    without building them from the parsed values — a receiver computes one
    per document. The frame must have been checked (``raw.frame()`` did not
    raise)."""
    if raw.kind is not Kind.DATA:
        raise TypeError(f"{raw.kind.name} frame carries no document; only DATA has an AAD")
    ids, app_key, times = raw.aad_parts()
    origin = encode_endpoint(raw.origin)
    return b"".join((AAD_PREFIX, origin, ids, origin, encode_endpoint(raw.target), app_key,
                     bytes((raw.save_fwd, raw.flags & BOUND_FLAGS, raw.priority)), times))


def parse_document_aad(aad: bytes) -> DocumentHeader:
    """Parse bytes made by ``document_aad`` (or by the first layout, v1,
    which has no flags, priority or times). Raises ValueError (WireError) if
    they were not."""
    v1 = aad.startswith(_AAD_V1)
    if not v1 and not aad.startswith(AAD_PREFIX):
        raise WireError("associated data does not start with SEMQ-AAD-v2")
    r = Reader(aad, len(AAD_PREFIX))
    lk0 = r.lk0("AAD LK0")
    source = r.endpoint("AAD source")
    target = r.endpoint("AAD target")
    app_key = r.app_key("AAD AppKey")
    sf = r.u8("AAD SaveFwd")
    flags = priority = created = expires = 0
    if not v1:
        flags = r.u8("AAD flags")
        priority = r.u8("AAD priority")
        created = r.u64("AAD created_ms")
        expires = r.u64("AAD expires_ms")
    r.end("associated data")
    try:
        save_fwd = SaveFwd(sf)
    except ValueError:
        raise WireError(f"AAD SaveFwd {sf} is not 0..3") from None
    return DocumentHeader(lk0=lk0, source=source, target=target, app_key=app_key, save_fwd=save_fwd,
                          flags=flags, priority=priority, created_ms=created, expires_ms=expires or None)


_P: Final = len(AAD_PREFIX)


def aad_source_id(aad: bytes) -> str:
    """The source node id in ``aad``, without building the whole header (the
    hot path of signature checks). Raises WireError for bytes that are not
    an AAD; the full check is ``parse_document_aad``."""
    if (aad[:_P] != AAD_PREFIX and aad[:_P] != _AAD_V1) or len(aad) < _P + 2:
        raise WireError("associated data does not start with SEMQ-AAD-v2")
    src = _P + 2 + aad[_P + 1] + 12  # past LK0: type, len, id, semq u16, db u16, record u64
    if src + 2 > len(aad):
        raise WireError("associated data is too short for a source endpoint")
    end = src + 2 + aad[src + 1]
    if end > len(aad):
        raise WireError("AAD source runs past the end")
    try:
        return aad[src + 2:end].decode("ascii")
    except UnicodeDecodeError:
        raise WireError("AAD source id is not ASCII") from None
