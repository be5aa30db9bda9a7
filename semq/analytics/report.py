"""Render a :class:`~.tables.ReportData`: one self-contained HTML file, a terminal
summary, and CSV + Parquet of every table. No Spark here.

The HTML file has inline CSS and inline SVG (:mod:`.charts`), no script and no
external reference, so it opens offline and can be mailed as it is.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any, Final

from . import charts
from .charts import fmt_duration
from .events import format_ms
from .tables import ReportData, Table

__all__ = ["render_html", "render_text", "write_report", "write_tables"]

HTML_STUCK_ROWS: Final = 200
HTML_FAILED_ROWS: Final = 100
HTML_PAIR_ROWS: Final = 200
HEATMAP_MAX_PARTIES: Final = 40
# Above this many hours the time chart uses days (one point per hour gets unreadable).
HOURS_IN_CHART: Final = 24 * 14

_CSS: Final = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#555;font-size:12px}
.card.warn b{color:#b00020}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.note{color:#555;font-size:12px;max-width:900px}
.scroll{overflow-x:auto}
"""

# Columns shown in the HTML for aggregate tables (CSV/Parquet have all).
_AGG_COLUMNS: Final = (
    "messages", "confirmed", "stuck", "failed", "e2e_ms_p50", "e2e_ms_p90", "e2e_ms_p99",
    "e2e_ms_max", "delivery_ms_p50", "delivery_ms_p90", "delivery_ms_p99", "dwell_ms_p90",
    "resend_rate", "duplicates_suppressed", "per_minute",
)
# The by_path table in the HTML: the headline latencies per link.
_PATH_COLUMNS: Final = (
    "path", "messages", "confirmed", "delivered", "failed", "stuck",
    *[f"{leg}_{q}" for leg in ("e2e_ms", "delivery_ms") for q in ("p50", "p90", "p99", "max")],
)


# ---------------------------------------------------------------- files


def write_tables(data: ReportData, out_dir: str | Path) -> list[Path]:
    """Write ``NAME.csv`` and ``NAME.parquet`` for every table; return the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrow_types = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(),
                   "bool": pa.bool_()}
    written = []
    for table in data.tables.values():
        csv_path = out / f"{table.name}.csv"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(table.columns)
            w.writerows(table.rows)
        schema = pa.schema([(c, arrow_types[t]) for c, t in zip(table.columns, table.types, strict=True)])
        columns = list(zip(*table.rows, strict=True)) if table.rows else [() for _ in table.columns]
        arrow = pa.table(
            [pa.array(list(col), type=schema.field(i).type) for i, col in enumerate(columns)],
            schema=schema,
        )
        pq_path = out / f"{table.name}.parquet"
        pq.write_table(arrow, pq_path)
        written += [csv_path, pq_path]
    return written


def write_report(data: ReportData, out_dir: str | Path) -> Path:
    """Write report.html and every table as CSV and Parquet into `out_dir`; return the HTML path."""
    out = Path(out_dir)
    write_tables(data, out)
    html_path = out / "report.html"
    tmp = html_path.with_suffix(".html.tmp")
    tmp.write_text(render_html(data), encoding="utf-8")
    os.replace(tmp, html_path)  # a reader never sees half a report
    return html_path


# ---------------------------------------------------------------- formatting


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if column.endswith("rate"):
            return f"{value * 100:.2f}%"
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        if column.endswith("_ms") or "_ms_" in column:
            return fmt_duration(value)
        if column in ("since", "t0", "failed_at"):
            return format_ms(value)
        return f"{value:,}"
    return str(value)


def _html_table(table: Table, columns: Sequence[str] | None = None, limit: int | None = None) -> str:
    cols = [c for c in (columns or table.columns) if c in table.columns]
    idx = [table.columns.index(c) for c in cols]
    left = {c for c, t in zip(table.columns, table.types, strict=True) if t == "string"}
    head = "".join(f'<th class="{"l" if c in left else ""}">{escape(c)}</th>' for c in cols)
    rows = table.rows if limit is None else table.rows[:limit]
    body = []
    for row in rows:
        tds = "".join(
            f'<td class="{"l" if c in left else ""}">{escape(_cell(c, row[i]))}</td>'
            for c, i in zip(cols, idx, strict=True)
        )
        body.append(f"<tr>{tds}</tr>")
    more = ""
    if limit is not None and len(table.rows) > limit:
        more = (f'<p class="note">{len(table.rows) - limit:,} more rows in '
                f"{escape(table.name)}.csv / {escape(table.name)}.parquet</p>")
    desc = f'<p class="note">{escape(table.description)}</p>' if table.description else ""
    return (f'{desc}<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>{more}')


def _pct(part: int, whole: int) -> str:
    return f"{part / whole * 100:.1f}%" if whole else "-"


def _summary(data: ReportData) -> dict[str, Any]:
    overall = data["overall"].dicts()[0]
    return {
        "messages": overall["messages"],
        "confirmed": overall["confirmed"],
        "delivered": overall["delivered"],
        "failed": overall["failed"],
        "best_effort": overall["best_effort"],
        "in_flight": overall["in_flight"],
        "stuck": overall["stuck"],
        "e2e": (overall["e2e_ms_p50"], overall["e2e_ms_p90"], overall["e2e_ms_p99"]),
        "delivery": (overall["delivery_ms_p50"], overall["delivery_ms_p90"], overall["delivery_ms_p99"]),
        "resend_rate": overall["resend_rate"],
        "duplicates": overall["duplicates_suppressed"],
        "per_minute": overall["per_minute"],
    }


def _window_text(meta: dict[str, Any]) -> str:
    return f"{format_ms(meta.get('window_start_ms'))} to {format_ms(meta.get('window_end_ms'))} UTC"


# ---------------------------------------------------------------- HTML


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document (inline CSS and SVG, no URLs)."""
    meta = data.meta
    s = _summary(data)
    n = s["messages"]
    cards = [
        ("messages", f"{n:,}", ""),
        ("confirmed end to end", f"{s['confirmed']:,}", _pct(s["confirmed"], n)),
        ("delivered (no ACK2 asked)", f"{s['delivered']:,}", _pct(s["delivered"], n)),
        ("not delivered", f"{s['failed']:,}", _pct(s["failed"], n)),
        ("best effort", f"{s['best_effort']:,}", ""),
        ("in flight", f"{s['in_flight']:,}", ""),
        ("stuck", f"{s['stuck']:,}", f"older than {fmt_duration(meta.get('stuck_after_ms'))}"),
        ("end to end p50 / p90 / p99", " / ".join(fmt_duration(v) or "-" for v in s["e2e"]), "queued → ACK2"),
        ("delivery p50 / p90 / p99", " / ".join(fmt_duration(v) or "-" for v in s["delivery"]), "queued → inbox"),
        ("resend rate", f"{(s['resend_rate'] or 0) * 100:.2f}%", "messages sent more than once"),
        ("duplicates suppressed", f"{s['duplicates']:,}", ""),
        ("throughput", f"{s['per_minute']:,.1f}/min", ""),
    ]
    card_html = "".join(
        f'<div class="card{" warn" if label == "stuck" and s["stuck"] else ""}">'
        f"<b>{escape(value)}</b><span>{escape(label)}{'<br>' + escape(sub) if sub else ''}</span></div>"
        for label, value, sub in cards
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>SEMQ delivery latency report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>SEMQ delivery latency report</h1>",
        f'<p class="meta">Messages queued {escape(_window_text(meta))} · state as of '
        f"{escape(format_ms(meta.get('as_of_ms')))} UTC · {meta.get('events', 0):,} events from "
        f"{escape(str(meta.get('inputs', '')))} · {meta.get('malformed_events', 0):,} malformed lines "
        f"skipped · reference clock {escape(str(meta.get('reference_clock')))} · generated "
        f"{escape(format_ms(meta.get('generated_at')))} UTC</p>",
        f'<div class="cards">{card_html}</div>',
    ]
    parts += ["<h2>Latency over time</h2>", _time_charts(data)]
    parts += ["<h2>Where the time goes</h2>", _html_table(data["legs"])]
    parts += ["<h2>Source &times; target</h2>", _pair_heatmap(data)]
    parts += ["<h2>Latency distribution</h2>", _histograms(data)]
    stuck = data["stuck"]
    parts.append(f"<h2>Stuck messages ({len(stuck):,})</h2>")
    if len(stuck):
        places: dict[str, int] = {}
        for p in stuck.column("place"):
            places[p] = places.get(p, 0) + 1
        parts.append(charts.bar_chart(sorted(places.items()), "Stuck messages by place"))
        parts.append(_html_table(stuck, limit=HTML_STUCK_ROWS))
    else:
        parts.append('<p class="note">None: every reliable message older than the threshold was '
                     "confirmed, delivered or reported as not delivered.</p>")
    for name, columns, limit in (
        ("by_save_fwd", None, None),
        ("by_path", _PATH_COLUMNS, None),
        ("by_appkey", None, None),
        ("by_pair", None, HTML_PAIR_ROWS),
        ("by_day", None, None),
        ("by_hour", None, None),
    ):
        t = data[name]
        keys = [c for c in t.columns if c not in _aggregate_columns(t)]
        parts += [f"<h2>{escape(t.title)}</h2>",
                  _html_table(t, columns or [*keys, *_AGG_COLUMNS], limit)]
    failed = data["failed"]
    parts += [f"<h2>{escape(failed.title)} ({len(failed):,})</h2>",
              _html_table(failed, limit=HTML_FAILED_ROWS)]
    parts += ["<h2>Clocks</h2>", _html_table(data["clock_skew"]), _CLOCK_NOTE]
    parts += [f"<h2>{escape(data['offline'].title)}</h2>", _html_table(data["offline"])]
    parts += [f"<h2>{escape(data['loggers'].title)}</h2>", _html_table(data["loggers"])]
    parts.append(
        '<p class="note">Every table is also in this folder as NAME.csv and NAME.parquet, '
        "with all columns (p50/p90/p99/max of every leg).</p></body></html>"
    )
    return "\n".join(parts)


_CLOCK_NOTE: Final = (
    '<p class="note">Each leg is measured on one clock where it can be (the origin\'s '
    "queued → ACK2, the platform's dwell, the receiver's received → inbox). Legs between two "
    "parties (sent → platform received, platform → target, queued → inbox) are moved to the "
    "reference clock with the offsets above and clamped at 0; the <i>clamped</i> column of "
    '"Where the time goes" counts how often that happened. Offsets come from causal order: '
    "the smallest observed difference each way bounds the offset, the midpoint is the "
    "estimate, half the width its uncertainty.</p>"
)


def _aggregate_columns(t: Table) -> set[str]:
    first_metric = t.columns.index("messages")
    return set(t.columns[first_metric:])


def _time_charts(data: ReportData) -> str:
    table = data["by_hour"] if len(data["by_hour"]) <= HOURS_IN_CHART else data["by_day"]
    rows = table.dicts()
    key = table.columns[0]
    labels = [str(r[key])[5:] if key == "hour" else str(r[key]) for r in rows]
    out = []
    for metric, title in (("e2e_ms", "End to end (queued → ACK2), per " + key),
                          ("delivery_ms", "Delivery (queued → inbox), per " + key)):
        out.append(charts.line_chart(
            labels,
            {f"p{p}": [r[f"{metric}_p{p}"] for r in rows] for p in (50, 90, 99)},
            title,
        ))
    return "".join(f"<div>{o}</div>" for o in out)


def _pair_heatmap(data: ReportData) -> str:
    rows = data["by_pair"].dicts()
    volume: dict[str, int] = {}
    for r in rows:
        volume[r["source"]] = volume.get(r["source"], 0) + r["messages"]
        volume[r["target"]] = volume.get(r["target"], 0) + r["messages"]
    parties = sorted(volume, key=lambda p: (-volume[p], p))[:HEATMAP_MAX_PARTIES]
    keep = set(parties)
    sources = sorted({r["source"] for r in rows} & keep)
    targets = sorted({r["target"] for r in rows} & keep)
    cells_e2e = {(r["source"], r["target"]): (r["e2e_ms_p90"], r["messages"]) for r in rows}
    cells_del = {(r["source"], r["target"]): (r["delivery_ms_p90"], r["messages"]) for r in rows}
    note = ""
    if len(volume) > HEATMAP_MAX_PARTIES:
        note = (f'<p class="note">The {HEATMAP_MAX_PARTIES} busiest of {len(volume)} parties; '
                "all pairs are in by_pair.csv.</p>")
    return (
        f"<div>{charts.heatmap(sources, targets, cells_e2e, 'p90 end to end (queued → ACK2)')}</div>"
        f"<div>{charts.heatmap(sources, targets, cells_del, 'p90 delivery (queued → inbox)')}</div>"
        + note
    )


def _histograms(data: ReportData) -> str:
    hist = data["histogram"].dicts()
    out = []
    for k, (metric, title) in enumerate((("e2e_ms", "End to end (queued → ACK2)"),
                                         ("delivery_ms", "Delivery (queued → inbox)"))):
        bins = [(r["low_ms"], r["high_ms"], r["messages"]) for r in hist if r["metric"] == metric]
        out.append(charts.histogram(bins, title, color=charts.PALETTE[k]))
    return "".join(f"<div>{o}</div>" for o in out)


# ---------------------------------------------------------------- text


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


def render_text(data: ReportData, top: int = 10) -> str:
    """A terminal summary: counts, where the time goes, SaveFwd modes, paths, slowest pairs, stuck."""
    meta = data.meta
    s = _summary(data)
    n = s["messages"]
    out = [
        "SEMQ delivery latency report",
        f"messages queued {_window_text(meta)}, state as of {format_ms(meta.get('as_of_ms'))} UTC",
        f"{meta.get('events', 0):,} events from {meta.get('inputs')}; "
        f"{meta.get('malformed_events', 0):,} malformed lines skipped",
        "",
        f"messages {n:,}: confirmed {s['confirmed']:,} ({_pct(s['confirmed'], n)}), "
        f"delivered without ACK2 {s['delivered']:,}, not delivered {s['failed']:,}, "
        f"best effort {s['best_effort']:,}, in flight {s['in_flight']:,}, "
        f"STUCK {s['stuck']:,}",
        "end to end p50/p90/p99: " + " / ".join(fmt_duration(v) or "-" for v in s["e2e"])
        + "    delivery p50/p90/p99: " + " / ".join(fmt_duration(v) or "-" for v in s["delivery"]),
        f"resend rate {(s['resend_rate'] or 0) * 100:.2f}%, duplicates suppressed "
        f"{s['duplicates']:,}, throughput {s['per_minute']:,.1f} messages/min",
        "",
        "Where the time goes",
        _text_table(
            ["leg", "clock", "n", "p50", "p90", "p99", "max", "clamped"],
            [[r["label"], r["clock"], f"{r['messages']:,}", fmt_duration(r["p50_ms"]),
              fmt_duration(r["p90_ms"]), fmt_duration(r["p99_ms"]), fmt_duration(r["max_ms"]),
              str(r["clamped"])] for r in data["legs"].dicts()],
        ),
        "",
        "Per SaveFwd mode",
        _text_table(
            ["save_fwd", "messages", "stuck", "e2e p50", "e2e p90", "e2e p99", "dwell p90"],
            [[str(r["save_fwd"]), f"{r['messages']:,}", f"{r['stuck']:,}",
              fmt_duration(r["e2e_ms_p50"]), fmt_duration(r["e2e_ms_p90"]),
              fmt_duration(r["e2e_ms_p99"]), fmt_duration(r["dwell_ms_p90"])]
             for r in data["by_save_fwd"].dicts()],
        ),
        "",
        "Latency by path (direct link or platform relay)",
        _text_table(
            ["path", "messages", *[f"{leg} {q}" for leg in ("e2e", "delivery")
                                   for q in ("p50", "p90", "p99", "max")]],
            [[r["path"], f"{r['messages']:,}",
              *[fmt_duration(r[f"{leg}_ms_{q}"]) for leg in ("e2e", "delivery")
                for q in ("p50", "p90", "p99", "max")]]
             for r in data["by_path"].dicts()],
        ),
        "",
        f"Slowest pairs (p90 end to end, top {top})",
    ]
    pairs = sorted(
        data["by_pair"].dicts(), key=lambda r: -(r["e2e_ms_p90"] or r["delivery_ms_p90"] or 0)
    )[:top]
    out.append(_text_table(
        ["source → target", "messages", "e2e p50", "e2e p90", "delivery p90", "stuck"],
        [[f"{r['source']} → {r['target']}", f"{r['messages']:,}", fmt_duration(r["e2e_ms_p50"]),
          fmt_duration(r["e2e_ms_p90"]), fmt_duration(r["delivery_ms_p90"]), f"{r['stuck']:,}"]
         for r in pairs],
    ))
    stuck = data["stuck"].dicts()
    out += ["", f"Stuck messages: {len(stuck):,} (no confirmation after "
                f"{fmt_duration(meta.get('stuck_after_ms'))})"]
    if stuck:
        places: dict[str, int] = {}
        for r in stuck:
            places[r["place"]] = places.get(r["place"], 0) + 1
        out.append("  " + ", ".join(f"{p} {c:,}" for p, c in sorted(places.items())))
        out.append(_text_table(
            ["lk0", "source → target", "place", "since (UTC)", "age"],
            [[r["lk0"], f"{r['source']} → {r['target']}", r["place"], r["since_utc"],
              fmt_duration(r["age_ms"])] for r in stuck[:top]],
        ))
    skew = [r for r in data["clock_skew"].dicts() if r["method"] != "reference"]
    if skew:
        out += ["", f"Clock offsets against {meta.get('reference_clock')}"]
        out.append(_text_table(
            ["logger", "offset", "±", "method"],
            [[r["logger"], f"{r['offset_ms']:+,} ms",
              "" if r["uncertainty_ms"] is None else f"{r['uncertainty_ms']:,} ms", r["method"]]
             for r in skew],
        ))
    return "\n".join(out) + "\n"
