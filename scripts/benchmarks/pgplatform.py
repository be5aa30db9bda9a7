#!/usr/bin/env python3
"""The platform's store: SQLite against PostgreSQL (one instance, two instances), and the failover gap.

The same SEMQ phases as ``scripts/bench e2e`` (``e2e.phase_online``,
``e2e.phase_store_drain``: A -> platform -> B, real processes on 127.0.0.1,
1 KiB, SaveFwd=3, Ack2 on, security off), in one run, for three platforms:

- **sqlite**: one ``semq platform run`` on its SQLite file (what the suite
  measures without ``--store``);
- **pg x1**: one instance whose store is a PostgreSQL database;
- **pg x2**: two instances on one database, each on its own copy of the
  platform's directory and port; A's node knows the first only, B's the
  second only, so every document crosses instances (stored by the first,
  which NOTIFYs the second at commit; semq/platform/cluster.py).

The PostgreSQL server is a throwaway one (semq.testing.pgserver: initdb in a
temporary directory, a free port, fsync and synchronous_commit on), or the
one at ``SEMQ_TEST_PG``; every phase gets a fresh database. CPU per document
is read from /proc for every daemon and for the server (its postmaster and
all its children, the backends: "PG"), so the PostgreSQL platform's cost is
counted whole. Ratios are against the SQLite platform's rate in the same
repeat's medians.

**failover** (two instances on PostgreSQL): A's node is given both
addresses (instance 1 first), B's the second only. An application streams
documents into A at ``--failover-rate``; a third of the way in, instance 1
(the one A is connected to) is killed with SIGKILL. Measured from the kill:
A's reconnection (instance 2's ``node_online`` for A), the first document
accepted after the kill reaching B's inbox ("documents flow again"), the
longest pause between two documents entering B's inbox, and the last
document delivered; B's inbox is then checked to hold every document exactly
once. This needs a node that takes several platform addresses (``semq node
init --platform a,b``; branch node-failover): where ``node init`` refuses
the list, the phase says so and is skipped.

Also run as ``scripts/bench suite --store postgresql``.

Usage: scripts/bench pgplatform [--count N] [--repeat R] [--no-half] [--failover-count N]
                                [--failover-rate R] [--synchronous MODE] [--phase-timeout S]
                                [--budget S] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

if __package__:
    from . import e2e
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/pgplatform.py
    import e2e  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]

__all__ = ["CONFIGS", "main", "phase_failover", "run"]

DEFAULT_COUNT: Final = 20_000
DEFAULT_BUDGET: Final = 900.0  # s: no step starts after it
FAILOVER_COUNT: Final = 12_000
FAILOVER_RATE: Final = 2_000.0  # docs/s offered to A while instance 1 is killed
FAILOVER_INQUIRY_S: Final = 2.0  # so a document lost with instance 1 is asked about within the phase
FAILOVER_KILL_AT: Final = 1 / 3  # of the stream
PHASES: Final = ("online", "half", "store", "drain")
# (key, label, instances on PostgreSQL; 0 = the SQLite platform)
CONFIGS: Final = (("sqlite", "SQLite platform", 0), ("pg1", "PostgreSQL, 1 instance", 1),
                  ("pg2", "PostgreSQL, 2 instances (A on 1, B on 2)", 2))
PROCS: Final = ("P", "P2", "A", "B", "PG")

# The aim for this comparison: two instances on PostgreSQL keep >= 70% of
# the SQLite platform's online rate.
TARGET_PG2_SHARE: Final = 0.70
TARGET_GAP_S: Final = 5.0


def _log(msg: str) -> None:
    print(f"[pgplatform] {msg}", file=sys.stderr, flush=True)


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if v is not None]
    return statistics.median(nums) if nums else None


# ---------------------------------------------------------------- failover


def _stream(root: Path, n: int, rate: float, started: threading.Event, errors: list[str]) -> None:
    """Accept ``n`` documents into A's store, paced at ``rate``/s (a thread:
    the main one kills the platform meanwhile)."""
    from semq.node.api import NodeClient

    try:
        with NodeClient(root / "A") as node:
            t0 = time.monotonic()
            started.set()
            done = 0
            while done < n:
                due = min(n, int((time.monotonic() - t0 + e2e.FEED_TICK) * rate))
                if due > done:
                    node.send_many(e2e.documents(done, due - done))
                    done = due
                time.sleep(max(0.0, t0 + done / rate - time.monotonic()))
    except Exception as exc:  # reported by the phase
        errors.append(f"{type(exc).__name__}: {exc}")
        started.set()


def phase_failover(tmp: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Stream A -> B across two instances, SIGKILL A's instance a third of
    the way in; times from the kill (s). ``{"unavailable": why}`` when the
    node cannot be given two platform addresses."""
    ns = argparse.Namespace(**{**vars(a), "platforms": 2, "secure": False})
    try:
        c = e2e._cluster(tmp, "failover", ns, homes={e2e.A: [1, 2], e2e.B: [2]},
                         inquiry_interval=FAILOVER_INQUIRY_S)
    except e2e.BenchError as exc:
        if "node init" in str(exc) and "platform" in str(exc):
            return {"unavailable": f"the node takes one platform address only ({exc})"}
        raise
    n, rate = a.failover_count, a.failover_rate
    try:
        c.start_platform()
        c.start("B")
        e2e._wait(lambda: c.online(e2e.B), a.phase_timeout, "B online")
        c.start("A")
        e2e._wait(lambda: c.online(e2e.A), a.phase_timeout, "A online")
        started = threading.Event()
        errors: list[str] = []
        feeder = threading.Thread(target=_stream, args=(c.root, n, rate, started, errors), daemon=True)
        feeder.start()
        started.wait(30)
        time.sleep(n / rate * FAILOVER_KILL_AT)
        kill_ms = time.time_ns() // 1_000_000  # the event logs' clock (ms since the epoch)
        c.kill("P")
        feeder.join(n / rate + a.phase_timeout)
        if errors or feeder.is_alive():
            raise e2e.BenchError(f"the feeder failed: {errors or 'still running'}")
        e2e._wait(lambda: c.count("B", "SELECT count(*) FROM inbox") == n
                  and c.count("A", "SELECT count(*) FROM outbox") == 0, a.phase_timeout,
                  f"{n} documents confirmed end to end at A after the failover")
        e2e.check_once(c, n)
        c.stop_all()
        queued = e2e.events(c.root / "A" / "events", ["queued"])["queued"]
        inbox = e2e.events(c.root / "B" / "events", ["inbox"])["inbox"]
        online2 = e2e.events(c.root / "P2" / "events", ["node_online"])["node_online"]
        after = sorted(ts for k, ts in inbox.items() if queued.get(k, 0) > kill_ms)
        times = sorted(inbox.values())
        around = [t for t in times if t >= kill_ms - 1000]
        pause = max((b - x for x, b in itertools.pairwise(around)), default=0)
        reconnect = online2.get(e2e.A)
        return {
            "docs": n, "rate_offered": rate,
            "queued_before_kill": sum(1 for ts in queued.values() if ts <= kill_ms),
            "delivered_before_kill": sum(1 for ts in times if ts <= kill_ms),
            "reconnect_s": None if reconnect is None or reconnect < kill_ms else (reconnect - kill_ms) / 1000,
            "flow_s": (after[0] - kill_ms) / 1000 if after else None,
            "pause_s": pause / 1000,
            "all_s": (times[-1] - kill_ms) / 1000,
        }
    finally:
        e2e._finish(c, ns)


# ---------------------------------------------------------------- the run


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Every configuration's phases ``a.repeat`` times, then the failover
    once; each step's failure is recorded and the next runs."""
    res: dict[str, Any] = {"runs": {k: {p: [] for p in PHASES} for k, _, _ in CONFIGS},
                           "failover": [], "errors": [], "skipped": [], "load": [e2e_load()]}
    t0 = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="semq-bench-pg-"))

    def step(what: str, fn: Any) -> None:
        if time.monotonic() - t0 > a.budget:
            res["skipped"].append(what)
            _log(f"skipped (time budget of {a.budget:.0f} s used): {what}")
            return
        try:
            fn()
        except Exception as exc:  # BenchError, StoreError, psycopg's, timeouts...: the next step
            res["errors"].append(f"{what}: {type(exc).__name__}: {exc}")
            _log(f"failed: {what}: {exc}")

    try:
        with e2e.open_pg_stores() as pg:
            res["pg"] = pg.base.rpartition("@")[2] + ("" if pg.pid else " (SEMQ_TEST_PG: its CPU not read)")
            for r in range(a.repeat):
                _log(f"repeat {r + 1} of {a.repeat} (load average {e2e_load()})")
                for key, label, instances in CONFIGS:
                    tmp = base / f"run{r + 1}-{key}"
                    tmp.mkdir()
                    ns = argparse.Namespace(count=a.count, repeat=1, synchronous=a.synchronous,
                                            phase_timeout=a.phase_timeout, secure=False, keep=False,
                                            pg=pg if instances else None, platforms=max(1, instances))
                    runs = res["runs"][key]
                    got: dict[str, Any] = {}

                    def online(ns: argparse.Namespace = ns, tmp: Path = tmp, runs: Any = runs, got: Any = got,
                               label: str = label) -> None:
                        _log(f"{label}: online, {a.count} documents")
                        got["online"] = e2e.phase_online(tmp, a.count, ns)
                        runs["online"].append(got["online"])

                    def half(ns: argparse.Namespace = ns, tmp: Path = tmp, runs: Any = runs, got: Any = got,
                             label: str = label) -> None:
                        if "online" not in got:
                            raise RuntimeError("no full-load rate to halve (online failed)")
                        rate = got["online"]["rate"] / 2
                        _log(f"{label}: half load, {a.count // 2} documents at {rate:,.0f}/s")
                        runs["half"].append(e2e.phase_online(tmp, a.count // 2, ns, rate=rate))

                    def store_drain(ns: argparse.Namespace = ns, tmp: Path = tmp, runs: Any = runs,
                                    label: str = label) -> None:
                        _log(f"{label}: store then drain, {a.count} documents")
                        st, dr = e2e.phase_store_drain(tmp, a.count, ns)
                        runs["store"].append(st)
                        runs["drain"].append(dr)

                    step(f"{label} online, repeat {r + 1}", online)
                    if a.half:
                        step(f"{label} half load, repeat {r + 1}", half)
                    step(f"{label} store/drain, repeat {r + 1}", store_drain)

            def failover() -> None:
                _log(f"failover: {a.failover_count} documents at {a.failover_rate:,.0f}/s, instance 1 killed "
                     f"{FAILOVER_KILL_AT:.0%} of the way in")
                tmp = base / "failover"
                tmp.mkdir()
                ns = argparse.Namespace(**{**vars(a), "pg": pg, "keep": False})
                got = phase_failover(tmp, ns)
                if "unavailable" in got:
                    _log(f"failover skipped: {got['unavailable']}")
                res["failover"].append(got)

            if a.failover_count:
                step("failover", failover)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
        res["seconds"] = time.monotonic() - t0
        res["load"].append(e2e_load())
    return res


def e2e_load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# ---------------------------------------------------------------- the table


def _f(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def report(a: argparse.Namespace, res: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    labels = {"online": "online, full load", "half": "online, half load", "store": "store (B offline)",
              "drain": "drain (B connects)"}
    headers = ["platform / phase", "docs/s", "of SQLite", "p50 ms", "p99 ms",
               *(f"CPU {p}" for p in PROCS), "CPU total"]
    rows: list[list[str]] = []
    rate = {(k, p): _median([x["rate"] for x in res["runs"][k][p]]) for k, _, _ in CONFIGS for p in PHASES}
    for key, label, _ in CONFIGS:
        for ph in PHASES:
            runs = res["runs"][key][ph]
            if not runs:
                continue
            cpu = {who: _median([(x.get("cpu") or {}).get(who) for x in runs]) for who in PROCS}
            total = _median([sum(v for v in (x.get("cpu") or {}).values() if v is not None) for x in runs])
            base = rate[("sqlite", ph)]
            mine = rate[(key, ph)]
            share = f"{mine / base:.0%}" if mine and base and ph != "half" else "-"
            lat = ph in ("online", "half")
            rows.append([f"{label}: {labels[ph]}", _f(mine), share,
                         _f(_median([x["p50"] for x in runs])) if lat else "-",
                         _f(_median([x["p99"] for x in runs])) if lat else "-",
                         *(_f(cpu[w]) for w in PROCS), _f(total)])
    n_runs = max((len(res["runs"][k]["online"]) for k, _, _ in CONFIGS), default=0)
    notes = [
        f"1 KiB documents, SaveFwd=3, Ack2 on, security off; node stores SQLite WAL synchronous={a.synchronous}; "
        f"PostgreSQL {res.get('pg', '?')}, fsync and synchronous_commit on, a fresh database per phase; "
        f"N = {a.count:,} per phase (half load N/2, paced at half the full-load rate of the same platform); "
        f"median of {n_runs} run(s); {res.get('seconds', 0):.0f} s in all; {e2e.code_version()}.",
        f"Load average (1/5/15 min) at start {res['load'][0]}, at end {res['load'][-1]}: 2 shared cores, the "
        "server and every daemon on them; figures move by 20-30% or more between runs.",
        "docs/s as scripts/bench e2e: online = A's first send -> last ACK2; store = first send -> last ACK_SAVE; "
        "drain = B online -> last ACK2 / platform ack. of SQLite = docs/s / the SQLite platform's in the same phase.",
        "CPU us/doc = user + system CPU of each process during the phase / documents (/proc): P, P2 = the "
        "platform's instances, A, B = the nodes, PG = the PostgreSQL server (postmaster and every child: "
        "backends, WAL writer, checkpointer); total = their sum. '-' = not running (P2: one instance; PG: SQLite).",
    ]
    sq, two = rate[("sqlite", "online")], rate[("pg2", "online")]
    if sq and two:
        ok = two >= TARGET_PG2_SHARE * sq
        notes.append(f"aim: two instances on PostgreSQL >= {TARGET_PG2_SHARE:.0%} of the SQLite platform's online rate: "
                     f"{two:,.0f} / {sq:,.0f} = {two / sq:.0%}, {'met' if ok else 'NOT met'}.")
    for f in res["failover"]:
        if "unavailable" in f:
            notes.append(f"failover: not measured: {f['unavailable']}.")
            continue
        gap = f["flow_s"]
        notes.append(
            f"failover (2 instances; A given both addresses, B the second; {f['docs']:,} documents offered at "
            f"{f['rate_offered']:,.0f}/s, instance 1 SIGKILLed after {f['queued_before_kill']:,} were accepted "
            f"and {f['delivered_before_kill']:,} delivered; inquiry interval {FAILOVER_INQUIRY_S:g} s): "
            f"A reconnected to instance 2 after {_f(f['reconnect_s'], '.2f')} s; the first document accepted after "
            f"the kill reached B's inbox after {_f(gap, '.2f')} s; longest pause in B's inbox {f['pause_s']:.2f} s; "
            f"the last document {f['all_s']:.2f} s after the kill; every document exactly once. "
            f"Aim gap <= {TARGET_GAP_S:g} s: "
            + ("not measured" if gap is None else
               f"{'met' if max(gap, f['pause_s']) <= TARGET_GAP_S else 'NOT met'}") + ".")
    notes.extend(f"skipped (time budget): {s}" for s in res["skipped"])
    notes.extend(f"ERROR: {e}" for e in res["errors"])
    return headers, rows, notes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options this comparison adds to a parser (also the suite's)."""
    p.add_argument("--no-half", dest="half", action="store_false", help="skip the half-load phase")
    p.add_argument("--failover-count", type=int, default=FAILOVER_COUNT,
                   help="documents streamed through the failover (0: no failover phase; default %(default)s)")
    p.add_argument("--failover-rate", type=float, default=FAILOVER_RATE,
                   help="docs/s offered during the failover (default %(default)g)")


def print_report(a: argparse.Namespace, res: dict[str, Any]) -> int:
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        headers, rows, notes = report(a, res)
        print_table("The platform's store: SQLite against PostgreSQL (one and two instances), 1 KiB documents",
                    headers, rows, notes)
    return 1 if res["errors"] or res["skipped"] else 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when everything was measured, 1 when a step failed or was
    skipped (the table shows the rest), 2 on a usage error."""
    p = argparse.ArgumentParser(prog="scripts/bench pgplatform",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, help="documents per phase (default %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="runs of every configuration; medians (default 1)")
    p.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"],
                   help="SQLite synchronous mode of the nodes' and the SQLite platform's stores (default FULL)")
    p.add_argument("--phase-timeout", type=float, default=e2e.DEFAULT_PHASE_TIMEOUT,
                   help="limit of each wait, s (default %(default)s)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                   help="s; no step starts after it (default %(default)g)")
    p.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    add_arguments(p)
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.count < 2 or not 1 <= a.repeat <= 5 or a.failover_count < 0 or a.failover_rate <= 0:
        print("error: --count must be >= 2, --repeat 1..5, --failover-count >= 0, --failover-rate > 0",
              file=sys.stderr)
        return 2
    try:
        res = run(a)
    except RuntimeError as e:  # the throwaway server did not start
        print(f"error: {e}", file=sys.stderr)
        return 1
    return print_report(a, res)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
