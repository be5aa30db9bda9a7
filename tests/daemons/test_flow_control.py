"""Seed 004 flow control: a window of unacknowledged DATA frames per
connection. A sender over the window gets OVER_WINDOW for the excess (nothing
stored, nothing lost) and slows down; a well-behaved node never exceeds it.
Real processes here; the same rules over memory streams with a fake clock,
among them that the node's window counts stored copies only, are in
tests/daemons/test_daemon_logic.py."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from semq.node.api import NodeClient
from semq.umxt_protocol import (
    LK0,
    LK1,
    AckBatch,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Hello,
    Kind,
    Nack,
    RawFrame,
    ResultCode,
    Welcome,
    encode_frame,
)
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e
A, B = "10008", "56001"


def small_window(c: Cluster, window: int) -> None:
    cfg = c.root / "P" / "semq.toml"
    cfg.write_text(re.sub(r"window = \d+", f"window = {window}", cfg.read_text()))


def test_sender_over_the_window_gets_over_window_and_nothing_is_stored(plain_cluster: Cluster) -> None:
    c = plain_cluster
    for o in (A, B):
        c.add_org(o)
    small_window(c, 8)
    c.start_platform()
    me, p = Endpoint.org(A), Endpoint.platform()
    frames = [encode_frame(Frame(kind=Kind.HELLO, source=me, target=p, body=Hello()))]
    frames += [encode_frame(Frame(kind=Kind.DATA, source=me, target=Endpoint.org(B),
                                  body=Data(lk0=LK0(endpoint=me, record_id=i), app_data=b"x")))
               for i in range(1, 21)]
    dec = FrameDecoder()
    got: list[Frame] = []
    with socket.create_connection(("127.0.0.1", c.port), timeout=5) as s:
        s.sendall(b"".join(frames))  # 20 DATA frames at once against a window of 8
        s.settimeout(3)
        try:
            while len([f for f in got if f.kind is Kind.NACK]) < 12 and (chunk := s.recv(65536)):
                dec.receive_data(chunk)
                got += [r.frame() for r in dec]
        except TimeoutError:
            pass
    welcome = next(f.body for f in got if isinstance(f.body, Welcome))
    assert welcome.window == 8
    nacks = [f.body for f in got if isinstance(f.body, Nack)]
    assert len(nacks) == 12 and {n.code for n in nacks} == {ResultCode.OVER_WINDOW}
    assert sorted(n.lk0.record_id for n in nacks) == list(range(9, 21))
    # The 8 within the window were stored for offline B; the 12 over it were not.
    wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 8, 10, "8 stored")
    assert c.count("P", "SELECT count(*) FROM seen") == 8


def test_node_respects_a_small_window_and_delivers_everything(plain_cluster: Cluster) -> None:
    c = plain_cluster
    for o in (A, B):
        c.add_org(o)
    small_window(c, 8)
    c.start_platform()
    c.start_node(B)
    with NodeClient(c.root / A) as node:
        node.send_many([dict(to=B, data=f"doc {i}".encode(), data_type="T") for i in range(200)])
    c.start_node(A)
    wait_until(lambda: len(c.inbox(B)) == 200, 60, "200 documents through a window of 8")
    wait_until(lambda: c.settled([A, B]), 60, "cleanup")
    assert "over the window" not in (c.root / "platform.log").read_text()


def test_reloaded_window_applies_to_the_running_session(tmp_path: Path) -> None:
    from semq.node.core import NodeCore
    from semq.node.daemon import NodeDaemon, NodeSettings

    core = NodeCore(tmp_path / "n.sqlite", A, create=True, synchronous="OFF")
    try:
        d = NodeDaemon(core, NodeSettings(window=4096))
        d.platform_window = d.granted = d.window = 1024  # as after WELCOME(window=1024)
        d.set_window(64)
        assert (d.s.window, d.granted, d.window) == (64, 64, 64)
        d.set_window(100_000)  # never above what the platform granted
        assert (d.granted, d.window) == (1024, 64)  # grows back by additive increase
    finally:
        core.close()


def _read_until(sock: socket.socket, dec: FrameDecoder, got: list[Frame], done: Callable[[], bool],
                timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out; got {[f.kind.name for f in got]}")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("the node closed the connection")
        dec.receive_data(chunk)
        got += [r.frame() for r in dec]


def _delivered(i: int, stored: bool = True) -> bytes:
    """A's document i as the platform delivers it to B: a stored copy (with
    an LK1) or forwarded (none)."""
    p, me, a = Endpoint.platform(), Endpoint.org(B), Endpoint.org(A)
    return encode_frame(Frame(kind=Kind.DATA, source=p, target=me, origin=a, ack2=False,
                              body=Data(lk0=LK0(endpoint=a, record_id=i),
                                        lk1=LK1(record_id=100 + i) if stored else None,
                                        app_data=f"doc {i}".encode())))


@contextmanager
def _node_behind_a_fake_platform(c: Cluster, window: int) -> Iterator[tuple[socket.socket, FrameDecoder,
                                                                            list[Frame]]]:
    """Node B with ``window`` connected to a platform that ignores windows
    (this test): the connection, its decoder and the frames read, after
    B's HELLO."""
    d = c.add_org(B)
    cfg = d / "semq.toml"
    cfg.write_text(re.sub(r"window = \d+", f"window = {window}", cfg.read_text()))
    with socket.create_server(("127.0.0.1", c.port)) as srv:
        srv.settimeout(20)
        c.start_node(B)
        conn, _ = srv.accept()
        with conn:
            dec, got = FrameDecoder(), list[Frame]()
            _read_until(conn, dec, got, lambda: any(f.kind is Kind.HELLO for f in got))
            yield conn, dec, got


def test_node_over_its_window_refuses_the_excess_with_over_window(plain_cluster: Cluster) -> None:
    """The other direction: a platform that sends a node more DATA at once
    than the window the node announced gets OVER_WINDOW for the excess; the
    node stores only what is within its window, and takes the rest later."""
    c = plain_cluster
    p, me = Endpoint.platform(), Endpoint.org(B)
    with _node_behind_a_fake_platform(c, 8) as (conn, dec, got):
        hello = next(f.body for f in got if isinstance(f.body, Hello))
        assert hello.window == 8
        conn.sendall(encode_frame(Frame(kind=Kind.WELCOME, source=p, target=me, body=Welcome(window=4096)))
                     + b"".join(_delivered(i) for i in range(1, 21)))  # 20 at once

        def nacked() -> list[Nack]:
            return [f.body for f in got if isinstance(f.body, Nack)]

        def acked() -> set[int]:
            return {e.dest_ref_id for f in got if isinstance(f.body, AckBatch)
                    for e in f.body.entries}

        _read_until(conn, dec, got, lambda: len(nacked()) >= 12 and len(acked()) >= 8)
        assert {n.code for n in nacked()} == {ResultCode.OVER_WINDOW}
        assert sorted(n.lk0.record_id for n in nacked()) == list(range(9, 21))
        assert all(f.target == p for f in got if f.kind is Kind.NACK)
        assert acked() == {100 + i for i in range(1, 9)}  # ACKs name our LK1
        wait_until(lambda: len(c.inbox(B)) == 8, 10, "8 within the window in the inbox")
        # Sent again within the window: taken, each once.
        conn.sendall(b"".join(_delivered(i) for i in range(9, 17)))
        _read_until(conn, dec, got, lambda: len(acked()) >= 16)
        conn.sendall(b"".join(_delivered(i) for i in range(17, 21)) + _delivered(1))  # and a duplicate
        _read_until(conn, dec, got, lambda: len(acked()) >= 20)
        wait_until(lambda: len(c.inbox(B)) == 20, 10, "all 20 in the inbox")
        assert len(nacked()) == 12
    assert "stored copies beyond our window of 8" in (c.root / f"{B}.log").read_text()


def test_platform_takes_back_a_copy_the_node_refused_over_its_window(tmp_path: Path) -> None:
    from semq.platform.core import PlatformCore
    from semq.umxt_protocol import FrameDecoder as Dec

    def raw(frame: Frame) -> list[RawFrame]:
        d = Dec()
        d.receive_data(encode_frame(frame))
        return list(d)

    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B])
        a, b, p = Endpoint.org(A), Endpoint.org(B), Endpoint.platform()
        lk0 = LK0(endpoint=a, record_id=7)
        core.handle(a, raw(Frame(kind=Kind.DATA, source=a, target=b, body=Data(lk0=lk0, app_data=b"x"))),
                    {})  # B offline: stored
        _, n = core.claim_stored(b, 10)
        # SS_SENT, held in memory for up to a second (SS_INIT on disk).
        assert n == 1 and core.conn.execute("SELECT state FROM stored").fetchone() == (0,) and core.held()
        out = core.handle(b, raw(Frame(kind=Kind.NACK, source=b, target=p,
                                       body=Nack(lk0=lk0, code=ResultCode.OVER_WINDOW))), {a: 1 << 40, b: 1 << 40})
        assert out.credit[b] == 1 and out.over_window[b] == 1 and b in out.stored_for
        # SS_INIT: goes again (written with the attempt it had).
        assert core.conn.execute("SELECT state, attempts FROM stored").fetchone() == (0, 1) and not core.held()
        _, n = core.claim_stored(b, 10)
        assert n == 1  # delivered again; nothing lost
    finally:
        core.close()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture
def slow_inquiry_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Plain TCP, inquiries every 2 s: tens of thousands of rows asking
    every 0.5 s would measure the inquiry loop, not the flow control."""
    c = Cluster(tmp_path, security=False, inquiry_interval=2.0)
    try:
        yield c
    finally:
        c.stop_all()


def test_a_stalled_node_does_not_grow_platform_memory_and_loses_nothing(slow_inquiry_cluster: Cluster) -> None:
    """B says HELLO and then never reads. A sends 40 MiB to it: the platform
    forwards until B's queue reaches its high-water mark (queue_mib = 4), then
    stores the rest on disk instead of buffering it: B's queue never holds
    more than the mark (plus one batch), and the platform's memory stays a
    working set, not what was sent. When the real B comes, every document
    arrives exactly once (the copies lost in the stalled link come again
    when A's inquiry learns B lacks them)."""
    from semq.ops.admin import admin_call

    c = slow_inquiry_cluster
    for o in (A, B):
        c.add_org(o)
    cfg = c.root / "P" / "semq.toml"
    cfg.write_text(cfg.read_text().replace("queue_mib = 16", "queue_mib = 4"))
    n, size = 40_000, 1024
    platform = c.start_platform()
    c.start_node(A)
    base = _rss_mib(platform.p.pid)
    b, p = Endpoint.org(B), Endpoint.platform()
    stalled = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(encode_frame(Frame(kind=Kind.HELLO, source=b, target=p, body=Hello(window=4096))))
        dec, got = FrameDecoder(), list[Frame]()
        _read_until(stalled, dec, got, lambda: any(f.kind is Kind.WELCOME for f in got))
        wait_until(lambda: B in json.loads((c.root / "P" / "status.json").read_text()).get("online", []),
                   10, "the stalled B online")
        peak_rss, peak_queue = base, 0

        def taken() -> bool:
            nonlocal peak_rss, peak_queue
            peak_rss = max(peak_rss, _rss_mib(platform.p.pid))
            st = admin_call(c.root / "P" / "admin.sock", "status")
            peak_queue = max([peak_queue, *(s["queued_bytes"] for s in st["sessions"] if s["node"] == B)])
            return c.count(A, "SELECT count(*) FROM outbox WHERE state IN (2, 3)") == n  # ACK_FWD or ACK_SAVE

        with NodeClient(c.root / A) as node:
            for i in range(0, n, 5000):
                node.send_many([dict(to=B, data=i.to_bytes(8, "big") + j.to_bytes(8, "big") + b"x" * (size - 16),
                                     data_type="T") for j in range(i, i + 5000)])
                taken()
        wait_until(taken, 120, f"{n} documents forwarded or stored", interval=0.25)
        stored = c.count("P", "SELECT count(*) FROM stored WHERE kind=1")
        forwarded = n - stored
        # Into the stalled link: the mark (4 MiB) plus at most a batch; the
        # rest went to disk.
        assert forwarded * size < (4 + 1) << 20, (forwarded, stored)
        assert 0 < peak_queue < (4 + 1) << 20, peak_queue
        # Memory: a working set (the queue, SQLite's 16 MiB page cache, read
        # buffers, allocator slack: 30-55 MiB here, whatever was sent; the
        # load benchmark shows it with a million stored documents).
        assert peak_rss - base < 100, f"platform RSS grew {peak_rss - base:.0f} MiB"
    finally:
        stalled.close()
    c.start_node(B)
    wait_until(lambda: c.count(B, "SELECT count(*) FROM inbox") == n, 120, f"all {n} in B's inbox")
    wait_until(lambda: c.settled([A, B]), 60, "cleanup")
    assert c.count(B, "SELECT count(DISTINCT record_id) FROM inbox") == n
