"""Spark latency report, end to end: generated logs of N messages, JSON and Parquet.

Generates deterministic delivery logs with semq.analytics.synth (N messages
among K organizations over D days, about 11.6 events per message), compacts
them to Parquet with `semq report compact`, then times `semq report latency`
on each input in a fresh process (JVM start included, as a user runs it) and
prints a table. Generated data is kept under --cache and reused while the
parameters are the same. The aim: <= 30 s for 1 M messages from Parquet.

Beside each wall time: the CPU time of the report's JVM (all its threads, read
from /proc just before the session stops) and the 1-minute load average
before and after, because on a shared 2-core machine the wall time mostly
measures the neighbours. `--rounds N` runs every report N times;
`--baseline DIR` alternates each run with the same command run from another
source tree (e.g. `git archive <commit> | tar -x -C DIR`), for pairs of
old and new measured back to back; when that tree's benchmark names another
compacted layout (its `_LAYOUT`), its reports read a dataset compacted by
its own code (kept in the cache beside this one's), so each version reads
the layout it was written for. Runs are bounded (--timeout).

Usage: scripts/bench analytics [--messages N] [--orgs K] [--days D] [--cache DIR]
                               [--only json|parquet] [--master URL] [--rounds N]
                               [--baseline DIR] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
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

# The CLI as `semq report ...` would run it, without needing semq.cli. Before
# the session stops, the JVM's CPU time is read from /proc (the JVM is not a
# waited-for child of this process: rusage would not count it).
_RUNNER = """
import argparse, os, sys
import semq
from semq.analytics import cli, session
print(f"[bench] semq from {os.path.dirname(semq.__file__)}", file=sys.stderr, flush=True)
start = session.start_session
def timed_start(*args, **kwargs):
    spark, created = start(*args, **kwargs)
    pid = spark.sparkContext._gateway.proc.pid
    stop = spark.stop
    def timed_stop():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            print(f"[bench] jvm cpu {cpu:.1f} s", file=sys.stderr, flush=True)
        except (OSError, IndexError, ValueError):
            pass
        stop()
    spark.stop = timed_stop
    return spark, created
session.start_session = timed_start
p = argparse.ArgumentParser(prog="semq")
cli.register(p.add_subparsers(dest="command", required=True))
a = p.parse_args(sys.argv[1:])
sys.exit(a.func(a))
"""
_STAGE_RE = re.compile(r"\] (.+?): .*?([\d.]+) s$")
_CPU_RE = re.compile(r"^\[bench\] jvm cpu ([\d.]+) s$", re.MULTILINE)
_FROM_RE = re.compile(r"^\[bench\] semq from (.+)$", re.MULTILINE)
# Bumped when `compact` writes a different layout, so a dataset cached by an
# older version is not taken for the current one.
_LAYOUT = "v4"
_LAYOUT_RE = re.compile(r'^_LAYOUT = "([\w.-]+)"$', re.MULTILINE)


def _layout_of(tree: str | None) -> str:
    """The compacted layout tag of a source tree's benchmark (this one's: _LAYOUT)."""
    if tree is None:
        return _LAYOUT
    try:
        found = _LAYOUT_RE.search((Path(tree) / "scripts" / "benchmarks" / "analytics.py").read_text())
    except OSError:
        found = None
    if found is None:
        raise SystemExit(f"error: --baseline {tree} has no scripts/benchmarks/analytics.py naming its _LAYOUT")
    return found.group(1)


def _load() -> float:
    return os.getloadavg()[0]


def _run(args: list[str], *, source: str | None = None,
         timeout: float = 1800) -> tuple[float, dict[str, float], float | None, str]:
    """Run the CLI in a new process; (wall s, stage s, JVM CPU s, stderr).

    `source`: a source tree whose ``semq`` package is imported instead of the
    installed one.
    """
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    try:
        # -P: `python -c` would put the working directory first on sys.path,
        # before PYTHONPATH, and import whatever semq/ is there.
        proc = subprocess.run([sys.executable, "-P", "-c", _RUNNER, *args], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"error: {' '.join(args[:2])} took longer than {timeout:.0f} s") from None
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    stages = {}
    for line in proc.stderr.splitlines():
        m = _STAGE_RE.search(line)
        if m:
            stages[m.group(1)] = float(m.group(2))
    cpu = _CPU_RE.search(proc.stderr)
    origin = _FROM_RE.search(proc.stderr)
    if origin:
        print(f"[bench]   ran semq from {origin.group(1)}", file=sys.stderr)
    return wall, stages, float(cpu.group(1)) if cpu else None, proc.stderr


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench analytics", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--orgs", type=int, default=20)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "semq-bench-analytics"))
    ap.add_argument("--only", choices=("json", "parquet"))
    ap.add_argument("--master", help="Spark master (default local[*])")
    ap.add_argument("--rounds", type=int, default=1, help="run every report this many times")
    ap.add_argument("--baseline", metavar="DIR",
                    help="a source tree (holding semq/) to run alternately with this one")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per command")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit(f"error: --rounds {a.rounds}: must be at least 1")
    if a.baseline and not (Path(a.baseline) / "semq" / "__init__.py").exists():
        raise SystemExit(f"error: --baseline {a.baseline} holds no semq/ package")

    cfg = SynthConfig(messages=a.messages, orgs=a.orgs, seed=a.seed, duration_ms=a.days * DAY_MS)
    tag = f"m{a.messages}-o{a.orgs}-d{a.days}-s{a.seed}"
    json_dir = Path(a.cache) / f"json-{tag}"
    pq_dir = Path(a.cache) / f"parquet-{_LAYOUT}-{tag}"
    trees = [("this", None)] + ([("baseline", a.baseline)] if a.baseline else [])
    # The dataset each tree's reports read: compacted by that tree's code.
    pq_dirs = {source: Path(a.cache) / f"parquet-{_layout_of(source)}-{tag}" for _, source in trees}
    rows: list[list[object]] = []
    manifest = json_dir / "synth.json"
    if not manifest.exists():
        if json_dir.exists():
            raise SystemExit(f"error: {json_dir} is incomplete; remove it and run again")
        print(f"[bench] generating {a.messages:,} messages into {json_dir}", file=sys.stderr)
        t0 = time.monotonic()
        stats = generate(json_dir, cfg)
        rows.append(["generate (Python)", "", f"{stats.events:,}", f"{time.monotonic() - t0:.1f}",
                     "-", "-", "-"])
    events = json.loads(manifest.read_text())["stats"]["events"]
    size_json = sum(p.stat().st_size for p in json_dir.rglob("*.jsonl"))
    master = ["--master", a.master] if a.master else []

    # Spark writes no _SUCCESS at the root of a dynamically overwritten dataset:
    # our own marker says the compaction finished.
    for name, source in trees if a.only != "json" else []:
        target = pq_dirs[source]
        compacted = target / ".semq-bench-complete"
        if compacted.exists() or (source is not None and target == pq_dir):
            continue
        print(f"[bench] compacting into {target} ({name})", file=sys.stderr)
        load = _load()
        wall, stages, cpu, _ = _run(["report", "compact", "--logs", str(json_dir), "--out", str(target),
                                     *master], source=source, timeout=a.timeout)
        compacted.touch()
        detail = ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
        rows.append(["compact JSON -> Parquet", name, f"{events:,}", f"{wall:.1f}",
                     "-" if cpu is None else f"{cpu:.0f}", f"{load:.1f} -> {_load():.1f}", detail])
    for kind in ("json", "parquet"):
        if a.only and a.only != kind:
            continue
        for r in range(a.rounds):
            # Alternate which tree goes first, so neither always meets the
            # same neighbour's phase.
            for name, source in (trees if r % 2 == 0 else trees[::-1]):
                path = json_dir if kind == "json" else pq_dirs[source]
                print(f"[bench] report latency on {kind} ({name}, round {r + 1}, {path.name})",
                      file=sys.stderr)
                load = _load()
                with tempfile.TemporaryDirectory() as out:
                    wall, stages, cpu, _ = _run(
                        ["report", "latency", "--logs", str(path), "--out", out, *master],
                        source=source, timeout=a.timeout,
                    )
                detail = ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
                rows.append([f"report latency ({kind})", name, f"{events:,}", f"{wall:.1f}",
                             "-" if cpu is None else f"{cpu:.0f}", f"{load:.1f} -> {_load():.1f}",
                             detail])
    size_pq = sum(p.stat().st_size for p in pq_dir.rglob("*.parquet")) if pq_dir.exists() else 0
    print_table(
        f"semq report latency: {a.messages:,} messages, {a.orgs} orgs, {a.days} days",
        ["step", "code", "events", "seconds", "JVM CPU s", "load", "stages (s)"],
        rows,
        notes=[
            f"JSON {size_json / 2**30:.2f} GiB, Parquet {size_pq / 2**20:.0f} MiB (events and "
            "per-message partials); seconds = wall time of a fresh process, JVM start included",
            "load: 1-minute load average before -> after; code: this tree or --baseline",
            "aim: <= 30 s for 1,000,000 messages from Parquet",
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
