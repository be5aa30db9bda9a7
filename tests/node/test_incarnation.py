"""A restored or re-created node store never reuses an LK0.

Receivers keep the LK0 of every document they delivered (the dedup table,
30 days) and suppress a document that comes again under one of them. A node
restored from an older backup, or initialised again for the same
organization, used to number its new documents from the old, low record ids
again: receivers took them for duplicates and dropped them, silently. Every
store incarnation (``semq node init``, ``semq restore``) now starts its
record ids at its creation time (``now_ms * 1000``;
docs/exactly-once.md)."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.ops.cli import main as ops_main
from tests._procs import Cluster, Proc, free_port, wait_until

A, B = "10008", "56001"


def send(c: Cluster, directory: Path, n: int, tag: str) -> dict[bytes, int]:
    """``n`` documents from the node in ``directory`` to B: {content: record id}."""
    with NodeClient(directory) as node:
        lks = node.send_many([dict(to=B, data=f"{tag} {i}".encode(), data_type="ORDER", key=f"{tag}{i}")
                              for i in range(n)])
    return {f"{tag} {i}".encode(): lk.record_id for i, lk in enumerate(lks)}


def delivered(c: Cluster) -> list[bytes]:
    """B's inbox contents from A (Cluster.inbox also asserts each LK0 once)."""
    return sorted(d for k, d in c.inbox(B).items() if k.startswith(f"{A}/"))


# ---------------------------------------------------------------- real processes


@pytest.mark.e2e
def test_documents_sent_after_a_restore_from_an_older_backup_all_arrive(cluster: Cluster,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    for o in (A, B):
        c.add_org(o)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    backup = c.root / "a-backup.tar.gz"
    assert ops_main(["backup", "--dir", str(c.root / A), "--out", str(backup)]) == 0  # while A runs

    first = send(c, c.root / A, 10, "before")
    wait_until(lambda: len(delivered(c)) == 10, 30, "the first 10 documents in B's inbox")
    wait_until(lambda: c.settled([A, B]), 30, "A's first 10 confirmed and cleaned up")

    assert c.kill(A, signal.SIGTERM) == 0
    assert ops_main(["restore", str(backup), "--dir", str(c.root / A), "--force"]) == 0
    c.start_node(A)
    second = send(c, c.root / A, 10, "after")

    wait_until(lambda: len(delivered(c)) == 20, 30, "all 20 documents in B's inbox")
    assert min(second.values()) > max(first.values())
    assert "new record ids start above" in capsys.readouterr().out
    wait_until(lambda: c.settled([A, B]), 30, "everything confirmed and cleaned up")
    assert delivered(c) == sorted([*first, *second])  # each once (Cluster.inbox checks)
    assert c.count(B, "SELECT count(*) FROM inbox") == 20
    with sqlite3.connect(str(c.root / A / "node.sqlite")) as conn:
        assert [h["reason"] for h in json.loads(conn.execute(
            "SELECT value FROM meta WHERE key='incarnations'").fetchone()[0])] == ["init", "restore"]


@pytest.mark.e2e
def test_a_node_initialised_again_for_the_same_organization_is_heard(plain_cluster: Cluster) -> None:
    """``semq node init`` on a fresh directory for an organization that has
    sent documents before (a lost disk, a move to another machine). Plain
    TCP: a second enrolment of the same organization is another matter
    (certificates); what is tested here is the record ids."""
    c = plain_cluster
    for o in (A, B):
        c.add_org(o)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    first = send(c, c.root / A, 10, "old")
    wait_until(lambda: len(delivered(c)) == 10, 30, "the old store's 10 documents in B's inbox")
    wait_until(lambda: c.settled([A, B]), 30, "confirmed and cleaned up")
    assert c.kill(A, signal.SIGTERM) == 0

    new = c.root / "A-new"
    assert semq_main(["node", "init", "--dir", str(new), "--org", A, "--platform", f"127.0.0.1:{c.port}",
                      "--no-security"]) == 0
    c.procs["A-new"] = Proc("A-new", ["node", "run", "--dir", str(new), "--inquiry-interval", c.iq],
                            c.root / "A-new.log", "running")
    second = send(c, new, 10, "new")
    wait_until(lambda: len(delivered(c)) == 20, 30, "the new store's documents in B's inbox too")
    assert min(second.values()) > max(first.values())
    assert delivered(c) == sorted([*first, *second])
    wait_until(lambda: c.count(B, "SELECT count(*) FROM inbound") == 0
               and c.count("P", "SELECT count(*) FROM stored") == 0, 30, "everything confirmed")


# ---------------------------------------------------------------- in process


def test_node_init_starts_the_ids_at_the_creation_time(tmp_path: Path) -> None:
    from semq.node.store import ID_RATE, id_floor, incarnation

    t0 = int(time.time() * 1000)
    assert semq_main(["node", "init", "--dir", str(tmp_path / A), "--org", A, "--no-security",
                      "--platform", f"127.0.0.1:{free_port()}"]) == 0
    with NodeClient(tmp_path / A) as node:
        (lk0,) = node.send_many([dict(to=B, data=b"x")])
        inc = incarnation(node.core.conn)
    t1 = int(time.time() * 1000)
    assert inc is not None and inc["reason"] == "init" and t0 <= inc["time_ms"] <= t1
    assert inc["floor"] == id_floor(inc["time_ms"]) == inc["time_ms"] * (ID_RATE // 1000)
    assert lk0.record_id == inc["floor"] + 1
    # the pending-ack ids (named by ACK and ACK2) start there too
    with sqlite3.connect(str(tmp_path / A / "node.sqlite")) as conn:
        seqs = dict(conn.execute("SELECT name, seq FROM sqlite_sequence"))
    assert seqs["inbound"] == inc["floor"] and seqs["outbox"] == inc["floor"] + 1


def test_an_incarnation_never_lowers_a_sequence_and_is_recorded(tmp_path: Path) -> None:
    from semq.node.store import begin_incarnation, incarnation, open_node_store

    db = open_node_store(tmp_path / "n.sqlite", create=True, synchronous="OFF")
    conn = db.connection()
    try:
        assert incarnation(conn) is None  # a store made without one (as before this version)
        begin_incarnation(conn, "init", now_ms=2_000)
        assert next(iter(conn.execute("SELECT seq FROM sqlite_sequence WHERE name='outbox'")))[0] == 2_000_000
        conn.execute("UPDATE sqlite_sequence SET seq=5000000000 WHERE name='outbox'")
        begin_incarnation(conn, "restore", now_ms=3_000)  # a clock behind the store's ids: max wins
        seqs = dict(conn.execute("SELECT name, seq FROM sqlite_sequence"))
        assert seqs == {"outbox": 5_000_000_000, "inbound": 3_000_000}
        assert incarnation(conn) == {"reason": "restore", "time_ms": 3_000, "floor": 3_000_000}
        history = json.loads(conn.execute("SELECT value FROM meta WHERE key='incarnations'").fetchone()[0])
        assert [h["reason"] for h in history] == ["init", "restore"]
        with pytest.raises(ValueError, match="reason 'copy'"):
            begin_incarnation(conn, "copy")
    finally:
        db.close()


def test_restore_begins_an_incarnation_above_what_the_store_sent_since(tmp_path: Path) -> None:
    from semq.ops.backup import restore

    src = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(src), "--org", A, "--no-security",
                      "--platform", f"127.0.0.1:{free_port()}"]) == 0
    assert ops_main(["backup", "--dir", str(src), "--out", str(tmp_path / "a.tar")]) == 0
    core = NodeCore(src / "node.sqlite", A)
    sent = core.accept([NewDocument(target=B, app_data=b"%d" % i) for i in range(5)])
    core.close()
    info = restore(tmp_path / "a.tar", src, force=True)
    assert info.id_floor > sent[-1].record_id
    core = NodeCore(src / "node.sqlite", A)
    try:
        (again,) = core.accept([NewDocument(target=B, app_data=b"later")])
        assert again.record_id == info.id_floor + 1
        assert core.conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1  # the backup had none
    finally:
        core.close()


def test_a_record_id_is_never_handed_out_again_once_its_row_is_cleaned(tmp_path: Path) -> None:
    """Within one store: the pending-send table's ids are AUTOINCREMENT, so a
    document accepted after every earlier row was confirmed and deleted
    (the highest id too) gets a new id, never the cleaned one's, which its
    receiver still remembers (docs/exactly-once.md)."""
    from semq.umxt_protocol import (
        AckBatch,
        AckEntry,
        AckFlag,
        Endpoint,
        Frame,
        FrameDecoder,
        Kind,
        encode_frame,
    )

    core = NodeCore(tmp_path / "n.sqlite", A, create=True, synchronous="OFF")
    try:
        first = core.accept([NewDocument(target=B, app_data=b"%d" % i) for i in range(3)])
        assert len(core.claim(10).data) == 3
        ack2 = Frame(kind=Kind.ACK_BATCH, source=Endpoint.platform(), origin=Endpoint.org(B), target=Endpoint.org(A),
                     body=AckBatch(ack_kind=Kind.ACK2, entries=tuple(
                         AckEntry(1, 1, 0, 1, 1, lk.record_id, int(AckFlag.DELIVERY), 0) for lk in first)))
        dec = FrameDecoder()
        dec.receive_data(encode_frame(ack2))
        core.handle(list(dec))
        assert core.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)  # confirmed, cleaned up
        (later,) = core.accept([NewDocument(target=B, app_data=b"later")])
        assert later.record_id > max(lk.record_id for lk in first)
    finally:
        core.close()
