"""UMX-T frames as strict values, and their encoding.

A ``Frame`` is the header attributes (kind, endpoints, Reliable, SaveFwd,
Ack2, priority) plus one body value whose type matches the kind. Every class
here is a frozen keyword-only dataclass that validates in its constructor
(LocalProtocolError, ResultCode.INVALID_FIELD). ``encode_frame`` turns a Frame
into bytes; ``decode_body`` (used by the stream decoder) turns a body back,
raising RemoteProtocolError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import partial
from itertools import starmap
from typing import Any, Final, NamedTuple

from construct import ConstructError

try:
    # ISA-L's CRC32 (zlib's polynomial, the same values) takes 0.1 us on a
    # 1 KiB frame where zlib's takes 0.7, and every frame is checked or
    # made ~4 times between two organizations (docs/profiling.md).
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a declared dependency; zlib's is the same function
    from zlib import crc32

from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, ResultCode
from ._schema import (
    ACK_ENTRY,
    BODY_SCHEMAS,
    DATA_PREFIX,
    HEADER,
    MAGIC,
    VERSION,
    flat_struct,
)
from ._types import (
    _ACK_KINDS,
    LK0,
    LK1,
    MAX_PRIORITY,
    AckFlag,
    AppKey,
    Endpoint,
    ForwardFlag,
    InquiryFlag,
    InquiryResult,
    InquiryTopic,
    Kind,
    NodeType,
    SaveFwd,
    _invalid,
)

__all__ = [
    "FLAG_ACK2",
    "FLAG_ENCRYPT",
    "FLAG_KEY_SEALED",
    "FLAG_LAYER",
    "FLAG_RELIABLE",
    "MAX_ACK_BATCH",
    "MAX_CERTIFICATES",
    "MAX_CRL",
    "MAX_SESSION_KEY",
    "MAX_TEXT",
    "Ack",
    "AckBatch",
    "AckEntry",
    "Body",
    "Bye",
    "CertRequest",
    "CertResponse",
    "Crl",
    "Data",
    "Error",
    "Frame",
    "Hello",
    "Inquiry",
    "InquiryAnswer",
    "InquiryResp",
    "Nack",
    "Ping",
    "Pong",
    "Welcome",
    "WindowUpdate",
    "decode_body",
    "encode_data",
    "encode_frame",
    "encode_frames",
    "frame_from_wire",
    "read_app_key",
]

FLAG_LAYER: Final = 0x01  # LAYER_MASK: 0 application packet (DATA), 1 transport packet
FLAG_RELIABLE: Final = 0x02  # Reliable=1
FLAG_ACK2: Final = 0x04  # Ack2=1: the receiver must send an end-to-end confirmation
FLAG_ENCRYPT: Final = 0x08  # Encrypt=1: AppData is sealed with the wrapped SessionKey
# The AppKey travels inside the sealed AppData, not in the header (which then
# carries an empty one): the relay routes without it and must not read it.
# DATA with Encrypt=1 only.
FLAG_KEY_SEALED: Final = 0x10
FLAGS_KNOWN: Final = 0x1F

MAX_SESSION_KEY: Final = 4096  # bytes of a wrapped session key
MAX_RECEIPT: Final = 4096  # bytes of a signed receipt on ACK2
MAX_TEXT: Final = 1024  # characters of an error message / reason
MAX_PROOF: Final = 4096  # bytes of a signed refusal on a NACK
MAX_ACK_BATCH: Final = 100_000  # acks in one ACK_BATCH frame
MAX_INQUIRY_ITEMS: Final = 10_000  # records in one INQUIRY / INQUIRY_RESP
MAX_CERTIFICATES: Final = 8  # certificates in one CERT_RESPONSE (rollover: old + new + chain)
MAX_TOKEN: Final = 4096  # bytes of a HELLO token
MAX_CRL: Final = 4 << 20  # bytes of a CRL frame's revocation list (~100,000 revoked certificates)
_MAX_U32: Final = 0xFFFF_FFFF
_MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF
_MAX_MS: Final = 0x7FFF_FFFF_FFFF_FFFF

_HEADER: Final = flat_struct(HEADER)
HEADER_SIZE: Final = _HEADER.size
_DATA_PREFIX: Final = flat_struct(DATA_PREFIX)
_ACK_ENTRY: Final = flat_struct(ACK_ENTRY)
_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_CRC: Final = struct.Struct(">I")


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


# AppKey is frozen, so one shared empty default is safe (and saves a
# construction per Data/Ack).
_NO_APP_KEY: Final = AppKey()


# ---------------------------------------------------------------- bodies


@dataclass(frozen=True, kw_only=True, slots=True)
class Data:
    """A document (kind DATA). ``lk0`` names it at its origin; ``lk1`` is set
    by the platform on stored copies it delivers; times are ms since the epoch;
    ``expires_ms`` None means never. ``encrypt`` says AppData is sealed with a
    session key, wrapped for the receiver in ``session_key``; ``key_sealed``
    that the AppKey is inside the sealed AppData (the header's is empty)."""

    lk0: LK0
    app_data: bytes = b""
    app_key: AppKey = _NO_APP_KEY
    lk1: LK1 | None = None
    created_ms: int = 0
    expires_ms: int | None = None
    encrypt: bool = False
    session_key: bytes = b""
    key_sealed: bool = False

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Ack:
    """The 810 parameters of ACK, REACK, ACK2, REACK2, ACK_FWD, ACK_SAVE.
    ``src_*``: the record of the side that sends the ack (0 = none);
    ``dest_*``: the record being acked. ``receipt``: on ACK2, the receiver's
    signature over the document's digest (security issue)."""

    dest_ref_id: int
    ack_flag: AckFlag
    src_ref_id: int = 0
    src_semq_id: int = 1
    src_semq_db_id: int = 1
    dest_semq_id: int = 1
    dest_semq_db_id: int = 1
    flag: ForwardFlag = ForwardFlag.NONE
    app_key: AppKey = _NO_APP_KEY
    receipt: bytes = b""

    def __post_init__(self) -> None:
        if self.ack_flag.__class__ is not AckFlag:
            object.__setattr__(self, "ack_flag", _enum(AckFlag, "ack_flag", self.ack_flag))
        if self.flag.__class__ is not ForwardFlag:
            object.__setattr__(self, "flag", _enum(ForwardFlag, "flag", self.flag))
        a, b, c = self.src_semq_id, self.src_semq_db_id, self.src_ref_id
        d, e, f = self.dest_semq_id, self.dest_semq_db_id, self.dest_ref_id
        # One fused comparison on the hot path; the named checks word the error.
        if not (
            type(a) is int and type(b) is int and type(c) is int
            and type(d) is int and type(e) is int and type(f) is int
            and 0 <= a <= 0xFFFF and 0 <= b <= 0xFFFF and 0 <= c <= _MAX_U64
            and 0 <= d <= 0xFFFF and 0 <= e <= 0xFFFF and 0 <= f <= _MAX_U64
        ):
            _check_int("src_semq_id", a, 0, 0xFFFF)
            _check_int("src_semq_db_id", b, 0, 0xFFFF)
            _check_int("src_ref_id", c, 0, _MAX_U64)
            _check_int("dest_semq_id", d, 0, 0xFFFF)
            _check_int("dest_semq_db_id", e, 0, 0xFFFF)
            _check_int("dest_ref_id", f, 0, _MAX_U64)
        r = self.receipt
        if type(r) is not bytes or len(r) > MAX_RECEIPT:
            _check_bytes("receipt", r, MAX_RECEIPT)

    @property
    def entry(self) -> AckEntry:
        return AckEntry(
            self.src_semq_id,
            self.src_semq_db_id,
            self.src_ref_id,
            self.dest_semq_id,
            self.dest_semq_db_id,
            self.dest_ref_id,
            int(self.ack_flag),
            int(self.flag),
        )


class AckEntry(NamedTuple):
    """One ack in an ACK_BATCH: the 810 parameters without AppKey (the
    receiving side looks it up by dest_ref_id). Plain ints for speed."""

    src_semq_id: int
    src_semq_db_id: int
    src_ref_id: int
    dest_semq_id: int
    dest_semq_db_id: int
    dest_ref_id: int
    ack_flag: int
    flag: int = 0

    @classmethod
    def of(
        cls,
        dest_ref_id: int,
        ack_flag: AckFlag,
        *,
        src_ref_id: int = 0,
        flag: ForwardFlag = ForwardFlag.NONE,
        src_semq_id: int = 1,
        src_semq_db_id: int = 1,
        dest_semq_id: int = 1,
        dest_semq_db_id: int = 1,
    ) -> AckEntry:
        return cls(
            src_semq_id, src_semq_db_id, src_ref_id, dest_semq_id, dest_semq_db_id,
            dest_ref_id, int(ack_flag), int(flag),
        )


# Which ack_flag / flag each ack kind must carry (SPEC: ack_flag 1 platform hop,
# 2 delivery; flag 1 forwarded / 2 stored only on ACK_FWD / ACK_SAVE).
_ACK_RULES: Final[dict[Kind, tuple[AckFlag, ForwardFlag]]] = {
    Kind.ACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.REACK: (AckFlag.PLATFORM, ForwardFlag.NONE),
    Kind.ACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.REACK2: (AckFlag.DELIVERY, ForwardFlag.NONE),
    Kind.ACK_FWD: (AckFlag.PLATFORM, ForwardFlag.FORWARDED),
    Kind.ACK_SAVE: (AckFlag.PLATFORM, ForwardFlag.STORED),
}


def _flags_fit(packed: bytes, n: int, ack_flag: int, flag: int) -> bool:
    """Whether every one of the ``n`` packed ack entries (26 bytes each) has
    ``ack_flag`` and ``flag``: their two flag bytes sit at offsets 24 and 25,
    so the check counts bytes in two strided slices instead of looping."""
    return packed[24::_ACK_ENTRY.size].count(ack_flag) == n and packed[25::_ACK_ENTRY.size].count(flag) == n


@dataclass(frozen=True, kw_only=True, slots=True)
class AckBatch:
    """Many acks of one kind in one frame (kind ACK_BATCH). ``receipt`` may
    carry one signature over the whole batch (a batch receipt)."""

    ack_kind: Kind
    entries: tuple[AckEntry, ...]
    receipt: bytes = b""
    # The entries as the wire carries them (26 bytes each), made while
    # checking them; the encoder sends these bytes. Not part of the value.
    _packed: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _enum(Kind, "ack_kind", self.ack_kind)
        if kind not in _ACK_RULES:
            raise _invalid(f"ack_kind {kind.name} is not an ack kind")
        object.__setattr__(self, "ack_kind", kind)
        if not isinstance(self.entries, tuple):
            object.__setattr__(self, "entries", tuple(AckEntry(*e) for e in self.entries))
        n = len(self.entries)
        if n > MAX_ACK_BATCH:
            raise _invalid(
                f"ACK_BATCH of {n} entries exceeds the {MAX_ACK_BATCH} limit"
            )
        ack_flag, flag = _ACK_RULES[kind]
        # Packing checks every id's range and type (struct refuses the rest);
        # the two flag bytes of every entry are then counted in the packed
        # bytes (offsets 24 and 25 of 26), as the decoder does. Only a batch
        # that fails is checked entry by entry, to say what is wrong.
        try:
            packed: bytes | None = b"".join(starmap(_ACK_ENTRY.pack, self.entries))
        except struct.error:
            packed = None
        if packed is not None and _flags_fit(packed, n, ack_flag, flag):
            object.__setattr__(self, "_packed", packed)
        else:
            self._check_entries(kind, ack_flag, flag)
        _check_bytes("receipt", self.receipt, MAX_RECEIPT)

    def _check_entries(self, kind: Kind, ack_flag: int, flag: int) -> None:
        for e in self.entries:
            if e[6] != ack_flag or e[7] != flag:
                raise _invalid(
                    f"ACK_BATCH of {kind.name} holds an entry with ack_flag {e[6]} flag {e[7]};"
                    f" {kind.name} needs ack_flag {int(ack_flag)} flag {int(flag)}"
                )
            # One chained comparison per field: cheap enough for 100k entries,
            # and it keeps out-of-range ints from reaching struct.pack later.
            try:
                ok = (
                    0 <= e[0] <= 0xFFFF and 0 <= e[1] <= 0xFFFF and 0 <= e[2] <= _MAX_U64
                    and 0 <= e[3] <= 0xFFFF and 0 <= e[4] <= 0xFFFF and 0 <= e[5] <= _MAX_U64
                )
            except TypeError:  # not an int: _check_int names it
                ok = False
            if not ok:
                for i, name in enumerate(AckEntry._fields[:6]):
                    _check_int(f"ACK_BATCH entry {name}", e[i], 0, _MAX_U64 if i in (2, 5) else 0xFFFF)


@dataclass(frozen=True, kw_only=True, slots=True)
class Inquiry:
    """809: ``items`` name records by full locator (LK0 form). Topic RECEIVED:
    "did you receive these messages?"; STATE: "what is the state of these
    records of yours?"."""

    topic: InquiryTopic
    items: tuple[LK0, ...]
    flag: InquiryFlag = InquiryFlag.FROM_PEER

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic", _enum(InquiryTopic, "topic", self.topic))
        object.__setattr__(self, "flag", _enum(InquiryFlag, "flag", self.flag))
        object.__setattr__(self, "items", tuple(self.items))
        if not self.items or len(self.items) > MAX_INQUIRY_ITEMS:
            raise _invalid(f"INQUIRY of {len(self.items)} items is outside 1..{MAX_INQUIRY_ITEMS}")


class InquiryAnswer(NamedTuple):
    lk0: LK0
    result: InquiryResult


@dataclass(frozen=True, kw_only=True, slots=True)
class InquiryResp:
    """809-Confirmation: one answer per asked record."""

    topic: InquiryTopic
    answers: tuple[InquiryAnswer, ...]
    flag: InquiryFlag = InquiryFlag.FROM_PEER

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic", _enum(InquiryTopic, "topic", self.topic))
        object.__setattr__(self, "flag", _enum(InquiryFlag, "flag", self.flag))
        answers = tuple(
            InquiryAnswer(a[0], _enum(InquiryResult, "result", a[1])) for a in self.answers
        )
        object.__setattr__(self, "answers", answers)
        if not answers or len(answers) > MAX_INQUIRY_ITEMS:
            raise _invalid(
                f"INQUIRY_RESP of {len(answers)} answers is outside 1..{MAX_INQUIRY_ITEMS}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Nack:
    """The message ``lk0`` was not taken: the platform neither forwarded nor
    stored it, or its target refused it. ``proof``: a target's signed refusal
    (semq.crypto, docs/security.md "Refusals"); empty from the platform."""

    lk0: LK0
    code: ResultCode
    message: str = ""
    proof: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("message", self.message)
        _check_bytes("proof", self.proof, MAX_PROOF)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hello:
    """First frame of a node on a connection. ``window``: how many unacked
    message frames the node accepts; ``token``: authentication material."""

    semq_id: int = 1
    semq_db_id: int = 1
    window: int = 1024
    software: str = "semq"
    token: bytes = b""

    def __post_init__(self) -> None:
        _check_int("semq_id", self.semq_id, 1, 0xFFFF)
        _check_int("semq_db_id", self.semq_db_id, 1, 0xFFFF)
        _check_int("window", self.window, 1, _MAX_U32)
        _check_text("software", self.software)
        try:
            size = len(self.software.encode("utf-8"))
        except UnicodeEncodeError:
            raise _invalid(f"software {self.software!r} is not valid UTF-8") from None
        if size > 255:
            raise _invalid(f"software name of {size} bytes exceeds the 255-byte limit")
        _check_bytes("token", self.token, MAX_TOKEN)


@dataclass(frozen=True, kw_only=True, slots=True)
class Welcome:
    window: int = 1024
    server_time_ms: int = 0
    session_id: int = 0

    def __post_init__(self) -> None:
        _check_int("window", self.window, 1, _MAX_U32)
        _check_int("server_time_ms", self.server_time_ms, 0, _MAX_MS)
        _check_int("session_id", self.session_id, 0, _MAX_U64)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ping:
    nonce: int = 0
    time_ms: int = 0

    def __post_init__(self) -> None:
        _check_int("nonce", self.nonce, 0, _MAX_U64)
        _check_int("time_ms", self.time_ms, 0, _MAX_MS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Pong:
    nonce: int = 0
    time_ms: int = 0

    def __post_init__(self) -> None:
        _check_int("nonce", self.nonce, 0, _MAX_U64)
        _check_int("time_ms", self.time_ms, 0, _MAX_MS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Error:
    """A result code and one line; the sender may close the connection."""

    code: ResultCode
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("message", self.message)


@dataclass(frozen=True, kw_only=True, slots=True)
class WindowUpdate:
    """Flow-control credit: the receiver accepts ``credit`` more frames."""

    credit: int

    def __post_init__(self) -> None:
        _check_int("credit", self.credit, 0, _MAX_U32)


@dataclass(frozen=True, kw_only=True, slots=True)
class CertRequest:
    endpoint: Endpoint


@dataclass(frozen=True, kw_only=True, slots=True)
class CertResponse:
    """The endpoint's certificates (DER, newest first), or a result code."""

    endpoint: Endpoint
    code: ResultCode = ResultCode.OK
    certificates: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        object.__setattr__(self, "certificates", tuple(bytes(c) for c in self.certificates))
        if len(self.certificates) > MAX_CERTIFICATES:
            raise _invalid(
                f"{len(self.certificates)} certificates exceed the {MAX_CERTIFICATES} limit"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Crl:
    """The platform CA's certificate revocation list, DER as the CA signed
    it (the node checks the signature; the relay cannot forge one)."""

    der: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "der", bytes(self.der))
        if not 1 <= len(self.der) <= MAX_CRL:
            raise _invalid(f"revocation list of {len(self.der)} bytes is outside 1..{MAX_CRL}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Bye:
    code: ResultCode = ResultCode.OK
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("reason", self.reason)


Body = (
    Data | Ack | AckBatch | Inquiry | InquiryResp | Nack | Hello | Welcome | Ping | Pong
    | Error | WindowUpdate | CertRequest | CertResponse | Bye | Crl
)

_MESSAGE_KINDS: Final = frozenset(k for k in Kind if k.is_message)

_BODY_TYPE: Final[dict[Kind, type]] = {
    Kind.DATA: Data,
    **{k: Ack for k in _ACK_KINDS},
    Kind.INQUIRY: Inquiry,
    Kind.INQUIRY_RESP: InquiryResp,
    Kind.ACK_BATCH: AckBatch,
    Kind.NACK: Nack,
    Kind.HELLO: Hello,
    Kind.WELCOME: Welcome,
    Kind.PING: Ping,
    Kind.PONG: Pong,
    Kind.ERROR: Error,
    Kind.WINDOW: WindowUpdate,
    Kind.CERT_REQUEST: CertRequest,
    Kind.CERT_RESPONSE: CertResponse,
    Kind.BYE: Bye,
    Kind.CRL: Crl,
}


# ---------------------------------------------------------------- frame


@dataclass(frozen=True, kw_only=True, slots=True)
class Frame:
    """One UMX-T frame. ``source`` is the transport source of this hop (the
    platform on frames it relays), ``target`` the final target, ``origin`` the
    application-level source (defaults: DATA -> its LK0's endpoint, otherwise
    ``source``). ``save_fwd`` defaults to MUST_DELIVER on message kinds and
    NONE on session kinds (SPEC: acks and inquiries travel with SaveFwd=3)."""

    kind: Kind
    source: Endpoint
    target: Endpoint
    body: Body
    origin: Endpoint = field(default=None)  # type: ignore[assignment]
    reliable: bool = True
    save_fwd: SaveFwd = field(default=None)  # type: ignore[assignment]
    ack2: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        kind = self.kind
        if kind.__class__ is not Kind:
            kind = _enum(Kind, "kind", kind)
            object.__setattr__(self, "kind", kind)
        expected = _BODY_TYPE[kind]
        if type(self.body) is not expected:
            raise _invalid(f"{kind.name} needs a {expected.__name__} body, not {self.body!r}")
        if self.origin is None:
            origin = self.body.lk0.endpoint if isinstance(self.body, Data) else self.source
            object.__setattr__(self, "origin", origin)
        sf = self.save_fwd
        if sf is None:
            object.__setattr__(
                self, "save_fwd", SaveFwd.MUST_DELIVER if kind in _MESSAGE_KINDS else SaveFwd.NONE
            )
        elif sf.__class__ is not SaveFwd:
            object.__setattr__(self, "save_fwd", _enum(SaveFwd, "SaveFwd", sf))
        for name in ("source", "target", "origin"):
            if not isinstance(getattr(self, name), Endpoint):
                raise _invalid(f"{name} must be an Endpoint, not {getattr(self, name)!r}")
        p = self.priority
        if type(p) is not int or not 0 <= p <= MAX_PRIORITY:
            _check_int("priority", p, 0, MAX_PRIORITY)
        self._check_attributes(kind)

    def _check_attributes(self, kind: Kind) -> None:
        sf = self.save_fwd
        if kind not in _MESSAGE_KINDS:
            if sf is not SaveFwd.NONE or self.ack2:
                raise _invalid(f"session frame {kind.name} must have SaveFwd=0 and Ack2=0")
            return
        if sf is SaveFwd.NONE:
            raise _invalid(f"SaveFwd 0 on a {kind.name} frame; message frames need 1..3")
        if kind is Kind.DATA:
            assert isinstance(self.body, Data)
            if self.body.lk0.endpoint != self.origin:
                raise _invalid(f"DATA LK0 names {self.body.lk0.endpoint} but origin is {self.origin}")
            if not self.reliable and (sf is not SaveFwd.DISCARD or self.ack2):
                raise _invalid(
                    f"Reliable=0 (best effort) needs SaveFwd=1 and Ack2=0, not SaveFwd={int(sf)}"
                    f" Ack2={int(self.ack2)}"
                )
            return
        # Acks, inquiries, NACK: SaveFwd=3, reliable, no confirmation of their own.
        if sf is not SaveFwd.MUST_DELIVER or self.ack2 or not self.reliable:
            raise _invalid(
                f"{kind.name} travels with Reliable=1 SaveFwd=3 Ack2=0, not"
                f" Reliable={int(self.reliable)} SaveFwd={int(sf)} Ack2={int(self.ack2)}"
            )
        if isinstance(self.body, Ack):
            ack_flag, flag = _ACK_RULES[kind]
            if self.body.ack_flag is not ack_flag or self.body.flag is not flag:
                raise _invalid(
                    f"{kind.name} needs ack_flag {int(ack_flag)} flag {int(flag)}, not"
                    f" {int(self.body.ack_flag)} {int(self.body.flag)}"
                )

    @property
    def layer(self) -> int:
        """LAYER_MASK: 0 application packet (DATA), 1 transport packet."""
        return 0 if self.kind is Kind.DATA else 1

    @property
    def flags(self) -> int:
        f = 0 if self.kind is Kind.DATA else FLAG_LAYER
        if self.reliable:
            f |= FLAG_RELIABLE
        if self.ack2:
            f |= FLAG_ACK2
        if isinstance(self.body, Data):
            if self.body.encrypt:
                f |= FLAG_ENCRYPT
            if self.body.key_sealed:
                f |= FLAG_KEY_SEALED
        return f


# ---------------------------------------------------------------- encoding


def _ak(app_key: AppKey) -> bytes:
    parts = []
    for s in (app_key.domain, app_key.data_type, app_key.subtype, app_key.key):
        b = s.encode("utf-8")
        parts.append(_U8.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def _lk(lk: LK0) -> dict[str, Any]:
    return {
        "node_type": int(lk.endpoint.node_type),
        "node_id": lk.endpoint.node_id,
        "semq_id": lk.semq_id,
        "semq_db_id": lk.semq_db_id,
        "record_id": lk.record_id,
    }


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


def _encode_ack(a: Ack) -> bytes:
    return b"".join(
        (_ACK_ENTRY.pack(*a.entry), _ak(a.app_key), _U16.pack(len(a.receipt)), a.receipt)
    )


def _encode_ack_batch(b: AckBatch) -> bytes:
    packed = b._packed
    return b"".join(
        (
            _U8.pack(b.ack_kind),
            _U32.pack(len(b.entries)),
            packed if packed is not None else b"".join(starmap(_ACK_ENTRY.pack, b.entries)),
            _U16.pack(len(b.receipt)),
            b.receipt,
        )
    )


def _body_container(body: Body) -> dict[str, Any]:
    """The construct container for the kinds encoded by schema (not hot)."""
    if isinstance(body, Inquiry):
        return {"flag": body.flag, "topic": body.topic, "count": len(body.items),
                "items": [_lk(i) for i in body.items]}
    if isinstance(body, InquiryResp):
        return {"flag": body.flag, "topic": body.topic, "count": len(body.answers),
                "items": [{**_lk(a.lk0), "result": int(a.result)} for a in body.answers]}
    if isinstance(body, Nack):
        return {**_lk(body.lk0), "code": int(body.code), "message": body.message, "proof": body.proof}
    if isinstance(body, Hello | Welcome | Ping | Pong | WindowUpdate):
        return {f: getattr(body, f) for f in body.__dataclass_fields__}
    if isinstance(body, Error):
        return {"code": int(body.code), "message": body.message}
    if isinstance(body, Bye):
        return {"code": int(body.code), "reason": body.reason}
    if isinstance(body, Crl):
        return {"crl": body.der}
    if isinstance(body, CertRequest):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id}
    if isinstance(body, CertResponse):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id,
                "code": int(body.code), "count": len(body.certificates),
                "certificates": list(body.certificates)}
    raise LocalProtocolError(f"no encoder for {type(body).__name__}")  # pragma: no cover


_COMPILED: Final = {k: s.compile() for k, s in BODY_SCHEMAS.items()}


def encode_body(kind: Kind, body: Body) -> bytes:
    if isinstance(body, Data):
        return _encode_data(body)
    if isinstance(body, Ack):
        return _encode_ack(body)
    if isinstance(body, AckBatch):
        return _encode_ack_batch(body)
    try:
        out: bytes = _COMPILED[kind].build(_body_container(body))
    except (ConstructError, struct.error, UnicodeError) as e:
        raise LocalProtocolError(f"cannot encode {kind.name}: {e}", ResultCode.INVALID_FIELD) from e
    return out


def encode_frame(frame: Frame) -> bytes:
    """The bytes of one frame, CRC32 trailer included."""
    body = encode_body(frame.kind, frame.body)
    src = frame.source.node_id.encode("ascii")
    dst = frame.target.node_id.encode("ascii")
    org = frame.origin.node_id.encode("ascii")
    if len(body) > _MAX_U32:
        raise LocalProtocolError(
            f"frame body of {len(body)} bytes exceeds the 4 GiB wire limit", ResultCode.FRAME_TOO_LARGE
        )
    head = _HEADER.pack(
        MAGIC, VERSION, frame.kind, frame.flags, frame.save_fwd, frame.priority,
        frame.source.node_type, frame.target.node_type, frame.origin.node_type,
        len(src), len(dst), len(org), 0, len(body),
    )
    out = b"".join((head, src, dst, org, body))
    return out + _CRC.pack(crc32(out))


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
) -> bytes:
    """Exactly ``encode_frame(Frame(kind=DATA, source=..., body=Data(lk0=LK0(
    endpoint=source, ...))))``, without building the values: the origin's
    send path encodes rows it validated when it accepted them (NodeCore.accept
    builds the Frame once), so re-validating per send would only cost time.
    ``source`` is also the origin. Encrypt=1 iff ``session_key``;
    ``key_sealed``: the AppKey is inside AppData (``app_key`` is then empty)."""
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
             | (FLAG_KEY_SEALED if key_sealed else 0))
    head = _HEADER.pack(
        MAGIC, VERSION, 1, flags, save_fwd, priority, source.node_type, target.node_type, source.node_type,
        len(src), len(dst), len(src), 0, len(body),
    )
    out = b"".join((head, src, dst, src, body))
    return out + _CRC.pack(crc32(out))


def encode_frames(frames: list[Frame]) -> bytes:
    """Several frames coalesced for one ``send_all``."""
    return b"".join([encode_frame(f) for f in frames])


# ---------------------------------------------------------------- decoding
#
# Building values on the decode path. The public constructors validate in
# __post_init__; a frozen dataclass's generated __init__ sets every field with
# a generic object.__setattr__ call, which was most of a decode's time. The
# _*_wire builders below create the same values by setting the slots through
# their descriptors, after checking exactly what the wire layout leaves open
# (an unsigned u16 cannot exceed 65535, but it can be 0). When a fast check
# fails they call the public constructor, which raises naming the value and the
# limit, so error messages have one source. tests/test_protocol_decoder.py
# rebuilds every decoded value through the public constructors to prove the
# two paths accept the same values.

_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    return tuple(getattr(cls, n).__set__ for n in names)


_AK_SET: Final = _slot_setters(AppKey, "domain", "data_type", "subtype", "key")
_LK0_SET: Final = _slot_setters(LK0, "endpoint", "record_id", "semq_id", "semq_db_id")
_LK1_SET: Final = _slot_setters(LK1, "record_id", "semq_id", "semq_db_id")
_DATA_SET: Final = _slot_setters(
    Data, "lk0", "app_data", "app_key", "lk1", "created_ms", "expires_ms", "encrypt", "session_key", "key_sealed"
)
_ACK_SET: Final = _slot_setters(
    Ack, "dest_ref_id", "ack_flag", "src_ref_id", "src_semq_id", "src_semq_db_id",
    "dest_semq_id", "dest_semq_db_id", "flag", "app_key", "receipt",
)
_BATCH_SET: Final = _slot_setters(AckBatch, "ack_kind", "entries", "receipt", "_packed")
_FRAME_SET: Final = _slot_setters(
    Frame, "kind", "source", "target", "body", "origin", "reliable", "save_fwd", "ack2", "priority"
)
_SAVE_FWD: Final = tuple(SaveFwd)  # index = wire value 0..3
_ACK_FLAG_OF: Final = {int(f): f for f in AckFlag}
_FWD_FLAG_OF: Final = {int(f): f for f in ForwardFlag}
_ACK_KIND_OF: Final = {int(k): k for k in _ACK_RULES}
_make_entry: Final = partial(tuple.__new__, AckEntry)  # AckEntry._make without the Python frame


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


_DATA_PREFIX_SIZE: Final = _DATA_PREFIX.size
_ACK_ENTRY_SIZE: Final = _ACK_ENTRY.size


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


def _decode_data(buf: bytes, origin: Endpoint, encrypt: bool, key_sealed: bool = False) -> Data:
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
                    key_sealed=key_sealed)
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
    return d


def _decode_ack(kind: Kind, buf: bytes) -> Ack:
    e = _ACK_ENTRY.unpack_from(buf)
    app_key, pos = _read_app_key(buf, _ACK_ENTRY_SIZE)
    (r_len,) = _U16.unpack_from(buf, pos)
    if pos + 2 + r_len != len(buf):
        raise RemoteProtocolError(f"{kind.name} body length is inconsistent", ResultCode.MALFORMED_FRAME)
    receipt = buf[pos + 2 :]
    ack_flag = _ACK_FLAG_OF.get(e[6])
    flag = _FWD_FLAG_OF.get(e[7])
    # The ids are unsigned and in range by layout (Ack allows 0 = none); left
    # open: the two flags' values and the receipt's size.
    if ack_flag is None or flag is None or r_len > MAX_RECEIPT:
        return Ack(src_semq_id=e[0], src_semq_db_id=e[1], src_ref_id=e[2],  # raises
                   dest_semq_id=e[3], dest_semq_db_id=e[4], dest_ref_id=e[5],
                   ack_flag=e[6], flag=e[7], app_key=app_key, receipt=receipt)
    a = _new(Ack)
    s = _ACK_SET
    s[0](a, e[5])
    s[1](a, ack_flag)
    s[2](a, e[2])
    s[3](a, e[0])
    s[4](a, e[1])
    s[5](a, e[3])
    s[6](a, e[4])
    s[7](a, flag)
    s[8](a, app_key)
    s[9](a, receipt)
    return a


def _decode_ack_batch(buf: bytes) -> AckBatch:
    if len(buf) < 7:
        raise RemoteProtocolError("ACK_BATCH body is too short", ResultCode.MALFORMED_FRAME)
    (count,) = _U32.unpack_from(buf, 1)
    end = 5 + count * _ACK_ENTRY_SIZE
    if end + 2 > len(buf):
        raise RemoteProtocolError(
            f"ACK_BATCH declares {count} entries but the body holds {len(buf)} bytes",
            ResultCode.MALFORMED_FRAME,
        )
    (r_len,) = _U16.unpack_from(buf, end)
    if end + 2 + r_len != len(buf):
        raise RemoteProtocolError("ACK_BATCH has bytes after its receipt", ResultCode.MALFORMED_FRAME)
    kind = _ACK_KIND_OF.get(buf[0])
    packed = buf[5:end]
    entries = tuple(map(_make_entry, _ACK_ENTRY.iter_unpack(packed)))
    receipt = buf[end + 2 :]
    if kind is not None and count <= MAX_ACK_BATCH and r_len <= MAX_RECEIPT:
        # The kind's flags checked over the packed bytes, as AckBatch does.
        ack_flag, flag = _ACK_RULES[kind]
        if _flags_fit(packed, count, ack_flag, flag):
            batch = _new(AckBatch)
            s = _BATCH_SET
            s[0](batch, kind)
            s[1](batch, entries)
            s[2](batch, receipt)
            s[3](batch, packed)
            return batch
    return AckBatch(ack_kind=buf[0], entries=entries, receipt=receipt)  # type: ignore[arg-type]  # raises


def frame_from_wire(
    kind: Kind, source: Endpoint, target: Endpoint, origin: Endpoint, body: Body,
    flags: int, save_fwd: int, priority: int,
) -> Frame:
    """The Frame of a decoded header and body (used by RawFrame.frame).
    FrameDecoder.next_frame has checked what the first half of
    Frame.__post_init__ checks (kind, SaveFwd 0..3 by kind, priority, the
    endpoints) and decode_body returns the body type of the kind with LK0's
    endpoint = origin; the SaveFwd/Reliable/Ack2 and ack-flag rules are run
    here by _check_attributes. Raises LocalProtocolError on a broken rule."""
    f = _new(Frame)
    s = _FRAME_SET
    s[0](f, kind)
    s[1](f, source)
    s[2](f, target)
    s[3](f, body)
    s[4](f, origin)
    s[5](f, bool(flags & FLAG_RELIABLE))
    s[6](f, _SAVE_FWD[save_fwd])
    s[7](f, bool(flags & FLAG_ACK2))
    s[8](f, priority)
    f._check_attributes(kind)
    return f


def _loc(c: Any) -> LK0:
    return LK0(
        endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id),
        semq_id=c.semq_id,
        semq_db_id=c.semq_db_id,
        record_id=c.record_id,
    )


def _decode_by_schema(kind: Kind, buf: bytes) -> Body:
    c = _COMPILED[kind].parse(buf)
    if kind is Kind.INQUIRY:
        return Inquiry(flag=c.flag, topic=c.topic, items=tuple(_loc(i) for i in c["items"]))
    if kind is Kind.INQUIRY_RESP:
        return InquiryResp(
            flag=c.flag,
            topic=c.topic,
            answers=tuple(InquiryAnswer(_loc(i), i.result) for i in c["items"]),
        )
    if kind is Kind.NACK:
        return Nack(lk0=_loc(c), code=c.code, message=c.message, proof=c.proof)
    if kind is Kind.HELLO:
        return Hello(semq_id=c.semq_id, semq_db_id=c.semq_db_id, window=c.window,
                     software=c.software, token=c.token)
    if kind is Kind.WELCOME:
        return Welcome(window=c.window, server_time_ms=c.server_time_ms, session_id=c.session_id)
    if kind is Kind.PING:
        return Ping(nonce=c.nonce, time_ms=c.time_ms)
    if kind is Kind.PONG:
        return Pong(nonce=c.nonce, time_ms=c.time_ms)
    if kind is Kind.ERROR:
        return Error(code=c.code, message=c.message)
    if kind is Kind.WINDOW:
        return WindowUpdate(credit=c.credit)
    if kind is Kind.CERT_REQUEST:
        return CertRequest(endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id))
    if kind is Kind.CERT_RESPONSE:
        return CertResponse(endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id),
                            code=c.code, certificates=tuple(c.certificates))
    if kind is Kind.BYE:
        return Bye(code=c.code, reason=c.reason)
    if kind is Kind.CRL:
        return Crl(der=c.crl)
    raise RemoteProtocolError(f"no decoder for {kind.name}", ResultCode.UNKNOWN_KIND)  # pragma: no cover


def decode_body(kind: Kind, buf: bytes, origin: Endpoint, flags: int) -> Body:
    """Parse one body. Raises RemoteProtocolError (never construct's errors)."""
    try:
        if kind is Kind.DATA:
            return _decode_data(buf, origin, bool(flags & FLAG_ENCRYPT), bool(flags & FLAG_KEY_SEALED))
        if kind in _ACK_KINDS:
            return _decode_ack(kind, buf)
        if kind is Kind.ACK_BATCH:
            return _decode_ack_batch(buf)
        return _decode_by_schema(kind, buf)
    except RemoteProtocolError:
        raise
    except ProtocolError as e:
        raise RemoteProtocolError(f"{kind.name}: {e}", e.code) from e
    except (ConstructError, struct.error, IndexError, UnicodeError, ValueError) as e:
        raise RemoteProtocolError(f"malformed {kind.name} body: {e}", ResultCode.MALFORMED_FRAME) from e


_ = NodeType  # re-exported through the package
