"""``semq watch`` with real writers: processes that write a file in place
and pause mid-file longer than the settle time, files renamed in, many at
once, the watcher killed and started again while writers still write, and
the inbox folder woken by the node rather than by a timer. A platform, two
nodes and the watchers are real processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from semq.node.api import NodeClient
from tests._procs import Cluster, Proc, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"
SETTLE = "1"  # s: every pause of the writers below is longer


def _start(c: Cluster) -> tuple[Path, Path]:
    for org in (A, B):
        c.add_org(org)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    out, inbox = c.root / "erp-out", c.root / "erp-in"
    out.mkdir()
    inbox.mkdir()
    return out, inbox


def _watch(c: Cluster, name: str, *args: str) -> Proc:
    p = Proc(name, ["watch", *args], c.root / f"{name}.log", "watching", timeout=30)
    c.procs[name] = p
    return p


def _outbox_watch(c: Cluster, out: Path, name: str = "watchA") -> Proc:
    return _watch(c, name, "--dir", str(c.root / A), "--outbox", str(out), "--to", B, "--type", "INVOICE",
                  "--key-from-name", "--settle", SETTLE, "--interval", "0.2")


def _writer(c: Cluster, script: str, name: str = "writer") -> subprocess.Popen[bytes]:
    """A separate process that writes files the way ``script`` says."""
    log = c.root / f"{name}.log"
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _written(folder: Path) -> dict[str, bytes]:
    """The inbox folder's files, by AppKey key (``KEY__LK0.bin``)."""
    return {p.name.rsplit("__", 1)[0]: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


def _sent_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.startswith("sent: ")]


def test_a_writer_that_pauses_mid_file_gets_one_whole_document_as_do_renamed_and_many_files(
        cluster: Cluster) -> None:
    out, inbox = _start(cluster)
    _watch(cluster, "watchB", "--dir", str(cluster.root / B), "--inbox", str(inbox))
    watcher = _outbox_watch(cluster, out)
    assert "writer closes it or renames it in" in (cluster.root / "watchA.log").read_text()

    # 1. One invoice written in place, a 3 s pause (three times the settle
    # time) between its two halves, then closed.
    slow = _writer(cluster, f"""
        import time
        with open({str(out / "INV-901.xml")!r}, "wb") as f:
            f.write(b'<invoice id="INV-901"><line n="1"/>')
            f.flush()
            time.sleep(3)
            f.write(b'<line n="2"/></invoice>')
        """, "slow")
    # 2. 200 files at once, each half written, a 2 s pause, then finished;
    # and 20 written elsewhere and renamed in.
    many = _writer(cluster, f"""
        import os, time
        out = {str(out)!r}
        files = [open(os.path.join(out, f"M-{{i:03d}}.xml"), "wb") for i in range(200)]
        for i, f in enumerate(files):
            f.write(b"<m n='%d'>" % i)
            f.flush()
        time.sleep(2)
        for i, f in enumerate(files):
            f.write(b"half two of %d</m>" % i)
            f.close()
        aside = {str(cluster.root / "aside")!r}
        os.mkdir(aside)
        for i in range(20):
            p = os.path.join(aside, f"R-{{i:02d}}.xml")
            with open(p, "wb") as f:
                f.write(b"<renamed n='%d'/>" % i)
            os.rename(p, os.path.join(out, f"R-{{i:02d}}.xml"))
        """, "many")
    assert slow.wait(timeout=30) == 0 and many.wait(timeout=60) == 0
    want = {"INV-901": b'<invoice id="INV-901"><line n="1"/><line n="2"/></invoice>'}
    want |= {f"M-{i:03d}": b"<m n='%d'>half two of %d</m>" % (i, i) for i in range(200)}
    want |= {f"R-{i:02d}": b"<renamed n='%d'/>" % i for i in range(20)}

    wait_until(lambda: len(_written(inbox)) >= len(want), 90, f"{len(want)} files in B's inbox folder")
    time.sleep(1.5)  # (a second document for any file would have come by now)
    assert _written(inbox) == want  # each whole, none cut in two
    stored = cluster.inbox(B)  # (asserts no document twice)
    assert sorted(stored.values()) == sorted(want.values())
    assert len(_sent_lines(cluster.root / "watchA.log")) == len(want)
    assert sorted(p.name for p in (out / "sent").iterdir()) == sorted(f"{k}.xml" for k in want)
    assert watcher.kill(signal.SIGTERM) == 0
    cluster.procs.pop("watchA")


def test_the_watcher_killed_and_started_again_while_writers_write_loses_and_repeats_nothing(
        cluster: Cluster) -> None:
    """80 files written one after the other, each with a pause mid-file;
    one more held half-written across the restart (a file already there
    when the watcher starts, whose writer is still at it): the watcher is
    SIGKILLed after 20 files and started again."""
    out, inbox = _start(cluster)
    _watch(cluster, "watchB", "--dir", str(cluster.root / B), "--inbox", str(inbox))
    _outbox_watch(cluster, out)
    writer = _writer(cluster, f"""
        import os, sys, time
        out = {str(out)!r}
        held = open(os.path.join(out, "LONG.xml"), "wb")
        held.write(b"<long>first half")
        held.flush()
        for i in range(80):
            with open(os.path.join(out, f"W-{{i:02d}}.xml"), "wb") as f:
                f.write(b"<w n='%d'>" % i)
                f.flush()
                time.sleep(0.05)
                f.write(b"</w>")
            if i == 40:
                print("half", flush=True)
                time.sleep(3)  # the restart happens meanwhile: LONG.xml is there, still open
        held.write(b" second half</long>")
        held.close()
        """)
    log = cluster.root / "watchA.log"
    wait_until(lambda: len(_sent_lines(log)) >= 20, 60, "20 files sent")
    cluster.kill("watchA", signal.SIGKILL)
    wait_until(lambda: "half" in (cluster.root / "writer.log").read_text(), 30, "the writer halfway")
    _outbox_watch(cluster, out)
    time.sleep(2 * float(SETTLE) + 0.5)  # longer than the settle time, the writer still holding LONG.xml
    assert not (out / "sent" / "LONG.xml").exists(), "a file still open for writing was taken"
    assert writer.wait(timeout=60) == 0

    want = {f"W-{i:02d}": b"<w n='%d'></w>" % i for i in range(80)}
    want["LONG"] = b"<long>first half second half</long>"
    wait_until(lambda: len(_written(inbox)) >= len(want), 90, f"{len(want)} files in B's inbox folder")
    time.sleep(1.5)
    assert _written(inbox) == want
    stored = cluster.inbox(B)  # (asserts no document twice)
    assert sorted(stored.values()) == sorted(want.values())
    assert sorted(p.name for p in (out / "sent").iterdir()) == sorted(f"{k}.xml" for k in want)
    assert cluster.count(A, "SELECT count(*) FROM watch_files") == len(want)
    assert cluster.count(A, "SELECT count(*) FROM watch_files WHERE moved_ms IS NULL") == 0


def test_the_inbox_folder_is_written_when_the_node_says_a_document_arrived_not_on_a_timer(
        cluster: Cluster) -> None:
    """With --interval 10, each of five documents is in the inbox folder
    within 2 s of its commit in B's inbox (typically a few ms): the daemon
    wakes the watcher. Read on a 10 s timer, each would wait a uniform 0-10 s
    (all five under 2 s: 1 chance in 3,000)."""
    _, inbox = _start(cluster)
    interval = 10.0
    watcher = _watch(cluster, "watchB", "--dir", str(cluster.root / B), "--inbox", str(inbox),
                     "--interval", str(interval))
    assert "the inbox when the node says a document arrived" in (cluster.root / "watchB.log").read_text()
    lags = []
    with NodeClient(cluster.root / A) as node:
        for i in range(5):
            node.send(B, b"<doc n='%d'/>" % i, data_type="ORDER", key=f"D-{i}")
            [f] = wait_until(lambda i=i: [p for p in inbox.iterdir() if p.name.startswith(f"D-{i}__")], 30,
                             f"document {i} in the inbox folder")
            written_ms = f.stat().st_mtime_ns / 1e6
            [(received_ms,)] = cluster.q(B, "SELECT received_ms FROM inbox WHERE key=?", f"D-{i}")
            lags.append((written_ms - received_ms) / 1000)
            time.sleep(0.3)
    assert max(lags) < 2.0, lags  # read on a timer, one of these would wait up to 10 s
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox WHERE consumed_ms IS NULL") == 0, 10,
               "every document acknowledged")
    assert watcher.kill(signal.SIGTERM) == 0
    cluster.procs.pop("watchB")
    text = (cluster.root / "watchB.log").read_text()
    assert "Traceback" not in text and text.rstrip().endswith("stopped (SIGTERM)"), text[-500:]
    assert os.listdir(inbox) and all(not n.startswith(".") or n == ".semq-watch.lock" for n in os.listdir(inbox))


def test_the_inbox_folder_without_a_running_node_says_so_once_then_follows_it_when_it_runs(
        cluster: Cluster) -> None:
    for org in (A, B):
        cluster.add_org(org)
    cluster.start_platform()
    cluster.start_node(A)
    inbox = cluster.root / "erp-in"
    inbox.mkdir()
    _watch(cluster, "watchB", "--dir", str(cluster.root / B), "--inbox", str(inbox), "--interval", "0.3")
    log = cluster.root / "watchB.log"
    wait_until(lambda: "reading the inbox every 0.3 s until the node answers" in log.read_text(), 10,
               "the watcher saying no node answers")
    time.sleep(1)  # several intervals: said once
    assert log.read_text().count("until the node answers") == 1
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"<while-away/>", data_type="ORDER", key="AWAY")
    cluster.start_node(B)
    wait_until(lambda: "the node answers again" in log.read_text(), 20, "the watcher finding the node")
    wait_until(lambda: _written(inbox).get("AWAY") == b"<while-away/>", 30, "the document in the inbox folder")
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"<after/>", data_type="ORDER", key="AFTER")
    wait_until(lambda: _written(inbox).get("AFTER") == b"<after/>", 30, "the next document in the inbox folder")
    assert cluster.kill("watchB", signal.SIGTERM) == 0
    assert "Traceback" not in log.read_text()
