"""Local durable queues (seed 004): create / destroy / enqueue / dequeue /
ack / recover, leases, durability across a killed consumer, the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.cli.features import main as seed
from semq.node.features.queues import LocalQueues, QueueError

A = "10008"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / A
    assert semq_main(["node", "init", "--dir", str(d), "--org", A, "--no-security"]) == 0
    return d


def test_fifo_lease_ack_release(node: Path) -> None:
    with LocalQueues(node) as q:
        assert q.create("jobs") is True
        assert q.create("jobs", exist_ok=True) is False
        with pytest.raises(QueueError, match="already exists"):
            q.create("jobs")
        ids = q.enqueue_many("jobs", [b"a", b"b", b"c"])
        first = q.dequeue("jobs", lease=30)
        assert first is not None and (first.id, first.data, first.delivery) == (ids[0], b"a", 1)
        second = q.dequeue("jobs")
        assert second is not None and second.data == b"b"  # "a" is in flight: invisible
        q.release("jobs", second.id)
        again = q.dequeue("jobs")
        assert again is not None and (again.data, again.delivery) == (b"b", 2)
        q.ack("jobs", first.id)
        with pytest.raises(QueueError, match="acknowledged already"):
            q.ack("jobs", first.id)
        third = q.dequeue("jobs")
        assert third is not None and third.data == b"c"
        assert q.dequeue("jobs") is None
        with pytest.raises(QueueError, match="not in flight"):
            q.ack("jobs", q.enqueue("jobs", b"d"))  # never dequeued
        [st] = q.stats("jobs")
        assert (st.ready, st.in_flight, st.max_delivery) == (1, 2, 2)


def test_expired_lease_comes_back_first_and_late_ack_is_refused(node: Path) -> None:
    with LocalQueues(node) as q:
        q.create("jobs")
        q.enqueue_many("jobs", [b"old", b"new"])
        t = 1_000_000
        old = q.dequeue("jobs", lease=5, now_ms_=t)
        assert old is not None and old.data == b"old"
        nxt = q.dequeue("jobs", lease=5, now_ms_=t + 4_999)
        assert nxt is not None and nxt.data == b"new"
        back = q.dequeue("jobs", lease=5, now_ms_=t + 5_000)  # the lease ended: visible, and older
        assert back is not None and (back.id, back.delivery) == (old.id, 2)
        [st] = q.stats("jobs", now_ms_=t + 5_000)
        assert (st.ready, st.in_flight, st.expired_leases) == (0, 2, 0)
        with pytest.raises(QueueError, match="was dequeued again since delivery 1"):
            q.ack("jobs", old.id, delivery=old.delivery)
        q.ack("jobs", back.id, delivery=back.delivery)


def test_names_limits_destroy_and_isolation(node: Path) -> None:
    with LocalQueues(node) as q:
        for bad in ("", "-x", "a b", "x" * 129, "é"):
            with pytest.raises(QueueError, match="is not 1-128 characters"):
                q.create(bad)
        with pytest.raises(QueueError, match="no queue 'nope'"):
            q.enqueue("nope", b"x")
        q.create("a")
        q.create("b")
        q.enqueue("a", b"1")
        assert q.dequeue("b") is None
        with pytest.raises(QueueError, match="still holds 1 item"):
            q.destroy("a")
        assert q.destroy("a", force=True) == 1
        assert q.names() == ["b"]
        assert q.destroy("b") == 0
        with pytest.raises(QueueError, match="positive number of seconds"):
            q.dequeue("x", lease=0)


CONSUMER = textwrap.dedent("""
    import sys, time
    from semq.node.features.queues import LocalQueues
    q = LocalQueues(sys.argv[1])
    item = q.dequeue("jobs", lease=3600)
    print(item.id, flush=True)
    time.sleep(120)  # "working" when it is killed
""")


def test_killed_consumer_item_stays_invisible_until_recover(node: Path) -> None:
    with LocalQueues(node) as q:
        q.create("jobs")
        ids = q.enqueue_many("jobs", [b"precious", b"other"])
    p = subprocess.Popen([sys.executable, "-c", CONSUMER, str(node)], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert int(line) == ids[0]
    finally:
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=20) == -signal.SIGKILL
    with LocalQueues(node) as q:  # the application restarts
        other = q.dequeue("jobs")
        assert other is not None and other.data == b"other"  # the leased one is still invisible
        q.ack("jobs", other.id)
        assert q.dequeue("jobs") is None
        assert q.recover("jobs") == 1
        item = q.dequeue("jobs")
        assert item is not None and (item.id, item.data, item.delivery) == (ids[0], b"precious", 2)
        q.ack("jobs", item.id)
        assert q.stats("jobs")[0].ready == 0


def test_enqueued_items_survive_a_killed_producer(node: Path) -> None:
    script = ("import sys, os, signal\nfrom semq.node.features.queues import LocalQueues\nq = LocalQueues(sys.argv[1])\n"
              "q.create('jobs')\nprint(q.enqueue('jobs', b'durable'), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", script, str(node)], capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL and p.stdout.strip() == b"1"
    with LocalQueues(node) as q:
        item = q.dequeue("jobs")
        assert item is not None and item.data == b"durable"


def test_cli(node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--dir", str(node)]
    f = tmp_path / "job.bin"
    f.write_bytes(b"job-1")
    assert seed(["queue", "create", *d, "jobs"]) == 0
    assert seed(["queue", "put", *d, "jobs", str(f)]) == 0
    assert seed(["queue", "put", *d, "jobs", str(f)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["1", "2"]
    assert seed(["queue", "get", *d, "jobs", "--lease", "60"]) == 0
    out = capsys.readouterr()
    assert out.out == "job-1" and "semq queue ack jobs 1" in out.err
    assert seed(["queue", "get", *d, "jobs", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["id"], got["delivery"]) == (2, 1)
    assert seed(["queue", "get", *d, "jobs"]) == 3  # nothing visible
    assert "has no visible item" in capsys.readouterr().err
    assert seed(["queue", "list", *d, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["in_flight"] == 2
    assert seed(["queue", "recover", *d]) == 2
    assert "needs a queue NAME or --all" in capsys.readouterr().err
    assert seed(["queue", "recover", *d, "jobs"]) == 0
    assert capsys.readouterr().out == "recovered 2 in-flight item(s)\n"
    assert seed(["queue", "get", *d, "jobs", "--out", str(tmp_path / "o.bin")]) == 0
    assert capsys.readouterr().out == "1\n" and (tmp_path / "o.bin").read_bytes() == b"job-1"
    assert seed(["queue", "ack", *d, "jobs", "1"]) == 0
    assert seed(["queue", "ack", *d, "jobs", "1"]) == 2
    assert capsys.readouterr().err.endswith("error: no item 1 in queue 'jobs' (acknowledged already?)\n")
    assert seed(["queue", "destroy", *d, "jobs"]) == 2
    assert seed(["queue", "destroy", *d, "jobs", "--force"]) == 0
    assert seed(["queue", "get", *d, "nope"]) == 2


def test_cli_get_waits_for_an_item(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import threading

    d = ["--dir", str(node)]
    with LocalQueues(node) as q:
        q.create("jobs")

    def later() -> None:
        with LocalQueues(node) as q2:
            q2.enqueue("jobs", b"late")

    t = threading.Timer(0.3, later)
    t.start()
    assert seed(["queue", "get", *d, "jobs", "--wait", "10"]) == 0
    t.join()
    assert capsys.readouterr().out == "late"
