"""UMX-T frames as strict values, and their encoding.

A ``Frame`` is the header attributes (kind, endpoints, Reliable, SaveFwd,
Ack2, priority; SPEC "UMX-T frames", docs/protocol.md "Header") plus one
body value whose type matches the kind. Every body class is a frozen
keyword-only dataclass that validates in its constructor (LocalProtocolError,
ResultCode.INVALID_FIELD), defined beside its codec:

- ``_data``: DATA, the document, and ``encode_data``;
- ``_acks``: the six ack kinds and ACK_BATCH;
- ``_control``: inquiries, NACK, CHUNK, CHUNK_ACK and the session's frames;
- ``_limits``: flag bits, size limits and the shared checks;
- ``_codec``: the fixed layouts, the CRC, the AppKey, values built off the wire.

This module holds what spans the kinds: the ``Frame`` and which body each
kind carries, ``encode_frame`` (a Frame to bytes, CRC32 trailer included),
and ``decode_body`` and ``frame_from_wire``, which the stream decoder
(_decoder.RawFrame) uses to turn a body and a checked header back into a
Frame, raising RemoteProtocolError. It also re-exports the names of the
modules above: every frame value and codec can be imported from here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from construct import ConstructError

import semq.umxt_protocol._codec as _codec  # the module: its layouts are bound by assignment below

from ._acks import (
    _ACK_RULES,
    Ack,
    AckBatch,
    AckEntry,
    _decode_ack,
    _decode_ack_batch,
    _encode_ack,
    _encode_ack_batch,
)
from ._codec import (
    HEADER_SIZE,
    _new,
    _slot_setters,
    crc32,
    lk0_from_wire,
    lk1_from_wire,
    read_app_key,
)
from ._control import (
    _COMPILED,
    CHUNK_COMPRESSED,
    Bye,
    CertRequest,
    CertResponse,
    Chunk,
    ChunkAck,
    Crl,
    Error,
    Hello,
    Inquiry,
    InquiryAnswer,
    InquiryResp,
    Nack,
    PeerAnnounce,
    PeerInfo,
    PeerLookup,
    Ping,
    Pong,
    Presence,
    PresenceEntry,
    PresenceQuery,
    PresenceState,
    Welcome,
    WindowUpdate,
    _body_container,
    _chunk_head,
    _decode_by_schema,
    _decode_chunk,
    _encode_chunk,
)
from ._data import Data, _decode_data, _encode_data, encode_data
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, ResultCode
from ._limits import (
    _MAX_U32,
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_ENVELOPE,
    FLAG_KEY_SEALED,
    FLAG_LARGE,
    FLAG_LAYER,
    FLAG_ORDERED,
    FLAG_RELIABLE,
    FLAGS_KNOWN,
    MAX_ACK_BATCH,
    MAX_CERTIFICATES,
    MAX_CRL,
    MAX_PRESENCE_ITEMS,
    MAX_SESSION_KEY,
    MAX_TEXT,
    _check_int,
    _enum,
)
from ._schema import MAGIC, VERSION
from ._types import _ACK_KINDS, MAX_PRIORITY, Endpoint, Kind, SaveFwd, _invalid

__all__ = [
    "CHUNK_COMPRESSED",
    "FLAGS_KNOWN",
    "FLAG_ACK2",
    "FLAG_ENCRYPT",
    "FLAG_ENVELOPE",
    "FLAG_KEY_SEALED",
    "FLAG_LARGE",
    "FLAG_LAYER",
    "FLAG_ORDERED",
    "FLAG_RELIABLE",
    "HEADER_SIZE",
    "MAX_ACK_BATCH",
    "MAX_CERTIFICATES",
    "MAX_CRL",
    "MAX_PRESENCE_ITEMS",
    "MAX_SESSION_KEY",
    "MAX_TEXT",
    "Ack",
    "AckBatch",
    "AckEntry",
    "Body",
    "Bye",
    "CertRequest",
    "CertResponse",
    "Chunk",
    "ChunkAck",
    "Crl",
    "Data",
    "Error",
    "Frame",
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
    "crc32",
    "decode_body",
    "encode_body",
    "encode_data",
    "encode_frame",
    "encode_frames",
    "frame_from_wire",
    "lk0_from_wire",
    "lk1_from_wire",
    "read_app_key",
]

# Bound by assignment, not imported: see _codec, above its layouts.
_CRC: Final = _codec._CRC
_HEADER: Final = _codec._HEADER


Body = (
    Data | Ack | AckBatch | Inquiry | InquiryResp | Nack | Chunk | ChunkAck | Hello | Welcome | Ping | Pong
    | Error | WindowUpdate | CertRequest | CertResponse | Bye | Crl | PeerAnnounce | PeerLookup | PeerInfo
    | PresenceQuery | Presence
)

_MESSAGE_KINDS: Final = frozenset(k for k in Kind if k.is_message)
# A member read off the Enum class costs a lookup through its metaclass
# (~0.1 us); the per-frame checks for CHUNK compare with this global instead.
_CHUNK: Final = Kind.CHUNK

_BODY_TYPE: Final[dict[Kind, type]] = {
    Kind.DATA: Data,
    **{k: Ack for k in _ACK_KINDS},
    Kind.INQUIRY: Inquiry,
    Kind.INQUIRY_RESP: InquiryResp,
    Kind.ACK_BATCH: AckBatch,
    Kind.NACK: Nack,
    Kind.CHUNK: Chunk,
    Kind.CHUNK_ACK: ChunkAck,
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
    Kind.PEER_ANNOUNCE: PeerAnnounce,
    Kind.PEER_LOOKUP: PeerLookup,
    Kind.PEER_INFO: PeerInfo,
    Kind.PRESENCE_QUERY: PresenceQuery,
    Kind.PRESENCE: Presence,
}


# ---------------------------------------------------------------- frame


@dataclass(frozen=True, kw_only=True, slots=True)
class Frame:
    """One UMX-T frame. ``source`` is the transport source of this hop (the
    platform on frames it relays), ``target`` the final target, ``origin`` the
    application-level source (defaults: DATA -> its LK0's endpoint, otherwise
    ``source``; a CHUNK's LK0 must name it). ``save_fwd`` defaults to MUST_DELIVER on message kinds and
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
        # Acks, inquiries, NACK, CHUNK, CHUNK_ACK: SaveFwd=3, reliable, no
        # confirmation of their own.
        if sf is not SaveFwd.MUST_DELIVER or self.ack2 or not self.reliable:
            raise _invalid(
                f"{kind.name} travels with Reliable=1 SaveFwd=3 Ack2=0, not"
                f" Reliable={int(self.reliable)} SaveFwd={int(sf)} Ack2={int(self.ack2)}"
            )
        if kind is _CHUNK:
            # A chunk is its origin's, as a document is (the relay checks
            # that the origin is the sending connection's).
            assert isinstance(self.body, Chunk)
            if self.body.lk0.endpoint != self.origin:
                raise _invalid(f"CHUNK LK0 names {self.body.lk0.endpoint} but origin is {self.origin}")
            return
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
            if self.body.envelope:
                f |= FLAG_ENVELOPE
            if self.body.ordered:
                f |= FLAG_ORDERED
            if self.body.large:
                f |= FLAG_LARGE
        return f


# ---------------------------------------------------------------- encoding


def encode_body(kind: Kind, body: Body) -> bytes:
    if isinstance(body, Data):
        return _encode_data(body)
    if isinstance(body, Ack):
        return _encode_ack(body)
    if isinstance(body, AckBatch):
        return _encode_ack_batch(body)
    if isinstance(body, Chunk):
        return _encode_chunk(body)
    try:
        out: bytes = _COMPILED[kind].build(_body_container(body))
    except (ConstructError, struct.error, UnicodeError) as e:
        raise LocalProtocolError(f"cannot encode {kind.name}: {e}", ResultCode.INVALID_FIELD) from e
    return out


def encode_frame(frame: Frame) -> bytes:
    """The bytes of one frame, CRC32 trailer included."""
    if frame.kind is _CHUNK:
        return _encode_chunk_frame(frame)
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


def _encode_chunk_frame(frame: Frame) -> bytes:
    """encode_frame of a CHUNK: the payload (up to megabytes) is copied once,
    into the frame, and the CRC is run over the parts in turn."""
    chunk = frame.body
    assert isinstance(chunk, Chunk)
    before = _chunk_head(chunk)
    payload = chunk.payload
    body_len = len(before) + len(payload)
    if body_len > _MAX_U32:
        raise LocalProtocolError(
            f"frame body of {body_len} bytes exceeds the 4 GiB wire limit", ResultCode.FRAME_TOO_LARGE
        )
    src = frame.source.node_id.encode("ascii")
    dst = frame.target.node_id.encode("ascii")
    org = frame.origin.node_id.encode("ascii")
    head = _HEADER.pack(
        MAGIC, VERSION, frame.kind, frame.flags, frame.save_fwd, frame.priority,
        frame.source.node_type, frame.target.node_type, frame.origin.node_type,
        len(src), len(dst), len(org), 0, body_len,
    )
    parts = [head, src, dst, org, before, payload]
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    parts.append(_CRC.pack(crc))
    return b"".join(parts)


def encode_frames(frames: list[Frame]) -> bytes:
    """Several frames coalesced for one ``send_all``."""
    return b"".join([encode_frame(f) for f in frames])


# ---------------------------------------------------------------- decoding

_FRAME_SET: Final = _slot_setters(
    Frame, "kind", "source", "target", "body", "origin", "reliable", "save_fwd", "ack2", "priority"
)
_SAVE_FWD: Final = tuple(SaveFwd)  # index = wire value 0..3


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


def decode_body(kind: Kind, buf: bytes, origin: Endpoint, flags: int) -> Body:
    """Parse one body. Raises RemoteProtocolError (never construct's errors)."""
    try:
        if kind is Kind.DATA:
            return _decode_data(buf, origin, bool(flags & FLAG_ENCRYPT), bool(flags & FLAG_KEY_SEALED),
                                bool(flags & FLAG_ENVELOPE), bool(flags & FLAG_ORDERED),
                                bool(flags & FLAG_LARGE))
        if kind in _ACK_KINDS:
            return _decode_ack(kind, buf)
        if kind is Kind.ACK_BATCH:
            return _decode_ack_batch(buf)
        if kind is _CHUNK:
            return _decode_chunk(buf, origin)
        return _decode_by_schema(kind, buf)
    except RemoteProtocolError:
        raise
    except (ProtocolError, ConstructError, struct.error, IndexError, UnicodeError, ValueError) as e:
        raise _body_error(kind, e) from e


def decode_chunk_body(buf: bytes | memoryview, origin: Endpoint) -> Chunk:
    """``decode_body`` of a CHUNK, also from a view of the received frame
    (RawFrame.frame passes one: the payload is copied out of the frame once,
    not first into a body and then into the value)."""
    try:
        return _decode_chunk(buf, origin)
    except RemoteProtocolError:
        raise
    except (ProtocolError, ConstructError, struct.error, IndexError, UnicodeError, ValueError) as e:
        raise _body_error(Kind.CHUNK, e) from e


def _body_error(kind: Kind, e: Exception) -> RemoteProtocolError:
    if isinstance(e, ProtocolError):
        return RemoteProtocolError(f"{kind.name}: {e}", e.code)
    return RemoteProtocolError(f"malformed {kind.name} body: {e}", ResultCode.MALFORMED_FRAME)

