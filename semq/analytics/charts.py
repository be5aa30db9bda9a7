"""Inline SVG charts for the HTML report, written by hand so the file opens offline.

No JavaScript and no external references: tooltips are SVG ``<title>``
elements, colours are literal. Latencies span milliseconds (forwarded at
once) to hours (stored for an offline target), so time axes are logarithmic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Final

__all__ = ["bar_chart", "fmt_duration", "heatmap", "histogram", "line_chart"]

PALETTE: Final = ("#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#9467bd", "#8c564b")
_FONT: Final = 'font-family="system-ui, sans-serif" font-size="11"'
# Tick values for log-scale duration axes, in ms.
_TICKS: Final = (
    1, 10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000, 21_600_000, 86_400_000,
    604_800_000,
)


def fmt_duration(ms: float | None) -> str:
    """12 ms, 1.5 s, 12.0 min, 3.2 h, 1.5 d; empty for None."""
    if ms is None:
        return ""
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.1f} min"
    if ms < 86_400_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"


def _log(v: float) -> float:
    return math.log10(max(v, 1.0))


def _log_axis(lo: float, hi: float) -> tuple[float, float, list[float]]:
    a = math.floor(_log(lo))
    b = max(math.ceil(_log(hi)), a + 1)
    ticks = [float(t) for t in _TICKS if a <= _log(t) <= b]
    return float(a), float(b), ticks


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (
        # Inline SVG in HTML needs no xmlns; leaving it out keeps the file free of URLs.
        f'<svg role="img" aria-label="{escape(label)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" {_FONT}>'
        + "".join(body)
        + "</svg>"
    )


def _empty(width: int, height: int, title: str) -> str:
    return _svg(width, height, [
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">'
        f"{escape(title)}: no data</text>"
    ], title)


def line_chart(x_labels: Sequence[str], series: dict[str, Sequence[float | None]], title: str,
               width: int = 760, height: int = 280) -> str:
    """One line per series over categorical x (time buckets), log-scale duration y."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not x_labels or not values:
        return _empty(width, height, title)
    left, right, top, bottom = 64, 110, 24, 46
    pw, ph = width - left - right, height - top - bottom
    a, b, ticks = _log_axis(min(values), max(values))

    def x(i: int) -> float:
        return left + (pw * i / (len(x_labels) - 1) if len(x_labels) > 1 else pw / 2)

    def y(v: float) -> float:
        return top + ph - (_log(v) - a) / (b - a) * ph

    body = [f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for t in ticks:
        yy = y(t)
        body.append(f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e4e4e4"/>')
        body.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{fmt_duration(t)}</text>')
    step = max(1, math.ceil(len(x_labels) / 8))
    for i in range(0, len(x_labels), step):
        body.append(
            f'<text x="{x(i):.1f}" y="{top + ph + 16}" text-anchor="middle">{escape(x_labels[i])}</text>'
        )
    body.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for k, (name, vs) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        segment: list[str] = []
        for i, v in enumerate(vs):
            if v is None:
                if len(segment) > 1:
                    body.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{" ".join(segment)}"/>')
                segment = []
                continue
            segment.append(f"{x(i):.1f},{y(v):.1f}")
            body.append(
                f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2" fill="{color}">'
                f"<title>{escape(name)} {escape(x_labels[i])}: {fmt_duration(v)}</title></circle>"
            )
        if len(segment) > 1:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{" ".join(segment)}"/>')
        ly = top + 12 + 16 * k
        body.append(f'<rect x="{left + pw + 12}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        body.append(f'<text x="{left + pw + 26}" y="{ly + 1}">{escape(name)}</text>')
    return _svg(width, height, body, title)


def _heat_color(frac: float) -> str:
    # Light yellow (fast) to dark red (slow).
    lo, hi = (255, 247, 188), (189, 0, 38)
    r, g, b = (round(lo[i] + (hi[i] - lo[i]) * frac) for i in range(3))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(sources: Sequence[str], targets: Sequence[str],
            cells: dict[tuple[str, str], tuple[float | None, int]], title: str,
            max_cell: int = 28) -> str:
    """Source rows x target columns coloured by a latency (log scale); count in the tooltip."""
    values = [v for v, _ in cells.values() if v is not None]
    if not sources or not targets or not values:
        return _empty(520, 120, title)
    cell = max(10, min(max_cell, 640 // max(len(targets), 1)))
    label_w = 8 + 7 * max(len(s) for s in sources)
    label_h = 8 + 6 * max(len(t) for t in targets)
    top = 24 + label_h
    width = label_w + cell * len(targets) + 150
    height = top + cell * len(sources) + 20
    lo, hi = _log(min(values)), _log(max(values))
    span = hi - lo or 1.0
    body = [f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>']
    for j, t in enumerate(targets):
        cx = label_w + j * cell + cell / 2
        body.append(
            f'<text transform="translate({cx:.1f},{top - 6}) rotate(-60)">{escape(t)}</text>'
        )
    for i, s in enumerate(sources):
        cy = top + i * cell
        body.append(f'<text x="{label_w - 6}" y="{cy + cell / 2 + 4:.1f}" text-anchor="end">{escape(s)}</text>')
        for j, t in enumerate(targets):
            v, n = cells.get((s, t), (None, 0))
            x0 = label_w + j * cell
            if n == 0:
                fill = "#f7f7f7"
            elif v is None:
                fill = "#d9d9d9"
            else:
                fill = _heat_color((_log(v) - lo) / span)
            tip = f"{s} → {t}: {n} messages" + (f", {fmt_duration(v)}" if v is not None else "")
            body.append(
                f'<rect x="{x0}" y="{cy}" width="{cell - 1}" height="{cell - 1}" fill="{fill}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    # Legend: five steps from fastest to slowest.
    lx = label_w + cell * len(targets) + 20
    body.append(f'<text x="{lx}" y="{top - 6}">source ↓ target →</text>')
    for k in range(5):
        frac = k / 4
        v = 10 ** (lo + frac * span)
        yy = top + k * 18
        body.append(f'<rect x="{lx}" y="{yy}" width="14" height="14" fill="{_heat_color(frac)}"/>')
        body.append(f'<text x="{lx + 20}" y="{yy + 11}">{fmt_duration(v)}</text>')
    return _svg(width, max(height, top + 100), body, title)


def histogram(bins: Sequence[tuple[int, int, int]], title: str, width: int = 760,
              height: int = 240, color: str = PALETTE[0]) -> str:
    """Bars for (low_ms, high_ms, count) bins on a log-scale duration axis."""
    bins = [b for b in bins if b[2] > 0]
    if not bins:
        return _empty(width, height, title)
    left, right, top, bottom = 56, 16, 24, 40
    pw, ph = width - left - right, height - top - bottom
    a, b, ticks = _log_axis(max(bins[0][0], 1), bins[-1][1])
    peak = max(n for _, _, n in bins)

    def x(v: float) -> float:
        return left + (_log(v) - a) / (b - a) * pw

    body = [f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for t in ticks:
        body.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{fmt_duration(t)}</text>')
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
    for lo_ms, hi_ms, n in bins:
        x0, x1 = x(max(lo_ms, 1)), x(max(hi_ms, 1))
        h = ph * n / peak
        body.append(
            f'<rect x="{x0:.1f}" y="{top + ph - h:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{fmt_duration(lo_ms)} to {fmt_duration(hi_ms)}: '
            f"{n} messages</title></rect>"
        )
    body.append(f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{peak}</text>')
    body.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#999"/>')
    return _svg(width, height, body, title)


def bar_chart(items: Sequence[tuple[str, float]], title: str, width: int = 520) -> str:
    """Horizontal bars with their value, e.g. stuck messages per place."""
    if not items:
        return _empty(width, 80, title)
    label_w = 8 + 7 * max(len(k) for k, _ in items)
    bar_h, top = 20, 24
    height = top + bar_h * len(items) + 8
    peak = max(v for _, v in items) or 1
    pw = width - label_w - 70
    body = [f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>']
    for i, (label, v) in enumerate(items):
        yy = top + i * bar_h
        w = pw * v / peak
        body.append(f'<text x="{label_w - 6}" y="{yy + 14}" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{label_w}" y="{yy + 3}" width="{w:.1f}" height="{bar_h - 6}" fill="{PALETTE[2]}"/>')
        body.append(f'<text x="{label_w + w + 6:.1f}" y="{yy + 14}">{v:g}</text>')
    return _svg(width, height, body, title)
