"""The pieces of the wire format that every frame kind shares.

The fixed layouts of _schema.py as plain ``struct`` objects (the header, the
DATA prefix, the 26-byte ack entry; docs/protocol.md "Frame", "Header",
"Bodies"), the CRC32 trailer, the AppKey's four length-prefixed parts (SPEC
"Identifiers"), and the building of values straight off the wire: the
slot-setting construction that the decoders of _data, _acks and _frames use,
explained once below, and the LK0 / LK1 builders other layers' hot paths use
too.
"""

from __future__ import annotations

import struct
from typing import Any, Final

try:
    # ISA-L's CRC32 (zlib's polynomial, the same values) takes 0.1 us on a
    # 1 KiB frame where zlib's takes 0.7, and every frame is checked or
    # made ~4 times between two organizations (docs/profiling.md).
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a declared dependency; zlib's is the same function
    from zlib import crc32

from ._errors import RemoteProtocolError, ResultCode
from ._schema import ACK_ENTRY, DATA_PREFIX, HEADER, flat_struct
from ._types import LK0, LK1, AppKey, Endpoint

__all__ = [
    "HEADER_SIZE",
    "crc32",
    "lk0_from_wire",
    "lk1_from_wire",
    "read_app_key",
]

# A module that calls these objects' methods on a hot path binds them by
# assignment, ``_U8: Final = _codec._U8``, not with ``from ._codec import
# _U8`` (_data, _acks and _frames do): CPython compiles ``name.pack(...)`` on
# a name bound by a module-level import as an attribute load and a call (it
# takes the name for a module's) instead of LOAD_METHOD, and the bound method
# made per call costs encode_data of a 1 KiB document 1.37 -> 1.63 us.
_HEADER: Final = flat_struct(HEADER)
HEADER_SIZE: Final = _HEADER.size
_DATA_PREFIX: Final = flat_struct(DATA_PREFIX)
_ACK_ENTRY: Final = flat_struct(ACK_ENTRY)
_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_CRC: Final = struct.Struct(">I")
_DATA_PREFIX_SIZE: Final = _DATA_PREFIX.size
_ACK_ENTRY_SIZE: Final = _ACK_ENTRY.size


# AppKey is frozen, so one shared empty default is safe (and saves a
# construction per Data/Ack).
_NO_APP_KEY: Final = AppKey()


def _ak(app_key: AppKey) -> bytes:
    parts = []
    for s in (app_key.domain, app_key.data_type, app_key.subtype, app_key.key):
        b = s.encode("utf-8")
        parts.append(_U8.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


# ---------------------------------------------------------------- decoding
#
# Building values on the decode path. The public constructors validate in
# __post_init__; a frozen dataclass's generated __init__ sets every field with
# a generic object.__setattr__ call, which was most of a decode's time. The
# _*_wire builders below create the same values by setting the slots through
# their descriptors, after checking exactly what the wire layout leaves open
# (an unsigned u16 cannot exceed 65535, but it can be 0). When a fast check
# fails they call the public constructor, which raises naming the value and the
# limit, so error messages have one source. tests/protocol/test_protocol_decoder.py
# rebuilds every decoded value through the public constructors to prove the
# two paths accept the same values.

_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    return tuple(getattr(cls, n).__set__ for n in names)


_AK_SET: Final = _slot_setters(AppKey, "domain", "data_type", "subtype", "key")
_LK0_SET: Final = _slot_setters(LK0, "endpoint", "record_id", "semq_id", "semq_db_id")
_LK1_SET: Final = _slot_setters(LK1, "record_id", "semq_id", "semq_db_id")


def _read_app_key(buf: bytes, pos: int) -> tuple[AppKey, int]:
    # The four u8-prefixed parts, unrolled (this runs once per DATA and ack).
    # Indexing past the end raises IndexError, which decode_body reports as
    # MALFORMED_FRAME; slices never fail, so the end is checked once.
    a = pos + 1
    b = a + buf[pos]
    c = b + 1
    d = c + buf[b]
    e = d + 1
    f = e + buf[d]
    g = f + 1
    end = g + buf[f]
    if end > len(buf):
        raise RemoteProtocolError("AppKey runs past the end of the body", ResultCode.MALFORMED_FRAME)
    if end == pos + 4:
        return _NO_APP_KEY, end
    # Nothing to check after decoding: each part is at most 255 bytes (u8
    # length) of valid UTF-8, so a str without surrogates.
    app_key = _new(AppKey)
    s = _AK_SET
    try:
        s[0](app_key, buf[a:b].decode("utf-8"))
        s[1](app_key, buf[c:d].decode("utf-8"))
        s[2](app_key, buf[e:f].decode("utf-8"))
        s[3](app_key, buf[g:end].decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"AppKey is not UTF-8: {exc}", ResultCode.INVALID_FIELD) from exc
    return app_key, end


def read_app_key(buf: bytes, pos: int = 0) -> tuple[AppKey, int]:
    """An AppKey encoded as in the DATA header (four u8-prefixed UTF-8
    parts) at ``pos`` in ``buf``, and the position after it: how a receiver
    reads the AppKey that travelled sealed inside a document. Raises
    RemoteProtocolError (or IndexError for bytes that end inside a length)."""
    return _read_app_key(buf, pos)


def _lk0_wire(endpoint: Endpoint, semq: int, db: int, rec: int) -> LK0:
    # u16/u64 off the wire cannot exceed their maxima; only 0 is out of range.
    if not (semq and db and rec):
        return LK0(endpoint=endpoint, semq_id=semq, semq_db_id=db, record_id=rec)  # raises
    lk0 = _new(LK0)
    s = _LK0_SET
    s[0](lk0, endpoint)
    s[1](lk0, rec)
    s[2](lk0, semq)
    s[3](lk0, db)
    return lk0


# Public for other layers' hot paths (e.g. receipt manifests built from ACK
# entries): an LK0 of values decoded off the wire, where only zero can be out
# of range (and LK0's own validation refuses it).
lk0_from_wire = _lk0_wire


def _lk1_wire(semq: int, db: int, rec: int) -> LK1:
    if not (semq and db and rec):  # (off the wire rec is non-zero: zero means "no LK1")
        return LK1(semq_id=semq, semq_db_id=db, record_id=rec)  # raises
    lk1 = _new(LK1)
    s = _LK1_SET
    s[0](lk1, rec)
    s[1](lk1, semq)
    s[2](lk1, db)
    return lk1


# Public like lk0_from_wire: an LK1 of values that can only be out of range
# by being zero (a platform's delivery names its stored row by id).
lk1_from_wire = _lk1_wire
