"""Canonical byte encodings shared by the AAD, signed containers and receipts.

Every variable field is length-prefixed, so two different values never encode
to the same bytes (no ambiguity for an attacker to exploit). Big-endian.
"""

from __future__ import annotations

import struct
from typing import Final

from semq.umxt_protocol import LK0, AppKey, Endpoint, NodeType, ProtocolError

__all__ = [
    "Reader",
    "WireError",
    "encode_app_key",
    "encode_endpoint",
    "encode_lk0",
]

U8: Final = struct.Struct(">B")
U16: Final = struct.Struct(">H")
U32: Final = struct.Struct(">I")
U64: Final = struct.Struct(">Q")
_LK0_TAIL: Final = struct.Struct(">HHQ")


class WireError(ValueError):
    """Malformed bytes; callers turn it into their own error (DecryptError,
    BadSignature) at one boundary."""


# Encodings of the few endpoints and AppKeys a node sees, computed once
# (every document encodes its source, target and LK0 endpoint). Keyed on
# immutable values only (the node id string; a frozen AppKey of strings);
# cleared when they grow past _CACHE_MAX entries.
_CACHE_MAX: Final = 4096
_ENDPOINTS: dict[str, tuple[NodeType, bytes]] = {}
_APP_KEYS: dict[AppKey, bytes] = {}


def encode_endpoint(ep: Endpoint) -> bytes:
    hit = _ENDPOINTS.get(ep.node_id)
    if hit is not None and hit[0] is ep.node_type:
        return hit[1]
    nid = ep.node_id.encode("ascii")
    out = bytes((int(ep.node_type), len(nid))) + nid
    if type(ep.node_id) is str and type(ep.node_type) is NodeType:
        if len(_ENDPOINTS) >= _CACHE_MAX:
            _ENDPOINTS.clear()
        _ENDPOINTS[ep.node_id] = (ep.node_type, out)
    return out


def encode_lk0(lk0: LK0) -> bytes:
    return encode_endpoint(lk0.endpoint) + _LK0_TAIL.pack(
        lk0.semq_id, lk0.semq_db_id, lk0.record_id
    )


def encode_app_key(ak: AppKey) -> bytes:
    hit = _APP_KEYS.get(ak)
    if hit is not None:
        return hit
    out = bytearray()
    for s in (ak.domain, ak.data_type, ak.subtype, ak.key):
        b = s.encode("utf-8")
        out += U8.pack(len(b))
        out += b
    enc = bytes(out)
    if type(ak) is AppKey:
        if len(_APP_KEYS) >= _CACHE_MAX:
            _APP_KEYS.clear()
        _APP_KEYS[ak] = enc
    return enc


class Reader:
    """Bounds-checked reading of a byte string; raises WireError naming what
    ran short."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise WireError(f"{what} runs past the end ({len(self.buf)} bytes)")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        v: int = U16.unpack(self.take(2, what))[0]
        return v

    def u32(self, what: str) -> int:
        v: int = U32.unpack(self.take(4, what))[0]
        return v

    def u64(self, what: str) -> int:
        v: int = U64.unpack(self.take(8, what))[0]
        return v

    def endpoint(self, what: str) -> Endpoint:
        t = self.u8(what)
        n = self.u8(what)
        raw = self.take(n, what)
        try:
            return Endpoint(node_type=NodeType(t), node_id=raw.decode("ascii"))
        except (ValueError, ProtocolError) as e:
            raise WireError(f"{what} is not a valid endpoint: {e}") from None

    def lk0(self, what: str) -> LK0:
        ep = self.endpoint(what)
        semq, db, rec = _LK0_TAIL.unpack(self.take(_LK0_TAIL.size, what))
        try:
            return LK0(endpoint=ep, semq_id=semq, semq_db_id=db, record_id=rec)
        except ProtocolError as e:
            raise WireError(f"{what} is not a valid LK0: {e}") from None

    def app_key(self, what: str) -> AppKey:
        parts = []
        for _ in range(4):
            n = self.u8(what)
            try:
                parts.append(self.take(n, what).decode("utf-8"))
            except UnicodeDecodeError:
                raise WireError(f"{what} is not UTF-8") from None
        return AppKey(domain=parts[0], data_type=parts[1], subtype=parts[2], key=parts[3])

    def rest(self) -> bytes:
        out = self.buf[self.pos:]
        self.pos = len(self.buf)
        return out

    def end(self, what: str) -> None:
        if self.pos != len(self.buf):
            raise WireError(f"{what} has {len(self.buf) - self.pos} unexpected trailing bytes")
