"""Schema version 3 (the seed capabilities' tables), the shared write
transaction, the node daemon's seed task, and the CLI wiring."""

from __future__ import annotations

import os
import sqlite3
from functools import partial
from pathlib import Path

import pytest
import trio

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.node.daemon.background import run_background_tasks
from semq.node.features._access import write_tx
from semq.node.features.capabilities import TxSettings
from semq.node.features.txn import Transactions, TxState
from semq.node.store import MIGRATIONS, SEED_MODELS
from semq.store.db import open_store
from semq.store.gate import StoreGate

A, B = "10008", "56001"


def test_v2_store_upgrades_to_v3_and_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    db = open_store(path, MIGRATIONS[:2], create=True)  # what version 2 of semq created
    db.execute_sql(
        "INSERT INTO outbox (target_type, target_id, save_fwd, ack2, created_ms, app_data, state_ms)"
        " VALUES (1, '56001', 3, 1, 1, x'6869', 1)")
    db.execute_sql(
        "INSERT INTO inbox (origin_type, origin_id, semq_id, semq_db_id, record_id, save_fwd, created_ms,"
        " received_ms, app_data) VALUES (1, '56001', 1, 1, 7, 3, 1, 1, x'6869')")
    db.close()
    core = NodeCore(path, A)
    try:
        c = core.conn
        assert c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(len(MIGRATIONS))
        assert c.execute("SELECT target_id, app_data FROM outbox").fetchall() == [("56001", b"hi")]
        assert c.execute("SELECT record_id FROM inbox").fetchall() == [(7,)]
        for m in SEED_MODELS:
            assert c.execute(f"SELECT count(*) FROM {m._meta.table_name}").fetchone()[0] == 0
        plan = c.execute("EXPLAIN QUERY PLAN SELECT id FROM inbox WHERE domain='semq.rpc' AND subtype='reply'"
                         " AND key='x' ORDER BY id LIMIT 1").fetchall()
        assert "inbox_rpc_reply" in str(plan)
    finally:
        core.close()
    assert (tmp_path / "node.sqlite.bak-v2").exists()


def test_write_tx_joins_accept_and_holds_log_records_until_commit(tmp_path: Path) -> None:
    core = NodeCore(tmp_path / "node.sqlite", A, create=True, events_dir=tmp_path / "events")
    try:
        def logged() -> str:
            return "".join(p.read_text() for p in (tmp_path / "events").glob("*.jsonl"))

        with pytest.raises(RuntimeError), write_tx(core):
            core.accept([NewDocument(target=B, app_data=b"x")])
            assert core.conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1
            raise RuntimeError("abort")
        assert core.conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
        assert '"queued"' not in logged()
        with write_tx(core):
            core.accept([NewDocument(target=B, app_data=b"x")])
            assert '"queued"' not in logged()  # not committed yet
        assert logged().count('"queued"') == 1
        assert core.log is not None and core.log.__class__.__name__ == "EventLog"
    finally:
        core.close()


async def test_run_background_tasks_checks_back_and_sweeps(tmp_path: Path) -> None:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security"]) == 0
    (d / "capabilities.toml").write_text("[tx]\ncheckback = 'echo rollback'\nfirst_check = 0\n"
                                         "[dead]\nmax_attempts = 2\n")
    with NodeClient(d) as n:
        m = Transactions(n, settings=TxSettings(first_check=0)).send(B, b"x", data_type="ORDER")
        n.send(B, b"y", data_type="ORDER")
    c = sqlite3.connect(str(d / "node.sqlite"))
    with c:
        c.execute("UPDATE outbox SET attempts=2")
    c.close()
    core = NodeCore(d / "node.sqlite", A)  # what the daemon passes, with its gate
    gate = StoreGate()

    def done() -> bool:
        tx = core.conn.execute("SELECT state FROM tx_half WHERE id=?", (m.id,)).fetchone()[0]
        st = core.conn.execute("SELECT state FROM outbox ORDER BY id").fetchall()
        return bool(tx == TxState.ROLLED_BACK and st == [(9,)])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_background_tasks, core, gate=gate, interval=0.05, maintenance_interval=0.05))
            with trio.fail_after(20):
                while not await gate.run(done):
                    await trio.sleep(0.05)
            # The daemon's own connection only: a second one in the daemon's
            # process would be unsafe (see docs/seed-capabilities.md, Wiring).
            assert _open_fds(d / "node.sqlite") in (None, 1)
            nursery.cancel_scope.cancel()
    finally:
        core.close()


def _open_fds(path: Path) -> int | None:
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.exists():
        return None
    n = 0
    for f in fd_dir.iterdir():
        try:
            n += os.readlink(f) == str(path)
        except OSError:
            pass
    return n


def test_semq_cli_has_the_feature_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security"]) == 0
    for argv in (["tx", "list"], ["replies"], ["requests"], ["dead"], ["queue", "list"]):
        assert semq_main([*argv, "--dir", str(d)]) == 0, argv
    assert semq_main(["queue", "get", "--dir", str(d), "nope"]) == 2
    assert capsys.readouterr().err.endswith("error: no queue 'nope' (create it first: semq queue create nope)\n")
