"""Prometheus metrics for a node or the platform (off by default; ``--metrics
HOST:PORT`` turns them on).

The daemons feed them cheaply:

- ``Metrics.observe_events(records)`` with the delivery-event records the
  cores already build (docs/events.md): counters by event, acks by kind,
  inquiries, resends, forwarded / stored / dropped, per-hop and end-to-end
  latency. ``instrument_core(core, metrics)`` does that without touching the
  core: it wraps the core's event log, so every record written is counted
  (after its commit, like the log itself).
- ``Metrics.observe_batch(size, seconds)`` per store transaction.
- ``poll_store`` (a task) sets the gauges that need the store (messages per
  state, oldest unconfirmed, stuck, store size, nodes online/offline) every
  ``interval`` seconds through the daemon's gate; ``probe_loop_lag`` measures
  how late the trio loop wakes up.

``serve_metrics`` answers ``GET /metrics`` on the trio loop (a tiny HTTP/1.0
responder, no threads). ``grafana_dashboard()`` is the Grafana dashboard for
these metrics shipped in the package (``semq admin grafana-dashboard``). Every instrument lives in the Metrics object's own
CollectorRegistry, so two daemons in one process (tests) do not collide.

Label values are bounded: event names, ack kinds, roles and states come from
fixed sets; ``node`` labels are the organizations the platform knows.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from semq import __version__

from .handlers import DEFAULT_STUCK_AFTER, store_bytes

__all__ = [
    "BATCH_BUCKETS",
    "COMMIT_BUCKETS",
    "DEFAULT_METRICS_PORT",
    "GRAFANA_DASHBOARD",
    "LAG_BUCKETS",
    "LATENCY_BUCKETS",
    "MAX_HTTP_REQUEST",
    "MAX_TRACKED",
    "MeteredEventLog",
    "Metrics",
    "grafana_dashboard",
    "instrument_core",
    "node_snapshot",
    "parse_metrics_address",
    "platform_snapshot",
    "poll_store",
    "probe_loop_lag",
    "serve_metrics",
]

log = logging.getLogger("semq.ops.metrics")

#: seconds: 1 ms .. 1 day (store-and-forward: an offline target makes hours normal)
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                          60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384)
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
DEFAULT_METRICS_PORT: Final = 9410
MAX_HTTP_REQUEST: Final = 8192  # bytes of request head the metrics responder reads
#: the dashboard inside this package (pyproject.toml ships it as package data)
GRAFANA_DASHBOARD: Final = ("grafana", "semq-dashboard.json")

#: event -> ack kind (semq_acks_total{kind}); docs/events.md
_ACKS: Final = {
    ("origin", "ack_fwd"): "ack_fwd", ("origin", "ack_save"): "ack_save", ("origin", "ack2"): "ack2",
    ("platform", "acked"): "ack", ("receiver", "ack2_sent"): "ack2_sent", ("receiver", "reack2"): "reack2",
    ("receiver", "reack"): "reack",
}
#: event -> reason (semq_dropped_total{reason})
_DROPS: Final = {
    ("platform", "dropped"): "dropped", ("platform", "refused"): "refused", ("platform", "expired"): "expired",
    ("origin", "nack"): "nack", ("origin", "expired"): "expired", ("origin", "dead"): "dead",
    ("receiver", "refused"): "refused",
}
#: (role, event) -> latency observed as ts - created_ms, and where
_HOPS: Final = {
    ("origin", "ack_fwd"): "origin_to_platform_ack", ("origin", "ack_save"): "origin_to_platform_ack",
    ("platform", "received"): "origin_to_platform", ("receiver", "received"): "origin_to_receiver",
}
_E2E: Final = {("receiver", "inbox"): "delivered", ("origin", "ack2"): "confirmed"}
#: origin events after which a document is no longer tracked
_ORIGIN_FINAL: Final = frozenset({"ack2", "cleaned", "nack", "expired", "dead"})
MAX_TRACKED: Final = 50_000  # origin documents whose first send time is remembered


class Metrics:
    """The instruments of one daemon (``role``: ``node`` or ``platform``)."""

    def __init__(self, role: str, ident: str = "") -> None:
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Gauge("semq_build_info", "Always 1: software version and role", ["version", "role", "id"],
                          registry=r)
        self.info.labels(__version__, role, ident).set(1)
        self.events = Counter("semq_events", "Delivery events written (docs/events.md)", ["role", "event"],
                              registry=r)
        self.forwarded = Counter("semq_forwarded", "DATA forwarded at once to an online target", registry=r)
        self.stored = Counter("semq_stored", "DATA stored for an offline target", registry=r)
        self.dropped = Counter("semq_dropped", "Documents not delivered, by reason", ["reason"], registry=r)
        self.acks = Counter("semq_acks", "Acknowledgements, by kind", ["kind"], registry=r)
        self.inquiries = Counter("semq_inquiries", "Inquiry entries sent", ["role"], registry=r)
        self.resends = Counter("semq_resends", "Documents sent again (after a lost ack or an operator's resend)",
                               ["role"], registry=r)
        self.duplicates = Counter("semq_duplicates", "Duplicate DATA suppressed at the receiver", registry=r)
        self.hop_latency = Histogram("semq_hop_latency_seconds",
                                     "Per-hop latency from the document's creation (cross-clock hops clamped at 0)",
                                     ["hop"], buckets=LATENCY_BUCKETS, registry=r)
        self.e2e_latency = Histogram("semq_e2e_latency_seconds",
                                     "End-to-end latency: delivered (receiver's clock) or confirmed (origin's)",
                                     ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.messages = Gauge("semq_messages", "Rows per table and state (pending-send, stored, pending-ack)",
                              ["table", "state"], registry=r)
        self.oldest_unconfirmed = Gauge("semq_oldest_unconfirmed_seconds",
                                        "Age of the oldest message without end-to-end confirmation", registry=r)
        self.stuck = Gauge("semq_stuck_messages", "Messages unconfirmed for longer than the stuck threshold",
                           registry=r)
        self.connections = Gauge("semq_connections", "Connected sessions (node: 1 when connected)", registry=r)
        self.store_size = Gauge("semq_store_bytes", "Store size on disk (database, WAL, WAL index)", registry=r)
        self.node_online = Gauge("semq_node_online", "Platform: 1 while the organization is connected", ["node"],
                                 registry=r)
        self.node_offline = Gauge("semq_node_offline_seconds",
                                  "Platform: seconds since the organization was last connected (0 online)",
                                  ["node"], registry=r)
        self.batch_size = Histogram("semq_commit_batch_size", "Frames or rows per store transaction",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.commit_time = Histogram("semq_commit_seconds", "Duration of one store transaction",
                                     buckets=COMMIT_BUCKETS, registry=r)
        self.loop_lag = Gauge("semq_event_loop_lag_seconds", "How late the trio loop woke the lag probe (last)",
                              registry=r)
        self.loop_lag_hist = Histogram("semq_event_loop_lag_histogram_seconds", "Event-loop lag samples",
                                       buckets=LAG_BUCKETS, registry=r)
        self.counts = Counter("semq_operations", "Daemon counters fed with Metrics.count", ["name"], registry=r)
        self._batches = {"count": 0, "rows": 0, "max": 0, "last": 0, "seconds": 0.0}
        self._offline_since: dict[str, float] = {}
        self._last_online: set[str] = set()
        self._sent: dict[str, int | float] = {}  # origin: lk0 -> first "sent" ts (latency without created_ms)

    # ------------------------------------------------------------ cheap feeds

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the free-form counter ``semq_operations_total{name}``
        (e.g. frames_in, refused, tls_refused)."""
        if n:
            self.counts.labels(name).inc(n)

    def observe_batch(self, size: int, seconds: float) -> None:
        """One store transaction of ``size`` frames/rows took ``seconds``."""
        self.batch_size.observe(size)
        self.commit_time.observe(seconds)
        b = self._batches
        b["count"] += 1
        b["rows"] += size
        b["max"] = max(b["max"], size)
        b["last"] = size
        b["seconds"] += seconds

    def batch_summary(self) -> dict[str, Any]:
        """For ``semq admin status``: transactions, rows, mean/max/last size."""
        b = self._batches
        n = b["count"] or 1
        return {"transactions": b["count"], "rows": b["rows"], "mean_size": round(b["rows"] / n, 2),
                "max_size": b["max"], "last_size": b["last"], "mean_ms": round(1000 * b["seconds"] / n, 3)}

    def observe_events(self, records: Iterable[Mapping[str, Any]], role: str | None = None) -> None:
        """Count delivery-event records (docs/events.md) and observe the
        latencies they allow: ``ts - created_ms`` (cross-clock values below
        0 count as 0); origin acks without ``created_ms`` are timed from
        the document's first ``sent`` event this process saw (at most
        MAX_TRACKED documents remembered). ``role`` is the default for
        records without one (the platform's records omit it). Never raises
        for odd records."""
        default = role or ("platform" if self.role == "platform" else "origin")
        tally: Tally[tuple[str, str]] = Tally()
        sent = self._sent
        for rec in records:
            ev = rec.get("event")
            if not isinstance(ev, str):
                continue
            who = rec.get("role") or default
            key = (who, ev)
            tally[key] += 1
            ts = rec.get("ts")
            if not isinstance(ts, int | float):
                continue
            created = rec.get("created_ms")
            base = created if isinstance(created, int | float) and created > 0 else None
            if who == "origin":
                # Origin events after "queued" may not repeat created_ms: time
                # them from the first send this process saw (bounded memory).
                lk0 = str(rec.get("lk0") or "")
                if ev == "sent" and lk0:
                    if lk0 not in sent:
                        sent[lk0] = ts
                        if len(sent) > MAX_TRACKED:
                            del sent[next(iter(sent))]
                elif ev in _ORIGIN_FINAL:
                    first = sent.pop(lk0, None)
                    base = base if base is not None else first
                elif ev in ("ack_fwd", "ack_save") and base is None:
                    base = sent.get(lk0)
            if base is None:
                if key == ("platform", "delivered") and (rec.get("attempt") or 1) > 1:
                    self.resends.labels("platform").inc()
                continue
            hop = _HOPS.get(key)
            e2e = _E2E.get(key)
            if hop or e2e:
                secs = max(0.0, (ts - base) / 1000)
                if hop:
                    self.hop_latency.labels(hop).observe(secs)
                if e2e:
                    self.e2e_latency.labels(e2e).observe(secs)
            if key == ("platform", "delivered") and (rec.get("attempt") or 1) > 1:
                self.resends.labels("platform").inc()
        for (who, ev), n in tally.items():
            self.events.labels(who, ev).inc(n)
            key = (who, ev)
            if key == ("platform", "forwarded"):
                self.forwarded.inc(n)
            elif key == ("platform", "stored"):
                self.stored.inc(n)
            elif ev == "inquiry":
                self.inquiries.labels(who).inc(n)
            elif key == ("origin", "resend"):
                self.resends.labels("origin").inc(n)
            elif key == ("receiver", "duplicate"):
                self.duplicates.inc(n)
            if key in _ACKS:
                self.acks.labels(_ACKS[key]).inc(n)
            if key in _DROPS:
                self.dropped.labels(_DROPS[key]).inc(n)

    def observe_loop_lag(self, seconds: float) -> None:
        self.loop_lag.set(seconds)
        self.loop_lag_hist.observe(seconds)

    # ------------------------------------------------------------ store gauges

    def set_snapshot(self, snap: Mapping[str, Any]) -> None:
        """Gauges from a store snapshot (node_snapshot / platform_snapshot)."""
        self.messages.clear()
        for (table, state), n in snap.get("messages", {}).items():
            self.messages.labels(table, state).set(n)
        oldest = snap.get("oldest_ms")
        self.oldest_unconfirmed.set(max(0.0, time.time() - oldest / 1000) if oldest else 0.0)
        self.stuck.set(snap.get("stuck", 0))
        if "bytes" in snap:
            self.store_size.set(snap["bytes"])

    def set_nodes(self, known: Mapping[str, int | None], online: Iterable[str]) -> None:
        """Platform: ``known`` {node: last_seen_ms}, ``online`` node ids."""
        now = time.time()
        on = set(online)
        for node, last_seen in known.items():
            if node in on:
                self._offline_since.pop(node, None)
                self.node_online.labels(node).set(1)
                self.node_offline.labels(node).set(0)
                continue
            self.node_online.labels(node).set(0)
            # Offline since we saw it go (this process), else since it last connected.
            since = self._offline_since.get(node)
            if since is None:
                since = last_seen / 1000 if last_seen else now
                self._offline_since[node] = since
            self.node_offline.labels(node).set(max(0.0, now - since))

    def mark_online(self, online: Iterable[str]) -> None:
        """Remember when connected nodes go offline (between store polls)."""
        on = set(online)
        now = time.time()
        for node in self._last_online - on:
            self._offline_since[node] = now
        for node in on:
            self._offline_since.pop(node, None)
        self._last_online = on

    def render(self) -> bytes:
        return generate_latest(self.registry)


def grafana_dashboard() -> str:
    """The Grafana dashboard for these metrics (JSON text), read from the
    installed package; tests/ops/test_grafana.py checks that every metric it
    names is one the Metrics object serves."""
    from importlib.resources import files

    return files("semq.ops").joinpath(*GRAFANA_DASHBOARD).read_text("utf-8")


# ---------------------------------------------------------------- hooks


class MeteredEventLog:
    """Wraps a core's EventLog: writes, then counts the records (after the
    commit they describe, as the log itself)."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def write(self, records: list[dict[str, Any]]) -> None:
        self.inner.write(records)
        try:
            self.metrics.observe_events(records)
        except Exception:  # metrics must never cost a message
            log.exception("metrics: observe_events failed")

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def instrument_core(core: Any, metrics: Metrics) -> None:
    """Count every event record ``core`` writes. Call before the daemon
    starts. A core without an event log (``events_dir=None``) is left as is."""
    if getattr(core, "log", None) is not None and not isinstance(core.log, MeteredEventLog):
        core.log = MeteredEventLog(core.log, metrics)


# ---------------------------------------------------------------- store poller


def node_snapshot(core: Any, stuck_after: float) -> dict[str, Any]:
    """On the store thread: gauges of a node's store."""
    from semq.node.engine import SendState
    from semq.node.origin.outbox import OutboxFilter

    # Not yet confirmed end to end (SPEC A.5), as the admin console's ``stuck``.
    open_ = OutboxFilter(reliable=True, states=(SendState.SS_INIT, SendState.SS_SENT, SendState.SS_ACK_FWD,
                                                SendState.SS_ACK))
    cutoff = int(time.time() * 1000 - stuck_after * 1000)
    msgs: dict[tuple[str, str], int] = {("outbox", s.name): 0 for s in SendState}
    # The owners count what the node defers in memory for up to 1 s where it
    # is (docs/design.md), without writing it.
    for name, n in core.state_counts().items():
        msgs[("outbox", name)] = n
    msgs[("inbound", "pending_ack")] = core.pending_ack_count()
    msgs[("inbox", "unread")] = core.inbox.count(unread=True)
    oldest = core.outbox.oldest(open_)
    stuck = core.outbox.count(OutboxFilter(reliable=True, states=open_.states, created_before=cutoff))
    stuck += core.pending_acks.count(received_before=cutoff)
    return {"messages": msgs, "oldest_ms": oldest, "stuck": stuck}


def platform_snapshot(core: Any, stuck_after: float) -> dict[str, Any]:
    """On the store thread: gauges of the platform's store and its nodes,
    as their owners count them (semq.platform.copies, nodes): delivered
    copies whose SS_SENT is held in memory counted where they are, without
    writing them (docs/design.md)."""
    from semq.platform.engine import StoredState

    cutoff = int(time.time() * 1000 - stuck_after * 1000)
    msgs: dict[tuple[str, str], int] = {("stored", s.name): 0 for s in StoredState if s is not StoredState.SS_ACK}
    copies, relayed, chunks = core.copies.state_counts()
    msgs[("relayed", "waiting")] = relayed
    msgs[("chunks", "kept")] = chunks  # a large document's chunks kept for an absent receiver
    for s, n in copies.items():
        try:
            msgs[("stored", StoredState(s).name)] = n
        except ValueError:
            msgs[("stored", str(s))] = n
    stuck = sum(core.copies.older(cutoff))
    nodes = {n.node_id: n.last_seen_ms for n in core.nodes.rows() if not n.revoked}
    return {"messages": msgs, "oldest_ms": core.copies.oldest_ms(), "stuck": stuck, "nodes": nodes}


async def poll_store(metrics: Metrics, daemon: Any, core: Any, *, interval: float = 15.0,
                     stuck_after: float = DEFAULT_STUCK_AFTER) -> None:
    """Run for the daemon's life: every ``interval`` s, one read transaction
    on the daemon's gate for the store gauges; connections every second."""
    platform = metrics.role == "platform"
    snap_fn = platform_snapshot if platform else node_snapshot
    next_poll = trio.current_time()
    while True:
        if platform:
            online = [ep.node_id for ep in list(daemon.sessions)]
            metrics.connections.set(len(online))
            metrics.mark_online(online)
        else:
            metrics.connections.set(1 if daemon.connected else 0)
        if trio.current_time() >= next_poll:
            next_poll = trio.current_time() + interval
            try:
                snap = await daemon.gate.run(snap_fn, core, stuck_after)
                snap["bytes"] = store_bytes(core.path)
                metrics.set_snapshot(snap)
                if platform:
                    metrics.set_nodes(snap["nodes"], [ep.node_id for ep in list(daemon.sessions)])
            except Exception as e:  # a busy or failing store must not stop the daemon
                log.warning("metrics: store poll failed: %s", e)
        await trio.sleep(min(1.0, interval))


async def probe_loop_lag(metrics: Metrics, *, interval: float = 0.5) -> None:
    """Run for the daemon's life: sleep ``interval`` and record how much
    later than asked the loop woke us (blocking work on the trio thread)."""
    while True:
        start = trio.current_time()
        await trio.sleep(interval)
        metrics.observe_loop_lag(max(0.0, trio.current_time() - start - interval))


# ---------------------------------------------------------------- HTTP


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` / ``[::1]:PORT`` / ``HOST`` (port 9410); raises
    ValueError naming the text."""
    from semq.session.transport import parse_hostport

    return parse_hostport(text, default_port=DEFAULT_METRICS_PORT)


def _response(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8", head: bool = False) -> bytes:
    hdr = (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
           "Cache-Control: no-store\r\nConnection: close\r\n\r\n")
    return hdr.encode("ascii") + (b"" if head else body)


async def _http(stream: trio.abc.Stream, render: Callable[[], bytes]) -> None:
    try:
        buf = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in buf and b"\n\n" not in buf and len(buf) <= MAX_HTTP_REQUEST:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                buf += chunk
        if len(buf) > MAX_HTTP_REQUEST:
            await stream.send_all(_response("431 Request Header Fields Too Large", b"request too large\n"))
            return
        line = buf.split(b"\n", 1)[0].decode("latin-1").strip().split()
        if len(line) < 2:
            if buf:
                await stream.send_all(_response("400 Bad Request", b"bad request\n"))
            return
        method, target = line[0], line[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            await stream.send_all(_response("405 Method Not Allowed", b"GET /metrics\n"))
        elif target == "/metrics":
            await stream.send_all(_response("200 OK", render(), CONTENT_TYPE_LATEST, head=method == "HEAD"))
        elif target == "/":
            await stream.send_all(_response("200 OK", b"SEMQ metrics: GET /metrics\n", head=method == "HEAD"))
        else:
            await stream.send_all(_response("404 Not Found", b"not found; GET /metrics\n"))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:  # one scrape must never stop the daemon
        log.exception("metrics: request failed")
    finally:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await stream.aclose()


async def serve_metrics(host: str, port: int, metrics: Metrics, *,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled;
    ``task_status`` gets the bound port (``port`` 0 = any free port)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = int(listeners[0].socket.getsockname()[1])
    log.info("metrics on http://%s:%d/metrics", host, bound)

    async def handle(stream: trio.SocketStream) -> None:
        await _http(stream, metrics.render)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound)

