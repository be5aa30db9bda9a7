"""The bodies that are neither documents nor acks: INQUIRY and INQUIRY_RESP
(the seed's code 809 and its confirmation; SPEC "UMX-T frames", what an
answer does: "The flow"), NACK, a large document's CHUNK and CHUNK_ACK, and
the session's frames HELLO, WELCOME, PING, PONG, ERROR, WINDOW,
CERT_REQUEST, CERT_RESPONSE, CRL and BYE (docs/protocol.md "INQUIRY and
INQUIRY_RESP, seed code 809", "NACK (kind 11)", "CHUNK (kind 12)",
"CHUNK_ACK (kind 13)", "Session kinds (32..44)").

Few of these travel per document, so they are built and parsed through the
compiled construct schemas of _schema.py (``_COMPILED``) rather than
hand-written code; the values still validate in their constructors. CHUNK
is the exception: a large document is thousands of them, each carrying up
to megabytes, so its codec is hand-written ``struct`` code that copies the
payload once each way (``_chunk_head``, ``_decode_chunk``), tested byte for
byte against CHUNK_BODY (tests/protocol/test_protocol_fastpath.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, NamedTuple

from ._codec import _lk0_wire, _new, _slot_setters
from ._errors import LocalProtocolError, RemoteProtocolError, ResultCode
from ._limits import (
    _MAX_MS,
    _MAX_U32,
    _MAX_U64,
    MAX_CERTIFICATES,
    MAX_CRL,
    MAX_INQUIRY_ITEMS,
    MAX_PEER_ADDRESSES,
    MAX_PEER_ALLOWED,
    MAX_PEER_TTL,
    MAX_PRESENCE_ITEMS,
    MAX_PROOF,
    MAX_TOKEN,
    _check_bytes,
    _check_int,
    _check_text,
    _enum,
)
from ._schema import BODY_SCHEMAS
from ._types import (
    LK0,
    Endpoint,
    InquiryFlag,
    InquiryResult,
    InquiryTopic,
    Kind,
    _invalid,
)

__all__ = [
    "CHUNK_COMPRESSED",
    "Bye",
    "CertRequest",
    "CertResponse",
    "Chunk",
    "ChunkAck",
    "Crl",
    "Error",
    "Hello",
    "Inquiry",
    "InquiryAnswer",
    "InquiryResp",
    "Nack",
    "PeerAnnounce",
    "PeerInfo",
    "PeerLookup",
    "Ping",
    "Pong",
    "Presence",
    "PresenceEntry",
    "PresenceQuery",
    "PresenceState",
    "Welcome",
    "WindowUpdate",
]

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
    (semq.identity.crypto, docs/security.md "Refusals"); empty from the platform."""

    lk0: LK0
    code: ResultCode
    message: str = ""
    proof: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("message", self.message)
        _check_bytes("proof", self.proof, MAX_PROOF)


#: CHUNK ``flags`` bit 0: the chunk was compressed before it was sealed. The
#: other bits are zero in version 1 (refused with INVALID_FIELD).
CHUNK_COMPRESSED: Final = 0x01
_CHUNK_FLAGS_KNOWN: Final = CHUNK_COMPRESSED


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunk:
    """Chunk ``index`` (0-based) of the large document ``lk0``, whose
    manifest travelled as a DATA frame with FLAG_LARGE under the same LK0.
    ``payload``: the chunk as the origin sealed it (semq.node.large);
    ``flags``: CHUNK_COMPRESSED when it was compressed before sealing. It
    travels origin -> target (relayed like ACK2), so LK0's endpoint is the
    frame's origin (Frame checks it)."""

    lk0: LK0
    index: int
    flags: int = 0
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.lk0, LK0):
            raise _invalid(f"CHUNK lk0 must be an LK0, not {self.lk0!r}")
        i, f, p = self.index, self.flags, self.payload
        # Fast path first: one fused check; the named checks word the error.
        if (type(i) is int and type(f) is int and 0 <= i <= _MAX_U32 and 0 <= f <= _CHUNK_FLAGS_KNOWN
                and type(p) is bytes and len(p) <= _MAX_U32):
            return
        _check_int("chunk index", i, 0, _MAX_U32)
        _check_int("chunk flags", f, 0, 0xFF)
        if f & ~_CHUNK_FLAGS_KNOWN:
            raise _invalid(f"chunk flags 0x{f:02x} set bits other than CHUNK_COMPRESSED (0x01)")
        _check_bytes("chunk payload", p, _MAX_U32)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkAck:
    """The receiver of the large document ``lk0`` -> its origin (relayed like
    ACK2): every chunk with an index below ``through`` is committed at the
    receiver. ``code`` other than OK: the receiver refused the whole document
    for that reason (``message``: one line). LK0's endpoint is the frame's
    target, the document's origin, as on a NACK."""

    lk0: LK0
    through: int
    code: ResultCode = ResultCode.OK
    message: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lk0, LK0):
            raise _invalid(f"CHUNK_ACK lk0 must be an LK0, not {self.lk0!r}")
        _check_int("through", self.through, 0, _MAX_U32)
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("message", self.message)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hello:
    """First frame of a node on a connection. ``window``: how many unacked
    message frames the node accepts; ``token``: authentication material."""

    semq_id: int = 1
    semq_db_id: int = 1
    window: int = 1024
    software: str = "semq"
    token: bytes = b""
    units: int = 1  # the node's units (semq.umxt_protocol.units): this one is ``semq_id`` of them

    def __post_init__(self) -> None:
        _check_int("semq_id", self.semq_id, 1, 0xFFFF)
        _check_int("semq_db_id", self.semq_db_id, 1, 0xFFFF)
        _check_int("units", self.units, 1, 0xFFFF)
        if self.semq_id > self.units:
            raise LocalProtocolError(f"semq_id {self.semq_id} is over the node's {self.units} unit(s)",
                                     ResultCode.INVALID_FIELD)
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


def _check_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """Direct-link addresses: HOST:PORT texts of at most 255 bytes, at most
    MAX_PEER_ADDRESSES of them (their form is checked where they are used:
    a relay passes them on, a node dials them)."""
    if isinstance(addresses, str | bytes):
        raise _invalid("addresses must be a sequence of HOST:PORT texts, not one text")
    out = tuple(addresses)
    if not all(isinstance(a, str) for a in out):
        raise _invalid("addresses must be texts")
    if len(out) > MAX_PEER_ADDRESSES:
        raise _invalid(f"{len(out)} addresses exceed the {MAX_PEER_ADDRESSES} limit")
    for a in out:
        _check_text("address", a)
        if not a or len(a.encode("utf-8", "replace")) > 255 or not a.isprintable():
            raise _invalid(f"address {a!r} is not 1..255 printable bytes")
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerAnnounce:
    """A node listens for direct links at ``addresses`` (HOST:PORT) for
    ``ttl_s`` seconds (0 withdraws). ``observe``: the platform puts in the
    address it sees the node's connection come from, with each announced
    port. ``allowed``: the organizations that may look it up and connect
    (empty: every organization the platform admits)."""

    ttl_s: int
    addresses: tuple[str, ...] = ()
    observe: bool = False
    allowed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_int("ttl_s", self.ttl_s, 0, MAX_PEER_TTL)
        object.__setattr__(self, "addresses", _check_addresses(self.addresses))
        if isinstance(self.allowed, str | bytes):
            raise _invalid("allowed must be a sequence of organization ids, not one text")
        allowed = tuple(self.allowed)
        if len(allowed) > MAX_PEER_ALLOWED:
            raise _invalid(f"{len(allowed)} allowed organizations exceed the {MAX_PEER_ALLOWED} limit")
        for org in allowed:
            try:
                Endpoint.org(org)  # validates the id
            except LocalProtocolError as e:
                raise _invalid(f"allowed organization {org!r}: {e}") from None
        object.__setattr__(self, "allowed", allowed)
        object.__setattr__(self, "observe", bool(self.observe))


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerLookup:
    endpoint: Endpoint


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerInfo:
    """Where ``endpoint`` listens for direct links (until ``expires_ms``)
    and the fingerprint of the certificate its platform connection
    presented; or a result code (DIRECT_NOT_ALLOWED, NO_DIRECT_ADDRESS,
    UNKNOWN_TARGET) and no addresses."""

    endpoint: Endpoint
    code: ResultCode = ResultCode.OK
    expires_ms: int = 0
    fingerprint: str = ""
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_int("expires_ms", self.expires_ms, 0, _MAX_MS)
        if not isinstance(self.fingerprint, str) or len(self.fingerprint) > 255 or not self.fingerprint.isascii():
            raise _invalid(f"fingerprint {self.fingerprint[:40]!r} is not up to 255 ASCII characters")
        object.__setattr__(self, "addresses", _check_addresses(self.addresses))


class PresenceState(IntEnum):
    """What the platform says of an organization named in a PRESENCE_QUERY."""

    __hash__ = int.__hash__

    UNKNOWN = 0  # not an organization the platform knows (or revoked): nothing else is told
    ONLINE = 1  # connected to the platform now (any of its units), since ``since_ms``
    OFFLINE = 2  # not connected; ``since_ms``: when it was last seen (0: never)


def _check_orgs(orgs: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(orgs, str | bytes):
        raise _invalid(f"{what} must be a sequence of organization ids, not one text")
    out = tuple(orgs)
    if not 1 <= len(out) <= MAX_PRESENCE_ITEMS:
        raise _invalid(f"{what} of {len(out)} organizations is outside 1..{MAX_PRESENCE_ITEMS}")
    for org in out:
        try:
            Endpoint.org(org)  # validates the id
        except LocalProtocolError as e:
            raise _invalid(f"{what}: organization {org!r}: {e}") from None
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class PresenceQuery:
    """A node asks whether the organizations it names are online (its
    partners: 1..MAX_PRESENCE_ITEMS ids). There is no "everyone": the
    platform answers only for the names asked (docs/security.md, "What
    presence tells")."""

    orgs: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "orgs", _check_orgs(self.orgs, "PRESENCE_QUERY"))


class PresenceEntry(NamedTuple):
    org: str
    state: PresenceState
    since_ms: int  # ONLINE: when its session began; OFFLINE: when it was last seen (0: never)
    last_seen_ms: int  # the last time the platform saw it connected (0: never)


@dataclass(frozen=True, kw_only=True, slots=True)
class Presence:
    """The platform's answer to a PRESENCE_QUERY: one entry per name asked."""

    entries: tuple[PresenceEntry, ...]

    def __post_init__(self) -> None:
        entries = tuple(PresenceEntry(e[0], _enum(PresenceState, "presence state", e[1]), e[2], e[3])
                        for e in self.entries)
        _check_orgs([e.org for e in entries], "PRESENCE")
        for e in entries:
            _check_int("since_ms", e.since_ms, 0, _MAX_MS)
            _check_int("last_seen_ms", e.last_seen_ms, 0, _MAX_MS)
        object.__setattr__(self, "entries", entries)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bye:
    code: ResultCode = ResultCode.OK
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", _enum(ResultCode, "code", self.code))
        _check_text("reason", self.reason)


def _lk(lk: LK0) -> dict[str, Any]:
    return {
        "node_type": int(lk.endpoint.node_type),
        "node_id": lk.endpoint.node_id,
        "semq_id": lk.semq_id,
        "semq_db_id": lk.semq_db_id,
        "record_id": lk.record_id,
    }


# The kinds encoded and decoded by their construct schema (the others have
# hand-written codecs: _data, _acks, the CHUNK below). _frames' ``Body`` is
# this and those; named here so that this module needs nothing of _frames.
SchemaBody = (
    Inquiry | InquiryResp | Nack | ChunkAck | Hello | Welcome | Ping | Pong | Error | WindowUpdate
    | CertRequest | CertResponse | Bye | Crl | PeerAnnounce | PeerLookup | PeerInfo | PresenceQuery | Presence
)


def _body_container(body: SchemaBody) -> dict[str, Any]:
    """The construct container for the kinds encoded by schema (not hot)."""
    if isinstance(body, Inquiry):
        return {"flag": body.flag, "topic": body.topic, "count": len(body.items),
                "items": [_lk(i) for i in body.items]}
    if isinstance(body, InquiryResp):
        return {"flag": body.flag, "topic": body.topic, "count": len(body.answers),
                "items": [{**_lk(a.lk0), "result": int(a.result)} for a in body.answers]}
    if isinstance(body, Nack):
        return {**_lk(body.lk0), "code": int(body.code), "message": body.message, "proof": body.proof}
    if isinstance(body, ChunkAck):
        return {**_lk(body.lk0), "through": body.through, "code": int(body.code), "message": body.message}
    if isinstance(body, Hello | Welcome | Ping | Pong | WindowUpdate):
        return {f: getattr(body, f) for f in body.__dataclass_fields__}
    if isinstance(body, Error):
        return {"code": int(body.code), "message": body.message}
    if isinstance(body, Bye):
        return {"code": int(body.code), "reason": body.reason}
    if isinstance(body, Crl):
        return {"crl": body.der}
    if isinstance(body, PeerAnnounce):
        return {"ttl_s": body.ttl_s, "observe": int(body.observe), "count": len(body.addresses),
                "addresses": list(body.addresses), "allowed_count": len(body.allowed),
                "allowed": list(body.allowed)}
    if isinstance(body, PeerLookup):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id}
    if isinstance(body, PeerInfo):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id,
                "code": int(body.code), "expires_ms": body.expires_ms, "fingerprint": body.fingerprint,
                "count": len(body.addresses), "addresses": list(body.addresses)}
    if isinstance(body, PresenceQuery):
        return {"count": len(body.orgs), "orgs": list(body.orgs)}
    if isinstance(body, Presence):
        return {"count": len(body.entries),
                "items": [{"node_id": e.org, "state": int(e.state), "since_ms": e.since_ms,
                           "last_seen_ms": e.last_seen_ms} for e in body.entries]}
    if isinstance(body, CertRequest):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id}
    if isinstance(body, CertResponse):
        return {"node_type": int(body.endpoint.node_type), "node_id": body.endpoint.node_id,
                "code": int(body.code), "count": len(body.certificates),
                "certificates": list(body.certificates)}
    raise LocalProtocolError(f"no encoder for {type(body).__name__}")  # pragma: no cover


_COMPILED: Final = {k: s.compile() for k, s in BODY_SCHEMAS.items()}


def _loc(c: Any) -> LK0:
    return LK0(
        endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id),
        semq_id=c.semq_id,
        semq_db_id=c.semq_db_id,
        record_id=c.record_id,
    )


def _decode_by_schema(kind: Kind, buf: bytes) -> SchemaBody:
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
    if kind is Kind.CHUNK_ACK:
        return ChunkAck(lk0=_loc(c), through=c.through, code=c.code, message=c.message)
    if kind is Kind.HELLO:
        return Hello(semq_id=c.semq_id, semq_db_id=c.semq_db_id, window=c.window,
                     software=c.software, token=c.token, units=c.units)
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
    if kind is Kind.PEER_ANNOUNCE:
        if c.observe > 1:
            raise RemoteProtocolError(f"PEER_ANNOUNCE observe flag {c.observe} is not 0 or 1",
                                      ResultCode.INVALID_FIELD)
        return PeerAnnounce(ttl_s=c.ttl_s, observe=bool(c.observe), addresses=tuple(c.addresses),
                            allowed=tuple(c.allowed))
    if kind is Kind.PEER_LOOKUP:
        return PeerLookup(endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id))
    if kind is Kind.PEER_INFO:
        return PeerInfo(endpoint=Endpoint(node_type=c.node_type, node_id=c.node_id), code=c.code,
                        expires_ms=c.expires_ms, fingerprint=c.fingerprint, addresses=tuple(c.addresses))
    if kind is Kind.PRESENCE_QUERY:
        return PresenceQuery(orgs=tuple(c.orgs))
    if kind is Kind.PRESENCE:
        return Presence(entries=tuple(PresenceEntry(i.node_id, i.state, i.since_ms, i.last_seen_ms)
                                      for i in c["items"]))
    if kind is Kind.BYE:
        return Bye(code=c.code, reason=c.reason)
    if kind is Kind.CRL:
        return Crl(der=c.crl)
    raise RemoteProtocolError(f"no decoder for {kind.name}", ResultCode.UNKNOWN_KIND)  # pragma: no cover



# ---------------------------------------------------------------- CHUNK
# The hand-written codec of CHUNK_BODY: the locator's endpoint (u8 type, u8
# length, ASCII id), then one fixed run of LK0's ids, index, flags and the
# payload's u32 length, then the payload.

_LOC_HEAD: Final = struct.Struct(">BB")  # LK0 node_type, node id length
_CHUNK_FIXED: Final = struct.Struct(">HHQIBI")  # semq_id, semq_db_id, record_id, index, flags, payload length
_CHUNK_SET: Final = _slot_setters(Chunk, "lk0", "index", "flags", "payload")


def _chunk_head(c: Chunk) -> bytes:
    """The CHUNK body up to its payload (which follows it unchanged):
    encode_frame joins the payload straight into the frame, copying it once."""
    lk0 = c.lk0
    ep = lk0.endpoint
    nid = ep.node_id.encode("ascii")
    return b"".join((
        _LOC_HEAD.pack(ep.node_type, len(nid)), nid,
        _CHUNK_FIXED.pack(lk0.semq_id, lk0.semq_db_id, lk0.record_id, c.index, c.flags, len(c.payload)),
    ))


def _encode_chunk(c: Chunk) -> bytes:
    return b"".join((_chunk_head(c), c.payload))


def _decode_chunk(buf: bytes | memoryview, origin: Endpoint) -> Chunk:
    """A CHUNK body; ``buf`` may be a view of the received frame (the payload
    is then copied out of it once). ``origin`` (the frame's) is the LK0's
    endpoint object when the locator names it, as it must."""
    size = len(buf)
    if size < 2:
        raise RemoteProtocolError(f"CHUNK body of {size} bytes is too short", ResultCode.MALFORMED_FRAME)
    at = 2 + buf[1]
    end = at + _CHUNK_FIXED.size
    if end > size:
        raise RemoteProtocolError(f"CHUNK body of {size} bytes is too short", ResultCode.MALFORMED_FRAME)
    semq, db, rec, index, flags, p_len = _CHUNK_FIXED.unpack_from(buf, at)
    if end + p_len != size:
        raise RemoteProtocolError(
            f"CHUNK payload declares {p_len} bytes but {size - end} remain", ResultCode.MALFORMED_FRAME
        )
    node_type, node_id = buf[0], str(buf[2:at], "ascii")
    if node_type == origin.node_type and node_id == origin.node_id:
        endpoint = origin
    else:  # (Frame refuses it; the Endpoint is validated to say what it is)
        endpoint = Endpoint(node_type=node_type, node_id=node_id)  # type: ignore[arg-type]
    lk0 = _lk0_wire(endpoint, semq, db, rec)
    # Left open by the layout: the flags' undefined bits.
    if flags & ~_CHUNK_FLAGS_KNOWN:
        return Chunk(lk0=lk0, index=index, flags=flags)  # raises
    c = _new(Chunk)
    s = _CHUNK_SET
    s[0](c, lk0)
    s[1](c, index)
    s[2](c, flags)
    s[3](c, bytes(buf[end:]))
    return c
