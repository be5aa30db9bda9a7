"""The limits of the UMX-T wire format and the checks the frame values share.

Flag bits of the header's flags byte (docs/protocol.md "Flags"; SPEC "UMX-T
frames": LAYER_MASK, Reliable, Ack2, Encrypt; the sealed AppKey of
docs/security.md "The AppKey travels sealed"), the size limits every body
field is held to (docs/protocol.md "Limits"), and the range, type and enum
checks the frozen dataclasses of _data, _acks and _control run in their
constructors. A check that fails raises LocalProtocolError with
ResultCode.INVALID_FIELD, naming the value and the limit (STYLE 3).
"""

from __future__ import annotations

from typing import Any, Final

from ._types import _invalid

__all__ = [
    "FLAGS_KNOWN",
    "FLAG_ACK2",
    "FLAG_ENCRYPT",
    "FLAG_ENVELOPE",
    "FLAG_KEY_SEALED",
    "FLAG_LARGE",
    "FLAG_LAYER",
    "FLAG_ORDERED",
    "FLAG_RELIABLE",
    "MAX_ACK_BATCH",
    "MAX_CERTIFICATES",
    "MAX_CRL",
    "MAX_INQUIRY_ITEMS",
    "MAX_PEER_ADDRESSES",
    "MAX_PEER_ALLOWED",
    "MAX_PEER_TTL",
    "MAX_PRESENCE_ITEMS",
    "MAX_PROOF",
    "MAX_RECEIPT",
    "MAX_SESSION_KEY",
    "MAX_TEXT",
    "MAX_TOKEN",
]

FLAG_LAYER: Final = 0x01  # LAYER_MASK: 0 application packet (DATA), 1 transport packet
FLAG_RELIABLE: Final = 0x02  # Reliable=1
FLAG_ACK2: Final = 0x04  # Ack2=1: the receiver must send an end-to-end confirmation
FLAG_ENCRYPT: Final = 0x08  # Encrypt=1: AppData is sealed with the wrapped SessionKey
# The AppKey travels inside the sealed AppData, not in the header (which then
# carries an empty one): the relay routes without it and must not read it.
# DATA with Encrypt=1 only.
FLAG_KEY_SEALED: Final = 0x10
# AppData begins with the document's envelope: the users it is from and to
# inside the two organizations, and its place in an ordered channel
# (semq.node.envelope). Inside the sealed AppData when Encrypt=1: the relay
# routes without it. DATA only; its AAD binds the flag.
FLAG_ENVELOPE: Final = 0x20
# The document belongs to an ordered channel (its envelope says which, and
# its place): the relay delivers it to the first unit of a node of several,
# so that one store keeps the channel. DATA with FLAG_ENVELOPE only; bound by
# the AAD. The relay learns that a document is ordered, never its channel.
FLAG_ORDERED: Final = 0x40
# AppData is a large document's manifest (semq.node.large); its content
# follows in CHUNK frames under the same LK0. DATA only.
FLAG_LARGE: Final = 0x80
FLAGS_KNOWN: Final = 0xFF

MAX_SESSION_KEY: Final = 4096  # bytes of a wrapped session key
MAX_RECEIPT: Final = 4096  # bytes of a signed receipt on ACK2
MAX_TEXT: Final = 1024  # characters of an error message / reason
MAX_PROOF: Final = 4096  # bytes of a signed refusal on a NACK
MAX_ACK_BATCH: Final = 100_000  # acks in one ACK_BATCH frame
MAX_INQUIRY_ITEMS: Final = 10_000  # records in one INQUIRY / INQUIRY_RESP
MAX_CERTIFICATES: Final = 8  # certificates in one CERT_RESPONSE (rollover: old + new + chain)
MAX_TOKEN: Final = 4096  # bytes of a HELLO token
MAX_PEER_ADDRESSES: Final = 8  # addresses in one PEER_ANNOUNCE / PEER_INFO
MAX_PEER_ALLOWED: Final = 1000  # organizations named in one PEER_ANNOUNCE's allow-list
MAX_PEER_TTL: Final = 7 * 86400  # s an announcement may live
MAX_PRESENCE_ITEMS: Final = 64  # organizations named in one PRESENCE_QUERY (and answered in one PRESENCE)
MAX_CRL: Final = 4 << 20  # bytes of a CRL frame's revocation list (~100,000 revoked certificates)
_MAX_U32: Final = 0xFFFF_FFFF
_MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF
_MAX_MS: Final = 0x7FFF_FFFF_FFFF_FFFF


def _check_bytes(name: str, value: object, limit: int) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise _invalid(f"{name} must be bytes, not {type(value).__name__}")
    if len(value) > limit:
        raise _invalid(f"{name} of {len(value)} bytes exceeds the {limit}-byte limit")


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise _invalid(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise _invalid(f"{name} of {len(value)} characters exceeds the {MAX_TEXT} limit")


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"{name} {value!r} is outside {low}..{high}")


def _enum(enum: Any, name: str, value: object) -> Any:
    if value.__class__ is enum:  # already a member: the common case
        return value
    try:
        # The table Enum.__call__ consults first, without its call overhead.
        return enum._value2member_map_[value]
    except (KeyError, TypeError):
        pass
    try:
        return enum(value)
    except ValueError:
        # Name the allowed values too (STYLE 3: errors name the value and the limit).
        values = sorted(int(m) for m in enum)
        allowed = (
            f"{values[0]}..{values[-1]}"
            if values == list(range(values[0], values[-1] + 1))
            else ", ".join(map(str, values))
        )
        raise _invalid(f"{name} {value!r} is not a known {enum.__name__} ({allowed})") from None
