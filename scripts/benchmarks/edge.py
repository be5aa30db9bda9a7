"""AS2 edge vs SEMQ-to-SEMQ: documents/s and CPU per document, one run.

Two real nodes (and a platform) on 127.0.0.1, each the other's AS2 partner
too. Phase 1 sends N documents from A to B the SEMQ way (through the
platform, confirmed end to end); phase 2 sends N documents from A to B over
AS2 (signed, encrypted, a signed MDN each). For each: wall time from the
first accept to the last confirmation, documents/s, and the CPU seconds the
two node processes used per document (user + system, /proc). Security on
for SEMQ (mutual TLS, signed and sealed documents), as in production.

    scripts/bench edge [-n 300] [--size 2048]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._proc import cpu_seconds, terminate

ROOT = Path(__file__).resolve().parents[2]


def _semq(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "semq", *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"semq {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path, ready: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "semq", *args], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                         cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while ready not in log.read_text(errors="replace"):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{args[:2]} did not start: {log.read_text()[-500:]}")
        time.sleep(0.1)
    return p


def _count(db: Path, sql: str) -> int:
    c = sqlite3.connect(db, timeout=30)
    try:
        return int(c.execute(sql).fetchone()[0])
    finally:
        c.close()


def _wait(pred: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench edge")
    ap.add_argument("-n", type=int, default=300, help="documents per phase")
    ap.add_argument("--size", type=int, default=2048, help="bytes per document")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from semq.node.api import NodeClient
    from semq.settings.config import load_config, write_config

    with tempfile.TemporaryDirectory(prefix="semq-bench-edge-") as t:
        tmp = Path(t)
        pport, eports = _port(), {"A": _port(), "B": _port()}
        _semq("platform", "init", "--dir", str(tmp / "P"))
        dirs = {"A": tmp / "56001", "B": tmp / "56002"}
        for name, org in (("A", "56001"), ("B", "56002")):
            _semq("node", "init", "--dir", str(dirs[name]), "--org", org, "--platform", f"127.0.0.1:{pport}",
                  "--enroll-from", str(tmp / "P"))
            cfg = load_config(dirs[name])
            write_config(dataclasses.replace(cfg, edge_listen=f"127.0.0.1:{eports[name]}"))
            (tmp / f"{name}.pem").write_text(_semq("partner", "cert", "--dir", str(dirs[name]), "-q"))
        for me, them in (("A", "B"), ("B", "A")):
            _semq("partner", "add", "--dir", str(dirs[me]), "--as2", f"SEMQ-{them}", "--url",
                  f"http://127.0.0.1:{eports[them]}/", "--cert", str(tmp / f"{them}.pem"), "--our-id", f"SEMQ-{me}",
                  "-q")
        procs = [_start(["platform", "run", "--dir", str(tmp / "P"), "--listen", f"127.0.0.1:{pport}"],
                        tmp / "P.log", "listening on")]
        nodes = {n: _start(["node", "run", "--dir", str(d)], tmp / f"{n}.log", "running") for n, d in dirs.items()}
        procs += nodes.values()
        body = os.urandom(a.size // 2).hex().encode()[:a.size]
        a_db = dirs["A"] / "node.sqlite"
        rows = []
        try:
            time.sleep(1.0)
            for phase in ("SEMQ-to-SEMQ", "AS2 edge"):
                cpu0 = {n: cpu_seconds(p.pid) or 0.0 for n, p in nodes.items()}
                t0 = time.monotonic()
                with NodeClient(dirs["A"]) as node:
                    if phase == "SEMQ-to-SEMQ":
                        node.send_many([{"to": "56002", "data": body, "data_type": "BENCH"} for _ in range(a.n)])
                    else:
                        for _ in range(a.n):
                            node.send_edge("as2:SEMQ-B", body, content_type="application/octet-stream")
                if phase == "SEMQ-to-SEMQ":
                    _wait(lambda: _count(a_db, "SELECT count(*) FROM outbox WHERE state != 4") == 0, 600)
                else:
                    _wait(lambda: _count(a_db, "SELECT count(*) FROM edge_out WHERE state IN (0, 1)") == 0, 1200)
                    failed = _count(a_db, "SELECT count(*) FROM edge_out WHERE state = 9")
                    if failed:
                        raise SystemExit(f"{failed} AS2 documents failed")
                wall = time.monotonic() - t0
                cpu = sum((cpu_seconds(p.pid) or 0.0) - cpu0[n] for n, p in nodes.items())
                rows.append((phase, a.n, wall, a.n / wall, cpu / a.n * 1000))
        finally:
            for p in procs:
                terminate(p, 5.0)
    print(f"{'path':<14} {'docs':>6} {'wall s':>8} {'docs/s':>8} {'CPU ms/doc (both nodes)':>24}")
    for phase, n, wall, rate, cpu in rows:
        print(f"{phase:<14} {n:>6} {wall:>8.2f} {rate:>8.1f} {cpu:>24.2f}")
    return 0
