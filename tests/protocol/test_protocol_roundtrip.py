"""Round trips over every kind, and the fast hand codecs against the normative
construct schemas of _schema.py (byte for byte, field by field)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semq.umxt_protocol import (
    HEADER_SIZE,
    Ack,
    AckBatch,
    AckEntry,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    RawFrame,
    encode_frame,
)
from semq.umxt_protocol._schema import (
    ACK_BATCH_BODY,
    ACK_BODY,
    BODY_SCHEMAS,
    DATA_BODY,
    HEADER,
    MAGIC,
    VERSION,
)
from tests.protocol.test_protocol_strategies import (
    ACK_KINDS,
    PROTOCOL_SETTINGS,
    ack_batch_bodies,
    assert_valid_value,
    frames_of,
)


def decode_one(raw: bytes) -> RawFrame:
    dec = FrameDecoder()
    dec.receive_data(raw)
    got = dec.next_frame()
    assert got is not None
    assert dec.next_frame() is None
    assert dec.buffered == 0
    return got


def split(raw: bytes, frame: Frame) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """(header, source id, target id, origin id, body) of an encoded frame."""
    sl, tl, ol = (len(e.node_id) for e in (frame.source, frame.target, frame.origin))
    i = HEADER_SIZE
    return (raw[:i], raw[i:i + sl], raw[i + sl:i + sl + tl], raw[i + sl + tl:i + sl + tl + ol],
            raw[i + sl + tl + ol:-4])


# ------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
@PROTOCOL_SETTINGS
@given(data=st.data())
def test_round_trip_every_kind(kind: Kind, data: st.DataObject) -> None:
    frame = data.draw(frames_of(kind))
    raw = encode_frame(frame)
    got = decode_one(raw)
    # The routing view (header only) agrees with the frame ...
    assert got.kind is kind
    assert (got.source, got.target, got.origin) == (frame.source, frame.target, frame.origin)
    assert (got.flags, got.save_fwd, got.priority) == (frame.flags, frame.save_fwd, frame.priority)
    assert (got.reliable, got.ack2) == (frame.reliable, frame.ack2)
    assert got.raw == raw
    # ... and the parsed frame is the original, field for field and type for
    # type, and passes the public constructors' validation.
    assert got.frame() == frame
    assert_valid_value(got.frame())
    # Encoding is a function of the value: re-encoding gives the same bytes.
    assert encode_frame(got.frame()) == raw
    if kind is Kind.DATA:
        assert isinstance(frame.body, Data)
        lk0, lk1, created, expires = got.data_prefix()
        assert (lk0, lk1, created, expires) == (
            frame.body.lk0, frame.body.lk1, frame.body.created_ms, frame.body.expires_ms)


# ------------------------------------------- hand codecs vs construct schema


def _header_container(frame: Frame, raw: bytes) -> dict[str, Any]:
    _, src, dst, org, body = split(raw, frame)
    return {
        "magic": MAGIC, "version": VERSION, "kind": int(frame.kind), "flags": frame.flags,
        "save_fwd": int(frame.save_fwd), "priority": frame.priority,
        "source_type": int(frame.source.node_type), "target_type": int(frame.target.node_type),
        "origin_type": int(frame.origin.node_type), "source_len": len(src),
        "target_len": len(dst), "origin_len": len(org), "reserved": 0, "body_len": len(body),
    }


def _app_key(c: Any) -> tuple[str, str, str, str]:
    return (c.domain, c.data_type, c.subtype, c.key)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
@PROTOCOL_SETTINGS
@given(data=st.data())
def test_header_and_crc_match_the_schema(kind: Kind, data: st.DataObject) -> None:
    frame = data.draw(frames_of(kind))
    raw = encode_frame(frame)
    head, src, dst, org, body = split(raw, frame)
    expected = _header_container(frame, raw)
    assert HEADER.build(expected) == head
    parsed = HEADER.parse(head)
    assert {k: parsed[k] for k in expected} == expected
    assert (src, dst, org) == tuple(
        e.node_id.encode("ascii") for e in (frame.source, frame.target, frame.origin))
    assert raw[-4:] == struct.pack(">I", zlib.crc32(raw[:-4]))
    # Every body, hand-coded or not, is exactly what its schema parses and
    # rebuilds: the hand codecs cannot drift from the normative layout.
    schema = BODY_SCHEMAS[int(kind)]
    assert schema.build(schema.parse(body)) == body
    assert schema.compile().build(schema.parse(body)) == body


@PROTOCOL_SETTINGS
@given(frame=frames_of(Kind.DATA))
def test_data_codec_matches_the_schema(frame: Frame) -> None:
    d = frame.body
    assert isinstance(d, Data)
    body = split(encode_frame(frame), frame)[4]
    lk1 = d.lk1
    container = {
        "prefix": {
            "semq_id": d.lk0.semq_id, "semq_db_id": d.lk0.semq_db_id,
            "record_id": d.lk0.record_id,
            "lk1_semq_id": lk1.semq_id if lk1 else 0,
            "lk1_semq_db_id": lk1.semq_db_id if lk1 else 0,
            "lk1_record_id": lk1.record_id if lk1 else 0,
            "created_ms": d.created_ms, "expires_ms": d.expires_ms or 0,
        },
        "domain": d.app_key.domain, "data_type": d.app_key.data_type,
        "subtype": d.app_key.subtype, "key": d.app_key.key,
        "session_key": d.session_key, "app_data": d.app_data,
    }
    assert DATA_BODY.build(container) == body
    c = DATA_BODY.parse(body)
    assert {k: c.prefix[k] for k in container["prefix"]} == container["prefix"]
    assert _app_key(c) == (d.app_key.domain, d.app_key.data_type, d.app_key.subtype, d.app_key.key)
    assert (c.session_key, c.app_data) == (d.session_key, d.app_data)


def _entry_container(e: tuple[int, ...]) -> dict[str, int]:
    # AckEntry's field names are the 810 parameter names of ACK_ENTRY.
    return dict(zip(AckEntry._fields, e, strict=True))


@pytest.mark.parametrize("kind", ACK_KINDS, ids=lambda k: k.name)
@PROTOCOL_SETTINGS
@given(data=st.data())
def test_ack_codec_matches_the_schema(kind: Kind, data: st.DataObject) -> None:
    frame = data.draw(frames_of(kind))
    a = frame.body
    assert isinstance(a, Ack)
    body = split(encode_frame(frame), frame)[4]
    container = {
        "entry": _entry_container(tuple(a.entry)),
        "domain": a.app_key.domain, "data_type": a.app_key.data_type,
        "subtype": a.app_key.subtype, "key": a.app_key.key, "receipt": a.receipt,
    }
    assert ACK_BODY.build(container) == body
    c = ACK_BODY.parse(body)
    assert {k: c.entry[k] for k in container["entry"]} == container["entry"]
    assert _app_key(c) == (a.app_key.domain, a.app_key.data_type, a.app_key.subtype, a.app_key.key)
    assert c.receipt == a.receipt


@PROTOCOL_SETTINGS
@given(batch=ack_batch_bodies(max_entries=60))
def test_ack_batch_codec_matches_the_schema(batch: AckBatch) -> None:
    frame = Frame(kind=Kind.ACK_BATCH, source=Endpoint.org("56001"),
                  target=Endpoint.platform(), body=batch)
    body = split(encode_frame(frame), frame)[4]
    container = {
        "ack_kind": int(batch.ack_kind), "count": len(batch.entries),
        "entries": [_entry_container(tuple(e)) for e in batch.entries],
        "receipt": batch.receipt,
    }
    assert ACK_BATCH_BODY.build(container) == body
    c = ACK_BATCH_BODY.parse(body)
    assert (c.ack_kind, c.count, c.receipt) == (int(batch.ack_kind), len(batch.entries),
                                                batch.receipt)
    assert [tuple(e[k] for k in AckEntry._fields) for e in c.entries] == [
        tuple(e) for e in batch.entries]
