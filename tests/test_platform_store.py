"""The platform's store path (SPEC P.2): DATA for an offline target is
stored in one look-up and one insert per batch, not one SELECT and one
INSERT per document, and still gives each copy one LK1 — the same one to a
resend whose ACK_SAVE was lost and to a copy repeated in the batch."""

from __future__ import annotations

from pathlib import Path

from semq.platform.core import PlatformCore
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Inquiry,
    InquiryTopic,
    Kind,
    RawFrame,
    encode_frame,
)

A, B, C = "10008", "56001", "56002"


def _raw(*frames: Frame) -> list[RawFrame]:
    d = FrameDecoder()
    d.receive_data(b"".join(encode_frame(f) for f in frames))
    return list(d)


def _data(src: Endpoint, dst: Endpoint, record_id: int) -> Frame:
    return Frame(kind=Kind.DATA, source=src, target=dst,
                 body=Data(lk0=LK0(endpoint=src, record_id=record_id), app_data=b"doc %d" % record_id))


def _saved(out_data: list[bytes]) -> list[tuple[int, int]]:
    """(LK0 record id, LK1 id) of every ACK_SAVE entry, in order."""
    d = FrameDecoder()
    d.receive_data(b"".join(out_data))
    pairs = []
    while (raw := d.next_frame()) is not None:
        body = raw.frame().body
        if isinstance(body, AckBatch) and body.ack_kind is Kind.ACK_SAVE:
            pairs += [(e.dest_ref_id, e.src_ref_id) for e in body.entries]  # LK0 record, LK1
    return pairs


def test_a_batch_of_stored_documents_gets_one_lk1_each_in_two_statements(tmp_path: Path) -> None:
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B, C])
        a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
        sql: list[str] = []
        core.conn.set_trace_callback(sql.append)
        # B and C offline. An inquiry A relays to B is stored between the
        # documents (its row id comes from SQLite, theirs from the batch);
        # document 1 is repeated in the batch.
        inquiry = Frame(kind=Kind.INQUIRY, source=a, target=b,
                        body=Inquiry(topic=InquiryTopic.RECEIVED, items=(LK0(endpoint=a, record_id=99),)))
        frames = [_data(a, b, 1), _data(a, c, 2), inquiry, *(_data(a, b, r) for r in range(3, 51)), _data(a, b, 1)]
        out = core.handle(a, _raw(*frames), lambda ep: False)
        core.conn.set_trace_callback(None)
        assert out.errors == []
        saved = _saved(out.sends[a])
        assert [r for r, _ in saved] == [1, 2, *range(3, 51), 1]
        lk1 = dict(saved)
        assert saved[-1] == (1, lk1[1])  # the repeat names the same copy
        assert len(set(lk1.values())) == 50
        rows = core.conn.execute("SELECT id, kind, record_id, target_id, frame FROM stored ORDER BY id").fetchall()
        data_rows = {r[2]: (r[0], r[3], bytes(r[4])) for r in rows if r[1] == int(Kind.DATA)}
        assert len(rows) == 51 and len(data_rows) == 50
        for f in frames:
            if f.kind is Kind.DATA:
                assert data_rows[f.body.lk0.record_id] == (lk1[f.body.lk0.record_id], f.target.node_id,
                                                           encode_frame(f))
        assert out.stored_for == {b, c}
        # Per batch: one look-up of earlier copies, one insert of the new ones.
        per_doc = [s for s in sql if " stored" in s]
        assert sum("k(t, o, s, d, r)" in s for s in per_doc) == 1, per_doc
        assert sum(s.startswith("INSERT INTO stored (id,") for s in per_doc) == 50  # one executemany
        assert len(per_doc) <= 50 + 3, per_doc

        # A resend of documents 2 and 7 (their ACK_SAVE lost) and a new one.
        out = core.handle(a, _raw(_data(a, c, 2), _data(a, b, 7), _data(a, b, 51)), lambda ep: False)
        again = _saved(out.sends[a])
        assert again[:2] == [(2, lk1[2]), (7, lk1[7])]
        assert again[2][1] > max(r[0] for r in rows)  # never an id used before
        assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (52,)

        # A copy already handed to its target (state SENT) is not reused: a
        # resend then is a new copy, as before (the receiver drops the repeat).
        _, n = core.claim_stored(c, 10)
        assert n == 1
        out = core.handle(a, _raw(_data(a, c, 2)), lambda ep: False)
        (copy,) = _saved(out.sends[a])
        assert copy[0] == 2 and copy[1] != lk1[2]
    finally:
        core.close()
