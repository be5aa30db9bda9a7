"""A tiny aligned text table for benchmark output, headed by the machine's
facts (figures mean little without them: MEASUREMENTS.md saw ±20-30% between
passes on the 2-vCPU machine)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from collections.abc import Sequence

__all__ = ["machine_facts", "print_table", "render_table"]


def machine_facts() -> str:
    """One line: CPU count, Python version and implementation, OS, UTC date."""
    cpus = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    py = f"{platform.python_implementation()} {platform.python_version()}"
    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{usable} of {cpus} CPUs, {py}, {platform.system()} {platform.machine()}, {when}"


def _is_number(text: str) -> bool:
    t = text.replace(",", "").replace("_", "").rstrip("x%").strip()
    try:
        float(t)
    except ValueError:
        return False
    return True


def render_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]],
                 notes: Sequence[str] = (), facts: bool = True) -> str:
    """``title``, the machine's facts (unless ``facts`` is False: a report
    of several tables says them once), then the rows under ``headers``.
    Columns whose cells are all numbers (or empty / "-") are right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells for {len(headers)} headers")
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    right = [
        bool(cells) and all(_is_number(r[i]) or r[i] in ("", "-") for r in cells)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "  ".join(parts).rstrip()

    out = [title, *([machine_facts()] if facts else []), "", line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    if notes:
        out.append("")
        out += list(notes)
    return "\n".join(out)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]],
                notes: Sequence[str] = (), facts: bool = True) -> None:
    print(render_table(title, headers, rows, notes, facts), file=sys.stdout, flush=True)
