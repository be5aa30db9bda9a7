"""Metrics: served over HTTP on the trio loop and scraped with a raw socket
GET; counters move after observe_events (and through an instrumented core's
event log); the store poller and the lag probe set their gauges."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import trio

from semq.ops.metrics import (
    Metrics,
    instrument_core,
    parse_metrics_address,
    poll_store,
    probe_loop_lag,
    serve_metrics,
)
from tests.ops.test_ops_handlers import (
    A,
    B,
    NodeStandIn,
    PlatformStandIn,
    SessionStandIn,
    make_node,
    platform_with_stored,
)


def raw_get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def value(text: str, metric: str, /, **labels: str) -> float:
    """The sample ``name{labels}`` in exposition text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != metric:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


async def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str]:
    return await trio.to_thread.run_sync(raw_get, port, path, method)


async def test_served_and_counters_move(tmp_path: Path) -> None:
    m = Metrics("platform", "platform")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, "127.0.0.1", 0, m)
        code, text = await scrape(port)
        assert code == 200 and value(text, "semq_build_info", role="platform") == 1
        assert value(text, "semq_forwarded_total") == 0
        now = int(time.time() * 1000)
        m.observe_events([
            {"ts": now, "event": "received", "lk0": "a/1/1/1", "created_ms": now - 250},
            {"ts": now, "event": "forwarded", "lk0": "a/1/1/1"},
            {"ts": now, "event": "stored", "lk0": "a/1/1/2"},
            {"ts": now, "event": "stored", "lk0": "a/1/1/3"},
            {"ts": now, "event": "dropped", "code": 301},
            {"ts": now, "event": "delivered", "attempt": 2},
            {"ts": now, "event": "acked"},
            {"event": "inquiry"},
            {"no": "event"},
        ])
        m.observe_events([
            {"ts": now, "role": "origin", "event": "ack2", "created_ms": now - 2000},
            {"ts": now, "role": "origin", "event": "resend"},
            {"ts": now, "role": "receiver", "event": "inbox", "created_ms": now + 5000},  # skewed clock
            {"ts": now, "role": "receiver", "event": "duplicate"},
        ])
        # origin acks that do not repeat created_ms: timed from the first send
        m.observe_events([
            {"ts": now - 900, "role": "origin", "event": "sent", "lk0": "o/1/1/7"},
            {"ts": now - 500, "role": "origin", "event": "sent", "lk0": "o/1/1/7"},  # a resend: first one counts
            {"ts": now - 800, "role": "origin", "event": "ack_save", "lk0": "o/1/1/7"},
            {"ts": now, "role": "origin", "event": "ack2", "lk0": "o/1/1/7"},
            {"ts": now, "role": "origin", "event": "ack2", "lk0": "o/1/1/8"},  # never seen sent: not timed
        ])
        assert m._sent == {}
        m.observe_batch(64, 0.004)
        m.count("frames_in", 3)
        code, text = await scrape(port)
        assert value(text, "semq_forwarded_total") == 1
        assert value(text, "semq_stored_total") == 2
        assert value(text, "semq_dropped_total", reason="dropped") == 1
        assert value(text, "semq_acks_total", kind="ack") == 1
        assert value(text, "semq_acks_total", kind="ack2") == 3
        assert value(text, "semq_inquiries_total", role="platform") == 1
        assert value(text, "semq_resends_total", role="platform") == 1
        assert value(text, "semq_resends_total", role="origin") == 1
        assert value(text, "semq_duplicates_total") == 1
        assert value(text, "semq_events_total", role="platform", event="stored") == 2
        assert value(text, "semq_hop_latency_seconds_count", hop="origin_to_platform") == 1
        assert value(text, "semq_hop_latency_seconds_bucket", hop="origin_to_platform", le="0.25") == 1
        assert value(text, "semq_e2e_latency_seconds_count", kind="confirmed") == 2
        assert value(text, "semq_e2e_latency_seconds_bucket", kind="confirmed", le="1.0") == 1  # 0.9 s
        assert value(text, "semq_hop_latency_seconds_bucket", hop="origin_to_platform_ack", le="0.05") == 0
        assert value(text, "semq_hop_latency_seconds_count", hop="origin_to_platform_ack") == 1
        assert value(text, "semq_e2e_latency_seconds_bucket", kind="delivered", le="0.001") == 1  # clamped at 0
        assert value(text, "semq_commit_batch_size_count") == 1 and value(text, "semq_commit_seconds_sum") > 0
        assert value(text, "semq_operations_total", name="frames_in") == 3
        assert m.batch_summary()["max_size"] == 64

        assert (await scrape(port, "/nope"))[0] == 404
        assert (await scrape(port, "/metrics", "POST"))[0] == 405
        code, body = await scrape(port, "/metrics?x=1", "HEAD")
        assert code == 200 and body == ""
        nursery.cancel_scope.cancel()


async def test_instrumented_node_core_and_poller(tmp_path: Path) -> None:
    core = make_node(tmp_path, 0)
    m = Metrics("node", A)
    instrument_core(core, m)
    instrument_core(core, m)  # idempotent
    d = NodeStandIn()
    from semq.node.core import NewDocument

    try:
        core.accept([NewDocument(target=B, app_data=b"x") for _ in range(3)])
        core.claim(2)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_metrics, "127.0.0.1", 0, m)
            nursery.start_soon(poll_store, m, d, core)
            nursery.start_soon(probe_loop_lag, m)
            await trio.sleep(0.7)
            _, text = await scrape(port)
            assert value(text, "semq_events_total", role="origin", event="queued") == 3
            assert value(text, "semq_events_total", role="origin", event="sent") == 2
            assert value(text, "semq_messages", table="outbox", state="SS_INIT") == 1
            assert value(text, "semq_messages", table="outbox", state="SS_SENT") == 2
            assert value(text, "semq_messages", table="outbox", state="SS_ACK2") == 0
            assert value(text, "semq_connections") == 1
            assert value(text, "semq_store_bytes") > 0
            assert value(text, "semq_stuck_messages") == 0
            assert value(text, "semq_event_loop_lag_histogram_seconds_count") >= 1
            nursery.cancel_scope.cancel()
        # the log still writes its file
        assert "queued" in next((tmp_path / "events").glob("*.jsonl")).read_text()
    finally:
        core.close()


async def test_platform_node_gauges(tmp_path: Path) -> None:
    core = platform_with_stored(tmp_path, 2)
    m = Metrics("platform")
    d = PlatformStandIn()
    from semq.umxt_protocol import Endpoint

    d.sessions[Endpoint.org(B)] = SessionStandIn()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll_store, m, d, core)
            await trio.sleep(0.2)
            text = m.render().decode()
            assert value(text, "semq_node_online", node=B) == 1
            assert value(text, "semq_node_online", node=A) == 0
            assert value(text, "semq_node_offline_seconds", node=A) >= 0
            assert value(text, "semq_messages", table="stored", state="SS_INIT") == 2
            assert value(text, "semq_oldest_unconfirmed_seconds") >= 0
            assert value(text, "semq_connections") == 1
            nursery.cancel_scope.cancel()
    finally:
        core.close()


def test_address() -> None:
    assert parse_metrics_address("127.0.0.1:9410") == ("127.0.0.1", 9410)
    assert parse_metrics_address("[::1]:9") == ("::1", 9)
    assert parse_metrics_address("0.0.0.0") == ("0.0.0.0", 9410)
