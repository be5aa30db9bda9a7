"""The origin's direct DATA encoder gives the same bytes as encode_frame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.umxt_protocol import (
    LK0,
    AppKey,
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
       sk=st.binary(max_size=300), data=st.binary(max_size=3000), semq=st.integers(1, 65535))
def test_encode_data_matches_encode_frame(src: str, dst: str, rid: int, key: tuple[str, str, str, str],
                                          created: int, expires: int | None, save_fwd: int, ack2: bool,
                                          prio: int, sk: bytes, data: bytes, semq: int) -> None:
    source, target = Endpoint.org(src), Endpoint.org(dst)
    frame = Frame(
        kind=Kind.DATA, source=source, target=target, save_fwd=SaveFwd(save_fwd), ack2=ack2, priority=prio,
        body=Data(lk0=LK0(endpoint=source, record_id=rid, semq_id=semq, semq_db_id=semq),
                  app_key=AppKey(domain=key[0], data_type=key[1], subtype=key[2], key=key[3]),
                  created_ms=created, expires_ms=expires, encrypt=bool(sk), session_key=sk, app_data=data),
    )
    fast = encode_data(source=source, target=target, record_id=rid, app_key=key, created_ms=created,
                       expires_ms=expires, save_fwd=save_fwd, ack2=ack2, priority=prio, session_key=sk,
                       app_data=data, semq_id=semq, semq_db_id=semq)
    assert fast == encode_frame(frame)


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
