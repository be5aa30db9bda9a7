"""The origin's direct DATA encoder gives the same bytes as encode_frame;
the hand-written CHUNK codec gives and reads the bytes of its construct
schema."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.umxt_protocol import (
    CHUNK_COMPRESSED,
    LK0,
    AppKey,
    Chunk,
    Data,
    Endpoint,
    Frame,
    Kind,
    SaveFwd,
    encode_data,
    encode_frame,
)

ids = st.from_regex(r"[A-Za-z0-9._:@-]{1,64}", fullmatch=True)
text = st.text(max_size=40)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(src=ids, dst=ids, rid=st.integers(1, 2**64 - 1), key=st.tuples(text, text, text, text),
       created=st.integers(0, 2**63 - 1), expires=st.none() | st.integers(1, 2**63 - 1),
       save_fwd=st.sampled_from([1, 2, 3]), ack2=st.booleans(), prio=st.integers(0, 9),
       sk=st.binary(max_size=300), data=st.binary(max_size=3000), semq=st.integers(1, 65535),
       large=st.booleans(), envelope=st.booleans(), ordered=st.booleans())
def test_encode_data_matches_encode_frame(src: str, dst: str, rid: int, key: tuple[str, str, str, str],
                                          created: int, expires: int | None, save_fwd: int, ack2: bool,
                                          prio: int, sk: bytes, data: bytes, semq: int, large: bool,
                                          envelope: bool, ordered: bool) -> None:
    source, target = Endpoint.org(src), Endpoint.org(dst)
    ordered = ordered and envelope
    frame = Frame(
        kind=Kind.DATA, source=source, target=target, save_fwd=SaveFwd(save_fwd), ack2=ack2, priority=prio,
        body=Data(lk0=LK0(endpoint=source, record_id=rid, semq_id=semq, semq_db_id=semq),
                  app_key=AppKey(domain=key[0], data_type=key[1], subtype=key[2], key=key[3]),
                  created_ms=created, expires_ms=expires, encrypt=bool(sk), session_key=sk, app_data=data,
                  envelope=envelope, ordered=ordered, large=large),
    )
    fast = encode_data(source=source, target=target, record_id=rid, app_key=key, created_ms=created,
                       expires_ms=expires, save_fwd=save_fwd, ack2=ack2, priority=prio, session_key=sk,
                       app_data=data, semq_id=semq, semq_db_id=semq, envelope=envelope, ordered=ordered,
                       large=large)
    assert fast == encode_frame(frame)


def test_encode_data_of_a_large_documents_manifest() -> None:
    """``large=True`` sets FLAG_LARGE and nothing else: the frame decodes to
    a Data with ``large`` set."""
    from semq.umxt_protocol import FLAG_LARGE, FrameDecoder

    a, b = Endpoint.org("10008"), Endpoint.org("56001")
    kw = dict(source=a, target=b, record_id=1003, session_key=b"k" * 32, app_data=b"manifest", ack2=True)
    plain, large = encode_data(**kw), encode_data(**kw, large=True)  # type: ignore[arg-type]
    assert large[4] == plain[4] | FLAG_LARGE and large[:4] == plain[:4] and large[5:-4] == plain[5:-4]
    dec = FrameDecoder()
    dec.receive_data(large)
    raw = dec.next_frame()
    assert raw is not None and raw.large
    body = raw.frame().body
    assert isinstance(body, Data) and body.large and body.encrypt and body.app_data == b"manifest"


def _chunk_container(c: Chunk) -> dict[str, object]:
    ep = c.lk0.endpoint
    return {"node_type": int(ep.node_type), "node_id": ep.node_id, "semq_id": c.lk0.semq_id,
            "semq_db_id": c.lk0.semq_db_id, "record_id": c.lk0.record_id, "index": c.index,
            "flags": c.flags, "payload": c.payload}


@settings(max_examples=200, derandomize=True, deadline=None)
@given(src=ids, dst=ids, rid=st.integers(1, 2**64 - 1), semq=st.integers(1, 65535),
       index=st.integers(0, 2**32 - 1) | st.sampled_from([0, 2**32 - 1]),
       flags=st.sampled_from([0, CHUNK_COMPRESSED]), payload=st.binary(max_size=5000),
       relayed=st.booleans())
def test_chunk_codec_matches_the_schema(src: str, dst: str, rid: int, semq: int, index: int, flags: int,
                                        payload: bytes, relayed: bool) -> None:
    """The CHUNK body encode_frame writes is CHUNK_BODY's (and the compiled
    schema's) build of the same value, and the decoder reads CHUNK_BODY's
    bytes back to the value."""
    from semq.umxt_protocol import FrameDecoder
    from semq.umxt_protocol._frames import encode_body
    from semq.umxt_protocol._schema import CHUNK_BODY, HEADER

    origin, target = Endpoint.org(src), Endpoint.org(dst)
    chunk = Chunk(lk0=LK0(endpoint=origin, record_id=rid, semq_id=semq, semq_db_id=semq),
                  index=index, flags=flags, payload=payload)
    source = Endpoint.platform() if relayed else origin
    frame = Frame(kind=Kind.CHUNK, source=source, target=target, origin=origin, body=chunk)
    raw = encode_frame(frame)
    container = _chunk_container(chunk)
    body = CHUNK_BODY.build(container)
    assert body == CHUNK_BODY.compile().build(container) == encode_body(Kind.CHUNK, chunk)
    assert raw.endswith(body + raw[-4:]) and HEADER.parse(raw).body_len == len(body)
    parsed = CHUNK_BODY.parse(body)
    assert {k: parsed[k] for k in container} == container
    dec = FrameDecoder()
    dec.receive_data(raw)
    got = dec.next_frame()
    assert got is not None and got.body == body and got.frame() == frame


@settings(max_examples=300, derandomize=True, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1))
def test_frame_crc32_is_zlibs(data: bytes, start: int) -> None:
    """The frames' CRC32 (ISA-L's, for speed) gives zlib's values, on bytes
    and on the memoryviews the decoder passes, from any starting value."""
    import zlib

    from semq.umxt_protocol._codec import crc32

    assert crc32.__module__ == "isal.isal_zlib"  # the declared dependency, not the fallback
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])
    assert crc32(data, start) == zlib.crc32(data, start)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(semq=st.integers(0, 65535), db=st.integers(0, 65535), rec=st.integers(0, 2**64 - 1))
def test_lk1_from_wire_is_the_validated_lk1(semq: int, db: int, rec: int) -> None:
    """The hot paths' LK1 (the platform names each delivered copy with one)
    equals the public constructor's, and refuses what it refuses (zeros)."""
    from semq.umxt_protocol import LK1, ProtocolError, lk1_from_wire

    try:
        want = LK1(semq_id=semq, semq_db_id=db, record_id=rec)
    except ProtocolError as e:
        with pytest.raises(ProtocolError) as info:
            lk1_from_wire(semq, db, rec)
        assert type(info.value) is type(e) and str(info.value) == str(e)
    else:
        assert lk1_from_wire(semq, db, rec) == want
