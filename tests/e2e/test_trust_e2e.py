"""What SEMQ promises, held against a dishonest relay and an enrolled
organization with bad intent, with real processes (semq.testing.dishonest:
the real platform with an operator who cheats).

Each test fails on a SEMQ that trusted the relay: a receipt that proves
what it says, a confirmation only by the target's signature, a refusal
only by the target's signature, no metadata for third parties, no AppKey
for the relay, stored copies that a target refuses leave the platform,
documents older than the duplicate-suppression window refused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Data,
    Endpoint,
    Error,
    Frame,
    Hello,
    Inquiry,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    ResultCode,
    encode_frame,
)
from tests._procs import Cluster, wait_until
from tests.e2e.test_security_e2e import _read_frames, _tls_socket

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77003"
SS_FAILED = 9


def plan(c: Cluster, *rules: dict[str, Any]) -> Path:
    """Write the dishonest relay's plan (it reads it again when it changes)."""
    p = c.root / "plan.json"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rules": list(rules)}))
    os.replace(tmp, p)
    return p


def status(c: Cluster, name: str) -> dict[str, Any]:
    try:
        return dict(json.loads((c.root / name / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def outbox(c: Cluster, org: str) -> list[tuple[int, int, int]]:
    return [(r, s, code) for r, s, code in c.q(org, "SELECT id, state, code FROM outbox ORDER BY id")]


def start(c: Cluster, *orgs: str, rules: tuple[dict[str, Any], ...] = (), offline: tuple[str, ...] = ()) -> None:
    """Enroll ``orgs`` and ``offline``, start the (dishonest) platform and the nodes of ``orgs``."""
    for o in (*orgs, *offline):
        c.add_org(o)
    c.start_platform(plan(c, *rules))
    for o in orgs:
        c.start_node(o)


def test_a_relay_that_changes_the_expiry_gets_a_signed_refusal_not_a_receipt(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """The expiry is bound to the document: moved by the relay, the target
    refuses it, signs the refusal, and the origin shows it; no receipt
    exists for a document no application saw."""
    start(cluster, A, B, rules=({"action": "alter", "source": A, "target": B, "set": {"expires_ms": 1},
                                 "direct": True},))
    with NodeClient(cluster.root / A) as node:
        lk0 = node.send(B, b"<order id='S1'/>", data_type="ORDER", key="S1")
    rows = wait_until(lambda: [r for r in outbox(cluster, A) if r[1] == SS_FAILED], 30, "the refusal")
    assert rows == [(lk0.record_id, SS_FAILED, int(ResultCode.DECRYPT_FAILED))]
    assert cluster.q(A, "SELECT target_id, code FROM refusals") == [(B, int(ResultCode.DECRYPT_FAILED))]
    assert cluster.count(B, "SELECT count(*) FROM inbox") == 0
    assert cluster.count(B, "SELECT count(*) FROM dedup") == 0
    assert semq_main(["messages", "--dir", str(cluster.root / A), "--receipt", str(lk0)]) != 0
    capsys.readouterr()
    assert semq_main(["messages", "--dir", str(cluster.root / A)]) == 0
    assert f"refused by {B} (signed): DECRYPT_FAILED" in capsys.readouterr().out


def test_a_refusal_the_target_did_not_sign_changes_nothing(cluster: Cluster) -> None:
    start(cluster, A, B, rules=({"action": "forge_nack", "source": A, "target": B, "code": "BAD_SIGNATURE"},))
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"<order id='S2'/>", data_type="ORDER", key="S2")
    wait_until(lambda: status(cluster, "P").get("mischief_forge_nack", 0) >= 1, 30, "the forged refusal")
    wait_until(lambda: status(cluster, A).get("bad_refusals", 0) >= 1, 30, "A to count it")
    assert [r[1] for r in outbox(cluster, A)] != [SS_FAILED]
    plan(cluster)  # honest again: the document goes through
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == 1, 60, "delivery once honest")
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")


def test_an_ack2_without_the_targets_receipt_confirms_nothing(cluster: Cluster) -> None:
    """The relay drops documents and confirms them in the target's name:
    without a receipt, with bytes that look like one, and with a genuine
    receipt of another document. Every row stays open; once the relay is
    honest they are delivered, once each."""
    start(cluster, A, B)
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"honest", data_type="ORDER", key="K0")
    wait_until(lambda: cluster.settled([A, B]), 30, "the honest document")
    plan(cluster, *({"action": "forge_ack2", "source": A, "target": B, "receipt": how, "count": 1}
                    for how in ("replay", "none", "garbage")),
         {"action": "drop", "kind": "DATA", "source": A, "target": B})  # (and the resends)
    time.sleep(0.5)  # (the relay reads its plan at its next batch)
    with NodeClient(cluster.root / A) as node:
        sent = [node.send(B, f"forged {i}".encode(), data_type="ORDER", key=f"K{i}") for i in (1, 2, 3)]
    wait_until(lambda: status(cluster, "P").get("mischief_forge_ack2", 0) >= 3, 30, "three forged ACK2s")
    wait_until(lambda: status(cluster, A).get("bad_receipts", 0) >= 3, 30, "A to count them")
    time.sleep(1.5)  # inquiries come and go: nothing confirms them
    assert [r[0] for r in outbox(cluster, A)] == [lk.record_id for lk in sent]
    assert cluster.count(A, "SELECT count(*) FROM receipts WHERE verified=1 AND record_id > ?",
                         sent[0].record_id - 1) == 0
    plan(cluster)
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == 4, 60, "delivery once honest")
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")
    assert len(cluster.inbox(B)) == 4  # each once
    assert cluster.count(A, "SELECT count(*) FROM receipts WHERE verified=1") == 4


def test_forged_inquiry_answers_and_questions_settle_nothing(cluster: Cluster) -> None:
    """The relay drops the documents, says "forwarded" for itself and
    "received" in the target's name, and asks the origin about them as if
    it were the target: the rows stay open."""
    start(cluster, A, B, rules=(
        {"action": "ask_state", "source": A, "target": B, "count": 1},
        {"action": "drop", "kind": "DATA", "source": A, "target": B},
        {"action": "answer_received", "kind": "INQUIRY", "source": A, "target": "platform", "result": "FORWARDED"},
        {"action": "answer_received", "kind": "INQUIRY", "source": A, "target": B, "result": "RECEIVED"},
    ))
    with NodeClient(cluster.root / A) as node:
        sent = [node.send(B, f"dropped {i}".encode(), data_type="ORDER") for i in (1, 2)]
    wait_until(lambda: status(cluster, "P").get("mischief_answer_received", 0) >= 4, 30,
               "forged answers from the platform and in the target's name")
    assert status(cluster, "P").get("mischief_ask_state") == 1
    time.sleep(1.5)
    rows = outbox(cluster, A)
    assert [r[0] for r in rows] == [lk.record_id for lk in sent]
    assert {r[1] for r in rows} <= {1, 2}  # SS_SENT / SS_ACK_FWD: asked about, never confirmed
    plan(cluster)
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == 2, 60, "delivery once honest")
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")


def _hello(s: Any, org: str) -> None:
    s.sendall(encode_frame(Frame(kind=Kind.HELLO, source=Endpoint.org(org), target=Endpoint.platform(),
                                 body=Hello())))


def test_a_third_organization_can_neither_confirm_nor_learn(cluster: Cluster) -> None:
    """C, enrolled, sends B a REACK2 for A's document and asks B and the
    platform whether A's document arrived: B's pending-ack row stays, and
    C learns nothing (NO_RECORD)."""
    start(cluster, A, B, rules=(
        {"action": "drop", "kind": "REACK2", "source": A, "target": B},  # B's row waits for A's REACK2...
        {"action": "drop", "kind": "INQUIRY", "source": B, "target": A},  # ... and does not ask A about it
    ), offline=(C,))
    with NodeClient(cluster.root / A) as node:
        lk0 = node.send(B, b"between A and B", data_type="ORDER")
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == 1, 30, "delivery")
    [(inbound_id, s_ack)] = wait_until(lambda: cluster.q(B, "SELECT id, s_ack FROM inbound"), 30,
                                       "B's pending-ack row (written after a second)")
    assert s_ack == 0
    me, pe, be = Endpoint.org(C), Endpoint.platform(), Endpoint.org(B)
    with _tls_socket(cluster, C) as s:
        _hello(s, C)
        s.sendall(b"".join((
            encode_frame(Frame(kind=Kind.ACK_BATCH, source=me, target=be, body=AckBatch(
                ack_kind=Kind.REACK2, entries=(AckEntry(1, 1, 0, 1, 1, inbound_id, int(AckFlag.DELIVERY), 0),)))),
            encode_frame(Frame(kind=Kind.INQUIRY, source=me, target=be,
                               body=Inquiry(topic=InquiryTopic.RECEIVED, items=(lk0,)))),
            encode_frame(Frame(kind=Kind.INQUIRY, source=me, target=pe,
                               body=Inquiry(topic=InquiryTopic.RECEIVED, items=(lk0,)))),
        )))
        frames = _read_frames(s, timeout=5)
    answers = [a for f in frames if isinstance(f.body, InquiryResp) for a in f.body.answers]
    assert len(answers) == 2 and {a.result for a in answers} == {InquiryResult.NO_RECORD}
    time.sleep(1)
    assert cluster.q(B, "SELECT id, s_ack FROM inbound") == [(inbound_id, 0)]


def test_a_stored_copy_the_target_refuses_leaves_the_platform(cluster: Cluster) -> None:
    start(cluster, A, offline=(B,), rules=({"action": "alter", "source": A, "target": B, "set": {"created_ms": 12345}},))
    with NodeClient(cluster.root / A) as node:
        lk0 = node.send(B, b"stored, then refused", data_type="ORDER")
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 1, 30, "stored")
    cluster.start_node(B)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored") == 0, 30, "the copy settled")
    rows = wait_until(lambda: [r for r in outbox(cluster, A) if r[1] == SS_FAILED], 30, "the refusal at A")
    assert rows == [(lk0.record_id, SS_FAILED, int(ResultCode.DECRYPT_FAILED))]
    assert cluster.count(B, "SELECT count(*) FROM inbox") == 0


def test_a_document_older_than_the_dedup_window_is_refused_and_a_replay_suppressed(cluster: Cluster) -> None:
    start(cluster, A, B, rules=({"action": "replay", "source": A, "target": B, "seconds": 1.0},))
    day = 86_400_000
    now = int(time.time() * 1000)
    core = NodeCore(cluster.root / A / "node.sqlite", A)  # an application writing to A's store
    try:
        old, young = core.accept([
            NewDocument(target=B, app_data=b"31 days old", encrypt=True, created_ms=now - 31 * day),
            NewDocument(target=B, app_data=b"29 days old", encrypt=True, created_ms=now - 29 * day),
        ])
    finally:
        core.close()
    rows = wait_until(lambda: [r for r in outbox(cluster, A) if r[1] == SS_FAILED], 30, "the refusal")
    assert rows == [(old.record_id, SS_FAILED, int(ResultCode.STALE))]
    wait_until(lambda: status(cluster, "P").get("mischief_replay", 0) >= 2, 30, "the relay's replays")
    time.sleep(2)  # the replayed copies reached B
    assert list(cluster.inbox(B)) == [f"{A}/{young.record_id}"]  # delivered once, the replay suppressed
    assert cluster.q(B, "SELECT count(*) FROM dedup") == [(1,)]


def test_the_relay_routes_without_the_app_key(cluster: Cluster) -> None:
    start(cluster, A, offline=(B,))
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"<invoice/>", domain="trade", data_type="INVOICE", subtype="COMMERCIAL", key="INV-SECRET-0042")
        node.send(B, b"<notice/>", data_type="NOTICE", key="PUBLIC-KEY-0001", clear_app_key=True)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 2, 30, "stored")
    frames = b"".join(f for (f,) in cluster.q("P", "SELECT frame FROM stored"))
    assert b"INV-SECRET-0042" not in frames and b"COMMERCIAL" not in frames
    assert b"PUBLIC-KEY-0001" in frames  # asked for in clear
    cluster.start_node(B)
    wait_until(lambda: cluster.settled([A, B]), 30, "delivery")
    keys = cluster.q(B, "SELECT domain, data_type, subtype, key FROM inbox ORDER BY id")
    assert keys == [("trade", "INVOICE", "COMMERCIAL", "INV-SECRET-0042"), ("", "NOTICE", "", "PUBLIC-KEY-0001")]
    relay_logs = b"".join(p.read_bytes() for p in (cluster.root / "P" / "events").glob("*.jsonl"))
    assert b"INV-SECRET-0042" not in relay_logs and b"PUBLIC-KEY-0001" in relay_logs
    origin_logs = b"".join(p.read_bytes() for p in (cluster.root / A / "events").glob("*.jsonl"))
    assert b"INV-SECRET-0042" in origin_logs  # the organizations' own logs keep it




# ---------------------------------------------------------------- bounded memory


def test_before_hello_a_large_frame_is_refused_at_its_header(cluster: Cluster) -> None:
    """A peer that has not said who it is cannot make the relay wait for,
    and buffer, a 64 MiB frame: the header is refused at once."""
    cluster.add_org(A)
    cluster.start_platform()
    big = encode_frame(Frame(kind=Kind.DATA, source=Endpoint.org(A), target=Endpoint.org(B),
                             body=Data(lk0=LK0(endpoint=Endpoint.org(A), record_id=1), app_data=bytes(1 << 20))))
    with _tls_socket(cluster, A) as s:
        s.sendall(big[:200])  # the header of a 1 MiB frame, no body
        frames = _read_frames(s, timeout=5)
    errors = [f.body for f in frames if isinstance(f.body, Error)]
    assert errors and errors[0].code is ResultCode.FRAME_TOO_LARGE and "65536" in errors[0].message


def test_an_organization_holds_at_most_its_connections(cluster: Cluster) -> None:
    cluster.add_org(A)
    cluster.start_platform()
    socks = [_tls_socket(cluster, A) for _ in range(4)]  # the most it may (max_connections_per_org)
    try:
        with _tls_socket(cluster, A) as fifth:
            frames = _read_frames(fifth, timeout=5)
        errors = [f.body for f in frames if isinstance(f.body, Error)]
        assert errors and errors[0].code is ResultCode.TOO_MANY_CONNECTIONS
    finally:
        for s in socks:
            s.close()
    # Closed ones no longer count: a node connects as usual.
    cluster.start_node(A)
    wait_until(lambda: status(cluster, A).get("connected"), 20, "A connected")


def test_documents_past_the_storage_quota_wait_at_their_origin(cluster: Cluster,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cfg = cluster.root / "P" / "semq.toml"
    cfg.write_text(cfg.read_text().replace("quota_mib = 4096", "quota_mib = 1"))
    cluster.start_platform()
    cluster.start_node(A)
    with NodeClient(cluster.root / A) as node:
        sent = [node.send(B, bytes([i]) * 400_000, data_type="DRAWING") for i in range(3)]
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 2, 30, "two stored")
    rows = wait_until(lambda: [r for r in outbox(cluster, A) if r[2] == int(ResultCode.QUOTA_EXCEEDED)], 30,
                      "the third to wait at A")
    assert [r[1] for r in rows] == [0]  # SS_INIT: kept, sent again later
    assert cluster.count("P", "SELECT sum(length(frame)) FROM stored") <= 1 << 20
    capsys.readouterr()
    assert semq_main(["messages", "--dir", str(cluster.root / A)]) == 0
    assert "QUOTA_EXCEEDED" in capsys.readouterr().out
    cluster.start_node(B)
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == 3, 60, "all three delivered")
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")
    assert sorted(cluster.inbox(B)) == sorted(f"{A}/{lk.record_id}" for lk in sent)
