"""Tracking, as real processes on 127.0.0.1 with security on: after the
stores have cleaned a confirmed document, ``semq track`` still answers
where it went and when — at the origin (every step, the receipt it was
confirmed with), at the receiver, and at the platform (the relay's view,
without the AppKey, which travels sealed)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.tracking.history import HistoryReader, history_paths
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def _track(capsys: Any, directory: Any, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = semq_main(["track", "--dir", str(directory), *args])
    return rc, capsys.readouterr().out


def _state(directory: Any, lk0: str, role: str) -> str | None:
    r = HistoryReader(history_paths(directory))
    try:
        rows = [d for d in r.document(lk0) if d["role"] == role]
    finally:
        r.close()
    return rows[0]["state"] if rows else None


def test_track_answers_where_a_confirmed_document_went_after_the_stores_cleaned_it(
        cluster: Cluster, capsys: Any) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    with NodeClient(c.root / A) as node:
        lk0s = [str(node.send(B, f"<invoice n='{i}'/>".encode(), data_type="INVOICE", key=f"INV-{i:04d}"))
                for i in range(40, 43)]
    wait_until(lambda: c.settled([A, B]), 30, "the documents confirmed and cleaned")
    assert c.count(A, "SELECT count(*) FROM outbox") == 0
    wait_until(lambda: _state(c.root / A, lk0s[2], "origin") == "ack2", 10, "the origin's history")
    wait_until(lambda: _state(c.root / B, lk0s[2], "receiver") in ("ack2_sent", "inbox"), 10, "the receiver's")

    # The origin: the timeline of one document, by its key.
    rc, out = _track(capsys, c.root / A, "INV-0042")
    assert rc == 0, out
    assert out.splitlines()[0].startswith(f"{lk0s[2]}  out to {B}  key INVOICE / INV-0042")
    for step in ("queued", "sent", "ack_fwd", "ack2", "cleaned"):
        assert re.search(rf"  [a-z ,]+ \({step}\)( |$)", out, re.M), step
    assert "path relay" in out and f"receipt verified: signed by {B} at " in out
    # As JSON, with the digest the receiver's receipt confirmed.
    rc, out = _track(capsys, c.root / A, lk0s[2], "--json")
    [row] = json.loads(out)
    assert (row["role"], row["state"], row["counterpart"], row["key"], row["path"]) == (
        "origin", "ack2", B, "INV-0042", "relay")
    assert len(row["receipt"]) == 64 and row["receipt_check"]["verified"] is True
    # All three, newest first; none failed.
    rc, out = _track(capsys, c.root / A, "--to", B, "--since", "1h")
    assert rc == 0 and [line.split()[3] for line in out.splitlines()[1:]] == lk0s[::-1]
    assert _track(capsys, c.root / A, "--state", "nack")[0] == 1

    # The receiver: the same document, from the other side.
    rc, out = _track(capsys, c.root / B, "INV-0042", "--json")
    [got] = json.loads(out)
    assert (got["role"], got["counterpart"], got["key"]) == ("receiver", A, "INV-0042")
    assert {"received", "inbox"} <= {s["event"] for s in got["steps"]}

    # The platform: the relay's view, no AppKey (sealed inside the document).
    wait_until(lambda: _state(c.root / "P", lk0s[2], "platform") is not None, 10, "the platform's history")
    rc, out = _track(capsys, c.root / "P", lk0s[2], "--json")
    [relay] = json.loads(out)
    assert relay["role"] == "platform" and relay["key"] is None and relay["target"] == B
    assert "forwarded" in {s["event"] for s in relay["steps"]}
    assert _track(capsys, c.root / "P", "INV-0042")[0] == 1  # the relay cannot search by a key it never saw

    # A stopped daemon's history still answers.
    c.kill(A, signal.SIGTERM)
    rc, out = _track(capsys, c.root / A, "INV-0041")
    assert rc == 0 and lk0s[1] in out


def _indexers(parent: int) -> list[int]:
    """The history indexer processes whose parent is ``parent``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"semq.tracking.history" in cmd and (ppid == parent or parent == 0):
            out.append(int(d.name))
    return out


def test_the_history_is_indexed_at_idle_priority_and_its_indexer_ends_with_its_daemon(cluster: Cluster) -> None:
    c = cluster
    c.add_org(A)
    c.start_platform()
    node = c.start_node(A)
    [pid] = wait_until(lambda: _indexers(node.p.pid), 10, "the node's history indexer")
    # It runs only on CPU time nothing else wants: delivery never waits for it.
    wait_until(lambda: os.sched_getscheduler(pid) == os.SCHED_IDLE, 10, "the indexer at idle priority")
    [ppid] = wait_until(lambda: _indexers(c.procs["P"].p.pid), 10, "the platform's history indexer")
    # A daemon killed outright leaves no indexer behind.
    c.kill(A)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or b"semq.tracking.history" not in
               Path(f"/proc/{pid}/cmdline").read_bytes(), 10, "the indexer to end with its daemon")
    # ... and one stopped cleanly stops its own.
    c.kill("P", signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{ppid}").exists() or b"semq.tracking.history" not in
               Path(f"/proc/{ppid}/cmdline").read_bytes(), 10, "the platform's indexer to stop")


def test_a_node_of_several_units_has_one_history_of_every_unit(cluster: Cluster, capsys: Any) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B, units=2)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    with NodeClient(c.root / A) as node:
        lk0s = [str(lk0) for lk0 in node.send_many([{"to": B, "data": b"<doc/>", "key": f"U-{i}"} for i in range(12)])]
    wait_until(lambda: c.settled([A, B]), 30, "the documents confirmed and cleaned")
    # The platform gave them to both units of B; B's unit 1 indexes both units' logs.
    unit2 = c.db(B, 2)
    try:
        assert unit2.execute("SELECT count(*) FROM inbox").fetchone()[0] > 0
    finally:
        unit2.close()

    def received() -> set[str]:
        r = HistoryReader(history_paths(c.root / B))
        try:
            return {d["lk0"] for d in r.search(source=A, role="receiver", limit=100)}
        finally:
            r.close()

    wait_until(lambda: received() == set(lk0s), 15, "every unit's documents in B's history")
    rc, out = _track(capsys, c.root / B, "--from", A)
    assert rc == 0 and len(out.splitlines()) == 13
