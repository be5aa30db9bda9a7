"""A batch that came over a direct link (NodeCore.handle(..., direct=peer)):
the receiver answers every reliable document with ACK2 (on a direct link the
end-to-end acknowledgement is also the transport's) and keeps no pending-ack
row for it; the origin sends no REACK2 for an ACK2 that came that way (an
ACK2 lost with the link brings the document again, and its duplicate is
answered again). From the platform, nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import Endpoint, FrameDecoder, Kind, RawFrame

A, B = "10008", "56001"
a_ep, b_ep = Endpoint.org(A), Endpoint.org(B)


def _frames(chunks: list[bytes]) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(b"".join(chunks))
    return list(dec)


@pytest.mark.parametrize("ack2", [True, False])
def test_a_direct_copy_is_answered_with_ack2_and_no_confirmations_are_kept(tmp_path: Path, ack2: bool) -> None:
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, events_dir=tmp_path / "ea")
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, events_dir=tmp_path / "eb")
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i, ack2=ack2) for i in range(3)])
        data = a.claim(10, only=B).data
        answer = b.handle(_frames(data), direct=a_ep)
        assert answer.delivered == 3
        acks = _frames(answer.data)
        assert [f.kind for f in acks] == [Kind.ACK_BATCH]  # ACK2 even when none was asked
        assert not b.pending_acks.deferred and b.conn.execute("SELECT count(*) FROM inbound").fetchone()[0] == 0
        back = a.handle(acks, direct=b_ep)
        assert back.data == []  # no REACK2 on a direct link
        assert back.settled == 3 and len(set(back.settled_ids)) == 3
        assert a.conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
        # The same document again (its ACK2 was lost with the link): not
        # delivered twice, answered again.
        again = b.handle(_frames(data), direct=a_ep)
        assert again.delivered == 0 and [f.kind for f in _frames(again.data)] == [Kind.ACK_BATCH]
    finally:
        a.close()
        b.close()
    received = [json.loads(line) for p in (tmp_path / "eb").glob("*.jsonl") for line in p.read_text().splitlines()]
    paths = {e["path"] for e in received if e["event"] == "received"}
    assert paths == {"direct"}
    sent = [json.loads(line) for p in (tmp_path / "ea").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert {e["path"] for e in sent if e["event"] == "sent"} == {"direct"}


def test_through_the_platform_the_confirmations_stay(tmp_path: Path) -> None:
    a = NodeCore(tmp_path / "a.sqlite", A, create=True)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc")])
        data = a.claim(10).data
        # (as relayed: the platform is the hop; the test hands the frame over)
        answer = b.handle(_frames(data))
        assert b.pending_acks.deferred  # waits for the origin's REACK2
        back = a.handle(_frames(answer.data))
        assert [f.kind for f in _frames(back.data)] == [Kind.ACK_BATCH]  # REACK2
    finally:
        a.close()
        b.close()
