"""Load, small enough for CI: many simulated TLS nodes connected to a
real platform while a real node pair exchanges documents, and a backlog for an
offline node drained on reconnect with bounded platform memory. Real ``semq``
processes on 127.0.0.1 (security on), every wait bounded. The full-size runs
are ``scripts/bench load nodes`` / ``backlog`` (docs/reliability.md, "Load")."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from semq.node.api import NodeClient
from semq.testing.loadgen import LoadGenProcess, issue_identities, proc_info
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"
SIM_NODES = 200
BACKLOG = 20_000
RSS_BOUND_MIB = 250  # platform peak; measured ~70 MiB (200 nodes) and ~100 MiB (20k backlog)


def _docs(start: int, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(start, start + n):
        head = f"<order id='T{i:07d}'>".encode()
        out.append(dict(to=B, data=head + b"x" * (1024 - len(head)), data_type="ORDER", domain="trade",
                        subtype="PO", key=f"T{i:07d}", save_fwd=3, ack2=True))
    return out


def _online(root: Path) -> set[str]:
    """Organizations the running platform reports online (status.json, every second)."""
    try:
        return set(json.loads((root / "P" / "status.json").read_text()).get("online", []))
    except (OSError, ValueError):
        return set()


def _send(directory: Path, n: int, batch: int = 1000) -> list[int]:
    """Send ``n`` documents; their record ids, in order."""
    ids: list[int] = []
    with NodeClient(directory) as node:
        for i in range(0, n, batch):
            ids += [lk.record_id for lk in node.send_many(_docs(i, min(batch, n - i)))]
    return ids


def test_200_tls_nodes_connected_while_a_real_pair_exchanges(cluster: Cluster, tmp_path: Path) -> None:
    """200 simulated organizations, each with its own certificate and TLS
    session, connect at once, exchange documents among themselves (each
    exactly once) and stay connected while a real pair moves 500 documents
    A->B exactly once; the platform holds a descriptor per connection, stays
    within the memory bound and gives the descriptors back when they leave."""
    cluster.add_org(A)
    cluster.add_org(B)
    issue_identities(tmp_path / "P", SIM_NODES, tmp_path / "ids")
    plat = cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    pid = plat.p.pid
    wait_until(lambda: {A, B} <= _online(tmp_path), 20, "A and B online")
    before = proc_info(pid)
    assert before is not None
    gen = LoadGenProcess(tmp_path / "ids", cluster.port, tmp_path / "loadgen.err",
                         ["--docs-per-node", "3", "--hold", "120", "--ping-interval", "2"])
    try:
        conn = gen.wait("connected", 60)
        assert conn["all"], conn
        assert conn["connected"] == SIM_NODES
        loaded = proc_info(pid)
        assert loaded is not None
        assert loaded.fds >= before.fds + SIM_NODES, (before, loaded)
        exch = gen.wait("exchanged", 60)
        assert exch["ok"] and exch["received"] == exch["sent"] == 3 * SIM_NODES and exch["duplicates"] == 0
        gen.wait("holding", 10)
        _send(tmp_path / A, 500, batch=100)
        wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox") == 0
                   and cluster.count(B, "SELECT count(*) FROM inbox") == 500, 60,
                   "500 documents A->B confirmed end to end under load")
        assert len(cluster.inbox(B)) == 500  # (inbox() asserts each LK0 once)
        during = proc_info(pid)
        assert during is not None and during.fds >= before.fds + SIM_NODES
        assert during.hwm_mib < RSS_BOUND_MIB, during
        time.sleep(2.5)  # at least one PING per simulated node (every 2 s): answered, nobody dropped
        gen.stop()
        done = gen.wait("done", 60)
        assert gen.p.wait(timeout=30) == 0, done
        assert done["ok"] and done["reconnects"] == 0 and not done["errors"], done
        assert done["pongs"] >= SIM_NODES and done["pongs"] >= done["pings"] - SIM_NODES, done
        after = wait_until(lambda: (x := proc_info(pid)) is not None and x.fds <= before.fds + 2 and x, 20,
                           "the platform to close the simulated nodes' descriptors")
        assert after.rss_mib < RSS_BOUND_MIB
        assert plat.p.poll() is None
    finally:
        gen.stop()
        gen.kill()


def test_backlog_for_an_offline_node_drained_on_reconnect(cluster: Cluster, tmp_path: Path) -> None:
    """20,000 SaveFwd 3 documents stored at the platform for an offline B
    (every one ACK_SAVE'd at A) are all delivered when B connects, exactly
    once; nothing is left in A's outbox or the platform's stored table; the
    platform's peak RSS stays within the bound."""
    cluster.add_org(A)
    cluster.add_org(B)
    plat = cluster.start_platform()
    pid = plat.p.pid
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            info = proc_info(pid)
            if info is not None:
                peak[0] = max(peak[0], info.rss_mib)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        ids = _send(tmp_path / A, BACKLOG)
        cluster.start_node(A)
        wait_until(lambda: cluster.count(A, "SELECT count(*) FROM outbox WHERE state=3") == BACKLOG, 60,
                   f"{BACKLOG} documents ACK_SAVE'd at A", 0.2)
        assert cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == BACKLOG
        cluster.start_node(B)
        wait_until(lambda: cluster.count(B, "SELECT count(*) FROM inbox") == BACKLOG
                   and cluster.count(A, "SELECT count(*) FROM outbox") == 0
                   and cluster.count("P", "SELECT count(*) FROM stored") == 0, 90,
                   "the backlog delivered and confirmed", 0.2)
        info = proc_info(pid)
        assert info is not None
    finally:
        stop.set()
        sampler.join(timeout=5)
    inbox = cluster.inbox(B)  # asserts each LK0 once
    assert len(inbox) == BACKLOG
    assert set(inbox) == {f"{A}/{i}" for i in ids}
    assert inbox[f"{A}/{ids[0]}"] == _docs(0, 1)[0]["data"]
    assert inbox[f"{A}/{ids[-1]}"] == _docs(BACKLOG - 1, 1)[0]["data"]
    assert max(info.hwm_mib, peak[0]) < RSS_BOUND_MIB, (info, peak)
    assert plat.p.poll() is None
    # The platform owns delivery of what it stored: the origin sends nothing
    # again while the backlog drains (before ab4ed5f, A asked B, which cannot
    # tell queued from lost: 953,440 of 1,000,000 were sent twice).
    resends = sum(f.read_text().count('"event":"resend"') for f in (tmp_path / A / "events").glob("*.jsonl"))
    assert resends == 0, f"{resends} of {BACKLOG} stored documents were sent again during the drain"


def test_organization_enrolled_while_the_platform_runs_can_connect(cluster: Cluster, tmp_path: Path) -> None:
    """Organizations join a running relay: one enrolled (semq node init
    --enroll-from) while the platform runs connects without a restart (the
    relay read its list of known organizations only at start until 2498fe1)."""
    cluster.add_org(A)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.add_org(B)  # enrolled now, with the relay running (the CA reload sees it within ~2 s)
    cluster.start_node(B)
    wait_until(lambda: B in _online(tmp_path), 10, f"{B}, enrolled while the platform runs, to connect", 0.2)


def test_platform_inquiry_round_does_not_scan_the_stored_table(tmp_path: Path) -> None:
    """The platform's inquiry round runs every second on its one store
    thread. Before schema v3 it read the whole stored table (no index served
    it): with 1,000,000 stored copies (2 GiB) 2.5-4 s per round, which held
    storing and delivery back (the first 1M backlog run, docs/reliability.md)."""
    from semq.platform.core import PlatformCore
    from semq.umxt_protocol import Endpoint

    core = PlatformCore(tmp_path / "platform.sqlite", create=True)
    try:
        sql: list[str] = []
        core.conn.set_trace_callback(sql.append)
        core.inquiries({Endpoint.org(B): 1 << 40})
        core.conn.set_trace_callback(None)
        selects = [s for s in sql if s.lstrip().upper().startswith("SELECT") and " stored " in s]
        assert selects, sql
        scans = []
        for s in selects:
            plan = core.conn.execute("EXPLAIN QUERY PLAN " + s).fetchall()
            # "SCAN stored USING INDEX stored_sent" reads the partial index of
            # delivered-not-acked copies only; a bare "SCAN stored" reads them all.
            scans += [f"{row[3]}: {s[:120]}" for row in plan if str(row[3]).strip() == "SCAN stored"]
        assert not scans, scans
    finally:
        core.close()


async def test_platform_tls_caches_no_session_per_connection(tmp_path: Path) -> None:
    """Every accepted TLS connection left its session in the platform's
    context (TLS 1.3 with OP_NO_TICKET means stateful tickets), never resumed:
    12-17 MiB per 1,000 connections until OpenSSL's cache of 20,480 sessions
    was full (fixed in 2498fe1: no tickets at all)."""
    import trio

    from semq.cli import main as semq_main
    from semq.identity.crypto import client_ssl_context
    from semq.identity.security import PlatformSecurity
    from semq.testing.loadgen import load_identities

    assert semq_main(["platform", "init", "--dir", str(tmp_path / "P")]) == 0
    issue_identities(tmp_path / "P", 20, tmp_path / "ids")
    ids, ca = load_identities(tmp_path / "ids")
    assert ca is not None
    server = PlatformSecurity(tmp_path / "P").ssl_context()

    async def handle(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server, server_side=True)
        with trio.move_on_after(5):
            try:
                await tls.do_handshake()
                await tls.receive_some(16)
            except trio.BrokenResourceError:
                pass
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        with trio.fail_after(30):
            for ident in ids:
                assert ident.cert and ident.key
                ctx = client_ssl_context(cert_file=ident.cert, key_file=ident.key, ca_file=ca)
                tls = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), ctx,
                                     server_hostname="127.0.0.1")
                await tls.do_handshake()
                await tls.send_all(b"x")
                await tls.aclose()
            await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    stats = server.session_stats()
    assert stats["accept_good"] == len(ids)
    assert stats["number"] == 0, f"{stats['number']} TLS sessions cached after {len(ids)} connections: {stats}"


def _store_calls(root: Path) -> int:
    r = subprocess.run([sys.executable, "-m", "semq", "admin", "status", "--dir", str(root / "P"), "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["store_calls"])


def test_idle_connected_nodes_do_not_poll_the_store(cluster: Cluster, tmp_path: Path) -> None:
    """An idle connected node costs the store thread nothing: until 705a2ba
    every session's deliverer asked for stored copies every second (200 idle
    nodes: 220 store calls/s; 1,000: 25-35 % of a core)."""
    issue_identities(tmp_path / "P", SIM_NODES, tmp_path / "ids")
    cluster.start_platform()
    c0, t0 = _store_calls(tmp_path), time.monotonic()
    time.sleep(2)
    alone = (_store_calls(tmp_path) - c0) / (time.monotonic() - t0)  # the inquiry loop and the like
    gen = LoadGenProcess(tmp_path / "ids", cluster.port, tmp_path / "loadgen.err",
                         ["--docs-per-node", "0", "--hold", "60", "--ping-interval", "30"])
    try:
        assert gen.wait("connected", 60)["all"]
        c1, t1 = _store_calls(tmp_path), time.monotonic()
        time.sleep(2)
        idle = (_store_calls(tmp_path) - c1) / (time.monotonic() - t1)
    finally:
        gen.stop()
        gen.kill()
    assert idle < alone + 0.1 * SIM_NODES, (
        f"{idle:.0f} store calls/s with {SIM_NODES} idle nodes connected, {alone:.0f}/s with none")


def test_platform_settles_acks_by_record_id(tmp_path: Path) -> None:
    """ACKs name stored copies by LK1, i.e. by their row id: settling a batch
    must look the rows up by primary key, whatever else the target has stored."""
    from semq.platform.core import PlatformCore
    from semq.umxt_protocol import (
        AckBatch,
        AckEntry,
        AckFlag,
        Endpoint,
        Frame,
        FrameDecoder,
        Kind,
        encode_frame,
    )

    core = PlatformCore(tmp_path / "platform.sqlite", create=True)
    try:
        core.register([A, B])
        b = Endpoint.org(B)
        entries = tuple(AckEntry(1, 1, 0, 1, 1, lk1, int(AckFlag.PLATFORM), 0) for lk1 in range(1, 501))
        dec = FrameDecoder()
        dec.receive_data(encode_frame(Frame(kind=Kind.ACK_BATCH, source=b, target=core.me,
                                            body=AckBatch(ack_kind=Kind.ACK, entries=entries))))
        sql: list[str] = []
        core.conn.set_trace_callback(sql.append)
        out = core.handle(b, list(dec), {b: 1 << 40})
        core.conn.set_trace_callback(None)
        assert not out.errors
        # By an IN list, or by one id range when the ids are dense (rows_by_id).
        lookups = [s for s in sql if s.lstrip().upper().startswith("SELECT") and " FROM stored WHERE id " in s]
        assert lookups, sql
        for s in lookups:
            plan = [str(row[3]) for row in core.conn.execute("EXPLAIN QUERY PLAN " + s)]
            assert any("PRIMARY KEY" in p for p in plan), (plan, s[:160])
    finally:
        core.close()
