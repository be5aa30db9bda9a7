"""Stream framing: bytes in, in any split, complete frames out (h2's rule:
read the fixed header, check the declared length against the limit before
waiting for the body, wait for the whole frame, then parse)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final

from ._codec import _CRC, _DATA_PREFIX, _HEADER, HEADER_SIZE, crc32, lk0_from_wire, lk1_from_wire
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, ResultCode
from ._frames import Body, Frame, decode_body, decode_chunk_body, frame_from_wire
from ._limits import (
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_ENVELOPE,
    FLAG_KEY_SEALED,
    FLAG_LARGE,
    FLAG_LAYER,
    FLAG_ORDERED,
    FLAG_RELIABLE,
    FLAGS_KNOWN,
)
from ._schema import MAGIC, VERSION
from ._types import LK0, LK1, MAX_NODE_ID, MAX_PRIORITY, Endpoint, Kind, NodeType

# The DATA prefix begins with LK0 and then LK1, each semq_id, semq_db_id, record_id.
_DATA_IDS: Final = struct.Struct(_DATA_PREFIX.format[:4])
_LK1_RECORD: Final = struct.Struct(">Q")
_LK1_RECORD_AT: Final = struct.calcsize(_DATA_PREFIX.format[:6])  # after LK0 and LK1's semq ids

__all__ = ["DEFAULT_MAX_FRAME", "HEADER_SIZE", "HELLO_MAX_FRAME", "FrameDecoder", "RawFrame", "frame_save_fwd", "relay_bytes", "relay_frame_bytes"]

DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024  # bytes, whole frame (docs/protocol.md "Limits")
# Before a connection's HELLO is accepted, no frame may be larger than this:
# a peer that has not said who it is cannot make the relay buffer 64 MiB
# (HELLO itself is a few hundred bytes, its token at most 4 KiB).
HELLO_MAX_FRAME: Final = 64 * 1024
_KINDS: Final = {int(k): k for k in Kind}
_CHUNK: Final = Kind.CHUNK  # (a global: cheaper per frame than Kind.CHUNK, an Enum class look-up)
_NODE_TYPES: Final = {int(t) for t in NodeType}
_CACHE_LIMIT: Final = 4096
_VIEW_COPY: Final = 1 << 20  # frames of this size and more leave the buffer through a memoryview
_TIMES_AT: Final = 24  # created_ms u64, expires_ms u64 in the DATA prefix (docs/protocol.md)
_APP_KEY_AT: Final = 40  # the DATA body's AppKey, after its fixed prefix
_FLAGS_AT: Final = 4  # header bytes: magic (2), version, kind, flags, save_fwd, priority
_SAVE_FWD_AT: Final = 5
_PRIORITY_AT: Final = 6


def rewrite_header(b: bytes, *, flags: int | None = None, priority: int | None = None) -> bytes:
    """The whole frame ``b`` with its flags or priority byte replaced and
    its CRC made again. A relay never does this (the AAD binds both on a
    document); a test tool playing a dishonest relay does
    (semq.testing.dishonest), valid or not."""
    out = bytearray(b)
    if flags is not None:
        out[_FLAGS_AT] = flags
    if priority is not None:
        out[_PRIORITY_AT] = priority
    out[-4:] = _CRC.pack(crc32(memoryview(out)[:-4]))
    return bytes(out)


def frame_save_fwd(b: bytes) -> int:
    """SaveFwd of the whole frame ``b`` (one this process checked before,
    e.g. one it stored), from its header."""
    return b[_SAVE_FWD_AT]
_new_raw: Final = object.__new__


def _valid_heads() -> dict[tuple[int, int, int], Kind]:
    """{(kind, flags, SaveFwd): Kind} for every combination the header rules
    allow: LAYER_MASK 0 on DATA and 1 on every other kind, Encrypt, the
    envelope and the large-document flag only on DATA (a sealed AppKey with
    Encrypt, ordered with the envelope), SaveFwd 1..3 on message kinds and 0
    on session kinds. Reliable and Ack2 are free here (the Frame checks their
    rules)."""
    table = {}
    for k in Kind:
        for flags in range(FLAGS_KNOWN + 1):
            if bool(flags & FLAG_LAYER) != (k is not Kind.DATA):
                continue
            if flags & FLAG_ENCRYPT and k is not Kind.DATA:
                continue
            if flags & FLAG_KEY_SEALED and not flags & FLAG_ENCRYPT:
                continue
            if flags & FLAG_ENVELOPE and k is not Kind.DATA:
                continue
            if flags & FLAG_ORDERED and not flags & FLAG_ENVELOPE:
                continue
            if flags & FLAG_LARGE and k is not Kind.DATA:
                continue
            for sf in (1, 2, 3) if k.is_message else (0,):
                table[(int(k), flags, sf)] = k
    return table


_VALID_HEAD: Final = _valid_heads()
_endpoints_cache: dict[tuple[bytes, bytes], tuple[Endpoint, Endpoint, Endpoint]] = {}


_endpoint_cache: dict[tuple[int, bytes], Endpoint] = {}


def _endpoint(node_type: int, raw: bytes) -> Endpoint:
    """One Endpoint object per endpoint (bounded cache): frames of one
    organization name it with the same object whatever their other
    endpoints, so comparing them starts with ``is``."""
    key = (node_type, raw)
    ep = _endpoint_cache.get(key)
    if ep is None:
        try:
            ep = Endpoint(node_type=NodeType(node_type), node_id=raw.decode("ascii"))
        except (ProtocolError, UnicodeDecodeError, ValueError) as e:
            raise RemoteProtocolError(f"bad endpoint: {e}", ResultCode.INVALID_FIELD) from e
        if len(_endpoint_cache) >= _CACHE_LIMIT:
            _endpoint_cache.clear()
        _endpoint_cache[key] = ep
    return ep


def _endpoints(types_lens: bytes, ids: bytes) -> tuple[Endpoint, Endpoint, Endpoint]:
    """(source, target, origin) from header bytes 7..12 (three types, three
    lengths) and the id bytes. Cached: a connection sees few distinct triples,
    and building three validated Endpoints per frame is the routing path's
    largest cost."""
    key = (types_lens, ids)
    eps = _endpoints_cache.get(key)
    if eps is None:
        st, tt, ot, sl, tl, _ol = types_lens
        eps = (
            _endpoint(st, ids[:sl]),
            _endpoint(tt, ids[sl : sl + tl]),
            _endpoint(ot, ids[sl + tl :]),
        )
        if len(_endpoints_cache) >= _CACHE_LIMIT:
            _endpoints_cache.clear()
        _endpoints_cache[key] = eps
    return eps


class RawFrame:
    """A complete, checksum-verified frame whose header is parsed and whose
    body is not. A relay routes on this and forwards ``raw`` (or
    ``relay_bytes``) without ever parsing the body."""

    __slots__ = ("_body_start", "flags", "kind", "origin", "priority", "raw", "save_fwd", "source", "target")
    kind: Kind
    flags: int
    save_fwd: int
    priority: int
    source: Endpoint
    target: Endpoint
    origin: Endpoint
    raw: bytes
    _body_start: int

    def __init__(self) -> None:
        # Only FrameDecoder makes them (its slot stores, without __init__):
        # a RawFrame is a frame whose header and CRC were checked.
        raise TypeError("RawFrame is made by FrameDecoder from checked bytes, not constructed")

    @property
    def body(self) -> bytes:
        return self.raw[self._body_start : -4]

    @property
    def reliable(self) -> bool:
        return bool(self.flags & FLAG_RELIABLE)

    @property
    def ack2(self) -> bool:
        return bool(self.flags & FLAG_ACK2)

    @property
    def key_sealed(self) -> bool:
        """DATA whose AppKey is inside the sealed AppData (the header's is empty)."""
        return bool(self.flags & FLAG_KEY_SEALED)

    @property
    def large(self) -> bool:
        """DATA whose AppData is a large document's manifest (FLAG_LARGE):
        its content follows in CHUNK frames under the same LK0."""
        return bool(self.flags & FLAG_LARGE)

    def data_prefix(self) -> tuple[LK0, LK1 | None, int, int | None]:
        """(LK0, LK1, created_ms, expires_ms) of a DATA frame, from its fixed
        prefix only. Raises RemoteProtocolError on a short or invalid prefix."""
        if self.kind is not Kind.DATA:
            raise LocalProtocolError(f"data_prefix() on a {self.kind.name} frame")
        try:
            s, d, r, ls, ld, lr, created, expires = _DATA_PREFIX.unpack_from(self.raw, self._body_start)
            # (The codec's constructors for values off the wire: only a zero
            # id can be out of range, and they refuse it as LK0/LK1 do.)
            lk0 = lk0_from_wire(self.origin, s, d, r)
            lk1 = lk1_from_wire(ls, ld, lr) if lr else None
        except ProtocolError as e:
            raise RemoteProtocolError(f"DATA prefix: {e}", e.code) from e
        except Exception as e:
            raise RemoteProtocolError(f"DATA prefix: {e}", ResultCode.MALFORMED_FRAME) from e
        return lk0, lk1, created, expires or None

    def data_ids(self) -> tuple[int, int, int]:
        """(semq_id, semq_db_id, record_id) of a DATA frame's LK0, unchecked:
        for grouping a batch's look-ups before each frame is decoded (and
        validated) on its own. Raises RemoteProtocolError on a short body."""
        if self.kind is not Kind.DATA:
            raise LocalProtocolError(f"data_ids() on a {self.kind.name} frame")
        try:
            return _DATA_IDS.unpack_from(self.raw, self._body_start)
        except struct.error as e:
            raise RemoteProtocolError(f"DATA prefix: {e}", ResultCode.MALFORMED_FRAME) from e

    def app_key_parts(self) -> tuple[str, str, str, str] | None:
        """The AppKey (domain, data_type, subtype, key) in a DATA frame's
        header, straight from its bytes (after the 40-byte prefix, the four
        u8-prefixed parts unrolled), without parsing the rest; None if the
        body is too short to hold them (the frame itself is refused when it
        is parsed). A relay logs it for documents sent with it in clear."""
        b = self.raw
        a = self._body_start + _APP_KEY_AT + 1
        try:
            c = a + b[a - 1] + 1
            e = c + b[c - 1] + 1
            g = e + b[e - 1] + 1
            end = g + b[g - 1]
        except IndexError:
            return None
        if end > len(b):
            return None
        return (b[a:c - 1].decode("utf-8", "replace"), b[c:e - 1].decode("utf-8", "replace"),
                b[e:g - 1].decode("utf-8", "replace"), b[g:end].decode("utf-8", "replace"))

    def aad_parts(self) -> tuple[bytes, bytes, bytes]:
        """The bytes of a checked DATA frame that its associated data takes
        as they are (semq.identity.crypto.raw_frame_aad): LK0's three ids (12 bytes),
        the AppKey as the header encodes it (four u8-prefixed parts), and the
        creation time and expiry (16 bytes). The frame must have been
        checked (``frame()`` did not raise)."""
        b, at = self.raw, self._body_start
        end = pos = at + _APP_KEY_AT
        for _ in range(4):
            end += 1 + b[end]
        return b[at:at + _DATA_IDS.size], b[pos:end], b[at + _TIMES_AT:pos]

    def lk1_record_id(self) -> int:
        """A DATA frame's LK1 record id (0: no LK1, a forwarded document),
        unchecked and 0 for a body too short to hold it: for counting a
        read's stored copies before each frame is decoded (and validated)."""
        try:
            return int(_LK1_RECORD.unpack_from(self.raw, self._body_start + _LK1_RECORD_AT)[0])
        except struct.error:
            return 0

    def frame(self) -> Frame:
        """Parse the body; the full, validated Frame. Raises RemoteProtocolError."""
        body: Body
        if self.kind is _CHUNK:  # its payload copied out of ``raw`` once, not via ``body``
            body = decode_chunk_body(memoryview(self.raw)[self._body_start : -4], self.origin)
        else:
            body = decode_body(self.kind, self.body, self.origin, self.flags)
        try:
            frame = frame_from_wire(
                self.kind, self.source, self.target, self.origin, body, self.flags,
                self.save_fwd, self.priority,
            )
        except ProtocolError as e:
            raise RemoteProtocolError(f"{self.kind.name} from {self.source}: {e}", e.code) from e
        # frame.flags == self.flags by construction: LAYER_MASK was checked
        # against the kind in next_frame, Reliable and Ack2 are read from the
        # flags, and DATA's Encrypt too (Data refuses Encrypt without a key).
        return frame

    def __repr__(self) -> str:
        return f"<RawFrame {self.kind.name} {self.source}->{self.target} {len(self.raw)}B>"


def relay_bytes(raw: RawFrame, source: Endpoint, lk1: LK1 | None = None) -> bytes:
    """The frame as the relay sends it on: transport source replaced (SPEC:
    "the transport source of a frame the platform relays is the platform"),
    LK1 spliced into a DATA prefix when given, CRC recomputed; the body after
    the prefix is copied untouched."""
    if lk1 is not None and raw.kind is not Kind.DATA:
        raise LocalProtocolError(f"LK1 on a {raw.kind.name} frame")
    return relay_frame_bytes(raw.raw, source, lk1)


def relay_frame_bytes(b: bytes, source: Endpoint, lk1: LK1 | None = None) -> bytes:
    """``relay_bytes`` on the bytes of a frame this process decoded (and
    checked) before, e.g. one it stored: no second decode. The bytes must be
    a whole, valid frame; LK1 only on DATA."""
    (_m, _v, kind, flags, sf, prio, _st, tt, ot, sl, tl, ol, _r, body_len) = _HEADER.unpack_from(b)
    src = source.node_id.encode("ascii")
    ids_end = HEADER_SIZE + sl + tl + ol
    head = _HEADER.pack(
        MAGIC, VERSION, kind, flags, sf, prio, source.node_type, tt, ot, len(src), tl, ol, 0, body_len
    )
    if lk1 is None:  # target and origin ids and the body: one slice
        out = b"".join((head, src, b[HEADER_SIZE + sl : -4]))
        return out + _CRC.pack(crc32(out))
    if kind != Kind.DATA:
        raise LocalProtocolError(f"LK1 on a frame of kind {kind}")
    # The LK1 spliced between views of ``b``, the CRC run over the parts in
    # turn: the ~1 KiB body is copied once (a stored copy's delivery sliced,
    # spliced, joined and appended to it: 2.2 -> 1.8 us).
    m = memoryview(b)
    lk1_at = ids_end + _DATA_IDS.size  # after LK0's ids
    parts: list[bytes | memoryview] = [head, src, m[HEADER_SIZE + sl : lk1_at],
             _DATA_IDS.pack(lk1.semq_id, lk1.semq_db_id, lk1.record_id), m[lk1_at + _DATA_IDS.size : -4]]
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    parts.append(_CRC.pack(crc))
    return b"".join(parts)


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

    def claim(self) -> int:
        """Bytes this decoder holds or is about to hold: what is buffered,
        plus the rest of the frame at its head when that frame's header has
        come (its declared total, already checked against the limit). A
        reader that must bound what a peer costs reserves this much before
        it reads on (semq.session.transport.ByteBudget): the frame it started is
        then covered whole."""
        pos, buf = self._pos, self._buf
        have = len(buf) - pos
        if have < HEADER_SIZE or self._error is not None:
            return have
        head = _HEADER.unpack_from(buf, pos)
        total = HEADER_SIZE + head[9] + head[10] + head[11] + head[13] + 4
        return max(have, min(total, self.max_frame_size))

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[RawFrame]:
        while got := self._take(1):
            yield got[0]

    def _fail(self, message: str, code: ResultCode) -> RemoteProtocolError:
        self._error = RemoteProtocolError(message, code)
        return self._error

    def next_frame(self) -> RawFrame | None:
        """The next complete, CRC-checked frame, or None until more bytes
        arrive. Raises RemoteProtocolError (then on every later call too)."""
        got = self._take(1)
        return got[0] if got else None

    def frames(self) -> list[RawFrame]:
        """Every complete frame buffered, in order (``list(self)`` in one
        call: a read's frames decoded in one loop). Raises
        RemoteProtocolError at the first bad frame, as ``list(self)`` does."""
        return self._take(-1)

    def _take(self, limit: int) -> list[RawFrame]:
        """Up to ``limit`` complete frames (all when negative)."""
        if self._error is not None:
            raise self._error
        out: list[RawFrame] = []
        buf, pos = self._buf, self._pos
        size = len(buf)
        unpack, valid, max_size = _HEADER.unpack_from, _VALID_HEAD, self.max_frame_size
        crc_at = _CRC.unpack_from
        try:
            while limit:
                if size - pos < HEADER_SIZE:
                    if size - pos >= 2 and buf[pos : pos + 2] != MAGIC:
                        raise self._fail(f"bad magic {bytes(buf[pos:pos + 2])!r}, expected {MAGIC!r}",
                                         ResultCode.MALFORMED_FRAME)
                    break
                head = unpack(buf, pos)
                (magic, version, kind, flags, save_fwd, prio, st, tt, ot, sl, tl, ol, reserved, body_len) = head
                total = HEADER_SIZE + sl + tl + ol + body_len + 4
                # Hot path: one table look-up validates kind, flags (known
                # bits, LAYER_MASK, Encrypt only on DATA) and SaveFwd
                # together; the rest is one fused comparison. Only when it
                # fails does _header_error run the checks one by one to
                # name the first broken rule and its code.
                k = valid.get((kind, flags, save_fwd))
                if not (
                    k is not None and magic == MAGIC and version == VERSION and not reserved
                    and total <= max_size and prio <= MAX_PRIORITY
                    and st in _NODE_TYPES and tt in _NODE_TYPES and ot in _NODE_TYPES
                    and 1 <= sl <= MAX_NODE_ID and 1 <= tl <= MAX_NODE_ID and 1 <= ol <= MAX_NODE_ID
                ):
                    raise self._header_error(head, total)
                assert k is not None
                if size - pos < total:
                    break
                end = pos + total
                # A large frame is copied out once, through a view (slicing
                # the bytearray first would hold a third copy at the peak);
                # a small one by the slice, which is faster.
                raw = bytes(buf[pos:end]) if total < _VIEW_COPY else bytes(memoryview(buf)[pos:end])
                pos = end
                if crc32(memoryview(raw)[:-4]) != crc_at(raw, total - 4)[0]:
                    raise self._fail(f"CRC32 mismatch on a {total}-byte {k.name} frame", ResultCode.BAD_CHECKSUM)
                ids_end = HEADER_SIZE + sl + tl + ol
                try:
                    source, target, origin = _endpoints(raw[7:13], raw[HEADER_SIZE:ids_end])
                except RemoteProtocolError as e:
                    self._error = e
                    raise
                # (RawFrame has no __init__ to call: its slots are stored here.)
                rf = _new_raw(RawFrame)
                rf.kind = k
                rf.flags = flags
                rf.save_fwd = save_fwd
                rf.priority = prio
                rf.source = source
                rf.target = target
                rf.origin = origin
                rf.raw = raw
                rf._body_start = ids_end
                out.append(rf)
                limit -= 1
        finally:
            # What was taken is consumed, also when a later frame is bad.
            if pos == size:
                buf.clear()
                self._pos = 0
            else:
                self._pos = pos
        return out

    def _header_error(self, head: tuple[Any, ...], total: int) -> RemoteProtocolError:
        """The first rule the header breaks, in the documented order
        (docs/protocol.md "Decoding rules"), recorded as this decoder's error."""
        (magic, version, kind, flags, save_fwd, prio, st, tt, ot, sl, tl, ol, reserved, _len) = head
        if magic != MAGIC:
            return self._fail(f"bad magic {magic!r}, expected {MAGIC!r}", ResultCode.MALFORMED_FRAME)
        if version != VERSION:
            return self._fail(f"UMX-T version {version} is not supported (only {VERSION})", ResultCode.UNSUPPORTED_VERSION)
        k = _KINDS.get(kind)
        if k is None:
            return self._fail(f"frame kind {kind} is unknown", ResultCode.UNKNOWN_KIND)
        if total > self.max_frame_size:
            return self._fail(
                f"frame of {total} bytes exceeds the {self.max_frame_size}-byte limit",
                ResultCode.FRAME_TOO_LARGE,
            )
        if flags & ~FLAGS_KNOWN or reserved:
            return self._fail(f"reserved header bits set (flags 0x{flags:02x}, reserved {reserved})", ResultCode.INVALID_FIELD)
        if bool(flags & FLAG_LAYER) != (k is not Kind.DATA):
            return self._fail(f"LAYER_MASK {flags & FLAG_LAYER} does not fit kind {k.name}", ResultCode.INVALID_FIELD)
        if flags & FLAG_ENCRYPT and k is not Kind.DATA:
            return self._fail(f"Encrypt=1 on a {k.name} frame", ResultCode.INVALID_FIELD)
        if flags & FLAG_KEY_SEALED and not flags & FLAG_ENCRYPT:
            return self._fail("a sealed AppKey without Encrypt=1", ResultCode.INVALID_FIELD)
        if flags & FLAG_ENVELOPE and k is not Kind.DATA:
            return self._fail(f"an envelope on a {k.name} frame", ResultCode.INVALID_FIELD)
        if flags & FLAG_ORDERED and not flags & FLAG_ENVELOPE:
            return self._fail("an ordered document without its envelope", ResultCode.INVALID_FIELD)
        if flags & FLAG_LARGE and k is not Kind.DATA:
            return self._fail(f"the large-document flag (0x80) on a {k.name} frame", ResultCode.INVALID_FIELD)
        if k.is_message != (1 <= save_fwd <= 3) or save_fwd > 3:
            return self._fail(f"SaveFwd {save_fwd} is not valid on a {k.name} frame (1..3 for messages, 0 for session)", ResultCode.INVALID_FIELD)
        if prio > MAX_PRIORITY:
            return self._fail(f"priority {prio} is outside 0..{MAX_PRIORITY}", ResultCode.INVALID_FIELD)
        for t, n, what in ((st, sl, "source"), (tt, tl, "target"), (ot, ol, "origin")):
            if t not in _NODE_TYPES or not 1 <= n <= MAX_NODE_ID:
                return self._fail(f"{what} endpoint type {t} / id length {n} is invalid (types 1..3, 1..{MAX_NODE_ID} bytes)", ResultCode.INVALID_FIELD)
        # Unreachable while _VALID_HEAD and the fast check mirror the rules above.
        return self._fail(f"invalid header {head!r}", ResultCode.MALFORMED_FRAME)  # pragma: no cover
