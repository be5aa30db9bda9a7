"""Compare the tables of two `semq report latency --out DIR` directories.

Usage: python scripts/compare_reports.py DIR_A DIR_B

Every table (NAME.csv) must have the same columns and rows in both; the only
differences allowed are the p50/p90/p99 columns of groups of more than 1,000
messages, which come from KLL sketches that compact at random (within their
rank error, docs/analytics.md). Prints one line per table and exits 1 when
anything else differs.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

EXACT_UP_TO = 1_000  # semq.analytics.jobs.SKETCH_K: groups this small are exact
_PERCENTILES = ("_p50", "_p90", "_p99", "p50_ms", "p90_ms", "p99_ms")


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def compare(a: Path, b: Path) -> int:
    """Print the differences table by table; return how many are not allowed."""
    names = sorted(p.stem for p in a.glob("*.csv"))
    other = sorted(p.stem for p in b.glob("*.csv"))
    if names != other:
        print(f"different tables: {names} / {other}")
        return 1
    bad = 0
    for name in names:
        ra, rb = _rows(a / f"{name}.csv"), _rows(b / f"{name}.csv")
        if ra[:1] != rb[:1] or len(ra) != len(rb):
            print(f"{name}: columns or row count differ ({len(ra) - 1} / {len(rb) - 1} rows)")
            bad += 1
            continue
        head = ra[0]
        sketched = {i for i, c in enumerate(head) if c.endswith(_PERCENTILES)}
        count = head.index("messages") if "messages" in head else None
        exact = approx = 0
        for x, y in zip(ra[1:], rb[1:], strict=True):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                if u == v:
                    continue
                if i in sketched and count is not None and int(x[count]) > EXACT_UP_TO:
                    approx += 1
                    continue
                exact += 1
                if exact <= 5:
                    print(f"{name}: {head[i]} {u!r} / {v!r} in row {x[:3]}")
        bad += exact
        print(f"{name}: {len(ra) - 1} rows, {exact} differences, "
              f"{approx} KLL percentiles of groups over {EXACT_UP_TO:,} differ")
    print("same tables" if not bad else f"{bad} differences")
    return bad


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    return 1 if compare(Path(argv[0]), Path(argv[1])) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
