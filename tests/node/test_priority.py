"""Priorities (seed 001): 0-9, higher first, in the origin's send queue and
in the platform's stored queue; acceptance order within a priority. Real
processes: B's inbox order (inbox id) is what its applications see."""

from __future__ import annotations

import random

import pytest

from semq.node.api import NodeClient
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def send_mixed(c: Cluster, n: int, seed: str) -> list[tuple[int, int]]:
    """n documents of random priorities 0-9 in one transaction; returns
    (record id, priority) in acceptance order."""
    rng = random.Random(seed)
    prios = [rng.randint(0, 9) for _ in range(n)]
    with NodeClient(c.root / A) as node:
        lks = node.send_many([dict(to=B, data=f"{seed}-{i}".encode(), data_type="ORDER", priority=p)
                              for i, p in enumerate(prios)])
    return [(lk.record_id, p) for lk, p in zip(lks, prios, strict=True)]


def expected(sent: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(sent, key=lambda rp: (-rp[1], rp[0]))


def inbox_order(c: Cluster) -> list[tuple[int, int]]:
    return [(r, p) for r, p in c.q(B, "SELECT record_id, priority FROM inbox ORDER BY id")]


def test_stored_queue_delivers_higher_priority_first_then_acceptance_order(cluster: Cluster) -> None:
    """B offline: two batches are stored at the platform one after the
    other; when B comes up, all of the second batch's high-priority
    documents overtake the first batch's low-priority ones."""
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    first = send_mixed(cluster, 30, "first")
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 30, 30, "batch 1 stored")
    second = send_mixed(cluster, 30, "second")
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 60, 30, "batch 2 stored")
    sent = first + second
    assert {p for _, p in first} & {p for _, p in second}, "the seeds give shared priorities"
    cluster.start_node(B)
    wait_until(lambda: len(inbox_order(cluster)) == 60, 30, "all 60 in B's inbox")
    assert inbox_order(cluster) == expected(sent)
    assert cluster.q(B, "SELECT DISTINCT priority FROM inbox ORDER BY 1") == [(p,) for p in sorted({p for _, p in sent})]


def test_priority_out_of_range_is_refused_at_send(cluster: Cluster) -> None:
    cluster.add_org(A)
    from semq.umxt_protocol import LocalProtocolError

    with NodeClient(cluster.root / A) as node, pytest.raises(LocalProtocolError, match="priority"):
        node.send(B, b"x", data_type="ORDER", priority=10)
