"""The tables of a latency report, made from collected rows on the driver.

Hashes become the names they stand for, hours and days become dates, and
each table gets its columns, types, title and description (what
:mod:`.report` renders; the tables are listed in docs/analytics.md
"Aggregates" and "Clock skew"). No Spark job runs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from .clocks import ClockOffset, OrderBound
from .events import format_ms
from .legs import LEG_NAMES, LEGS, OUTCOMES, PERCENTILES
from .periods import OfflinePeriod
from .sparkutil import DAY_MS, HOUR_MS
from .tables import Table

if TYPE_CHECKING:
    from .facts import _Facts

__all__: list[str] = []

def _name(names: dict[int, str], h: int | None) -> str:
    if h is None:
        return ""
    return names.get(int(h), f"#{h}")


_SPARK_TO_TABLE: Final = {
    "string": "string", "bigint": "long", "int": "long", "double": "double", "boolean": "bool",
    "float": "double", "smallint": "long", "tinyint": "long",
}


def _format_hour(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:00")


def _format_day(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


_AGG_TYPES: Final = {"messages": "long", "resend_rate": "double", "per_minute": "double"}


def _aggregate_table(name: str, title: str, keys: list[str], rows: list[dict[str, Any]],
                     window_start: int, window_end: int, names: dict[int, str],
                     description: str = "") -> Table:
    """count, outcomes, p50/p90/p99/max of every leg, resends, duplicates, throughput."""
    columns: list[str] = []
    types: list[str] = []
    for k in keys:
        columns.append(k.removesuffix("_h"))
        types.append("long" if k == "save_fwd" else "string")
    metrics = ["messages", *OUTCOMES]
    for leg in LEG_NAMES:
        metrics += [f"{leg}_p{round(p * 100)}" for p in PERCENTILES] + [f"{leg}_max"]
    metrics += ["resends", "resend_rate", "inquiries", "duplicates_suppressed", "redeliveries",
                "target_offline_max_ms", "first_ms", "last_ms", "per_minute"]
    columns += metrics
    types += [_AGG_TYPES.get(m, "long") for m in metrics]
    # Throughput: messages per minute over the part of the report window the
    # row covers (an hour or a day bucket, else the whole window).
    length = {"hour": HOUR_MS, "day": DAY_MS}.get(keys[0]) if keys else None
    out = []
    for d in rows:
        key_values: list[Any] = []
        for k in keys:
            v = d[k]
            if k.endswith("_h"):
                v = None if v is None else _name(names, v)
            elif k == "hour":
                v = _format_hour(v)
            elif k == "day":
                v = _format_day(v)
            key_values.append(v)
        if length is not None and d[keys[0]] is not None:
            start = int(d[keys[0]])
            span = min(start + length, window_end) - max(start, window_start)
        else:
            span = window_end - window_start
        messages = int(d["messages"])
        values: list[Any] = []
        for m in metrics:
            if m == "resend_rate":
                values.append(d["resent"] / messages if messages else 0.0)
            elif m == "per_minute":
                values.append(round(messages / max(span, 60_000) * 60_000, 3))
            else:
                v = d[m]
                values.append(None if v is None else int(v))
        out.append((*key_values, *values))
    # Sorted here: the keys are hashes in Spark and names only now.
    out.sort(key=lambda row: tuple((v is None, v) for v in row[:len(keys)]))
    return Table(name=name, title=title, columns=columns, types=types, rows=out,
                 description=description)


def _legs_table(overall: dict[str, Any]) -> Table:
    """The overall row reshaped: one row per leg ("where does the time go")."""
    rows = []
    for leg in LEGS:
        n = int(overall[f"{leg.name}__n"] or 0)
        total = overall[f"{leg.name}__sum"]
        rows.append((
            leg.name, leg.label, leg.clock, n,
            overall[f"{leg.name}_p50"], overall[f"{leg.name}_p90"], overall[f"{leg.name}_p99"],
            overall[f"{leg.name}_max"],
            None if not n or total is None else round(int(total) / n, 1),
            int(overall[f"clamped_{leg.name}"] or 0) if leg.clock == "cross" else 0,
            leg.description,
        ))
    return Table(
        name="legs", title="Where the time goes (all messages)",
        columns=["leg", "label", "clock", "messages", "p50_ms", "p90_ms", "p99_ms", "max_ms",
                 "mean_ms", "clamped", "meaning"],
        types=["string", "string", "string", "long", "long", "long", "long", "long", "double",
               "long", "string"],
        rows=rows,
    )


def _stuck_and_failed(stuck: list[Any], failed: list[Any], stuck_after_ms: int,
                      names: dict[int, str],
                      app_keys: dict[str, tuple[str | None, str | None]]) -> tuple[Table, Table]:
    def who(r: Any) -> tuple[Any, ...]:
        return (r.lk0, *[None if h is None else _name(names, h)
                         for h in (r.source_h, r.target_h, r.domain_h, r.data_type_h)],
                *app_keys.get(r.lk0, (None, None)), r.save_fwd)

    def when(ms: Any) -> str | None:
        return None if ms is None else format_ms(int(ms))

    head = ["lk0", "source", "target", "domain", "data_type", "subtype", "key", "save_fwd"]
    head_types = ["string"] * 7 + ["long"]
    return (
        Table(
            name="stuck", title="Stuck messages",
            columns=[*head, "place", "since_utc", "since", "age_ms", "resends", "inquiries",
                     "target_offline_ms", "evidence"],
            types=[*head_types, "string", "string", "long", "long", "long", "long", "long", "string"],
            rows=[(*who(r), r.place, when(r.since), r.since, r.age_ms, r.resends, r.inquiries,
                   r.target_offline_ms, r.evidence) for r in stuck],
            description=f"no end-to-end confirmation and older than {stuck_after_ms // 1000} s; "
            "place: where it is, since: when it got there (reference clock)",
        ),
        Table(
            name="failed", title="Not delivered (dropped, refused, expired, dead letters)",
            columns=[*head, "failure", "code", "at_utc", "evidence"],
            types=[*head_types, "string", "long", "string", "string"],
            rows=[(*who(r), r.failure, r.code, when(r.failed_at), r.evidence) for r in failed],
        ),
    )


@dataclass(kw_only=True)
class _MessageRows:
    """Every message with its legs, collected (tests and small logs)."""

    fields: list[Any]
    rows: list[Any]

    def table(self, names: dict[int, str]) -> Table:
        columns, types = [], []
        for f in self.fields:
            if f.name.endswith("_h") or f.name in ("hour", "day"):
                columns.append(f.name.removesuffix("_h"))
                types.append("string")
            else:
                columns.append(f.name)
                types.append(_SPARK_TO_TABLE.get(f.dataType.simpleString(), "string"))
        out = []
        for r in self.rows:
            row = []
            for f, v in zip(self.fields, r, strict=True):
                if f.name.endswith("_h"):
                    v = None if v is None else _name(names, v)
                elif f.name == "hour":
                    v = _format_hour(v)
                elif f.name == "day":
                    v = _format_day(v)
                row.append(v)
            out.append(tuple(row))
        return Table(name="messages", title="Per message", columns=columns, types=types, rows=out)


def _skew_table(offsets: dict[str, ClockOffset], bounds: list[OrderBound]) -> Table:
    rows = [
        (o.logger, o.reference, o.offset_ms, o.low_ms, o.high_ms,
         None if o.low_ms is None or o.high_ms is None else (o.high_ms - o.low_ms) // 2,
         o.samples, o.method, o.via or "")
        for o in sorted(offsets.values(), key=lambda o: (o.method != "reference", o.logger))
    ]
    return Table(
        name="clock_skew", title="Clock offsets (logger clock minus reference clock)",
        columns=["logger", "reference", "offset_ms", "low_ms", "high_ms", "uncertainty_ms",
                 "samples", "method", "via"],
        types=["string", "string", "long", "long", "long", "long", "long", "string", "string"],
        rows=rows,
        description="estimated from causal order (docs/analytics.md); cross-clock legs are "
        "corrected by these offsets and clamped at 0",
    )


def _offline_table(periods: list[OfflinePeriod], offsets: dict[str, ClockOffset], as_of: int) -> Table:
    by_node: dict[tuple[str, str], list[OfflinePeriod]] = {}
    for p in periods:
        by_node.setdefault((p.logger, p.node), []).append(p)
    rows = []
    for (logger, node), ps in sorted(by_node.items()):
        off = offsets[logger].offset_ms if logger in offsets else 0
        durations = [((p.end if p.end is not None else as_of + off) - p.start)
                     for p in ps if p.start is not None]
        still = next((p.start for p in ps if p.end is None and p.start is not None), None)
        rows.append((
            node, logger, len(durations), sum(durations), max(durations, default=0),
            format_ms(still - off) if still is not None else "",
        ))
    return Table(
        name="offline", title="Target offline time (platform's view)",
        columns=["node", "platform", "periods", "offline_ms", "longest_ms", "offline_since_utc"],
        types=["string", "string", "long", "long", "long", "string"], rows=rows,
        description="from node_offline/node_online; a node still offline counts until the end of the log",
    )


def _inputs_table(facts: _Facts, names: dict[int, str], offsets: dict[str, ClockOffset]) -> Table:
    rows = []
    for h in sorted(facts.lines, key=lambda h: _name(names, h)):
        logger = _name(names, h)
        last = facts.last.get(h)
        rows.append((
            logger, facts.messages.get(h, 0), facts.lines[h],
            format_ms(int(last)) if last is not None else "",
            offsets[logger].offset_ms if logger in offsets else 0,
        ))
    return Table(
        name="loggers", title="Logs read",
        columns=["logger", "messages", "events", "last_event_utc_own_clock", "clock_offset_ms"],
        types=["string", "long", "long", "string", "long"], rows=rows,
        description="events: lines read in the time window (exact duplicates included, "
        "cleanup events not read)",
    )
