"""Identifiers and small wire values of UMX-T (SPEC "Identifiers").

Every value validates in its constructor and raises LocalProtocolError with
ResultCode.INVALID_FIELD naming the value and the limit. The decoder turns
those into RemoteProtocolError when the value came off the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

from ._errors import LocalProtocolError, ResultCode

__all__ = [
    "LK0",
    "LK1",
    "MAX_APPKEY_FIELD",
    "MAX_NODE_ID",
    "MAX_PRIORITY",
    "MAX_RECORD_ID",
    "MAX_SEMQ_ID",
    "AckFlag",
    "AppKey",
    "Endpoint",
    "ForwardFlag",
    "InquiryFlag",
    "InquiryResult",
    "InquiryTopic",
    "Kind",
    "NodeType",
    "SaveFwd",
]

MAX_NODE_ID: Final = 64  # bytes of a node id (ASCII)
MAX_APPKEY_FIELD: Final = 255  # bytes of each AppKey part (UTF-8), u8-prefixed on the wire
MAX_SEMQ_ID: Final = 0xFFFF  # semq_id and semq_db_id are u16
MAX_RECORD_ID: Final = 0xFFFF_FFFF_FFFF_FFFF  # record ids are u64
MAX_PRIORITY: Final = 9  # priorities 0..9, higher first (seed 001)

_NODE_ID_RE: Final = re.compile(r"[A-Za-z0-9._:@-]+")


def _invalid(message: str) -> LocalProtocolError:
    return LocalProtocolError(message, ResultCode.INVALID_FIELD)


class Kind(IntEnum):
    """Frame kinds (SPEC "UMX-T frames"). 1..31 are message kinds that carry
    SaveFwd; 32.. are session kinds between two directly connected peers."""

    # A hot dict key: int's C-level hash (Enum's is hash(name), in Python),
    # which also agrees with IntEnum's int equality.
    __hash__ = int.__hash__

    DATA = 1  # a document (application packet, LAYER_MASK 0)
    ACK = 2  # 810-Indication ack_flag 1: receiver -> platform, "got your stored copy (LK1)"
    REACK = 3  # 810-Response ack_flag 1: platform -> receiver, "got your ACK"
    ACK2 = 4  # 810-Indication ack_flag 2: receiver -> origin, end-to-end delivery confirmation
    REACK2 = 5  # 810-Response ack_flag 2: origin -> receiver, "got your ACK2"
    ACK_FWD = 6  # 810 flag 1: platform -> origin, forwarded at once
    ACK_SAVE = 7  # 810 flag 2: platform -> origin, stored for later delivery
    INQUIRY = 8  # 809: "did you receive ..." / "what is the state of ..."
    INQUIRY_RESP = 9  # 809-Confirmation: the answers
    ACK_BATCH = 10  # many 810 acks of one kind in one frame (ours: the relay moves acks in bulk)
    NACK = 11  # platform -> origin: not forwarded and not stored, with the result code
    CHUNK = 12  # origin -> target (relayed): one chunk of a large document's content, under its LK0
    CHUNK_ACK = 13  # target -> origin (relayed): the chunks of a large document committed so far, or its refusal
    HELLO = 32  # session: a node introduces itself (first frame on a connection)
    WELCOME = 33  # session: the platform accepts the HELLO
    PING = 34  # session: liveness probe
    PONG = 35  # session: answer to PING
    ERROR = 36  # session: a result code and a one-line message; the sender may close
    WINDOW = 37  # session: flow-control credit (seed 004 sliding window)
    CERT_REQUEST = 38  # session: ask the platform's directory for an endpoint's certificates
    CERT_RESPONSE = 39  # session: the certificates (DER), or a result code
    BYE = 40  # session: orderly close with a reason
    CRL = 41  # session: platform -> node, the CA's signed certificate revocation list (DER)
    PEER_ANNOUNCE = 42  # session: node -> platform, "I listen for direct links here, for this long"
    PEER_LOOKUP = 43  # session: node -> platform, "where does this organization listen?"
    PEER_INFO = 44  # session: platform -> node, the answer: addresses and certificate fingerprint, or a code
    PRESENCE_QUERY = 45  # session: node -> platform, "are these organizations online?" (the ones it names)
    PRESENCE = 46  # session: platform -> node, the answer: online/offline, since when, last seen

    @property
    def is_message(self) -> bool:
        """Message kinds carry SaveFwd and may be relayed and stored."""
        return self < 32

    @property
    def seed_code(self) -> int | None:
        """The seed's protocol number: 809 for inquiries, 810 for acks."""
        if self in _ACK_KINDS or self is Kind.ACK_BATCH:
            return 810
        if self in (Kind.INQUIRY, Kind.INQUIRY_RESP):
            return 809
        return None


_ACK_KINDS: Final = frozenset(
    {Kind.ACK, Kind.REACK, Kind.ACK2, Kind.REACK2, Kind.ACK_FWD, Kind.ACK_SAVE}
)


class NodeType(IntEnum):
    """Endpoint types (SPEC "Identifiers")."""

    # A hot dict key: int's C-level hash (Enum's is hash(name), in Python),
    # which also agrees with IntEnum's int equality.
    __hash__ = int.__hash__

    ORGANIZATION = 1  # an organization's node
    PLATFORM = 2  # the relay
    USER = 3  # a user inside an organization (later)


class SaveFwd(IntEnum):
    """What happens when the target is not online (SPEC "UMX-T frames")."""

    NONE = 0  # session frames: not applicable
    DISCARD = 1  # drop it (and tell the origin)
    STORE = 2  # store at the platform, deliver later
    MUST_DELIVER = 3  # origin keeps it until confirmed; asks and resends


class AckFlag(IntEnum):
    """810 ``ack_flag``: which hop an ack confirms."""

    PLATFORM = 1  # ack between a node and the platform
    DELIVERY = 2  # end-to-end delivery confirmation


class ForwardFlag(IntEnum):
    """810 ``flag`` on ACK_FWD / ACK_SAVE."""

    NONE = 0  # not an ACK_FWD / ACK_SAVE
    FORWARDED = 1  # the platform forwarded at once
    STORED = 2  # the platform stored it


class InquiryFlag(IntEnum):
    """809 ``flag``: who asks."""

    FROM_PLATFORM = 1  # the platform asks a node
    FROM_PEER = 2  # a node asks (the platform or the other node)


class InquiryTopic(IntEnum):
    """What an inquiry asks (SPEC "The flow", A.5 and B.2)."""

    RECEIVED = 1  # "did you receive the message LK0 x?" (asked of a receiver or the platform)
    STATE = 2  # "what is the state of your record x?" (a receiver asks about its pending ack)


class InquiryResult(IntEnum):
    """809-Confirmation ``result``."""

    NOT_RECEIVED = 0  # RECEIVED: not here -> the asker resends
    RECEIVED = 1  # RECEIVED: here -> the asker marks SS_ACK2
    MARKED_ACKED = 2  # STATE: was SS_SENT, now marked SS_ACK (the ack had been lost)
    ALREADY_ACKED = 3  # STATE: already SS_ACK / SS_ACK2
    NO_RECORD = 4  # STATE: no such record: confirmed and cleaned up
    FORWARDED = 5  # RECEIVED, asked of the platform: forwarded at once (the lost ACK_FWD)
    STORED = 6  # RECEIVED, asked of the platform: stored for later delivery (the lost ACK_SAVE)


@dataclass(frozen=True, kw_only=True, slots=True)
class Endpoint:
    """(node_type, node_id): who sends or receives a frame."""

    node_type: NodeType
    node_id: str
    # Endpoints key the relay's and the nodes' per-batch dicts (sessions,
    # acks, forwards): the hash is computed once, not from a fresh tuple and
    # IntEnum's Python-level __hash__ at every look-up.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.node_type, NodeType):
            try:
                object.__setattr__(self, "node_type", NodeType(self.node_type))
            except ValueError:
                raise _invalid(f"node type {self.node_type!r} is not one of 1..3") from None
        nid = self.node_id
        if not isinstance(nid, str) or not nid:
            raise _invalid(f"node id {nid!r} is empty; it must be 1..{MAX_NODE_ID} characters")
        if len(nid) > MAX_NODE_ID:
            raise _invalid(f"node id of {len(nid)} characters exceeds the {MAX_NODE_ID} limit")
        if not _NODE_ID_RE.fullmatch(nid):
            raise _invalid(f"node id {nid!r} has characters outside [A-Za-z0-9._:@-]")
        object.__setattr__(self, "_hash", hash((int(self.node_type), nid)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # The generated __eq__ builds and compares two tuples; the relay
        # compares every frame's endpoints with its connection's and its
        # own. The same object (the decoder hands out one per endpoint), then
        # the cached hashes, tell most cases apart first.
        if self is other:
            return True
        if other.__class__ is not Endpoint:
            return NotImplemented
        return self._hash == other._hash and self.node_id == other.node_id and self.node_type == other.node_type

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt by the constructor: a str's hash differs between processes.
        return (_make_endpoint, (int(self.node_type), self.node_id))

    @classmethod
    def org(cls, node_id: str) -> Endpoint:
        return cls(node_type=NodeType.ORGANIZATION, node_id=node_id)

    @classmethod
    def platform(cls, node_id: str = "platform") -> Endpoint:
        return cls(node_type=NodeType.PLATFORM, node_id=node_id)

    def __str__(self) -> str:
        return f"{self.node_type.name.lower()}:{self.node_id}"


def _make_endpoint(node_type: int, node_id: str) -> Endpoint:
    return Endpoint(node_type=NodeType(node_type), node_id=node_id)


def _check_semq(name: str, value: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= MAX_SEMQ_ID:
        raise _invalid(f"{name} {value!r} is outside 1..{MAX_SEMQ_ID}")


def _check_record(name: str, value: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= MAX_RECORD_ID:
        raise _invalid(f"{name} {value!r} is outside 1..2**64-1")


@dataclass(frozen=True, kw_only=True, slots=True)
class LK0:
    """Source locator key: names a record at its owner, globally unique
    (node_type, node_id, semq_id, semq_db_id, record_id)."""

    endpoint: Endpoint
    record_id: int
    semq_id: int = 1
    semq_db_id: int = 1

    def __post_init__(self) -> None:
        # Fast path first: one fused comparison (decoding builds these per frame);
        # the named checks only run to word the error.
        s, d, r = self.semq_id, self.semq_db_id, self.record_id
        if not (
            type(s) is int and type(d) is int and type(r) is int
            and 1 <= s <= MAX_SEMQ_ID and 1 <= d <= MAX_SEMQ_ID and 1 <= r <= MAX_RECORD_ID
        ):
            _check_semq("semq_id", s)
            _check_semq("semq_db_id", d)
            _check_record("record_id", r)

    def __str__(self) -> str:
        return f"{self.endpoint.node_id}/{self.semq_id}/{self.semq_db_id}/{self.record_id}"

    @classmethod
    def parse(cls, text: str, node_type: NodeType = NodeType.ORGANIZATION) -> LK0:
        """Parse ``NODE/SEMQ/DB/RECORD`` (as printed by ``str``)."""
        parts = text.split("/")
        if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
            raise _invalid(f"LK0 {text!r} is not NODE/SEMQ_ID/DB_ID/RECORD_ID")
        return cls(
            endpoint=Endpoint(node_type=node_type, node_id=parts[0]),
            semq_id=int(parts[1]),
            semq_db_id=int(parts[2]),
            record_id=int(parts[3]),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class LK1:
    """Platform locator key (semq_id, semq_db_id, record_id) of the platform's
    stored copy; set only on messages the platform stored and later delivers."""

    record_id: int
    semq_id: int = 1
    semq_db_id: int = 1

    def __post_init__(self) -> None:
        # Fast path first: one fused comparison (decoding builds these per frame);
        # the named checks only run to word the error.
        s, d, r = self.semq_id, self.semq_db_id, self.record_id
        if not (
            type(s) is int and type(d) is int and type(r) is int
            and 1 <= s <= MAX_SEMQ_ID and 1 <= d <= MAX_SEMQ_ID and 1 <= r <= MAX_RECORD_ID
        ):
            _check_semq("semq_id", s)
            _check_semq("semq_db_id", d)
            _check_record("record_id", r)


@dataclass(frozen=True, kw_only=True, slots=True)
class AppKey:
    """Application key (domain, data_type, subtype, key), e.g.
    trade / ORDER / PO / S0001. Returned unchanged in acks."""

    domain: str = ""
    data_type: str = ""
    subtype: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        d, t, s, k = self.domain, self.data_type, self.subtype, self.key
        # Fast path: ASCII strings (checked in O(1)) are as many bytes as
        # characters and cannot hold surrogates.
        if (
            type(d) is str and type(t) is str and type(s) is str and type(k) is str
            and d.isascii() and t.isascii() and s.isascii() and k.isascii()
            and len(d) <= MAX_APPKEY_FIELD and len(t) <= MAX_APPKEY_FIELD
            and len(s) <= MAX_APPKEY_FIELD and len(k) <= MAX_APPKEY_FIELD
        ):
            return
        for name in ("domain", "data_type", "subtype", "key"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise _invalid(f"AppKey {name} {value!r} is not a string")
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate cannot go on the wire
                raise _invalid(f"AppKey {name} {value!r} is not valid UTF-8") from None
            if size > MAX_APPKEY_FIELD:
                raise _invalid(
                    f"AppKey {name} of {size} bytes exceeds the {MAX_APPKEY_FIELD}-byte limit"
                )

    def __str__(self) -> str:
        return f"{self.domain}/{self.data_type}/{self.subtype}/{self.key}"
