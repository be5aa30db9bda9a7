"""Hostile floods at every listener (``scripts/bench load flood``): each process's peak memory and descriptors beside its declared bound.

Real ``semq`` processes on 127.0.0.1 in a fresh temporary directory,
security on: a platform P, organizations A and B (B listens for direct
links and accepts them from A only), and M, an enrolled organization with
bad intent. Each phase floods one surface with semq.testing.hostile while A
sends B documents through the platform, and reports the flood (connections
tried, held, welcomed, closed; bytes the listener read before closing),
the attacked process's RSS and descriptors before and at their peak
(sampled every 0.2 s), the bound declared for that surface (semq.settings.bounds,
docs/security.md "Bounds") and how long A's documents took meanwhile.

Phases (``--phases``, default all):

``platform-silent``   strangers that connect and say nothing (``--connections``, default 2,000)
``platform-early``    M's first frames declaring 60 MiB, before HELLO (64)
``platform-frames``   M's sessions streaming a 60 MiB frame each (16)
``direct-idle``       links of A (which B accepts) to B's listener, idle after HELLO (``--connections``)
``direct-refused``    M's links (not accepted by B) whose first frames declare 60 MiB (8)
``direct-silent``     TLS connections to B's listener that say nothing (``--connections``)
``user-socket``       local connections to B's user socket streaming 16 MiB without a token (50)

Exit 0 when every phase stayed within its bound and A's documents arrived,
1 otherwise.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import trio

if __package__:
    from .load import MIB, A, B, BenchError, Cluster, _log
else:  # run as a file
    from load import MIB, A, B, BenchError, Cluster, _log  # type: ignore[no-redef]

M: Final = "66001"
PHASES: Final = ("platform-silent", "platform-early", "platform-frames", "direct-idle", "direct-refused",
                 "direct-silent", "user-socket")
DOCS: Final = 200  # A's documents to B during each phase


@dataclass
class Phase:
    name: str
    target: str  # the process attacked: "P" or "B"
    bound: str  # what semq.settings.bounds promises, in words
    rss_limit: float  # MiB over the process's RSS before the flood that the phase must stay within
    fd_limit: int  # descriptors over those before
    attack: Callable[[], Awaitable[Any]]


class _Peak:
    """Samples one process's RSS and descriptors every 0.2 s on a thread."""

    def __init__(self, pid: int) -> None:
        from semq.testing.hostile import process_usage

        self.usage = process_usage
        self.pid = pid
        self.before = process_usage(pid)
        self.rss, self.fds = self.before.rss, self.before.fds
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                u = self.usage(self.pid)
            except OSError:
                return
            self.rss, self.fds = max(self.rss, u.rss), max(self.fds, u.fds)

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)


def _documents_meanwhile(c: Cluster, tag: str, out: list[float]) -> None:
    """A sends B ``DOCS`` documents; ``out`` gets the seconds until B holds them all."""
    from semq.node.api import NodeClient

    from .load import documents

    t0 = time.monotonic()
    before = c.count("B", "SELECT count(*) FROM inbox")
    with NodeClient(c.root / "A") as node:
        node.send_many(documents(0, DOCS, tag))
    end = t0 + 120
    while time.monotonic() < end:
        if c.count("B", "SELECT count(*) FROM inbox") - before >= DOCS:
            out.append(time.monotonic() - t0)
            return
        time.sleep(0.2)
    out.append(float("inf"))


def _user_socket_flood(path: Path, n: int, size: int, seconds: float) -> tuple[int, int]:
    """``n`` local connections streaming ``size`` bytes without a newline
    or a token: (connections the node closed, bytes it took)."""
    closed, taken = 0, 0
    lock = threading.Lock()

    def one() -> None:
        nonlocal closed, taken
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(seconds)
        sent = 0
        try:
            s.connect(str(path))
            block = b"x" * 65536
            end = time.monotonic() + seconds
            while sent < size and time.monotonic() < end:
                sent += s.send(block)
        except OSError:
            with lock:
                closed += 1
        finally:
            s.close()
            with lock:
                taken += sent

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 10)
    return closed, taken


def run_flood(a: argparse.Namespace, tmp: Path) -> tuple[list[list[str]], list[str], bool]:
    from semq.settings.config import load_config, write_config
    from semq.testing import hostile
    from semq.testing.hostile import Identity

    if a.security != "on":
        raise BenchError("the flood needs security (the listeners' bounds start at the TLS handshake)")
    c = Cluster(tmp, secure=True)
    c.cli("node", "init", "--dir", "M", "--org", M, "--platform", f"127.0.0.1:{c.port}", "--enroll-from", "P")
    cfg = load_config(tmp / "B")
    import dataclasses

    write_config(dataclasses.replace(cfg, direct_listen="127.0.0.1:0", direct_from=A))
    n = a.connections
    wanted = a.phases or list(PHASES)
    rows: list[list[str]] = []
    problems: list[str] = []
    try:
        c.start("P")
        c.start("A")
        c.start("B")
        warm: list[float] = []
        _documents_meanwhile(c, "W", warm)  # every process warm, certificates exchanged
        if warm[0] == float("inf"):
            raise BenchError("A's first documents did not reach B")
        st: dict[str, Any] = {}
        import json

        def direct_port() -> int:
            nonlocal st
            st = json.loads((tmp / "B" / "status.json").read_text())
            return int(str((st.get("direct") or {}).get("listening")).rpartition(":")[2])

        from .load import wait_for

        bport = wait_for(lambda: _try(direct_port), 30, "B's direct-link listener")
        m = Identity.of(tmp / "M")
        host = "127.0.0.1"
        user_sock = tmp / "B" / "user.sock"
        phases = [
            Phase("platform-silent", "P", "max_handshakes 256 waiting for HELLO; fd_reserve 64", 64, 300,
                  lambda: hostile.silent_connections(host, c.port, n, hold=12)),
            Phase("platform-early", "P", "64 KiB before HELLO", 64, 100,
                  lambda: hostile.big_first_frames(host, c.port, m, "platform", 64, 60 * MIB, seconds=10,
                                                   direct=False)),
            Phase("platform-frames", "P", "4 connections of one organization; 96 MiB buffered for it", 200, 100,
                  lambda: hostile.big_frames_in_sessions(host, c.port, m, "platform", B, 16, 60 * MIB, seconds=20)),
            Phase("direct-idle", "B", "4 links of one organization; 256 in all", 64, 64,
                  lambda: hostile.idle_links(host, bport, Identity.of(tmp / "A"), B, n, hold=10)),
            Phase("direct-refused", "B", "direct_from checked before a frame is read", 40, 64,
                  lambda: hostile.big_first_frames(host, bport, m, B, 8, 60 * MIB, seconds=10)),
            Phase("direct-silent", "B", "32 links in their handshake; fd_reserve 64", 64, 100,
                  lambda: hostile.silent_connections(host, bport, n, hold=12, tls=m.direct_tls)),
            Phase("user-socket", "B", "4 KiB before the token; 64 connections", 64, 100,
                  lambda: trio.to_thread.run_sync(_user_socket_flood, user_sock, 50, 16 * MIB, 15.0)),
        ]
        for ph in phases:
            if ph.name not in wanted:
                continue
            pid = c.pid(ph.target)
            if pid is None:
                raise BenchError(f"{ph.target} is not running before phase {ph.name}")
            _log(f"phase {ph.name}")
            peak = _Peak(pid)
            took: list[float] = []
            sender = threading.Thread(target=_documents_meanwhile, args=(c, ph.name[:3].upper(), took))
            sender.start()
            t0 = time.monotonic()
            try:
                result = trio.run(ph.attack)
            finally:
                sender.join(timeout=180)
                peak.close()
            spent = time.monotonic() - t0
            c.alive()
            grew = (peak.rss - peak.before.rss) / MIB
            more_fds = peak.fds - peak.before.fds
            line = result.line() if hasattr(result, "line") else f"{result[0]} closed by the node, {result[1] / MIB:.1f} MiB taken"
            docs = took[0] if took else float("inf")
            rows.append([ph.name, f"{'P' if ph.target == 'P' else 'B'}: RSS {peak.before.rss / MIB:,.0f} -> "
                         f"{peak.rss / MIB:,.0f} MiB (+{grew:,.0f}), fds {peak.before.fds} -> {peak.fds}",
                         ph.bound, f"{docs:.1f} s" if docs != float("inf") else "NOT DELIVERED", line])
            _log(f"  {rows[-1][1]}; {line}; A's {DOCS} documents in {docs:.1f} s; flood {spent:.0f} s")
            if grew > ph.rss_limit:
                problems.append(f"{ph.name}: RSS grew by {grew:.0f} MiB (allowed {ph.rss_limit:.0f})")
            if more_fds > ph.fd_limit:
                problems.append(f"{ph.name}: {more_fds} descriptors more (allowed {ph.fd_limit})")
            if docs == float("inf"):
                problems.append(f"{ph.name}: A's documents did not reach B within 120 s")
            time.sleep(2)  # (the listener's closings settle before the next phase measures)
    finally:
        c.stop_all()
    notes = [f"--connections {n}; each phase: A sends B {DOCS} documents through the platform meanwhile.",
             "bounds: semq.settings.bounds (docs/security.md, \"Bounds\"); RSS peaks sampled every 0.2 s.",
             "2 vCPUs shared with other work: figures move by +-20-30 %."]
    notes += [f"FAILED: {p}" for p in problems]
    return rows, notes, not problems


def _try(f: Callable[[], Any]) -> Any:
    try:
        return f()
    except (OSError, ValueError):
        return None


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    f = sub.add_parser("flood", parents=[common], help="hostile floods at every listener, beside the bounds")
    f.add_argument("--connections", type=int, default=2000, help="connections of the many-connection phases")
    f.add_argument("--phases", nargs="*", choices=PHASES, help="phases to run (default: all)")


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench flood ...`` is ``scripts/bench load flood ...``."""
    if __package__:
        from .load import main as load_main
    else:
        from load import main as load_main  # type: ignore[no-redef]
    return load_main(["flood", *(argv or [])])
