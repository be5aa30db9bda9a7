"""End to end: real ``semq`` processes on 127.0.0.1 (SPEC "The flow")."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from semq.node.api import NodeClient
from tests._procs import Cluster, doc_key, wait_until

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77000"


def send(c: Cluster, org: str, to: str, n: int, *, size: int = 200, key_prefix: str = "S",
         **kw: object) -> dict[str, bytes]:
    rng = random.Random(f"{org}{to}{n}" + ("" if key_prefix == "S" else key_prefix))
    with NodeClient(c.root / org) as node:
        docs = [dict(to=to, data=rng.randbytes(rng.randint(1, size)), data_type="ORDER", domain="trade",
                     key=f"{key_prefix}{i:04d}", **kw) for i in range(n)]
        lks = node.send_many(docs)
    return {doc_key(lk.endpoint.node_id, lk.semq_id, lk.record_id): d["data"]  # type: ignore[misc]
            for lk, d in zip(lks, docs, strict=True)}


def test_online_delivery_reaches_ack2_and_cleans_up(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    sent = send(cluster, A, B, 40)
    wait_until(lambda: len(cluster.inbox(B)) == 40, 30, "40 documents in B's inbox")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 30, "all tables cleaned up")
    events = (cluster.root / A / "events").glob("*.jsonl")
    text = "".join(p.read_text() for p in events)
    assert text.count('"event":"ack2"') == 40 and text.count('"event":"ack_fwd"') == 40


def test_offline_target_is_stored_then_delivered_once(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    sent = send(cluster, A, B, 60)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 60, 30, "60 stored at P")
    # ACK_SAVE -> SS_ACK; Ack2 asked, so A keeps the rows until B confirms.
    wait_until(lambda: cluster.q(A, "SELECT DISTINCT state FROM outbox") == [(3,)], 30, "A at SS_ACK")
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 60, 30, "B's inbox")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 30, "cleanup everywhere")


def test_savefwd1_to_offline_target_is_dropped_and_origin_told(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    send(cluster, A, B, 3, save_fwd=1, ack2=False)
    rows = wait_until(lambda: [r for r in cluster.q(A, "SELECT state, code FROM outbox") if r[0] == 9] or None
                      if len(cluster.q(A, "SELECT state FROM outbox WHERE state=9")) == 3 else None,
                      20, "three SS_FAILED rows")
    assert all(code == 301 for _, code in rows)
    assert cluster.count("P", "SELECT count(*) FROM stored") == 0


def test_savefwd3_waits_at_origin_while_platform_is_down(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_node(A)  # no platform yet
    sent = send(cluster, A, B, 10)
    time.sleep(1.5)
    assert cluster.q(A, "SELECT DISTINCT state FROM outbox") == [(0,)]
    cluster.start_platform()
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 10, 30, "delivery after the platform came up")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 30, "cleanup")


def test_sigkill_platform_holding_stored_messages(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    sent = send(cluster, A, B, 80)
    wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox WHERE state=3") == 80, 30, "all ACK_SAVE'd")
    cluster.kill("P", signal.SIGKILL)
    cluster.start_platform()
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 80, 40, "all stored copies delivered after the restart")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 40, "cleanup")


def test_sigkill_nodes_mid_stream_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(B)
    sent = send(cluster, A, B, 600, size=1024)
    cluster.start_node(A)
    wait_until(lambda: len(cluster.inbox(B)) > 50, 30, "some delivered")
    cluster.kill(B, signal.SIGKILL)  # acks in flight are lost
    wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox WHERE state=0") < 550, 30, "A progressing")
    cluster.kill(A, signal.SIGKILL)
    cluster.start_node(A)
    time.sleep(0.5)
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 600, 60, "all 600 after the kills")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")


def test_thousand_documents_among_three_orgs(cluster: Cluster) -> None:
    orgs = (A, B, C)
    for o in orgs:
        cluster.add_org(o)
    cluster.start_platform()
    for o in orgs:
        cluster.start_node(o)
    expected: dict[str, dict[str, bytes]] = {o: {} for o in orgs}
    pairs = [(a, b) for a in orgs for b in orgs if a != b]
    threads = []
    results: dict[tuple[str, str], dict[str, bytes]] = {}

    def go(a: str, b: str, n: int) -> None:
        results[(a, b)] = send(cluster, a, b, n, size=2048, save_fwd=random.Random(a + b).choice([2, 3]))

    for i, (a, b) in enumerate(pairs):
        threads.append(threading.Thread(target=go, args=(a, b, 167 if i < 4 else 166)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for (_a, b), docs in results.items():
        expected[b].update(docs)
    assert sum(len(v) for v in expected.values()) == 1000
    for o in orgs:
        wait_until(lambda o=o: len(cluster.inbox(o)) == len(expected[o]), 60, f"{o}'s inbox")  # type: ignore[misc]
        assert cluster.inbox(o) == expected[o]
    wait_until(lambda: cluster.settled(list(orgs)), 60, "cleanup")


def test_sigterm_stops_each_daemon_with_exit_0_and_loses_nothing(cluster: Cluster) -> None:
    """``kill`` (SIGTERM) while documents stream: each daemon lets the store
    call in progress finish, removes its status file and exits 0; started
    again, the daemons deliver every document exactly once."""
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    sent: dict[str, bytes] = {}
    stop = threading.Event()

    def stream() -> None:  # A's application hands over 10 documents every 20 ms
        i = 0
        while not stop.is_set():
            sent.update(send(cluster, A, B, 10, size=1024, key_prefix=f"T{i}"))
            i += 1
            time.sleep(0.02)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(cluster.inbox(B)) >= 20, 30, "some delivered")
        for name in (B, A, "P"):  # while documents, acks and commits are in flight
            time.sleep(0.2)
            assert cluster.kill(name, signal.SIGTERM) == 0, f"{name} did not exit 0 on SIGTERM"
            assert not (cluster.root / name / "status.json").exists()
    finally:
        stop.set()
        t.join(timeout=30)
    assert cluster.count(A, "SELECT count(*) FROM outbox") > 0, "nothing was in flight: nothing was tested"
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == len(sent), 60, f"all {len(sent)} after the restart")
    assert cluster.inbox(B) == sent
    wait_until(lambda: cluster.settled([A, B]), 60, "cleanup")
