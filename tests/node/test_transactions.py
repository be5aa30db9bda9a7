"""Transactional messages (seed 002): half messages, commit / rollback,
crash safety, the check-back schedule, the CLI, end to end."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from semq.cli import main as semq_main
from semq.cli.features import main as seed
from semq.node.api import NodeClient
from semq.node.features.capabilities import TxSettings
from semq.node.features.tasks import run_checkbacks
from semq.node.features.txn import (
    Decision,
    HalfMessage,
    Transactions,
    TxChecker,
    TxError,
    TxState,
)
from semq.umxt_protocol import LocalProtocolError
from tests._procs import Cluster, wait_until

A, B = "10008", "56001"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security"]) == 0
    return d


def q(d: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    c = sqlite3.connect(str(d / "node.sqlite"))
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def outbox(d: Path) -> list[tuple[object, ...]]:
    return q(d, "SELECT id, target_id, key, app_data FROM outbox ORDER BY id")


# ---------------------------------------------------------------- commit / rollback


def test_half_message_is_not_sent_until_commit_and_commit_is_idempotent(node: Path) -> None:
    with NodeClient(node) as n:
        txs = Transactions(n)
        m = txs.send(B, b"<order/>", data_type="ORDER", key="PO-1", priority=7)
        assert m.state is TxState.HALF and m.lk0 is None
        assert outbox(node) == []  # the daemon only sends outbox rows
        lk0 = txs.commit(m.id)
        assert outbox(node) == [(lk0.record_id, B, "PO-1", b"<order/>")]
        assert q(node, "SELECT priority, save_fwd, ack2 FROM outbox") == [(7, 3, 1)]
        assert txs.commit(m.id) == lk0  # a retry after a lost answer
        assert len(outbox(node)) == 1
        got = txs.get(m.id)
        assert got.state is TxState.COMMITTED and got.lk0 == lk0 and got.decided_by == "api"
        with pytest.raises(TxError, match=f"transaction {m.id} was committed as {lk0}"):
            txs.rollback(m.id)


def test_rollback_is_final_and_never_reaches_the_outbox(node: Path) -> None:
    with NodeClient(node) as n:
        txs = Transactions(n)
        m = txs.send(B, b"x", data_type="ORDER")
        assert txs.rollback(m.id, note="order cancelled").state is TxState.ROLLED_BACK
        assert txs.rollback(m.id).state is TxState.ROLLED_BACK  # idempotent
        with pytest.raises(TxError, match=r"was rolled back .*order cancelled.*cannot be committed"):
            txs.commit(m.id)
        assert outbox(node) == []
        with pytest.raises(TxError, match="no transaction 99"):
            txs.commit(99)
        assert [x.id for x in txs.list()] == []
        assert [x.state for x in txs.list(states=None)] == [TxState.ROLLED_BACK]


def test_invalid_fields_are_refused_at_send_like_semq_send(node: Path) -> None:
    with NodeClient(node) as n:
        txs = Transactions(n)
        with pytest.raises(LocalProtocolError):
            txs.send("", b"x")
        with pytest.raises(LocalProtocolError):
            txs.send(B, b"x", priority=12)
        with pytest.raises(LocalProtocolError):
            txs.send(B, b"x", key="k" * 300)
        assert txs.list(states=None) == []


def test_run_commits_on_success_and_rolls_back_on_error(node: Path) -> None:
    with NodeClient(node) as n:
        txs = Transactions(n)
        assert txs.run(B, b"ok", lambda half: half.id * 10, data_type="ORDER") == 10
        with pytest.raises(ZeroDivisionError):
            txs.run(B, b"bad", lambda half: 1 // 0, data_type="ORDER")
        states = [(m.app_data, m.state) for m in txs.list(states=None)]
        assert states == [(b"ok", TxState.COMMITTED), (b"bad", TxState.ROLLED_BACK)]
        assert [r[3] for r in outbox(node)] == [b"ok"]


def test_failure_inside_commit_leaves_neither_outbox_row_nor_commit(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from semq.node.features import txn

    def boom() -> None:
        raise RuntimeError("power cut")

    with NodeClient(node) as n:
        txs = Transactions(n)
        m = txs.send(B, b"x", data_type="ORDER")
        monkeypatch.setitem(txn._crash_hooks, "after-accept", boom)
        with pytest.raises(RuntimeError):
            txs.commit(m.id)
        assert outbox(node) == [] and txs.get(m.id).state is TxState.HALF
        monkeypatch.delitem(txn._crash_hooks, "after-accept")
        lk0 = txs.commit(m.id)
        assert [r[0] for r in outbox(node)] == [lk0.record_id]


CRASH = textwrap.dedent("""
    import os, signal, sys
    from semq.node.features import txn
    from semq.node.api import NodeClient
    txn._crash_hooks["after-accept"] = lambda: os.kill(os.getpid(), signal.SIGKILL)
    with NodeClient(sys.argv[1]) as n:
        txn.Transactions(n).commit(int(sys.argv[2]))
""")


def test_process_killed_inside_commit_never_half_commits(node: Path) -> None:
    """SIGKILL after the outbox row was written inside the commit's
    transaction: on disk there is neither the row nor COMMITTED; the
    delivery log does not claim 'queued' either."""
    with NodeClient(node) as n:
        m = Transactions(n).send(B, b"x", data_type="ORDER")
    p = subprocess.run([sys.executable, "-c", CRASH, str(node), str(m.id)], timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert outbox(node) == []
    assert q(node, "SELECT state, outbox_id FROM tx_half") == [(0, None)]
    assert '"queued"' not in "".join(f.read_text() for f in (node / "events").glob("*.jsonl"))
    with NodeClient(node) as n:
        lk0 = Transactions(n).commit(m.id)
    assert [r[0] for r in outbox(node)] == [lk0.record_id]


# ---------------------------------------------------------------- check-back


def test_checkback_schedule_first_after_6s_every_60s_15_times_then_a_person(node: Path) -> None:
    asked: list[int] = []

    def unsure(m: HalfMessage) -> None:
        asked.append(m.checks)

    with NodeClient(node) as n:
        m = Transactions(n, settings=TxSettings()).send(B, b"x", data_type="ORDER")
        ck = TxChecker(n, settings=TxSettings(), checkback=unsure)
        t0 = m.created_ms
        assert ck.run_due(t0 + 5_999).asked == 0
        r = ck.run_due(t0 + 6_000)
        assert (r.asked, r.unknown) == (1, [m.id]) and asked == [1]
        t = t0 + 6_000
        for i in range(2, 16):
            assert ck.run_due(t + 59_999).asked == 0, f"check {i} too early"
            t += 60_000
            r = ck.run_due(t)
            assert r.asked == 1
        assert asked == list(range(1, 16))
        assert r.flagged == [m.id]
        got = Transactions(n).get(m.id)
        assert got.state is TxState.NEEDS_ATTENTION and "15 check-backs without an answer" in got.note
        assert ck.run_due(t + 10 * 60_000).asked == 0  # nobody asks any more: a person decides
        assert Transactions(n).commit(m.id, by="person").record_id == outbox(node)[0][0]


def test_checkback_answers_commit_rollback_and_errors(node: Path) -> None:
    answers = {"C": "commit", "R": Decision.ROLLBACK, "T": True, "F": False, "?": "maybe"}

    def cb(m: HalfMessage) -> object:
        if m.app_key.key == "X":
            raise RuntimeError("database down")
        return answers[m.app_key.key]

    s = TxSettings(first_check=0, check_interval=0, max_checks=3)
    with NodeClient(node) as n:
        txs = Transactions(n, settings=s)
        ids = {k: txs.send(B, k.encode(), data_type="ORDER", key=k).id for k in [*answers, "X"]}
        r = TxChecker(n, settings=s, checkback=cb).run_due()  # type: ignore[arg-type]
        assert sorted(i for i, _ in r.committed) == sorted([ids["C"], ids["T"]])
        assert sorted(r.rolled_back) == sorted([ids["R"], ids["F"]])
        assert sorted(r.unknown) == sorted([ids["?"], ids["X"]])
        assert "raised RuntimeError: database down" in txs.get(ids["X"]).note
        assert sorted(str(row[2]) for row in outbox(node)) == ["C", "T"]
        assert txs.get(ids["C"]).decided_by == "checkback"


def test_decision_made_while_the_checkback_runs_wins_cleanly(node: Path) -> None:
    s = TxSettings(first_check=0)
    with NodeClient(node) as n:
        txs = Transactions(n, settings=s)
        m = txs.send(B, b"x", data_type="ORDER")
        ck = TxChecker(n, settings=s, checkback=lambda _m: "commit")
        [claimed] = ck.claim_due()
        txs.rollback(m.id, by="person")  # while the application is being asked
        r = ck.check_one(claimed)
        assert r.skipped == [m.id] and not r.committed
        assert outbox(node) == [] and txs.get(m.id).state is TxState.ROLLED_BACK


def test_command_checkback_environment_exit_codes_and_timeout(node: Path, tmp_path: Path) -> None:
    script = tmp_path / "cb.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "$SEMQ_TX_ID $SEMQ_TX_TO $SEMQ_TX_TYPE $SEMQ_TX_KEY $SEMQ_TX_CHECK" >> "$SEMQ_DIR/asked.log"
        case "$SEMQ_TX_KEY" in
          C*) echo commit ;;
          R*) echo "rollback: order 4711 not found" ;;
          S*) sleep 30 ;;
          *) echo "no idea" >&2; exit 4 ;;
        esac
    """))
    script.chmod(0o755)
    s = TxSettings(checkback=str(script), first_check=0, check_interval=0, checkback_timeout=0.5)
    with NodeClient(node) as n:
        txs = Transactions(n, settings=s)
        ids = {k: txs.send(B, b"x", data_type="ORDER", key=k).id for k in ("C1", "R1", "U1", "S1")}
        t = time.monotonic()
        r = TxChecker(n, settings=s).run_due()
        assert time.monotonic() - t < 10  # the sleeping command was stopped
        assert [i for i, _ in r.committed] == [ids["C1"]] and r.rolled_back == [ids["R1"]]
        assert sorted(r.unknown) == sorted([ids["U1"], ids["S1"]])
        assert txs.get(ids["U1"]).note == "check-back 1 exited 4: no idea"
        assert "did not answer within 0.5 s" in txs.get(ids["S1"]).note
    lines = sorted((node / "asked.log").read_text().splitlines())
    assert lines[0] == f"{ids['C1']} {B} ORDER C1 1"


def test_no_checkback_configured_flags_on_the_same_schedule(node: Path) -> None:
    s = TxSettings(first_check=1, check_interval=1, max_checks=2)
    with NodeClient(node) as n:
        m = Transactions(n, settings=s).send(B, b"x", data_type="ORDER")
        ck = TxChecker(n, settings=s)
        assert ck.run_due(m.created_ms + 1000).unknown == [m.id]
        assert ck.run_due(m.created_ms + 2000).flagged == [m.id]
        assert "no check-back configured" in Transactions(n).get(m.id).note


async def test_run_checkbacks_task_commits_in_the_background(node: Path) -> None:
    with NodeClient(node) as n:
        m = Transactions(n, settings=TxSettings(first_check=0)).send(B, b"x", data_type="ORDER")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_checkbacks(node, 0.05, checkback=lambda _m: "commit"))
        with trio.fail_after(20):
            while not outbox(node):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert q(node, "SELECT state, decided_by FROM tx_half WHERE id=?", m.id) == [(1, "checkback")]


# ---------------------------------------------------------------- CLI


def test_cli_send_list_commit_rollback_and_errors(node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "order.xml"
    doc.write_bytes(b"<order/>")
    d = ["--dir", str(node)]
    assert seed(["tx", "send", *d, "--to", B, "--type", "ORDER", "--key", "PO-9", str(doc)]) == 0
    out = capsys.readouterr()
    assert out.out == "1\n" and "NOT sent until 'semq tx commit 1'" in out.err
    assert seed(["tx", "send", *d, "-q", "--to", B, "--type", "ORDER", str(doc)]) == 0
    capsys.readouterr()
    assert seed(["tx", "list", *d]) == 0
    out = capsys.readouterr()
    assert "HALF" in out.out and "PO-9" in out.out and "2 transaction(s)" in out.err
    assert seed(["tx", "commit", *d, "1"]) == 0
    lk0 = capsys.readouterr().out.strip()
    assert re.fullmatch(rf"{A}/1/1/[1-9][0-9]*", lk0), lk0
    assert seed(["tx", "rollback", *d, "2", "--note", "cancelled"]) == 0
    capsys.readouterr()
    assert seed(["tx", "rollback", *d, "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: transaction 1 was committed") and err.count("\n") == 1
    assert seed(["tx", "commit", *d, "7"]) == 2
    assert capsys.readouterr().err == "error: no transaction 7 (see 'semq tx list --all')\n"
    assert seed(["tx", "send", *d, "--to", B, "--type", "ORDER", str(tmp_path / "missing")]) == 2
    assert "error: no such file" in capsys.readouterr().err
    assert seed(["tx", "list", *d, "--all", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["state"], r["lk0"]) for r in rows] == [(1, "COMMITTED", lk0),
                                                              (2, "ROLLED_BACK", None)]
    assert seed(["tx", "show", *d, "2", "--data"]) == 0
    assert capsys.readouterr().out == "<order/>"


def test_cli_config_is_validated_and_used(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--dir", str(node)]
    assert seed(["tx", "config", *d, "--checkback", "echo commit", "--first-check", "0", "--max-checks", "3"]) == 0
    assert "checkback = 'echo commit'" in capsys.readouterr().out
    assert seed(["tx", "config", *d, "--max-checks", "0"]) == 2
    assert "--max-checks 0 is outside 1..1000000" in capsys.readouterr().err
    (node / "capabilities.toml").write_text("[tx]\nfirst_chek = 1\n")
    assert seed(["tx", "config", *d]) == 2
    assert "unknown keys: first_chek" in capsys.readouterr().err
    (node / "capabilities.toml").write_text("[tx]\ncheckback = 'echo commit'\nfirst_check = 0\n")
    with NodeClient(node) as n:
        Transactions(n).send(B, b"x", data_type="ORDER")
    assert seed(["tx", "check", *d]) == 0
    assert capsys.readouterr().out.startswith("asked 1: committed 1")
    assert len(outbox(node)) == 1


# ---------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_e2e_commit_delivers_rollback_never_and_checkback_decides(cluster: Cluster, tmp_path: Path) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    da = cluster.root / A
    script = tmp_path / "orders-status.sh"
    script.write_text('#!/bin/sh\ncase "$SEMQ_TX_KEY" in C*) echo commit;; R*) echo rollback;; *) exit 1;; esac\n')
    script.chmod(0o755)
    assert seed(["tx", "config", "--dir", str(da), "--checkback", str(script), "--first-check", "30"]) == 0
    with NodeClient(da) as n:
        txs = Transactions(n)
        keep = txs.send(B, b"keep", data_type="ORDER", key="K1")
        drop = txs.send(B, b"drop", data_type="ORDER", key="K2")
        time.sleep(1.0)
        assert cluster.inbox(B) == {}  # nothing leaves before commit
        lk0 = txs.commit(keep.id)
        txs.rollback(drop.id)
    wait_until(lambda: cluster.inbox(B) == {f"{A}/{lk0.record_id}": b"keep"}, 20, "the committed document")
    # Check-back: the producer "crashed" before deciding; the node asks.
    assert seed(["tx", "config", "--dir", str(da), "--first-check", "0.2", "--check-interval", "0.3"]) == 0
    with NodeClient(da) as n:
        ids = {k: Transactions(n).send(B, k.encode(), data_type="ORDER", key=k).id for k in ("C7", "R7", "U7")}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "watch.log").open("wb")
    w = subprocess.Popen([sys.executable, "-m", "semq.cli.features", "tx", "watch", "--dir", str(da),
                          "--interval", "0.1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # Running (its SIGTERM handler in place) before anything can end the
        # test: the node daemon runs check-backs too and may decide first; a
        # SIGTERM during the watcher's start-up would kill it (exit -15).
        wait_until(lambda: b"checking back on half messages" in (tmp_path / "watch.log").read_bytes(), 30,
                   "tx watch to start")
        wait_until(lambda: b"C7" in cluster.inbox(B).values(), 30, "the document the check-back committed")
        with NodeClient(da) as n:
            wait_until(lambda: Transactions(n).get(ids["R7"]).state is TxState.ROLLED_BACK, 10, "rollback")
            assert Transactions(n).get(ids["U7"]).state is TxState.HALF
    finally:
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=20) == 0
    time.sleep(0.5)
    assert sorted(cluster.inbox(B).values()) == [b"C7", b"keep"]


@pytest.mark.e2e
def test_e2e_node_daemon_runs_the_checkbacks(cluster: Cluster, tmp_path: Path) -> None:
    for o in (A, B):
        cluster.add_org(o)
    da = cluster.root / A
    assert seed(["tx", "config", "--dir", str(da), "--checkback", "echo commit", "--first-check", "0.2"]) == 0
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    with NodeClient(da) as n:
        m = Transactions(n).send(B, b"decided by the check-back", data_type="ORDER")
    wait_until(lambda: list(cluster.inbox(B).values()) == [b"decided by the check-back"], 30, "delivery")
    assert q(da, "SELECT state, decided_by FROM tx_half WHERE id=?", m.id) == [(1, "checkback")]
