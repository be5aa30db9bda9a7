"""``semq watch`` as a real process beside a real platform and two real
nodes: an outbox folder SIGKILLed mid-folder and started again sends
every file exactly once, and the receiver's inbox folder gets each
document once, acknowledged."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests._procs import Cluster, Proc, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"
FILES = 200


def _watch(c: Cluster, name: str, *args: str, crash_after: int = 0) -> Proc:
    """``semq watch`` as a process; ``crash_after``: one that dies right
    after that many commits, before it moves their files (semq.testing.crashing_watch)."""
    module = ["semq.testing.crashing_watch", str(crash_after)] if crash_after else None
    p = Proc(name, ["watch", *args, "--interval", "0.2", "--settle", "1"], c.root / f"{name}.log", "watching", timeout=30,
             module=module, may_exit=bool(crash_after))
    c.procs[name] = p
    return p


def _sent_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.startswith("sent: ")]


def test_a_watched_folder_killed_mid_folder_delivers_every_file_exactly_once(cluster: Cluster) -> None:
    for org in (A, B):
        cluster.add_org(org)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    out, inbox = cluster.root / "erp-out", cluster.root / "erp-in"
    out.mkdir()
    inbox.mkdir()
    rng = random.Random(7)
    contents = {f"INV-{i:04d}": rng.randbytes(rng.randint(1, 3000)) for i in range(FILES)}
    for key, data in contents.items():  # as an ERP should: written aside, renamed in
        (out / f"{key}.xml.tmp").write_bytes(data)
        os.replace(out / f"{key}.xml.tmp", out / f"{key}.xml")

    receiver = _watch(cluster, "watchB", "--dir", str(cluster.root / B), "--inbox", str(inbox))
    args = ["--dir", str(cluster.root / A), "--outbox", str(out), "--to", B, "--type", "INVOICE", "--key-from-name"]
    log = cluster.root / "watchA.log"

    # 1. Dies right after its third commit of 10 files: 20 files in sent/,
    # 10 accepted (documents and records committed) but still in the folder.
    crashing = _watch(cluster, "watchA", *args, "--batch", "10", crash_after=3)
    wait_until(lambda: crashing.p.poll() is not None, 60, "the crash after the third commit")
    cluster.procs.pop("watchA")
    assert len(list((out / "sent").iterdir())) == 20
    assert cluster.count(A, "SELECT count(*) FROM watch_files WHERE moved_ms IS NULL") == 10

    # 2. Started again, one file per transaction: the 10 are moved without
    # being sent again; SIGKILLed mid-folder.
    _watch(cluster, "watchA", *args, "--batch", "1")
    wait_until(lambda: len(_sent_lines(log)) >= 20 + 10 + 30, 60, "30 more files sent")
    cluster.kill("watchA", signal.SIGKILL)
    assert len(list((out / "sent").iterdir())) < FILES, "the watcher was to be killed mid-folder"
    recovered = [line for line in _sent_lines(log) if line.endswith("(accepted before a restart; not sent again)")]
    assert len(recovered) == 10, recovered

    # 3. Started again: it finishes the folder.
    _watch(cluster, "watchA", *args, "--batch", "1")
    wait_until(lambda: len(list((out / "sent").iterdir())) == FILES, 90, "every file in sent/")
    assert sorted(p.name for p in out.iterdir() if p.name != ".semq-watch.lock") == ["failed", "sent"]
    assert list((out / "failed").iterdir()) == []

    def written() -> list[Path]:
        return [p for p in inbox.iterdir() if not p.name.startswith(".")]

    wait_until(lambda: len(written()) >= FILES, 120, f"{FILES} files in B's inbox folder")
    wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox WHERE consumed_ms IS NULL") == 0, 30,
               "every document acknowledged")
    # Exactly once: B's store holds each LK0 once (Cluster.inbox asserts it),
    # one per file, and the inbox folder one file per document.
    stored = cluster.inbox(B)
    assert len(stored) == FILES and sorted(stored.values()) == sorted(contents.values())
    files = written()
    assert len(files) == FILES
    lk0s = {p.stem.rsplit("__", 1)[1] for p in files}
    assert len(lk0s) == FILES
    assert {p.stem.rsplit("__", 1)[0]: p.read_bytes() for p in files} == contents
    # The sender's record: one row per file, each moved to sent/.
    assert cluster.count(A, "SELECT count(*) FROM watch_files") == FILES
    assert cluster.count(A, "SELECT count(*) FROM watch_files WHERE moved_ms IS NULL") == 0

    assert receiver.kill(signal.SIGTERM) == 0
    cluster.procs.pop("watchB")
    assert cluster.kill("watchA", signal.SIGTERM) == 0
    for name in ("watchA", "watchB"):
        text = (cluster.root / f"{name}.log").read_text()
        assert "Traceback" not in text and text.rstrip().endswith("stopped (SIGTERM)"), text[-500:]
