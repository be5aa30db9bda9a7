"""Request / reply (seed 000): pseudo-synchronous inquiry and update, the
asynchronous inquiry, correlation exactly once — real processes."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import trio

from semq.cli.features import main as seed
from semq.node.api import NodeClient
from semq.node.features import rpc
from semq.node.features.tasks import request_async
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77000"


def responder(d: Path, stop: threading.Event, answer: bytes = b"", *, delay: float = 0.0) -> threading.Thread:
    """B's application: answers every request with ``answer`` (or the
    request's own data reversed)."""

    def run() -> None:
        with NodeClient(d) as node:
            while not stop.is_set():
                for item, _ in rpc.incoming(node):
                    time.sleep(delay)
                    rpc.reply(node, item.id, answer or item.app_data[::-1])
                time.sleep(0.02)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def up(cluster: Cluster, *orgs: str) -> None:
    for o in orgs:
        cluster.add_org(o)
    cluster.start_platform()
    for o in orgs:
        cluster.start_node(o)


def test_pseudo_synchronous_request_cli_and_api(cluster: Cluster, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    up(cluster, A, B)
    stop = threading.Event()
    t = responder(cluster.root / B, stop)
    try:
        inquiry = tmp_path / "inquiry.txt"
        inquiry.write_bytes(b"price of 4711?")
        out = tmp_path / "answer.txt"
        assert seed(["request", "--dir", str(cluster.root / A), "--to", B, "--type", "PRICE", "--timeout", "20",
                     "--out", str(out), str(inquiry)]) == 0
        assert out.read_bytes() == b"?1174 fo ecirp"
        assert f"from {B} to request {A}/1/1/" in capsys.readouterr().err
        with NodeClient(cluster.root / A) as node:
            got = rpc.request(node, B, b"update 1", data_type="STOCK", key="S-1", timeout=20)
            assert got.data == b"1 etadpu"
            assert got.item.app_key.key == str(got.request) and got.item.app_key.subtype == "reply"
            assert got.item.consumed_ms is None or got.item.consumed_ms > 0
            # The reply was taken: it is no longer unread in the inbox.
            assert all(i.id != got.item.id for i in node.inbox())
    finally:
        stop.set()
        t.join(10)
    # B answered each request once and acknowledged it.
    with NodeClient(cluster.root / B) as node:
        answered = rpc.incoming(node, include_answered=True)
        assert len(answered) == 2 and all(r is not None for _, r in answered)
        assert rpc.incoming(node) == []


async def test_request_async_in_trio(cluster: Cluster) -> None:
    up(cluster, A, B)
    stop = threading.Event()
    t = responder(cluster.root / B, stop, b"pong")
    try:
        with NodeClient(cluster.root / A) as node:
            async with trio.open_nursery() as nursery:
                results: list[bytes] = []

                async def one(i: int) -> None:
                    got = await request_async(node, B, f"ping {i}".encode(), data_type="PING", timeout=20)
                    results.append(got.data)

                for i in range(3):
                    nursery.start_soon(one, i)
            assert results == [b"pong"] * 3
            with pytest.raises(rpc.ReplyTimeout):
                stop.set()
                t.join(10)
                await request_async(node, B, b"nobody answers", data_type="PING", timeout=0.5)
    finally:
        stop.set()


def test_timeout_exit_3_then_the_late_reply_is_correlated(cluster: Cluster, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)  # B is offline: the request is stored at the platform
    da, db = str(cluster.root / A), str(cluster.root / B)
    doc = tmp_path / "q.txt"
    doc.write_bytes(b"how many?")
    t0 = time.monotonic()
    assert seed(["request", "--dir", da, "--to", B, "--type", "COUNT", "--timeout", "1", str(doc)]) == 3
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    m = re.match(rf"error: no reply from {B} to request ({A}/1/1/\d+) within 1 s", err)
    assert m and err.count("\n") == 1
    first = m.group(1)
    # Asynchronous inquiry: another request, without waiting.
    assert seed(["request", "--dir", da, "--to", B, "--type", "COUNT", "--no-wait", str(doc)]) == 0
    second = capsys.readouterr().out.strip()
    assert second == f"{A}/1/1/{int(first.rsplit('/', 1)[1]) + 1}"
    cluster.start_node(B)
    wait_until(lambda: seed(["requests", "--dir", db, "--json"]) == 0
               and len(json.loads(capsys.readouterr().out)) == 2, 30, "both requests at B")
    assert seed(["requests", "--dir", db, "--json"]) == 0
    reqs = json.loads(capsys.readouterr().out)
    assert [r["lk0"] for r in reqs] == [first, second]
    for r, answer in zip(reqs, ("7", "8"), strict=True):
        (tmp_path / "a").write_text(answer)
        assert seed(["reply", "--dir", db, "--to-request", str(r["id"]), "-q", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    # Answering twice is refused (one reply per request).
    assert seed(["reply", "--dir", db, "--to-request", str(reqs[0]["id"]), str(tmp_path / "a")]) == 2
    assert "was already answered by" in capsys.readouterr().err

    def replied() -> bool:
        seed(["replies", "--dir", da, "--json"])
        rows = json.loads(capsys.readouterr().out)["requests"]
        return [r["state"] for r in rows] == ["replied", "replied"]

    wait_until(replied, 30, "both replies matched at A")
    assert seed(["replies", "--dir", da, "--take", first]) == 0
    assert capsys.readouterr().out == "7"
    assert seed(["replies", "--dir", da, "--take", second]) == 0
    assert capsys.readouterr().out == "8"
    assert seed(["replies", "--dir", da]) == 0
    assert "0 request(s)" in capsys.readouterr().err  # both taken
    assert seed(["replies", "--dir", da, "--take", f"{A}/1/1/99"]) == 2
    assert f"no request {A}/1/1/99 recorded here" in capsys.readouterr().err


def test_reply_is_matched_exactly_once_and_only_from_the_asked_org(cluster: Cluster) -> None:
    up(cluster, A, B, C)
    with NodeClient(cluster.root / A) as a:
        a.send(B, b"an order", data_type="ORDER")
        lk0 = rpc.send_request(a, B, b"?", data_type="Q")
    with NodeClient(cluster.root / B) as b:
        wait_until(lambda: rpc.incoming(b), 20, "the request at B")
        order = next(i for i in b.inbox() if i.app_key.data_type == "ORDER")
        [(item, _)] = rpc.incoming(b)
        rpc.reply(b, item.id, b"first")
        # A second document with the same correlation key (a buggy app).
        b.send(A, b"second", domain="semq.rpc", data_type="Q", subtype="reply", key=str(lk0))
        with pytest.raises(rpc.RpcError, match="already answered"):
            rpc.reply(b, item.id, b"third")
        with pytest.raises(rpc.RpcError, match=f"inbox document {order.id} is not a request"):
            rpc.reply(b, order.id, b"x")
        with pytest.raises(rpc.RpcError, match="no inbox document 999999"):
            rpc.reply(b, 999_999, b"x")
    with NodeClient(cluster.root / C) as c:  # a third organization tries to answer
        c.send(A, b"forged", domain="semq.rpc", data_type="Q", subtype="reply", key=str(lk0))
    with NodeClient(cluster.root / A) as a:
        wait_until(lambda: len([i for i in a.inbox() if i.app_key.subtype == "reply"]) == 3, 30, "3 replies at A")
        got = rpc.take_reply(a, lk0)
        assert got.data == b"first"
        assert rpc.take_reply(a, lk0).item.id == got.item.id  # taking again: the same one
        stray = {it.app_data: why for it, why in rpc.unmatched_replies(a)}
        assert stray[b"second"] == f"request {lk0} already has its reply (inbox {got.item.id})"
        assert stray[b"forged"] == f"request {lk0} went to {B}, not to {C}"
        [info] = rpc.replies(a, include_taken=True)
        assert info.state == "taken" and info.reply_inbox_id == got.item.id
