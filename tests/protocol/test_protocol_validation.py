"""Wire values validate on construction: LocalProtocolError with
ResultCode.INVALID_FIELD, naming the offending value and the limit (STYLE 3).
Plus the layering rule: the core imports no I/O library."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings

from semq.umxt_protocol import (
    LK0,
    LK1,
    MAX_ACK_BATCH,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Bye,
    CertResponse,
    Chunk,
    ChunkAck,
    Data,
    Endpoint,
    Error,
    ForwardFlag,
    Frame,
    Hello,
    Inquiry,
    InquiryResp,
    InquiryTopic,
    Kind,
    LocalProtocolError,
    PeerAnnounce,
    PeerInfo,
    Ping,
    ProtocolError,
    RemoteProtocolError,
    ResultCode,
    SaveFwd,
    WindowUpdate,
    encode_frame,
)
from semq.umxt_protocol._limits import MAX_PEER_ADDRESSES, MAX_PEER_ALLOWED, MAX_PEER_TTL
from tests.protocol import test_protocol_strategies as _strategies

A = Endpoint.org("10008")
B = Endpoint.org("56001")
P = Endpoint.platform()


def data(**kw: Any) -> Data:
    return Data(lk0=LK0(endpoint=A, record_id=1), **kw)


def data_frame(**kw: Any) -> Frame:
    return Frame(kind=Kind.DATA, source=A, target=B, body=data(), **kw)


def ack(kind: Kind = Kind.ACK2, **kw: Any) -> Frame:
    return Frame(kind=kind, source=B, target=A, body=Ack(dest_ref_id=1, ack_flag=AckFlag.DELIVERY), **kw)


# (what to build, words the message must contain: the value and the limit)
CASES: list[tuple[str, Callable[[], object], list[str]]] = [
    ("SaveFwd 4", lambda: data_frame(save_fwd=4), ["SaveFwd 4", "0..3"]),
    ("SaveFwd 0 on DATA", lambda: data_frame(save_fwd=0), ["SaveFwd 0", "1..3"]),
    ("empty node id", lambda: Endpoint.org(""), ["''", "1..64"]),
    ("65-char node id", lambda: Endpoint.org("x" * 65), ["65", "64"]),
    ("bad node id char", lambda: Endpoint.org("a/b"), ["'a/b'", "[A-Za-z0-9._:@-]"]),
    ("node type 7", lambda: Endpoint(node_type=7, node_id="x"), ["7", "1..3"]),  # type: ignore[arg-type]
    ("70000-byte AppKey key", lambda: AppKey(key="k" * 70_000), ["70000", "255"]),
    ("256-byte AppKey domain (multi-byte)", lambda: AppKey(domain="é" * 128), ["256", "255"]),
    ("surrogate in AppKey", lambda: AppKey(subtype="\ud800"), ["subtype", "UTF-8"]),
    ("priority 10", lambda: data_frame(priority=10), ["priority 10", "0..9"]),
    ("priority -1", lambda: data_frame(priority=-1), ["priority -1", "0..9"]),
    ("semq_id 0", lambda: LK0(endpoint=A, record_id=1, semq_id=0), ["semq_id 0", "1..65535"]),
    ("semq_db_id 65536", lambda: LK1(record_id=1, semq_db_id=65_536), ["65536", "1..65535"]),
    ("record_id 0", lambda: LK0(endpoint=A, record_id=0), ["record_id 0", "2**64-1"]),
    ("record_id 2**64", lambda: LK1(record_id=2**64), [str(2**64), "2**64-1"]),
    ("Reliable=0 with SaveFwd=3", lambda: data_frame(reliable=False),
     ["Reliable=0", "SaveFwd=1", "SaveFwd=3"]),
    ("Reliable=0 with Ack2", lambda: data_frame(reliable=False, save_fwd=1, ack2=True),
     ["Reliable=0", "Ack2=1"]),
    ("Encrypt without key", lambda: data(encrypt=True), ["Encrypt=1", "empty"]),
    ("key without Encrypt", lambda: data(session_key=b"k" * 32), ["Encrypt=0", "32-byte"]),
    ("4097-byte session key", lambda: data(encrypt=True, session_key=bytes(4097)), ["4097", "4096"]),
    ("created_ms -1", lambda: data(created_ms=-1), ["created_ms -1"]),
    ("expires_ms 0", lambda: data(expires_ms=0), ["expires_ms 0", "1.."]),
    ("ACK2 with ack_flag 1", lambda: Frame(kind=Kind.ACK2, source=B, target=A,
                                           body=Ack(dest_ref_id=1, ack_flag=AckFlag.PLATFORM)),
     ["ACK2", "ack_flag 2"]),
    ("ack_flag 3", lambda: Ack(dest_ref_id=1, ack_flag=3), ["ack_flag 3", "1..2"]),  # type: ignore[arg-type]
    ("dest_ref_id 2**64", lambda: Ack(dest_ref_id=2**64, ack_flag=AckFlag.PLATFORM),
     [str(2**64), str(2**64 - 1)]),
    ("5000-byte receipt", lambda: Ack(dest_ref_id=1, ack_flag=AckFlag.DELIVERY, receipt=bytes(5000)),
     ["5000", "4096"]),
    ("ACK2 with SaveFwd 2", lambda: ack(save_fwd=SaveFwd.STORE), ["SaveFwd=2", "SaveFwd=3"]),
    ("ACK2 asking Ack2", lambda: ack(ack2=True), ["Ack2=1", "Ack2=0"]),
    ("ACK2 best effort", lambda: ack(reliable=False), ["Reliable=0", "Reliable=1"]),
    ("PING with SaveFwd", lambda: Frame(kind=Kind.PING, source=A, target=P, body=Ping(),
                                        save_fwd=SaveFwd.MUST_DELIVER), ["PING", "SaveFwd=0"]),
    ("body of the wrong kind", lambda: Frame(kind=Kind.PING, source=A, target=P, body=data()),
     ["PING", "Ping"]),
    ("DATA origin is not LK0's", lambda: Frame(kind=Kind.DATA, source=A, target=B, origin=B,
                                               body=data()), ["56001", "10008"]),
    ("kind 99", lambda: Frame(kind=99, source=A, target=B, body=data()), ["kind 99"]),  # type: ignore[arg-type]
    ("batch too big", lambda: AckBatch(
        ack_kind=Kind.ACK, entries=(AckEntry.of(1, AckFlag.PLATFORM),) * (MAX_ACK_BATCH + 1)),
     [str(MAX_ACK_BATCH + 1), str(MAX_ACK_BATCH)]),
    ("batch entry of the wrong flag", lambda: AckBatch(
        ack_kind=Kind.ACK_FWD, entries=(AckEntry.of(1, AckFlag.PLATFORM),)),
     ["ACK_FWD", "flag 0", "flag 1"]),
    ("batch entry out of range", lambda: AckBatch(
        ack_kind=Kind.ACK, entries=(AckEntry.of(2**64, AckFlag.PLATFORM),)),
     ["dest_ref_id", str(2**64), str(2**64 - 1)]),
    ("batch entry semq id out of range", lambda: AckBatch(
        ack_kind=Kind.ACK, entries=(AckEntry.of(1, AckFlag.PLATFORM, src_semq_id=70_000),)),
     ["src_semq_id", "70000", "65535"]),
    ("batch entry not an int", lambda: AckBatch(
        ack_kind=Kind.ACK, entries=(AckEntry.of("7", AckFlag.PLATFORM),)),  # type: ignore[arg-type]
     ["dest_ref_id", "'7'"]),
    ("batch entry flag out of a byte", lambda: AckBatch(
        ack_kind=Kind.ACK, entries=(AckEntry(1, 1, 0, 1, 1, 1, 257, 0),)), ["ACK", "ack_flag 257"]),
    ("batch of a non-ack kind", lambda: AckBatch(ack_kind=Kind.DATA, entries=()), ["DATA"]),
    ("empty inquiry", lambda: Inquiry(topic=InquiryTopic.RECEIVED, items=()), ["0", "1..10000"]),
    ("empty inquiry answer", lambda: InquiryResp(topic=InquiryTopic.STATE, answers=()),
     ["0", "1..10000"]),
    ("inquiry topic 9", lambda: Inquiry(topic=9, items=(LK0(endpoint=A, record_id=1),)),  # type: ignore[arg-type]
     ["topic 9", "1..2"]),
    ("9 certificates", lambda: CertResponse(endpoint=A, certificates=(b"c",) * 9), ["9", "8"]),
    ("error code 7", lambda: Error(code=7), ["code 7"]),  # type: ignore[arg-type]
    ("1025-char reason", lambda: Bye(reason="r" * 1025), ["1025", "1024"]),
    ("window 0", lambda: Hello(window=0), ["window 0", "1..4294967295"]),
    ("unit over units", lambda: Hello(semq_id=3, units=2), ["semq_id 3", "2 unit(s)"]),
    ("units 0", lambda: Hello(units=0), ["units 0", "1..65535"]),
    ("software 300 bytes", lambda: Hello(software="s" * 300), ["300", "255"]),
    ("credit 2**32", lambda: WindowUpdate(credit=2**32), [str(2**32), "4294967295"]),
    ("nonce -1", lambda: Ping(nonce=-1), ["nonce -1"]),
    ("9 addresses", lambda: PeerAnnounce(ttl_s=60, addresses=("h:1",) * 9), ["9 addresses", "8"]),
    ("9 addresses in an answer", lambda: PeerInfo(endpoint=A, addresses=("h:1",) * 9), ["9 addresses", "8"]),
    ("256-byte address", lambda: PeerAnnounce(ttl_s=60, addresses=("h" * 251 + ":7443",)),
     ["'" + "h" * 251 + ":7443'", "1..255"]),
    ("256-byte address (multi-byte)", lambda: PeerAnnounce(ttl_s=60, addresses=("é" * 126 + ":443",)),
     ["é" * 126 + ":443", "1..255"]),
    ("empty address", lambda: PeerAnnounce(ttl_s=60, addresses=("",)), ["''", "1..255"]),
    ("unprintable address", lambda: PeerAnnounce(ttl_s=60, addresses=("h:1\n",)), ["'h:1\\n'", "printable"]),
    ("ttl over MAX_PEER_TTL", lambda: PeerAnnounce(ttl_s=MAX_PEER_TTL + 1),
     [f"ttl_s {MAX_PEER_TTL + 1}", f"0..{MAX_PEER_TTL}"]),
    ("ttl -1", lambda: PeerAnnounce(ttl_s=-1), ["ttl_s -1", f"0..{MAX_PEER_TTL}"]),
    ("invalid org id in allowed", lambda: PeerAnnounce(ttl_s=60, allowed=("56001", "a/b")),
     ["'a/b'", "[A-Za-z0-9._:@-]"]),
    ("65-char org id in allowed", lambda: PeerAnnounce(ttl_s=60, allowed=("x" * 65,)), ["65", "64"]),
    ("allow-list too long", lambda: PeerAnnounce(ttl_s=60, allowed=("56001",) * (MAX_PEER_ALLOWED + 1)),
     [str(MAX_PEER_ALLOWED + 1), str(MAX_PEER_ALLOWED)]),
    ("256-char fingerprint", lambda: PeerInfo(endpoint=A, fingerprint="f" * 256), ["'fff", "255"]),
    ("chunk index -1", lambda: Chunk(lk0=LK0(endpoint=A, record_id=1), index=-1), ["chunk index -1", "0..4294967295"]),
    ("chunk index 2**32", lambda: Chunk(lk0=LK0(endpoint=A, record_id=1), index=2**32),
     [f"chunk index {2**32}", "0..4294967295"]),
    ("chunk flags 0x02", lambda: Chunk(lk0=LK0(endpoint=A, record_id=1), index=0, flags=2),
     ["chunk flags 0x02", "CHUNK_COMPRESSED (0x01)"]),
    ("chunk flags 256", lambda: Chunk(lk0=LK0(endpoint=A, record_id=1), index=0, flags=256),
     ["chunk flags 256", "0..255"]),
    ("chunk payload text", lambda: Chunk(lk0=LK0(endpoint=A, record_id=1), index=0, payload="x"),  # type: ignore[arg-type]
     ["chunk payload", "bytes", "str"]),
    ("chunk without an LK0", lambda: Chunk(lk0="10008/1/1/1", index=0), ["CHUNK lk0", "LK0"]),  # type: ignore[arg-type]
    ("CHUNK of another origin's document", lambda: Frame(
        kind=Kind.CHUNK, source=B, target=A, body=Chunk(lk0=LK0(endpoint=A, record_id=1), index=0)),
     ["CHUNK LK0 names organization:10008", "origin is organization:56001"]),
    ("CHUNK with SaveFwd 2", lambda: Frame(
        kind=Kind.CHUNK, source=A, target=B, save_fwd=SaveFwd.STORE,
        body=Chunk(lk0=LK0(endpoint=A, record_id=1), index=0)), ["CHUNK", "SaveFwd=3", "SaveFwd=2"]),
    ("CHUNK_ACK through 2**32", lambda: ChunkAck(lk0=LK0(endpoint=A, record_id=1), through=2**32),
     [f"through {2**32}", "0..4294967295"]),
    ("CHUNK_ACK code 7", lambda: ChunkAck(lk0=LK0(endpoint=A, record_id=1), through=0, code=7),  # type: ignore[arg-type]
     ["code 7"]),
    ("CHUNK_ACK message of 1025", lambda: ChunkAck(lk0=LK0(endpoint=A, record_id=1), through=0,
                                                  message="m" * 1025), ["1025", "1024"]),
    ("CHUNK_ACK asking Ack2", lambda: Frame(
        kind=Kind.CHUNK_ACK, source=B, target=A, ack2=True,
        body=ChunkAck(lk0=LK0(endpoint=A, record_id=1), through=0)), ["CHUNK_ACK", "Ack2=1", "Ack2=0"]),
]


@pytest.mark.parametrize(("build", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_values_are_refused_with_value_and_limit(
    build: Callable[[], object], words: list[str]
) -> None:
    with pytest.raises(LocalProtocolError) as info:
        build()
    err = info.value
    assert err.code is ResultCode.INVALID_FIELD
    for w in words:
        assert w in str(err), f"{w!r} missing from {str(err)!r}"


def test_the_limits_themselves_are_accepted() -> None:
    # The boundary values of the cases above must be fine, so the refusals are
    # about the limit and not about the field.
    e = Endpoint.org("x" * 64)
    AppKey(domain="d" * 255, data_type="é" * 127, subtype="", key="k" * 255)
    lk0 = LK0(endpoint=e, record_id=2**64 - 1, semq_id=65_535, semq_db_id=65_535)
    d = Data(lk0=lk0, encrypt=True, session_key=bytes(4096), expires_ms=1)
    f = Frame(kind=Kind.DATA, source=e, target=B, body=d, priority=9, reliable=False,
              save_fwd=SaveFwd.DISCARD)
    assert encode_frame(f)
    AckBatch(ack_kind=Kind.ACK, entries=(AckEntry.of(2**64 - 1, AckFlag.PLATFORM),) * 10)
    Ack(dest_ref_id=0, ack_flag=AckFlag.DELIVERY, receipt=bytes(4096))
    Bye(reason="r" * 1024)
    WindowUpdate(credit=2**32 - 1)
    CertResponse(endpoint=A, certificates=(b"c",) * 8)
    Hello(software="s" * 255)
    announce = PeerAnnounce(ttl_s=MAX_PEER_TTL, addresses=("h" * 249 + ":65535", "é" * 125 + ":4433")
                            + ("h:1",) * (MAX_PEER_ADDRESSES - 2), allowed=("x" * 64,) * MAX_PEER_ALLOWED)
    assert encode_frame(Frame(kind=Kind.PEER_ANNOUNCE, source=A, target=P, body=announce))
    PeerAnnounce(ttl_s=0)
    PeerInfo(endpoint=A, fingerprint="f" * 255, addresses=("h:1",) * MAX_PEER_ADDRESSES)
    chunk = Chunk(lk0=LK0(endpoint=A, record_id=1), index=2**32 - 1, flags=1, payload=bytearray(3))
    assert encode_frame(Frame(kind=Kind.CHUNK, source=A, target=B, body=chunk))
    ChunkAck(lk0=LK0(endpoint=A, record_id=1), through=2**32 - 1, code=ResultCode.TOO_LARGE, message="m" * 1024)


def test_enum_like_fields_are_normalized() -> None:
    f = Frame(kind=2, source=B, target=P, body=Ack(dest_ref_id=9, ack_flag=1))  # type: ignore[arg-type]
    assert f.kind is Kind.ACK
    assert f.save_fwd is SaveFwd.MUST_DELIVER  # acks travel with SaveFwd=3 (SPEC)
    assert isinstance(f.body, Ack) and f.body.ack_flag is AckFlag.PLATFORM
    assert f.body.flag is ForwardFlag.NONE
    assert Frame(kind=Kind.PING, source=A, target=P, body=Ping()).save_fwd is SaveFwd.NONE


def test_values_are_frozen() -> None:
    e = Endpoint.org("a")
    with pytest.raises(AttributeError):
        e.node_id = "b"  # type: ignore[misc]


def test_error_hierarchy_carries_result_codes() -> None:
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert ProtocolError("x").code is ResultCode.MALFORMED_FRAME
    assert RemoteProtocolError("x", ResultCode.BAD_CHECKSUM).code is ResultCode.BAD_CHECKSUM


# ---------------------------------------------------------------- layering

# Libraries the sans-IO core must never pull in (STYLE 1): the async runtime,
# the ORM and database driver, networking, and the heavy analytics extra.
_FORBIDDEN_IN_CORE = ["trio", "peewee", "sqlite3", "pyspark", "socket", "ssl", "asyncio",
                      "selectors"]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60)
    return set(out.stdout.split())


def test_protocol_core_imports_no_io() -> None:
    mods = _modules_after("import semq.umxt_protocol")
    assert "semq.umxt_protocol" in mods  # the probe itself worked
    leaked = [m for m in _FORBIDDEN_IN_CORE if m in mods]
    assert not leaked, f"semq.umxt_protocol imports {leaked}"


def test_importing_semq_does_not_import_pyspark() -> None:
    mods = _modules_after("import semq")
    assert "semq" in mods
    assert not {m for m in mods if m == "pyspark" or m.startswith("pyspark.")}


@settings(max_examples=300, deadline=None)
@given(a=_strategies.endpoints, b=_strategies.endpoints)
def test_endpoint_equality_is_by_type_and_id(a: Endpoint, b: Endpoint) -> None:
    """Endpoint's own __eq__ (identity and hash first) answers as the
    dataclass's did: equal type and id, nothing else."""
    same = (a.node_type, a.node_id) == (b.node_type, b.node_id)
    twin = Endpoint(node_type=a.node_type, node_id=a.node_id)
    assert (a == b) is same and (a != b) is (not same) and (b == a) is same
    assert a == twin and twin == a and not (a != twin) and a == a
    assert a != (a.node_type, a.node_id) and a != a.node_id and not (a == None)  # noqa: E711


def test_the_decoder_names_one_endpoint_with_one_object() -> None:
    """Frames with different endpoint triples name the same organization
    with the same object (the relay compares them with its connection's
    endpoint: ``is`` first)."""
    from semq.umxt_protocol import FrameDecoder

    dec = FrameDecoder()
    dec.receive_data(encode_frame(Frame(kind=Kind.PING, source=A, target=P, body=Ping()))
                     + encode_frame(data_frame()) + encode_frame(ack()))
    ping, doc, ack2 = list(dec)
    assert ping.source is doc.source is doc.origin and doc.target is ack2.source and ack2.target is doc.source


def test_endpoint_hash_is_cached_yet_safe_across_processes() -> None:
    """Endpoints keep their hash (they key every per-batch dict); equal
    endpoints hash equal however they were made, and a pickled one is rebuilt
    in a process with another string-hash seed instead of carrying a hash
    that is wrong there."""
    import pickle

    a, b = Endpoint.org("10008"), Endpoint(node_type=1, node_id="10008")  # type: ignore[arg-type]
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert hash(Endpoint.org("10008")) != hash(Endpoint.platform("10008"))  # type is part of it
    blob = pickle.dumps([a, Endpoint.platform()])
    code = ("import pickle, sys; from semq.umxt_protocol import Endpoint;"
            "eps = pickle.loads(sys.stdin.buffer.read());"
            "d = {Endpoint.org('10008'): 'org', Endpoint.platform(): 'platform'};"
            "print(d[eps[0]], d[eps[1]])")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == ["org", "platform"]
