"""The normative byte layout of UMX-T version 1, as construct schemas.

Every frame is::

    HEADER (18 bytes) | source id | target id | origin id | body | CRC32 (4 bytes)

The fixed HEADER carries everything a relay routes by (kind, flags, SaveFwd,
priority, the three endpoint types and the id and body lengths); the body's
layout depends on the kind. CRC32 (zlib) covers every byte before it.

The schemas here are the single definition of the format (docs/protocol.md is
written from them). The fixed-width ones are also turned into ``struct.Struct``
objects by ``flat_struct`` so the hot paths (header, DATA prefix, ACK_BATCH
entries) run at ``struct`` speed without a second hand-kept layout; the tests
check the fast codecs against the construct schemas byte for byte.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from construct import (
    Array,
    Bytes,
    Const,
    Construct,
    FormatField,
    GreedyBytes,
    Int8ub,
    Int16ub,
    Int32ub,
    Int64ub,
    PascalString,
    Prefixed,
    Renamed,
    Struct,
    Terminated,
    this,
)

__all__ = [
    "ACK_BATCH_BODY",
    "ACK_BODY",
    "ACK_ENTRY",
    "BODY_SCHEMAS",
    "BYE_BODY",
    "CERT_REQUEST_BODY",
    "CERT_RESPONSE_BODY",
    "CHUNK_ACK_BODY",
    "CHUNK_BODY",
    "CRL_BODY",
    "DATA_BODY",
    "DATA_PREFIX",
    "ERROR_BODY",
    "HEADER",
    "HELLO_BODY",
    "INQUIRY_BODY",
    "INQUIRY_RESP_BODY",
    "MAGIC",
    "NACK_BODY",
    "PEER_ANNOUNCE_BODY",
    "PEER_INFO_BODY",
    "PEER_LOOKUP_BODY",
    "PING_BODY",
    "PRESENCE_BODY",
    "PRESENCE_QUERY_BODY",
    "VERSION",
    "WELCOME_BODY",
    "WINDOW_BODY",
    "flat_struct",
]

MAGIC: Final = b"UX"
VERSION: Final = 1

#: Fixed frame header. ``flags``: bit0 LAYER_MASK (1 = transport packet),
#: bit1 Reliable, bit2 Ack2, bit3 Encrypt, bit4 AppKey sealed, bit5 envelope,
#: bit6 ordered, bit7 large document manifest (_limits.py, docs/protocol.md
#: "Flags").
HEADER = Struct(
    "magic" / Const(MAGIC),
    "version" / Int8ub,
    "kind" / Int8ub,
    "flags" / Int8ub,
    "save_fwd" / Int8ub,
    "priority" / Int8ub,
    "source_type" / Int8ub,
    "target_type" / Int8ub,
    "origin_type" / Int8ub,
    "source_len" / Int8ub,
    "target_len" / Int8ub,
    "origin_len" / Int8ub,
    "reserved" / Int8ub,
    "body_len" / Int32ub,
)

_APP_KEY = (
    "domain" / PascalString(Int8ub, "utf8"),
    "data_type" / PascalString(Int8ub, "utf8"),
    "subtype" / PascalString(Int8ub, "utf8"),
    "key" / PascalString(Int8ub, "utf8"),
)

#: Fixed start of a DATA body: LK0's ids (its endpoint is the frame's origin),
#: LK1 (all zero when absent), creation time and expiry (0 = none), in ms since
#: the Unix epoch. A relay reads this with one unpack and never parses the rest.
DATA_PREFIX = Struct(
    "semq_id" / Int16ub,
    "semq_db_id" / Int16ub,
    "record_id" / Int64ub,
    "lk1_semq_id" / Int16ub,
    "lk1_semq_db_id" / Int16ub,
    "lk1_record_id" / Int64ub,
    "created_ms" / Int64ub,
    "expires_ms" / Int64ub,
)

DATA_BODY = Struct(
    "prefix" / DATA_PREFIX,
    *_APP_KEY,
    "session_key" / Prefixed(Int16ub, GreedyBytes),
    "app_data" / Prefixed(Int32ub, GreedyBytes),
    Terminated,
)

#: The 810 parameters (SPEC "UMX-T frames"): src_* name the record of the side
#: that sends the ack, dest_* the record being acked; ref ids may be 0 (none).
ACK_ENTRY = Struct(
    "src_semq_id" / Int16ub,
    "src_semq_db_id" / Int16ub,
    "src_ref_id" / Int64ub,
    "dest_semq_id" / Int16ub,
    "dest_semq_db_id" / Int16ub,
    "dest_ref_id" / Int64ub,
    "ack_flag" / Int8ub,
    "flag" / Int8ub,
)

ACK_BODY = Struct(
    "entry" / ACK_ENTRY,
    *_APP_KEY,
    "receipt" / Prefixed(Int16ub, GreedyBytes),
    Terminated,
)

ACK_BATCH_BODY = Struct(
    "ack_kind" / Int8ub,
    "count" / Int32ub,
    "entries" / Array(this.count, ACK_ENTRY),
    "receipt" / Prefixed(Int16ub, GreedyBytes),
    Terminated,
)

_LOCATOR = (
    "node_type" / Int8ub,
    "node_id" / PascalString(Int8ub, "ascii"),
    "semq_id" / Int16ub,
    "semq_db_id" / Int16ub,
    "record_id" / Int64ub,
)

INQUIRY_BODY = Struct(
    "flag" / Int8ub,
    "topic" / Int8ub,
    "count" / Int32ub,
    "items" / Array(this.count, Struct(*_LOCATOR)),
    Terminated,
)

INQUIRY_RESP_BODY = Struct(
    "flag" / Int8ub,
    "topic" / Int8ub,
    "count" / Int32ub,
    "items" / Array(this.count, Struct(*_LOCATOR, "result" / Int8ub)),
    Terminated,
)

NACK_BODY = Struct(
    *_LOCATOR,
    "code" / Int16ub,
    "message" / PascalString(Int16ub, "utf8"),
    "proof" / Prefixed(Int16ub, GreedyBytes),
    Terminated,
)

#: One chunk of a large document (the DATA with FLAG_LARGE named by the
#: locator carries its manifest). ``flags``: bit0 compressed; the payload is
#: sealed by the origin. The fast codec in _control.py is tested against this.
CHUNK_BODY = Struct(
    *_LOCATOR,
    "index" / Int32ub,
    "flags" / Int8ub,
    "payload" / Prefixed(Int32ub, GreedyBytes),
    Terminated,
)

#: The receiver of a large document -> its origin: the chunks below
#: ``through`` are committed, or (``code`` not 0) the document is refused.
CHUNK_ACK_BODY = Struct(
    *_LOCATOR,
    "through" / Int32ub,
    "code" / Int16ub,
    "message" / PascalString(Int16ub, "utf8"),
    Terminated,
)

HELLO_BODY = Struct(
    "semq_id" / Int16ub,
    "semq_db_id" / Int16ub,
    "window" / Int32ub,
    "software" / PascalString(Int8ub, "utf8"),
    "token" / Prefixed(Int16ub, GreedyBytes),
    "units" / Int16ub,
    Terminated,
)

WELCOME_BODY = Struct(
    "window" / Int32ub,
    "server_time_ms" / Int64ub,
    "session_id" / Int64ub,
    Terminated,
)

PING_BODY = Struct("nonce" / Int64ub, "time_ms" / Int64ub, Terminated)

ERROR_BODY = Struct(
    "code" / Int16ub,
    "message" / PascalString(Int16ub, "utf8"),
    Terminated,
)

WINDOW_BODY = Struct("credit" / Int32ub, Terminated)

CERT_REQUEST_BODY = Struct(
    "node_type" / Int8ub,
    "node_id" / PascalString(Int8ub, "ascii"),
    Terminated,
)

CERT_RESPONSE_BODY = Struct(
    "node_type" / Int8ub,
    "node_id" / PascalString(Int8ub, "ascii"),
    "code" / Int16ub,
    "count" / Int8ub,
    "certificates" / Array(this.count, Prefixed(Int32ub, GreedyBytes)),
    Terminated,
)

CRL_BODY = Struct(
    "crl" / Prefixed(Int32ub, GreedyBytes),
    Terminated,
)

PEER_ANNOUNCE_BODY = Struct(
    "ttl_s" / Int32ub,
    "observe" / Int8ub,
    "count" / Int8ub,
    "addresses" / Array(this.count, PascalString(Int8ub, "utf8")),
    "allowed_count" / Int16ub,
    "allowed" / Array(this.allowed_count, PascalString(Int8ub, "ascii")),
    Terminated,
)

PEER_LOOKUP_BODY = CERT_REQUEST_BODY

PEER_INFO_BODY = Struct(
    "node_type" / Int8ub,
    "node_id" / PascalString(Int8ub, "ascii"),
    "code" / Int16ub,
    "expires_ms" / Int64ub,
    "fingerprint" / PascalString(Int8ub, "ascii"),
    "count" / Int8ub,
    "addresses" / Array(this.count, PascalString(Int8ub, "utf8")),
    Terminated,
)

PRESENCE_QUERY_BODY = Struct(
    "count" / Int8ub,
    "orgs" / Array(this.count, PascalString(Int8ub, "ascii")),
    Terminated,
)

PRESENCE_BODY = Struct(
    "count" / Int8ub,
    "items" / Array(this.count, Struct(
        "node_id" / PascalString(Int8ub, "ascii"),
        "state" / Int8ub,
        "since_ms" / Int64ub,
        "last_seen_ms" / Int64ub,
    )),
    Terminated,
)

BYE_BODY = Struct(
    "code" / Int16ub,
    "reason" / PascalString(Int16ub, "utf8"),
    Terminated,
)

#: Body schema per kind number (Kind values; kept as ints so this module does
#: not depend on the dataclasses).
BODY_SCHEMAS: Final[dict[int, Construct]] = {
    1: DATA_BODY,
    2: ACK_BODY,
    3: ACK_BODY,
    4: ACK_BODY,
    5: ACK_BODY,
    6: ACK_BODY,
    7: ACK_BODY,
    8: INQUIRY_BODY,
    9: INQUIRY_RESP_BODY,
    10: ACK_BATCH_BODY,
    11: NACK_BODY,
    12: CHUNK_BODY,
    13: CHUNK_ACK_BODY,
    32: HELLO_BODY,
    33: WELCOME_BODY,
    34: PING_BODY,
    35: PING_BODY,
    36: ERROR_BODY,
    37: WINDOW_BODY,
    38: CERT_REQUEST_BODY,
    39: CERT_RESPONSE_BODY,
    40: BYE_BODY,
    41: CRL_BODY,
    42: PEER_ANNOUNCE_BODY,
    43: PEER_LOOKUP_BODY,
    44: PEER_INFO_BODY,
    45: PRESENCE_QUERY_BODY,
    46: PRESENCE_BODY,
}


def _fmt(subcon: Any) -> str:
    while isinstance(subcon, Renamed):
        subcon = subcon.subcon
    if isinstance(subcon, FormatField):
        fmt: str = subcon.fmtstr
        return fmt[1:]
    if isinstance(subcon, Const):
        return _fmt(subcon.subcon)
    if isinstance(subcon, Bytes) and isinstance(subcon.length, int):
        return f"{subcon.length}s"
    if isinstance(subcon, Struct):
        return "".join(_fmt(s) for s in subcon.subcons)
    raise TypeError(f"{subcon!r} is not fixed-width")


def flat_struct(schema: Struct) -> struct.Struct:
    """The ``struct.Struct`` equivalent of a fixed-width construct Struct
    (fields in the same order, nested Structs flattened)."""
    return struct.Struct(">" + _fmt(schema))
