"""Spark latency report, end to end: generated logs of N messages, JSON and Parquet.

Generates deterministic delivery logs with semq.analytics.synth (N messages
among K organizations over D days, about 11.6 events per message), compacts
them to Parquet with `semq report compact`, then times `semq report latency`
on each input in a fresh process (JVM start included, as a user runs it) and
prints a table. Generated data is kept under --cache and reused while the
parameters are the same. Issue 5's aim: <= 30 s for 1 M messages from Parquet.

Usage: scripts/bench analytics [--messages N] [--orgs K] [--days D] [--cache DIR]
                               [--only json|parquet] [--master URL]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/analytics.py
    from _table import print_table  # type: ignore[no-redef]

from semq.analytics.synth import DAY_MS, SynthConfig, generate

# The CLI as `semq report ...` would run it, without needing semq.cli.
_RUNNER = """
import argparse, sys
from semq.analytics import cli
p = argparse.ArgumentParser(prog="semq")
cli.register(p.add_subparsers(dest="command", required=True))
a = p.parse_args(sys.argv[1:])
sys.exit(a.func(a))
"""
_STAGE_RE = re.compile(r"\] (.+?): .*?([\d.]+) s$")


def _run(args: list[str]) -> tuple[float, dict[str, float], str]:
    """Run the CLI in a new process; (wall seconds, stage seconds, stderr)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _RUNNER, *args], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    stages = {}
    for line in proc.stderr.splitlines():
        m = _STAGE_RE.search(line)
        if m:
            stages[m.group(1)] = float(m.group(2))
    return wall, stages, proc.stderr


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench analytics", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--orgs", type=int, default=20)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "semq-bench-analytics"))
    ap.add_argument("--only", choices=("json", "parquet"))
    ap.add_argument("--master", help="Spark master (default local[*])")
    a = ap.parse_args(argv)

    cfg = SynthConfig(messages=a.messages, orgs=a.orgs, seed=a.seed, duration_ms=a.days * DAY_MS)
    tag = f"m{a.messages}-o{a.orgs}-d{a.days}-s{a.seed}"
    json_dir = Path(a.cache) / f"json-{tag}"
    pq_dir = Path(a.cache) / f"parquet-{tag}"
    rows: list[list[object]] = []
    manifest = json_dir / "synth.json"
    if not manifest.exists():
        if json_dir.exists():
            raise SystemExit(f"error: {json_dir} is incomplete; remove it and run again")
        print(f"[bench] generating {a.messages:,} messages into {json_dir}", file=sys.stderr)
        t0 = time.monotonic()
        stats = generate(json_dir, cfg)
        rows.append(["generate (Python)", f"{stats.events:,}", f"{time.monotonic() - t0:.1f}", "-"])
    events = json.loads(manifest.read_text())["stats"]["events"]
    size_json = sum(p.stat().st_size for p in json_dir.rglob("*.jsonl"))
    master = ["--master", a.master] if a.master else []

    # Spark writes no _SUCCESS at the root of a dynamically overwritten dataset:
    # our own marker says the compaction finished.
    compacted = pq_dir / ".semq-bench-complete"
    if a.only != "json" and not compacted.exists():
        print(f"[bench] compacting into {pq_dir}", file=sys.stderr)
        wall, _, _ = _run(["report", "compact", "--logs", str(json_dir), "--out", str(pq_dir), *master])
        compacted.touch()
        rows.append(["compact JSON -> Parquet", f"{events:,}", f"{wall:.1f}", "-"])
    runs = [("json", json_dir), ("parquet", pq_dir)]
    for kind, path in runs:
        if a.only and a.only != kind:
            continue
        print(f"[bench] report latency on {kind}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as out:
            wall, stages, _ = _run(["report", "latency", "--logs", str(path), "--out", out, *master])
        detail = ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
        rows.append([f"report latency ({kind})", f"{events:,}", f"{wall:.1f}", detail])
    size_pq = sum(p.stat().st_size for p in pq_dir.rglob("*.parquet")) if pq_dir.exists() else 0
    print_table(
        f"semq report latency: {a.messages:,} messages, {a.orgs} orgs, {a.days} days",
        ["step", "events", "seconds", "stages (s)"],
        rows,
        notes=[
            f"JSON {size_json / 2**30:.2f} GiB, Parquet {size_pq / 2**20:.0f} MiB; "
            "seconds = wall time of a fresh process, JVM start included",
            "issue 5 aim: <= 30 s for 1,000,000 messages from Parquet",
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
