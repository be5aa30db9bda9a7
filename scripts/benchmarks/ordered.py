#!/usr/bin/env python3
"""Ordered channel beside unordered traffic: docs/s, ratio and CPU per document, A -> platform -> B, one run.

Each variant is ``scripts/bench e2e``'s online phase at full load
(``e2e.phase_online``: real ``semq ... run`` processes on 127.0.0.1, fresh
stores per phase, N 1 KiB documents accepted into A's store with
``NodeClient.send_many``, 1000 per transaction, *before* A's daemon starts;
docs/s = N / (A's first ``sent`` -> A's last ``ack2``), B's inbox checked to
hold each document once), SaveFwd=3, Ack2 on, security off unless
``--security on`` (e2e's default), A and B one unit each. Only the documents
differ:

- **unordered**: e2e's documents.
- **ordered**: the same documents, all in one ordered channel A -> B
  (``send_many(..., ordered="BENCH")``: each carries an envelope naming the
  one before it; the receiver hands them over in that order).
- **ordered, held** (``--held-every K``, default 4; 0 leaves it out): the
  same channel, every K-th document at priority 1. A sends priority first
  (its claims take ``ORDER BY priority DESC, id``), so those documents reach
  B ahead of the ones they follow and B holds them (table
  ``channel_held``) until those come: N/K documents held and released.
  This is the one reordering of the real path a benchmark can cause on
  purpose; the others (a copy sent again after a lost frame or a restart,
  the platform storing for B over its high-water mark while later documents
  pass, a direct link coming up mid-channel) come from failures or
  overload. Every ordered phase counts B's ``held`` events, so one of those
  would show there too.

After each ordered phase B's inbox is checked to hold the channel's
documents in send order (inbox ids ascending with the record ids) and
nothing left in ``channel_held``, else the run fails.

The variants are interleaved: each of ``--repeat`` rounds runs each variant
once, in an order rotated round by round, so a neighbour on the shared
machine hits them alike. The ratio ordered / unordered is taken per round
(the two phases of one round ran a few seconds apart) and its median is the
figure; the ratio of the median rates is printed beside it. CPU us/doc is
user+system CPU of each daemon during the phase / N (from /proc): A the
origin, B the receiver, P the platform.

Usage: scripts/bench ordered [--count N] [--repeat R] [--held-every K]
                             [--security off|on] [--synchronous MODE]
                             [--phase-timeout S] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

if __package__:
    from . import e2e
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/ordered.py
    import e2e  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]

DEFAULT_REPEAT: Final = 5
DEFAULT_HELD_EVERY: Final = 4
CHANNEL: Final = "BENCH"
AIM: Final = 0.8  # ordered docs/s >= 80% of unordered docs/s (a note, never a test)
VARIANTS: Final = ("unordered", "ordered", "held")
ROLES: Final = ("A", "P", "B")  # origin, platform, receiver


def label(variant: str, held_every: int) -> str:
    if variant == "held":
        return f"ordered, every {held_every}th at priority 1 (held)"
    return "ordered (one channel)" if variant == "ordered" else "unordered"


def _log(msg: str) -> None:
    print(f"[ordered] {msg}", file=sys.stderr, flush=True)


def inspect_channel(n: int) -> Any:
    """The check of an ordered phase (``e2e.phase_online``'s ``inspect``):
    B's inbox holds the channel's ``n`` documents in send order, nothing is
    left held; returns how many were held on the way (B's ``held`` events)."""

    def check(c: e2e.Cluster) -> dict[str, Any]:
        rids = [r for (r,) in c.rows("B", f"SELECT record_id FROM inbox WHERE channel='{CHANNEL}' ORDER BY id")]
        left = c.rows("B", "SELECT count(*) FROM channel_held")[0][0]
        out_of_order = sum(x >= y for x, y in itertools.pairwise(rids))
        if len(rids) != n or out_of_order or left:
            raise e2e.BenchError(f"channel {CHANNEL} at B: {len(rids)} of {n} in the inbox, {out_of_order} out of"
                                 f" send order, {left} still held")
        held = e2e.events(c.root / "B" / "events", ["held"])["held"]
        return {"held": len(held), "in_order": True}

    return check


def documents_of(variant: str, held_every: int) -> e2e.Documents:
    if variant == "unordered":
        return e2e.documents
    return functools.partial(e2e.documents, ordered=CHANNEL,
                             priority_every=held_every if variant == "held" else 0)


def variants(a: argparse.Namespace) -> tuple[str, ...]:
    return VARIANTS if a.held_every else VARIANTS[:2]


def measure(a: argparse.Namespace, base: Path) -> dict[str, list[dict[str, Any]]]:
    """Every variant once per round, ``a.repeat`` rounds, the order rotated
    round by round; fresh processes and stores for each phase."""
    names = variants(a)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
    for r in range(a.repeat):
        tmp = base / f"round{r + 1}"
        tmp.mkdir()
        k = r % len(names)
        for v in names[k:] + names[:k]:
            _log(f"round {r + 1}/{a.repeat}: {label(v, a.held_every)}, {a.count} documents")
            row = e2e.phase_online(tmp, a.count, a, name=v, docs=documents_of(v, a.held_every),
                                   inspect=None if v == "unordered" else inspect_channel(a.count))
            row["round"] = r + 1
            runs[v].append(row)
    return runs


def ratios(runs: dict[str, list[dict[str, Any]]], variant: str) -> list[float]:
    """docs/s of ``variant`` / unordered, per round."""
    by_round = {x["round"]: x["rate"] for x in runs["unordered"]}
    return [x["rate"] / by_round[x["round"]] for x in runs[variant] if x["round"] in by_round]


def _cpu(row: dict[str, Any], who: str) -> float | None:
    if who == "total":
        parts = [row["cpu"].get(k) for k in ROLES]
        return None if any(p is None for p in parts) else sum(float(p) for p in parts if p is not None)
    v = row["cpu"].get(who)
    return None if v is None else float(v)


def med_cpu(rows: list[dict[str, Any]], who: str) -> float | None:
    vals = [v for r in rows if (v := _cpu(r, who)) is not None]
    return statistics.median(vals) if vals else None


def report(a: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], seconds: float) -> tuple[
        list[list[str]], list[str]]:
    """The table's rows and notes."""
    f = e2e._f
    rows = []
    for v, rs in runs.items():
        rx = ratios(runs, v)
        held = e2e._med(rs, "held")
        rows.append([label(v, a.held_every), f"{rs[0]['docs']:,}", f(e2e._med(rs, "seconds"), ".2f"),
                     f(e2e._med(rs, "rate")), f"{statistics.median(rx):.2f}x" if rx else "-",
                     f(e2e._med(rs, "p50"), ".0f"), f(e2e._med(rs, "p99"), ".0f"),
                     *(f(med_cpu(rs, who), ".0f") for who in (*ROLES, "total")),
                     "-" if v == "unordered" else f(held)])
    per_round = "; ".join(f"{v} " + ", ".join(f"{x['rate']:,.0f}" for x in rs) for v, rs in runs.items())
    cpu_round = "; ".join(f"{v} " + ", ".join(f(_cpu(x, 'total'), '.0f') for x in rs) for v, rs in runs.items())
    notes = [
        f"1 KiB documents, SaveFwd=3, Ack2 on, security {'on' if a.secure else 'off'}; SQLite"
        f" synchronous={a.synchronous}, WAL; A and B one unit each; {a.repeat} round(s), each variant once per"
        f" round in a rotated order; medians; {seconds:.0f} s in all; {e2e.code_version()}.",
        f"Each phase is scripts/bench e2e's online phase at full load: N documents accepted into A's store"
        f" before A starts; docs/s = N / (A's first 'sent' -> A's last 'ack2'). ordered = all N in one channel"
        f" A -> B ({CHANNEL})"
        + (f"; held = the same channel with every {a.held_every}th document at priority 1: A sends priority"
           " first, so B receives those before the ones they follow and holds them until those come."
           if a.held_every else "."),
        "x unordered = median over rounds of (docs/s of the variant / docs/s of unordered in the same round)."
        " CPU us/doc = user+system CPU of each daemon during the phase / N: A origin, P platform, B receiver."
        " held = B's 'held' events (documents that arrived before the one they follow).",
        "Checked after every ordered phase: B's inbox holds the channel's N documents in send order, none"
        " left held; after every phase: each document once.",
        f"docs/s per round: {per_round}. CPU total us/doc per round: {cpu_round}.",
        "accept (NodeClient.send_many, 1000 per transaction, no daemon): "
        + ", ".join(f"{v} {f(e2e._med(rs, 'accept'))}/s" for v, rs in runs.items()) + ".",
    ]
    saved = {v: e2e._med(rs, "ack_save") or 0 for v, rs in runs.items()}
    if any(saved.values()):
        notes.append("stored by the platform although B was online (B's queue over its high-water mark; such a"
                     " document can reach B after later ones, and is then held if ordered), medians: "
                     + ", ".join(f"{v} {x:,.0f}" for v, x in saved.items()) + ".")
    base_cpu = {who: med_cpu(runs["unordered"], who) for who in (*ROLES, "total")}
    for v in list(runs)[1:]:
        rx = ratios(runs, v)
        if not rx:
            continue
        m = statistics.median(rx)
        of_medians = (e2e._med(runs[v], "rate") or 0) / (e2e._med(runs["unordered"], "rate") or 1)
        cpu_x = ", ".join(
            f"{who} {c / b:.2f}x" for who in (*ROLES, "total")
            if (c := med_cpu(runs[v], who)) is not None and (b := base_cpu[who]))
        notes.append(
            f"{label(v, a.held_every)} / unordered: docs/s {m:.2f}x (per round: {', '.join(f'{x:.2f}' for x in rx)};"
            f" of the medians {of_medians:.2f}x), aim >= {AIM:.0%}: {'met' if m >= AIM else 'NOT met'};"
            f" CPU per document {cpu_x}.")
    return rows, notes


HEADERS: Final = ["variant", "docs", "seconds", "docs/s", "x unordered", "p50 ms", "p99 ms", "CPU A us/doc",
                  "CPU P us/doc", "CPU B us/doc", "CPU total us/doc", "held"]


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every phase completed, 1 when one failed (timeout, lost,
    duplicated or misordered document), 2 on a usage error."""
    p = argparse.ArgumentParser(
        prog="scripts/bench ordered", description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Variants: unordered = scripts/bench e2e's documents; ordered = the same documents, all in one"
               " ordered channel A -> B; held = that channel with every K-th document at priority 1: A sends"
               " priority first, so those reach B before the documents they follow and B holds them until those"
               " come (the one way to make the real path reorder a channel on purpose; otherwise it takes a"
               " lost frame, a restart, the platform's high-water mark or a direct link coming up). Each"
               " variant is e2e's online phase at full load (N documents accepted before A starts; docs/s ="
               " N / first 'sent' -> last 'ack2' at A), security off by default as e2e's; B's inbox is checked"
               " to hold the channel in send order. The variants are interleaved round by round; the ratio"
               " ordered / unordered is the median of the rounds' ratios; CPU us/doc per daemon (A origin, P"
               " platform, B receiver). Details: scripts/benchmarks/ordered.py and docs/benchmarks.md.")
    p.add_argument("--count", type=int, default=e2e.DEFAULT_COUNT, help="documents per phase (default %(default)s)")
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT,
                   help="rounds, each running every variant once (default %(default)s)")
    p.add_argument("--held-every", type=int, default=DEFAULT_HELD_EVERY, metavar="K",
                   help="the held variant: every K-th ordered document at priority 1, so it arrives before the"
                        " ones it follows and is held (default %(default)s; 0: leave the variant out)")
    p.add_argument("--security", default="off", choices=["off", "on"],
                   help="TLS + end-to-end sealing and signatures (default off, as scripts/bench e2e)")
    p.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"],
                   help="SQLite synchronous mode of all three stores (default FULL)")
    p.add_argument("--phase-timeout", type=float, default=e2e.DEFAULT_PHASE_TIMEOUT,
                   help="limit of each wait, s (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the stores and logs")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.count < 2 or not 1 <= a.repeat <= 9 or not 0 <= a.held_every <= a.count:
        print("error: --count must be >= 2, --repeat 1..9 and --held-every 0..count", file=sys.stderr)
        return 2
    if a.held_every == 1:
        print("error: --held-every 1 puts every document at priority 1 (nothing is held); use 2 or more",
              file=sys.stderr)
        return 2
    a.secure = a.security == "on"
    a.pg = None
    t0 = time.monotonic()
    runs = e2e._in_scratch(a, "semq-bench-ordered-", lambda base: measure(a, base))
    if runs is None:
        return 1
    if a.json:
        print(json.dumps({"runs": runs, "ratios": {v: ratios(runs, v) for v in list(runs)[1:]}}, indent=1))
        return 0
    rows, notes = report(a, runs, time.monotonic() - t0)
    print_table("SEMQ ordered channel beside unordered traffic: A -> platform -> B, real processes on 127.0.0.1",
                HEADERS, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
