"""Live receive with real processes on 127.0.0.1 (security on): a
follower is woken by the node daemon when a document commits into the
inbox (no polling), ``semq inbox --follow`` prints documents as they
arrive, and ``semq receive --exec`` runs a command per document — acked on
exit 0, retried then parked otherwise, run again after its own SIGKILL
(at least once), with the sender's values never shell-interpreted."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.node.api import InboxItem, NodeClient
from semq.ops.usersock import UserClient
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def _up(c: Cluster) -> None:
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)


def _send(c: Cluster, data: bytes, **kw: Any) -> str:
    kw.setdefault("data_type", "ORDER")
    with NodeClient(c.root / A) as a:
        return str(a.send(kw.pop("to", B), data, **kw))


def _unread(c: Cluster) -> int:
    return c.count(B, "SELECT count(*) FROM inbox WHERE consumed_ms IS NULL")


def test_follow_yields_each_document_as_it_arrives_woken_by_the_daemon(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    node = NodeClient(c.root / B)
    reads: list[float] = []
    real = node.inbox_after

    def counted(*a: Any, **kw: Any) -> list[InboxItem]:
        reads.append(time.monotonic())
        return real(*a, **kw)

    node.inbox_after = counted  # type: ignore[method-assign]
    got: queue.Queue[tuple[float, InboxItem]] = queue.Queue()

    def follow() -> None:
        for n, item in enumerate(node.follow(timeout=60), 1):
            got.put((time.monotonic(), item))
            if n == 2:
                return

    threading.Thread(target=follow, daemon=True).start()
    try:
        first = _send(c, b"<order>warm-up</order>", key="S0")  # the certificates are fetched once
        _, item = got.get(timeout=30)
        assert str(item.lk0) == first and item.app_data == b"<order>warm-up</order>"
        # Quiet: the follower waits on the daemon and does not read the store.
        n = len(reads)
        time.sleep(3)
        assert len(reads) == n, "the follower read the store while nothing arrived"
        t0 = time.monotonic()
        second = _send(c, b"<order>live</order>", key="S1")
        at, item = got.get(timeout=10)
        assert str(item.lk0) == second and item.app_key.key == "S1"
        assert at - t0 < 2.0, f"yielded {at - t0:.2f} s after it was sent"
        assert len(reads) - n <= 3  # once per wake, not in a loop
        assert got.empty()  # each document once
    finally:
        time.sleep(0.2)
        node.close()


def test_afollow_under_trio_and_a_users_follow_over_the_user_socket(cluster: Cluster) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B)
    with NodeClient(c.root / B) as b:
        token = b.add_user("alice")
    c.start_platform()
    c.start_node(A)
    c.start_node(B)

    async def main() -> list[tuple[float, InboxItem]]:
        out: list[tuple[float, InboxItem]] = []
        with NodeClient(c.root / B) as node:
            async with trio.open_nursery() as n:
                async def follow() -> None:
                    async for item in node.afollow(timeout=30):
                        out.append((time.monotonic(), item))
                        if len(out) == 2:
                            n.cancel_scope.cancel()

                n.start_soon(follow)
                await trio.to_thread.run_sync(lambda: _send(c, b"one", key="K1"))
                with trio.fail_after(30):
                    while not out:
                        await trio.sleep(0.05)
                await trio.sleep(1)
                sent = time.monotonic()
                await trio.to_thread.run_sync(lambda: _send(c, b"two", key="K2", to=f"{B}/alice"))
                with trio.fail_after(10):
                    while len(out) < 2:
                        await trio.sleep(0.05)
                assert out[1][0] - sent < 2.0
        return out

    out = trio.run(main)
    assert [i.app_data for _, i in out] == [b"one", b"two"] and out[1][1].to_user == "alice"

    # Alice's application, with her token: her documents only, as they arrive.
    me = UserClient(c.root / B / "user.sock", "alice", token)
    got: queue.Queue[dict[str, Any]] = queue.Queue()
    def follow() -> None:
        for n, d in enumerate(me.follow(timeout=30), 1):
            got.put(d)
            if n == 2:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert got.get(timeout=10)["data"] == b"two"  # unacknowledged: given first
    _send(c, b"for the organization", key="K3")  # not hers
    sent = time.monotonic()
    _send(c, b"three", key="K4", to=f"{B}/alice")
    d = got.get(timeout=10)
    assert d["data"] == b"three" and d["to_user"] == "alice" and time.monotonic() - sent < 3.0
    thread.join(timeout=10)


def _lines(proc: subprocess.Popen[bytes]) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line.decode())

    threading.Thread(target=pump, daemon=True).start()
    return q


def _semq(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "semq", *args], stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kw)


def test_inbox_follow_prints_a_document_that_arrives_later(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    proc = _semq("inbox", "--dir", str(c.root / B), "--follow", "--json", "--ack", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    try:
        lines = _lines(proc)
        time.sleep(1.5)
        assert lines.empty()
        lk0 = _send(c, b"<order/>", key="\x1b[2Jlate")
        d = json.loads(lines.get(timeout=30))
        assert d["lk0"] == lk0 and d["app_key"] == "/ORDER//\x1b[2Jlate" and isinstance(d["received_ms"], int)
        wait_until(lambda: _unread(c) == 0, 10, "--ack to acknowledge it")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
    # The human form: one line, the AppKey's control characters escaped, a time.
    proc = _semq("inbox", "--dir", str(c.root / B), "--follow", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = _lines(proc)
        assert lines.get(timeout=10).split()[0] == "ID"
        _send(c, b"<order/>", key="\x1b[2Jagain")
        line = lines.get(timeout=30)
        assert "\x1b" not in line and "\\x1b[2Jagain" in line and time.strftime("%Y-%m-%d") in line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)


def _receive(c: Cluster, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return _semq("receive", "--dir", str(c.root / B), *args, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                 cwd=c.root)


def test_receive_exec_acks_and_passes_the_senders_values_as_data(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    out = c.root / "out"
    out.mkdir()
    hostile = "$(touch PWNED);`touch PWNED2`;'\"\n\x07"
    cmd = ('cat > "out/$SEMQ_ID.doc" && printf %s "$SEMQ_KEY" > "out/$SEMQ_ID.key"'
           ' && env | grep ^SEMQ_ | sort > "out/$SEMQ_ID.env"')
    proc = _receive(c, c.root / "receive.log", "--exec", cmd)
    try:
        lk0 = _send(c, b"<order>1</order>", key=hostile, domain="trade", subtype="PO")
        wait_until(lambda: list(out.glob("*.env")) and _unread(c) == 0, 30, "the command to take the document")
        [doc] = out.glob("*.doc")
        assert doc.read_bytes() == b"<order>1</order>"
        assert doc.with_suffix(".key").read_text() == hostile  # as it came: never interpreted
        assert not (c.root / "PWNED").exists() and not (c.root / "PWNED2").exists()
        env = doc.with_suffix(".env").read_text()
        for line in (f"SEMQ_LK0={lk0}", f"SEMQ_FROM={A}", "SEMQ_TYPE=ORDER", "SEMQ_DOMAIN=trade",
                     "SEMQ_SUBTYPE=PO", "SEMQ_SIZE=16", f"SEMQ_ID={doc.stem}"):
            assert line in env.splitlines(), env
        assert "acknowledged" in (c.root / "receive.log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_receive_retries_a_failing_command_then_parks_it_and_retry_gives_it_back(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    log = c.root / "receive.log"
    proc = _receive(c, log, "--exec", 'echo "no stock for $SEMQ_KEY" >&2; exit 3', "--max-tries", "3",
                    "--backoff", "0.2")
    try:
        _send(c, b"<order/>", key="S1")
        wait_until(lambda: "parked after 3 tries" in log.read_text(), 30, "the document to be parked")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    text = log.read_text()
    assert "exit 3; try 1 of 3, next in 0.2 s" in text and "exit 3; try 2 of 3, next in 0.4 s" in text
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--parked", "--json"],
                       capture_output=True, timeout=30)
    [p] = json.loads(r.stdout)
    assert (p["tries"], p["last_code"], p["app_key"]) == (3, 3, "/ORDER//S1")
    assert "no stock for S1" in p["stderr_tail"] and p["parked_ms"]
    assert _unread(c) == 1  # parked: not acknowledged, kept
    # A restarted receive leaves it parked; --retry gives it back.
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--once", "--exec",
                        "cat >/dev/null"], capture_output=True, timeout=30)
    assert r.returncode == 0 and _unread(c) == 1
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--retry",
                        str(p["id"]), "999999"], capture_output=True, timeout=30)
    assert r.returncode == 1 and b"document 999999 is not in the inbox" in r.stderr
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--once", "--exec",
                        "cat >/dev/null"], capture_output=True, timeout=30)
    assert r.returncode == 0 and _unread(c) == 0 and b"acknowledged" in r.stderr


def test_receive_killed_mid_document_runs_it_again_after_a_restart(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    log = c.root / "receive.log"
    # The first run records itself and hangs; the next one takes the document.
    cmd = ('echo "$SEMQ_ID" >> runs; if [ -e first ]; then cat > got; else touch first; exec sleep 5; fi')
    proc = _receive(c, log, "--exec", cmd)
    try:
        _send(c, b"<order>once</order>", key="S1")
        wait_until(lambda: (c.root / "first").exists(), 30, "the first run to start")
        proc.kill()  # SIGKILL mid-document
        proc.wait(timeout=10)
        assert _unread(c) == 1  # not acknowledged: never lost
        proc = _receive(c, log, "--exec", cmd)
        wait_until(lambda: _unread(c) == 0, 30, "the restarted receive to take it")
        assert (c.root / "got").read_bytes() == b"<order>once</order>"
        runs = (c.root / "runs").read_text().split()
        assert len(runs) == 2 and runs[0] == runs[1]  # at least once: the same document, run again
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_receive_holds_an_ordered_channel_behind_its_failing_document(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    log = c.root / "receive.log"
    cmd = 'if [ "$SEMQ_KEY" = S1 ] && [ ! -e ok ]; then exit 1; fi; echo "$SEMQ_KEY" >> taken'
    for key in ("S1", "S2", "S3"):
        _send(c, key.encode(), key=key, ordered="orders")
    proc = _receive(c, log, "--exec", cmd, "--max-tries", "2", "--backoff", "0.3")
    try:
        wait_until(lambda: "parked after 2 tries" in log.read_text(), 30, "S1 to be parked")
        _send(c, b"unordered", key="U1")  # other documents keep flowing
        wait_until(lambda: (c.root / "taken").exists() and "U1" in (c.root / "taken").read_text(), 30, "U1")
        time.sleep(1)
        assert (c.root / "taken").read_text().split() == ["U1"]  # S2 and S3 wait for S1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    (c.root / "ok").touch()
    [parked] = json.loads(subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B),
                                          "--parked", "--json"], capture_output=True, timeout=30).stdout)
    assert subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--retry",
                           str(parked["id"])], capture_output=True, timeout=30).returncode == 0
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--once", "--exec", cmd],
                       capture_output=True, timeout=60, cwd=c.root)
    assert r.returncode == 0, r.stderr
    assert (c.root / "taken").read_text().split() == ["U1", "S1", "S2", "S3"]


def test_follow_waits_on_every_unit_of_a_node(cluster: Cluster) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B, units=2)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    got: queue.Queue[InboxItem] = queue.Queue()

    def follow() -> None:
        with NodeClient(c.root / B) as node:
            for n, item in enumerate(node.follow(timeout=60), 1):
                got.put(item)
                if n == 8:
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    sent = [_send(c, b"doc %d" % i, key=f"K{i}") for i in range(8)]
    items = [got.get(timeout=30) for _ in sent]
    assert sorted(str(i.lk0) for i in items) == sorted(sent)
    assert {i.unit for i in items} == {1, 2}  # both units' inboxes, each document once
    thread.join(timeout=10)


def test_follow_without_a_daemon_says_so_once_and_takes_documents_once_it_runs(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    c = cluster
    c.add_org(A)
    c.add_org(B)
    caplog.set_level(logging.WARNING, logger="semq.node.api")
    got: queue.Queue[InboxItem] = queue.Queue()

    def follow() -> None:
        with NodeClient(c.root / B) as node:
            for item in node.follow(timeout=60):
                got.put(item)
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(3.5)  # three tries at least, one line
    away = [r for r in caplog.records if "waiting for the node daemon, trying again every second" in r.message]
    assert len(away) == 1, [r.message for r in caplog.records]
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    lk0 = _send(c, b"<order/>", key="S1")
    assert str(got.get(timeout=30).lk0) == lk0
    thread.join(timeout=10)


def test_receive_kills_a_command_that_hangs_after_its_timeout(cluster: Cluster) -> None:
    c = cluster
    _up(c)
    log = c.root / "receive.log"
    proc = _receive(c, log, "--exec", "echo started >&2; exec sleep 60", "--timeout", "0.5", "--max-tries", "1")
    try:
        t0 = time.monotonic()
        _send(c, b"<order/>", key="SLOW")
        wait_until(lambda: "parked after 1 try" in log.read_text(), 30, "the hanging run to be killed")
        assert time.monotonic() - t0 < 20
        assert "timed out" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    r = subprocess.run([sys.executable, "-m", "semq", "receive", "--dir", str(c.root / B), "--parked", "--json"],
                       capture_output=True, timeout=30)
    [p] = json.loads(r.stdout)
    assert p["last_code"] == -signal.SIGKILL and "started" in p["stderr_tail"]
    assert "killed after 0.5 s (--timeout)" in p["stderr_tail"]
