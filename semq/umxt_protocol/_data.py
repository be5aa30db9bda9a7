"""DATA: the document frame (SPEC "UMX-T frames" and "Identifiers": its
attributes, LK0, LK1, AppKey; docs/protocol.md "DATA (kind 1)").

The ``Data`` body value, its encoder and its decoder, and ``encode_data``,
the origin's direct encoder of a whole DATA frame from a stored row. Both
directions are hot: every document is encoded once at its origin and decoded
at the platform (header and prefix only) and at its target, so they are
hand-written ``struct`` code, tested byte for byte against the construct
schema (tests/protocol/test_protocol_roundtrip.py, tests/protocol/test_protocol_fastpath.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import semq.umxt_protocol._codec as _codec  # the module: its layouts are bound by assignment below

from ._codec import (
    _DATA_PREFIX_SIZE,
    _NO_APP_KEY,
    _ak,
    _lk0_wire,
    _lk1_wire,
    _new,
    _read_app_key,
    _slot_setters,
    crc32,
)
from ._errors import RemoteProtocolError, ResultCode
from ._limits import (
    _MAX_MS,
    _MAX_U32,
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_ENVELOPE,
    FLAG_KEY_SEALED,
    FLAG_LARGE,
    FLAG_ORDERED,
    FLAG_RELIABLE,
    MAX_SESSION_KEY,
    _check_bytes,
    _check_int,
)
from ._schema import MAGIC, VERSION
from ._types import LK0, LK1, AppKey, Endpoint, _invalid

__all__ = ["Data", "encode_data"]

# Bound by assignment, not imported: see _codec, above its layouts.
_CRC: Final = _codec._CRC
_DATA_PREFIX: Final = _codec._DATA_PREFIX
_HEADER: Final = _codec._HEADER
_U8: Final = _codec._U8
_U16: Final = _codec._U16
_U32: Final = _codec._U32


@dataclass(frozen=True, kw_only=True, slots=True)
class Data:
    """A document (kind DATA). ``lk0`` names it at its origin; ``lk1`` is set
    by the platform on stored copies it delivers; times are ms since the epoch;
    ``expires_ms`` None means never. ``encrypt`` says AppData is sealed with a
    session key, wrapped for the receiver in ``session_key``; ``key_sealed``
    that the AppKey is inside the sealed AppData (the header's is empty);
    ``envelope`` that AppData begins with the document's envelope (users,
    ordered channel: semq.node.envelope), ``ordered`` that it belongs to an
    ordered channel (the relay keeps a channel in one unit of its target),
    ``large`` that AppData is a large document's manifest (semq.node.large)
    whose content follows in CHUNK frames under the same LK0."""

    lk0: LK0
    app_data: bytes = b""
    app_key: AppKey = _NO_APP_KEY
    lk1: LK1 | None = None
    created_ms: int = 0
    expires_ms: int | None = None
    encrypt: bool = False
    session_key: bytes = b""
    key_sealed: bool = False
    envelope: bool = False
    ordered: bool = False
    large: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lk0, LK0):
            raise _invalid(f"DATA lk0 must be an LK0, not {self.lk0!r}")
        _check_int("created_ms", self.created_ms, 0, _MAX_MS)
        if self.expires_ms is not None:
            _check_int("expires_ms", self.expires_ms, 1, _MAX_MS)
        _check_bytes("app_data", self.app_data, _MAX_U32)
        _check_bytes("session_key", self.session_key, MAX_SESSION_KEY)
        if self.encrypt and not self.session_key:
            raise _invalid("Encrypt=1 but the session key is empty")
        if not self.encrypt and self.session_key:
            raise _invalid(f"Encrypt=0 but a {len(self.session_key)}-byte session key is set")
        if self.key_sealed and (not self.encrypt or self.app_key != _NO_APP_KEY):
            raise _invalid("a sealed AppKey needs Encrypt=1 and an empty AppKey in the header")


def _encode_data(d: Data) -> bytes:
    lk0, lk1 = d.lk0, d.lk1
    prefix = _DATA_PREFIX.pack(
        lk0.semq_id, lk0.semq_db_id, lk0.record_id,
        lk1.semq_id if lk1 else 0, lk1.semq_db_id if lk1 else 0, lk1.record_id if lk1 else 0,
        d.created_ms, d.expires_ms or 0,
    )
    return b"".join(
        (prefix, _ak(d.app_key), _U16.pack(len(d.session_key)), d.session_key,
         _U32.pack(len(d.app_data)), d.app_data)
    )


def encode_data(
    *,
    source: Endpoint,
    target: Endpoint,
    record_id: int,
    app_key: tuple[str, str, str, str] = ("", "", "", ""),
    created_ms: int = 0,
    expires_ms: int | None = None,
    save_fwd: int = 3,
    ack2: bool = False,
    reliable: bool = True,
    priority: int = 0,
    session_key: bytes = b"",
    app_data: bytes = b"",
    semq_id: int = 1,
    semq_db_id: int = 1,
    key_sealed: bool = False,
    envelope: bool = False,
    ordered: bool = False,
    large: bool = False,
) -> bytes:
    """Exactly ``encode_frame(Frame(kind=DATA, source=..., body=Data(lk0=LK0(
    endpoint=source, ...))))``, without building the values: the origin's
    send path encodes rows it validated when it accepted them (NodeCore.accept
    builds the Frame once), so re-validating per send would only cost time.
    ``source`` is also the origin. Encrypt=1 iff ``session_key``;
    ``key_sealed``: the AppKey is inside AppData (``app_key`` is then empty);
    ``envelope``: AppData begins with the document's envelope (FLAG_ENVELOPE);
    ``ordered``: it belongs to an ordered channel (FLAG_ORDERED);
    ``large``: AppData is a large document's manifest (FLAG_LARGE)."""
    parts = [_DATA_PREFIX.pack(semq_id, semq_db_id, record_id, 0, 0, 0, created_ms, expires_ms or 0)]
    for s in app_key:
        b = s.encode("utf-8")
        parts.append(_U8.pack(len(b)))
        parts.append(b)
    parts += (_U16.pack(len(session_key)), session_key, _U32.pack(len(app_data)), app_data)
    body = b"".join(parts)
    src = source.node_id.encode("ascii")
    dst = target.node_id.encode("ascii")
    flags = ((FLAG_RELIABLE if reliable else 0) | (FLAG_ACK2 if ack2 else 0) | (FLAG_ENCRYPT if session_key else 0)
             | (FLAG_KEY_SEALED if key_sealed else 0) | (FLAG_ENVELOPE if envelope else 0)
             | (FLAG_ORDERED if ordered else 0) | (FLAG_LARGE if large else 0))
    head = _HEADER.pack(
        MAGIC, VERSION, 1, flags, save_fwd, priority, source.node_type, target.node_type, source.node_type,
        len(src), len(dst), len(src), 0, len(body),
    )
    out = b"".join((head, src, dst, src, body))
    return out + _CRC.pack(crc32(out))


_DATA_SET: Final = _slot_setters(
    Data, "lk0", "app_data", "app_key", "lk1", "created_ms", "expires_ms", "encrypt", "session_key", "key_sealed",
    "envelope", "ordered", "large",
)


def _decode_data(buf: bytes, origin: Endpoint, encrypt: bool, key_sealed: bool = False,
                 envelope: bool = False, ordered: bool = False, large: bool = False) -> Data:
    if len(buf) < _DATA_PREFIX_SIZE + 4 + 2 + 4:
        raise RemoteProtocolError(f"DATA body of {len(buf)} bytes is too short", ResultCode.MALFORMED_FRAME)
    semq, db, rec, l1s, l1d, l1r, created, expires = _DATA_PREFIX.unpack_from(buf)
    app_key, pos = _read_app_key(buf, _DATA_PREFIX_SIZE)
    (sk_len,) = _U16.unpack_from(buf, pos)
    pos += 2
    session_key = buf[pos : pos + sk_len]
    pos += sk_len
    if pos + 4 > len(buf):
        raise RemoteProtocolError("DATA session key runs past the body", ResultCode.MALFORMED_FRAME)
    (ad_len,) = _U32.unpack_from(buf, pos)
    pos += 4
    if pos + ad_len != len(buf):
        raise RemoteProtocolError(
            f"DATA AppData declares {ad_len} bytes but {len(buf) - pos} remain",
            ResultCode.MALFORMED_FRAME,
        )
    lk0 = _lk0_wire(origin, semq, db, rec)
    lk1 = _lk1_wire(l1s, l1d, l1r) if l1r else None
    # What Data.__post_init__ checks that the layout leaves open: times above
    # the signed range, a session key over the limit, Encrypt vs the key.
    if not (created <= _MAX_MS and expires <= _MAX_MS and sk_len <= MAX_SESSION_KEY
            and encrypt == (sk_len > 0) and (not key_sealed or (encrypt and app_key == _NO_APP_KEY))):
        return Data(lk0=lk0, lk1=lk1, created_ms=created, expires_ms=expires or None,  # raises
                    app_key=app_key, encrypt=encrypt, session_key=session_key, app_data=buf[pos:],
                    key_sealed=key_sealed, envelope=envelope, ordered=ordered, large=large)
    d = _new(Data)
    s = _DATA_SET
    s[0](d, lk0)
    s[1](d, buf[pos:])
    s[2](d, app_key)
    s[3](d, lk1)
    s[4](d, created)
    s[5](d, expires or None)
    s[6](d, encrypt)
    s[7](d, session_key)
    s[8](d, key_sealed)
    s[9](d, envelope)
    s[10](d, ordered)
    s[11](d, large)
    return d

