"""UMX-T codec speed: our codecs vs compiled construct vs hand-written struct.

Frames: a 1 KiB DATA frame with every field set (the SEMQ example: org 10008
sends order S0001 to org 56001, relayed by the platform with LK1), an ACK2, and
an ACK_BATCH of 1000 ACK2 entries. For each, frames/s through

- ``semq``: ``encode_frame``; decode = ``FrameDecoder.receive_data`` +
  ``next_frame()`` + ``RawFrame.frame()`` (a validated Frame); route =
  ``next_frame()`` only (header, ids and CRC: what the relay does);
- ``construct``: the compiled header and body schemas of _schema.py, built and
  parsed directly (containers, no validation), CRC with zlib;
- ``struct``: a hand-written ``struct`` encoder/decoder of the same layouts
  (plain tuples, no validation): the pure-Python limit.

Each figure is the median of R runs of about S seconds. ``x struct`` is how
many times the struct version's rate this one's time is (1.0 = as fast,
2.5 = takes 2.5 times as long). The issue's aim: semq decode within 2.5x.

Usage: scripts/bench protocol [--seconds S] [--runs R] [--batch N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import struct
import sys
import time
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

if __package__:
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/protocol.py
    from _table import print_table  # type: ignore[no-redef]

from semq.umxt_protocol import (
    LK0,
    LK1,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    SaveFwd,
    encode_frame,
)
from semq.umxt_protocol._schema import (
    ACK_BATCH_BODY,
    ACK_BODY,
    DATA_BODY,
    HEADER,
    MAGIC,
    VERSION,
)

AIM = 2.5  # the aim: decode within 2.5x of the struct version

ORG_A = Endpoint.org("10008")
ORG_B = Endpoint.org("56001")
PLATFORM = Endpoint.platform()
CREATED_MS = 1_795_000_000_000


def sample_frames(batch: int) -> dict[str, Frame]:
    data = Frame(
        kind=Kind.DATA, source=PLATFORM, target=ORG_B, origin=ORG_A,
        save_fwd=SaveFwd.MUST_DELIVER, ack2=True, priority=5,
        body=Data(
            lk0=LK0(endpoint=ORG_A, record_id=1001),
            lk1=LK1(record_id=77),
            app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001"),
            created_ms=CREATED_MS, expires_ms=CREATED_MS + 7 * 86_400_000,
            encrypt=True, session_key=bytes(range(48)) * 2,
            app_data=bytes(i % 251 for i in range(1024)),
        ),
    )
    ack2 = Frame(
        kind=Kind.ACK2, source=ORG_B, target=ORG_A,
        body=Ack(src_ref_id=501, dest_ref_id=1001, ack_flag=AckFlag.DELIVERY,
                 app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key="S0001")),
    )
    entries = tuple(AckEntry.of(1000 + i, AckFlag.DELIVERY, src_ref_id=500 + i)
                    for i in range(batch))
    ack_batch = Frame(kind=Kind.ACK_BATCH, source=ORG_B, target=ORG_A,
                      body=AckBatch(ack_kind=Kind.ACK2, entries=entries))
    return {"DATA 1 KiB": data, "ACK2": ack2, f"ACK_BATCH x{batch}": ack_batch}


# ------------------------------------------------------------ plain messages
# The struct and construct variants work on plain tuples, not validated values:
# these NamedTuples hold exactly what goes on the wire.

class Head(NamedTuple):
    kind: int
    flags: int
    save_fwd: int
    priority: int
    source_type: int
    target_type: int
    origin_type: int
    source: str
    target: str
    origin: str


class PlainData(NamedTuple):
    head: Head
    semq_id: int
    semq_db_id: int
    record_id: int
    lk1_semq_id: int
    lk1_semq_db_id: int
    lk1_record_id: int
    created_ms: int
    expires_ms: int
    domain: str
    data_type: str
    subtype: str
    key: str
    session_key: bytes
    app_data: bytes


class PlainAck(NamedTuple):
    head: Head
    entry: tuple[int, ...]
    domain: str
    data_type: str
    subtype: str
    key: str
    receipt: bytes


class PlainBatch(NamedTuple):
    head: Head
    ack_kind: int
    entries: list[tuple[int, ...]]
    receipt: bytes


def plain_head(f: Frame) -> Head:
    return Head(int(f.kind), f.flags, int(f.save_fwd), f.priority, int(f.source.node_type),
                int(f.target.node_type), int(f.origin.node_type), f.source.node_id,
                f.target.node_id, f.origin.node_id)


def plain(f: Frame) -> PlainData | PlainAck | PlainBatch:
    b = f.body
    if isinstance(b, Data):
        lk1 = b.lk1 or LK1(record_id=1)
        z = b.lk1 is None
        return PlainData(plain_head(f), b.lk0.semq_id, b.lk0.semq_db_id, b.lk0.record_id,
                         0 if z else lk1.semq_id, 0 if z else lk1.semq_db_id,
                         0 if z else lk1.record_id, b.created_ms, b.expires_ms or 0,
                         b.app_key.domain, b.app_key.data_type, b.app_key.subtype, b.app_key.key,
                         b.session_key, b.app_data)
    if isinstance(b, Ack):
        return PlainAck(plain_head(f), tuple(b.entry), b.app_key.domain, b.app_key.data_type,
                        b.app_key.subtype, b.app_key.key, b.receipt)
    assert isinstance(b, AckBatch)
    return PlainBatch(plain_head(f), int(b.ack_kind), [tuple(e) for e in b.entries], b.receipt)


# ---------------------------------------------------- hand-written struct
# The same layouts as _schema.py, written out by hand: the pure-Python limit.

S_HEAD = struct.Struct(">2s12BI")
S_PREFIX = struct.Struct(">HHQHHQQQ")
S_ENTRY = struct.Struct(">HHQHHQBB")
S_U8, S_U16, S_U32 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I")
S_CRC = S_U32


def _s_head(h: Head, body_len: int) -> bytes:
    s, t, o = h.source.encode("ascii"), h.target.encode("ascii"), h.origin.encode("ascii")
    return b"".join((
        S_HEAD.pack(MAGIC, VERSION, h.kind, h.flags, h.save_fwd, h.priority, h.source_type,
                    h.target_type, h.origin_type, len(s), len(t), len(o), 0, body_len), s, t, o))


def _s_strs(*parts: str) -> bytes:
    out = []
    for p in parts:
        b = p.encode("utf-8")
        out.append(S_U8.pack(len(b)))
        out.append(b)
    return b"".join(out)


def struct_encode(m: PlainData | PlainAck | PlainBatch) -> bytes:
    if isinstance(m, PlainData):
        body = b"".join((
            S_PREFIX.pack(m.semq_id, m.semq_db_id, m.record_id, m.lk1_semq_id, m.lk1_semq_db_id,
                          m.lk1_record_id, m.created_ms, m.expires_ms),
            _s_strs(m.domain, m.data_type, m.subtype, m.key),
            S_U16.pack(len(m.session_key)), m.session_key, S_U32.pack(len(m.app_data)), m.app_data,
        ))
    elif isinstance(m, PlainAck):
        body = b"".join((S_ENTRY.pack(*m.entry), _s_strs(m.domain, m.data_type, m.subtype, m.key),
                         S_U16.pack(len(m.receipt)), m.receipt))
    else:
        pack = S_ENTRY.pack
        body = b"".join((S_U8.pack(m.ack_kind), S_U32.pack(len(m.entries)),
                         b"".join([pack(*e) for e in m.entries]), S_U16.pack(len(m.receipt)),
                         m.receipt))
    head = _s_head(m.head, len(body))
    crc = zlib.crc32(body, zlib.crc32(head))  # no copy of the body just for the CRC
    return b"".join((head, body, S_CRC.pack(crc)))


def _s_read_app_key(buf: bytes, pos: int) -> tuple[str, str, str, str, int]:
    """The four u8-prefixed AppKey parts and the position after them."""
    out = []
    for _ in range(4):
        ln = buf[pos]
        out.append(buf[pos + 1:pos + 1 + ln].decode("utf-8"))
        pos += 1 + ln
    return out[0], out[1], out[2], out[3], pos


def struct_decode(raw: bytes) -> PlainData | PlainAck | PlainBatch:
    """Framing checks (magic, version, length, CRC) and every field; no value
    validation beyond what the layout itself enforces."""
    (magic, version, kind, flags, sf, prio, st, tt, ot, sl, tl, ol, _r, body_len) = \
        S_HEAD.unpack_from(raw)
    if magic != MAGIC or version != VERSION:
        raise ValueError("bad magic or version")
    i = S_HEAD.size
    total = i + sl + tl + ol + body_len + 4
    if len(raw) != total or zlib.crc32(memoryview(raw)[:-4]) != S_CRC.unpack_from(raw, total - 4)[0]:
        raise ValueError("bad length or CRC")
    ids = raw[i:i + sl + tl + ol].decode("ascii")
    head = Head(kind, flags, sf, prio, st, tt, ot, ids[:sl], ids[sl:sl + tl], ids[sl + tl:])
    b = i + sl + tl + ol
    if kind == 1:
        semq, db, rec, l1s, l1d, l1r, created, expires = S_PREFIX.unpack_from(raw, b)
        domain, data_type, subtype, key, pos = _s_read_app_key(raw, b + S_PREFIX.size)
        (sk_len,) = S_U16.unpack_from(raw, pos)
        sk = raw[pos + 2:pos + 2 + sk_len]
        pos += 2 + sk_len
        (ad_len,) = S_U32.unpack_from(raw, pos)
        return PlainData(head, semq, db, rec, l1s, l1d, l1r, created, expires, domain, data_type,
                         subtype, key, sk, raw[pos + 4:pos + 4 + ad_len])
    if kind == 10:
        (count,) = S_U32.unpack_from(raw, b + 1)
        end = b + 5 + count * S_ENTRY.size
        entries = list(S_ENTRY.iter_unpack(raw[b + 5:end]))
        (r_len,) = S_U16.unpack_from(raw, end)
        return PlainBatch(head, raw[b], entries, raw[end + 2:end + 2 + r_len])
    entry = S_ENTRY.unpack_from(raw, b)
    domain, data_type, subtype, key, pos = _s_read_app_key(raw, b + S_ENTRY.size)
    (r_len,) = S_U16.unpack_from(raw, pos)
    return PlainAck(head, entry, domain, data_type, subtype, key, raw[pos + 2:pos + 2 + r_len])


# ------------------------------------------------- compiled construct schemas

C_HEAD = HEADER.compile()
C_BODY = {1: DATA_BODY.compile(), 4: ACK_BODY.compile(), 10: ACK_BATCH_BODY.compile()}
_ENTRY_NAMES = AckEntry._fields


def construct_encode(m: PlainData | PlainAck | PlainBatch) -> bytes:
    h = m.head
    if isinstance(m, PlainData):
        body = C_BODY[1].build({
            "prefix": {"semq_id": m.semq_id, "semq_db_id": m.semq_db_id, "record_id": m.record_id,
                       "lk1_semq_id": m.lk1_semq_id, "lk1_semq_db_id": m.lk1_semq_db_id,
                       "lk1_record_id": m.lk1_record_id, "created_ms": m.created_ms,
                       "expires_ms": m.expires_ms},
            "domain": m.domain, "data_type": m.data_type, "subtype": m.subtype, "key": m.key,
            "session_key": m.session_key, "app_data": m.app_data})
    elif isinstance(m, PlainAck):
        body = C_BODY[4].build({
            "entry": dict(zip(_ENTRY_NAMES, m.entry, strict=True)), "domain": m.domain,
            "data_type": m.data_type, "subtype": m.subtype, "key": m.key, "receipt": m.receipt})
    else:
        body = C_BODY[10].build({
            "ack_kind": m.ack_kind, "count": len(m.entries),
            "entries": [dict(zip(_ENTRY_NAMES, e, strict=True)) for e in m.entries],
            "receipt": m.receipt})
    s, t, o = h.source.encode("ascii"), h.target.encode("ascii"), h.origin.encode("ascii")
    head = C_HEAD.build({
        "magic": MAGIC, "version": VERSION, "kind": h.kind, "flags": h.flags,
        "save_fwd": h.save_fwd, "priority": h.priority, "source_type": h.source_type,
        "target_type": h.target_type, "origin_type": h.origin_type, "source_len": len(s),
        "target_len": len(t), "origin_len": len(o), "reserved": 0, "body_len": len(body)})
    out = b"".join((head, s, t, o, body))
    return out + S_CRC.pack(zlib.crc32(out))


def construct_decode(raw: bytes) -> Any:
    h = C_HEAD.parse(raw[:S_HEAD.size])
    i = S_HEAD.size
    ids = i + h.source_len + h.target_len + h.origin_len
    if len(raw) != ids + h.body_len + 4 or zlib.crc32(memoryview(raw)[:-4]) != \
            S_CRC.unpack_from(raw, len(raw) - 4)[0]:
        raise ValueError("bad length or CRC")
    raw[i:ids].decode("ascii")
    return h, C_BODY[h.kind].parse(raw[ids:-4])


# ------------------------------------------------------------------ timing


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn``, timed in growing loops for ``seconds``."""
    gc.collect()
    n, done, spent = 1, 0, 0.0
    clock = time.perf_counter
    while spent < seconds:
        t0 = clock()
        for _ in range(n):
            fn()
        spent += clock() - t0
        done += n
        if spent < seconds / 10:
            n *= 2
    return done / spent


def semq_decoder(raw: bytes, full: bool) -> Callable[[], object]:
    dec = FrameDecoder()
    receive, nxt = dec.receive_data, dec.next_frame
    if full:
        def run() -> object:
            receive(raw)
            return nxt().frame()  # type: ignore[union-attr]
    else:
        def run() -> object:
            receive(raw)
            return nxt()
    return run


def check(frames: dict[str, Frame]) -> None:
    """Every variant agrees with the others before anything is timed."""
    for name, f in frames.items():
        raw = encode_frame(f)
        p = plain(f)
        assert struct_encode(p) == raw, f"struct encoder differs on {name}"
        assert construct_encode(p) == raw, f"construct encoder differs on {name}"
        assert struct_decode(raw) == p, f"struct decoder differs on {name}"
        h, _body = construct_decode(raw)
        assert h.kind == int(f.kind)
        dec = FrameDecoder()
        dec.receive_data(raw)
        got = dec.next_frame()
        assert got is not None and got.frame() == f, f"semq round trip differs on {name}"


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench protocol",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=0.25,
                   help="time per figure per run (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; median (default 3)")
    p.add_argument("--batch", type=int, default=1000,
                   help="entries in the ACK_BATCH frame (default %(default)s)")
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.runs < 1 or not 1 <= a.batch <= 100_000:
        print("error: --seconds must be > 0, --runs >= 1, --batch 1..100000", file=sys.stderr)
        return 2

    frames = sample_frames(a.batch)
    check(frames)
    rows: list[list[object]] = []
    verdicts: list[str] = []
    for name, f in frames.items():
        raw = encode_frame(f)
        pl = plain(f)
        acks = a.batch if f.kind is Kind.ACK_BATCH else (1 if f.kind is Kind.ACK2 else 0)
        cases: list[tuple[str, str, Callable[[], object]]] = [
            ("struct", "encode", partial(struct_encode, pl)),
            ("struct", "decode", partial(struct_decode, raw)),
            ("semq", "encode", partial(encode_frame, f)),
            ("semq", "decode", semq_decoder(raw, full=True)),
            ("semq", "route", semq_decoder(raw, full=False)),
            ("construct", "encode", partial(construct_encode, pl)),
            ("construct", "decode", partial(construct_decode, raw)),
        ]
        # Interleave the runs (round robin) so a noisy neighbour spreads over
        # every variant instead of hitting one.
        samples: dict[tuple[str, str], list[float]] = {(c, o): [] for c, o, _ in cases}
        for _ in range(a.runs):
            for codec, op, fn in cases:
                samples[(codec, op)].append(rate(fn, a.seconds))
        med = {k: statistics.median(v) for k, v in samples.items()}
        for codec, op, _ in cases:
            r = med[(codec, op)]
            base = med[("struct", "decode" if op in ("decode", "route") else "encode")]
            rows.append([name, f"{len(raw):,}", codec, op, fmt(r),
                         fmt(r * acks) if acks else "-", f"{base / r:.2f}x"])
        ratio = med[("struct", "decode")] / med[("semq", "decode")]
        verdicts.append(f"{name}: semq decode takes {ratio:.2f}x the struct time "
                        f"({'within' if ratio <= AIM else 'OVER'} the {AIM}x aim)")
    print_table(
        f"UMX-T codecs: median of {a.runs} runs of ~{a.seconds:g} s each",
        ["frame", "bytes", "codec", "op", "frames/s", "acks/s", "x struct"],
        rows,
        notes=[
            "x struct: this variant's time per frame / the struct version's "
            "(route compares with struct decode).",
            "semq decode returns a validated Frame; route = header, ids and CRC only.",
            *verdicts,
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
