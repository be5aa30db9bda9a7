#!/usr/bin/env python3
"""The performance targets in one run: SEMQ end to end, mosquitto, NATS JetStream and this machine's limits, one table.

Everything is measured in the same run, on this machine, with 1 KiB
documents and only 127.0.0.1:

- **SEMQ** A -> platform -> B, real ``semq ... run`` processes, SaveFwd=3,
  Ack2 on, security off and on: online (full load: first send -> last ACK2),
  half load (send -> inbox p50/p99), store (B offline) and drain (B
  connects). These are ``scripts/bench e2e``'s own phases (``e2e.phase_online``,
  ``e2e.phase_store_drain``, run as ``e2e.measure`` runs them).
- **SEMQ, B as units** (``--receiver-units N``, default 2; 1 leaves them
  out): online (full load), store and drain again, security off, with the
  receiver B run as N units (``semq node init --units N``: a supervisor and
  N unit processes, each with its own store and platform connection; the
  platform gives each document to one unit by its LK0) and A as one, as
  ``scripts/bench e2e --receiver-units N`` runs them: B's inbox counted over
  every unit's store, B's CPU and RSS summed over its processes (each unit's
  PID from its status.json) and listed per process in the notes. With
  ``--sender-units M`` (> 1) one more online phase runs A as M units too.
- **peers** (``peers.measure_peers``): mosquitto (MQTT QoS 1, persistent
  session, paho-mqtt) and NATS JetStream (file storage, durable pull
  consumer, explicit acks, nats-py), the same phases. Missing brokers and
  clients are installed the way ``scripts/bench peers`` does it
  (``apt-get install mosquitto nats-server``, ``pip install paho-mqtt
  nats-py`` into this interpreter's environment).
- **limits**: this machine's SQLite group-commit insert rate (WAL,
  ``synchronous`` and page size as the SEMQ stores, 512 rows per transaction
  like a node's claim batch, 1 KiB rows, one process) and its loopback frame rate (a real
  1,227-byte UMX-T DATA frame, 512 frames joined per ``sendall`` like the
  daemons' send of a claimed batch, from one process to another over a
  127.0.0.1 TCP socket; the receiver only counts bytes).

Each repeat runs SEMQ (security off, B as units, security on), each peer
and the limits one after the other, so a noisy neighbour hits all of them
alike; figures are medians over the repeats. Peak RSS is VmHWM of every process: the SEMQ
daemons and the limit workers read it themselves just before they stop; the
brokers and the peers' publisher/subscriber processes are sampled from
/proc every 0.25 s.

Bounded in time: every wait has a limit (``--phase-timeout``), a step that
would start after ``--budget`` seconds is skipped (and said so), and at
``--budget`` + 180 s the run is stopped; every process it started is stopped
on the way out, also on errors, Ctrl-C and SIGTERM. Then the table is printed
with what was measured, and notes saying which issue-7 targets are met in
this run, and which aims of B as units (rates against NATS JetStream and
SEMQ's one unit, CPU per document against NATS JetStream's) are.

``--store postgresql`` runs something else: the SEMQ phases (security off)
on the SQLite platform, on one platform instance on PostgreSQL and on two
(the sender's node on one, the receiver's on the other), and the failover
gap, without the peers and limits (``scripts/bench pgplatform``; one repeat
unless ``--repeat``). Without ``--store`` (or with ``--store sqlite``) the
suite is as described above.

Usage: scripts/bench suite [--repeat 3] [--count N] [--quick] [--synchronous MODE]
                           [--receiver-units N] [--sender-units M]
                           [--phase-timeout S] [--budget S] [--json]
                           [--store sqlite|postgresql [--no-half] [--failover-count N] [--failover-rate R]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

if __package__:
    from . import e2e, peers, pgplatform
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/suite.py
    import e2e  # type: ignore[no-redef]
    import peers  # type: ignore[no-redef]
    import pgplatform  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]

DEFAULT_COUNT: Final = 20_000
QUICK_COUNT: Final = 5_000
DEFAULT_BUDGET: Final = 1800.0  # s; the full mode takes ~8 min on a quiet machine
QUICK_BUDGET: Final = 300.0
HARD_GRACE: Final = 180.0  # s after the budget: stop whatever runs
BATCH: Final = 512  # a node's claim batch = rows per transaction = frames per send
READ_SIZE: Final = 256 * 1024  # semq.session.transport.READ_SIZE
SQLITE_ROWS_PER_DOC: Final = 5  # limit rows = 5 x count (long enough to time)
LOOPBACK_FRAMES_PER_DOC: Final = 100  # loopback frames = 100 x count
WORKER_TIMEOUT: Final = 120.0
PHASES: Final = ("online", "half", "store", "drain")
PEER_NAMES: Final = {"nats": "NATS JetStream", "mosquitto": "mosquitto"}

# Performance targets (2 cores; security off unless stated).
TARGET_RATE: Final = {"online": 15_000, "store": 20_000, "drain": 45_000}
TARGET_X: Final = {"nats": 1.1, "mosquitto": 2.0}
TARGET_P99_HALF_MS: Final = 20.0
# The half load: half of its 15,000/s online target (the suite also
# measures at half of SEMQ's own full-load rate, which is higher).
TARGET_HALF_RATE: Final = 7_500
TARGET_SECURE_SHARE: Final = 0.60
# Aims of the receiver as units (security off): notes, never a test.
DEFAULT_RECEIVER_UNITS: Final = 2
UNIT_PHASES: Final = ("online", "store", "drain")
AIM_UNITS_X_NATS: Final = {"online": 1.3, "drain": 1.3}  # B as units / NATS JetStream, docs/s
AIM_UNITS_X_ONE: Final = {"drain": 1.2}  # B as units / B as one unit, docs/s
AIM_CPU_X_NATS: Final = 1.0  # SEMQ's CPU per document / NATS JetStream's, at most (every phase)

SEMQ_ACK: Final = (
    "SEMQ: ACK_SAVE = committed to the platform's SQLite store, ACK2 = committed to B's inbox, each "
    "before the frame that reports it leaves; "
)
SEMQ_SYNC: Final = {
    "FULL": "with synchronous=FULL every commit is fsynced (WAL), so neither kill -9 nor a power loss "
            "loses an acknowledged document (as far as the disk honours fsync).",
    "NORMAL": "with synchronous=NORMAL the WAL is fsynced at checkpoints only: kill -9 loses nothing, "
              "a power loss can lose the last acknowledged commits.",
    "OFF": "with synchronous=OFF nothing is fsynced: kill -9 loses nothing, a power loss can lose "
           "acknowledged documents or corrupt the store.",
}


class Overrun(BaseException):
    """The hard time limit passed (BaseException: nothing on the way may swallow it)."""


def _log(msg: str) -> None:
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


def _now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # one clock for every process


def _self_rss_mib() -> float | None:
    return e2e.peak_rss_mib(os.getpid())


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if v is not None]
    return statistics.median(nums) if nums else None


# ---------------------------------------------------------------- child processes


def descendants() -> list[int]:
    """PIDs of every live process descended from this one (from /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    stack = [os.getpid()]
    while stack:
        for pid in children.get(stack.pop(), []):
            out.append(pid)
            stack.append(pid)
    return out


def stop_leftovers() -> list[int]:
    """The safety net: whatever this run started and is still alive (an
    interrupted clean-up) gets SIGTERM, then SIGKILL after 5 s; by PID."""
    left = [pid for pid in descendants() if _alive(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in left):
            time.sleep(0.1)
        for pid in left:  # reap our own children
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if not any(_alive(pid) for pid in left):
            break
    return left


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ---------------------------------------------------------------- RSS of children


class RssSampler:
    """Peak RSS (VmHWM) of every descendant process of this one, sampled from
    /proc every ``interval`` s in a thread while the ``with`` block runs."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak: dict[int, float] = {}
        self.cmd: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        for pid in descendants():
            rss = e2e.peak_rss_mib(pid)
            if rss is None:
                continue
            if pid not in self.cmd:
                try:
                    self.cmd[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                except OSError:
                    continue
            self.peak[pid] = max(rss, self.peak.get(pid, 0.0))

    def by_role(self) -> dict[str, float | None]:
        """Peers' processes: broker, publisher ('-pub' worker), subscriber ('-sub' worker)."""
        out: dict[str, float | None] = {"broker": None, "pub": None, "sub": None}
        for pid, rss in self.peak.items():
            cmd = self.cmd.get(pid, [])
            if "--worker" in cmd:
                i = cmd.index("--worker")
                role = cmd[i + 1] if i + 1 < len(cmd) else ""
                key = "pub" if role.endswith("-pub") else "sub" if role.endswith("-sub") else ""
            else:
                key = "broker" if any(b in " ".join(cmd[:1]) for b in ("mosquitto", "nats-server")) else ""
            if key:
                out[key] = max(rss, out[key] or 0.0)
        return out


# ---------------------------------------------------------------- limit workers (child processes)


def _worker_sqlite(path: str, rows: int, batch: int, synchronous: str) -> dict[str, Any]:
    """Insert ``rows`` 1 KiB rows, ``batch`` per transaction, WAL, ``synchronous``,
    the page size of SEMQ's stores."""
    from semq.store.db import PAGE_SIZE

    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute(f"PRAGMA page_size={PAGE_SIZE}")  # as semq.store.db (before WAL)
        con.execute("PRAGMA journal_mode=wal")
        con.execute(f"PRAGMA synchronous={synchronous}")
        con.execute("PRAGMA cache_size=-16000")  # as semq.store.db
        con.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, key TEXT NOT NULL, data BLOB NOT NULL)")
        secs = 0.0
        for i in range(0, rows, batch):
            data = []  # built outside the timed part: the limit is SQLite's
            for j in range(i, min(rows, i + batch)):
                head = f"<order id='S{j:07d}'>".encode()
                data.append((f"S{j:07d}", head + b"x" * (e2e.PAYLOAD - len(head))))
            t0 = time.perf_counter()
            con.execute("BEGIN")
            con.executemany("INSERT INTO docs (key, data) VALUES (?, ?)", data)
            con.execute("COMMIT")
            secs += time.perf_counter() - t0
        level = con.execute("PRAGMA synchronous").fetchone()[0]
        mode = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
        journal = con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()
    return {"rows": rows, "seconds": secs, "rate": rows / secs, "synchronous": mode, "journal": journal,
            "rss": _self_rss_mib()}


def _worker_recv(total: int, timeout: float) -> dict[str, Any]:
    """Listen on 127.0.0.1, print the port, receive ``total`` bytes from one connection."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(timeout)
        print(srv.getsockname()[1], flush=True)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout)
            view = memoryview(bytearray(READ_SIZE))
            got = first = 0
            while got < total:
                n = conn.recv_into(view)
                if not n:
                    break
                if not first:
                    first = _now_ns()
                got += n
            last = _now_ns()
    return {"bytes": got, "first_ns": first, "last_ns": last, "rss": _self_rss_mib()}


def _worker_send(port: int, frame_file: str, frames: int, batch: int, timeout: float) -> dict[str, Any]:
    """Send ``frames`` copies of the frame, ``batch`` joined per sendall."""
    frame = Path(frame_file).read_bytes()
    group = [frame] * batch
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.settimeout(timeout)
        start = _now_ns()
        sent = 0
        while sent < frames:
            n = min(batch, frames - sent)
            s.sendall(b"".join(group[:n]))  # a fresh join per batch, as the daemons do
            sent += n
        s.shutdown(socket.SHUT_WR)
    return {"frames": sent, "start_ns": start, "rss": _self_rss_mib()}


def _worker_main(argv: list[str]) -> int:
    kind, *rest = argv
    try:
        if kind == "sqlite":
            out = _worker_sqlite(rest[0], int(rest[1]), int(rest[2]), rest[3])
        elif kind == "recv":
            out = _worker_recv(int(rest[0]), float(rest[1]))
        elif kind == "send":
            out = _worker_send(int(rest[0]), rest[1], int(rest[2]), int(rest[3]), float(rest[4]))
        else:
            out = {"error": f"unknown worker {kind!r}"}
    except Exception as exc:  # reported to the parent as one JSON line
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------- limits (parent side)


def _worker_cmd(*args: object) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--worker", *(str(a) for a in args)]


@contextlib.contextmanager
def _started(cmd: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A worker process, killed (by its PID) on the way out if still running."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=10)


def _result(p: subprocess.Popen[str], name: str, timeout: float) -> dict[str, Any]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} worker did not finish within {timeout:.0f} s") from None
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"{name} worker exited {p.returncode}: {err.strip()[-600:]}")
    data: dict[str, Any] = json.loads(lines[-1])
    if "error" in data:
        raise RuntimeError(f"{name} worker: {data['error']}")
    return data


def measure_sqlite(tmp: Path, rows: int, synchronous: str, timeout: float) -> dict[str, Any]:
    path = tmp / "limit.sqlite"
    try:
        with _started(_worker_cmd("sqlite", path, rows, BATCH, synchronous)) as p:
            return _result(p, "SQLite", timeout)
    finally:
        for sfx in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(f"{path}{sfx}").unlink()


def data_frame() -> bytes:
    """The protocol benchmark's 1 KiB DATA frame, every field set (1,227 bytes)."""
    if __package__:
        from .protocol import sample_frames
    else:
        from protocol import sample_frames  # type: ignore[no-redef]
    from semq.umxt_protocol import encode_frame

    return encode_frame(sample_frames(1)["DATA 1 KiB"])


def measure_loopback(tmp: Path, frames: int, timeout: float) -> dict[str, Any]:
    frame = data_frame()
    frame_file = tmp / "frame.bin"
    frame_file.write_bytes(frame)
    with _started(_worker_cmd("recv", frames * len(frame), timeout)) as recv:
        assert recv.stdout is not None
        ready, _, _ = select.select([recv.stdout], [], [], timeout)
        line = recv.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            raise RuntimeError(f"loopback receiver did not report its port: {line!r}")
        with _started(_worker_cmd("send", line, frame_file, frames, BATCH, timeout)) as send:
            s = _result(send, "loopback sender", timeout)
        r = _result(recv, "loopback receiver", timeout)
    if r["bytes"] != frames * len(frame):
        raise RuntimeError(f"loopback: received {r['bytes']} of {frames * len(frame)} bytes")
    secs = (r["last_ns"] - s["start_ns"]) / 1e9
    return {"frames": frames, "frame_bytes": len(frame), "seconds": secs, "rate": frames / secs,
            "rss_send": s["rss"], "rss_recv": r["rss"]}


# ---------------------------------------------------------------- the run


class Results:
    def __init__(self) -> None:
        self.semq: dict[bool, dict[str, list[dict[str, Any]]]] = {
            s: {k: [] for k in PHASES} for s in (False, True)}
        self.peers: dict[str, list[dict[str, Any]]] = {p: [] for p in peers.PEERS}
        self.peer_rss: dict[str, list[dict[str, float | None]]] = {p: [] for p in peers.PEERS}
        self.peer_label: dict[str, str] = {}
        self.sqlite: list[dict[str, Any]] = []
        self.loopback: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.skipped: list[str] = []
        self.seconds = 0.0
        self.load: list[str] = []
        self.target_half: list[dict[str, Any]] = []  # security off, paced at TARGET_HALF_RATE
        # Security off, B as --receiver-units units: online, store, drain;
        # "online both": A as --sender-units units too.
        self.units: dict[str, list[dict[str, Any]]] = {k: [] for k in (*UNIT_PHASES, "online both")}
        # Security off, online at full load with the delivery history off
        # (history_days = 0), right after the same phase with it on.
        self.history_off: list[dict[str, Any]] = []

    def as_json(self) -> dict[str, Any]:
        return {"semq": {("security on" if k else "security off"): v for k, v in self.semq.items()},
                "semq units (security off)": self.units,
                "peers": self.peers, "peer_rss": self.peer_rss, "peer_label": self.peer_label,
                "sqlite": self.sqlite, "loopback": self.loopback, "errors": self.errors,
                "skipped": self.skipped, "seconds": self.seconds, "load": self.load,
                "target_half": self.target_half, "history off": self.history_off}


def run_suite(a: argparse.Namespace, res: Results) -> None:
    """Fill ``res`` step by step (so an overrun keeps what was measured)."""
    t0 = time.monotonic()
    soft = t0 + a.budget
    base = Path(tempfile.mkdtemp(prefix="semq-bench-suite-"))
    res.load.append(_load())
    try:
        def step(what: str, fn: Callable[[], None]) -> None:
            if time.monotonic() > soft:
                res.skipped.append(what)
                _log(f"skipped (time budget of {a.budget:.0f} s used): {what}")
                return
            try:
                fn()
            except Exception as exc:  # BenchError, StoreError, timeouts, a worker's error...: next step
                res.errors.append(f"{what}: {type(exc).__name__}: {exc}")
                _log(f"failed: {what}: {exc}")

        for r in range(a.repeat):
            run = base / f"run{r + 1}"
            run.mkdir()
            _log(f"repeat {r + 1} of {a.repeat} (load average {_load()})")
            for secure in (False, True):
                # e2e.measure's phases one by one (so a failure or the budget
                # loses one phase, not the repeat); fresh processes and stores each.
                ns = argparse.Namespace(count=a.count, repeat=1, synchronous=a.synchronous,
                                        phase_timeout=a.phase_timeout, secure=secure, keep=False)
                tmp = run / ("sec" if secure else "plain")
                tmp.mkdir()
                mode = f"security {'on' if secure else 'off'}"
                got: dict[str, dict[str, Any]] = {}

                def online(ns: argparse.Namespace = ns, tmp: Path = tmp, got: dict[str, Any] = got,
                           mode: str = mode) -> None:
                    _log(f"SEMQ {mode}: online, {a.count} documents")
                    got["online"] = e2e.phase_online(tmp, a.count, ns,
                                                     before_stop=None if ns.secure else history_catch_up(a.count))
                    res.semq[ns.secure]["online"].append(got["online"])

                def half(ns: argparse.Namespace = ns, tmp: Path = tmp, got: dict[str, Any] = got,
                         mode: str = mode) -> None:
                    if "online" not in got:
                        raise RuntimeError("no full-load rate to halve (online failed)")
                    rate = got["online"]["rate"] / 2
                    _log(f"SEMQ {mode}: half load, {a.count // 2} documents at {rate:,.0f}/s")
                    res.semq[ns.secure]["half"].append(e2e.phase_online(tmp, a.count // 2, ns, rate=rate))

                def target_half(ns: argparse.Namespace = ns, tmp: Path = tmp) -> None:
                    _log(f"SEMQ security off: {a.count // 2} documents at {TARGET_HALF_RATE:,}/s (the issue's half load)")
                    res.target_half.append(e2e.phase_online(tmp, a.count // 2, ns, rate=TARGET_HALF_RATE,
                                                            name="target-half"))

                def store_drain(ns: argparse.Namespace = ns, tmp: Path = tmp, mode: str = mode, r: int = r) -> None:
                    _log(f"SEMQ {mode}: store then drain, {a.count} documents")
                    st, dr = e2e.phase_store_drain(tmp, a.count, ns)
                    st["repeat"] = dr["repeat"] = r  # (B as units is paired with its repeat)
                    res.semq[ns.secure]["store"].append(st)
                    res.semq[ns.secure]["drain"].append(dr)

                def history_off(ns: argparse.Namespace = ns, tmp: Path = tmp, pair: dict[str, Any] = got) -> None:
                    _log(f"SEMQ security off, delivery history off: online, {a.count} documents")
                    off = argparse.Namespace(**{**vars(ns), "history": False})
                    x = e2e.phase_online(tmp, a.count, off, name="online-history-off")
                    # Paired with the phase with the history that ran just before.
                    if "online" in pair and x.get("rate"):
                        x["with_history_ratio"] = pair["online"]["rate"] / x["rate"]
                        x["with_history_cpu"] = pair["online"].get("cpu")
                    res.history_off.append(x)

                step(f"SEMQ {mode} online, repeat {r + 1}", online)
                if not secure:
                    step(f"SEMQ {mode} online, delivery history off, repeat {r + 1}", history_off)
                step(f"SEMQ {mode} half load, repeat {r + 1}", half)
                if not secure:
                    step(f"SEMQ {mode} at {TARGET_HALF_RATE:,}/s, repeat {r + 1}", target_half)
                step(f"SEMQ {mode} store/drain, repeat {r + 1}", store_drain)
                if not secure and a.receiver_units > 1:
                    _units_steps(a, res, run, r, step)
            for peer in peers.PEERS:
                def peer_step(peer: str = peer, r: int = r) -> None:
                    left = max(10.0, soft - time.monotonic())
                    with RssSampler() as sampler:
                        rows = peers.measure_peers(a.count, 1, peers=[peer], phase_timeout=min(a.phase_timeout, 60.0),
                                                   budget=min(peers.TOTAL_BUDGET, left))
                    row = rows[0]
                    res.peer_label[peer] = row["label"]
                    res.peers[peer].extend(row["runs"])
                    if row["runs"]:
                        res.peer_rss[peer].append(sampler.by_role())
                    res.errors.extend(f"{peer}, repeat {r + 1}: {e}" for e in row["errors"])
                step(f"{PEER_NAMES[peer]}, repeat {r + 1}", peer_step)

            def sqlite_step(run: Path = run) -> None:
                _log(f"limit: SQLite inserts, {a.count * SQLITE_ROWS_PER_DOC} rows of 1 KiB, {BATCH} per transaction")
                res.sqlite.append(measure_sqlite(run, a.count * SQLITE_ROWS_PER_DOC, a.synchronous, WORKER_TIMEOUT))

            def loopback_step(run: Path = run) -> None:
                n = a.count * LOOPBACK_FRAMES_PER_DOC
                _log(f"limit: loopback TCP, {n} DATA frames, {BATCH} per sendall")
                res.loopback.append(measure_loopback(run, n, WORKER_TIMEOUT))

            step(f"SQLite limit, repeat {r + 1}", sqlite_step)
            step(f"loopback limit, repeat {r + 1}", loopback_step)
            shutil.rmtree(run, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        res.seconds = time.monotonic() - t0
        res.load.append(_load())


def _units_steps(a: argparse.Namespace, res: Results, run: Path, r: int,
                 step: Callable[[str, Callable[[], None]], None]) -> None:
    """Repeat ``r``'s phases with B as ``a.receiver_units`` units (security
    off, fresh processes and stores each): online at full load, store then
    drain, and with ``a.sender_units`` > 1 online with A as units too."""
    n_b, n_a = a.receiver_units, a.sender_units
    ns = argparse.Namespace(count=a.count, repeat=1, synchronous=a.synchronous, phase_timeout=a.phase_timeout,
                            secure=False, keep=False, receiver_units=n_b, sender_units=1)
    tmp = run / "units"
    tmp.mkdir()

    def online() -> None:
        _log(f"SEMQ security off, B as {n_b} units: online, {a.count} documents")
        res.units["online"].append(e2e.phase_online(tmp, a.count, ns))

    def store_drain() -> None:
        _log(f"SEMQ security off, B as {n_b} units: store then drain, {a.count} documents")
        st, dr = e2e.phase_store_drain(tmp, a.count, ns)
        st["repeat"] = dr["repeat"] = r
        res.units["store"].append(st)
        res.units["drain"].append(dr)

    def online_both() -> None:
        _log(f"SEMQ security off, A as {n_a} units and B as {n_b}: online, {a.count} documents")
        both = argparse.Namespace(**{**vars(ns), "sender_units": n_a})
        res.units["online both"].append(e2e.phase_online(tmp, a.count, both, name="online-both"))

    step(f"SEMQ security off, B as {n_b} units, online, repeat {r + 1}", online)
    step(f"SEMQ security off, B as {n_b} units, store/drain, repeat {r + 1}", store_drain)
    if n_a > 1:
        step(f"SEMQ security off, A as {n_a} units and B as {n_b}, online, repeat {r + 1}", online_both)


# ---------------------------------------------------------------- the table


HISTORY_MAX_COST = 0.05  # what writing the delivery history may cost of online throughput


def _f(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _pct(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    share = a / b
    return f"{share:.0%}" if share >= 0.1 else f"{share:.1%}" if share >= 0.01 else f"{share:.2%}"


def _cpu_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median CPU us per document of each SEMQ daemon (P, A, B) over runs."""
    out = {}
    for k in ("P", "A", "B"):
        m = _median([(x.get("cpu") or {}).get(k) for x in runs])
        if m is not None:
            out[k] = m
    return out


def _ceiling_notes(res: Results, semq_rate: dict[tuple[bool, str], float | None],
                   peer_rate: dict[tuple[str, str], float | None]) -> list[str]:
    """What the CPU each document cost allows (security off): with C cores,
    at most C / (the three daemons' CPU per document) documents/s, and at
    most 1 / (the busiest daemon's) — each daemon's Python runs under one
    interpreter lock. Printed beside each rate target that is not met, with
    the CPU per document the target would need: the figure that says how
    far a target is, whatever the neighbours did to docs/s."""
    cores = len(os.sched_getaffinity(0))
    wanted: list[tuple[str, str, float]] = []
    for k in ("online", "store", "drain"):
        v = semq_rate[(False, k)]
        if v is not None and v < TARGET_RATE[k]:
            wanted.append((k, f"{TARGET_RATE[k]:,}/s", TARGET_RATE[k]))
    for peer in ("nats", "mosquitto"):
        on, pv = semq_rate[(False, "online")], peer_rate[(peer, "online")]
        if on and pv and on < TARGET_X[peer] * pv:
            wanted.append(("online", f"{TARGET_X[peer]:g}x {PEER_NAMES[peer]} = {TARGET_X[peer] * pv:,.0f}/s",
                           TARGET_X[peer] * pv))
    notes = []
    for k, label, rate in wanted:
        cpu = _cpu_medians(res.semq[False][k])
        if len(cpu) < (2 if k == "store" else 3):
            continue
        total = sum(cpu.values())
        role, top = max(cpu.items(), key=lambda kv: kv[1])
        need = cores * 1e6 / rate
        cut = (f"{1 - need / total:.0%} less" if total > need else
               "the CPU already allows it: the rest is the daemons waiting on each other")
        notes.append(
            f"CPU ceiling, {k} (security off): the daemons used {total:,.0f} us per document ("
            + ", ".join(f"{r} {v:,.0f}" for r, v in cpu.items())
            + f"), so {cores} cores allow at most {cores * 1e6 / total:,.0f}/s and {role}'s one interpreter about"
            f" {1e6 / top:,.0f}/s; {label} needs <= {need:,.0f} us in all ({cut}) and"
            f" <= {1e6 / rate:,.0f} us in each daemon.")
    return notes


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _process_label(key: str) -> str:
    """"B/1" -> "B unit 1", "B/sup" -> "B supervisor" (e2e.Cluster.cpu's names)."""
    who, _, part = key.partition("/")
    return key if not part else f"{who} supervisor" if part == "sup" else f"{who} unit {part}"


def _units_notes(a: argparse.Namespace, res: Results, semq_rate: dict[tuple[bool, str], float | None],
                 peer_rate: dict[tuple[str, str], float | None],
                 semq_cpu_of: dict[tuple[bool, str], float | None], peer_cpu_of: dict[tuple[str, str], float | None],
                 units_rate: dict[str, float | None], units_cpu: dict[str, float | None]) -> list[str]:
    """Notes on B as units (security off): what ran, the CPU per document of
    every process (SEMQ with B as one unit, as units, NATS JetStream), and
    the aims, each with met / NOT met, and for a rate aim not met what the
    CPU per document it used allows on this machine's cores."""
    n_b, n_a = a.receiver_units, a.sender_units
    cores = len(os.sched_getaffinity(0))
    notes = [e2e.units_note(1, n_b) + " RSS receiver in these rows = B's processes together."]
    if n_a > 1:
        notes.append(f"'A as {n_a} and B as {n_b} units': the same online phase with A as {n_a} units too (its "
                     f"documents accepted in calls of {e2e.LOAD_BATCH}, each into the next unit).")

    def procs(d: dict[str, float]) -> str:
        return ", ".join(f"{_process_label(k)} {v:,.1f}" if v < 1 else f"{_process_label(k)} {v:,.0f}"
                         for k, v in d.items()) if d else "not measured"

    for k in UNIT_PHASES:
        nats = {who: m for who in ("broker", "publisher", "subscriber")
                if (m := _median([(x.get(f"{k}_cpu_parts") or {}).get(who) for x in res.peers["nats"]])) is not None}
        parts = [f"SEMQ, B as one unit: {procs(e2e.per_process(res.semq[False][k]))}",
                 f"B as {n_b} units: {procs(e2e.per_process(res.units[k]))}"]
        if k == "online" and n_a > 1:
            parts.append(f"A as {n_a} and B as {n_b} units: {procs(e2e.per_process(res.units['online both']))}")
        parts.append(f"NATS JetStream: {procs(nats)}")
        notes.append(f"CPU us/doc per process, {k} (security off, medians): " + "; ".join(parts) + ".")

    def ceiling(cpu: float | None, want: float) -> str:
        """What the CPU per document used allows, beside a rate aim not met."""
        if not cpu:
            return ""
        return (f" (the {cpu:,.0f} us of CPU per document it used allow at most {cores * 1e6 / cpu:,.0f}/s on"
                f" {cores} cores; {want:,.0f}/s needs <= {cores * 1e6 / want:,.0f} us)")

    def rate_aim(label: str, mine: float | None, cpu: float | None, other_label: str, other: float | None,
                 x: float, extra: str = "") -> str:
        head = f"aim {label} >= {x:g}x {other_label}: "
        if not mine or not other:
            return head + "not measured."
        ok = mine >= x * other
        return (head + f"{mine:,.0f} / {other:,.0f} = {mine / other:.2f}x{extra}, {_met(ok)}"
                + ("" if ok else ceiling(cpu, x * other)) + ".")

    nats_name = PEER_NAMES["nats"]
    for k, x in AIM_UNITS_X_NATS.items():
        notes.append(rate_aim(f"{k}, B as {n_b} units", units_rate[k], units_cpu[k], f"{nats_name}'s {k}",
                              peer_rate[("nats", k)], x))
    for k, x in AIM_UNITS_X_ONE.items():
        one = {x["repeat"]: x["rate"] for x in res.semq[False][k] if "repeat" in x}
        pairs = [u["rate"] / one[u["repeat"]] for u in res.units[k] if u.get("repeat") in one]
        paired = f" (per repeat: {', '.join(f'{p:.2f}' for p in pairs)})" if pairs else ""
        notes.append(rate_aim(f"{k}, B as {n_b} units", units_rate[k], units_cpu[k], f"SEMQ's {k} with B as one unit",
                              semq_rate[(False, k)], x, paired))
    if n_a > 1:
        x = AIM_UNITS_X_NATS["online"]
        notes.append(rate_aim(f"online, A as {n_a} and B as {n_b} units", units_rate["online both"],
                              units_cpu["online both"], f"{nats_name}'s online", peer_rate[("nats", "online")], x))
    for k in UNIT_PHASES:
        theirs = peer_cpu_of[("nats", k)]
        mine = [("B as one unit", semq_cpu_of[(False, k)]), (f"B as {n_b} units", units_cpu[k])]
        if k == "online" and n_a > 1:
            mine.append((f"A as {n_a} and B as {n_b} units", units_cpu["online both"]))
        notes.append(f"aim SEMQ CPU per document <= {AIM_CPU_X_NATS:g}x {nats_name}'s, {k} (security off): " + (
            "not measured." if not theirs else "; ".join(
                f"{label} {v:,.0f} / {theirs:,.0f} us = {v / theirs:.2f}x, {_met(v <= AIM_CPU_X_NATS * theirs)}"
                if v else f"{label} not measured" for label, v in mine) + "."))
    return notes


def report(a: argparse.Namespace, res: Results) -> tuple[list[str], list[list[str]], list[str]]:
    """Headers, rows and notes of the one table."""
    semq_rate = {(s, k): _median([x["rate"] for x in res.semq[s][k]]) for s in (False, True) for k in PHASES}
    peer_key = {"online": "online_msgs_s", "half": "half_rate_msgs_s", "store": "store_msgs_s",
                "drain": "drain_msgs_s"}
    peer_rate = {(p, k): _median([x.get(peer_key[k]) for x in res.peers[p]]) for p in peers.PEERS for k in PHASES}
    sqlite_rate = _median([x["rate"] for x in res.sqlite])
    loop_rate = _median([x["rate"] for x in res.loopback])
    labels = {"online": "online, full load", "half": "online, half load", "store": "store (receiver offline)",
              "drain": "drain (receiver connects)"}
    headers = ["system / phase", "docs/s", "CPU us/doc", "p50 ms", "p99 ms", "RSS relay", "RSS sender",
               "RSS receiver", "x NATS", "x mosquitto", "of SQLite", "of loopback"]
    rows: list[list[str]] = []

    def rss(vals: list[float | None]) -> str:
        m = _median(vals)
        return "-" if m is None else f"{m:.0f}"

    def semq_cpu(runs: list[dict[str, Any]]) -> float | None:
        """Median over runs of the CPU per document of every SEMQ process that ran."""
        sums = []
        for x in runs:
            vals = [v for v in (x.get("cpu") or {}).values() if v is not None]
            sums.append(sum(vals) if vals else None)
        return _median(sums)

    def node_rss(runs: list[dict[str, Any]], who: str) -> str:
        """Median peak RSS of P, A or B (a node of several units: its processes together)."""
        return rss([e2e.of_node(x["rss"], who) for x in runs])

    semq_cpu_of = {(s, k): semq_cpu(res.semq[s][k]) for s in (False, True) for k in PHASES}
    peer_cpu_of = {(p, k): _median([x.get(f"{k}_cpu_us") for x in res.peers[p]])
                   for p in peers.PEERS for k in ("online", "store", "drain")}
    units_rate = {k: _median([x["rate"] for x in runs]) for k, runs in res.units.items()}
    units_cpu = {k: semq_cpu(runs) for k, runs in res.units.items()}
    n_b, n_a = a.receiver_units, a.sender_units

    def semq_row(label: str, runs: list[dict[str, Any]], k: str, rate: float | None, cpu: float | None,
                 compare: bool) -> list[str]:
        lat = k in ("online", "half")
        return [label, _f(rate), _f(cpu),
                _f(_median([x["p50"] for x in runs]), ".0f") if lat else "-",
                _f(_median([x["p99"] for x in runs]), ".0f") if lat else "-",
                node_rss(runs, "P"), node_rss(runs, "A"), node_rss(runs, "B") if k != "store" else "-",
                _x(rate, peer_rate[("nats", k)]) if compare else "-",
                _x(rate, peer_rate[("mosquitto", k)]) if compare else "-",
                _pct(rate, sqlite_rate) if compare else "-", _pct(rate, loop_rate) if compare else "-"]

    for secure in (False, True):
        for k in PHASES:
            rows.append(semq_row(f"SEMQ {labels[k]}, security {'on' if secure else 'off'}", res.semq[secure][k], k,
                                 semq_rate[(secure, k)], semq_cpu_of[(secure, k)], k != "half"))
        if not secure and res.target_half:
            th = res.target_half
            rows.insert(PHASES.index("half") + 1, semq_row(  # right under the half-load row
                f"SEMQ online, {TARGET_HALF_RATE:,}/s (half of the 15,000/s target), security off", th, "half",
                _median([x["rate"] for x in th]), semq_cpu(th), False))
        if not secure and res.history_off:
            rows.insert(1, semq_row(f"SEMQ {labels['online']}, security off, delivery history off", res.history_off,
                                    "online", _median([x["rate"] for x in res.history_off]),
                                    semq_cpu(res.history_off), True))
        if not secure and n_b > 1:
            for k in UNIT_PHASES:
                rows.append(semq_row(f"SEMQ {labels[k]}, B as {n_b} units, security off", res.units[k], k,
                                     units_rate[k], units_cpu[k], True))
            if n_a > 1:
                rows.append(semq_row(f"SEMQ {labels['online']}, A as {n_a} and B as {n_b} units, security off",
                                     res.units["online both"], "online", units_rate["online both"],
                                     units_cpu["online both"], True))
    for peer in ("nats", "mosquitto"):
        runs = res.peers[peer]
        prss = res.peer_rss[peer]
        for k in PHASES:
            rate = peer_rate[(peer, k)]
            p50 = {"online": "p50_ms", "half": "half_p50_ms"}.get(k)
            p99 = {"online": "p99_ms", "half": "half_p99_ms"}.get(k)
            full = k != "half"
            rows.append([
                f"{PEER_NAMES[peer]} {labels[k]}", _f(rate), _f(peer_cpu_of.get((peer, k))),
                _f(_median([x.get(p50) for x in runs]), ".1f") if p50 else "-",
                _f(_median([x.get(p99) for x in runs]), ".1f") if p99 else "-",
                rss([x["broker"] for x in prss]),
                rss([x["pub"] for x in prss]) if k != "drain" else "-",
                rss([x["sub"] for x in prss]) if k != "store" else "-",
                "-", "-", _pct(rate, sqlite_rate) if full else "-", _pct(rate, loop_rate) if full else "-",
            ])
    rows.append([f"limit: SQLite insert, WAL, synchronous={a.synchronous}, {BATCH} rows/txn", _f(sqlite_rate),
                 "-", "-", "-", "-", rss([x["rss"] for x in res.sqlite]), "-", "-", "-", "-", "-"])
    frame_bytes = res.loopback[0]["frame_bytes"] if res.loopback else 1227
    rows.append([f"limit: loopback TCP, {frame_bytes:,} B frames, {BATCH}/sendall", _f(loop_rate), "-", "-", "-",
                 "-", rss([x["rss_send"] for x in res.loopback]), rss([x["rss_recv"] for x in res.loopback]),
                 "-", "-", "-", "-"])

    n_runs = max([len(res.semq[False]["online"]), len(res.peers["nats"]), len(res.sqlite)], default=0)
    sync_used = {str(x.get("synchronous")) for x in res.sqlite}
    sync_note = f" (the limit's connection read back PRAGMA synchronous = {sorted(sync_used)})" if sync_used else ""
    notes = [
        f"1 KiB documents, 127.0.0.1 only; SQLite WAL, synchronous={a.synchronous} in every SEMQ store and the "
        f"SQLite limit{sync_note}; median of {n_runs} run(s) (asked: {a.repeat}); N = {a.count:,} per phase "
        f"(half load N/2); {res.seconds:.0f} s in all; {e2e.code_version()}.",
        f"Load average (1/5/15 min) at start {res.load[0]}, at end {res.load[-1]}: the 2 shared cores also ran other "
        "engineers' jobs, figures move by 20-30% or more between runs.",
        "SEMQ: A -> platform -> B, SaveFwd=3, Ack2 on; docs/s online = first send -> last ACK2 at A; store = first "
        "send -> last ACK_SAVE; drain = B online -> last ACK2/platform ack. p50/p99 = send -> inbox at full and at "
        "half load (paced at half the full-load rate of the same repeat); security on = mutual TLS 1.3, sealed "
        "and signed documents. RSS MiB: relay = platform / broker, sender = A / publisher, receiver = B / "
        "subscriber (peak VmHWM; peers' processes sampled every 0.25 s).",
        "Peers: the same phases, publish window 256, p50/p99 = publish -> receive; no TLS. x NATS / x mosquitto = "
        "SEMQ docs/s / the peer's in the same phase; of SQLite / of loopback = docs/s / the limit's rate.",
        "CPU us/doc = user + system CPU time of every process of the system in the phase (SEMQ: platform, A and B "
        "from /proc, the phase's poll waits included; peers: broker from /proc, publisher and subscriber from "
        "their own clocks, connected to done) / documents. It moves less with the neighbours than docs/s (busy "
        "neighbours still raise it: caches, shared cores); at a paced load it includes the daemons' idle ticks.",
    ]
    for k in ("online", "store", "drain"):
        mine = semq_cpu_of[(False, k)]
        theirs = [(PEER_NAMES[p], peer_cpu_of[(p, k)]) for p in ("nats", "mosquitto")]
        if mine and all(v for _, v in theirs):
            notes.append(f"CPU per document, {k}, security off: SEMQ {mine:,.0f} us; " + "; ".join(
                f"{name} {v:,.0f} us (SEMQ uses {mine / v:.2f}x)" for name, v in theirs if v) + ".")
    if n_b > 1:
        notes.extend(_units_notes(a, res, semq_rate, peer_rate, semq_cpu_of, peer_cpu_of, units_rate, units_cpu))
    # Targets.
    on = semq_rate[(False, "online")]
    for k in ("online", "store", "drain"):
        v = semq_rate[(False, k)]
        t = TARGET_RATE[k]
        notes.append(f"target {k} >= {t:,}/s (security off): " +
                     ("not measured" if v is None else f"{v:,.0f}/s = {v / t:.0%} of it, {_met(v >= t)}."))
    for peer in ("nats", "mosquitto"):
        pv = peer_rate[(peer, "online")]
        tx = TARGET_X[peer]
        notes.append(f"target online >= {tx:g}x {PEER_NAMES[peer]} (security off): " +
                     ("not measured" if not on or not pv else
                      f"{on:,.0f} / {pv:,.0f} = {on / pv:.2f}x, {_met(on >= tx * pv)}."))
    hp99 = _median([x["p99"] for x in res.semq[False]["half"]])
    hrate = semq_rate[(False, "half")]
    notes.append(f"target p99 <= {TARGET_P99_HALF_MS:.0f} ms at half load (security off): " +
                 ("not measured" if hp99 is None else
                  f"{hp99:.0f} ms at {hrate or 0:,.0f}/s (half of *our* rate, not of 15,000/s), "
                  f"{_met(hp99 <= TARGET_P99_HALF_MS)}."))
    tp99 = _median([x["p99"] for x in res.target_half])
    notes.append(f"target p99 <= {TARGET_P99_HALF_MS:.0f} ms at half of 15,000/s (security off): " +
                 ("not measured" if tp99 is None else
                  f"{tp99:.0f} ms at {_median([x['rate'] for x in res.target_half]) or 0:,.0f}/s, "
                  f"{_met(tp99 <= TARGET_P99_HALF_MS)}."))
    notes.extend(_ceiling_notes(res, semq_rate, peer_rate))
    notes.append(_history_note(res, semq_cpu))
    son = semq_rate[(True, "online")]
    notes.append(f"target security on >= {TARGET_SECURE_SHARE:.0%} of plain (online): " +
                 ("not measured" if not on or not son else
                  f"{son:,.0f} / {on:,.0f} = {son / on:.1%}, {_met(son >= TARGET_SECURE_SHARE * on)}."))
    np99, nrate = _median([x.get("half_p99_ms") for x in res.peers["nats"]]), peer_rate[("nats", "half")]
    notes.append("p99 send -> inbox at half load (security off): " +
                 ("not measured" if hp99 is None or np99 is None else
                  f"SEMQ {hp99:.0f} ms at {hrate or 0:,.0f}/s, NATS JetStream {np99:.1f} ms (publish -> receive) at"
                  f" {nrate or 0:,.0f}/s: {hp99 / np99:.1f}x NATS JetStream's."))
    if on and sqlite_rate and loop_rate:
        notes.append(f"SEMQ online (security off) is {on / sqlite_rate:.0%} of this machine's SQLite group-commit "
                     f"insert rate ({sqlite_rate:,.0f} rows/s) and {on / loop_rate:.1%} of its loopback frame "
                     f"rate ({loop_rate:,.0f} frames/s).")
    notes.append("What an ack promises:")
    notes.append(f"- {SEMQ_ACK}{SEMQ_SYNC[a.synchronous]}")
    notes.extend(f"- {peers.ack_promise(p)}" for p in ("nats", "mosquitto"))
    if res.peer_label:
        notes.append("Peers: " + "; ".join(res.peer_label[p] for p in ("nats", "mosquitto") if p in res.peer_label)
                     + f"; clients paho-mqtt {peers._dist_version('paho-mqtt')}, "
                     f"nats-py {peers._dist_version('nats-py')}.")
    own = _self_rss_mib()
    if own is not None:
        notes.append(f"This process (SEMQ pre-loading and the half-load feeder run in it): peak RSS {own:.0f} MiB.")
    notes.extend(f"skipped (time budget): {s}" for s in res.skipped)
    notes.extend(f"ERROR: {e}" for e in res.errors)
    return headers, rows, notes


def history_catch_up(n: int, timeout: float = 120.0) -> Callable[[Any], dict[str, Any]]:
    """For the online phase with the delivery history on: how much of it
    the idle-priority indexers had done when the last document was
    confirmed, and how long after that A's and B's histories held all ``n``
    documents (the indexers run on CPU time the delivery does not want)."""

    def indexed(c: Any) -> tuple[int, int]:
        out = []
        for who, sql in (("A", "SELECT count(*) FROM doc WHERE role = 'origin' AND state = 'ack2'"),
                         ("B", "SELECT count(*) FROM doc WHERE role = 'receiver'"
                               " AND state IN ('inbox', 'ack2_sent')")):
            path = c.root / who / "history.sqlite"
            if not path.exists():
                out.append(0)
                continue
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                out.append(int(conn.execute(sql).fetchone()[0]))
            except sqlite3.OperationalError:
                out.append(0)
            finally:
                conn.close()
        return out[0], out[1]

    def indexer_cpu(c: Any) -> float | None:
        """CPU seconds of the daemons' indexer processes (their children
        running semq.tracking.history): all they did since the phase began."""
        daemons = set(c.pids().values())
        total = 0.0
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"semq.tracking.history" in cmd and int(stat[stat.rindex(")") + 2:].split()[1]) in daemons:
                total += e2e.cpu_seconds(int(d.name)) or 0.0
        return total or None

    def measure(c: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        a0, b0 = indexed(c)
        lag = None
        while time.monotonic() - t0 < timeout:
            a, b = indexed(c)
            if a >= n and b >= n:
                lag = time.monotonic() - t0
                break
            time.sleep(0.2)
        cpu = indexer_cpu(c)
        return {"history_at_end": (a0 / n, b0 / n), "history_lag_s": lag,
                "history_cpu_us": None if cpu is None else cpu / n * 1e6}

    return measure


def _history_note(res: Results, semq_cpu: Callable[[list[dict[str, Any]]], float | None]) -> str:
    """What writing the delivery history costs at full load: the online
    rate with it / without it, per repeat (the two phases ran one after the
    other), and CPU per document."""
    ratios = [x["with_history_ratio"] for x in res.history_off if "with_history_ratio" in x]
    on_runs = [{"cpu": x["with_history_cpu"]} for x in res.history_off if x.get("with_history_cpu")]
    if not ratios:
        return f"target: the delivery history costs <= {HISTORY_MAX_COST:.0%} of online throughput: not measured."
    ratio = statistics.median(ratios)
    cpu_on, cpu_off = semq_cpu(on_runs), semq_cpu(res.history_off)
    cpu = (f"; CPU per document {cpu_on:,.0f} us with it, {cpu_off:,.0f} us without"
           if cpu_on and cpu_off else "")
    lag = ""
    ends = [x["history_at_end"] for x in res.semq[False]["online"] if x.get("history_at_end")]
    lags = [x.get("history_lag_s") for x in res.semq[False]["online"] if x.get("history_at_end")]
    if ends:
        a_end, b_end = ends[-1]
        last = lags[-1]
        hcpu = _median([x.get("history_cpu_us") for x in res.semq[False]["online"] if x.get("history_at_end")])
        lag = (f" When the last document was confirmed the idle-priority indexers had done {a_end:.0%} of A's"
               f" history and {b_end:.0%} of B's; both were complete "
               + (f"{last:.1f} s later" if last is not None else "not within 120 s")
               + (f"; the indexers of P, A and B used {hcpu:,.0f} us of CPU per document in all (idle time, not"
                  " in the CPU per document above)." if hcpu else "."))
    return (f"target: the delivery history costs <= {HISTORY_MAX_COST:.0%} of online throughput (security off): "
            f"online with it / without it = {ratio:.1%} (median of {len(ratios)} paired run(s): "
            f"{', '.join(f'{x:.1%}' for x in ratios)}){cpu}, {_met(ratio >= 1 - HISTORY_MAX_COST)}.{lag}")


# ---------------------------------------------------------------- main


def _on_signal(signum: int, _frame: object) -> None:
    if signum == signal.SIGALRM:
        raise Overrun
    raise KeyboardInterrupt  # SIGTERM: every `finally` stops its processes


def _store_comparison(a: argparse.Namespace) -> int:
    """``--store postgresql``: the platform on SQLite, on PostgreSQL with one
    and with two instances, and the failover gap (pgplatform.run)."""
    a.repeat = a.repeat or 1
    a.count = a.count or (QUICK_COUNT if a.quick else DEFAULT_COUNT)
    a.budget = a.budget or pgplatform.DEFAULT_BUDGET
    if a.count < 2 or not 1 <= a.repeat <= 5 or a.budget <= 0 or a.failover_count < 0 or a.failover_rate <= 0:
        print("error: --count must be >= 2, --repeat 1..5, --budget > 0, --failover-count >= 0, "
              "--failover-rate > 0", file=sys.stderr)
        return 2
    try:
        res = pgplatform.run(a)
    except RuntimeError as e:  # the throwaway server did not start
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        left = stop_leftovers()
        if left:
            _log(f"stopped {len(left)} leftover process(es) of this run: PIDs {left}")
    return pgplatform.print_report(a, res)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when everything was measured, 1 when something failed or was
    skipped (the table shows the rest), 2 on a usage error, 130 on Ctrl-C."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        return _worker_main(args[1:])
    p = argparse.ArgumentParser(prog="scripts/bench suite",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=None, help="runs of everything; medians (default 3, --quick 1)")
    p.add_argument("--count", type=int, default=None,
                   help=f"documents per phase (default {DEFAULT_COUNT}, --quick {QUICK_COUNT})")
    p.add_argument("--quick", action="store_true", help="1 repeat, N = 5000: a couple of minutes")
    p.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"],
                   help="SQLite synchronous mode of the SEMQ stores and the SQLite limit (default FULL)")
    p.add_argument("--phase-timeout", type=float, default=e2e.DEFAULT_PHASE_TIMEOUT,
                   help="limit of each wait, s (default %(default)s)")
    p.add_argument("--budget", type=float, default=None,
                   help=f"s; no step starts after it, everything stops {HARD_GRACE:.0f} s later "
                        f"(default {DEFAULT_BUDGET:.0f}, --quick {QUICK_BUDGET:.0f})")
    p.add_argument("--receiver-units", type=int, default=DEFAULT_RECEIVER_UNITS, metavar="N",
                   help="also measure online, store and drain (security off) with B as N units (default"
                        " %(default)s; 1: not)")
    p.add_argument("--sender-units", type=int, default=1, metavar="M",
                   help="with M > 1, also online with A as M units and B as --receiver-units (default 1: not)")
    p.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgresql"],
                   help="postgresql: compare the platform's stores instead (scripts/bench pgplatform)")
    pgplatform.add_arguments(p)
    try:
        a = p.parse_args(args)
    except SystemExit as e:
        return int(e.code or 0)
    if a.store == "postgresql":
        return _store_comparison(a)
    a.repeat = a.repeat or (1 if a.quick else 3)
    a.count = a.count or (QUICK_COUNT if a.quick else DEFAULT_COUNT)
    a.budget = a.budget or (QUICK_BUDGET if a.quick else DEFAULT_BUDGET)
    if a.count < 2 or not 1 <= a.repeat <= 5 or a.budget <= 0:
        print("error: --count must be >= 2, --repeat 1..5, --budget > 0", file=sys.stderr)
        return 2
    if not (1 <= a.receiver_units <= e2e.MAX_UNITS and 1 <= a.sender_units <= e2e.MAX_UNITS) or (
            a.sender_units > 1 and a.receiver_units < 2):
        print(f"error: --receiver-units and --sender-units must be 1..{e2e.MAX_UNITS}; --sender-units > 1 needs"
              " --receiver-units > 1", file=sys.stderr)
        return 2
    try:
        peers.ensure_brokers(peers.PEERS)  # installs, if needed, before the clock starts
        peers.ensure_clients(peers.PEERS)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        print(f"error: cannot install the peers: {exc}", file=sys.stderr)
        return 1
    res = Results()
    old_term = signal.signal(signal.SIGTERM, _on_signal)
    old_alarm = signal.signal(signal.SIGALRM, _on_signal)
    signal.alarm(int(a.budget + HARD_GRACE))
    try:
        run_suite(a, res)
    except Overrun:
        res.errors.append(f"stopped at the hard limit ({a.budget + HARD_GRACE:.0f} s); what was measured is shown")
        _log(res.errors[-1])
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
        left = stop_leftovers()
        if left:
            _log(f"stopped {len(left)} leftover process(es) of this run: PIDs {left}")
        signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGTERM, old_term)
    if a.json:
        print(json.dumps(res.as_json(), indent=1))
    else:
        headers, rows, notes = report(a, res)
        print_table("Performance: SEMQ, its peers and this machine's limits, one run, 1 KiB documents",
                    headers, rows, notes)
    return 1 if res.errors or res.skipped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
