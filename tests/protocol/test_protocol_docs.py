"""docs/protocol.md is checked against the code, so the format cannot drift
silently: the golden vectors (encode == hex, decode == frame), the layout
tables (field names, sizes and offsets against the construct schemas), and the
kind and result-code tables (against the IntEnums)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pytest
from construct import Array, Construct, Renamed, Struct, Terminated

from semq.umxt_protocol import (
    CHUNK_COMPRESSED,
    LK0,
    LK1,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Bye,
    CertRequest,
    CertResponse,
    Chunk,
    ChunkAck,
    Crl,
    Data,
    Endpoint,
    Error,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Hello,
    Inquiry,
    InquiryAnswer,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
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
    ResultCode,
    SaveFwd,
    Welcome,
    WindowUpdate,
    _schema,
    encode_frame,
    relay_bytes,
)

DOC: Final = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

# ------------------------------------------------------------ golden frames
# The SEMQ example of SPEC "The flow": organization 10008 (A) sends order
# S0001 to organization 56001 (B) through the platform (P). Fixed values only.

A: Final = Endpoint.org("10008")
B: Final = Endpoint.org("56001")
P: Final = Endpoint.platform()
CREATED_MS: Final = 1_795_000_000_000  # 2026-11-18T11:06:40Z
ORDER: Final = AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001")
A_RECORD: Final = 1001  # A's pending-send row (LK0 record id)
P_RECORD: Final = 77  # the platform's stored copy (LK1 record id)
B_RECORD: Final = 501  # B's pending-ack row
LK0_S0001: Final = LK0(endpoint=A, record_id=A_RECORD)
# Illustrative bytes: the wrapped session key and the sealed AppData are
# whatever the crypto layer produced; the protocol carries them opaquely.
SESSION_KEY: Final = bytes(range(32))
SEALED_ORDER: Final = b"sealed order S0001:" + bytes(range(0xE0, 0xF0))

# Direct links: A listens on its LAN address and asks the platform to add the
# address its connection comes from (observe); only B may look it up. The
# fingerprint is illustrative: the SHA-256 of the certificate A's platform
# connection presented, hex.
A_DIRECT: Final = "192.168.1.20:7443"
A_OBSERVED: Final = "203.0.113.7:7443"
A_FINGERPRINT: Final = "470cd18267a28405605bb10fa00589a3da77de5bc57bbd88ca4869a1d4033807"
A_TTL_S: Final = 3600

# A large document (A's record 1003): its manifest travels as a DATA with
# FLAG_LARGE, its content in CHUNK frames. Illustrative sealed bytes again.
LK0_LARGE: Final = LK0(endpoint=A, record_id=1003)
SEALED_MANIFEST: Final = b"sealed manifest:" + bytes(range(0xE0, 0xF0))
SEALED_CHUNK: Final = b"sealed chunk 0:" + bytes(range(0xE0, 0xF0))

_ORDER_BODY: Final = dict(
    lk0=LK0_S0001, app_key=ORDER, created_ms=CREATED_MS, expires_ms=CREATED_MS + 7 * 86_400_000,
    encrypt=True, session_key=SESSION_KEY, app_data=SEALED_ORDER,
)


def _ack(kind: Kind, src: Endpoint, dst: Endpoint, **kw: Any) -> Frame:
    return Frame(kind=kind, source=src, target=dst, body=Ack(**kw))


GOLDEN: Final[dict[str, Frame]] = {
    # A -> P: the order as it leaves A (no LK1 yet).
    "data_semq_example_from_origin": Frame(
        kind=Kind.DATA, source=A, target=B, save_fwd=SaveFwd.MUST_DELIVER, ack2=True,
        priority=5, body=Data(**_ORDER_BODY),  # type: ignore[arg-type]
    ),
    # P -> B: the stored copy delivered when B came online: every field set.
    "data_semq_example": Frame(
        kind=Kind.DATA, source=P, target=B, origin=A, save_fwd=SaveFwd.MUST_DELIVER, ack2=True,
        priority=5, body=Data(lk1=LK1(record_id=P_RECORD), **_ORDER_BODY),  # type: ignore[arg-type]
    ),
    "ack": _ack(Kind.ACK, B, P, src_ref_id=B_RECORD, dest_ref_id=P_RECORD,
                ack_flag=AckFlag.PLATFORM, app_key=ORDER),
    "reack": _ack(Kind.REACK, P, B, src_ref_id=P_RECORD, dest_ref_id=B_RECORD,
                  ack_flag=AckFlag.PLATFORM, app_key=ORDER),
    "ack2": _ack(Kind.ACK2, B, A, src_ref_id=B_RECORD, dest_ref_id=A_RECORD,
                 ack_flag=AckFlag.DELIVERY, app_key=ORDER),
    "reack2": _ack(Kind.REACK2, A, B, src_ref_id=A_RECORD, dest_ref_id=B_RECORD,
                   ack_flag=AckFlag.DELIVERY, app_key=ORDER),
    "ack_fwd": _ack(Kind.ACK_FWD, P, A, dest_ref_id=A_RECORD, ack_flag=AckFlag.PLATFORM,
                    flag=ForwardFlag.FORWARDED, app_key=ORDER),
    "ack_save": _ack(Kind.ACK_SAVE, P, A, src_ref_id=P_RECORD, dest_ref_id=A_RECORD,
                     ack_flag=AckFlag.PLATFORM, flag=ForwardFlag.STORED, app_key=ORDER),
    "inquiry": Frame(kind=Kind.INQUIRY, source=A, target=B,
                     body=Inquiry(topic=InquiryTopic.RECEIVED, items=(LK0_S0001,))),
    "inquiry_resp": Frame(
        kind=Kind.INQUIRY_RESP, source=B, target=A,
        body=InquiryResp(topic=InquiryTopic.RECEIVED,
                         answers=(InquiryAnswer(LK0_S0001, InquiryResult.RECEIVED),)),
    ),
    "ack_batch": Frame(
        kind=Kind.ACK_BATCH, source=B, target=A,
        body=AckBatch(ack_kind=Kind.ACK2, entries=tuple(
            AckEntry.of(A_RECORD + i, AckFlag.DELIVERY, src_ref_id=B_RECORD + i) for i in range(3))),
    ),
    "nack": Frame(kind=Kind.NACK, source=P, target=A,
                  body=Nack(lk0=LK0(endpoint=A, record_id=1002),
                            code=ResultCode.TARGET_OFFLINE_DROPPED,
                            message="56001 is offline and SaveFwd=1")),
    "data_large_manifest": Frame(
        kind=Kind.DATA, source=A, target=B, save_fwd=SaveFwd.MUST_DELIVER, ack2=True,
        body=Data(lk0=LK0_LARGE, app_key=ORDER, created_ms=CREATED_MS, encrypt=True,
                  session_key=SESSION_KEY, app_data=SEALED_MANIFEST, large=True),
    ),
    "chunk": Frame(kind=Kind.CHUNK, source=A, target=B,
                   body=Chunk(lk0=LK0_LARGE, index=0, flags=CHUNK_COMPRESSED, payload=SEALED_CHUNK)),
    "chunk_ack": Frame(kind=Kind.CHUNK_ACK, source=B, target=A, body=ChunkAck(lk0=LK0_LARGE, through=1)),
    "hello": Frame(kind=Kind.HELLO, source=A, target=P,
                   body=Hello(window=1024, software="semq 0.1.0", token=b"\x01\x02\x03\x04")),
    "welcome": Frame(kind=Kind.WELCOME, source=P, target=A,
                     body=Welcome(window=1024, server_time_ms=CREATED_MS, session_id=42)),
    "ping": Frame(kind=Kind.PING, source=A, target=P, body=Ping(nonce=7, time_ms=CREATED_MS)),
    "pong": Frame(kind=Kind.PONG, source=P, target=A, body=Pong(nonce=7, time_ms=CREATED_MS)),
    "error": Frame(kind=Kind.ERROR, source=P, target=A,
                   body=Error(code=ResultCode.SOURCE_MISMATCH, message="frame claims source 56001")),
    "window": Frame(kind=Kind.WINDOW, source=P, target=A, body=WindowUpdate(credit=512)),
    "cert_request": Frame(kind=Kind.CERT_REQUEST, source=A, target=P,
                          body=CertRequest(endpoint=B)),
    "cert_response": Frame(kind=Kind.CERT_RESPONSE, source=P, target=A,
                           body=CertResponse(endpoint=B, certificates=(b"0\x82DER...",))),
    "bye": Frame(kind=Kind.BYE, source=A, target=P,
                 body=Bye(code=ResultCode.SHUTTING_DOWN, reason="node stopping")),
    "crl": Frame(kind=Kind.CRL, source=P, target=A, body=Crl(der=b"0\x82CRL...")),
    "peer_announce": Frame(kind=Kind.PEER_ANNOUNCE, source=A, target=P,
                           body=PeerAnnounce(ttl_s=A_TTL_S, observe=True, addresses=(A_DIRECT,),
                                             allowed=(B.node_id,))),
    "peer_lookup": Frame(kind=Kind.PEER_LOOKUP, source=B, target=P, body=PeerLookup(endpoint=A)),
    "peer_info": Frame(kind=Kind.PEER_INFO, source=P, target=B,
                       body=PeerInfo(endpoint=A, expires_ms=CREATED_MS + A_TTL_S * 1000,
                                     fingerprint=A_FINGERPRINT, addresses=(A_DIRECT, A_OBSERVED))),
    "presence_query": Frame(kind=Kind.PRESENCE_QUERY, source=A, target=P,
                            body=PresenceQuery(orgs=(B.node_id,))),
    "presence": Frame(kind=Kind.PRESENCE, source=P, target=A,
                      body=Presence(entries=(PresenceEntry(B.node_id, PresenceState.OFFLINE, CREATED_MS,
                                                           CREATED_MS),))),
}


# ------------------------------------------------------------- doc parsing


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


_VECTOR_RE: Final = re.compile(r"^vector ([a-z0-9_]+):\s*$")
_HEX_RE: Final = re.compile(r"^(?:[0-9a-f]{2}(?: |$))+$")


def doc_vectors(text: str) -> dict[str, bytes]:
    """``vector NAME:`` lines inside fenced code blocks, each followed by
    lines of hex bytes (separated by spaces) up to a blank line or the fence."""
    vectors: dict[str, bytes] = {}
    name: str | None = None
    hex_lines: list[str] = []
    in_code = False
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
        if name is not None and (not in_code or not _HEX_RE.match(stripped)):
            assert name not in vectors, f"vector {name} appears twice"
            vectors[name] = bytes.fromhex("".join(hex_lines))
            name, hex_lines = None, []
        if name is not None:
            hex_lines.append(stripped)
        elif in_code and (m := _VECTOR_RE.match(stripped)):
            name = m.group(1)
    return vectors


def doc_table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells stripped, header and separator dropped) of the first
    Markdown table after the line ``<!-- marker -->``."""
    lines = text.splitlines()
    start = lines.index(f"<!-- {marker} -->")
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table after {marker}"
    return rows[2:]


# ------------------------------------------------------------------ vectors


def test_golden_frames_cover_every_kind() -> None:
    assert {f.kind for f in GOLDEN.values()} == set(Kind)


def test_doc_holds_exactly_the_golden_vectors() -> None:
    assert sorted(doc_vectors(doc_text())) == sorted(GOLDEN)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_vector(name: str) -> None:
    frame = GOLDEN[name]
    expected = doc_vectors(doc_text())[name]
    assert encode_frame(frame).hex(" ") == expected.hex(" ")
    dec = FrameDecoder()
    dec.receive_data(expected)
    raw = dec.next_frame()
    assert raw is not None and dec.buffered == 0
    assert raw.frame() == frame


def test_relayed_example_is_the_origin_frame_with_source_and_lk1_replaced() -> None:
    vectors = doc_vectors(doc_text())
    dec = FrameDecoder()
    dec.receive_data(vectors["data_semq_example_from_origin"])
    raw = dec.next_frame()
    assert raw is not None
    assert relay_bytes(raw, P, LK1(record_id=P_RECORD)) == vectors["data_semq_example"]


def test_vector_parser_reads_what_it_should() -> None:
    text = "```text\nvector one:\n55 58 01\n02\n\nvector two:\nff\n```\nvector three:\n00\n"
    assert doc_vectors(text) == {"one": b"UX\x01\x02", "two": b"\xff"}


# ------------------------------------------------------------------- tables


def test_every_result_code_is_documented() -> None:
    rows = doc_table_after(doc_text(), "result-codes")
    documented = {(int(r[0]), r[1].strip("`")) for r in rows}
    assert documented == {(int(c), c.name) for c in ResultCode}


def test_every_kind_is_documented() -> None:
    rows = doc_table_after(doc_text(), "kinds")
    documented = {(int(r[0]), r[1].strip("`")) for r in rows}
    assert documented == {(int(k), k.name) for k in Kind}


def _fields(schema: Construct) -> list[tuple[str, Construct]]:
    """(name, subcon) in wire order; nested Structs (DATA's prefix, an ack's
    entry) are flattened, Terminated is dropped."""
    while isinstance(schema, Renamed):
        schema = schema.subcon
    assert isinstance(schema, Struct), schema
    out: list[tuple[str, Construct]] = []
    for sub in schema.subcons:
        inner = sub.subcon if isinstance(sub, Renamed) else sub
        if inner is Terminated or not sub.name:
            continue
        if isinstance(inner, Struct):
            out += _fields(inner)
        else:
            out.append((sub.name, inner))
    return out


def _resolve(path: str) -> Construct:
    """``HEADER`` or ``INQUIRY_BODY.items`` (the element of an Array field)."""
    name, *parts = path.split(".")
    schema: Construct = getattr(_schema, name)
    for part in parts:
        sub = dict(_fields(schema))[part]
        assert isinstance(sub, Array), sub
        schema = sub.subcon
    return schema


_LAYOUTS: Final = [
    "HEADER", "DATA_BODY", "ACK_BODY", "ACK_BATCH_BODY", "ACK_ENTRY", "INQUIRY_BODY",
    "INQUIRY_BODY.items", "INQUIRY_RESP_BODY", "INQUIRY_RESP_BODY.items", "NACK_BODY",
    "CHUNK_BODY", "CHUNK_ACK_BODY",
    "HELLO_BODY", "WELCOME_BODY", "PING_BODY", "ERROR_BODY", "WINDOW_BODY",
    "CERT_REQUEST_BODY", "CERT_RESPONSE_BODY", "BYE_BODY", "CRL_BODY",
    "PEER_ANNOUNCE_BODY", "PEER_LOOKUP_BODY", "PEER_INFO_BODY",
    "PRESENCE_QUERY_BODY", "PRESENCE_BODY", "PRESENCE_BODY.items",
]


def test_every_body_schema_has_a_layout_table() -> None:
    documented = {s for s in _LAYOUTS if "." not in s}
    used = {name for name, schema in vars(_schema).items()
            if name.endswith("_BODY") and schema in _schema.BODY_SCHEMAS.values()}
    assert used <= documented


@pytest.mark.parametrize("path", _LAYOUTS)
def test_layout_table_matches_the_schema(path: str) -> None:
    rows = doc_table_after(doc_text(), f"layout: {path}")
    fields = _fields(_resolve(path))
    assert [r[2].strip("`") for r in rows] == [name for name, _ in fields]
    offset: int | None = 0
    for row, (name, sub) in zip(rows, fields, strict=True):
        try:
            size: int | None = sub.sizeof()
        except Exception:  # variable width: the doc writes e.g. "1 + n"
            size = None
        if size is not None:
            assert row[1] == str(size), f"{path}.{name}: size {row[1]} != {size}"
        if offset is not None:
            assert row[0] == str(offset), f"{path}.{name}: offset {row[0]} != {offset}"
            offset = offset + size if size is not None else None
        else:
            assert not row[0].isdigit(), f"{path}.{name}: a fixed offset after a variable field"
