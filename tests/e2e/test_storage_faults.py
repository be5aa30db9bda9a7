"""Storage faults, with real ``semq`` processes on 127.0.0.1:

- a full or read-only store: the node refuses new documents with one clear
  line (path and reason), keeps everything it has and recovers when space
  returns. "Full" is a small tmpfs mounted for the node's directory and filled
  with a filler file, so SQLite really gets ENOSPC from the kernel (the
  node's own code path, not a PRAGMA); "read-only" is that tmpfs remounted
  ``ro``. Mounting needs root (CAP_SYS_ADMIN): those tests skip otherwise.
- a corrupt SQLite file: ``semq node run`` and ``semq platform run`` refuse to
  start with a clear message, and the file's bytes are unchanged.
- a crash during batch commits loses nothing acknowledged: the platform is
  SIGKILLed again and again while a node streams documents to an offline
  target; every document whose ACK_SAVE the origin saw is delivered; and the
  receiving node is SIGKILLed again and again while it drains a backlog:
  every document reaches its inbox exactly once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._chaos import event_lk0s, send_docs
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


# ---------------------------------------------------------------- helpers


class Mounts:
    """tmpfs mounts made by a test; unmounted at teardown (after the
    processes using them are killed)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def tmpfs(self, path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs to simulate a full/read-only disk (needs root):"
                        f" {r.stderr.strip() or r.returncode}")
        self.paths.append(path)
        return path

    @staticmethod
    def remount(path: Path, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, timeout=10)

    def unmount_all(self) -> None:
        for p in reversed(self.paths):
            subprocess.run(["umount", "-l", str(p)], capture_output=True, timeout=10)
        self.paths.clear()


@pytest.fixture
def mounts(cluster: Cluster) -> Iterator[Mounts]:
    m = Mounts()
    try:
        yield m
    finally:
        cluster.stop_all()  # nothing may hold the mounts open
        m.unmount_all()


def fill(fs: Path) -> Path:
    """Fill the filesystem at ``fs`` to the last block with one file
    (unbuffered writes, smaller and smaller, until ENOSPC at one byte)."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError:
                size //= 2
    finally:
        os.close(fd)
    assert os.statvfs(fs).f_bavail == 0, "filesystem not full"
    return filler


def cli(*args: str | Path, stdin: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The real ``semq`` command in a child process (stderr as the user sees it)."""
    r = subprocess.run([sys.executable, "-m", "semq", *map(str, args)], input=stdin, capture_output=True,
                       timeout=timeout)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def snapshot(c: Cluster, org: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row a node holds that a fault must not lose (inbox with content hashes)."""
    inbox = [(o, r, hashlib.sha256(d).hexdigest())
             for o, r, d in c.q(org, "SELECT origin_id, record_id, app_data FROM inbox")]
    return {
        "inbox": sorted(inbox),
        "outbox": sorted(c.q(org, "SELECT id, target_id, state, save_fwd, length(app_data) FROM outbox")),
        "dedup": sorted(c.q(org, "SELECT origin_id, record_id FROM dedup")),
    }


def one_line_error(stderr: str, *needles: str) -> bool:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and all(n in lines[0] for n in needles)


def online(c: Cluster) -> set[str]:
    """Organizations the running platform reports online (status.json)."""
    try:
        return set(json.loads((c.root / "P" / "status.json").read_text()).get("online", []))
    except (OSError, ValueError):
        return set()


def file_digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def settle(c: Cluster, orgs: list[str], timeout: float = 40) -> None:
    wait_until(lambda: c.settled(orgs), timeout, "every table settled")


def mount_org(c: Cluster, mounts: Mounts, org: str, size: str = "16m") -> Path:
    """The node's whole data directory on its own small tmpfs."""
    mounts.tmpfs(c.root / org, size)
    return c.add_org(org)


# ---------------------------------------------------------------- (a) full / read-only


def _full_disk_setup(c: Cluster, mounts: Mounts) -> tuple[dict[str, bytes], Path]:
    """A (on a small tmpfs) and B exchange documents, everything settles,
    then A's filesystem is filled to the last byte."""
    mount_org(c, mounts, A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    to_b = send_docs(c.root / A, B, 30, seed="full-ab", save_fwd=3)
    to_a = send_docs(c.root / B, A, 20, seed="full-ba", save_fwd=2)
    wait_until(lambda: len(c.inbox(B)) == 30 and len(c.inbox(A)) == 20, 30, "both inboxes")
    settle(c, [A, B])
    assert c.inbox(A) == to_a and c.inbox(B) == to_b
    return to_a, fill(c.root / A)


def test_full_disk_refuses_new_documents_keeps_everything_and_recovers(cluster: Cluster, mounts: Mounts) -> None:
    c = cluster
    to_a, filler = _full_disk_setup(c, mounts)
    before = snapshot(c, A)
    big = random.Random(1).randbytes(2 * 1024 * 1024)  # larger than anything the WAL has room for
    for _ in range(3):
        r = cli("send", "--dir", c.root / A, "--to", B, "--type", "ORDER", "-", stdin=big)
        assert r.returncode != 0, f"a document was accepted on a full disk: {r.stdout} {r.stderr}"
    assert snapshot(c, A) == before, "the node lost or changed rows while its disk was full"
    # Space returns: the same command works, and the document travels.
    filler.unlink()
    r = cli("send", "--dir", c.root / A, "--to", B, "--type", "ORDER", "-q", "-", stdin=big)
    assert r.returncode == 0, r.stderr
    lk0 = r.stdout.strip()
    rid = int(lk0.rsplit("/", 1)[1])
    if c.procs[A].p.poll() is not None:  # the daemon may have died meanwhile: another test pins that
        c.procs.pop(A)
        c.start_node(A)
    wait_until(lambda: c.inbox(B).get(f"{A}/{rid}") == big, 30, "the document sent after recovery")
    settle(c, [A, B])
    assert c.inbox(A) == to_a


def test_full_disk_error_is_one_clear_line(cluster: Cluster, mounts: Mounts) -> None:
    c = cluster
    _full_disk_setup(c, mounts)
    big = random.Random(2).randbytes(2 * 1024 * 1024)
    r = cli("send", "--dir", c.root / A, "--to", B, "--type", "ORDER", "-", stdin=big)
    store = str(c.root / A / "node.sqlite")
    assert r.returncode == 1, r.returncode
    assert one_line_error(r.stderr, store, "disk full"), r.stderr[-3000:]


def test_full_disk_node_daemon_keeps_running(cluster: Cluster, mounts: Mounts) -> None:
    """The node daemon on a full disk stays up (and retries): a full disk is
    an operating condition, not a reason to stop serving what it has."""
    c = cluster
    _full_disk_setup(c, mounts)
    p = c.procs[A]
    time.sleep(3)  # idle on a full disk
    assert p.p.poll() is None, f"idle node daemon exited {p.p.returncode}:\n{p.log.read_text()[-3000:]}"
    send_docs(c.root / B, A, 10, seed="full-while", save_fwd=3)  # B -> A while A is full
    time.sleep(3)
    assert p.p.poll() is None, f"node daemon exited {p.p.returncode}:\n{p.log.read_text()[-3000:]}"


def test_send_reports_failure_only_when_nothing_was_accepted(cluster: Cluster, mounts: Mounts) -> None:
    """Disk full exactly between the store's commit and the event log's append:
    SQLite writes into WAL space it already has, the log needs a new block."""
    c = cluster
    d = mount_org(c, mounts, A)
    keep = sqlite3.connect(str(d / "node.sqlite"))  # a second connection: the WAL file stays
    try:
        keep.execute("SELECT count(*) FROM outbox").fetchall()  # now it has the WAL open
        send_docs(d, B, 100, seed="wal", size=8192)  # the WAL grows to ~1 MB
        keep.execute("PRAGMA wal_checkpoint(RESTART)")  # the next write reuses the WAL from its start
        log = next((d / "events").glob("*.jsonl"))
        with log.open("a") as f:  # the log ends on a page boundary: its next line needs a new block
            f.write("\n" * (-log.stat().st_size % 4096))
        fill(d)
        r = cli("send", "--dir", d, "--to", B, "--type", "ORDER", "--key", "ENOSPC", "-", stdin=b"<order/>")
        accepted = keep.execute("SELECT count(*) FROM outbox WHERE key='ENOSPC'").fetchone()[0]
        assert accepted in (0, 1)
        assert (r.returncode == 0) == (accepted == 1), (
            f"exit {r.returncode} but {accepted} document(s) accepted; stderr: {r.stderr.strip()}")
    finally:
        keep.close()


def test_full_disk_at_the_receiver_loses_nothing(cluster: Cluster, mounts: Mounts) -> None:
    """B's disk fills while documents for it arrive: nothing acknowledged is
    lost, and when space returns every document is in B's inbox once."""
    c = cluster
    mount_org(c, mounts, B)
    c.add_org(A)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    first = send_docs(c.root / A, B, 10, seed="rx-1", save_fwd=3)
    wait_until(lambda: len(c.inbox(B)) == 10, 30, "first documents")
    filler = fill(c.root / B)
    sent = dict(first)
    sent.update(send_docs(c.root / A, B, 20, seed="rx-2", save_fwd=3, size=64 * 1024))
    sent.update(send_docs(c.root / A, B, 20, seed="rx-3", save_fwd=2, ack2=False, size=64 * 1024))
    time.sleep(4)  # deliveries fail at B meanwhile
    filler.unlink()
    if c.procs[B].p.poll() is not None:  # died on the full disk: pinned by the test above
        c.procs.pop(B)
        c.start_node(B)
    wait_until(lambda: len(c.inbox(B)) == len(sent), 60, "every document after space returned")
    assert c.inbox(B) == sent  # also: none twice (Cluster.inbox asserts)
    settle(c, [A, B])


def test_read_only_store_refuses_documents_and_the_daemon_start(cluster: Cluster, mounts: Mounts) -> None:
    c = cluster
    mount_org(c, mounts, A)
    c.add_org(B)
    pending = send_docs(c.root / A, B, 15, seed="ro", save_fwd=3)  # waiting in A's store
    before = snapshot(c, A)
    Mounts.remount(c.root / A, "ro")
    r = cli("send", "--dir", c.root / A, "--to", B, "--type", "ORDER", "-", stdin=b"<order/>")
    assert r.returncode != 0 and str(c.root / A) in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    r = cli("node", "run", "--dir", c.root / A, timeout=30)
    assert r.returncode != 0 and str(c.root / A) in r.stderr, r.stderr[-2000:]
    Mounts.remount(c.root / A, "rw")
    assert snapshot(c, A) == before
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    wait_until(lambda: len(c.inbox(B)) == 15, 30, "the documents kept while read-only")
    assert c.inbox(B) == pending
    settle(c, [A, B])


def test_read_only_store_error_says_read_only(cluster: Cluster, mounts: Mounts) -> None:
    c = cluster
    mount_org(c, mounts, A)
    Mounts.remount(c.root / A, "ro")
    r = cli("send", "--dir", c.root / A, "--to", B, "--type", "ORDER", "-", stdin=b"<order/>")
    assert one_line_error(r.stderr, str(c.root / A / "node.sqlite")), r.stderr
    assert "read-only" in r.stderr or "Read-only" in r.stderr, r.stderr


# ---------------------------------------------------------------- (b) corrupt files


def _root_page(db: Path, table: str) -> tuple[int, int]:
    """(the table's root page number, the store's page size)."""
    # Read-write on purpose: a read-only connection to a WAL store leaves -wal
    # and -shm behind (it may not delete them), which would not be ours to leave.
    c = sqlite3.connect(str(db))
    try:
        return (int(c.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]),
                int(c.execute("PRAGMA page_size").fetchone()[0]))
    finally:
        c.close()


def _corrupt(db: Path, how: str, table: str) -> None:
    size = db.stat().st_size
    # Ask SQLite first, with no descriptor of ours open on the file: closing
    # one would drop SQLite's locks and leave its journal files behind.
    page, page_size = _root_page(db, table) if how == "page" else (0, 0)
    with db.open("r+b") as f:
        if how == "header":
            f.write(b"this is not SQLite at all")
        elif how == "page":  # the table's b-tree root page: valid header, broken table
            f.seek((page - 1) * page_size)
            f.write(b"\xff" * page_size)
        elif how == "truncated":
            f.truncate(size // 2)
        elif how == "empty":
            f.truncate(0)


def _prepare(c: Cluster, role: str) -> Path:
    """A store with real content, every process stopped (WAL checkpointed)."""
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    send_docs(c.root / A, B, 40, seed="corrupt", save_fwd=3, size=8192)
    wait_until(lambda: c.count("P", "SELECT count(*) FROM stored") == 40, 30, "stored at the platform")
    c.kill("P", signal.SIGTERM)
    c.kill(A, signal.SIGTERM)
    return c.root / ("P" if role == "platform" else A)


@pytest.mark.parametrize("role", ["node", "platform"])
@pytest.mark.parametrize("how", [
    "header",
    "page",
    "truncated",
    "empty",
])
def test_corrupt_store_is_refused_at_start_and_left_untouched(cluster: Cluster, role: str, how: str) -> None:
    d = _prepare(cluster, role)
    db = d / ("platform.sqlite" if role == "platform" else "node.sqlite")
    _corrupt(db, how, "stored" if role == "platform" else "outbox")
    before = file_digests(d)
    args = ["platform", "run", "--dir", d, "--listen", "127.0.0.1:0"] if role == "platform" else [
        "node", "run", "--dir", d]
    try:
        r = cli(*args, timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail(f"semq {role} run started on a store corrupted by '{how}' instead of refusing it")
    assert r.returncode != 0
    assert one_line_error(r.stderr.replace("\r", ""), str(db)), r.stderr[-2000:]
    after = file_digests(d)
    after.pop("status.json", None)
    assert after == before, "the corrupt store (or its WAL/SHM) was modified"


# ---------------------------------------------------------------- (c) crashes during batch commits


def test_platform_sigkilled_during_batch_commits_loses_nothing_acknowledged(cluster: Cluster) -> None:
    """A streams documents to B, which is offline, so the platform stores them
    in batches; the platform is SIGKILLed again and again at seeded moments
    (mid-batch, mid-commit, mid-ack) and restarted. Every document whose
    ACK_SAVE A saw (its 'ack_save' event, written after A committed SS_ACK)
    must be delivered to B; in the end every document is, exactly once."""
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    rng = random.Random(6)
    sent: dict[str, bytes] = {}
    errors: list[BaseException] = []

    def stream() -> None:  # A's application hands over 15 documents every 150 ms
        try:
            for i in range(60):
                sent.update(send_docs(c.root / A, B, 15, seed=f"kill-p-{i}", size=8192,
                                      save_fwd=2 + i % 2, ack2=i % 3 == 0))
                time.sleep(0.15)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    acked_at_kills = []
    try:
        # The kills must hit a platform that is storing: wait for the first
        # ACK_SAVE (a loaded machine can take seconds to seal the first batch).
        wait_until(lambda: len(event_lk0s(c.root / A, "ack_save")) > 0, 60, "a first ACK_SAVE at A")
        for _ in range(8):
            wait_until(lambda: A in online(c), 30, "A connected to the platform")
            time.sleep(rng.uniform(0.05, 0.5))  # the platform is storing batches now
            c.kill("P", signal.SIGKILL)
            acked_at_kills.append(len(event_lk0s(c.root / A, "ack_save")))
            c.start_platform()
    finally:
        t.join(timeout=60)
    assert not errors, errors
    assert acked_at_kills[-1] > 0, "no ACK_SAVE reached A before the kills: nothing was tested"
    c.start_node(B)
    wait_until(lambda: len(c.inbox(B)) == len(sent), 90, f"all {len(sent)} documents at B")
    assert c.inbox(B) == sent  # byte-identical, none twice
    acked = {f"{lk.split('/')[0]}/{lk.split('/')[-1]}" for lk in event_lk0s(c.root / A, "ack_save")}
    assert acked <= set(sent)
    settle(c, [A, B], 60)
    print(f"ACK_SAVE'd documents seen by A at each of the 8 kills: {acked_at_kills} (of {len(sent)})")


def test_receiver_sigkilled_while_draining_a_backlog_gets_each_document_once(cluster: Cluster) -> None:
    """B drains 600 stored documents and is SIGKILLed again and again between
    its inbox commit and its acks: every document reaches B's inbox exactly
    once (dedup by LK0 in the inbox transaction, docs/exactly-once.md)."""
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    sent = send_docs(c.root / A, B, 600, seed="drain", size=2048, save_fwd=3, ack2=True)
    wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 600, 60, "600 stored")
    rng = random.Random(9)
    for _ in range(6):
        c.start_node(B)
        time.sleep(rng.uniform(0.1, 0.8))
        c.kill(B, signal.SIGKILL)
    c.start_node(B)
    wait_until(lambda: len(c.inbox(B)) == 600, 60, "the whole backlog at B")
    assert c.inbox(B) == sent
    settle(c, [A, B], 60)
