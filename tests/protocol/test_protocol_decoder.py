"""The stream decoder: any split of a stream gives the same frames; any input
either parses or raises RemoteProtocolError carrying a ResultCode (h11's fuzz
invariant); the header is checked before the body is awaited; errors are
sticky; relay_bytes rewrites only what it says it does."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semq.umxt_protocol import (
    CHUNK_COMPRESSED,
    DEFAULT_MAX_FRAME,
    FLAG_LARGE,
    HEADER_SIZE,
    LK0,
    LK1,
    MAX_ACK_BATCH,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Chunk,
    ChunkAck,
    Data,
    Endpoint,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Kind,
    LocalProtocolError,
    Nack,
    Ping,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    SaveFwd,
    encode_frame,
    encode_frames,
    relay_bytes,
)
from semq.umxt_protocol._schema import DATA_BODY
from tests.protocol.test_protocol_strategies import (
    FUZZ_SETTINGS,
    PROTOCOL_SETTINGS,
    assert_valid_value,
    frames,
    frames_of,
)

ORG_A = Endpoint.org("10008")
ORG_B = Endpoint.org("56001")
PLATFORM = Endpoint.platform()


def data_frame(size: int = 1024, record_id: int = 1) -> Frame:
    return Frame(
        kind=Kind.DATA, source=ORG_A, target=ORG_B, ack2=True,
        body=Data(lk0=LK0(endpoint=ORG_A, record_id=record_id), app_data=bytes(size),
                  app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001"),
                  created_ms=1_795_000_000_000),
    )


def ping_frame() -> Frame:
    return Frame(kind=Kind.PING, source=ORG_A, target=PLATFORM, body=Ping(nonce=7))


def with_crc(without_crc: bytes | bytearray) -> bytes:
    return bytes(without_crc) + struct.pack(">I", zlib.crc32(without_crc))


def drain(dec: FrameDecoder) -> list[RawFrame]:
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f)
    return out


def decode_stream(chunks: list[bytes], max_frame_size: int = DEFAULT_MAX_FRAME) -> list[Frame]:
    dec = FrameDecoder(max_frame_size)
    out: list[Frame] = []
    for chunk in chunks:
        dec.receive_data(chunk)
        out.extend(r.frame() for r in drain(dec))
    assert dec.buffered == 0
    return out


def assert_remote_error(data: bytes, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
    """Feed ``data``; it may give frames; anything raised must be a
    RemoteProtocolError with a ResultCode, and the decoder then stays broken.
    ``frames()`` takes the same frames and fails the same way."""
    one, batch = FrameDecoder(max_frame_size), FrameDecoder(max_frame_size)
    one.receive_data(data)
    batch.receive_data(data)
    raws, one_error = [], None
    try:
        while (r := one.next_frame()) is not None:
            raws.append(r.raw)
    except RemoteProtocolError as e:
        one_error = e
    try:
        taken = [r.raw for r in batch.frames()]
    except RemoteProtocolError as e:
        assert one_error is not None and (e.code, str(e)) == (one_error.code, str(one_error))
        with pytest.raises(RemoteProtocolError) as again:
            batch.frames()
        assert again.value is e  # sticky
    else:
        assert one_error is None and taken == raws
    dec = FrameDecoder(max_frame_size)
    dec.receive_data(data)
    try:
        for raw in dec:
            if raw.kind is Kind.DATA:
                lk1_id = raw.lk1_record_id()  # unchecked, never raises (0 for a short body)
                ids = raw.data_ids()  # unchecked, but only a short body may raise
                lk0, lk1, _, _ = raw.data_prefix()
                assert ids == (lk0.semq_id, lk0.semq_db_id, lk0.record_id)
                assert lk1_id == (lk1.record_id if lk1 is not None else 0)
            assert_valid_value(raw.frame())
    except RemoteProtocolError as e:
        assert isinstance(e.code, ResultCode)
        assert e.code is not ResultCode.OK
        assert str(e)
    # Anything else (struct.error, IndexError, construct's errors, ...)
    # propagates and fails the test.


def read_error(dec: FrameDecoder) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        drain(dec)
    return info.value


# ------------------------------------------------------------------ splits


@PROTOCOL_SETTINGS
@given(fs=st.lists(frames, min_size=1, max_size=5), data=st.data())
def test_any_split_gives_the_same_frames(fs: list[Frame], data: st.DataObject) -> None:
    stream = encode_frames(fs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert decode_stream(chunks) == fs
    # frames() (a read's frames in one call, what the transport uses) gives
    # the same frames, each once, whatever the split.
    dec, got = FrameDecoder(), []
    for chunk in chunks:
        dec.receive_data(chunk)
        got += [(r.raw, r.frame()) for r in dec.frames()]
    assert [f for _, f in got] == fs and b"".join(raw for raw, _ in got) == stream and dec.buffered == 0


@PROTOCOL_SETTINGS
@given(fs=st.lists(st.sampled_from(list(Kind)).flatmap(frames_of), min_size=1, max_size=3))
def test_one_byte_at_a_time(fs: list[Frame]) -> None:
    stream = encode_frames(fs)
    if len(stream) > 20_000:  # bounded run time; size is covered by the other split test
        stream = encode_frames(fs[:1])
        fs = fs[:1]
    assert decode_stream([stream[i:i + 1] for i in range(len(stream))]) == fs


def test_one_byte_at_a_time_yields_each_frame_exactly_when_complete() -> None:
    fs = [data_frame(100, 1), ping_frame(), data_frame(0, 2)]
    ends = []
    total = 0
    for f in fs:
        total += len(encode_frame(f))
        ends.append(total)
    stream = encode_frames(fs)
    dec = FrameDecoder()
    got_at = []
    for i in range(len(stream)):
        dec.receive_data(stream[i:i + 1])
        if (raw := dec.next_frame()) is not None:
            got_at.append(i + 1)
            assert raw.frame() == fs[len(got_at) - 1]
    assert got_at == ends


def test_iterating_the_decoder_drains_complete_frames_and_keeps_the_rest() -> None:
    a, b = encode_frame(data_frame(10, 1)), encode_frame(data_frame(10, 2))
    dec = FrameDecoder()
    dec.receive_data(a + b[:5])
    assert [r.frame() for r in dec] == [data_frame(10, 1)]
    assert dec.buffered == 5
    dec.receive_data(b[5:])
    assert [r.frame() for r in dec] == [data_frame(10, 2)]
    assert dec.buffered == 0


# -------------------------------------------------------------------- fuzz


@FUZZ_SETTINGS
@given(st.binary(max_size=512))
def test_arbitrary_bytes_parse_or_raise_remote_error(data: bytes) -> None:
    assert_remote_error(data)


@FUZZ_SETTINGS
@given(st.sampled_from(list(range(0, 256))), st.binary(max_size=512))
def test_bytes_after_a_valid_magic_and_version(kind: int, rest: bytes) -> None:
    # Past the magic check, so the header checks themselves get exercised.
    assert_remote_error(b"UX\x01" + bytes([kind]) + rest)


@FUZZ_SETTINGS
@given(frame=frames, data=st.data())
def test_mutated_frames_parse_or_raise_remote_error(frame: Frame, data: st.DataObject) -> None:
    raw = bytearray(encode_frame(frame))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    how = data.draw(st.sampled_from(["as is", "fix crc", "truncate", "truncate+fix crc"]))
    if how.startswith("truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    if how.endswith("fix crc") and len(raw) > 4:
        # With a valid CRC the mutation reaches the header and body parsers.
        raw = bytearray(with_crc(raw[:-4]))
    assert_remote_error(bytes(raw), max_frame_size=data.draw(st.sampled_from([64, DEFAULT_MAX_FRAME])))


@FUZZ_SETTINGS
@given(frame=frames, body=st.binary(max_size=300))
def test_any_body_under_a_valid_header_parses_or_raises_remote_error(frame: Frame, body: bytes) -> None:
    """Replace the body with arbitrary bytes, fix body_len and the CRC: every
    body decoder sees garbage that passed framing."""
    raw = encode_frame(frame)
    ids = sum(len(e.node_id) for e in (frame.source, frame.target, frame.origin))
    head = bytearray(raw[:HEADER_SIZE])
    head[14:18] = struct.pack(">I", len(body))
    assert_remote_error(with_crc(bytes(head) + raw[HEADER_SIZE:HEADER_SIZE + ids] + body))


@FUZZ_SETTINGS
@given(frame=frames, delta=st.integers(-40, 40))
def test_wrong_declared_body_length(frame: Frame, delta: int) -> None:
    raw = encode_frame(frame)
    (body_len,) = struct.unpack_from(">I", raw, 14)
    new_len = max(0, body_len + delta)
    head = bytearray(raw[:HEADER_SIZE])
    head[14:18] = struct.pack(">I", new_len)
    ids_end = HEADER_SIZE + sum(len(e.node_id) for e in (frame.source, frame.target, frame.origin))
    body = raw[ids_end:-4]
    # Body cut or padded to the new length (and the CRC made valid) ...
    assert_remote_error(with_crc(bytes(head) + raw[HEADER_SIZE:ids_end]
                                 + (body + bytes(max(0, delta)))[:new_len]))
    # ... and the original bytes under the lying header.
    assert_remote_error(bytes(head) + raw[HEADER_SIZE:])


# ------------------------------------------------------------- header rules


def test_oversized_frame_refused_from_the_header_alone() -> None:
    raw = encode_frame(data_frame(1024))
    dec = FrameDecoder(max_frame_size=512)
    dec.receive_data(raw[:HEADER_SIZE])  # the body has not arrived
    err = read_error(dec)
    assert err.code is ResultCode.FRAME_TOO_LARGE
    assert str(len(raw)) in str(err) and "512" in str(err)


def test_huge_declared_length_refused_at_the_default_limit() -> None:
    head = bytearray(encode_frame(data_frame(0))[:HEADER_SIZE])
    head[14:18] = struct.pack(">I", 70_000_000)
    dec = FrameDecoder()
    dec.receive_data(bytes(head))
    err = read_error(dec)
    assert err.code is ResultCode.FRAME_TOO_LARGE
    assert str(DEFAULT_MAX_FRAME) in str(err)
    assert dec.buffered == HEADER_SIZE  # nothing was waited for, nothing consumed


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    raw = encode_frame(data_frame(1024))
    assert decode_stream([raw], max_frame_size=len(raw)) == [data_frame(1024)]
    dec = FrameDecoder(max_frame_size=len(raw) - 1)
    dec.receive_data(raw)
    assert read_error(dec).code is ResultCode.FRAME_TOO_LARGE


def test_max_frame_size_below_a_header_is_refused() -> None:
    with pytest.raises(ValueError, match="below"):
        FrameDecoder(max_frame_size=HEADER_SIZE)


def _patched(offset: int, value: int, frame: Frame | None = None) -> bytes:
    raw = bytearray(encode_frame(frame or data_frame(16)))
    raw[offset] = value
    return with_crc(raw[:-4])


@pytest.mark.parametrize(
    ("offset", "value", "code", "words"),
    [
        (0, ord("X"), ResultCode.MALFORMED_FRAME, ["magic"]),
        (2, 2, ResultCode.UNSUPPORTED_VERSION, ["version 2", "only 1"]),
        (2, 0, ResultCode.UNSUPPORTED_VERSION, ["version 0"]),
        (3, 14, ResultCode.UNKNOWN_KIND, ["kind 14"]),
        (3, 31, ResultCode.UNKNOWN_KIND, ["kind 31"]),
        (3, 200, ResultCode.UNKNOWN_KIND, ["kind 200"]),
        (4, 0x42, ResultCode.INVALID_FIELD, ["ordered document without its envelope"]),  # bit 6 needs bit 5
        (4, 0x12, ResultCode.INVALID_FIELD, ["sealed AppKey without Encrypt"]),  # bit 4 needs Encrypt
        (4, 0x03, ResultCode.INVALID_FIELD, ["LAYER_MASK 1"]),  # transport bit on DATA
        (5, 4, ResultCode.INVALID_FIELD, ["SaveFwd 4"]),
        (5, 0, ResultCode.INVALID_FIELD, ["SaveFwd 0"]),
        (6, 10, ResultCode.INVALID_FIELD, ["priority 10", "0..9"]),
        (7, 9, ResultCode.INVALID_FIELD, ["source endpoint type 9"]),
        (10, 0, ResultCode.INVALID_FIELD, ["id length 0"]),
        (10, 65, ResultCode.INVALID_FIELD, ["id length 65", "1..64"]),
        (13, 1, ResultCode.INVALID_FIELD, ["reserved 1"]),
    ],
)
def test_header_errors_have_their_own_codes(
    offset: int, value: int, code: ResultCode, words: list[str]
) -> None:
    dec = FrameDecoder()
    dec.receive_data(_patched(offset, value)[:HEADER_SIZE])  # decided from the header alone
    err = read_error(dec)
    assert err.code is code, err
    for w in words:
        assert w in str(err)


def test_bad_magic_seen_from_two_bytes() -> None:
    dec = FrameDecoder()
    dec.receive_data(b"U")
    assert dec.next_frame() is None
    dec.receive_data(b"Y")
    assert read_error(dec).code is ResultCode.MALFORMED_FRAME


def test_session_kind_with_save_fwd_is_refused() -> None:
    dec = FrameDecoder()
    dec.receive_data(_patched(5, 3, ping_frame()))
    assert read_error(dec).code is ResultCode.INVALID_FIELD


def test_encrypt_flag_on_a_session_frame_is_refused() -> None:
    raw = encode_frame(ping_frame())
    dec = FrameDecoder()
    dec.receive_data(_patched(4, raw[4] | 0x08, ping_frame()))
    err = read_error(dec)
    assert err.code is ResultCode.INVALID_FIELD and "Encrypt=1" in str(err)


def chunk_frame(payload: bytes = b"sealed chunk", index: int = 0, flags: int = 0) -> Frame:
    return Frame(kind=Kind.CHUNK, source=ORG_A, target=ORG_B,
                 body=Chunk(lk0=LK0(endpoint=ORG_A, record_id=7), index=index, flags=flags, payload=payload))


def chunk_ack_frame(through: int = 1, code: ResultCode = ResultCode.OK) -> Frame:
    return Frame(kind=Kind.CHUNK_ACK, source=ORG_B, target=ORG_A,
                 body=ChunkAck(lk0=LK0(endpoint=ORG_A, record_id=7), through=through, code=code))


def nack_frame() -> Frame:
    return Frame(kind=Kind.NACK, source=PLATFORM, target=ORG_A,
                 body=Nack(lk0=LK0(endpoint=ORG_A, record_id=7), code=ResultCode.EXPIRED))


@pytest.mark.parametrize("make", [ping_frame, chunk_frame, chunk_ack_frame, nack_frame,
                                  lambda: batch_frame(2)], ids=["PING", "CHUNK", "CHUNK_ACK", "NACK", "ACK_BATCH"])
def test_the_large_flag_on_a_kind_other_than_data_is_refused(make: Callable[[], Frame]) -> None:
    """FLAG_LARGE says a DATA's AppData is a manifest; on any other kind the
    header alone is refused, as the envelope flag is."""
    frame = make()
    raw = encode_frame(frame)
    dec = FrameDecoder()
    dec.receive_data(_patched(4, raw[4] | FLAG_LARGE, frame)[:HEADER_SIZE])
    err = read_error(dec)
    assert err.code is ResultCode.INVALID_FIELD, err
    assert "large-document flag (0x80)" in str(err) and frame.kind.name in str(err)


def test_the_large_flag_on_data_marks_a_manifest() -> None:
    frame = data_frame(64)
    assert isinstance(frame.body, Data)
    large = replace(frame, body=replace(frame.body, large=True))
    raw = encode_frame(large)
    assert raw[4] == encode_frame(frame)[4] | FLAG_LARGE  # the one bit, the body unchanged
    assert raw[HEADER_SIZE:-4] == encode_frame(frame)[HEADER_SIZE:-4]
    [got] = drain(_decoder_of(raw))
    assert got.large and got.frame() == large
    [plain] = drain(_decoder_of(encode_frame(frame)))
    assert not plain.large and plain.frame() == frame


def _decoder_of(raw: bytes) -> FrameDecoder:
    dec = FrameDecoder()
    dec.receive_data(raw)
    return dec


def test_a_chunk_of_one_mib_round_trips_and_relays() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    frame = chunk_frame(payload, index=2**32 - 1, flags=CHUNK_COMPRESSED)
    raw = encode_frame(frame)
    assert len(raw) == HEADER_SIZE + 15 + (2 + 5 + 12 + 4 + 1 + 4) + len(payload) + 4
    for chunks in ([raw], [raw[i:i + 65536] for i in range(0, len(raw), 65536)]):
        assert decode_stream(chunks) == [frame]
    [rf] = drain(_decoder_of(raw))
    got = rf.frame()
    assert isinstance(got.body, Chunk) and type(got.body.payload) is bytes and got.body.payload == payload
    assert got.body.lk0.endpoint is rf.origin  # the header's endpoint object, not a second one
    assert_valid_value(got)
    # The relay forwards it untouched but for the transport source.
    relayed = relay_bytes(rf, PLATFORM)
    [again] = drain(_decoder_of(relayed))
    assert again.frame() == replace(frame, source=PLATFORM)
    assert again.body == rf.body


def test_flags_contradicting_the_body_are_refused() -> None:
    # Encrypt=1 in the header of a DATA frame without a session key: the
    # header alone looks fine, the body decoder refuses it.
    dec = FrameDecoder()
    dec.receive_data(_patched(4, encode_frame(data_frame(16))[4] | 0x08))
    raw = dec.next_frame()
    assert raw is not None
    with pytest.raises(RemoteProtocolError) as info:
        raw.frame()
    assert info.value.code is ResultCode.INVALID_FIELD
    assert "session key" in str(info.value)


def test_bad_crc() -> None:
    raw = bytearray(encode_frame(data_frame(64)))
    raw[HEADER_SIZE + 20] ^= 0xFF
    dec = FrameDecoder()
    dec.receive_data(bytes(raw))
    err = read_error(dec)
    assert err.code is ResultCode.BAD_CHECKSUM
    assert "CRC32" in str(err)


def test_crc_covers_the_header_and_the_trailer_itself() -> None:
    for i in (4, 6, len(encode_frame(data_frame(8))) - 1):
        raw = bytearray(encode_frame(data_frame(8)))
        raw[i] ^= 0x01 if i != 4 else 0x04  # Ack2 bit: header stays valid
        dec = FrameDecoder()
        dec.receive_data(bytes(raw))
        assert read_error(dec).code is ResultCode.BAD_CHECKSUM


@pytest.mark.parametrize(
    "bad",
    [
        _patched(2, 9),  # version
        _patched(3, 99),  # kind
        _patched(HEADER_SIZE + 30, 0x55)[:-1] + b"\x00",  # CRC
    ],
    ids=["version", "kind", "crc"],
)
def test_after_an_error_the_decoder_keeps_raising(bad: bytes) -> None:
    good = encode_frame(data_frame(8))
    dec = FrameDecoder()
    dec.receive_data(good + bad)
    assert dec.next_frame() is not None  # the good frame before the bad one
    first = read_error(dec)
    dec.receive_data(good)  # more (valid) bytes do not revive it
    for _ in range(3):
        again = read_error(dec)
        assert again.code is first.code


def test_bad_endpoint_bytes_are_a_remote_error() -> None:
    raw = bytearray(encode_frame(data_frame(8)))
    raw[HEADER_SIZE] = ord("/")  # not in [A-Za-z0-9._:@-]
    dec = FrameDecoder()
    dec.receive_data(with_crc(raw[:-4]))
    err = read_error(dec)
    assert err.code is ResultCode.INVALID_FIELD and "/" in str(err)
    assert read_error(dec) is err


@pytest.mark.parametrize(("field", "at"), [("LK0 semq_id", 0), ("LK0 record_id", 4), ("LK1 semq_id", 12)])
def test_a_zero_id_in_the_data_prefix_is_refused_as_the_frame_refuses_it(field: str, at: int) -> None:
    """data_prefix (the platform's routing) builds LK0 and LK1 with the
    codec's constructors for values off the wire; a zero id is refused the
    way LK0 / LK1 refuse it, and the full parse refuses the frame too."""
    frame = data_frame(8)
    assert isinstance(frame.body, Data)
    frame = replace(frame, body=replace(frame.body, lk1=LK1(record_id=9)))
    raw = bytearray(encode_frame(frame))
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    start = drain(dec)[0]._body_start
    width = 8 if field.endswith("record_id") else 2
    raw[start + at:start + at + width] = bytes(width)
    dec = FrameDecoder()
    dec.receive_data(with_crc(raw[:-4]))
    [bad] = drain(dec)
    with pytest.raises(RemoteProtocolError) as prefix:
        bad.data_prefix()
    with pytest.raises(RemoteProtocolError) as full:
        bad.frame()
    assert prefix.value.code is full.value.code is ResultCode.INVALID_FIELD
    name = field.split()[1]
    assert str(prefix.value) == f"DATA prefix: {name} 0 is outside 1..{'65535' if width == 2 else '2**64-1'}"


def test_non_data_frame_has_no_data_prefix() -> None:
    dec = FrameDecoder()
    dec.receive_data(encode_frame(ping_frame()))
    raw = dec.next_frame()
    assert raw is not None
    with pytest.raises(LocalProtocolError):
        raw.data_prefix()
    with pytest.raises(LocalProtocolError):
        raw.data_ids()


# ------------------------------------------------------------- relay_bytes


def _parts(raw: bytes) -> tuple[bytes, int]:
    dec = FrameDecoder()
    dec.receive_data(raw)
    r = dec.next_frame()
    assert r is not None
    return r.body, r.source.node_type


@PROTOCOL_SETTINGS
@given(frame=frames, new_source=st.sampled_from([PLATFORM, Endpoint.platform("p-2.example:7")]),
       lk1=st.builds(LK1, record_id=st.integers(1, 2**64 - 1), semq_id=st.integers(1, 0xFFFF),
                     semq_db_id=st.integers(1, 0xFFFF)))
def test_relay_bytes_replaces_source_and_splices_lk1(frame: Frame, new_source: Endpoint,
                                                     lk1: LK1) -> None:
    raw = encode_frame(frame)
    dec = FrameDecoder()
    dec.receive_data(raw)
    rf = dec.next_frame()
    assert rf is not None
    splice = lk1 if frame.kind is Kind.DATA else None
    out = relay_bytes(rf, new_source, splice)
    dec2 = FrameDecoder()
    dec2.receive_data(out)  # CRC valid, or this raises
    relayed = dec2.next_frame()
    assert relayed is not None
    got = relayed.frame()
    # Only the source (and LK1) changed; the origin and everything else stay.
    expected_body = replace(frame.body, lk1=lk1) if isinstance(frame.body, Data) else frame.body
    assert got == replace(frame, source=new_source, body=expected_body)
    assert relayed.origin == frame.origin
    # Bytes after the DATA prefix (AppKey, SessionKey, AppData) are copied untouched.
    cut = 40 if frame.kind is Kind.DATA else 0
    assert relayed.body[cut:] == rf.body[cut:]
    assert relayed.body[:12] == rf.body[:12]


def test_relay_bytes_refuses_lk1_on_a_non_data_frame() -> None:
    dec = FrameDecoder()
    dec.receive_data(encode_frame(ping_frame()))
    rf = dec.next_frame()
    assert rf is not None
    with pytest.raises(LocalProtocolError):
        relay_bytes(rf, PLATFORM, LK1(record_id=5))


def test_relay_without_lk1_keeps_the_body_bytes() -> None:
    frame = data_frame(32)
    raw = encode_frame(frame)
    dec = FrameDecoder()
    dec.receive_data(raw)
    rf = dec.next_frame()
    assert rf is not None
    out = relay_bytes(rf, PLATFORM)
    assert _parts(out)[0] == rf.body
    assert _parts(out)[1] == PLATFORM.node_type
    assert out != raw
    assert SaveFwd(out[5]) is frame.save_fwd


# ------------------------------------------- values the layout cannot forbid
# Every rule the wire layout leaves open (an unsigned u16 can still be 0) must
# be enforced on decode with INVALID_FIELD, by the fast decode path as much as
# by the public constructors. Each case patches one field of a valid frame.

ACK_ENTRY_FLAGS = 24  # offset of ack_flag in an 810 entry; flag follows


def reframe(frame: Frame, body: bytes, flags: int | None = None) -> bytes:
    """``frame``'s header and ids around ``body``, body_len and CRC fixed."""
    raw = encode_frame(frame)
    ids_end = HEADER_SIZE + sum(len(e.node_id) for e in (frame.source, frame.target, frame.origin))
    head = bytearray(raw[:HEADER_SIZE])
    head[14:18] = struct.pack(">I", len(body))
    if flags is not None:
        head[4] = flags
    return with_crc(bytes(head) + raw[HEADER_SIZE:ids_end] + body)


def body_of(frame: Frame) -> bytearray:
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    raw = dec.next_frame()
    assert raw is not None
    return bytearray(raw.body)


def patched_body(frame: Frame, offset: int, value: bytes, flags: int | None = None) -> bytes:
    body = body_of(frame)
    body[offset:offset + len(value)] = value
    return reframe(frame, bytes(body), flags)


def full_data(**kw: object) -> Frame:
    body = Data(lk0=LK0(endpoint=ORG_A, record_id=9), lk1=LK1(record_id=4),
                app_key=AppKey(domain="trade", key="S0001"), created_ms=5, expires_ms=6,
                encrypt=True, session_key=b"k" * 16, app_data=b"doc")
    return Frame(kind=Kind.DATA, source=PLATFORM, target=ORG_B, origin=ORG_A, body=body, **kw)  # type: ignore[arg-type]


def ack_frame(kind: Kind = Kind.ACK2, receipt: bytes = b"") -> Frame:
    ack_flag = AckFlag.DELIVERY if kind in (Kind.ACK2, Kind.REACK2) else AckFlag.PLATFORM
    flag = {Kind.ACK_FWD: ForwardFlag.FORWARDED, Kind.ACK_SAVE: ForwardFlag.STORED}.get(
        kind, ForwardFlag.NONE)
    return Frame(kind=kind, source=ORG_B, target=ORG_A,
                 body=Ack(dest_ref_id=9, ack_flag=ack_flag, flag=flag, receipt=receipt))


def batch_frame(n: int, kind: Kind = Kind.ACK2) -> Frame:
    return Frame(kind=Kind.ACK_BATCH, source=ORG_B, target=ORG_A,
                 body=AckBatch(ack_kind=kind,
                               entries=tuple(AckEntry.of(i + 1, AckFlag.DELIVERY) for i in range(n))))


def _big_session_key() -> bytes:
    c = DATA_BODY.parse(bytes(body_of(full_data())))
    c.session_key = bytes(5000)
    return reframe(full_data(), DATA_BODY.build(c))


def _big_receipt() -> bytes:
    body = body_of(ack_frame())
    return reframe(ack_frame(), bytes(body[:-2]) + struct.pack(">H", 5000) + bytes(5000))


CHUNK_FLAGS_AT = 2 + 5 + 12 + 4  # locator of "10008" (type, length, id, ids), index
CHUNK_ACK_CODE_AT = 2 + 5 + 12 + 4  # locator, through


def _oversized_batch() -> bytes:
    one = body_of(batch_frame(1))  # kind, count, 1 entry, receipt length
    entry = bytes(one[5:5 + 26])
    n = MAX_ACK_BATCH + 1
    return reframe(batch_frame(1), bytes(one[:1]) + struct.pack(">I", n) + entry * n + b"\0\0")


WIRE_CASES: list[tuple[str, Callable[[], bytes], list[str]]] = [
    ("LK0 record_id 0", lambda: patched_body(full_data(), 4, bytes(8)), ["record_id 0"]),
    ("LK0 semq_id 0", lambda: patched_body(full_data(), 0, bytes(2)), ["semq_id 0"]),
    ("LK0 semq_db_id 0", lambda: patched_body(full_data(), 2, bytes(2)), ["semq_db_id 0"]),
    ("LK1 semq_id 0", lambda: patched_body(full_data(), 12, bytes(2)), ["semq_id 0"]),
    ("LK1 semq_db_id 0", lambda: patched_body(full_data(), 14, bytes(2)), ["semq_db_id 0"]),
    ("created_ms 2**63", lambda: patched_body(full_data(), 24, struct.pack(">Q", 2**63)),
     ["created_ms", str(2**63)]),
    ("expires_ms 2**64-1", lambda: patched_body(full_data(), 32, b"\xff" * 8),
     ["expires_ms", str(2**64 - 1)]),
    ("session key of 5000 bytes", _big_session_key, ["5000", "4096"]),
    ("Encrypt=1 without a key", lambda: reframe(data_frame(4), bytes(body_of(data_frame(4))),
                                                flags=encode_frame(data_frame(4))[4] | 0x08),
     ["Encrypt=1"]),
    ("a key with Encrypt=0", lambda: reframe(full_data(), bytes(body_of(full_data())),
                                             flags=encode_frame(full_data())[4] & ~0x08),
     ["Encrypt=0"]),
    ("Reliable=0 with SaveFwd=3", lambda: reframe(full_data(), bytes(body_of(full_data())),
                                                  flags=encode_frame(full_data())[4] & ~0x02),
     ["Reliable=0"]),
    ("ACK with Ack2=1", lambda: reframe(ack_frame(Kind.ACK), bytes(body_of(ack_frame(Kind.ACK))),
                                        flags=encode_frame(ack_frame(Kind.ACK))[4] | 0x04),
     ["ACK", "Ack2=0"]),
    ("ack_flag 3", lambda: patched_body(ack_frame(), ACK_ENTRY_FLAGS, b"\x03"), ["ack_flag 3"]),
    ("flag 7", lambda: patched_body(ack_frame(), ACK_ENTRY_FLAGS + 1, b"\x07"), ["flag 7"]),
    ("ACK2 with ack_flag 1", lambda: patched_body(ack_frame(), ACK_ENTRY_FLAGS, b"\x01"),
     ["ACK2", "ack_flag 2"]),
    ("ACK_FWD with flag 2", lambda: patched_body(ack_frame(Kind.ACK_FWD), ACK_ENTRY_FLAGS + 1,
                                                 b"\x02"), ["ACK_FWD", "flag 1"]),
    ("receipt of 5000 bytes", _big_receipt, ["5000", "4096"]),
    ("ACK_BATCH of kind DATA", lambda: patched_body(batch_frame(3), 0, b"\x01"),
     ["DATA", "not an ack kind"]),
    ("ACK_BATCH of kind 99", lambda: patched_body(batch_frame(3), 0, b"\x63"), ["ack_kind 99"]),
    ("ACK_BATCH last entry's ack_flag", lambda: patched_body(batch_frame(3), 5 + 2 * 26 + 24, b"\x01"),
     ["ack_flag 1"]),
    ("ACK_BATCH first entry's flag", lambda: patched_body(batch_frame(3), 5 + 25, b"\x01"),
     ["flag 1"]),
    ("ACK_BATCH of 100001 entries", _oversized_batch, ["100001", "100000"]),
    ("CHUNK flags 0x02", lambda: patched_body(chunk_frame(), CHUNK_FLAGS_AT, b"\x02"),
     ["chunk flags 0x02", "CHUNK_COMPRESSED"]),
    ("CHUNK flags 0xff", lambda: patched_body(chunk_frame(), CHUNK_FLAGS_AT, b"\xff"), ["chunk flags 0xff"]),
    ("CHUNK of another origin's document", lambda: patched_body(chunk_frame(), 2, b"10009"),
     ["CHUNK LK0 names organization:10009", "origin is organization:10008"]),
    ("CHUNK LK0 record_id 0", lambda: patched_body(chunk_frame(), 2 + 5 + 4, bytes(8)), ["record_id 0"]),
    ("CHUNK LK0 node type 9", lambda: patched_body(chunk_frame(), 0, b"\x09"), ["node type 9"]),
    ("CHUNK_ACK code 7", lambda: patched_body(chunk_ack_frame(), CHUNK_ACK_CODE_AT, b"\x00\x07"),
     ["code 7"]),
]


@pytest.mark.parametrize(("make", "words"), [c[1:] for c in WIRE_CASES],
                         ids=[c[0] for c in WIRE_CASES])
def test_rules_the_layout_leaves_open_are_enforced_on_decode(
    make: Callable[[], bytes], words: list[str]
) -> None:
    dec = FrameDecoder()
    dec.receive_data(make())
    raw = dec.next_frame()  # framing, header and CRC are fine ...
    assert raw is not None
    with pytest.raises(RemoteProtocolError) as info:
        raw.frame()  # ... the value is not
    assert info.value.code is ResultCode.INVALID_FIELD, info.value
    for w in words:
        assert w in str(info.value), f"{w!r} missing from {str(info.value)!r}"


def _chunk_body_cut(keep: int) -> bytes:
    return reframe(chunk_frame(), bytes(body_of(chunk_frame())[:keep]))


def _chunk_payload_len(delta: int) -> bytes:
    body = body_of(chunk_frame())
    at = CHUNK_FLAGS_AT + 1
    (n,) = struct.unpack_from(">I", body, at)
    body[at:at + 4] = struct.pack(">I", n + delta)
    return reframe(chunk_frame(), bytes(body))


@pytest.mark.parametrize("make", [
    lambda: _chunk_body_cut(0), lambda: _chunk_body_cut(1), lambda: _chunk_body_cut(CHUNK_FLAGS_AT + 3),
    lambda: _chunk_payload_len(1), lambda: _chunk_payload_len(-1),
    lambda: patched_body(chunk_frame(), 1, b"\x40"),  # an id length past the body
], ids=["empty", "1 byte", "cut in the payload length", "payload shorter than declared",
        "bytes after the payload", "id length past the end"])
def test_a_chunk_body_that_breaks_its_layout_is_malformed(make: Callable[[], bytes]) -> None:
    [raw] = drain(_decoder_of(make()))
    with pytest.raises(RemoteProtocolError) as info:
        raw.frame()
    assert info.value.code is ResultCode.MALFORMED_FRAME, info.value
    assert "CHUNK" in str(info.value)


def test_patch_helpers_change_nothing_when_given_the_same_bytes() -> None:
    # The cases above are only meaningful if an unpatched reframe decodes.
    for frame in (full_data(), ack_frame(), batch_frame(3), chunk_frame(), chunk_ack_frame()):
        assert decode_stream([reframe(frame, bytes(body_of(frame)))]) == [frame]
