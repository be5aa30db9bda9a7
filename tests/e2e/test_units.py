"""A node of several units (semq.umxt_protocol.units), as real processes on 127.0.0.1:
the platform spreads an organization's documents over its units by LK0,
each unit answers for its own records, and every document arrives exactly
once, also when a unit is SIGKILLed mid-stream and its supervisor starts it
again."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from semq.node.api import NodeClient
from tests._procs import Cluster, doc_key, read_status, wait_until
from tests.e2e.test_e2e_flow import send

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def _send_spread(c: Cluster, org: str, to: str, n: int, calls: int, **kw: object) -> dict[str, bytes]:
    """``n`` documents in ``calls`` sends of one client (each a transaction,
    each to the next unit of a node of several)."""
    sent: dict[str, bytes] = {}
    per = n // calls
    with NodeClient(c.root / org) as node:
        for i in range(calls):
            docs = [dict(to=to, data=f"{org}-{i}-{j}".encode() * 3, data_type="ORDER", key=f"K{i}-{j}", **kw)
                    for j in range(per)]
            for lk, d in zip(node.send_many(docs), docs, strict=True):
                sent[doc_key(lk.endpoint.node_id, lk.semq_id, lk.record_id)] = d["data"]  # type: ignore[assignment]
    return sent


def _start(c: Cluster, units: int) -> None:
    """The platform, A (one unit) and B (``units`` units), running."""
    c.add_org(A)
    c.add_org(B, units=units)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)


def _unit_pid(c: Cluster, org: str, unit: int) -> int:
    """The pid of a running unit (its status.json, rewritten every second)."""
    d = c.unit_dir(org, unit)
    return int(wait_until(lambda: read_status(d).get("pid"), 20, f"unit {unit} of {org} to report its pid"))


def _per_unit(c: Cluster, org: str, sql: str) -> list[int]:
    out = []
    for unit in range(1, c.units[org] + 1):
        conn = c.db(org, unit)
        try:
            out.append(int(conn.execute(sql).fetchone()[0]))
        finally:
            conn.close()
    return out


def test_two_units_share_the_documents_both_ways(cluster: Cluster) -> None:
    _start(cluster, 2)
    to_b = _send_spread(cluster, A, B, 400, 4)
    to_a = _send_spread(cluster, B, A, 200, 4)  # from B's two units in turn
    wait_until(lambda: len(cluster.inbox(B)) == 400 and len(cluster.inbox(A)) == 200, 60, "every document delivered")
    assert cluster.inbox(B) == to_b
    assert cluster.inbox(A) == to_a
    # Each unit got a share of A's documents (spread by LK0), and sent some.
    got = _per_unit(cluster, B, "SELECT count(*) FROM inbox")
    assert sum(got) == 400 and min(got) > 100, got
    units = {int(k.split("/")[1]) if k.count("/") == 2 else 1 for k in to_a}
    assert units == {1, 2}, units
    wait_until(lambda: cluster.settled([A, B]), 60, "every table cleaned up")
    with NodeClient(cluster.root / B) as node:
        assert node.units == 2
        items = node.inbox(unread=True, limit=10_000)
        assert len(items) == 400 and len({i.id for i in items}) == 400
        assert {i.unit for i in items} == {1, 2}
        first = node.get(items[0].id)
        assert first.app_data == items[0].app_data
        assert node.acknowledge([i.id for i in items[:10]]) == 10
        assert len(node.inbox(unread=True, limit=10_000)) == 390
        st = node.status()
        assert st["inbox_unread"] == 390 and len(st["units"]) == 2
        assert st["inbox_total"] == sum(u["inbox_total"] for u in st["units"]) == 400


def test_documents_for_an_offline_unit_are_stored_and_delivered_to_it(cluster: Cluster) -> None:
    _start(cluster, 2)
    send(cluster, A, B, 10)
    wait_until(lambda: len(cluster.inbox(B)) == 10, 30, "B's units online (10 delivered)")
    cluster.kill(B, signal.SIGTERM)  # the supervisor stops both units
    sent = send(cluster, A, B, 300, key_prefix="L", save_fwd=2)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 300, 30,
               "300 stored for B")
    targets = {t for (t,) in cluster.q("P", "SELECT DISTINCT target_id FROM stored WHERE kind=1")}
    assert targets == {B, f"{B}:2"}, targets
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 310, 60, "the stored documents delivered")
    assert {k: v for k, v in cluster.inbox(B).items() if k in sent} == sent
    wait_until(lambda: cluster.settled([A, B]), 60, "every table cleaned up")


@pytest.mark.parametrize("units", [2, 3])
def test_a_unit_killed_mid_stream_loses_and_duplicates_nothing(cluster: Cluster, units: int) -> None:
    _start(cluster, units)
    victim = _unit_pid(cluster, B, units)
    sent: dict[str, bytes] = {}
    back: dict[str, bytes] = {}
    done = threading.Event()

    def stream() -> None:
        for i in range(20):
            sent.update(send(cluster, A, B, 100, key_prefix=f"M{i}-"))
            back.update(send(cluster, B, A, 25, key_prefix=f"R{i}-"))
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    wait_until(lambda: len(cluster.inbox(B)) >= 300, 60, "the stream under way")
    import os

    os.kill(victim, signal.SIGKILL)
    t.join(timeout=120)
    assert done.is_set()
    # The supervisor starts the unit again; nothing is lost or doubled
    # (Cluster.inbox fails on a document twice).
    wait_until(lambda: _unit_pid(cluster, B, units) != victim, 30, f"unit {units} started again")
    wait_until(lambda: len(cluster.inbox(B)) == 2000 and len(cluster.inbox(A)) == 500, 120,
               "every document delivered")
    assert cluster.inbox(B) == sent
    assert cluster.inbox(A) == back
    log = (cluster.root / f"{B}.log").read_text()
    assert f"unit {units} of node {B} exited" in log
    wait_until(lambda: cluster.settled([A, B]), 120, "every table cleaned up")


def test_units_are_set_at_init(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    from semq.cli import main as semq_main
    from tests._procs import set_config

    cluster.add_org(B, units=2)
    d: Path = cluster.root / B
    assert (d / "unit-2" / "node.sqlite").exists()
    assert "units = 2" in (d / "semq.toml").read_text()
    capsys.readouterr()
    # A node of several units takes no direct links.
    assert semq_main(["node", "init", "--dir", str(cluster.root / "x"), "--org", "77000", "--no-security",
                      "--units", "2", "--listen", "127.0.0.1:0"]) == 2
    assert "--units 2" in capsys.readouterr().err and not (cluster.root / "x").exists()
    assert semq_main(["node", "init", "--dir", str(cluster.root / "y"), "--org", "77000", "--no-security",
                      "--units", "33"]) == 2
    assert "--units 33 is out of range; allowed: an integer 1..32" in capsys.readouterr().err
    # More units in the file than stores: refused with the reason, nothing started.
    set_config(d, units=3)
    assert semq_main(["node", "run", "--dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert "unit 3 has no store" in err and "semq node init --units N" in err


def test_admin_backup_and_restore_take_every_unit(cluster: Cluster, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import sqlite3
    import tarfile

    from semq.cli import main as semq_main

    cluster.add_org(A)
    cluster.add_org(B, units=2)
    cluster.start_platform()
    cluster.start_node(B)
    d = cluster.root / B
    _send_spread(cluster, B, A, 40, 4, save_fwd=2)  # A is offline: stored, then SS_ACK at B's units
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 40, 30, "40 stored for A")
    capsys.readouterr()
    # The admin console answers for both units as one node.
    assert semq_main(["admin", "status", "--dir", str(d), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert [u["unit"] for u in st["units"]] == [1, 2]
    assert semq_main(["admin", "list", "--dir", str(d), "--json", "--limit", "100"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows["count"] == 40 and {r["unit"] for r in rows["rows"]} == {1, 2}
    unit2 = next(r for r in rows["rows"] if r["unit"] == 2)
    assert unit2["lk0"].startswith(f"{B}/2/1/")
    assert semq_main(["admin", "show", "--dir", str(d), "--json", unit2["lk0"]]) == 0
    assert json.loads(capsys.readouterr().out)["unit"] == 2
    assert semq_main(["admin", "list", "--dir", str(d), "--json", "--unit", "2"]) == 0
    assert {r["lk0"].split("/")[1] for r in json.loads(capsys.readouterr().out)["rows"]} == {"2"}
    assert semq_main(["status", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "2 units" in out and "unit 1: running" in out and "unit 2: running" in out
    # A backup while running holds both stores; restore puts both back.
    archive = tmp_path / "b.tar"
    assert semq_main(["backup", "--dir", str(d), "--out", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("semq-backup.json"))  # type: ignore[arg-type]
    assert {"node.sqlite", "unit-2/node.sqlite"} <= names
    assert set(manifest["stores"]) == {"node.sqlite", "unit-2/node.sqlite"}
    assert semq_main(["restore", str(archive), "--dir", str(d), "--force"]) == 2  # running: refused
    # 'semq admin stop' stops every unit, and with them the node (exit 0, not started again).
    assert semq_main(["admin", "stop", "--dir", str(d), "--wait", "30"]) == 0
    assert cluster.procs.pop(B).p.wait(timeout=30) == 0
    assert not (d / "unit-2" / "status.json").exists()
    assert semq_main(["restore", str(archive), "--dir", str(d), "--force"]) == 0
    for unit in (1, 2):
        conn = sqlite3.connect(cluster.unit_dir(B, unit) / "node.sqlite")
        try:
            assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 20
            inc = json.loads(conn.execute("SELECT value FROM meta WHERE key='incarnation'").fetchone()[0])
            assert inc["reason"] == "restore"
        finally:
            conn.close()


def test_requests_replies_and_dead_letters_across_units(cluster: Cluster) -> None:
    """Requests and replies find each other whichever unit holds them; the
    dead letters of every unit are one list."""
    from semq.node.features import rpc
    from semq.node.features.dead import DeadLetters

    _start(cluster, 2)
    with NodeClient(cluster.root / A) as a, NodeClient(cluster.root / B) as b:
        # A asks B 20 times: the requests land in both of B's units.
        asked = [rpc.send_request(a, B, b"q%d" % i, data_type="PRICE", timeout=60) for i in range(20)]
        got = wait_until(lambda: (lambda r: r if len(r) == 20 else None)(rpc.incoming(b)), 60, "20 requests at B")
        assert {item.unit for item, _ in got} == {1, 2}
        for item, answered in got:
            assert answered is None
            rpc.reply(b, item.id, b"answer to " + item.app_data)
        assert rpc.incoming(b) == []
        for lk in asked:
            r = rpc.wait_reply(a, lk, timeout=60)
            assert r.item.app_data.startswith(b"answer to q")
        # B asks A: the replies come back to whichever unit holds them.
        back = [rpc.send_request(b, A, b"b%d" % i, data_type="STOCK", timeout=60) for i in range(20)]
        incoming = wait_until(lambda: (lambda r: r if len(r) == 20 else None)(rpc.incoming(a)), 60,
                              "20 requests at A")
        for item, _ in incoming:
            rpc.reply(a, item.id, b"re " + item.app_data)
        replies = [rpc.wait_reply(b, lk, timeout=60) for lk in back]
        assert {r.item.unit for r in replies} == {1, 2}
        assert sorted(r.item.app_data for r in replies) == sorted(b"re b%d" % i for i in range(20))
        assert rpc.unmatched_replies(b) == []
        # Documents to an organization the platform does not know fail in both units.
        for _ in range(2):
            b.send_many([dict(to="99999", data=b"x")])
        dead = DeadLetters(b)
        letters = wait_until(lambda: (lambda d: d if len(d) == 2 else None)(dead.list()), 60, "2 dead letters")
        assert {d.lk0.semq_id for d in letters} == {1, 2}
        assert dead.purge([str(letters[1].lk0)]) == 1
        assert dead.purge() == 1 and dead.list() == []


def test_units_outlive_idle_threads_and_stop_when_their_supervisor_dies(cluster: Cluster) -> None:
    """The units keep running long after they started (nothing tied to the
    thread that started them), and stop by themselves when the supervisor
    is SIGKILLed (no unit left behind holding its store)."""
    import os
    import time

    cluster.add_org(B, units=2)
    cluster.start_platform()
    cluster.start_node(B)
    pids = [_unit_pid(cluster, B, u) for u in (1, 2)]
    time.sleep(12)  # past trio's idle worker-thread lifetime (10 s)
    assert [_unit_pid(cluster, B, u) for u in (1, 2)] == pids

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        st = Path(f"/proc/{pid}/stat").read_text().split()
        return st[2] != "Z"

    assert all(alive(p) for p in pids)
    cluster.kill(B)  # SIGKILL of the supervisor
    wait_until(lambda: not any(alive(p) for p in pids), 20, "both units stopped")


def test_documents_stored_before_a_node_of_units_first_connects_arrive_once(cluster: Cluster) -> None:
    """The platform learns that B runs units from B's first connection; what
    was stored for B before it goes to the unit each document's LK0 picks."""
    from semq.umxt_protocol import LK0, Endpoint
    from semq.umxt_protocol.units import holder

    cluster.add_org(A)
    cluster.add_org(B, units=2)
    cluster.start_platform()
    cluster.start_node(A)
    sent = send(cluster, A, B, 200)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 200, 30, "stored for B")
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 200, 60, "every document delivered")
    assert cluster.inbox(B) == sent
    for unit in (1, 2):
        conn = cluster.db(B, unit)
        try:
            recs = [r for (r,) in conn.execute("SELECT record_id FROM inbox")]
        finally:
            conn.close()
        assert recs and all(holder(LK0(endpoint=Endpoint.org(A), record_id=r), 2) == unit for r in recs)
    wait_until(lambda: cluster.settled([A, B]), 60, "every table cleaned up")
