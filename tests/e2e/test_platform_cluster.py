"""Several platform instances on one PostgreSQL store, as real processes
on 127.0.0.1 (a real PostgreSQL server: SEMQ_TEST_PG, or a throwaway
cluster of the test session's own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from tests._procs import Cluster, doc_key, read_status, wait_until
from tests.e2e.test_e2e_flow import send

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77000"


def _pg_cluster(tmp_path: Path, url: str, platforms: int = 2, **kw: object) -> Cluster:
    return Cluster(tmp_path, store=url, platforms=platforms, **kw)  # type: ignore[arg-type]


def _start(c: Cluster, *placed: tuple[str, int]) -> None:
    """Both instances, and the nodes of (organization, its instance) pairs."""
    for org, instance in placed:
        c.add_org(org, instance=instance)
    c.start_platform(instance=1)
    c.start_platform(instance=2)
    for org, _ in placed:
        c.start_node(org)


def _wait_sessions(c: Cluster, placed: dict[str, int], timeout: float = 30) -> None:
    """Until each organization's node says it is connected (its status.json)
    and the shared store's presence table, by which every instance routes,
    has it at its instance (1, 2...)."""
    want = {org: f"127.0.0.1:{c.ports[i - 1]}" for org, i in placed.items()}
    wait_until(lambda: all(read_status(c.root / org).get("connected") and _connected_at(c, org) == at
                           for org, at in want.items()), timeout,
               "the sessions of " + ", ".join(f"{org} at instance {i}" for org, i in placed.items()))


def test_two_instances_on_one_store_deliver_across_each_other(tmp_path: Path, pg_url: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    c = _pg_cluster(tmp_path, pg_url)
    try:
        c.add_org(C, instance=2)  # (started later)
        _start(c, (A, 1), (B, 2))
        # SaveFwd 1 is dropped for a target that is not online, rightly: the
        # documents go only once A's session is up at instance 1 and B's at
        # instance 2 (a node says "running" before its session is).
        _wait_sessions(c, {A: 1, B: 2})
        # A (on instance 1) to B (on instance 2): stored, 2 woken, delivered;
        # SaveFwd 1 too (B is online, though not on A's instance).
        sent = send(c, A, B, 40)
        sent |= send(c, A, B, 10, save_fwd=1, key_prefix="F")
        # and back, with B's answers on instance 2 to A on instance 1
        back = send(c, B, A, 20, key_prefix="R")
        wait_until(lambda: len(c.inbox(B)) == 50 and len(c.inbox(A)) == 20, 30, "every document delivered")
        assert c.inbox(B) == sent and c.inbox(A) == back
        # C is offline: stored in the shared store, delivered when it connects to instance 2
        later = send(c, A, C, 15)
        wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE target_id=?", C) == 15, 20, "stored for C")
        # the operator's console of either instance reads the shared store
        capsys.readouterr()
        assert semq_main(["admin", "list", "--dir", str(tmp_path / "P2"), "--target", C, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed["count"] == 15 and {r["target"] for r in listed["rows"]} == {C}
        assert semq_main(["admin", "stuck", "--dir", str(tmp_path / "P"), "--older-than", "0s"]) == 0
        assert semq_main(["admin", "status", "--dir", str(tmp_path / "P")]) == 0
        assert "instance 127.0.0.1:" in capsys.readouterr().out
        c.start_node(C)
        wait_until(lambda: len(c.inbox(C)) == 15, 30, "C's inbox")
        assert c.inbox(C) == later
        wait_until(lambda: c.settled([A, B, C]), 30, "every table cleaned up")
        presence = c.q("P", "SELECT node_id, instance FROM presence ORDER BY node_id")
        assert [n for n, _ in presence] == [A, B, C] and len({i for _, i in presence}) == 2
        # the operator sees the instances and what each holds
        capsys.readouterr()
        assert semq_main(["status", "--dir", str(tmp_path / "P2")]) == 0
        text = capsys.readouterr().out
        assert "(PostgreSQL); instances:" in text and "password" not in text
        p1, p2 = (f"127.0.0.1:{p}" for p in c.ports)
        assert f"{p1:<22} running" in text and f"{p2:<22} running" in text and "holds 1 organization(s)" in text and "holds 2 organization(s)" in text
    finally:
        c.stop_all()


def test_a_postgresql_restart_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """The server stops (fast: sessions cut) for two seconds while documents
    flow across two instances: the instances wait and resume, and every
    document arrives exactly once (nothing acknowledged was lost)."""
    from semq.testing.pgserver import throwaway_pg

    with throwaway_pg() as server:  # (its own: this test restarts it)
        url = server.create_database("semq")
        c = _pg_cluster(tmp_path / "run", url)
        try:
            _start(c, (A, 1), (B, 2))
            sent = send(c, A, B, 200)
            server.restart(down_s=2.0)
            sent |= send(c, A, B, 200, key_prefix="T")
            wait_until(lambda: len(c.inbox(B)) == 400, 90, "every document delivered after the restart")
            assert c.inbox(B) == sent
            wait_until(lambda: c.settled([A, B]), 60, "every table cleaned up")
        finally:
            c.stop_all()


def _connected_at(c: Cluster, org: str) -> str | None:
    """The instance holding ``org``'s connection (presence), or None."""
    rows = c.q("P", "SELECT i.address FROM presence p JOIN instances i ON i.id = p.instance WHERE p.node_id=?", org)
    return rows[0][0] if rows else None


def test_sigkill_of_one_instance_mid_stream_fails_over_exactly_once(tmp_path: Path, pg_url: str) -> None:
    """Two instances, nodes spread over them (each knows both addresses);
    one instance is SIGKILLed during a stream of 2,000 documents (SaveFwd 3,
    Ack2): its nodes reconnect to the other within a bound, and every
    document is delivered exactly once."""
    import threading
    import time

    c = _pg_cluster(tmp_path, pg_url)
    try:
        c.add_org(A, prefer=1)
        c.add_org(B, prefer=2)
        c.add_org(C, prefer=1)
        c.start_platform(instance=1)
        c.start_platform(instance=2)
        for o in (A, B, C):
            c.start_node(o)
        p1, p2 = (f"127.0.0.1:{p}" for p in c.ports)
        wait_until(lambda: [_connected_at(c, o) for o in (A, B, C)] == [p1, p2, p1], 20, "nodes spread over both")
        sent: dict[str, bytes] = {}
        to_c: dict[str, bytes] = {}

        def stream() -> None:
            for i in range(20):
                sent.update(send(c, A, B, 50, key_prefix=f"A{i:02d}-", save_fwd=3, ack2=True))
                to_c.update(send(c, B, C, 50, key_prefix=f"B{i:02d}-", save_fwd=3, ack2=True))
                time.sleep(0.05)

        t = threading.Thread(target=stream)
        t.start()
        wait_until(lambda: len(c.inbox(B)) >= 200, 60, "the stream under way")
        killed = time.monotonic()
        c.kill("P")  # instance 1: A's and C's
        wait_until(lambda: _connected_at(c, A) == p2 and _connected_at(c, C) == p2, 30,
                   "A and C reconnected to instance 2")
        reconnect_s = time.monotonic() - killed
        t.join(120)
        assert not t.is_alive()
        wait_until(lambda: len(c.inbox(B)) == 1000 and len(c.inbox(C)) == 1000, 120, "every document delivered")
        assert c.inbox(B) == sent and c.inbox(C) == to_c  # (inbox() fails on a document twice)
        wait_until(lambda: c.settled([A, B, C]), 60, "every table cleaned up")
        print(f"nodes reconnected to the other instance {reconnect_s:.1f} s after the SIGKILL")
        assert reconnect_s < 30
    finally:
        c.stop_all()


def test_units_of_a_node_across_two_instances(tmp_path: Path, pg_url: str) -> None:
    """B runs as 2 units on instance 2, A on instance 1: A's documents reach
    the unit their LK0 picks through the hand-over between instances (and
    through the shared store while B is offline), B's units answer A, and
    every document arrives once."""
    from semq.node.api import NodeClient
    from semq.umxt_protocol import LK0, Endpoint
    from semq.umxt_protocol.units import holder

    c = _pg_cluster(tmp_path, pg_url)
    try:
        c.add_org(A, instance=1)
        c.add_org(B, instance=2, units=2)
        c.start_platform(instance=1)
        c.start_platform(instance=2)
        c.start_node(A)
        c.start_node(B)
        sent = send(c, A, B, 200)
        back: dict[str, bytes] = {}
        with NodeClient(tmp_path / B) as node:  # from both of B's units
            for i in range(4):
                lks = node.send_many([dict(to=A, data=b"r%d-%d" % (i, j), key=f"R{i}-{j}") for j in range(25)])
                back |= {doc_key(B, lk.semq_id, lk.record_id): b"r%d-%d" % (i, j) for j, lk in enumerate(lks)}
        wait_until(lambda: len(c.inbox(B)) == 200 and len(c.inbox(A)) == 100, 60, "every document delivered")
        assert c.inbox(B) == sent and c.inbox(A) == back
        # Each unit holds exactly the documents its LK0s pick.
        for unit in (1, 2):
            conn = c.db(B, unit)
            try:
                rows = conn.execute("SELECT record_id FROM inbox").fetchall()
            finally:
                conn.close()
            assert rows and all(holder(LK0(endpoint=Endpoint.org(A), record_id=r), 2) == unit for (r,) in rows)
        # B offline: stored for each unit in the shared store, delivered when they return.
        c.kill(B, 15)
        later = send(c, A, B, 60, key_prefix="L")
        wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 60, 30, "stored for B")
        c.start_node(B)
        wait_until(lambda: len(c.inbox(B)) == 260, 60, "the stored documents delivered")
        assert {k: v for k, v in c.inbox(B).items() if k in later} == later
        wait_until(lambda: c.settled([A, B]), 60, "every table cleaned up")
        units = c.q("P", "SELECT units FROM nodes WHERE node_id=?", B)
        assert units == [(2,)]
    finally:
        c.stop_all()


def test_a_large_document_crosses_instances_and_waits_in_the_shared_store(tmp_path: Path, pg_url: str) -> None:
    """A large document from A (on instance 1) to B (on instance 2): its
    chunks, too large to hand over one hop, go through the shared store and
    instance 2 delivers them; then one for B while B is away, delivered by
    whichever instance B comes back to, with its origin stopped."""
    import hashlib
    import signal

    from tests.e2e.test_large import _content, _delivered, _send

    c = _pg_cluster(tmp_path, pg_url)
    try:
        _start(c, (A, 1), (B, 2))
        first = tmp_path / "first.bin"
        digests = {_content(first, 12)}
        assert _send(c, first).returncode == 0
        wait_until(lambda: len(_delivered(c)) == 1, 90, "the first large document at B")
        c.kill(B, signal.SIGTERM)
        second = tmp_path / "second.bin"
        digests.add(_content(second, 9))
        assert _send(c, second).returncode == 0
        wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=12") == 9, 60,
                   "the chunks kept in the shared store")
        assert not (tmp_path / "P" / "chunks").exists() and not (tmp_path / "P2" / "chunks").exists()
        c.kill(A, signal.SIGTERM)
        c.start_node(B)
        wait_until(lambda: len(_delivered(c)) == 2, 90, "the second large document at B, its origin away")
        assert {hashlib.sha256(p.read_bytes()).hexdigest() for p, _, _ in _delivered(c)} == digests
        wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=12") == 0, 30, "the chunks gone")
    finally:
        c.stop_all()
