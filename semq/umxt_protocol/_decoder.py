"""Stream framing: bytes in, in any split, complete frames out (h2's rule:
read the fixed header, check the declared length against the limit before
waiting for the body, wait for the whole frame, then parse)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final

from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, ResultCode
from ._frames import (
    _CRC,
    _DATA_PREFIX,
    _HEADER,
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_LAYER,
    FLAG_RELIABLE,
    FLAGS_KNOWN,
    HEADER_SIZE,
    Frame,
    decode_body,
)
from ._schema import MAGIC, VERSION
from ._types import LK0, LK1, MAX_NODE_ID, Endpoint, Kind, NodeType, SaveFwd

__all__ = ["DEFAULT_MAX_FRAME", "HEADER_SIZE", "FrameDecoder", "RawFrame", "relay_bytes"]

DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024  # bytes, whole frame (SPEC/issue default 64 MiB)
_KINDS: Final = {int(k): k for k in Kind}
_NODE_TYPES: Final = {int(t) for t in NodeType}
_CACHE_LIMIT: Final = 4096
_endpoint_cache: dict[tuple[int, bytes], Endpoint] = {}


def _endpoint(node_type: int, raw: bytes) -> Endpoint:
    key = (node_type, raw)
    ep = _endpoint_cache.get(key)
    if ep is None:
        try:
            ep = Endpoint(node_type=NodeType(node_type), node_id=raw.decode("ascii"))
        except (ProtocolError, UnicodeDecodeError) as e:
            raise RemoteProtocolError(f"bad endpoint: {e}", ResultCode.INVALID_FIELD) from e
        if len(_endpoint_cache) >= _CACHE_LIMIT:
            _endpoint_cache.clear()
        _endpoint_cache[key] = ep
    return ep


class RawFrame:
    """A complete, checksum-verified frame whose header is parsed and whose
    body is not. A relay routes on this and forwards ``raw`` (or
    ``relay_bytes``) without ever parsing the body."""

    __slots__ = ("_body_start", "flags", "kind", "origin", "priority", "raw", "save_fwd", "source", "target")

    def __init__(
        self, *, kind: Kind, flags: int, save_fwd: int, priority: int, source: Endpoint,
        target: Endpoint, origin: Endpoint, raw: bytes, body_start: int,
    ) -> None:
        self.kind = kind
        self.flags = flags
        self.save_fwd = save_fwd
        self.priority = priority
        self.source = source
        self.target = target
        self.origin = origin
        self.raw = raw
        self._body_start = body_start

    @property
    def body(self) -> bytes:
        return self.raw[self._body_start : -4]

    @property
    def reliable(self) -> bool:
        return bool(self.flags & FLAG_RELIABLE)

    @property
    def ack2(self) -> bool:
        return bool(self.flags & FLAG_ACK2)

    def data_prefix(self) -> tuple[LK0, LK1 | None, int, int | None]:
        """(LK0, LK1, created_ms, expires_ms) of a DATA frame, from its fixed
        prefix only. Raises RemoteProtocolError on a short or invalid prefix."""
        if self.kind is not Kind.DATA:
            raise LocalProtocolError(f"data_prefix() on a {self.kind.name} frame")
        try:
            s, d, r, ls, ld, lr, created, expires = _DATA_PREFIX.unpack_from(self.raw, self._body_start)
            lk0 = LK0(endpoint=self.origin, semq_id=s, semq_db_id=d, record_id=r)
            lk1 = LK1(semq_id=ls, semq_db_id=ld, record_id=lr) if lr else None
        except ProtocolError as e:
            raise RemoteProtocolError(f"DATA prefix: {e}", e.code) from e
        except Exception as e:
            raise RemoteProtocolError(f"DATA prefix: {e}", ResultCode.MALFORMED_FRAME) from e
        return lk0, lk1, created, expires or None

    def frame(self) -> Frame:
        """Parse the body; the full, validated Frame. Raises RemoteProtocolError."""
        body = decode_body(self.kind, self.body, self.origin, self.flags)
        try:
            frame = Frame(
                kind=self.kind, source=self.source, target=self.target, origin=self.origin,
                body=body, reliable=bool(self.flags & FLAG_RELIABLE),
                save_fwd=SaveFwd(self.save_fwd), ack2=bool(self.flags & FLAG_ACK2),
                priority=self.priority,
            )
        except ProtocolError as e:
            raise RemoteProtocolError(f"{self.kind.name} from {self.source}: {e}", e.code) from e
        if frame.flags != self.flags:
            raise RemoteProtocolError(
                f"{self.kind.name} flags 0x{self.flags:02x} contradict its body (0x{frame.flags:02x})",
                ResultCode.INVALID_FIELD,
            )
        return frame

    def __repr__(self) -> str:
        return f"<RawFrame {self.kind.name} {self.source}->{self.target} {len(self.raw)}B>"


def relay_bytes(raw: RawFrame, source: Endpoint, lk1: LK1 | None = None) -> bytes:
    """The frame as the relay sends it on: transport source replaced (SPEC:
    "the transport source of a frame the platform relays is the platform"),
    LK1 spliced into a DATA prefix when given, CRC recomputed; the body after
    the prefix is copied untouched."""
    b = raw.raw
    (_m, _v, kind, flags, sf, prio, _st, tt, ot, sl, tl, ol, _r, body_len) = _HEADER.unpack_from(b)
    src = source.node_id.encode("ascii")
    ids_end = HEADER_SIZE + sl + tl + ol
    head = _HEADER.pack(
        MAGIC, VERSION, kind, flags, sf, prio, source.node_type, tt, ot, len(src), tl, ol, 0, body_len
    )
    body = b[ids_end:-4]
    if lk1 is not None:
        if raw.kind is not Kind.DATA:
            raise LocalProtocolError(f"LK1 on a {raw.kind.name} frame")
        pre = bytearray(body[: _DATA_PREFIX.size])
        pre[12:24] = lk1.semq_id.to_bytes(2, "big") + lk1.semq_db_id.to_bytes(2, "big") + lk1.record_id.to_bytes(8, "big")
        body = bytes(pre) + body[_DATA_PREFIX.size :]
    out = b"".join((head, src, b[HEADER_SIZE + sl : ids_end], body))
    return out + _CRC.pack(zlib.crc32(out))


class FrameDecoder:
    """Incremental decoder. ``receive_data`` appends bytes; ``next_frame``
    returns the next complete frame or None. After a RemoteProtocolError the
    decoder is broken: every later call raises the same error (the connection
    must be closed after sending its result code)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame_size < HEADER_SIZE + 4:
            raise ValueError(f"max_frame_size {max_frame_size} is below the {HEADER_SIZE + 4}-byte minimum")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[RawFrame]:
        while (f := self.next_frame()) is not None:
            yield f

    def _fail(self, message: str, code: ResultCode) -> RemoteProtocolError:
        self._error = RemoteProtocolError(message, code)
        return self._error

    def next_frame(self) -> RawFrame | None:
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            if len(buf) - pos >= 2 and buf[pos : pos + 2] != MAGIC:
                raise self._fail(f"bad magic {bytes(buf[pos:pos + 2])!r}, expected {MAGIC!r}", ResultCode.MALFORMED_FRAME)
            return None
        (magic, version, kind, flags, save_fwd, prio, st, tt, ot, sl, tl, ol, reserved, body_len) = _HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise self._fail(f"bad magic {magic!r}, expected {MAGIC!r}", ResultCode.MALFORMED_FRAME)
        if version != VERSION:
            raise self._fail(f"UMX-T version {version} is not supported (only {VERSION})", ResultCode.UNSUPPORTED_VERSION)
        k = _KINDS.get(kind)
        if k is None:
            raise self._fail(f"frame kind {kind} is unknown", ResultCode.UNKNOWN_KIND)
        total = HEADER_SIZE + sl + tl + ol + body_len + 4
        if total > self.max_frame_size:
            raise self._fail(
                f"frame of {total} bytes exceeds the {self.max_frame_size}-byte limit",
                ResultCode.FRAME_TOO_LARGE,
            )
        if flags & ~FLAGS_KNOWN or reserved:
            raise self._fail(f"reserved header bits set (flags 0x{flags:02x}, reserved {reserved})", ResultCode.INVALID_FIELD)
        if bool(flags & FLAG_LAYER) != (k is not Kind.DATA):
            raise self._fail(f"LAYER_MASK {flags & FLAG_LAYER} does not fit kind {k.name}", ResultCode.INVALID_FIELD)
        if flags & FLAG_ENCRYPT and k is not Kind.DATA:
            raise self._fail(f"Encrypt=1 on a {k.name} frame", ResultCode.INVALID_FIELD)
        if k.is_message != (1 <= save_fwd <= 3) or save_fwd > 3:
            raise self._fail(f"SaveFwd {save_fwd} is not valid on a {k.name} frame (1..3 for messages, 0 for session)", ResultCode.INVALID_FIELD)
        if prio > 9:
            raise self._fail(f"priority {prio} is outside 0..9", ResultCode.INVALID_FIELD)
        for t, n, what in ((st, sl, "source"), (tt, tl, "target"), (ot, ol, "origin")):
            if t not in _NODE_TYPES or not 1 <= n <= MAX_NODE_ID:
                raise self._fail(f"{what} endpoint type {t} / id length {n} is invalid (types 1..3, 1..{MAX_NODE_ID} bytes)", ResultCode.INVALID_FIELD)
        if len(buf) - pos < total:
            return None
        end = pos + total
        raw = bytes(buf[pos:end])
        self._pos = end
        (crc,) = _CRC.unpack_from(raw, total - 4)
        if zlib.crc32(memoryview(raw)[:-4]) != crc:
            raise self._fail(f"CRC32 mismatch on a {total}-byte {k.name} frame", ResultCode.BAD_CHECKSUM)
        i = HEADER_SIZE
        try:
            source = _endpoint(st, raw[i : i + sl])
            target = _endpoint(tt, raw[i + sl : i + sl + tl])
            origin = _endpoint(ot, raw[i + sl + tl : i + sl + tl + ol])
        except RemoteProtocolError as e:
            self._error = e
            raise
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        return RawFrame(
            kind=k, flags=flags, save_fwd=save_fwd, priority=prio, source=source, target=target,
            origin=origin, raw=raw, body_start=i + sl + tl + ol,
        )
