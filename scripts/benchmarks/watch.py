#!/usr/bin/env python3
"""semq watch: how soon a closed file is sent and an arrived document written, and a folder's backlog.

Real processes on 127.0.0.1 (a platform, nodes A and B, security on, as
tests/_procs.py starts them) and two watchers: ``semq watch --outbox`` on
A (``--settle 1``) and ``semq watch --inbox`` on B (``--interval 10``: the
node wakes it, the interval does not). Figures:

- **backlog**: ``--files`` files of 1 KiB already in the outbox folder,
  older than the settle time: seconds from the watcher's start (its
  start-up included) until all are in ``sent/``.
- **close -> sent/**: one file written and closed every 0.3 s
  (``--singles`` of them): from its close until it is in ``sent/``
  (median and max, ms).
- **burst**: ``--files`` files written and closed in a loop while watched:
  seconds from the first written until all are in ``sent/``, and how long
  the writer took beside the watcher.
- **commit -> inbox folder**: ``--singles`` documents sent to B one at a
  time: from B's inbox commit (``received_ms``) until the file's
  modification time in B's inbox folder (median and max, ms).

Usage: scripts/bench watch [--files N] [--singles N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench watch", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--singles", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from semq.node.api import NodeClient
    from tests._procs import Cluster, Proc, wait_until

    a, b = "10008", "56001"
    root = Path(tempfile.mkdtemp(prefix="semq-bench-watch-"))
    c = Cluster(root)
    got: dict[str, Any] = {"files": args.files, "singles": args.singles, "load": os.getloadavg()[0]}
    try:
        for org in (a, b):
            c.add_org(org)
        c.start_platform()
        c.start_node(a)
        c.start_node(b)
        out, inbox = root / "out", root / "in"
        out.mkdir()
        inbox.mkdir()
        for i in range(args.files):
            (out / f"P-{i:05d}.xml").write_bytes(os.urandom(1024))
        time.sleep(1.2)  # older than the settle time
        t0 = time.monotonic()
        c.procs["watchA"] = Proc("watchA", ["watch", "--dir", str(root / a), "--outbox", str(out), "--to", b,
                                            "--type", "X", "--key-from-name", "--settle", "1"],
                                 root / "watchA.log", "watching", timeout=30)
        wait_until(lambda: len(os.listdir(out / "sent")) == args.files, 300, "the backlog sent", interval=0.01)
        got["backlog_s"] = time.monotonic() - t0

        lat = []
        for i in range(args.singles):
            time.sleep(0.3)
            p = out / f"L-{i:03d}.xml"
            with open(p, "wb") as f:
                f.write(b"<x/>" * 100)
            t = time.monotonic()
            wait_until(lambda p=p: (out / "sent" / p.name).exists(), 30, "sent", interval=0.002)
            lat.append((time.monotonic() - t) * 1000)
        got["close_to_sent_ms"] = {"median": statistics.median(lat), "max": max(lat)}

        t = time.monotonic()
        for i in range(args.files):
            with open(out / f"N-{i:05d}.xml", "wb") as f:
                f.write(os.urandom(1024))
        written = time.monotonic() - t
        total = 2 * args.files + args.singles
        wait_until(lambda: len(os.listdir(out / "sent")) == total, 300, "the burst sent", interval=0.01)
        got["burst_s"] = time.monotonic() - t
        got["burst_writer_s"] = written

        c.procs["watchB"] = Proc("watchB", ["watch", "--dir", str(root / b), "--inbox", str(inbox),
                                            "--interval", "10"], root / "watchB.log", "watching", timeout=30)
        wait_until(lambda: len(os.listdir(inbox)) >= total + 1, 600, "B's inbox folder filled", interval=0.1)
        lags = []
        with NodeClient(root / a) as node:
            for i in range(args.singles):
                node.send(b, b"<d/>", data_type="Y", key=f"Z-{i}")
                [f] = wait_until(lambda i=i: [p for p in inbox.iterdir() if p.name.startswith(f"Z-{i}__")], 30,
                                 "the document in the inbox folder", interval=0.005)
                received = c.q(b, "SELECT received_ms FROM inbox WHERE key=?", f"Z-{i}")[0][0]
                lags.append(f.stat().st_mtime_ns / 1e6 - received)
                time.sleep(0.2)
        got["commit_to_inbox_file_ms"] = {"median": statistics.median(lags), "max": max(lags)}
    finally:
        c.stop_all()
    if args.json:
        print(json.dumps(got))
        return 0
    print(f"load average at the start: {got['load']:.1f}")
    print(f"backlog of {args.files} files: all in sent/ {got['backlog_s']:.2f} s after the watcher started")
    m = got["close_to_sent_ms"]
    print(f"close -> sent/: median {m['median']:.0f} ms, max {m['max']:.0f} ms ({args.singles} files)")
    print(f"burst of {args.files} files (written in {got['burst_writer_s']:.2f} s): all in sent/"
          f" {got['burst_s']:.2f} s after the first")
    m = got["commit_to_inbox_file_ms"]
    print(f"commit -> inbox folder (--interval 10): median {m['median']:.0f} ms, max {m['max']:.0f} ms"
          f" ({args.singles} documents)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
