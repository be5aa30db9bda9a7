"""Seed 004 flow control: a window of unacknowledged DATA frames per
connection. A sender over the window gets OVER_WINDOW for the excess (nothing
stored, nothing lost) and slows down; a well-behaved node never exceeds it."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from semq.node.api import NodeClient
from semq.umxt_protocol import (
    LK0,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Hello,
    Kind,
    Nack,
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
