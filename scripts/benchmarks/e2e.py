#!/usr/bin/env python3
"""SEMQ end to end: documents/s and latency A -> platform -> B, real processes.

Organization 10008 (A) sends N 1 KiB documents to 56001 (B) through the
platform relay; SaveFwd=3, Ack2 on, security off unless ``--security``.
Every process is a real ``semq ... run`` on
127.0.0.1 with its stores in a fresh temporary directory (SQLite WAL,
``synchronous`` from ``--synchronous``, FULL by default: every state change is
committed before the frame that depends on it leaves the process).

Phases (each repeat starts fresh processes and stores for each):

- **online** (full load): B and the platform run; the N documents are
  accepted into A's store with ``NodeClient.send_many`` (1000 per
  transaction) *before* A's daemon starts, so the figure is what the daemons
  move, not how fast an application inserts (that rate is printed as
  ``accept``). docs/s = N / (A's first ``sent`` event -> A's last ``ack2``
  event), i.e. until A's outbox is empty: every document confirmed end to
  end and cleaned up at A.
- **half load**: the same, but an application feeds A's store while A runs,
  paced at half the online rate of this repeat (batches every 20 ms); N/2
  documents. docs/s is what was achieved (≈ the offered rate when A keeps up).
- **store**: B offline; N pre-loaded documents; docs/s = N / (first ``sent``
  -> last ``ack_save`` at A): every document committed at the platform.
- **drain**: B starts; docs/s = N / (the platform's ``node_online`` for B ->
  the last of A's ``ack2`` and the platform's ``acked``): every stored copy
  delivered, acknowledged by B (platform copy deleted) and confirmed end to
  end at A.

Latency is send -> inbox per document: A's ``sent`` event (the DATA frame's
transaction committed, frame about to be written) to B's ``inbox`` event
(document committed to B's inbox), both from the JSON-lines event logs
(docs/events.md) and on this one machine's clock; queued -> inbox (what the
application sees, including the wait in A's table until A notices the row) is shown too. The
inquiry interval is the default 15 s, so no inquiry runs inside a phase.

Peak RSS is VmHWM from /proc/PID/status of every daemon, read just before it
is stopped (platform and A of the store/drain pair cover both phases).
Figures are medians over ``--repeat`` runs; B's inbox is checked to hold
every document exactly once after each phase.

``--security on|both`` measures with mutual TLS and end-to-end sealing and
signatures too (when the daemons have them); the default is off.

``--receiver-units N`` runs B as N units (``semq node init --units N``:
``semq node run`` supervises N unit processes, each with its own store and
platform connection; the platform gives each document to one unit by its
LK0), ``--sender-units N`` A likewise (the pre-loaded documents go in calls
of 1000, each into the next unit, as ``NodeClient.send_many`` spreads
them). Inbox and outbox counts are then summed over every unit's store, B's
inbox is checked to hold each LK0 once over all its units, and a node's CPU
and RSS are the sums over its supervisor and units (each unit's PID read
from its status.json; listed per process under the table). For store and
drain a B of several units is started and stopped once before the store
phase: the platform learns a node's units from its HELLO, as it would have
from a node that went offline.

``--direct`` measures the relayed path (A -> platform -> B) beside a
direct node-to-node link (A -> B, mutual TLS; B started with ``--listen
127.0.0.1:0``), security on, alternated in one run: online and half load
(store and drain need B offline, when there is no link: they are the relayed
path's). See ``phase_path`` for how each phase is set up and checked.

Usage: scripts/bench e2e [--count N] [--repeat R] [--security off|on|both]
                         [--receiver-units N] [--sender-units N]
                         [--synchronous MODE] [--phase-timeout S] [--keep] [--json]
       scripts/bench e2e --direct [--count N] [--repeat R] [...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

if __package__:
    from ._proc import alive, cpu_seconds, parent_pid, terminate
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/e2e.py
    from _proc import alive, cpu_seconds, parent_pid, terminate  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]

DEFAULT_COUNT: Final = 20_000
DEFAULT_PHASE_TIMEOUT: Final = 90.0
PAYLOAD: Final = 1024
LOAD_BATCH: Final = 1000
FEED_TICK: Final = 0.02  # s between the half-load feeder's batches
A, B = "10008", "56001"
NODE_DIR: Final = {A: "A", B: "B"}  # each organization's directory in a Cluster
SEMQ: Final = [sys.executable, "-m", "semq"]

MAX_UNITS: Final = 32  # semq.umxt_protocol.units.MAX_UNITS (checked before any semq import)

# Performance targets (2 cores, security off).
TARGETS: Final = {"online": 15_000, "store": 20_000, "drain": 45_000}
P99_TARGET_HALF_MS: Final = 20.0


class BenchError(Exception):
    pass


def _log(msg: str) -> None:
    print(f"[e2e] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def security_supported() -> bool:
    r = subprocess.run([*SEMQ, "node", "init", "--help"], capture_output=True, text=True, timeout=60)
    return "--enroll-from" in r.stdout


class Cluster:
    """A platform, A and B in one temporary directory; processes by PID.

    With ``store`` (a PostgreSQL URL) the platform keeps its store there, and
    ``platforms`` instances run on copies of its directory (P, P2, ...), each
    on its own port (semq/platform/cluster.py). ``homes`` says which
    instances each node is given, in order (default: A the first, B the
    last, so with two instances every document crosses from one to the
    other). ``pg_pid``: the PostgreSQL server's postmaster, whose CPU (with
    its children's, the backends) is read as the daemons' is, as "PG".

    ``units``: how many units (semq.umxt_protocol.units) node "A" or "B" runs as (default
    1). Such a node is initialised with ``--units N``; ``start`` runs its
    supervisor and reads each unit's PID from the unit's status.json. Its
    processes are then named "B/sup" (the supervisor) and "B/1".."B/N" in
    ``cpu`` and ``rss_all``, ``count`` sums over every unit's store and
    ``online`` waits for every unit's connection."""

    def __init__(self, root: Path, synchronous: str, timeout: float, secure: bool, store: str = "",
                 platforms: int = 1, homes: dict[str, Sequence[int]] | None = None, pg_pid: int | None = None,
                 inquiry_interval: float | None = None, units: dict[str, int] | None = None) -> None:
        self.root = root
        self.units = {"A": 1, "B": 1, **(units or {})}
        self.unit_pids: dict[str, dict[int, int]] = {}  # node -> {unit: PID}, for nodes of several units
        self.ready_cpu: dict[str, float | None] = {}  # process (as in cpu()) -> CPU s when it said it runs
        self.timeout = timeout
        self.store = store
        self.ports = [_free_port() for _ in range(platforms)]
        self.port = self.ports[0]
        self.instances = ["P" if i == 1 else f"P{i}" for i in range(1, platforms + 1)]
        self.pg_pid = pg_pid
        self.inquiry = [] if inquiry_interval is None else ["--inquiry-interval", f"{inquiry_interval:g}"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {k: v for k, v in os.environ.items() if k != "SEMQ_DIR"}
        self.env["PYTHONUNBUFFERED"] = "1"
        homes = homes or {A: [1], B: [platforms]}
        # With security in the CLI: on = CA, enrolment, mutual TLS, sealed and
        # signed documents; off = --no-security. Without it: plain, as ever.
        has_security = security_supported()
        if secure and not has_security:
            raise BenchError("this semq has no security in its daemons (no 'node init --enroll-from')")
        off = ["--no-security"] if has_security and not secure else []
        on_pg = ["--store", store] if store else []
        self._cli("platform", "init", "--dir", "P", "--listen", f"127.0.0.1:{self.port}", *off, *on_pg)
        for org, d in ((A, "A"), (B, "B")):
            addresses = ",".join(f"127.0.0.1:{self.ports[i - 1]}" for i in homes[org])
            several = ["--units", str(self.units[d])] if self.units[d] > 1 else []
            self._cli("node", "init", "--dir", d, "--org", org, "--platform", addresses, *off, *several,
                      *(["--enroll-from", "P"] if secure else []))
        if not secure:
            self._cli("platform", "register", "--dir", "P", A, B)
            for org, d in ((A, "A"), (B, "B")):
                if self.units[d] > 1:  # (enrollment grants them; here the operator does)
                    self._cli("platform", "register", "--dir", "P", org, "--units", str(self.units[d]))
        # Further instances: copies of the platform's directory (its CA and
        # configuration; the store is the shared database), as docs/operations.md says.
        for name in self.instances[1:]:
            shutil.copytree(root / "P", root / name, ignore=shutil.ignore_patterns("events", "status.json"))
        if synchronous != "FULL":
            for d in ("A", "B", *self.instances):
                cfg = root / d / "semq.toml"
                cfg.write_text(cfg.read_text().replace('synchronous = "FULL"', f'synchronous = "{synchronous}"'))

    def _cli(self, *args: str) -> None:
        r = subprocess.run([*SEMQ, *args], cwd=self.root, env=self.env, capture_output=True, timeout=60)
        if r.returncode:
            raise BenchError(f"semq {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")

    def start(self, name: str, extra: Sequence[str] = ()) -> None:
        """Start a daemon (``extra``: more ``run`` options, e.g. a node's
        ``--listen`` for direct links) and wait until it says it runs."""
        if name in self.instances:
            i = self.instances.index(name)
            args = ["platform", "run", "--dir", name, *self.inquiry]
            if i:
                args += ["--listen", f"127.0.0.1:{self.ports[i]}"]
        else:
            args = ["node", "run", "--dir", name, *self.inquiry]
        args += extra
        log = self.root / f"{name}.log"
        with log.open("ab") as f:
            offset = f.tell()  # a daemon started again appends: read only what this start wrote
            p = subprocess.Popen([*SEMQ, *args], cwd=self.root, env=self.env, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        units = 1 if name in self.instances else self.units[name]
        # A node of several units: its supervisor says so once every unit runs.
        ready = "listening on" if name in self.instances else "running" if units == 1 else f"running as {units} units"

        found: dict[int, int] = {}  # unit -> PID

        def said() -> bool:
            # Each unit's PID, and its CPU so far, as soon as its status.json
            # names it (written right after the unit says it runs): a unit
            # that runs before the others may already be at work.
            for k in range(1, units + 1) if units > 1 else ():
                if k not in found and (pid := self._unit_pid(name, k, p.pid)) is not None:
                    found[k] = pid
                    self.ready_cpu[f"{name}/{k}"] = cpu_seconds(pid)
            with log.open("rb") as fh:
                fh.seek(offset)
                return ready in fh.read().decode(errors="replace") and len(found) == (units if units > 1 else 0)

        _wait(lambda: said() or p.poll() is not None, self.timeout,
              f"{name} to start" + (" and each unit to write its PID in status.json" if units > 1 else ""), 0.02)
        if p.poll() is not None:
            raise BenchError(f"{name} exited {p.returncode}: {log.read_text(errors='replace')[-1500:]}")
        if units > 1:
            self.unit_pids[name] = dict(sorted(found.items()))
        self.ready_cpu[f"{name}/sup" if units > 1 else name] = cpu_seconds(p.pid)

    def cpu_at_ready(self, name: str) -> dict[str, float | None]:
        """CPU seconds of daemon ``name``'s processes when each said it runs
        (last start), keyed as in ``cpu``: a baseline without the start-up."""
        return {k: v for k, v in self.ready_cpu.items() if k == name or k.startswith(f"{name}/")}

    def unit_dir(self, name: str, unit: int) -> Path:
        """Where unit ``unit`` of node ``name`` keeps its store and status.json."""
        return self.root / name if unit == 1 else self.root / name / f"unit-{unit}"

    def _unit_pid(self, name: str, unit: int, supervisor: int) -> int | None:
        """The PID in the unit's status.json (written when it runs, then every
        second) if it names a child of this run's supervisor, else None."""
        try:
            value = json.loads((self.unit_dir(name, unit) / "status.json").read_text(encoding="utf-8")).get("pid")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, int) and parent_pid(value) == supervisor else None

    def start_platform(self) -> None:
        """Every instance of the platform."""
        for name in self.instances:
            self.start(name)

    def pids(self) -> dict[str, int]:
        """Every running daemon process by name: "P", "A", "B"..., and for a
        node of several units "B/sup" (its supervisor) and "B/1".."B/N"."""
        out: dict[str, int] = {}
        for name, p in self.procs.items():
            if p.poll() is not None:
                continue
            units = self.unit_pids.get(name)
            if units:
                out[f"{name}/sup"] = p.pid
                out.update({f"{name}/{k}": pid for k, pid in units.items()})
            else:
                out[name] = p.pid
        return out

    def rss_all(self) -> dict[str, float | None]:
        """Peak RSS of every process of ``pids`` (the platform's instances,
        A and B are always keys; None: not running)."""
        out: dict[str, float | None] = dict.fromkeys((*self.instances, "A", "B"))
        out.update({k: peak_rss_mib(pid) for k, pid in self.pids().items()})
        return out

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds used so far by each process of ``pids`` (and, as "PG",
        by the PostgreSQL server: its postmaster and every child)."""
        out = {k: cpu_seconds(pid) for k, pid in self.pids().items()}
        if self.pg_pid is not None:
            out["PG"] = tree_cpu_seconds(self.pg_pid)
        return out

    def stop(self, name: str) -> None:
        """SIGTERM, SIGKILL after 15 s; a node's units (which its supervisor
        stops) are waited for too and SIGKILLed by PID if still there after 15 s."""
        p = self.procs.pop(name, None)
        units = list(self.unit_pids.pop(name, {}).values())
        if p is not None:
            terminate(p, 15.0)
        self._end_units(units, 15.0)

    def kill(self, name: str) -> None:
        """SIGKILL, by PID: no clean-up, as a crash (a node's units too)."""
        p = self.procs.pop(name)
        units = list(self.unit_pids.pop(name, {}).values())
        for pid in units:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait(timeout=10)
        self._end_units(units, 0.0)

    @staticmethod
    def _end_units(pids: Sequence[int], grace: float) -> None:
        """Wait up to ``grace`` s for unit processes to end (they are the
        supervisor's children, not ours: polled in /proc), then SIGKILL the
        rest by PID and wait for them (bounded)."""
        deadline = time.monotonic() + grace
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def alive(self) -> None:
        """Raise BenchError if a daemon, or a unit of a node, exited (a unit
        its supervisor started again would be measured with a restart in it)."""
        for name, p in self.procs.items():
            log = self.root / f"{name}.log"
            if p.poll() is not None:
                raise BenchError(f"{name} exited {p.returncode} during the run: "
                                 f"{log.read_text(errors='replace')[-1500:]}")
            for unit, pid in self.unit_pids.get(name, {}).items():
                if not alive(pid):
                    raise BenchError(f"unit {unit} of {name} (PID {pid}) exited during the run: "
                                     f"{log.read_text(errors='replace')[-1500:]}")

    def count(self, who: str, sql: str) -> int:
        self.alive()
        if who == "P" and self.store:
            import psycopg

            from semq.store.pg import translate_sql

            with psycopg.connect(self.store, autocommit=True) as pc:
                row = pc.execute(translate_sql(sql)).fetchone()
            return int(row[0]) if row else 0
        # A node of several units: the sum over every unit's store.
        return sum(int(r[0]) for r in self.rows(who, sql))

    def rows(self, who: str, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` in the SQLite store of ``who`` ("P", "A", "B"),
        read-only; for a node of several units, every unit's rows, unit 1 first."""
        if who == "P":
            paths = [self.root / "P" / "platform.sqlite"]
        else:
            paths = [self.unit_dir(who, k) / "node.sqlite" for k in range(1, self.units[who] + 1)]
        out: list[tuple[Any, ...]] = []
        for path in paths:
            c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                out += c.execute(sql).fetchall()
            finally:
                c.close()
        return out

    def routes(self, org: str) -> list[str]:
        """How the platform names ``org``'s connections: the organization for
        unit 1, ``ORG:K`` for unit K (semq.umxt_protocol.units.route_of)."""
        from semq.umxt_protocol.units import UNIT_SEP

        return [org, *(f"{org}{UNIT_SEP}{k}" for k in range(2, self.units[NODE_DIR[org]] + 1))]

    def online_routes(self) -> set[str]:
        """The connections the platform's instances report in status.json
        (rewritten every second): organizations, and ``ORG:K`` for units."""
        seen: set[str] = set()
        for name in self.instances:
            try:
                st = json.loads((self.root / name / "status.json").read_text())
            except (OSError, ValueError):
                continue
            seen.update(st.get("online", []))
        return seen

    def online(self, org: str) -> bool:
        """``org`` is connected to one of the platform's instances (every
        unit of it, for a node of several)."""
        return set(self.routes(org)) <= self.online_routes()

    def platform_events(self, wanted: Iterable[str], since_ms: int = 0) -> dict[str, dict[str, int]]:
        """``events`` of every instance of the platform, merged (the first of
        each at or after ``since_ms``)."""
        out: dict[str, dict[str, int]] = {w: {} for w in wanted}
        for name in self.instances:
            for ev, got in events(self.root / name / "events", wanted, since_ms).items():
                for k, ts in got.items():
                    out[ev][k] = min(ts, out[ev].get(k, ts))
        return out


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and its live children so far (the
    PostgreSQL postmaster and its backends and workers); None when the
    process is gone. A backend that ended between two readings takes its
    CPU with it: the platform's connections live as long as the phase."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    total = own
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            total += cpu_seconds(int(name)) or 0.0
    return total


# ---------------------------------------------------------------- documents


def documents(start: int, n: int, ordered: str = "", priority_every: int = 0) -> list[dict[str, Any]]:
    """Documents ``start`` .. ``start + n - 1``: 1 KiB each, SaveFwd=3, Ack2.
    ``ordered``: all in that ordered channel (``NodeClient.send_many``'s
    ``ordered``); ``priority_every`` K > 0: every K-th (K, 2K, ...) at
    priority 1, the others at 0."""
    out = []
    for i in range(start, start + n):
        head = f"<order id='S{i:07d}'>".encode()
        d = dict(to=B, data=head + b"x" * (PAYLOAD - len(head)), data_type="ORDER", domain="trade",
                 subtype="PO", key=f"S{i:07d}", save_fwd=3, ack2=True)
        if ordered:
            d["ordered"] = ordered
        if priority_every > 0 and (i + 1) % priority_every == 0:
            d["priority"] = 1
        out.append(d)
    return out


#: Makes documents ``start`` .. ``start + n - 1`` for ``NodeClient.send_many``.
Documents = Callable[[int, int], list[dict[str, Any]]]


def preload(root: Path, n: int, docs: Documents = documents) -> float:
    """Accept n documents into A's store (no daemon running); returns docs/s."""
    from semq.node.api import NodeClient

    t0 = time.perf_counter()
    with NodeClient(root / "A") as node:
        for i in range(0, n, LOAD_BATCH):
            node.send_many(docs(i, min(LOAD_BATCH, n - i)))
    return n / (time.perf_counter() - t0)


def feed(root: Path, n: int, rate: float, c: Cluster, docs: Documents = documents) -> None:
    """Accept n documents into A's store while A runs, paced at ``rate``/s."""
    from semq.node.api import NodeClient

    t0 = time.monotonic()
    done = 0
    with NodeClient(root / "A") as node:
        while done < n:
            due = min(n, int((time.monotonic() - t0 + FEED_TICK) * rate))
            if due > done:
                node.send_many(docs(done, due - done))
                done = due
            c.alive()
            time.sleep(max(0.0, t0 + done / rate - time.monotonic()))


# ---------------------------------------------------------------- event logs


def events(directory: Path, wanted: Iterable[str], since_ms: int = 0) -> dict[str, dict[str, int]]:
    """{event: {lk0: first ts}} for the wanted events of one logger's files
    (a node's units' files included), those before ``since_ms`` left out."""
    want = set(wanted)
    needles = [f'"event":"{w}"' for w in want]
    out: dict[str, dict[str, int]] = {w: {} for w in want}
    for f in sorted(directory.glob("events-*.jsonl")):
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                if not any(n in line for n in needles):
                    continue
                e = json.loads(line)
                ev = e["event"]
                if ev in want and e["ts"] >= since_ms:
                    key = e.get("lk0") or e.get("node", "")
                    seen = out[ev].get(key)
                    if seen is None or e["ts"] < seen:  # the first, over several units' files
                        out[ev][key] = e["ts"]
    return out


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def latencies(root: Path, exclude: Collection[str] = ()) -> dict[str, float]:
    """Send -> inbox and queued -> inbox percentiles (ms) of every document
    but those whose LK0 is in ``exclude`` (a warm-up's)."""
    a = events(root / "A" / "events", ["queued", "sent"])
    b = events(root / "B" / "events", ["inbox"])
    sent, queued, inbox = a["sent"], a["queued"], b["inbox"]
    if exclude:
        inbox = {k: v for k, v in inbox.items() if k not in exclude}
    s2i = [inbox[k] - sent[k] for k in inbox if k in sent]
    q2i = [inbox[k] - queued[k] for k in inbox if k in queued]
    return {"p50": percentile(s2i, 50), "p99": percentile(s2i, 99),
            "q_p50": percentile(q2i, 50), "q_p99": percentile(q2i, 99)}


def check_once(c: Cluster, n: int) -> None:
    """B's inbox holds ``n`` documents, each once (over every unit's store:
    a document in two units would be a duplicate too)."""
    c.alive()
    keys = c.rows("B", "SELECT origin_id, semq_id, semq_db_id, record_id FROM inbox")  # the LK0s
    total, distinct = len(keys), len(set(keys))
    if total != n or distinct != n:
        raise BenchError(f"B's inbox holds {total} documents ({distinct} distinct), expected {n} exactly once")


# ---------------------------------------------------------------- phases


class PgStores:
    """Where the platform's PostgreSQL stores are made: a fresh database per
    phase on the server at ``base`` (a URL of its ``postgres`` database);
    ``pid``: its postmaster's, when it runs on this machine (for its CPU)."""

    def __init__(self, base: str, pid: int | None) -> None:
        self.base = base
        self.pid = pid
        self._made: list[str] = []

    def new_database(self) -> str:
        import uuid

        import psycopg

        name = f"semq_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.base, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self._made.append(name)
        return f"{self.base.rpartition('/')[0]}/{name}"

    def drop(self, url: str) -> None:
        """Drop a database made here (its phase's processes are stopped)."""
        import psycopg

        name = url.rpartition("/")[2]
        if name in self._made:
            with psycopg.connect(self.base, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._made.remove(name)


@contextlib.contextmanager
def open_pg_stores() -> Iterator[PgStores]:
    """The PostgreSQL server the platform's stores go to: ``SEMQ_TEST_PG``
    when set (its CPU is not read: it may be another machine's), else a
    throwaway one (semq.testing.pgserver: initdb in a temporary directory, a
    free port, fsync and synchronous_commit on), stopped and removed at the
    end. Never the machine's own server."""
    from semq.testing.pgserver import ENV_URL, throwaway_pg

    if os.environ.get(ENV_URL):
        yield PgStores(os.environ[ENV_URL], None)
        return
    with throwaway_pg() as server:
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        yield PgStores(server.url(), pid)


def _cluster(tmp: Path, name: str, a: argparse.Namespace, **kw: Any) -> Cluster:
    """The phase's processes; ``a.pg`` (a PgStores, absent or None: SQLite)
    and ``a.platforms`` (instances, default 1) choose the platform's store;
    ``a.sender_units`` and ``a.receiver_units`` (absent: 1) A's and B's units."""
    root = tmp / name
    root.mkdir()
    kw.setdefault("units", {"A": getattr(a, "sender_units", 1), "B": getattr(a, "receiver_units", 1)})
    pg: PgStores | None = getattr(a, "pg", None)
    if pg is None:
        c = Cluster(root, a.synchronous, a.phase_timeout, a.secure, **kw)
    else:
        c = Cluster(root, a.synchronous, a.phase_timeout, a.secure, store=pg.new_database(),
                    platforms=getattr(a, "platforms", 1), pg_pid=pg.pid, **kw)
    if getattr(a, "history", True) is False:
        # The delivery history off (semq.tracking.history; on by default): what it costs.
        for d in ("A", "B", *c.instances):
            cfg = root / d / "semq.toml"
            text = cfg.read_text()
            if "history_days = 90" not in text:
                raise BenchError(f"{cfg} has no history_days = 90 to turn off")
            cfg.write_text(text.replace("history_days = 90", "history_days = 0"))
    return c


def units_note(sender: int, receiver: int) -> str:
    """What the figures of a run with nodes of several units mean."""
    who = " and ".join(f"{name} as {n} units" for name, n in (("A", sender), ("B", receiver)) if n > 1)
    return (f"{who} (semq node init --units N; semq node run is a supervisor of N unit processes, each with its"
            " own store and platform connection; the platform gives each document to one unit of B by its LK0):"
            " inbox and outbox counts are summed over every unit's store, B's inbox is checked to hold each LK0"
            " once over all units; CPU and RSS of such a node = the sum over its supervisor (NAME/sup) and units"
            " (NAME/K, PIDs from each unit's status.json); store/drain: B was online once before the store phase"
            " (the platform learns its units from its HELLO), the drain starts at its first unit's node_online."
            + (" A's documents are accepted in calls of 1000, each into the next unit." if sender > 1 else ""))


def _finish(c: Cluster, a: argparse.Namespace) -> None:
    """Stop the phase's processes; remove its directory and database unless ``--keep``."""
    c.stop_all()
    if not a.keep:
        shutil.rmtree(c.root, ignore_errors=True)
        pg: PgStores | None = getattr(a, "pg", None)
        if pg is not None and c.store:
            pg.drop(c.store)


def phase_online(tmp: Path, n: int, a: argparse.Namespace, rate: float | None = None,
                 name: str = "", docs: Documents = documents,
                 inspect: Callable[[Cluster], dict[str, Any]] | None = None,
                 before_stop: Callable[[Cluster], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Full load (rate None: pre-loaded) or paced at ``rate`` docs/s (in
    ``tmp/name``). ``docs`` makes the documents (default ``documents``);
    ``inspect``, when given, reads the stopped phase's stores and event logs
    (it may raise BenchError) and its figures join the result;
    ``before_stop`` the same with the processes still running, once the
    phase's figures are taken."""
    c = _cluster(tmp, name or ("half" if rate else "online"), a)
    try:
        c.start_platform()
        c.start("B")
        _wait(lambda: c.online(B), a.phase_timeout, "B online")
        accept = None
        if rate is None:
            accept = preload(c.root, n, docs)
            c.start("A")
            # A's start-up not counted; what it sends from then on is (the
            # units of an A of several start at different moments).
            cpu0 = {**c.cpu(), **c.cpu_at_ready("A")}
        else:
            c.start("A")
            cpu0 = {**c.cpu(), **c.cpu_at_ready("A")}
            feed(c.root, n, rate, c, docs)
        _wait(lambda: c.count("B", "SELECT count(*) FROM inbox") == n
              and c.count("A", "SELECT count(*) FROM outbox") == 0, a.phase_timeout,
              f"{n} documents confirmed end to end at A")
        cpu = _cpu_per_doc(cpu0, c.cpu(), n)
        check_once(c, n)
        rss = c.rss_all()
        live = before_stop(c) if before_stop is not None else {}
        c.stop_all()
        extra = {**live, **(inspect(c) if inspect is not None else {})}
        ev = events(c.root / "A" / "events", ["sent", "ack2", "ack_fwd", "ack_save"])
        secs = (max(ev["ack2"].values()) - min(ev["sent"].values())) / 1000
        return {"docs": n, "seconds": secs, "rate": n / secs, **latencies(c.root), "rss": rss, "cpu": cpu,
                "accept": accept, "ack_fwd": len(ev["ack_fwd"]), "ack_save": len(ev["ack_save"]), **extra}
    finally:
        _finish(c, a)


def _cpu_per_doc(before: dict[str, float | None], after: dict[str, float | None],
                 n: int) -> dict[str, float | None]:
    """CPU microseconds per document of each daemon between two readings
    (the idle wait of the phase's poll loop included: a few us per doc):
    P, A and B always (None: not running), then any other (P2, PG)."""
    out: dict[str, float | None] = {}
    for k in dict.fromkeys(["P", "A", "B", *before, *after]):
        b, e = before.get(k), after.get(k)
        out[k] = None if b is None or e is None else (e - b) * 1e6 / n
    return out


def phase_store_drain(tmp: Path, n: int, a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Store (B offline), then drain (B starts). A B of several units has
    been online once before the store phase, as a node that went offline
    has: the platform learns a node's units from its HELLO and stores each
    document for the unit that holds it. The drain starts at the first
    ``node_online`` of B's units after B was started again."""
    c = _cluster(tmp, "store", a)
    try:
        c.start_platform()
        if c.units["B"] > 1:
            c.start("B")
            _wait(lambda: c.online(B), a.phase_timeout, "B's units online (before it goes offline)")
            c.stop("B")
            _wait(lambda: not set(c.routes(B)) & c.online_routes(), a.phase_timeout, "B's units offline")
        preload(c.root, n)
        c.start("A")
        cpu0 = {**c.cpu(), **c.cpu_at_ready("A")}  # as in phase_online
        _wait(lambda: c.count("A", "SELECT count(*) FROM outbox WHERE state=3") == n, a.phase_timeout,
              f"{n} documents ACK_SAVE'd at A")
        cpu1 = c.cpu()
        store_cpu = _cpu_per_doc(cpu0, cpu1, n)
        store_rss = c.rss_all()
        ev = events(c.root / "A" / "events", ["sent", "ack_save"])
        store_secs = (max(ev["ack_save"].values()) - min(ev["sent"].values())) / 1000
        b_started_ms = int(time.time() * 1000)  # the events' clock
        c.start("B")
        cpu1 = {**c.cpu(), **c.cpu_at_ready("B")}  # B's start-up not counted, its first documents are
        _wait(lambda: c.count("A", "SELECT count(*) FROM outbox") == 0
              and c.count("P", "SELECT count(*) FROM stored") == 0, a.phase_timeout,
              f"{n} stored documents delivered and confirmed")
        drain_cpu = _cpu_per_doc(cpu1, c.cpu(), n)
        check_once(c, n)
        drain_rss = c.rss_all()
        c.stop_all()
        pe = c.platform_events(["node_online", "acked"], since_ms=b_started_ms)
        ae = events(c.root / "A" / "events", ["ack2"])
        start = min(pe["node_online"][r] for r in c.routes(B))
        end = max(max(ae["ack2"].values()), max(pe["acked"].values()))
        drain_secs = (end - start) / 1000
        return ({"docs": n, "seconds": store_secs, "rate": n / store_secs, "rss": store_rss, "cpu": store_cpu},
                {"docs": n, "seconds": drain_secs, "rate": n / drain_secs, **latencies(c.root),
                 "rss": drain_rss, "cpu": drain_cpu})
    finally:
        _finish(c, a)


def measure(a: argparse.Namespace, base: Path) -> dict[str, list[dict[str, Any]]]:
    """Every phase ``a.repeat`` times with ``a.secure``; fresh stores each time."""
    runs: dict[str, list[dict[str, Any]]] = {"online": [], "half": [], "store": [], "drain": []}
    mode = "security on" if a.secure else "security off"
    for r in range(a.repeat):
        tmp = base / f"{'sec' if a.secure else 'plain'}{r + 1}"
        tmp.mkdir()
        _log(f"{mode}, run {r + 1}/{a.repeat}: online, {a.count} documents")
        on = phase_online(tmp, a.count, a)
        runs["online"].append(on)
        half_rate = on["rate"] / 2
        _log(f"{mode}, run {r + 1}/{a.repeat}: half load, {a.count // 2} documents at {half_rate:,.0f}/s")
        runs["half"].append(phase_online(tmp, a.count // 2, a, rate=half_rate))
        _log(f"{mode}, run {r + 1}/{a.repeat}: store then drain, {a.count} documents")
        st, dr = phase_store_drain(tmp, a.count, a)
        runs["store"].append(st)
        runs["drain"].append(dr)
    return runs


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def of_node(values: dict[str, float | None], who: str) -> float | None:
    """``who``'s figure in a per-process dict (``Cluster.cpu``, ``rss_all``):
    its own, or for a node of several units the sum over its supervisor
    ("B/sup") and units ("B/1".."B/N"); None when none was read."""
    if values.get(who) is not None:
        return values[who]
    parts = [v for k, v in values.items() if k.startswith(f"{who}/") and v is not None]
    return sum(parts) if parts else None


def per_process(rows: list[dict[str, Any]], key: str = "cpu") -> dict[str, float]:
    """Median over rows of each process's figure (``key``: "cpu" or "rss"),
    in the order the processes were first seen."""
    names = list(dict.fromkeys(k for r in rows for k, v in (r.get(key) or {}).items() if v is not None))
    return {k: statistics.median(vals) for k in names
            if (vals := [r[key][k] for r in rows if r[key].get(k) is not None])}


def _med_rss(rows: list[dict[str, Any]], who: str) -> str:
    vals = [v for r in rows if (v := of_node(r["rss"], who)) is not None]
    return f"{statistics.median(vals):.0f}" if vals else "-"


def _med_cpu(rows: list[dict[str, Any]], who: str) -> str:
    vals = [v for r in rows if (v := of_node(r.get("cpu", {}), who)) is not None]
    return f"{statistics.median(vals):.0f}" if vals else "-"


def _f(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def code_version() -> str:
    """Which semq was measured: its directory and, in a git checkout, the
    commit (``+dirty`` when semq/ has uncommitted changes)."""
    import semq

    root = Path(semq.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode:
            return f"semq from {root}"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "semq"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"semq from {root} at git {rev.stdout.strip()}{' +dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return f"semq from {root}"


# ---------------------------------------------------------------- direct links (--direct)

# The two paths of --direct, both with security on (direct links are mutual
# TLS between the nodes' certificates, so they need it):
# - relay: B does not listen; A's documents go through the platform (A,
#   policy "prefer" as by default, asks the platform where B listens and is
#   told it does not);
# - direct: B runs with --listen 127.0.0.1:0 and announces it; A dials B
#   after its first documents went through the platform, then sends B's
#   documents over the link (semq/node/daemon/direct.py).
PATHS: Final = ("relay", "direct")
LISTEN_ANY: Final = "127.0.0.1:0"
WARMUP: Final = 10  # documents sent and confirmed before a --direct phase's N (not measured)
WARMUP_FIRST: Final = 9_000_000  # their keys (S9000000...), apart from the measured ones


def node_status(root: Path, who: str) -> dict[str, Any]:
    """A node's status.json (written every second while it runs); {} when unreadable."""
    try:
        st = json.loads((root / who / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return st if isinstance(st, dict) else {}


def direct_link_up(root: Path, peer: str) -> bool:
    """A's status.json shows its direct link to ``peer`` up."""
    links = node_status(root, "A").get("direct", {}).get("links", [])
    return any(link.get("peer") == peer and link.get("direction") == "out" and link.get("state") == "up"
               for link in links)


def path_counts(directory: Path, event: str, exclude: Collection[str]) -> dict[str, int]:
    """How many ``event`` events ("sent" at A, "received" at B) name each
    path ("relay", "direct"), but those of the LK0s in ``exclude``; a
    document sent again counts again."""
    needle = f'"event":"{event}"'
    out: dict[str, int] = {}
    for f in sorted(directory.glob("events-*.jsonl")):
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                if needle not in line:
                    continue
                e = json.loads(line)
                if e.get("event") == event and e.get("lk0") not in exclude:
                    p = str(e.get("path", "?"))
                    out[p] = out.get(p, 0) + 1
    return out


def warm_up(c: Cluster, path: str, timeout: float) -> set[str]:
    """Send WARMUP documents with A running and wait until they are
    confirmed end to end, and on the direct path until A's link to B is up
    (it is dialled once documents to B went through the platform). Returns
    their LK0s, left out of every figure."""
    from semq.node.api import NodeClient

    with NodeClient(c.root / "A") as node:
        node.send_many(documents(WARMUP_FIRST, WARMUP))
    _wait(lambda: c.count("A", "SELECT count(*) FROM outbox") == 0
          and c.count("B", "SELECT count(*) FROM inbox") == WARMUP, timeout, f"{WARMUP} warm-up documents confirmed")
    if path == "direct":
        _wait(lambda: direct_link_up(c.root, B), timeout, "A's direct link to B up (A's status.json)")
    return set(events(c.root / "A" / "events", ["sent"])["sent"])


def load_at_once(root: Path, n: int) -> float:
    """Accept n documents into A's store in one transaction while A runs
    (A sees none of them before the commit, then all); returns docs/s."""
    from semq.node.api import NodeClient

    with NodeClient(root / "A") as node:
        t0 = time.perf_counter()
        node.send_many(documents(0, n))
        return n / (time.perf_counter() - t0)


def phase_path(tmp: Path, n: int, a: argparse.Namespace, path: str, rate: float | None = None) -> dict[str, Any]:
    """One online phase of ``--direct`` on ``path`` ("relay" or "direct"),
    security on: P, B (listening on the direct path), A with an empty
    store, the warm-up, then N documents accepted in one transaction (rate
    None: full load) or fed at ``rate``/s. docs/s = N / (A's first ``sent``
    of them -> A's last ``ack2``). Raises BenchError unless every one of the
    N went on ``path``: by A's ``sent`` events, B's ``received`` events and,
    for the direct path, A's ``sent_direct`` in status.json."""
    c = _cluster(tmp, f"{path}-{'half' if rate else 'online'}", a)
    try:
        c.start_platform()
        c.start("B", ["--listen", LISTEN_ANY] if path == "direct" else [])
        _wait(lambda: c.online(B), a.phase_timeout, "B online")
        c.start("A")
        warm = warm_up(c, path, a.phase_timeout)
        before = node_status(c.root, "A")
        cpu0 = c.cpu()
        accept = load_at_once(c.root, n) if rate is None else None
        if rate is not None:
            feed(c.root, n, rate, c)
        _wait(lambda: c.count("B", "SELECT count(*) FROM inbox") == n + WARMUP
              and c.count("A", "SELECT count(*) FROM outbox") == 0, a.phase_timeout,
              f"{n} documents confirmed end to end at A")
        cpu = _cpu_per_doc(cpu0, c.cpu(), n)
        done_ms = time.time() * 1000
        check_once(c, n + WARMUP)
        # status.json is rewritten every second: one written after the end.
        after = _wait(lambda: (st := node_status(c.root, "A")) and st.get("time_ms", 0) > done_ms and st,
                      5.0, "A's status.json after the phase", 0.05)
        link_up = direct_link_up(c.root, B)
        c.stop_all()
        sent = path_counts(c.root / "A" / "events", "sent", warm)
        received = path_counts(c.root / "B" / "events", "received", warm)
        status_direct = int(after.get("sent_direct", 0)) - int(before.get("sent_direct", 0))
        status_again = int(after.get("direct", {}).get("sent_again", 0))
        other = "relay" if path == "direct" else "direct"
        if (sent.get(path, 0) < n or sent.get(other, 0) or received.get(path, 0) < n or received.get(other, 0)
                or (path == "direct" and (status_direct < n or not link_up)) or (path == "relay" and status_direct)):
            raise BenchError(
                f"the {path} phase did not go {path}: A's sent events {sent}, B's received events {received},"
                f" A's status.json sent_direct +{status_direct}, sent_again {status_again}, link up at the end:"
                f" {link_up} (expected all {n} on {path}){f'; kept in {c.root}' if a.keep else ''}")
        ev = events(c.root / "A" / "events", ["sent", "ack2"])
        first = min(t for k, t in ev["sent"].items() if k not in warm)
        last = max(t for k, t in ev["ack2"].items() if k not in warm)
        secs = (last - first) / 1000
        return {"path": path, "docs": n, "seconds": secs, "rate": n / secs, **latencies(c.root, warm),
                "cpu": cpu, "accept": accept, "offered": rate, "sent_direct": sent.get("direct", 0),
                "sent_relay": sent.get("relay", 0), "status_sent_direct": status_direct,
                "received_direct": received.get("direct", 0), "sent_again": status_again}
    finally:
        _finish(c, a)


def measure_direct(a: argparse.Namespace, base: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Both paths ``a.repeat`` times, alternated (relay first in odd runs,
    direct first in even ones): full load, then half load paced at half of
    the *relay's* full-load rate of the same run on both paths (the same
    offered load, so their latencies compare)."""
    a.secure = True
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {"online": [], "half": []} for p in PATHS}
    for r in range(a.repeat):
        tmp = base / f"direct{r + 1}"
        tmp.mkdir()
        order = PATHS if r % 2 == 0 else PATHS[::-1]
        for path in order:
            _log(f"run {r + 1}/{a.repeat}: {path}, online, {a.count} documents")
            runs[path]["online"].append(phase_path(tmp, a.count, a, path))
        rate = runs["relay"]["online"][-1]["rate"] / 2
        for path in order:
            _log(f"run {r + 1}/{a.repeat}: {path}, half load, {a.count // 2} documents at {rate:,.0f}/s")
            runs[path]["half"].append(phase_path(tmp, a.count // 2, a, path, rate=rate))
    return runs


def _cpu_total(row: dict[str, Any]) -> float:
    """CPU us/doc of P, A and B together."""
    return sum(v for k, v in row["cpu"].items() if k in ("P", "A", "B") and v is not None)


def report_direct(a: argparse.Namespace, runs: dict[str, dict[str, list[dict[str, Any]]]], seconds: float) -> None:
    rows = []
    for k, label in (("online", "online (full load)"), ("half", "online (half load)")):
        for path in PATHS:
            rs = runs[path][k]
            for r in rs:
                r["cpu"]["total"] = _cpu_total(r)
            rows.append([f"{path}: {label}", f"{rs[0]['docs']:,}", _f(_med(rs, "seconds"), ".2f"),
                         _f(_med(rs, "rate")), _f(_med(rs, "p50"), ".0f"), _f(_med(rs, "p99"), ".0f"),
                         _f(_med(rs, "q_p50"), ".0f") if k == "half" else "-",
                         _f(_med(rs, "q_p99"), ".0f") if k == "half" else "-",
                         *(_med_cpu(rs, who) for who in ("P", "A", "B", "total")),
                         f"{min(r['sent_direct'] for r in rs):,}", f"{max(r['sent_relay'] for r in rs):,}"])
    on = {p: runs[p]["online"] for p in PATHS}
    rate = {p: _med(on[p], "rate") or 0.0 for p in PATHS}
    cpu = {p: statistics.median(r["cpu"]["total"] for r in on[p]) for p in PATHS}
    rate_x, cpu_x = rate["direct"] / rate["relay"], cpu["direct"] / cpu["relay"]
    per_run = "; ".join(f"{p} " + ", ".join(f"{r['rate']:,.0f}" for r in on[p]) for p in PATHS)
    cpu_run = "; ".join(f"{p} " + ", ".join(f"{r['cpu']['total']:.0f}" for r in on[p]) for p in PATHS)
    # Paired: the two paths of one run ran minutes apart at most, under the
    # same neighbours; the ratio of each pair moves less than either rate.
    pairs = [(d["rate"] / r["rate"], d["cpu"]["total"] / r["cpu"]["total"])
             for r, d in zip(on["relay"], on["direct"], strict=True)]
    paired = (f"paired per run (direct / relay of the same run): rate {', '.join(f'{x:.2f}' for x, _ in pairs)}"
              f" (median {statistics.median(x for x, _ in pairs):.2f}x); CPU per document"
              f" {', '.join(f'{y:.2f}' for _, y in pairs)} (median {statistics.median(y for _, y in pairs):.2f}x).")
    per_proc = ", ".join(
        f"{who} {statistics.median(r['cpu'][who] for r in on['direct']) / statistics.median(r['cpu'][who] for r in on['relay']):.2f}x"
        for who in ("A", "B"))
    notes = [
        f"1 KiB documents, SaveFwd=3, Ack2 on, security on (mutual TLS 1.3, documents sealed and signed); SQLite"
        f" synchronous={a.synchronous}, WAL; median of {a.repeat} run(s), the paths alternated; {seconds:.0f} s in"
        f" all; {code_version()}.",
        "relay = A -> platform -> B (B does not listen); direct = A -> B over a mutual-TLS direct link (B runs"
        f" with --listen {LISTEN_ANY}; A's policy 'prefer', the default). Fresh processes and stores per phase.",
        f"Each phase: P, B, then A with an empty store; {WARMUP} warm-up documents confirmed end to end (they bring"
        " the direct link up: A dials B once its first documents to B went through the platform), then the N"
        " documents accepted in one transaction while A runs (full load) or fed at a pace (half load: half of the"
        " relay's full-load rate of the same run, on both paths). Warm-up documents are in no figure.",
        "docs/s = N / (A's first 'sent' -> A's last 'ack2' of the N). p50/p99 ms = A's 'sent' -> B's 'inbox'"
        " event; queued = from A's 'queued' event (paced feeding only).",
        "CPU us/doc = user+system CPU of each daemon during the phase / N (idle polling included); total = P + A"
        " + B. On the direct path the platform only keeps A's and B's sessions.",
        "sent direct / via platform = A's 'sent' events of the N by path (fewest direct, most relayed over the"
        " runs); every direct phase was also checked against B's 'received' events (path direct) and A's"
        " status.json sent_direct (+" + ", ".join(f"{r['status_sent_direct']:,}" for r in on["direct"])
        + " in the full-load runs), else the run fails.",
        "Store and drain (B offline) are not measured with --direct: with B offline there is no link to dial,"
        " the documents go through the platform as on the relay path (scripts/bench e2e --security on).",
        f"online docs/s per run: {per_run}. CPU total us/doc per run: {cpu_run}.",
        f"direct / relay, online full load: rate {rate_x:.2f}x (aim >= 1.5x: {'met' if rate_x >= 1.5 else 'NOT met'}),"
        f" CPU per document {cpu_x:.2f}x (aim <= 0.7x: {'met' if cpu_x <= 0.7 else 'NOT met'}); per process"
        f" {per_proc}.",
        paired,
    ]
    print_table(
        "SEMQ end to end, relayed and direct: A -> platform -> B and A -> B, real processes on 127.0.0.1",
        ["path: phase", "docs", "seconds", "docs/s", "p50 ms", "p99 ms", "queued p50", "queued p99",
         "CPU P us/doc", "CPU A us/doc", "CPU B us/doc", "CPU total us/doc", "sent direct", "via platform"],
        rows, notes)


_T = TypeVar("_T")


def _in_scratch(a: argparse.Namespace, prefix: str, work: Callable[[Path], _T]) -> _T | None:
    """``work`` in a fresh scratch directory (removed after, unless --keep);
    None, with one error line printed, when it failed."""
    from semq.store.db import StoreError

    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return work(base)
    except (BenchError, StoreError) as e:
        # StoreError: e.g. the store's schema changed under a running
        # benchmark (a working tree being edited).
        print(f"error: {e}", file=sys.stderr)
        return None
    except (OSError, sqlite3.Error, subprocess.SubprocessError, RuntimeError) as e:
        # RuntimeError: the throwaway PostgreSQL server did not start.
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    finally:
        if a.keep:
            _log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _main_direct(a: argparse.Namespace, t0: float) -> int:
    a.pg = None
    runs = _in_scratch(a, "semq-bench-e2e-direct-", lambda base: measure_direct(a, base))
    if runs is None:
        return 1
    if a.json:
        print(json.dumps(runs, indent=1))
    else:
        report_direct(a, runs, time.monotonic() - t0)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every phase completed, 1 when one failed (timeout, lost or
    duplicated document), 2 on a usage error."""
    p = argparse.ArgumentParser(prog="scripts/bench e2e",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, help="documents per phase (default %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="runs; medians are shown (default 1)")
    p.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"],
                   help="SQLite synchronous mode of all three stores (default FULL)")
    p.add_argument("--phase-timeout", type=float, default=DEFAULT_PHASE_TIMEOUT,
                   help="limit of each wait, s (default %(default)s)")
    p.add_argument("--security", default=None, choices=["off", "on", "both"],
                   help="TLS + end-to-end sealing and signatures (default off, on with --direct; needs security in"
                        " the daemons)")
    p.add_argument("--direct", action="store_true",
                   help="the relayed path and the direct node-to-node link side by side (security on; online"
                        " and half load only)")
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgresql"],
                   help="the platform's store (default sqlite; postgresql: a throwaway server, or SEMQ_TEST_PG)")
    p.add_argument("--platforms", type=int, default=1,
                   help="instances of the platform on the PostgreSQL store; A on the first, B on the last"
                        " (default 1)")
    p.add_argument("--receiver-units", type=int, default=1, metavar="N",
                   help="run B as N units (semq node init --units N; default 1)")
    p.add_argument("--sender-units", type=int, default=1, metavar="N",
                   help="run A as N units (the documents are accepted in calls of 1000, spread over them;"
                        " default 1)")
    p.add_argument("--keep", action="store_true", help="keep the stores and logs")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.count < 2 or not 1 <= a.repeat <= 5:
        print("error: --count must be >= 2 and --repeat 1..5", file=sys.stderr)
        return 2
    if not (1 <= a.receiver_units <= MAX_UNITS and 1 <= a.sender_units <= MAX_UNITS):
        print(f"error: --receiver-units and --sender-units must be 1..{MAX_UNITS}", file=sys.stderr)
        return 2
    if a.direct and (a.receiver_units > 1 or a.sender_units > 1):
        print("error: --direct needs nodes of one unit (a node of several units takes no direct links)",
              file=sys.stderr)
        return 2
    if (a.platforms != 1 and a.store != "postgresql") or not 1 <= a.platforms <= 4:
        print("error: --platforms 2..4 needs --store postgresql (1..4 in all)", file=sys.stderr)
        return 2
    if a.direct and (a.security not in (None, "on") or a.store != "sqlite"):
        print("error: --direct measures with security on (direct links are mutual TLS) on the SQLite platform",
              file=sys.stderr)
        return 2
    a.security = a.security or ("on" if a.direct else "off")
    t0 = time.monotonic()
    if a.direct:
        return _main_direct(a, t0)
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.security]

    def every_mode(base: Path) -> dict[bool, dict[str, list[dict[str, Any]]]]:
        out: dict[bool, dict[str, list[dict[str, Any]]]] = {}
        with contextlib.ExitStack() as stack:
            a.pg = stack.enter_context(open_pg_stores()) if a.store == "postgresql" else None
            for secure in modes:
                a.secure = secure
                out[secure] = measure(a, base)
        return out

    got = _in_scratch(a, "semq-bench-e2e-", every_mode)
    if got is None:
        return 1
    results = got
    if a.json:
        print(json.dumps({("security on" if k else "security off"): v for k, v in results.items()}, indent=1))
        return 0
    rows = []
    labels = {"online": "online (full load)", "half": "online (half load)", "store": "store (B offline)",
              "drain": "drain (B connects)"}
    for secure, runs in results.items():
        for k, label in labels.items():
            rs = runs[k]
            # Latency only where it means something: in store/drain it is the
            # time B was offline; queued->inbox of pre-loaded documents is the
            # time they waited in A's table before A started.
            lat = k in ("online", "half")
            rows.append([label + (", security on" if secure else ""), f"{rs[0]['docs']:,}",
                         _f(_med(rs, "seconds"), ".2f"), _f(_med(rs, "rate")),
                         _f(_med(rs, "p50"), ".0f") if lat else "-",
                         _f(_med(rs, "p99"), ".0f") if lat else "-",
                         _f(_med(rs, "q_p50"), ".0f") if k == "half" else "-",
                         _f(_med(rs, "q_p99"), ".0f") if k == "half" else "-",
                         _med_rss(rs, "P"), _med_rss(rs, "A"), _med_rss(rs, "B"),
                         _med_cpu(rs, "P"), _med_cpu(rs, "A"), _med_cpu(rs, "B")])
    plain = results.get(False) or results[True]
    notes = [
        f"1 KiB documents, SaveFwd=3, Ack2 on; SQLite synchronous={a.synchronous}, WAL; "
        f"median of {a.repeat} run(s); {time.monotonic() - t0:.0f} s in all; {code_version()}.",
        "security off = plain TCP, no sealing or signatures; on = mutual TLS 1.3, documents sealed and "
        "signed per batch, signed batch receipts (docs/security.md).",
        "p50/p99 ms = A's 'sent' -> B's 'inbox' event (one machine clock); queued p50/p99 = A's 'queued' "
        "-> B's 'inbox' (adds the wait in A's pending-send table; paced feeding only).",
        "RSS = peak (VmHWM) per process; store/drain: P and A are the same processes in both phases.",
        "CPU us/doc = user+system CPU time of each daemon during the phase / documents (from /proc; includes"
        " the event loop, sockets and TLS, so it is what the machine pays; less sensitive to neighbours than"
        " docs/s). Drain: from B's start, its start-up not counted (read once it runs).",
        f"accept (NodeClient.send_many, 1000 per transaction, no daemon): {_f(_med(plain['online'], 'accept'))}"
        " docs/s.",
    ]
    if a.receiver_units > 1 or a.sender_units > 1:
        notes.append(units_note(a.sender_units, a.receiver_units))
        for secure, runs in results.items():
            for k in ("online", "half", "store", "drain"):
                notes.append(f"CPU us/doc per process, {k}{', security on' if secure else ''}: "
                             + ", ".join(f"{who} {v:.0f}" for who, v in per_process(runs[k]).items()) + ".")
    if a.store == "postgresql":
        notes.append(f"platform store: PostgreSQL, {a.platforms} instance(s); A on the first, B on the last.")
        for secure, runs in results.items():
            for k in ("online", "half", "store", "drain"):
                extra = [f"{who} {_med_cpu(runs[k], who)}" for who in ("P2", "P3", "P4", "PG")
                         if _med_cpu(runs[k], who) != "-"]
                if extra:
                    notes.append(f"CPU us/doc, {k}{', security on' if secure else ''}: " + ", ".join(extra)
                                 + " (PG = the PostgreSQL server: postmaster and backends).")
    for secure, runs in results.items():
        ack_save = _med(runs["online"], "ack_save") or 0
        if ack_save:
            notes.append(f"online{', security on' if secure else ''}: {ack_save:,.0f} of {a.count:,} were stored "
                         "by the platform although B was online (its queue over the high-water mark).")
    if False in results:
        for k in ("online", "store", "drain"):
            v = _med(results[False][k], "rate") or 0
            t = TARGETS[k]
            notes.append(f"target {k} >= {t:,}/s (security off): {v:,.0f}/s = {v / t:.0%} of it, "
                         f"{'met' if v >= t else 'NOT met'}.")
        hp99 = _med(results[False]["half"], "p99")
        if hp99 is not None:
            notes.append(f"target p99 <= {P99_TARGET_HALF_MS:.0f} ms at half load: {hp99:.0f} ms, "
                         f"{'met' if hp99 <= P99_TARGET_HALF_MS else 'NOT met'} (at half of *our* rate).")
    if len(results) == 2:
        on, off = (_med(results[x]["online"], "rate") or 0 for x in (True, False))
        notes.append(f"target security on >= 60% of plain (online): {on / off:.0%}, "
                     f"{'met' if on >= 0.6 * off else 'NOT met'}.")
    print_table(
        "SEMQ end to end: A -> platform -> B, real processes on 127.0.0.1",
        ["phase", "docs", "seconds", "docs/s", "p50 ms", "p99 ms", "queued p50", "queued p99", "RSS P MiB",
         "RSS A MiB", "RSS B MiB", "CPU P us/doc", "CPU A us/doc", "CPU B us/doc"],
        rows, notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
