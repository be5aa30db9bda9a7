"""Expiry and dead letters: reasons, requeue, purge, the max-attempts
sweep; end to end an expired document is never delivered and shows in
``semq dead``, an unknown target too."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.cli.features import main as seed
from semq.node.api import NodeClient
from semq.node.features.dead import DeadLetterError, DeadLetters, reason, sweep
from tests._procs import Cluster, wait_until

A, B = "10008", "56001"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security"]) == 0
    return d


def sql(d: Path, q: str, *args: object) -> list[tuple[object, ...]]:
    c = sqlite3.connect(str(d / "node.sqlite"))
    try:
        with c:
            return c.execute(q, args).fetchall()
    finally:
        c.close()


def fail(d: Path, rid: int, code: int, attempts: int = 1) -> None:
    sql(d, "UPDATE outbox SET state=9, code=?, attempts=? WHERE id=?", code, attempts, rid)


def test_reasons_cover_every_failure_code() -> None:
    assert reason(303) == "expired"
    assert reason(300) == "unknown target"
    assert reason(301).startswith("dropped")
    assert reason(500) == "signature refused by the receiver"
    assert reason(501) == "receiver could not decrypt it"
    assert reason(304) == "too many attempts"
    assert reason(105) == "invalid field"  # any other result code by its name
    assert reason(777) == "result code 777"


def test_list_requeue_purge(node: Path) -> None:
    with NodeClient(node) as n:
        lks = n.send_many([dict(to=B, data=f"d{i}".encode(), data_type="ORDER", expires_in=60 if i == 0 else None)
                           for i in range(4)])
        fail(node, lks[0].record_id, 303)
        sql(node, "UPDATE outbox SET expires_ms=1 WHERE id=?", lks[0].record_id)  # long expired
        fail(node, lks[1].record_id, 500, attempts=3)
        fail(node, lks[2].record_id, 300)
        dl = DeadLetters(n)
        rows = dl.list()
        assert [(d.lk0, d.code, d.reason) for d in rows] == [
            (lks[0], 303, "expired"), (lks[1], 500, "signature refused by the receiver"),
            (lks[2], 300, "unknown target")]
        with pytest.raises(DeadLetterError, match="expired; requeue it with a new expiry"):
            dl.requeue([lks[0]])
        with pytest.raises(DeadLetterError, match="is not a dead letter: it is SS_INIT"):
            dl.requeue([lks[3]])
        res = dl.requeue(None)  # all: the expired one is skipped, the others go back
        assert res.requeued == [lks[1], lks[2]] and res.skipped_expired == [lks[0]]
        assert sql(node, "SELECT id, state, code, attempts FROM outbox WHERE id IN (?,?) ORDER BY id",
                   lks[1].record_id, lks[2].record_id) == [(lks[1].record_id, 0, 0, 0), (lks[2].record_id, 0, 0, 0)]
        res = dl.requeue([str(lks[0])], expires_in=30)
        assert res.requeued == [lks[0]]
        exp = sql(node, "SELECT expires_ms FROM outbox WHERE id=?", lks[0].record_id)[0][0]
        assert isinstance(exp, int) and exp > time.time() * 1000 + 20_000
        fail(node, lks[3].record_id, 301)
        with pytest.raises(DeadLetterError, match="not a document of this node"):
            dl.purge(["99999/1/1/4"])
        assert dl.purge([lks[3].record_id]) == 1
        assert dl.list() == []
        assert len(sql(node, "SELECT id FROM outbox")) == 3
    events = "".join(p.read_text() for p in (node / "events").glob("*.jsonl"))
    assert events.count('"detail":"requeued from the dead letters') == 3
    assert '"detail":"purged from the dead letters"' in events


def test_sweep_moves_only_unsent_rows_with_too_many_attempts(node: Path) -> None:
    with NodeClient(node) as n:
        lks = n.send_many([dict(to=B, data=b"x", data_type="ORDER") for _ in range(3)])
        sql(node, "UPDATE outbox SET attempts=5 WHERE id=?", lks[0].record_id)  # SS_INIT after 5 sends
        sql(node, "UPDATE outbox SET attempts=9, state=1 WHERE id=?", lks[1].record_id)  # in flight
        sql(node, "UPDATE outbox SET attempts=4 WHERE id=?", lks[2].record_id)
        assert sweep(n, 0) == 0
        assert sweep(n, 5) == 1
        assert [(d.lk0, d.code, d.reason, d.attempts) for d in DeadLetters(n).list()] == [
            (lks[0], 304, "too many attempts", 5)]
        assert sql(node, "SELECT state FROM outbox ORDER BY id") == [(9,), (1,), (0,)]
    assert '"event":"dead"' in "".join(p.read_text() for p in (node / "events").glob("*.jsonl"))


def test_cli_dead_list_requeue_purge_sweep_and_errors(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--dir", str(node)]
    with NodeClient(node) as n:
        lks = n.send_many([dict(to=B, data=b"x", data_type="ORDER", key=f"K{i}") for i in range(3)])
    fail(node, lks[0].record_id, 301)
    fail(node, lks[1].record_id, 300)
    assert seed(["dead", *d]) == 0
    out = capsys.readouterr()
    assert "dropped: target offline (SaveFwd 1)" in out.out and "unknown target" in out.out
    assert "2 dead letter(s)" in out.err
    assert seed(["dead", "list", *d, "--json"]) == 0
    assert [r["reason"] for r in json.loads(capsys.readouterr().out)] == [
        "dropped: target offline (SaveFwd 1)", "unknown target"]
    assert seed(["dead", "requeue", *d]) == 2
    assert capsys.readouterr().err == "error: dead requeue needs document IDs (record id or LK0) or --all\n"
    assert seed(["dead", "requeue", *d, str(lks[2].record_id)]) == 2
    assert "is not a dead letter: it is SS_INIT" in capsys.readouterr().err
    assert seed(["dead", "requeue", *d, str(lks[0])]) == 0
    assert capsys.readouterr().out == f"{lks[0]}\n"
    assert seed(["dead", "purge", *d, "--all"]) == 0
    assert capsys.readouterr().out == "purged 1\n"
    assert seed(["dead", "sweep", *d]) == 2
    assert "needs --max-attempts" in capsys.readouterr().err
    assert seed(["dead", "config", *d, "--max-attempts", "3"]) == 0
    assert capsys.readouterr().out == "max_attempts = 3\n"
    sql(node, "UPDATE outbox SET attempts=3")
    assert seed(["dead", "sweep", *d]) == 0
    assert capsys.readouterr().out.startswith("2 document(s) with 3 or more attempts")


def test_maintenance_runs_the_configured_sweep(node: Path) -> None:
    from semq.node.daemon.background import maintain

    assert seed(["dead", "config", "--dir", str(node), "--max-attempts", "2"]) == 0
    with NodeClient(node) as n:
        n.send(B, b"x", data_type="ORDER")
        sql(node, "UPDATE outbox SET attempts=2")
        assert maintain(n) == {"dead": 1, "tx_purged": 0, "rpc_purged": 0}


@pytest.mark.e2e
def test_e2e_expired_is_never_delivered_and_is_a_dead_letter(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    da = cluster.root / A
    cluster.start_node(A)  # platform down: nothing can leave A
    with NodeClient(da) as n:
        stale = n.send(B, b"stale", data_type="QUOTE", expires_in=0.3)
        kept = n.send(B, b"kept", data_type="QUOTE", expires_in=600)
    time.sleep(0.6)
    cluster.start_platform()
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 1, 30, "the unexpired document")
    assert cluster.inbox(B) == {f"{A}/{kept.record_id}": b"kept"}
    wait_until(lambda: cluster.q(A, "SELECT state, code FROM outbox WHERE id=?", stale.record_id) == [(9, 303)],
               10, "the expired row failed with EXPIRED")
    with NodeClient(da) as n:
        [d] = DeadLetters(n).list()
        assert (d.lk0, d.reason) == (stale, "expired")
        # Requeued with a new expiry it goes out (same LK0) and arrives once.
        DeadLetters(n).requeue([stale], expires_in=60)
    wait_until(lambda: len(cluster.inbox(B)) == 2, 30, "the requeued document")
    assert cluster.inbox(B)[f"{A}/{stale.record_id}"] == b"stale"


@pytest.mark.e2e
def test_e2e_unknown_target_is_a_dead_letter_with_its_reason(cluster: Cluster,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_org(A)
    cluster.start_platform()
    cluster.start_node(A)
    # Signed but not sealed: sealing needs the target's certificate, which
    # an unknown organization does not have (see docs/seed-capabilities.md).
    with NodeClient(cluster.root / A) as n:
        lk = n.send("99999", b"x", data_type="ORDER", encrypt=False)
    wait_until(lambda: cluster.q(A, "SELECT state, code FROM outbox") == [(9, 300)], 20, "UNKNOWN_TARGET NACK")
    capsys.readouterr()
    assert seed(["dead", "--dir", str(cluster.root / A)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[:3] == [str(lk), "99999", "300"] and "  unknown target" in line, line


@pytest.mark.e2e
def test_e2e_dead_keeps_what_the_receiver_said(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A document for a user the receiver does not have is refused by the
    receiver with its words; ``semq dead`` shows them beside the code's."""
    for org in (A, B):
        cluster.add_org(org)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    with NodeClient(cluster.root / A) as n:
        lk = n.send(f"{B}/bob", b"x", data_type="ORDER")
    wait_until(lambda: cluster.q(A, "SELECT state, code FROM outbox") == [(9, 300)], 30, "the receiver's refusal")
    said = f"unknown target: bob is not a user of organization {B}"

    def listed() -> str:
        capsys.readouterr()
        assert seed(["dead", "--dir", str(cluster.root / A)]) == 0
        return capsys.readouterr().out

    out = wait_until(lambda: next((o for o in [listed()] if said in o), None), 20, "the reason in the history",
                     interval=0.3)
    line = out.splitlines()[1]
    assert line.startswith(str(lk)) and line.endswith(said), line
    assert seed(["dead", "--dir", str(cluster.root / A), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert (row["reason"], row["detail"]) == ("unknown target", f"bob is not a user of organization {B}")


def test_dead_letter_actions_follow_the_operator_table_in_every_state(node: Path) -> None:
    """One row in each SendState: requeue and purge by id take only the
    states OPERATOR_TABLE gives them (the others: "is not a dead letter"),
    ``refs=None`` takes all of those; sweep and fail_target make dead
    letters only of the states DEAD_LETTER applies to."""
    from semq.node.engine import OPERATOR_TABLE, OperatorAction, SendState
    from semq.node.features.dead import fail_target

    states = list(SendState)

    def reset() -> None:
        sql(node, "DELETE FROM outbox")
        for s in states:
            sql(node, "INSERT INTO outbox (target_type, target_id, state, save_fwd, ack2, reliable, priority,"
                      " domain, data_type, subtype, key, created_ms, expires_ms, attempts, inquiries, state_ms,"
                      " code, encrypt, app_data) VALUES (1, ?, ?, 3, 1, 1, 0, '', 'ORDER', '', '', ?, NULL, 5,"
                      " 0, ?, 7, 0, x'00')", B, int(s), int(time.time() * 1000), int(time.time() * 1000))

    def ids() -> dict[SendState, int]:
        return {SendState(s): i for i, s in sql(node, "SELECT id, state FROM outbox")}

    with NodeClient(node) as n:
        dl = DeadLetters(n)
        for action, run in ((OperatorAction.REQUEUE, dl.requeue), (OperatorAction.PURGE_DEAD, dl.purge)):
            reset()
            by_state = ids()
            for s in states:
                if (s, action) in OPERATOR_TABLE:
                    continue
                with pytest.raises(DeadLetterError, match=f"is not a dead letter: it is {s.name}"):
                    run([by_state[s]])
            run(None)  # all it applies to
            after = {SendState(s) for (s,) in sql(node, "SELECT state FROM outbox")}
            expect = {OPERATOR_TABLE.get((s, action), s) for s in states} - {None}
            assert after == expect
        for rule in (lambda: sweep(n, 1), lambda: fail_target(n, B)):
            reset()
            before = ids()
            assert rule() == sum(1 for s in states if (s, OperatorAction.DEAD_LETTER) in OPERATOR_TABLE)
            after_states = dict(sql(node, "SELECT id, state FROM outbox"))
            for s, rid in before.items():
                assert after_states[rid] == int(OPERATOR_TABLE.get((s, OperatorAction.DEAD_LETTER), s) or 0)
