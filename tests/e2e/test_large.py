"""Large documents between real processes, security on: a 200 MiB document
whose receiver is SIGKILLed and whose connection is cut mid-transfer
arrives once, byte-identical, resumed (not sent again from zero); small
documents keep flowing beside it; a relay that alters or moves chunks gets
them refused; a file over the limit is refused at send."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from semq.node.large.incoming import ACK_EVERY_BYTES
from semq.node.large.outgoing import WINDOW_BYTES
from semq.testing.faultproxy import FaultPlan
from tests._procs import Cluster, ThreadedFaultProxy, read_status, set_config, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"
MIB = 1 << 20


def _content(path: Path, mib: int) -> str:
    """A file of ``mib`` MiB, half random and half compressible per MiB (as
    documents with images and text are); its SHA-256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(mib):
            block = os.urandom(MIB // 2) + bytes([i % 251]) * (MIB // 2)
            h.update(block)
            f.write(block)
    return h.hexdigest()


def _send(c: Cluster, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "semq", "send", "--dir", str(c.root / A), "--to", B,
                           "--type", "CAD", *extra, str(path)], capture_output=True, text=True, timeout=120)


def _through(c: Cluster) -> int:
    rows = c.q(B, "SELECT through FROM large_in")
    return int(rows[0][0]) if rows else -1


def _events(c: Cluster, org: str, event: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted((c.root / org / "events").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == event:
                out.append(e)
    return out


def _delivered(c: Cluster) -> list[tuple[Any, ...]]:
    """(file, size, record id) of B's large documents in the inbox (the row
    names the file relative to B's store directory)."""
    return [(c.root / B / p, n, r) for p, n, r in c.q(B, "SELECT path, size, record_id FROM inbox WHERE path IS NOT NULL")]


def test_a_200_mib_document_survives_a_receiver_kill_and_a_cut_connection(cluster: Cluster) -> None:
    cluster.add_org(A)
    cluster.add_org(B)
    # B's way to the platform, cut below: a link of about 25 MB/s (64 KiB
    # every 2.5 ms), so that the transfer lasts long enough to be cut.
    proxy = ThreadedFaultProxy(cluster.port, FaultPlan(delay=(0.0025, 0.0025)))
    try:
        set_config(cluster.root / B, platform=f"127.0.0.1:{proxy.port}")
        cluster.start_platform()
        cluster.start_node(A)
        cluster.start_node(B)
        src = cluster.root / "drawing.bin"
        digest = _content(src, 200)
        sent = _send(cluster, src)
        assert sent.returncode == 0, sent.stderr
        assert "as a large document (200 chunks" in sent.stderr

        # Small documents sent mid-transfer arrive while it goes on.
        wait_until(lambda: _through(cluster) >= 30, 60, "30 chunks committed at B")
        small = subprocess.run([sys.executable, "-m", "semq", "send", "--dir", str(cluster.root / A), "--to", B,
                                "--type", "ORDER", "--ndjson", "-"], capture_output=True, text=True, timeout=60,
                               input="".join(json.dumps({"data": f"order {i}", "key": f"PO-{i}"}) + "\n"
                                             for i in range(20)))
        assert small.returncode == 0, small.stderr
        wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox WHERE data_type='ORDER'") == 20, 30,
                   "the small documents delivered")
        assert not _delivered(cluster), "the small documents waited for the large one"

        # The receiver SIGKILLed mid-transfer, then started again.
        wait_until(lambda: _through(cluster) >= 100, 60, "100 chunks committed at B")
        cluster.kill(B, signal.SIGKILL)
        at_kill = _through(cluster)
        assert at_kill < 200
        cluster.start_node(B)

        # Its connection cut mid-transfer.
        wait_until(lambda: _through(cluster) >= at_kill + 40 or _delivered(cluster), 60, "40 more chunks")
        assert not _delivered(cluster), "the transfer ended before the cut"
        proxy.call(proxy.proxy.cut_all)

        proxy.call(proxy.proxy.set_pass_through, True)  # the rest at full speed
        wait_until(lambda: _delivered(cluster), 120, "the large document delivered")
        rows = _delivered(cluster)
        assert len(rows) == 1 and rows[0][1] == 200 * MIB
        h = hashlib.sha256()
        with open(rows[0][0], "rb") as f:
            while block := f.read(MIB):
                h.update(block)
        assert h.hexdigest() == digest, "not byte-identical"
        # Once: one inbox row for it, its ACK2 ended the origin's row with a receipt.
        rid = rows[0][2]
        assert cluster.count(B, "SELECT count(*) FROM inbox WHERE record_id=?", rid) == 1
        wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox WHERE id=?", rid) == 0, 30, "ACK2 at A")
        assert cluster.count(A, "SELECT count(*) FROM receipts WHERE record_id=?", rid) == 1
        assert cluster.count(B, "SELECT count(*) FROM large_in") == 0
        # Resumed, not from zero: the chunks sent twice are bounded by what
        # was in flight at the kill and at the cut — the window (16 chunks
        # of 1 MiB) beyond the last acknowledgement (every 4), each time —
        # and, at B's restart, what the platform kept while B was away plus
        # the window A sent on top of it before B's RESUME reached A (all of
        # it past the gap the kill left: B takes chunks in order only).
        window, every = WINDOW_BYTES // MIB, ACK_EVERY_BYTES // MIB
        done = _events(cluster, A, "large_sent")
        assert len(done) == 1 and done[0]["chunks"] == 200
        assert 0 < done[0]["resent"] <= 2 * (window + every) + window + done[0]["kept"] + 2, done[0]
        assert done[0]["resent"] < at_kill, "sent again from zero"
        assert len(_events(cluster, B, "large_complete")) == 1
    finally:
        cluster.stop_all()
        proxy.close()


def test_the_platform_keeps_a_large_document_for_an_absent_receiver(cluster: Cluster) -> None:
    """Store and forward for large documents: the receiver is away while
    the origin sends (the platform keeps the chunks, in a file by
    reference, and says so to the origin chunk by chunk); the origin is
    away when the receiver comes: the platform alone delivers it, whole."""
    cluster.add_org(A)
    cluster.add_org(B)
    cluster.start_platform()
    cluster.start_node(A)
    src = cluster.root / "doc.bin"
    digest = _content(src, 40)
    assert _send(cluster, src).returncode == 0
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=12") == 40, 60,
               "every chunk kept by the platform")
    assert cluster.q("P", "SELECT count(DISTINCT ref), max(length(frame)) FROM stored WHERE kind=12") == [(1, 0)]
    kept = list((cluster.root / "P" / "chunks").glob("*.chunks"))
    assert len(kept) == 1 and kept[0].stat().st_size > 40 * MIB // 2  # (half of each MiB compresses)
    status = subprocess.run([sys.executable, "-m", "semq", "status", "--dir", str(cluster.root / "P")],
                            capture_output=True, text=True, timeout=60)
    assert "large documents' chunks kept: 40 (" in status.stdout, status.stdout + status.stderr
    cluster.kill(A, signal.SIGTERM)
    cluster.start_node(B)
    wait_until(lambda: _delivered(cluster), 60, "the large document delivered with its origin away")
    path = _delivered(cluster)[0][0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=12") == 0, 30,
               "the chunks gone from the platform once delivered")
    assert not kept[0].exists(), "the file goes with its last chunk"
    cluster.start_node(A)  # its ACK2 waits at the platform
    wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox") == 0, 30, "the ACK2 at the origin")
    assert _events(cluster, A, "large_sent") == [] or _events(cluster, A, "large_sent")[0]["resent"] == 0


def test_status_files_and_large_document_directories_are_owner_only(cluster: Cluster) -> None:
    """Under the common umask 022, status.json (each daemon's) and every
    level of large/ (origin and receiver) and chunks/ (the platform's)
    are 0600 / 0700, like the rest of a data directory."""
    old = os.umask(0o022)  # (inherited by the daemons and by 'semq send')
    try:
        cluster.add_org(A)
        cluster.add_org(B)
        cluster.start_platform()
        cluster.start_node(A)
        src = cluster.root / "doc.bin"
        digest = _content(src, 5)
        assert _send(cluster, src).returncode == 0
        wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=12") == 5, 60,
                   "every chunk kept by the platform (B away)")
        cluster.start_node(B)
        wait_until(lambda: _delivered(cluster), 60, "the large document delivered")
        assert hashlib.sha256(_delivered(cluster)[0][0].read_bytes()).hexdigest() == digest
        for d in (cluster.root / A, cluster.root / B, cluster.root / "P"):
            wait_until(lambda d=d: read_status(d), 20, f"{d.name}/status.json")
    finally:
        os.umask(old)

    def mode(p: Path) -> int:
        return p.stat().st_mode & 0o777

    modes = {str(p.relative_to(cluster.root)): mode(p) for p in (
        cluster.root / A / "status.json", cluster.root / B / "status.json", cluster.root / "P" / "status.json",
        cluster.root / A / "large", cluster.root / A / "large" / "out",
        cluster.root / B / "large", cluster.root / B / "large" / "in", cluster.root / "P" / "chunks")}
    want = {k: 0o700 if (cluster.root / k).is_dir() else 0o600 for k in modes}
    assert {k: oct(v) for k, v in modes.items()} == {k: oct(v) for k, v in want.items()}
    files = [p for top in (cluster.root / A / "large", cluster.root / B / "large", cluster.root / "P" / "chunks")
             for p in top.rglob("*")]
    assert files, "no file under large/ or chunks/"
    assert {str(p): oct(mode(p)) for p in files if mode(p) & 0o077} == {}


def _dishonest(cluster: Cluster, rules: list[dict[str, Any]]) -> None:
    plan = cluster.root / "plan.json"
    plan.write_text(json.dumps({"rules": rules}))
    cluster.add_org(A)
    cluster.add_org(B)
    cluster.start_platform(plan)
    cluster.start_node(A)
    cluster.start_node(B)


def test_a_tampered_or_moved_chunk_is_refused_and_the_document_still_arrives_whole(cluster: Cluster) -> None:
    _dishonest(cluster, [{"action": "tamper_chunk", "kind": "CHUNK", "how": "flip", "count": 2},
                         {"action": "tamper_chunk", "kind": "CHUNK", "how": "move", "count": 1},
                         {"action": "delay", "kind": "CHUNK", "seconds": 0.5, "count": 1}])
    src = cluster.root / "doc.bin"
    digest = _content(src, 24)
    assert _send(cluster, src).returncode == 0
    wait_until(lambda: _delivered(cluster), 60, "the document delivered")
    path = _delivered(cluster)[0][0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    # (A chunk altered right after another one is not even opened: the
    # receiver takes chunks in order only, and waits for the one it lacks.)
    bad = _events(cluster, B, "bad_chunk")
    assert bad and all(e["code"] == 505 and "does not open" in e["detail"] for e in bad), bad
    wait_until(lambda: read_status(cluster.root / "P").get("mischief_tamper_chunk") == 3, 10,
               "the relay's three altered chunks in its status")
    assert _events(cluster, A, "large_sent")[0]["resent"] >= 1


def test_a_relay_that_alters_every_chunk_gets_the_document_refused(cluster: Cluster) -> None:
    _dishonest(cluster, [{"action": "tamper_chunk", "kind": "CHUNK", "how": "flip"}])
    src = cluster.root / "doc.bin"
    _content(src, 20)
    assert _send(cluster, src).returncode == 0
    wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox WHERE state=9") == 1, 60,
               "the document refused at A")
    assert cluster.q(A, "SELECT code FROM outbox") == [(505,)]
    assert cluster.count(B, "SELECT count(*) FROM inbox") == 0
    assert cluster.count(B, "SELECT count(*) FROM large_in") == 0
    assert list((cluster.root / B / "large" / "in").iterdir()) == []
    refusal = cluster.q(A, "SELECT count(*) FROM refusals")
    assert refusal == [(1,)], "the refusal is the receiver's signed one"


def test_a_file_over_the_limit_is_refused_at_send_and_nothing_is_kept(cluster: Cluster) -> None:
    cluster.add_org(A)
    set_config(cluster.root / A, max_document_mib=20)
    src = cluster.root / "big.bin"
    with open(src, "wb") as f:
        f.truncate(21 * MIB)
    r = _send(cluster, src)
    assert r.returncode == 2
    assert f"document of {21 * MIB} bytes (21.0 MiB) exceeds this node's limit of {20 * MIB} bytes (20 MiB" \
        in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert cluster.count(A, "SELECT count(*) FROM outbox") == 0
    assert not (cluster.root / A / "large").exists()


def test_a_user_of_the_receiver_reads_a_large_document_by_blocks_and_no_one_else_does(cluster: Cluster) -> None:
    """A large document for alice at B: her application reads it over the
    user socket by blocks (``semq inbox save`` with her token); bob's token
    cannot, and a block over the limit is refused with one line."""
    from semq.ops.usersock import UserClient, UserSocketError
    from semq.settings.bounds import USER_BLOCK_BYTES

    cluster.add_org(A)
    cluster.add_org(B)
    cluster.start_platform()
    cluster.start_node(A)
    env = {k: v for k, v in os.environ.items() if k != "SEMQ_TOKEN"}

    def semq(*args: str, token: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "semq", *args], capture_output=True, text=True, timeout=120,
                              env={**env, "SEMQ_TOKEN": token} if token else env)

    alice = semq("user", "add", "alice", "--dir", str(cluster.root / B)).stdout.strip()
    bob = semq("user", "add", "bob", "--dir", str(cluster.root / B)).stdout.strip()
    cluster.start_node(B)
    src = cluster.root / "plan.dwg"
    digest = _content(src, 6)
    sent = subprocess.run([sys.executable, "-m", "semq", "send", "--dir", str(cluster.root / A), "--to", f"{B}/alice",
                           "--type", "CAD", str(src)], capture_output=True, text=True, timeout=120)
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: _delivered(cluster), 60, "the large document in B's inbox")

    sock = cluster.root / B / "user.sock"
    me = UserClient(sock, "alice", alice)
    (item,) = me.inbox()
    assert item["large"] and item["size"] == 6 * MIB and item["to_user"] == "alice" and "data" not in item
    out = cluster.root / "saved.dwg"
    r = semq("inbox", "save", str(item["id"]), str(out), "--dir", str(cluster.root / B), "--user", "alice",
             token=alice)
    assert r.returncode == 0 and f"saved {6 * MIB} bytes" in r.stdout, r.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    shown = subprocess.run([sys.executable, "-m", "semq", "inbox", "show", str(item["id"]), "--dir",
                            str(cluster.root / B), "--user", "alice"], capture_output=True, timeout=120,
                           env={**env, "SEMQ_TOKEN": alice})
    assert hashlib.sha256(shown.stdout).hexdigest() == digest
    blocks = list(me.read(item["id"], block=MIB))
    assert len(blocks) == 6 and all(len(b) == MIB for b in blocks)

    r = semq("inbox", "save", str(item["id"]), str(cluster.root / "bob.dwg"), "--dir", str(cluster.root / B),
             "--user", "bob", token=bob)
    assert r.returncode == 1 and f"document {item['id']} is not in the inbox of bob" in r.stderr
    assert not (cluster.root / "bob.dwg").exists()
    with pytest.raises(UserSocketError, match="is not in the inbox of bob"):
        list(UserClient(sock, "bob", bob).read(item["id"]))
    with pytest.raises(UserSocketError, match=rf"length {USER_BLOCK_BYTES + 1} is outside 1\.\.{USER_BLOCK_BYTES}"):
        list(me.read(item["id"], block=USER_BLOCK_BYTES + 1))


def test_a_user_sends_a_large_file_through_the_user_socket_by_blocks(cluster: Cluster) -> None:
    """``semq send --user alice FILE`` with her token, A's data directory
    not hers to open: 6 MiB go over A's user socket in blocks of 1 MiB,
    staged and taken in as a large document, and arrive whole at B; the
    staging directory is left empty. A file over the node's limit is
    refused with one line before a block is staged."""
    cluster.add_org(A)
    cluster.add_org(B)
    set_config(cluster.root / A, max_document_mib=8)
    cluster.start_platform()
    env = {k: v for k, v in os.environ.items() if k != "SEMQ_TOKEN"}
    alice = subprocess.run([sys.executable, "-m", "semq", "user", "add", "alice", "--dir", str(cluster.root / A)],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    cluster.start_node(A)
    cluster.start_node(B)
    src = cluster.root / "plan.dwg"
    digest = _content(src, 6)
    sock = cluster.root / A / "user.sock"

    def send(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "semq", "send", "--socket", str(sock), "--user", "alice",
                               "--to", B, "--type", "CAD", str(path)], capture_output=True, text=True, timeout=120,
                              env={**env, "SEMQ_TOKEN": alice})

    r = send(src)
    assert r.returncode == 0, r.stderr
    assert f"accepted {6 * MIB} bytes from alice for {B}" in r.stderr
    (path, size, _), = wait_until(lambda: _delivered(cluster), 60, "alice's large document in B's inbox")
    assert size == 6 * MIB and hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert cluster.q(B, "SELECT from_user FROM inbox") == [("alice",)]
    assert not any((cluster.root / A / "uploads").iterdir())

    big = cluster.root / "big.bin"
    with open(big, "wb") as f:
        f.truncate(9 * MIB)
    r = send(big)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert (f"document of {9 * MIB} bytes (9.0 MiB) exceeds this node's limit of {8 * MIB} bytes (8 MiB"
            in r.stderr), r.stderr
    assert not any((cluster.root / A / "uploads").iterdir())
