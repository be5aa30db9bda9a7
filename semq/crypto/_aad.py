"""The associated data of a document: the header fields that name it.

Both the AEAD of a sealed document and the origin's signature cover these
bytes, so the relay can neither move a ciphertext to another LK0, source or
target, nor change its AppKey or SaveFwd, without the receiver noticing
(DecryptError / BadSignature). Replay of the same frame is caught by the
receiver's duplicate suppression on LK0, which the relay cannot change.

Layout (docs/security.md, "Associated data"), all big-endian::

    "SEMQ-AAD-v1" 0x00            12 bytes, domain separation
    LK0     node_type u8, id_len u8, id (ASCII), semq_id u16, semq_db_id u16, record_id u64
    source  node_type u8, id_len u8, id      -- the application origin, not the relay
    target  node_type u8, id_len u8, id
    AppKey  4 x (len u8, UTF-8)              -- domain, data_type, subtype, key
    SaveFwd u8
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from semq.umxt_protocol import LK0, AppKey, Data, Endpoint, Frame, Kind, RawFrame, SaveFwd

from ._wire import _LK0_TAIL, U8, Reader, WireError, encode_app_key, encode_endpoint, encode_lk0

__all__ = [
    "AAD_PREFIX",
    "DocumentHeader",
    "aad_source_id",
    "document_aad",
    "document_aad_fields",
    "document_aad_template",
    "frame_aad",
    "parse_document_aad",
    "raw_frame_aad",
]

AAD_PREFIX: Final = b"SEMQ-AAD-v1\x00"
_SAVE_FWD: Final = {int(v): bytes((int(v),)) for v in SaveFwd}


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentHeader:
    """The fields ``document_aad`` binds, as parsed back from the bytes."""

    lk0: LK0
    source: Endpoint
    target: Endpoint
    app_key: AppKey
    save_fwd: SaveFwd


def document_aad(lk0: LK0, source: Endpoint, target: Endpoint, app_key: AppKey,
                 save_fwd: SaveFwd | int) -> bytes:
    """The associated data for the document ``lk0`` sent by ``source`` (the
    application-level origin: ``Frame.origin``, never the relaying platform)
    to ``target``. Deterministic: origin and receiver compute it from the
    same header fields and get the same bytes."""
    try:
        sf = _SAVE_FWD.get(save_fwd)
    except TypeError:  # unhashable: SaveFwd() words the error
        sf = None
    if sf is None:
        sf = bytes((int(SaveFwd(save_fwd)),))  # ValueError unless 0..3
    return b"".join((
        AAD_PREFIX,
        encode_lk0(lk0),
        encode_endpoint(source),
        encode_endpoint(target),
        encode_app_key(app_key),
        sf,
    ))


def document_aad_template(lk0_endpoint: Endpoint, source: Endpoint, target: Endpoint, domain: str,
                          data_type: str, subtype: str, key: str, save_fwd: int) -> Callable[[int, int, int], bytes]:
    """``document_aad_fields`` with all but the LK0's three ids fixed: a
    function of (semq_id, semq_db_id, record_id) giving the same bytes. The
    documents an origin claims for one target under one AppKey differ only
    in those 12 bytes, so a batch builds the rest once (~0.3 us a document
    instead of ~1.1). Raises struct.error for a value out of range (the
    returned function too, for its ids)."""
    sf = _SAVE_FWD.get(save_fwd)
    if sf is None:
        sf = bytes((int(SaveFwd(save_fwd)),))
    d, t, st, k = (domain.encode(), data_type.encode(), subtype.encode(), key.encode())
    head = AAD_PREFIX + encode_endpoint(lk0_endpoint)
    tail = b"".join((
        encode_endpoint(source), encode_endpoint(target),
        U8.pack(len(d)), d, U8.pack(len(t)), t, U8.pack(len(st)), st, U8.pack(len(k)), k, sf,
    ))
    pack = _LK0_TAIL.pack

    def aad(semq_id: int, semq_db_id: int, record_id: int) -> bytes:
        return head + pack(semq_id, semq_db_id, record_id) + tail

    return aad


def document_aad_fields(lk0_endpoint: Endpoint, semq_id: int, semq_db_id: int, record_id: int,
                        source: Endpoint, target: Endpoint, domain: str, data_type: str,
                        subtype: str, key: str, save_fwd: int) -> bytes:
    """``document_aad`` from the fields themselves (the same bytes): what an
    origin claiming a batch of rows computes per document, without building
    an LK0 and an AppKey for each (their validation happened when the
    document was accepted). Raises struct.error for a value out of range."""
    return document_aad_template(lk0_endpoint, source, target, domain, data_type, subtype, key,
                                 save_fwd)(semq_id, semq_db_id, record_id)


def frame_aad(frame: Frame) -> bytes:
    """``document_aad`` of a DATA frame, from its header: LK0 and AppKey from
    the body, ``origin`` (not the transport ``source``), target, SaveFwd.
    Raises TypeError for a frame that is not DATA."""
    body = frame.body
    if not isinstance(body, Data):
        raise TypeError(f"{frame.kind.name} frame carries no document; only DATA has an AAD")
    return document_aad(body.lk0, frame.origin, frame.target, body.app_key, frame.save_fwd)


_LK0_WIRE: Final = 12  # semq_id u16, semq_db_id u16, record_id u64: the DATA prefix's first bytes
_APP_KEY_AT: Final = 40  # the DATA body's AppKey, after its fixed prefix


def raw_frame_aad(raw: RawFrame) -> bytes:
    """``frame_aad`` of a decoded DATA frame, assembled from its bytes: the
    LK0 tail is the first 12 bytes of the DATA prefix and the body's AppKey
    has the AAD's encoding (four u8-prefixed parts). The same bytes as
    ``frame_aad(raw.frame())`` (property-tested) without building them from
    the parsed values — a receiver computes one per document. The frame
    must have been checked (``raw.frame()`` did not raise)."""
    if raw.kind is not Kind.DATA:
        raise TypeError(f"{raw.kind.name} frame carries no document; only DATA has an AAD")
    b, at = raw.raw, raw._body_start
    end = pos = at + _APP_KEY_AT
    for _ in range(4):
        end += 1 + b[end]
    origin = encode_endpoint(raw.origin)
    return b"".join((AAD_PREFIX, origin, b[at:at + _LK0_WIRE], origin, encode_endpoint(raw.target),
                     b[pos:end], _SAVE_FWD[raw.save_fwd]))


def parse_document_aad(aad: bytes) -> DocumentHeader:
    """Parse bytes made by ``document_aad``. Raises ValueError (WireError) if
    they were not."""
    if not aad.startswith(AAD_PREFIX):
        raise WireError("associated data does not start with SEMQ-AAD-v1")
    r = Reader(aad, len(AAD_PREFIX))
    lk0 = r.lk0("AAD LK0")
    source = r.endpoint("AAD source")
    target = r.endpoint("AAD target")
    app_key = r.app_key("AAD AppKey")
    sf = r.u8("AAD SaveFwd")
    r.end("associated data")
    try:
        save_fwd = SaveFwd(sf)
    except ValueError:
        raise WireError(f"AAD SaveFwd {sf} is not 0..3") from None
    return DocumentHeader(lk0=lk0, source=source, target=target, app_key=app_key,
                          save_fwd=save_fwd)


_P: Final = len(AAD_PREFIX)


def aad_source_id(aad: bytes) -> str:
    """The source node id in ``aad``, without building the whole header (the
    hot path of signature checks). Raises WireError for bytes that are not
    an AAD; the full check is ``parse_document_aad``."""
    if aad[:_P] != AAD_PREFIX or len(aad) < _P + 2:
        raise WireError("associated data does not start with SEMQ-AAD-v1")
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
