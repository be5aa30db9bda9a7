#!/usr/bin/env python3
"""SEMQ under load: thousands of nodes connected at once (5,000 measured); a 1,000,000-document backlog drained on reconnect.

Two benchmarks (load; relay memory), each with real
``semq`` processes on 127.0.0.1 in a fresh temporary directory, security on
by default (mutual TLS 1.3, sealed and signed documents), SQLite
``synchronous=FULL``. Every process is started and stopped by PID; every wait
is bounded.

``scripts/bench load nodes [--nodes 1000]``
    A ``semq platform run``, a real node pair (``semq node run`` A=10008 and
    B=56001) and one load-generator process (semq.testing.loadgen) holding
    ``--nodes`` simulated organizations, each with its own certificate from
    the platform CA (issued by library calls, not 2,000 CLI runs), its own
    TLS connection, HELLO/WELCOME, a PING every 10 s, and
    ``--docs-per-node`` documents to other simulated nodes once all are
    connected (each must arrive exactly once). The pair moves
    ``--pair-docs`` documents A->B (1 KiB, SaveFwd 3, Ack2) before the load
    and again while every simulated node is connected. Reported: time to
    connect them all, platform RSS (VmRSS, VmHWM) and open descriptors
    before / while connected / after they left, platform CPU while
    connecting and while idle with every node connected, and the pair's
    documents/s (A's first ``sent`` -> last ``ack2`` event) without and with
    the load. Then the same nodes connect and leave ``--rounds`` - 1 more
    times: the platform's RSS after each round shows what it keeps per
    connection.

``scripts/bench load backlog [--docs 1000000]``
    The platform and A run, B is offline. ``--docs`` 1 KiB documents
    (SaveFwd 3, Ack2) are accepted into A's store with
    ``NodeClient.send_many`` (1,000 per transaction) before A starts; A
    sends them and every one is ACK_SAVE'd (stored at the platform). Then B
    starts and the platform delivers the whole backlog. Reported: accept,
    store and drain time and rate; platform RSS sampled every 0.5 s (peak
    while storing, with the whole backlog stored, peak while draining) and
    VmHWM; store and event-log sizes on disk; resends. Checked: B's inbox
    holds exactly the accepted LK0s, each once (and sampled bodies are
    byte-identical), A's outbox and the platform's ``stored`` table are
    empty. ``--rss-limit`` (default 300 MiB) is the bound the
    platform's peak is judged against.

``scripts/bench load frames [--connections 8] [--frames 3]``
    The relay's memory under hostile input. ``--connections`` enrolled
    organizations (one connection each) say HELLO and send ``--frames``
    frames of the maximum size (64 MiB) each, all at once, to an
    organization the platform does not know (each is read whole, then
    refused). Before that, each organization opens one connection more than
    it may hold (``max_connections_per_org``) and sends, before its HELLO,
    the header of a maximum-size frame: both are refused at once. Reported:
    the platform's RSS idle and its peak (sampled every 0.2 s, and VmHWM),
    against the bound SEMQ promises: idle + connections x 3 x the frame
    limit (the frame being read, its copy, and the one being handled) +
    16 MiB per connection for the reader's queue.

Exit 0 when everything completed and checked, 1 on a failure (a time cap,
a lost or duplicated document, a process that died), 2 on a usage error.
The machine has 2 cores shared with other work: figures move by +-20-30 %.

Usage: scripts/bench load nodes [--nodes N] [--docs-per-node D] [--pair-docs K] [--idle S] [--rounds R]
                                [--concurrency C] [--trickle S] [--security on|off] [--time-cap S] [--keep]
       scripts/bench load backlog [--docs N] [--security on|off] [--rss-limit MIB] [--time-cap S]
                                  [--restart-platform] [--keep]
       scripts/bench load frames [--connections N] [--frames F] [--security on|off] [--keep]
       scripts/bench load flood [--connections N] [--phases PHASE...] [--keep]

``scripts/bench load flood`` is described in scripts/benchmarks/flood.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from semq.testing.loadgen import LoadGenProcess

if __package__:
    from ._proc import terminate
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/load.py
    from _proc import terminate  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]

A, B = "10008", "56001"
SEMQ: Final = [sys.executable, "-m", "semq"]
PAYLOAD: Final = 1024
LOAD_BATCH: Final = 1000
MIB: Final = 1024 * 1024


class BenchError(Exception):
    pass


def _log(msg: str) -> None:
    print(f"[load] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Deadline:
    """The run's time cap: every wait takes what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.cap = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, what: str, progress: str = "") -> None:
        if self.left() <= 0:
            raise BenchError(f"time cap of {self.cap:g} s exceeded while {what}"
                             + (f" ({progress})" if progress else "")
                             + "; raise --time-cap or look at the kept logs (--keep)")


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


# ---------------------------------------------------------------- processes


class Cluster:
    """A platform and nodes A, B in one directory; processes by PID."""

    def __init__(self, root: Path, secure: bool, start_timeout: float = 120.0) -> None:
        self.root = root
        self.secure = secure
        self.port = _free_port()
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {k: v for k, v in os.environ.items() if k != "SEMQ_DIR"}
        self.env["PYTHONUNBUFFERED"] = "1"
        # Children import the semq this script imported, whatever their cwd.
        import semq

        src = str(Path(semq.__file__).resolve().parents[1])
        self.env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [self.env.get("PYTHONPATH")])])
        off = [] if secure else ["--no-security"]
        self.cli("platform", "init", "--dir", "P", "--listen", f"127.0.0.1:{self.port}", *off)
        for org, d in ((A, "A"), (B, "B")):
            self.cli("node", "init", "--dir", d, "--org", org, "--platform", f"127.0.0.1:{self.port}", *off,
                     *(["--enroll-from", "P"] if secure else []))
        if not secure:
            self.cli("platform", "register", "--dir", "P", A, B)

    def cli(self, *args: str) -> None:
        r = subprocess.run([*SEMQ, *args], cwd=self.root, env=self.env, capture_output=True, timeout=120)
        if r.returncode:
            raise BenchError(f"semq {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")

    def start(self, name: str) -> float:
        """Start P, A or B; returns the seconds until it said it runs."""
        args = ["platform", "run", "--dir", "P"] if name == "P" else ["node", "run", "--dir", name]
        log = self.root / f"{name}.log"
        t0 = time.monotonic()
        with log.open("ab") as f:
            p = subprocess.Popen([*SEMQ, *args], cwd=self.root, env=self.env, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        ready = "listening on" if name == "P" else "running"
        start = log.stat().st_size if log.exists() else 0

        def up() -> bool:
            with log.open("rb") as fh:
                fh.seek(start)
                return ready.encode() in fh.read() or p.poll() is not None

        wait_for(up, self.start_timeout, f"{name} to start", 0.02)
        if p.poll() is not None:
            raise BenchError(f"{name} exited {p.returncode}: {self.tail(name)}")
        return time.monotonic() - t0

    def tail(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def pid(self, name: str) -> int | None:
        p = self.procs.get(name)
        return p.pid if p is not None and p.poll() is None else None

    def stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is not None:
            terminate(p, 60.0)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise BenchError(f"{name} exited {p.returncode} during the run: {self.tail(name)}")

    def db(self, who: str) -> sqlite3.Connection:
        name = "platform.sqlite" if who == "P" else "node.sqlite"
        return sqlite3.connect(f"file:{self.root / who / name}?mode=ro", uri=True, timeout=30)

    def count(self, who: str, sql: str, *args: Any) -> int:
        self.alive()
        c = self.db(who)
        try:
            return int(c.execute(sql, args).fetchone()[0])
        finally:
            c.close()

    def online(self, org: str) -> bool:
        try:
            st = json.loads((self.root / "P" / "status.json").read_text())
        except (OSError, ValueError):
            return False
        return org in st.get("online", [])

    def disk(self, who: str) -> dict[str, int]:
        d = self.root / who
        store = sum(f.stat().st_size for f in d.glob("*.sqlite*"))
        events = sum(f.stat().st_size for f in (d / "events").glob("*")) if (d / "events").exists() else 0
        return {"store": store, "events": events}


class Sampler:
    """Reads /proc of the watched processes every ``interval`` s on a thread;
    keeps the peak RSS of each per phase."""

    def __init__(self, cluster: Cluster, interval: float = 0.5) -> None:
        from semq.testing.loadgen import proc_info

        self.proc_info = proc_info
        self.c = cluster
        self.interval = interval
        self.phase = "start"
        self.peaks: dict[tuple[str, str], float] = {}
        self.last: dict[str, Any] = {}
        self.extra: dict[str, int] = {}  # name -> pid of other processes (load generator)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        pids = {n: p.pid for n, p in list(self.c.procs.items()) if p.poll() is None}
        pids.update(self.extra)
        for name, pid in pids.items():
            info = self.proc_info(pid)
            if info is None:
                continue
            self.last[name] = info
            k = (self.phase, name)
            self.peaks[k] = max(self.peaks.get(k, 0.0), info.rss_mib)

    def peak(self, phase: str, name: str) -> float | None:
        return self.peaks.get((phase, name))

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)


# ---------------------------------------------------------------- documents


def documents(start: int, n: int, tag: str = "S") -> list[dict[str, Any]]:
    out = []
    for i in range(start, start + n):
        head = f"<order id='{tag}{i:07d}'>".encode()
        out.append(dict(to=B, data=head + b"x" * (PAYLOAD - len(head)), data_type="ORDER", domain="trade",
                        subtype="PO", key=f"{tag}{i:07d}", save_fwd=3, ack2=True))
    return out


def events(directory: Path, wanted: set[str], lo: int, hi: int) -> dict[str, dict[int, int]]:
    """{event: {record id: first ts}} for A's documents lo..hi (inclusive) or,
    for B's events, documents from A with those record ids."""
    needles = [f'"event":"{w}"' for w in wanted]
    out: dict[str, dict[int, int]] = {w: {} for w in wanted}
    for f in sorted(directory.glob("events-*.jsonl")):
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                if not any(n in line for n in needles):
                    continue
                e = json.loads(line)
                lk0 = e.get("lk0", "")
                if not lk0.startswith(f"{A}/"):
                    continue
                rid = int(lk0.rsplit("/", 1)[1])
                if lo <= rid <= hi and e["event"] in out:
                    out[e["event"]].setdefault(rid, e["ts"])
    return out


def _pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def pair_run(c: Cluster, start: int, n: int, dl: Deadline) -> dict[str, Any]:
    """A sends n documents to B while both run; documents/s from A's first
    ``sent`` to its last ``ack2`` event, send->inbox p50/p99."""
    from semq.node.api import NodeClient

    lks = []
    with NodeClient(c.root / "A") as node:
        for i in range(0, n, LOAD_BATCH):
            lks += node.send_many(documents(start + i, min(LOAD_BATCH, n - i), "P"))
    lo, hi = min(lk.record_id for lk in lks), max(lk.record_id for lk in lks)
    wait_for(lambda: c.count("A", "SELECT count(*) FROM outbox") == 0
             and c.count("B", "SELECT count(*) FROM inbox WHERE origin_id=? AND record_id BETWEEN ? AND ?",
                         A, lo, hi) == n,
             min(300.0, max(1.0, dl.left())), f"{n} pair documents confirmed end to end", 0.05)
    a = events(c.root / "A" / "events", {"sent", "ack2"}, lo, hi)
    b = events(c.root / "B" / "events", {"inbox"}, lo, hi)
    secs = (max(a["ack2"].values()) - min(a["sent"].values())) / 1000
    lat = [b["inbox"][r] - a["sent"][r] for r in b["inbox"] if r in a["sent"]]
    dup = c.count("B", "SELECT count(*) - count(DISTINCT record_id) FROM inbox WHERE origin_id=?"
                  " AND record_id BETWEEN ? AND ?", A, lo, hi)
    if dup:
        raise BenchError(f"{dup} pair documents delivered twice")
    return {"docs": n, "seconds": secs, "rate": n / secs if secs > 0 else float("inf"),
            "p50": _pct(lat, 50), "p99": _pct(lat, 99)}


# ---------------------------------------------------------------- load generator


def _loadgen(c: Cluster, ids: Path, args: list[str]) -> LoadGenProcess:
    """The load generator child (semq.testing.loadgen), its status lines logged."""
    from semq.testing.loadgen import LoadGenProcess

    def status(rec: dict[str, Any]) -> None:
        _log(f"  load: {rec['connected']} connected, {rec['received']}/{rec['sent']} documents")

    return LoadGenProcess(ids, c.port, c.root / "loadgen.err", args, cwd=c.root, env=c.env, on_status=status)


# ---------------------------------------------------------------- nodes


FD_MARGIN: Final = 64  # descriptors a process needs besides one per connection (stores, logs, listeners)


def _port_range() -> int:
    """Local ports the kernel hands out to outgoing connections: every
    simulated node connects from 127.0.0.1 to the one platform port, so this
    bounds how many can be connected at once."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 0
    return hi - lo + 1


def check_limits(nodes: int) -> dict[str, int]:
    """The limits ``nodes`` connections meet, checked before anything
    starts: the platform and the load generator each hold one descriptor per
    connection and lift their soft open-file limit to the hard one
    (semq.cli, semq.testing.loadgen), so the hard limit must fit them; and
    every connection goes from 127.0.0.1 to one port, so the local port
    range must too. BenchError naming the limit when one is too small; else
    the limits, for the report."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = 1 << 30 if hard == resource.RLIM_INFINITY else int(hard)
    if files < nodes + FD_MARGIN:
        raise BenchError(f"{nodes:,} nodes need {nodes + FD_MARGIN:,} open files in the platform and in the load"
                         f" generator; the hard limit here is {files:,} (raise it: ulimit -Hn, or LimitNOFILE=)")
    ports = _port_range()
    if ports and ports < nodes + FD_MARGIN:
        raise BenchError(f"{nodes:,} connections from 127.0.0.1 to one port need {nodes + FD_MARGIN:,} local ports;"
                         f" net.ipv4.ip_local_port_range has {ports:,}")
    return {"nofile": files, "ports": ports}


def run_nodes(a: argparse.Namespace, tmp: Path) -> tuple[list[list[str]], list[str], bool]:
    from semq.testing.loadgen import issue_identities, proc_info

    limits = check_limits(a.nodes)
    dl = Deadline(a.time_cap)
    c = Cluster(tmp, a.security == "on")
    sampler: Sampler | None = None
    gen: LoadGenProcess | None = None
    try:
        t = time.monotonic()
        issue_identities(tmp / "P", a.nodes, tmp / "ids", security=c.secure)
        issue_s = time.monotonic() - t
        _log(f"{a.nodes} identities issued and registered in {issue_s:.1f} s")
        c.start("P")
        sampler = Sampler(c)
        pid = c.pid("P")
        assert pid is not None
        c.start("A")
        c.start("B")
        wait_for(lambda: c.online(A) and c.online(B), 60, "A and B online")
        _log(f"pair without load: {a.pair_docs} documents A -> B")
        cpu0 = proc_info(pid)
        base = pair_run(c, 0, a.pair_docs, dl)
        cpu1 = proc_info(pid)
        assert cpu0 is not None and cpu1 is not None
        base_cpu_us = (cpu1.cpu_s - cpu0.cpu_s) / a.pair_docs * 1e6
        _log(f"  {base['rate']:,.0f} docs/s")
        time.sleep(1)
        before = proc_info(pid)
        assert before is not None
        sampler.phase = "connect"
        _log(f"load generator: {a.nodes} simulated nodes, {a.concurrency} handshakes at a time")
        gen = _loadgen(c, tmp / "ids", ["--concurrency", str(a.concurrency), "--docs-per-node",
                                        str(a.docs_per_node), "--trickle", str(a.trickle),
                                        "--hold", str(max(60.0, dl.left())), "--status-interval", "5",
                                        "--connect-deadline", str(min(600.0, max(10.0, dl.left())))])
        sampler.extra["L"] = gen.p.pid
        conn = gen.wait("connected", min(660.0, max(10.0, dl.left())))
        at_connect = proc_info(pid)
        assert at_connect is not None
        if not conn["all"]:
            raise BenchError(f"{conn['connected']} of {a.nodes} nodes connected in {conn['seconds']} s:"
                             f" failures {conn['failures']}, errors {conn['errors']}")
        _log(f"all {a.nodes} connected in {conn['seconds']:.1f} s; platform RSS {at_connect.rss_mib:.0f} MiB,"
             f" {at_connect.fds} fds")
        sampler.phase = "loaded"
        exch = gen.wait("exchanged", 120) if a.docs_per_node else {"ok": True, "seconds": 0}
        if not exch["ok"]:
            raise BenchError(f"documents among simulated nodes did not all arrive: {exch}")
        gen.wait("holding", 30)
        # Idle with every node connected (pings, and trickled documents if asked).
        i0 = proc_info(pid)
        time.sleep(a.idle)
        i1 = proc_info(pid)
        assert i0 is not None and i1 is not None
        idle_cpu = (i1.cpu_s - i0.cpu_s) / a.idle
        _log(f"idle with {a.nodes} connected: platform CPU {idle_cpu:.0%} of one core")
        _log(f"pair with load: {a.pair_docs} documents A -> B")
        loaded = pair_run(c, a.pair_docs, a.pair_docs, dl)
        _log(f"  {loaded['rate']:,.0f} docs/s")
        while_loaded = proc_info(pid)
        assert while_loaded is not None
        loaded_cpu_us = (while_loaded.cpu_s - i1.cpu_s) / a.pair_docs * 1e6
        sampler.phase = "after"
        gen.stop()
        done = gen.wait("done", 120)
        gen.p.wait(timeout=60)
        after = wait_for(lambda: (x := proc_info(pid)) and x.fds <= before.fds + 5 and x, 60,
                         "the platform's descriptors to return to the level before the load")
        stats = done
        ok = bool(done["ok"])
        if not ok:
            raise BenchError(f"load generator failed its checks: {done}")
        c.alive()
        hwm = while_loaded.hwm_mib
        lg = sampler.peak("loaded", "L")
        gen.kill()
        # Churn: the same nodes connect and leave again; what the platform
        # keeps per connection shows as RSS that grows round by round.
        rounds = [after]
        for r in range(2, a.rounds + 1):
            _log(f"round {r}: {a.nodes} nodes connect again, then leave")
            gen = _loadgen(c, tmp / "ids", ["--concurrency", str(a.concurrency), "--docs-per-node", "0",
                                            "--hold", "1", "--no-control", "--status-interval", "0",
                                            "--connect-deadline", str(min(600.0, max(10.0, dl.left())))])
            rec = gen.wait("done", min(660.0, max(10.0, dl.left())))
            if not rec["ok"] or gen.p.wait(timeout=60):
                raise BenchError(f"round {r}: load generator failed: {rec}")
            gen.kill()
            time.sleep(1)
            rounds.append(wait_for(lambda: (x := proc_info(pid)) and x.fds <= before.fds + 5 and x, 60,
                                   "the platform's descriptors to return to the level before the load"))
            dl.check(f"connection round {r}")
    finally:
        if sampler is not None:
            sampler.close()
        if gen is not None:
            gen.stop()
            gen.kill()
        c.stop_all()
    n = a.nodes
    per_conn = (at_connect.rss_mib - before.rss_mib) * 1024 / n
    rows = [
        ["simulated nodes connected at once", f"{n:,} of {n:,}"],
        ["time to connect all (TCP + TLS 1.3 + HELLO/WELCOME)", f"{conn['seconds']:.1f} s"],
        ["  one connection p50 / p99 / max", f"{conn['latency_p50'] * 1000:.0f} / {conn['latency_p99'] * 1000:.0f}"
                                           f" / {conn['latency_max'] * 1000:.0f} ms"],
        ["platform CPU while connecting", f"{at_connect.cpu_s - before.cpu_s:.1f} s"
                                          f" ({(at_connect.cpu_s - before.cpu_s) / conn['seconds']:.0%} of a core)"],
        ["platform VmRSS: 2 nodes / all connected / after they left",
         f"{before.rss_mib:.0f} / {at_connect.rss_mib:.0f} / {after.rss_mib:.0f} MiB"],
        ["  per connection", f"{per_conn:.0f} KiB"],
        *([[f"platform VmRSS after each of {len(rounds)} connect/leave rounds",
            " / ".join(f"{x.rss_mib:.0f}" for x in rounds) + " MiB"]] if len(rounds) > 1 else []),
        ["platform VmHWM (peak) with all connected", f"{hwm:.0f} MiB"],
        ["platform open fds: 2 nodes / all connected / after", f"{before.fds} / {at_connect.fds} / {after.fds}"],
        [f"platform CPU idle, {n:,} connected ({a.idle:g} s)", f"{idle_cpu:.0%} of a core"],
        ["documents among simulated nodes (sent / received once / dup)",
         f"{stats['sent']:,} / {stats['received']:,} / {stats['duplicates']}"],
        ["  pings answered by the platform", f"{stats['pongs']:,} of {stats['pings']:,}"],
        [f"real pair A->B, {a.pair_docs:,} docs, without load", f"{base['rate']:,.0f} docs/s"
                                                               f" (p50 {base['p50']:.0f} ms, p99 {base['p99']:.0f} ms)"],
        [f"real pair A->B, {a.pair_docs:,} docs, {n:,} nodes connected", f"{loaded['rate']:,.0f} docs/s"
                                                                         f" (p50 {loaded['p50']:.0f} ms, p99 {loaded['p99']:.0f} ms)"],
        ["  with load / without", f"{loaded['rate'] / base['rate']:.0%}"],
        ["platform CPU per pair document: without / with load", f"{base_cpu_us:.0f} / {loaded_cpu_us:.0f} µs"],
        ["load generator peak RSS", f"{lg:.0f} MiB" if lg else "-"],
    ]
    notes = [
        f"security {a.security}; identities issued by library calls in {issue_s:.1f} s; {a.concurrency} handshakes"
        f" at a time; each simulated node pings every 10 s; {a.docs_per_node} documents per node once all were"
        f" connected{f', then one per node every {a.trickle:g} s' if a.trickle else ''}.",
        "pair: 1 KiB documents, SaveFwd 3, Ack2, accepted while A runs; docs/s = A's first 'sent' -> last 'ack2'"
        " event; p50/p99 = A's 'sent' -> B's 'inbox' event; platform CPU per pair document = its CPU time over"
        " the pair run (with load: the idle nodes' pings included) / documents.",
        f"limits: {limits['nofile']:,} open files per process (platform and load generator),"
        f" {limits['ports']:,} local ports for the connections.",
        "2 vCPUs shared with the load generator and other work: figures move by +-20-30 %.",
    ]
    return rows, notes, ok


# ---------------------------------------------------------------- backlog


def preload(c: Cluster, n: int, dl: Deadline) -> tuple[float, array[int]]:
    """Accept n documents into A's store (no daemon running)."""
    from semq.node.api import NodeClient

    rids: array[int] = array("q")
    t0 = time.monotonic()
    last = t0
    with NodeClient(c.root / "A") as node:
        for i in range(0, n, LOAD_BATCH):
            lks = node.send_many(documents(i, min(LOAD_BATCH, n - i)))
            rids.extend(lk.record_id for lk in lks)
            now = time.monotonic()
            if now - last >= 10:
                last = now
                _log(f"  accepted {len(rids):,} of {n:,} ({len(rids) / (now - t0):,.0f}/s)")
                dl.check("accepting documents into A's store", f"{len(rids):,} of {n:,}")
    return n / (time.monotonic() - t0), rids


def check_inbox(c: Cluster, rids: array[int]) -> dict[str, int]:
    """One pass over B's (stopped) inbox: every accepted LK0 once, every body
    byte-identical to what A accepted (documents() is a function of the key)."""
    want = set(rids)
    seen: set[int] = set()
    out = {"rows": 0, "missing": 0, "unexpected": 0, "duplicated": 0, "differing": 0}
    db = c.db("B")
    try:
        for origin, rid, key, data in db.execute("SELECT origin_id, record_id, key, app_data FROM inbox"):
            out["rows"] += 1
            if origin != A or rid not in want:
                out["unexpected"] += 1
                continue
            if rid in seen:
                out["duplicated"] += 1
            seen.add(rid)
            try:
                expect = documents(int(key[1:]), 1)[0]["data"]
            except ValueError:
                expect = b""
            out["differing"] += data != expect
    finally:
        db.close()
    out["missing"] = len(want) - len(seen)
    return out


def _s(v: float) -> str:
    return f"{v:,.0f} s" if v >= 10 else f"{v:.1f} s"


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _size(b: int) -> str:
    return f"{b / MIB:,.0f} MiB" if b < 10 * 1024 * MIB else f"{b / 1024 / MIB:,.1f} GiB"


def _grep_count(directory: Path, needle: str) -> int:
    n = 0
    for f in sorted(directory.glob("events-*.jsonl")):
        r = subprocess.run(["grep", "-c", "-F", needle, str(f)], capture_output=True, text=True, timeout=600)
        n += int(r.stdout.strip() or 0)
    return n


def run_backlog(a: argparse.Namespace, tmp: Path) -> tuple[list[list[str]], list[str], bool]:
    from semq.testing.loadgen import proc_info

    n = a.docs
    dl = Deadline(a.time_cap)
    c = Cluster(tmp, a.security == "on")
    sampler: Sampler | None = None
    poll = 5.0 if n >= 500_000 else 2.0 if n >= 100_000 else 0.5  # counting 1M rows costs CPU too
    try:
        c.start("P")
        sampler = Sampler(c)
        sampler.phase = "accept"
        _log(f"accepting {n:,} documents into A's store (A's daemon not running)")
        accept_rate, rids = preload(c, n, dl)
        _log(f"  {accept_rate:,.0f} docs/s")
        sampler.phase = "store"
        t0 = time.monotonic()
        c.start("A")
        last_log = t0
        while True:
            done = c.count("A", "SELECT count(*) FROM outbox WHERE state=3")
            now = time.monotonic()
            if done >= n:
                break
            if now - last_log >= 10:
                last_log = now
                last = sampler.last.get("P")
                _log(f"  store: {done:,} of {n:,} ACK_SAVE'd ({done / (now - t0):,.0f}/s), platform RSS"
                     f" {last.rss_mib if last else 0:.0f} MiB")
            dl.check("storing the backlog at the platform", f"{done:,} of {n:,} ACK_SAVE'd")
            time.sleep(poll)
        store_s = time.monotonic() - t0
        sampler.sample()
        pid = c.pid("P")
        assert pid is not None
        stored_info = proc_info(pid)
        assert stored_info is not None
        stored_rows = c.count("P", "SELECT count(*) FROM stored WHERE kind=1")
        if stored_rows != n:
            raise BenchError(f"A saw {n:,} ACK_SAVEs but the platform holds {stored_rows:,} stored copies")
        disk_stored = c.disk("P")
        disk_a = c.disk("A")
        _log(f"stored {n:,} in {store_s:.0f} s ({n / store_s:,.0f}/s); platform RSS {stored_info.rss_mib:.0f} MiB,"
             f" VmHWM {stored_info.hwm_mib:.0f} MiB; platform store {_size(disk_stored['store'])}")
        restart: dict[str, Any] = {}
        if a.restart_platform:
            sampler.phase = "restart"
            _log("restarting the platform with the backlog stored")
            c.stop("P")
            restart["start_s"] = c.start("P")
            time.sleep(2)
            pid = c.pid("P")
            assert pid is not None
            info = proc_info(pid)
            restart["rss"] = info.rss_mib if info else None
            _log(f"  platform up in {restart['start_s']:.1f} s, RSS {restart['rss']:.0f} MiB")
        sampler.phase = "drain"
        t1 = time.monotonic()
        c.start("B")
        last_log = t1
        while True:
            got = c.count("B", "SELECT count(*) FROM inbox")
            left_p = c.count("P", "SELECT count(*) FROM stored")
            left_a = c.count("A", "SELECT count(*) FROM outbox") if got >= n else -1
            now = time.monotonic()
            if got >= n and left_p == 0 and left_a == 0:
                break
            if now - last_log >= 10:
                last_log = now
                last = sampler.last.get("P")
                _log(f"  drain: {got:,} of {n:,} in B's inbox ({got / (now - t1):,.0f}/s), platform stored"
                     f" {left_p:,}, RSS {last.rss_mib if last else 0:.0f} MiB")
            dl.check("draining the backlog to B", f"{got:,} of {n:,} in B's inbox, {left_p:,} still stored")
            time.sleep(poll)
        drain_s = time.monotonic() - t1
        sampler.sample()
        pid = c.pid("P")
        assert pid is not None
        drained_info = proc_info(pid)
        assert drained_info is not None
        _log(f"drained {n:,} in {drain_s:.0f} s ({n / drain_s:,.0f}/s); platform VmHWM {drained_info.hwm_mib:.0f} MiB")
        hwm_a = sampler.last["A"].hwm_mib if "A" in sampler.last else None
        hwm_b = sampler.last["B"].hwm_mib if "B" in sampler.last else None
        sampler.phase = "stop"
        c.stop_all()
        # ---- completeness, on the stopped stores
        _log("checking completeness")
        chk = check_inbox(c, rids)
        left_out = c.count("A", "SELECT count(*) FROM outbox")
        left_stored = c.count("P", "SELECT count(*) FROM stored")
        inbound = c.count("B", "SELECT count(*) FROM inbound")
        disk_end = {w: c.disk(w) for w in ("P", "A", "B")}
        sent = _grep_count(c.root / "A" / "events", '"event":"sent"')
        resent = _grep_count(c.root / "A" / "events", '"event":"resend"')
        inquiries = _grep_count(c.root / "A" / "events", '"event":"inquiry"')
        delivered = _grep_count(c.root / "P" / "events", '"event":"delivered"')
        forwarded = _grep_count(c.root / "P" / "events", '"event":"forwarded"')
        received = _grep_count(c.root / "B" / "events", '"event":"received"')
        dropped_dup = _grep_count(c.root / "B" / "events", '"event":"duplicate"')
        problems = []
        if chk["rows"] != n or chk["missing"] or chk["unexpected"] or chk["duplicated"]:
            problems.append(f"B's inbox holds {chk['rows']:,} rows (expected {n:,}): {chk['missing']:,} missing,"
                            f" {chk['unexpected']:,} unexpected, {chk['duplicated']:,} duplicated")
        if chk["differing"]:
            problems.append(f"{chk['differing']:,} documents in B's inbox differ from what A sent")
        if left_out or left_stored:
            problems.append(f"left behind: A's outbox {left_out:,}, platform stored {left_stored:,}")
        ok = not problems
    finally:
        if sampler is not None:
            sampler.close()
        c.stop_all()
    peak_store = sampler.peak("store", "P") if sampler else None
    peak_drain = sampler.peak("drain", "P") if sampler else None
    peak_all = max(v for (_, name), v in sampler.peaks.items() if name == "P") if sampler else 0.0
    limit_ok = max(peak_all, drained_info.hwm_mib) < a.rss_limit
    rows = [
        ["documents (1 KiB, SaveFwd 3, Ack2)", f"{n:,}"],
        ["accept into A's store (send_many, 1,000/transaction)", f"{_s(n / accept_rate)} ({accept_rate:,.0f}/s)"],
        ["store: A -> platform, all ACK_SAVE'd (B offline)", f"{_s(store_s)} ({n / store_s:,.0f}/s)"],
        ["drain: B starts -> inbox complete, platform and A empty", f"{_s(drain_s)} ({n / drain_s:,.0f}/s)"],
        ["platform RSS peak while storing (sampled 0.5 s)", f"{_mib(peak_store)} MiB"],
        [f"platform RSS with {n:,} stored (VmRSS / VmHWM)", f"{stored_info.rss_mib:,.0f} / {stored_info.hwm_mib:,.0f} MiB"],
    ]
    if restart:
        rows.append(["platform restarted with the backlog: start / RSS",
                     f"{restart['start_s']:.1f} s / {_mib(restart['rss'])} MiB"])
    rows += [
        ["platform RSS peak while draining (sampled 0.5 s)", f"{_mib(peak_drain)} MiB"],
        ["platform VmHWM at the end (whole run)", f"{drained_info.hwm_mib:,.0f} MiB"],
        [f"  bound {a.rss_limit:g} MiB", "met" if limit_ok else "NOT met"],
        ["A / B VmHWM", f"{_mib(hwm_a)} / {_mib(hwm_b)} MiB"],
        ["platform store with the backlog (+ event log)", f"{_size(disk_stored['store'])} (+ {_size(disk_stored['events'])})"],
        ["A's store with the backlog", _size(disk_a["store"])],
        ["after: platform / A / B stores", " / ".join(_size(disk_end[w]["store"]) for w in ("P", "A", "B"))],
        ["after: platform / A / B event logs", " / ".join(_size(disk_end[w]["events"]) for w in ("P", "A", "B"))],
        ["B's inbox: rows / missing / duplicated / body differs",
         f"{chk['rows']:,} / {chk['missing']:,} / {chk['duplicated']:,} / {chk['differing']:,}"],
        ["A's outbox / platform stored / B's pending-ack after the drain",
         f"{left_out:,} / {left_stored:,} / {inbound:,}"],
        ["DATA sent by A (of them resends after 'not received')", f"{sent:,} ({resent:,})"],
        ["platform: stored copies delivered / resends forwarded", f"{delivered:,} / {forwarded:,}"],
        ["B: DATA received / dropped as duplicates (dedup)", f"{received:,} / {dropped_dup:,}"],
        ["LK0s asked about by A (inquiries)", f"{inquiries:,}"],
    ]
    notes = [
        f"security {a.security}; SQLite synchronous=FULL, WAL; inquiry interval 15 s (default); RSS sampled every"
        " 0.5 s from /proc/PID/status (VmRSS), VmHWM read at the end of each phase.",
        "store = A's daemon start -> every row ACK_SAVE'd (polled every"
        f" {poll:g} s); drain = B's start -> B's inbox complete, platform 'stored' and A's outbox empty.",
        "2 vCPUs shared with other work: figures move by +-20-30 %.",
    ]
    if problems:
        notes += [f"FAILED: {p}" for p in problems]
    if not limit_ok:
        notes.append(f"platform peak RSS {max(peak_all, drained_info.hwm_mib):.0f} MiB is over --rss-limit {a.rss_limit:g} MiB")
    return rows, notes, ok and limit_ok


# ---------------------------------------------------------------- frames


def _frame_client(c: Cluster, org: str, secure: bool) -> socket.socket:
    import ssl

    raw = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    if not secure:
        return raw
    d = c.root / org
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(d / "ca.pem")
    ctx.load_cert_chain(d / "node.pem", d / "keys" / "sign.key.pem")
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _read_codes(s: socket.socket, timeout: float) -> list[int]:
    """Result codes of the ERROR / NACK frames that arrive within ``timeout``."""
    from semq.umxt_protocol import Error, FrameDecoder, Nack

    dec = FrameDecoder()
    s.settimeout(timeout)
    codes: list[int] = []
    try:
        while chunk := s.recv(1 << 20):
            dec.receive_data(chunk)
            for raw in dec.frames():
                body = raw.frame().body
                if isinstance(body, Error | Nack):
                    codes.append(int(body.code))
            if codes and timeout < 1:
                break
    except OSError:
        pass
    return codes


def run_frames(a: argparse.Namespace, tmp: Path) -> tuple[list[list[str]], list[str], bool]:
    from semq.umxt_protocol import (
        DEFAULT_MAX_FRAME,
        HELLO_MAX_FRAME,
        LK0,
        Data,
        Endpoint,
        Frame,
        Hello,
        Kind,
        ResultCode,
        encode_frame,
    )

    secure = a.security == "on"
    c = Cluster(tmp, secure)
    orgs = [str(70001 + i) for i in range(a.connections)]
    for org in orgs:
        if secure:
            c.cli("node", "init", "--dir", org, "--org", org, "--platform", f"127.0.0.1:{c.port}", "--enroll-from", "P")
    if not secure:
        c.cli("platform", "register", "--dir", "P", *orgs)
    cap = 4  # max_connections_per_org, the default
    sampler: Sampler | None = None
    problems: list[str] = []
    try:
        c.start("P")
        sampler = Sampler(c, interval=0.2)
        time.sleep(1)
        sampler.sample()
        idle = sampler.last["P"].rss_mib
        # 1. One connection more than an organization may hold; a large frame before HELLO.
        over = [_frame_client(c, orgs[0], secure) for _ in range(cap)]
        extra = _frame_client(c, orgs[0], secure)
        capped = ResultCode.TOO_MANY_CONNECTIONS in _read_codes(extra, 5) if secure else None
        for s in (*over, extra):
            s.close()
        big_head = encode_frame(Frame(kind=Kind.DATA, source=Endpoint.org(orgs[0]), target=Endpoint.org("99999"),
                                      body=Data(lk0=LK0(endpoint=Endpoint.org(orgs[0]), record_id=1),
                                                app_data=bytes(1 << 20))))[:200]
        early = []
        for org in orgs:
            s = _frame_client(c, org, secure)
            s.sendall(big_head)
            early.append(ResultCode.FRAME_TOO_LARGE in _read_codes(s, 5))
            s.close()
        # 2. Every connection sends maximum-size frames at once.
        overhead = 200
        size = DEFAULT_MAX_FRAME - overhead
        sampler.phase = "frames"
        refused = [0] * len(orgs)
        sent_bytes = [0] * len(orgs)
        errors: list[str] = []

        def client(i: int, org: str) -> None:
            try:
                s = _frame_client(c, org, secure)
                me = Endpoint.org(org)
                s.sendall(encode_frame(Frame(kind=Kind.HELLO, source=me, target=Endpoint.platform(),
                                             body=Hello(window=1024))))
                frame = encode_frame(Frame(kind=Kind.DATA, source=me, target=Endpoint.org("99999"),
                                           body=Data(lk0=LK0(endpoint=me, record_id=1), app_data=bytes(size))))
                assert len(frame) <= DEFAULT_MAX_FRAME
                for _ in range(a.frames):
                    s.sendall(frame)
                    sent_bytes[i] += len(frame)
                refused[i] = _read_codes(s, 60).count(int(ResultCode.UNKNOWN_TARGET))
                s.close()
            except (OSError, AssertionError) as e:
                errors.append(f"{org}: {e}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i, org)) for i, org in enumerate(orgs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        took = time.monotonic() - t0
        sampler.sample()
        pid = c.pid("P")
        from semq.testing.loadgen import proc_info

        info = proc_info(pid) if pid else None
        peak = max(sampler.peak("frames", "P") or 0.0, info.hwm_mib if info else 0.0)
        bound = idle + len(orgs) * (3 * DEFAULT_MAX_FRAME / MIB + 16)
        problems += errors
        if sum(refused) != len(orgs) * a.frames:
            problems.append(f"{sum(refused)} of {len(orgs) * a.frames} frames were answered UNKNOWN_TARGET")
        if capped is False:
            problems.append(f"a connection beyond {cap} for one organization was not refused")
        if not all(early):
            problems.append("a large frame before HELLO was not refused at its header")
        if peak > bound:
            problems.append(f"peak RSS {peak:.0f} MiB is over the bound {bound:.0f} MiB")
    finally:
        if sampler is not None:
            sampler.close()
        c.stop_all()
    rows = [
        ["connections (one per organization) x frames each", f"{len(orgs)} x {a.frames}"],
        ["frame size / limit before HELLO", f"{_mib(size / MIB)} / {HELLO_MAX_FRAME // 1024} KiB"],
        ["sent in", f"{_s(took)} ({sum(sent_bytes) / MIB / max(took, 1e-9):,.0f} MiB/s)"],
        ["platform RSS idle, MiB", _mib(idle)],
        ["platform RSS peak (sampled, VmHWM), MiB", _mib(peak)],
        ["bound: idle + connections x (3 x frame limit + 16 MiB), MiB", _mib(bound)],
        ["one connection over the cap of 4 per organization refused", "n/a (no TLS)" if capped is None else
         "yes" if capped else "NO"],
        ["maximum-size frame header before HELLO refused at once", f"{sum(early)} of {len(early)}"],
    ]
    notes = [f"security {a.security}; frames to an organization the platform does not know: each is read whole,"
             " then refused (UNKNOWN_TARGET).",
             "per connection the relay holds at most the frame being read, its copy, and the frame being"
             " handled, plus the reader's queue (16 MiB); an organization holds at most 4 connections.",
             "2 vCPUs shared with other work: figures move by +-20-30 %."]
    notes += [f"FAILED: {p}" for p in problems]
    return rows, notes, not problems


# ---------------------------------------------------------------- main


def code_version() -> str:
    import semq

    root = Path(semq.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode:
            return f"semq from {root}"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                "semq"], capture_output=True, text=True, timeout=10).stdout.strip()
        return f"semq from {root} at git {rev.stdout.strip()}{' +dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return f"semq from {root}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench load",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--security", default="on", choices=["on", "off"],
                        help="mutual TLS + end-to-end sealing (default on, as deployed)")
    common.add_argument("--keep", action="store_true", help="keep the directory (stores, logs)")
    common.add_argument("--json", action="store_true", help="print the table rows as JSON")
    n = sub.add_parser("nodes", parents=[common], help="many simulated nodes connected at once")
    n.add_argument("--nodes", type=int, default=1000)
    n.add_argument("--docs-per-node", type=int, default=3)
    n.add_argument("--pair-docs", type=int, default=10_000, help="documents A -> B per pair run")
    n.add_argument("--concurrency", type=int, default=64, help="handshakes at a time (default 64)")
    n.add_argument("--trickle", type=float, default=0.0, help="while connected: a document per node every S s")
    n.add_argument("--idle", type=float, default=10.0, help="s of idle CPU measurement (default 10)")
    n.add_argument("--rounds", type=int, default=3,
                   help="times all nodes connect and leave; RSS after each (default 3)")
    n.add_argument("--time-cap", type=float, default=1800.0, help="fail if the run takes longer (default 1800 s)")
    b = sub.add_parser("backlog", parents=[common], help="a big backlog for one offline node")
    b.add_argument("--docs", type=int, default=1_000_000)
    b.add_argument("--rss-limit", type=float, default=300.0, help="platform peak RSS bound, MiB (default 300)")
    b.add_argument("--restart-platform", action="store_true",
                   help="restart the platform with the backlog stored before B connects")
    b.add_argument("--time-cap", type=float, default=3600.0, help="fail if the run takes longer (default 3600 s)")
    f = sub.add_parser("frames", parents=[common], help="the relay's memory with maximum-size frames")
    f.add_argument("--connections", type=int, default=8, help="organizations sending at once (default 8)")
    f.add_argument("--frames", type=int, default=3, help="maximum-size frames per connection (default 3)")
    if __package__:
        from .flood import add_parser as add_flood
        from .flood import run_flood
    else:
        from flood import add_parser as add_flood  # type: ignore[no-redef]
        from flood import run_flood
    add_flood(sub, common)
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.what == "nodes" and (a.nodes < 2 or a.pair_docs < 1 or a.idle <= 0 or a.rounds < 1):
        print("error: --nodes must be >= 2, --pair-docs >= 1, --idle > 0, --rounds >= 1", file=sys.stderr)
        return 2
    if a.what == "backlog" and a.docs < 1:
        print("error: --docs must be >= 1", file=sys.stderr)
        return 2
    from semq.store.db import StoreError
    from semq.testing.loadgen import LoadGenError

    version = code_version()  # before any process starts: the tree may change during a long run
    tmp = Path(tempfile.mkdtemp(prefix=f"semq-bench-load-{a.what}-"))
    t0 = time.monotonic()
    try:
        run = {"nodes": run_nodes, "backlog": run_backlog, "frames": run_frames, "flood": run_flood}[a.what]
        rows, notes, ok = run(a, tmp)
    except (BenchError, StoreError, LoadGenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error, subprocess.SubprocessError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if a.keep:
            _log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    notes = [*notes, f"{version} at the start; {time.monotonic() - t0:,.0f} s in all."]
    if a.json:
        print(json.dumps({"rows": rows, "notes": notes, "ok": ok}, indent=1))
    else:
        title = (f"SEMQ load: {a.nodes:,} nodes connected at once to one platform" if a.what == "nodes"
                 else f"SEMQ load: a backlog of {a.docs:,} documents for one offline node" if a.what == "backlog"
                 else "SEMQ load: hostile floods at every listener, beside the declared bounds" if a.what == "flood"
                 else f"SEMQ load: {a.connections} connections sending maximum-size frames")
        header = (["phase", "attacked process", "bound (semq.settings.bounds)", "A's documents", "flood"]
                  if a.what == "flood" else ["", "measured"])
        print_table(title, header, rows, notes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
