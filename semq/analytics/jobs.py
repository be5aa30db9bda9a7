"""The Spark side of the reports: read the logs, join each message's events, aggregate.

Shape of the work (what costs what, measured in scripts/benchmarks/analytics.py):

1. **One shuffle over the events**: group by LK0 across every log given. A
   group-by with conditional min/count aggregates is the join of the origin's,
   the platform's and the receiver's events for one message, without sorting
   three tables. The platform's connection events ride along as their own
   tiny groups so JSON input is parsed once.
2. The per-message table is cached; clock offsets (:mod:`.clocks`) and offline
   periods (:mod:`.periods`) are computed on the driver from small collected
   results and joined back with broadcasts.
3. The aggregates (per pair, AppKey, SaveFwd, hour, day, overall) are group-bys
   over the cached per-message table with ``percentile_approx``.

pyspark is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .clocks import ClockOffset, OrderBound, estimate_offsets
from .errors import ReportError
from .events import FIELD_NAMES, FIELDS, NODE_EVENTS, format_ms, spark_schema
from .inputs import JSON_SUFFIXES, Inputs
from .periods import offline_periods
from .tables import ReportData, Table

__all__ = [
    "FOLLOW_UP_MS",
    "LEGS",
    "OUTCOMES",
    "PLACES",
    "SKEW_MARGIN_MS",
    "Leg",
    "ReportOptions",
    "build_report",
    "compact",
    "load_events",
]

# Events this much before --since are read too: a message queued just after
# `since` on the reference clock may carry earlier stamps on a skewed clock.
SKEW_MARGIN_MS: Final = 3_600_000
# Events up to this long after --until are read to finish the legs of messages
# queued before `until` (stored for an offline target, confirmed later).
FOLLOW_UP_MS: Final = 86_400_000
PERCENTILES: Final = (0.5, 0.9, 0.99)
# percentile_approx accuracy: rank error at most 1/ACCURACY of the group (0.1%),
# exact for groups under ~500 values (the tests rely on that). Spark's default
# of 10,000 cost 40% more time here for precision no latency report needs.
ACCURACY: Final = 1_000
HIST_BINS_PER_DECADE: Final = 4
_NODE_KEY: Final = "~node|"
# String attributes carried through the per-message aggregation as 64-bit hashes:
# Spark's fast hash aggregation keeps only fixed-width values per group, and a
# string aggregate (first(), max()) forces a sort of every event instead. On
# 1 M messages / 11.6 M events in Parquet that was 32 s against 8 s. The
# distinct values are few and are read once to decode (:func:`_dictionary`).
_DICT_COLUMNS: Final = ("source", "target", "domain", "data_type", "logger")

OUTCOMES: Final = ("confirmed", "delivered", "failed", "best_effort", "in_flight", "stuck")
PLACES: Final = ("at_origin", "forwarded_not_received", "stored_at_platform", "delivered_unconfirmed")


@dataclass(frozen=True, slots=True)
class Leg:
    """One measured stretch of a message's way; `clock` is whose clock measures it."""

    name: str
    label: str
    clock: str  # origin | platform | receiver | cross
    description: str


LEGS: Final = (
    Leg("queue_ms", "queued → sent", "origin",
        "waiting in the origin's pending-send table (origin offline or busy)"),
    Leg("platform_ack_ms", "sent → platform ack", "origin",
        "first send until ACK_FWD/ACK_SAVE, including resends before it"),
    Leg("to_platform_ms", "sent → platform received", "cross",
        "origin to platform transit, skew-corrected, clamped at 0"),
    Leg("platform_ms", "platform received → forwarded/stored", "platform",
        "time inside the platform until it forwarded or stored"),
    Leg("dwell_ms", "stored → delivered", "platform",
        "platform dwell of stored copies (target offline)"),
    Leg("to_target_ms", "platform out → target received", "cross",
        "platform to target transit, skew-corrected, clamped at 0"),
    Leg("inbox_ms", "received → inbox", "receiver", "receiver hands the document to the applications"),
    Leg("target_ack_ms", "delivered → target ACK", "platform",
        "stored copy delivered until the target's ACK reached the platform"),
    Leg("confirm_ms", "platform ack → ACK2", "origin",
        "ACK_FWD/ACK_SAVE until the end-to-end ACK2 at the origin"),
    Leg("delivery_ms", "queued → inbox", "cross",
        "origin queue to the target's inbox, skew-corrected, clamped to [0, end to end]"),
    Leg("e2e_ms", "queued → ACK2 (end to end)", "origin",
        "queued until the end-to-end confirmation came back, on the origin's clock"),
)
LEG_NAMES: Final = tuple(leg.name for leg in LEGS)
_CROSS_LEGS: Final = tuple(leg.name for leg in LEGS if leg.clock == "cross")


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """What `semq report latency` was asked."""

    since_ms: int | None = None
    until_ms: int | None = None
    stuck_after_ms: int = 3_600_000
    progress: Callable[[str], None] = lambda _msg: None
    # Also collect the per-message table ("messages": legs, outcome, place of
    # every message). For tests and small logs: it brings every row to the driver.
    with_messages: bool = False


class _Stopwatch:
    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.start = self.last = time.monotonic()
        self.stages: dict[str, float] = {}

    def lap(self, stage: str, detail: str = "") -> None:
        now = time.monotonic()
        self.stages[stage] = round(now - self.last, 2)
        self.last = now
        self.progress(f"{stage}: {detail + ', ' if detail else ''}{self.stages[stage]:.1f} s")


# ---------------------------------------------------------------- reading


def _canonical(df: Any) -> Any:
    """The log columns in schema order and type; missing ones as nulls."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    return df.select(
        [
            (F.col(n).cast(t) if n in have else F.lit(None).cast(t)).alias(n)
            for n, _, t in FIELDS
        ]
    )


def _list_remote(spark: Any, url: str) -> tuple[list[str], list[str]]:
    """JSON files and Parquet dataset roots under a URL, through Hadoop's file systems."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(url)
    try:
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            raise ReportError(f"no such file or directory: {url}")
        if fs.getFileStatus(path).isFile():
            return ([], [url]) if url.endswith(".parquet") else ([url], [])
        files = fs.listFiles(path, True)
        json_files: list[str] = []
        parquet = False
        while files.hasNext():
            name = files.next().getPath().toString()
            if name.endswith(".parquet"):
                parquet = True
            elif name.endswith(JSON_SUFFIXES):
                json_files.append(name)
    except ReportError:
        raise
    except Exception as exc:  # py4j wraps the JVM's IOException
        raise ReportError(f"cannot list {url}: {str(exc).splitlines()[0]}") from exc
    if parquet:
        return [], [url]
    return json_files, []


def load_events(spark: Any, inputs: Inputs, since_ms: int | None = None,
                until_ms: int | None = None) -> Any:
    """One DataFrame of all log events (schema of docs/events.md), time-filtered.

    Events are kept from ``since - SKEW_MARGIN_MS`` to ``until + FOLLOW_UP_MS``.
    Raises :class:`ReportError` when a URL holds no logs.
    """
    from pyspark.sql import functions as F

    json_files = list(inputs.json_files)
    parquet_dirs = list(inputs.parquet_dirs)
    for url in inputs.remote:
        j, p = _list_remote(spark, url)
        if not (j or p):
            raise ReportError(f"no delivery logs (*.jsonl or Parquet) found in {url}")
        json_files += j
        parquet_dirs += p
    lo = None if since_ms is None else since_ms - SKEW_MARGIN_MS
    hi = None if until_ms is None else until_ms + FOLLOW_UP_MS
    frames = []
    if json_files:
        # The explicit schema saves Spark a full pass to infer one (issue 5).
        frames.append(spark.read.schema(spark_schema()).json(json_files))
    for d in parquet_dirs:
        df = spark.read.parquet(d)
        if "date" in df.columns:
            # Partition pruning: whole days outside the window are not read.
            if lo is not None:
                df = df.where(F.col("date") >= F.lit(_utc_date(lo - 86_400_000)))
            if hi is not None:
                df = df.where(F.col("date") <= F.lit(_utc_date(hi + 86_400_000)))
        frames.append(_canonical(df))
    events = functools.reduce(lambda a, b: a.unionByName(b), frames)
    if lo is not None:
        events = events.where(F.col("ts") >= lo)
    if hi is not None:
        events = events.where(F.col("ts") < hi)
    return events


def _utc_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date().isoformat()


# ---------------------------------------------------------------- per message


def _per_message(events: Any) -> Any:
    """Group all events by LK0: first time of every step, counts, attributes."""
    from pyspark.sql import functions as F

    role, event, ts = F.col("role"), F.col("event"), F.col("ts")

    def at(r: str, *evs: str) -> Any:
        return (role == r) & event.isin(*evs)

    def first(r: str, *evs: str) -> Any:
        return F.min(F.when(at(r, *evs), ts))

    def count(r: str, *evs: str) -> Any:
        return F.count(F.when(at(r, *evs), 1))

    def by_role(r: str, col: str) -> Any:
        return F.max(F.when(role == r, _hash(col)))

    failure_events = (
        at("origin", "nack", "expired", "dead") | at("platform", "dropped", "refused")
    )
    # Connection events have no LK0: each becomes its own tiny group, so the one
    # pass over the (possibly JSON) input also yields them.
    key = F.when(
        event.isin(*NODE_EVENTS) & F.col("node").isNotNull() & F.col("logger").isNotNull()
        & ts.isNotNull(),
        F.concat_ws("|", F.lit(_NODE_KEY[:-1]), F.col("logger"), F.col("node"), event,
                    ts.cast("string")),
    ).otherwise(F.col("lk0"))
    aggs = [
        first("origin", "queued").alias("o_queued"),
        first("origin", "sent").alias("o_sent"),
        first("origin", "ack_fwd").alias("o_ack_fwd"),
        first("origin", "ack_save").alias("o_ack_save"),
        first("origin", "ack2").alias("o_ack2"),
        first("origin", "nack").alias("o_nack"),
        first("origin", "expired").alias("o_expired"),
        first("origin", "dead").alias("o_dead"),
        count("origin", "sent").alias("o_sends"),
        count("origin", "resend").alias("o_resends"),
        count("origin", "inquiry").alias("o_inquiries"),
        first("platform", "received").alias("p_received"),
        first("platform", "forwarded").alias("p_forwarded"),
        first("platform", "stored").alias("p_stored"),
        first("platform", "dropped").alias("p_dropped"),
        first("platform", "refused").alias("p_refused"),
        first("platform", "delivered").alias("p_delivered"),
        first("platform", "acked").alias("p_acked"),
        count("platform", "received").alias("p_receptions"),
        count("platform", "delivered").alias("p_deliveries"),
        count("platform", "inquiry").alias("p_inquiries"),
        first("receiver", "received").alias("r_received"),
        first("receiver", "inbox").alias("r_inbox"),
        first("receiver", "ack2_sent").alias("r_ack2_sent"),
        first("receiver", "reack2").alias("r_reack2"),
        count("receiver", "duplicate").alias("r_duplicates"),
        F.max(F.when(failure_events, F.col("code"))).alias("code"),
        by_role("origin", "logger").alias("o_lh"),
        by_role("platform", "logger").alias("p_lh"),
        by_role("receiver", "logger").alias("r_lh"),
        F.count(F.when(role == "origin", 1)).alias("o_events"),
        F.count(F.when(role == "platform", 1)).alias("p_events"),
        F.count(F.when(role == "receiver", 1)).alias("r_events"),
        F.max(F.when(role == "origin", ts)).alias("o_last"),
        F.max(F.when(role == "platform", ts)).alias("p_last"),
        F.max(F.when(role == "receiver", ts)).alias("r_last"),
        F.min(ts).alias("first_ts"),
        F.count(F.lit(1)).alias("events"),
        F.count(
            F.when(ts.isNull() | event.isNull() | role.isNull() | F.col("logger").isNull(), 1)
        ).alias("bad"),
        # Every message event carries the same attributes; max() picks the one
        # value (booleans: true if any event says so).
        F.max("save_fwd").alias("save_fwd"),
        F.max("ack2").alias("ack2"),
        F.max("reliable").alias("reliable"),
    ] + [F.max(_hash(col)).alias(f"{col}_h") for col in _DICT_COLUMNS if col != "logger"]
    return events.groupBy(key.alias("k")).agg(*aggs)


def _hash(col: str) -> Any:
    """A string column as its 64-bit hash (null stays null), decoded by :func:`_dictionary`."""
    from pyspark.sql import functions as F

    return F.when(F.col(col).isNotNull(), F.xxhash64(F.col(col)))


def _dictionary(events: Any) -> dict[int, str]:
    """Hash → string for the few distinct parties, loggers and AppKey types in the logs."""
    from pyspark.sql import functions as F

    values = (
        events.select(F.explode(F.array(*[F.col(c) for c in _DICT_COLUMNS])).alias("v"))
        .where(F.col("v").isNotNull())
        .distinct()
        .select("v", F.xxhash64("v").alias("h"))
        .collect()
    )
    return {int(r.h): r.v for r in values}


def _order_bounds(messages: Any, names: dict[int, str]) -> list[OrderBound]:
    """Causal pairs per message → the smallest time difference per logger pair."""
    from pyspark.sql import functions as F

    c = F.col
    o, p, r = c("o_lh"), c("p_lh"), c("r_lh")
    pairs = [
        # (earlier party, later party, later ts - earlier ts); each pair is a
        # cause and its effect (SPEC "The flow"), first occurrences only: the
        # first effect cannot precede the first cause.
        (o, p, c("p_received") - c("o_sent")),
        (p, o, F.least(c("o_ack_fwd"), c("o_ack_save")) - F.least(c("p_forwarded"), c("p_stored"))),
        (p, o, c("o_nack") - c("p_dropped")),
        (p, r, c("r_received") - F.least(c("p_forwarded"), c("p_delivered"))),
        (r, p, c("p_acked") - c("r_inbox")),
        (o, r, c("r_received") - c("o_sent")),
        (r, o, c("o_ack2") - c("r_ack2_sent")),
        (o, r, c("r_reack2") - c("o_ack2")),
    ]
    samples = messages.select(
        F.explode(
            F.array(*[
                F.struct(a.alias("a"), b.alias("b"), d.cast("long").alias("d"))
                for a, b, d in pairs
            ])
        ).alias("s")
    ).select("s.*").where(
        F.col("a").isNotNull() & F.col("b").isNotNull() & F.col("d").isNotNull()
        & (F.col("a") != F.col("b"))
    )
    rows = samples.groupBy("a", "b").agg(F.min("d").alias("d"), F.count(F.lit(1)).alias("n")).collect()
    return [OrderBound(_name(names, row.a), _name(names, row.b), int(row.d), int(row.n))
            for row in rows]


def _name(names: dict[int, str], h: int | None) -> str:
    if h is None:
        return ""
    return names.get(int(h), f"#{h}")


# ---------------------------------------------------------------- the report


def build_report(spark: Any, inputs: Inputs, options: ReportOptions | None = None) -> ReportData:
    """Run every job of `semq report latency` and collect the tables.

    Raises :class:`ReportError` when the logs hold no message in the window.
    """
    from pyspark.sql import functions as F

    opts = options or ReportOptions()
    watch = _Stopwatch(opts.progress)
    events = load_events(spark, inputs, opts.since_ms, opts.until_ms)
    names = _dictionary(events)
    watch.lap("read attributes", f"{len(names)} distinct parties, loggers and AppKey types")
    # localCheckpoint keeps the rows as they are (memory, spilling to disk);
    # persist() would first build compressed column batches, which measured
    # several times slower on this 1 M-row, 50-column table.
    grouped = _per_message(events).localCheckpoint(eager=True)
    is_node = F.col("k").startswith(_NODE_KEY)
    messages = grouped.where(F.col("k").isNotNull() & ~is_node).withColumnRenamed("k", "lk0")

    # Per-logger facts.
    role_cols = [(f"{r}_lh", f"{r}_events", f"{r}_last") for r in ("o", "p", "r")]
    per_role = [
        messages.select(F.col(h).alias("lh"), F.col(n).alias("n"), F.col(last).alias("last"))
        for h, n, last in role_cols
    ]
    per_logger = [
        (_name(names, r.lh), int(r.messages), int(r.events), r.last)
        for r in functools.reduce(lambda x, y: x.unionByName(y), per_role)
        .where(F.col("lh").isNotNull() & (F.col("n") > 0))
        .groupBy("lh")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("n").alias("events"),
             F.max("last").alias("last"))
        .collect()
    ]
    totals = grouped.agg(
        F.sum(F.when(F.col("k").isNull(), F.col("events")).otherwise(F.col("bad"))).alias("bad"),
        F.sum("events").alias("events"),
        F.count(F.when(F.col("k").isNotNull() & ~is_node, 1)).alias("messages"),
    ).first()
    n_events = int(totals["events"] or 0)
    watch.lap("join events by LK0", f"{n_events:,} events, {int(totals['messages'] or 0):,} messages")
    if not totals["messages"]:
        grouped.unpersist()
        raise ReportError("the logs hold no message events in the time window")

    node_events = []
    for row in grouped.where(is_node).select("k", "first_ts").collect():
        # k = "~node|<platform logger>|<node>|<event>|<ts>"
        parts = row.k.split("|")
        if len(parts) >= 5 and row.first_ts is not None:
            node_events.append((parts[1], "|".join(parts[2:-2]), int(row.first_ts), parts[-2]))
    periods = offline_periods(node_events)

    bounds = _order_bounds(messages, names)
    loggers = {lg for lg, *_ in per_logger}
    offsets = estimate_offsets(bounds, loggers)
    watch.lap("clock offsets", f"{len(offsets)} clocks, {len(periods)} offline periods")

    last_by_logger = {lg: int(last) for lg, _m, _e, last in per_logger if last is not None}
    for lg, _node, ts, _ev in node_events:
        last_by_logger[lg] = max(last_by_logger.get(lg, ts), ts)
    as_of = max(
        (last - (offsets[lg].offset_ms if lg in offsets else 0) for lg, last in last_by_logger.items()),
        default=0,
    )

    detail = _derive(spark, messages, offsets, periods, as_of, opts).localCheckpoint(eager=True)
    counted = detail.count()
    grouped.unpersist()
    watch.lap("legs per message", f"{counted:,} messages in the window")
    if counted == 0:
        detail.unpersist()
        raise ReportError("no message was queued in the time window")

    report = ReportData()
    window_start = opts.since_ms
    window_end = opts.until_ms if opts.until_ms is not None else as_of
    if window_start is None:
        window_start = detail.agg(F.min("t0")).first()[0]
    overall = _aggregate(detail, [], "overall", "All messages", window_start, window_end, names)
    report.add(overall)
    report.add(_legs_table(detail, overall))
    for keys, name, title in (
        (["source_h", "target_h"], "by_pair", "Per source → target"),
        (["domain_h", "data_type_h"], "by_appkey", "Per AppKey domain and type"),
        (["save_fwd"], "by_save_fwd", "Per SaveFwd mode"),
        (["day"], "by_day", "Per day (UTC)"),
        (["hour"], "by_hour", "Per hour (UTC)"),
    ):
        report.add(_aggregate(detail, keys, name, title, window_start, window_end, names))
    watch.lap("aggregates", "pair, AppKey, SaveFwd, day, hour")
    report.add(_histogram(detail))
    stuck = _stuck(detail, opts.stuck_after_ms, names)
    failed = _failed(detail, names)
    _add_app_keys(spark, events, [stuck, failed])
    report.add(stuck)
    report.add(failed)
    watch.lap("stuck and failed")
    if opts.with_messages:
        report.add(_collect(detail.orderBy("t0", "lk0"), "messages", "Per message", names=names))
    detail.unpersist()
    report.add(_skew_table(offsets, bounds))
    report.add(_offline_table(periods, offsets, as_of))
    report.add(_inputs_table(per_logger, node_events, offsets))
    report.meta.update(
        {
            "generated_at": int(time.time() * 1000),
            "inputs": inputs.describe(),
            "since_ms": opts.since_ms,
            "until_ms": opts.until_ms,
            "window_start_ms": window_start,
            "window_end_ms": window_end,
            "as_of_ms": as_of,
            "stuck_after_ms": opts.stuck_after_ms,
            "events": n_events,
            "malformed_events": int(totals["bad"] or 0),
            "messages": counted,
            "reference_clock": next(
                (o.reference for o in offsets.values()), None
            ),
            "master": spark.sparkContext.master,
            "stage_seconds": dict(watch.stages),
        }
    )
    return report


def _derive(spark: Any, messages: Any, offsets: dict[str, ClockOffset],
            periods: list[Any], as_of: int, opts: ReportOptions) -> Any:
    """Per-message legs on one clock, skew-corrected cross legs, outcome and place."""
    from pyspark.sql import functions as F

    c = F.col
    off_rows = [(lg, int(o.offset_ms)) for lg, o in offsets.items()] or [("", 0)]
    off = spark.createDataFrame(off_rows, "logger string, off long").select(
        F.xxhash64("logger").alias("lh"), "off"
    )
    m = messages
    for prefix in ("o", "p", "r"):
        m = m.join(
            F.broadcast(off.withColumnRenamed("lh", f"{prefix}_lh")
                        .withColumnRenamed("off", f"{prefix}_off")),
            on=f"{prefix}_lh", how="left",
        ).withColumn(f"{prefix}_off", F.coalesce(c(f"{prefix}_off"), F.lit(0)))

    def ref(col: str) -> Any:
        """A timestamp moved to the reference clock."""
        return c(col) - c(f"{col[0]}_off")

    def clamp(x: Any) -> Any:
        # greatest() would turn a missing leg into 0; a missing leg stays null.
        return F.when(x.isNotNull(), F.greatest(x, F.lit(0)))

    p_ack = F.least(c("o_ack_fwd"), c("o_ack_save"))
    p_out = F.coalesce(c("p_delivered"), c("p_forwarded"))
    e2e = clamp(c("o_ack2") - c("o_queued"))
    raw_cross = {
        "to_platform_ms": ref("p_received") - ref("o_sent"),
        "to_target_ms": (c("r_received") - c("r_off")) - (p_out - c("p_off")),
        "delivery_ms": ref("r_inbox") - ref("o_queued"),
    }
    t0 = F.coalesce(ref("o_queued"), ref("o_sent"), ref("p_received"), ref("r_received"),
                    ref("r_inbox"), c("first_ts"))
    m = m.select(
        "*",
        t0.alias("t0"),
        clamp(c("o_sent") - c("o_queued")).alias("queue_ms"),
        clamp(p_ack - c("o_sent")).alias("platform_ack_ms"),
        clamp(raw_cross["to_platform_ms"]).alias("to_platform_ms"),
        clamp(F.least(c("p_forwarded"), c("p_stored")) - c("p_received")).alias("platform_ms"),
        clamp(c("p_delivered") - c("p_stored")).alias("dwell_ms"),
        clamp(raw_cross["to_target_ms"]).alias("to_target_ms"),
        clamp(c("r_inbox") - c("r_received")).alias("inbox_ms"),
        clamp(c("p_acked") - c("p_delivered")).alias("target_ack_ms"),
        clamp(c("o_ack2") - p_ack).alias("confirm_ms"),
        # Delivery happened before the ACK2 came back: e2e bounds it from above.
        F.least(clamp(raw_cross["delivery_ms"]), e2e).alias("delivery_ms"),
        e2e.alias("e2e_ms"),
        *[
            F.when(raw < 0, 1).otherwise(0).alias(f"clamped_{name}")
            for name, raw in raw_cross.items()
        ],
    )
    if opts.since_ms is not None:
        m = m.where(c("t0") >= opts.since_ms)
    if opts.until_ms is not None:
        m = m.where(c("t0") < opts.until_ms)

    # How long the target was offline, for messages the platform found it offline.
    found = F.least(c("p_stored"), c("p_dropped"))
    m = m.withColumn("found_offline", found)
    if periods:
        lowest, highest = -(1 << 62), 1 << 62
        pdf = spark.createDataFrame(
            [
                (p.logger, p.node, p.start, lowest if p.start is None else p.start,
                 p.end, highest if p.end is None else p.end)
                for p in periods
            ],
            "per_logger string, per_node string, per_start long, per_lo long, "
            "per_end long, per_hi long",
        ).select("*", F.xxhash64("per_logger").alias("per_lh"), F.xxhash64("per_node").alias("per_nh"))
        cond = (
            (c("p_lh") == c("per_lh")) & (c("target_h") == c("per_nh"))
            & (c("found_offline") >= c("per_lo")) & (c("found_offline") < c("per_hi"))
        )
        m = m.join(F.broadcast(pdf), cond, "left")
        offline = (
            F.coalesce(c("per_end") - c("p_off"), F.lit(as_of))
            - (F.coalesce(c("per_start"), c("found_offline")) - c("p_off"))
        )
        m = m.withColumn("target_offline_ms", F.when(c("per_node").isNotNull(), clamp(offline)))
    else:
        m = m.withColumn("target_offline_ms", F.lit(None).cast("long"))

    reliable = F.coalesce(c("reliable"), F.lit(True))
    ack2_asked = F.coalesce(c("ack2"), F.lit(True))
    confirmed = c("o_ack2").isNotNull() | c("r_reack2").isNotNull()
    received = c("r_received").isNotNull() | c("r_inbox").isNotNull() | c("p_acked").isNotNull()
    failed_at = F.least(ref("o_nack"), ref("p_dropped"), ref("p_refused"), ref("o_expired"),
                        ref("o_dead"))
    failure = (
        F.when(c("p_dropped").isNotNull(), "dropped")
        .when(c("p_refused").isNotNull(), "refused")
        .when(c("o_nack").isNotNull(), "nack")
        .when(c("o_expired").isNotNull(), "expired")
        .when(c("o_dead").isNotNull(), "dead")
    )
    age = F.lit(as_of) - c("t0")
    outcome = (
        F.when(confirmed, "confirmed")
        .when(~reliable, "best_effort")
        .when(failed_at.isNotNull(), "failed")
        .when(~ack2_asked & received, "delivered")
        .when(age > opts.stuck_after_ms, "stuck")
        .otherwise("in_flight")
    )
    # Where an unconfirmed message is: the furthest step any log shows.
    place = (
        F.when(c("r_received").isNotNull() | c("r_inbox").isNotNull(), "delivered_unconfirmed")
        .when(c("p_stored").isNotNull(), "stored_at_platform")
        .when(c("p_forwarded").isNotNull(), "forwarded_not_received")
        .otherwise("at_origin")
    )
    since = (
        F.when(c("r_received").isNotNull() | c("r_inbox").isNotNull(),
               F.coalesce(ref("r_inbox"), ref("r_received")))
        .when(c("p_stored").isNotNull(), ref("p_stored"))
        .when(c("p_forwarded").isNotNull(), ref("p_forwarded"))
        .otherwise(c("t0"))
    )
    evidence = F.concat_ws(
        "",
        F.when(c("o_lh").isNotNull(), F.lit("O")),
        F.when(c("p_lh").isNotNull(), F.lit("P")),
        F.when(c("r_lh").isNotNull(), F.lit("R")),
    )
    return m.select(
        "lk0", "source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "ack2", "reliable",
        "t0",
        F.date_format(F.timestamp_millis(c("t0")), "yyyy-MM-dd HH:00").alias("hour"),
        F.date_format(F.timestamp_millis(c("t0")), "yyyy-MM-dd").alias("day"),
        *LEG_NAMES,
        *[f"clamped_{n}" for n in _CROSS_LEGS],
        F.greatest(c("o_resends"), c("o_sends") - 1, F.lit(0)).alias("resends"),
        (c("o_inquiries") + c("p_inquiries")).alias("inquiries"),
        c("r_duplicates").alias("duplicates"),
        F.greatest(c("p_deliveries") - 1, F.lit(0)).alias("redeliveries"),
        "target_offline_ms",
        outcome.alias("outcome"),
        F.when(~confirmed, place).alias("place"),
        F.when(~confirmed, since).alias("since"),
        age.alias("age_ms"),
        failure.alias("failure"),
        "code",
        failed_at.alias("failed_at"),
        evidence.alias("evidence"),
        "o_lh", "p_lh", "r_lh",
    )


# ---------------------------------------------------------------- tables


_SPARK_TO_TABLE: Final = {
    "string": "string", "bigint": "long", "int": "long", "double": "double", "boolean": "bool",
    "float": "double", "smallint": "long", "tinyint": "long",
}


def _collect(df: Any, name: str, title: str, description: str = "",
             names: dict[int, str] | None = None) -> Table:
    """Collect a small DataFrame; `*_h` hash columns come back as their strings."""
    columns, types, decode = [], [], []
    for i, f in enumerate(df.schema.fields):
        if f.name.endswith("_h") and names is not None:
            columns.append(f.name.removesuffix("_h"))
            types.append("string")
            decode.append(i)
        else:
            columns.append(f.name)
            types.append(_SPARK_TO_TABLE.get(f.dataType.simpleString(), "string"))
    rows = []
    for r in df.collect():
        row = list(r)
        for i in decode:
            row[i] = None if row[i] is None else _name(names or {}, row[i])
        rows.append(tuple(row))
    return Table(name=name, title=title, columns=columns, types=types, rows=rows,
                 description=description)


def _aggregate(detail: Any, keys: list[str], name: str, title: str,
               window_start: int, window_end: int, names: dict[int, str]) -> Table:
    """count, outcomes, p50/p90/p99/max of every leg, resends, duplicates, throughput."""
    from pyspark.sql import functions as F

    c = F.col
    aggs = [F.count(F.lit(1)).alias("messages")]
    aggs += [F.sum(F.when(c("outcome") == o, 1).otherwise(0)).alias(o) for o in OUTCOMES]
    for leg in LEG_NAMES:
        aggs.append(F.percentile_approx(leg, list(PERCENTILES), ACCURACY).alias(f"{leg}__pct"))
        aggs.append(F.max(leg).alias(f"{leg}_max"))
    aggs += [
        F.sum("resends").alias("resends"),
        F.avg(F.when(c("resends") > 0, 1.0).otherwise(0.0)).alias("resend_rate"),
        F.sum("inquiries").alias("inquiries"),
        F.sum("duplicates").alias("duplicates_suppressed"),
        F.sum("redeliveries").alias("redeliveries"),
        F.max("target_offline_ms").alias("target_offline_max_ms"),
        F.min("t0").alias("first_ms"),
        F.max("t0").alias("last_ms"),
    ]
    df = detail.groupBy(*keys).agg(*aggs) if keys else detail.agg(*aggs)
    cols: list[Any] = [*keys, "messages", *OUTCOMES]
    for leg in LEG_NAMES:
        for i, p in enumerate(PERCENTILES):
            cols.append(c(f"{leg}__pct")[i].alias(f"{leg}_p{round(p * 100)}"))
        cols.append(f"{leg}_max")
    cols += ["resends", "resend_rate", "inquiries", "duplicates_suppressed", "redeliveries",
             "target_offline_max_ms", "first_ms", "last_ms"]
    table = _collect(df.select(*cols), name, title, names=names)
    # Sorted here: the keys are hashes in Spark and names only now.
    nkeys = len(keys)
    table.rows.sort(key=lambda row: tuple((v is None, v) for v in row[:nkeys]))
    # Throughput: messages per minute over the part of the report window the
    # row covers (an hour or a day bucket, else the whole window).
    span_of: Callable[[tuple[Any, ...]], float]
    if keys == ["hour"] or keys == ["day"]:
        length = 3_600_000 if keys == ["hour"] else 86_400_000
        fmt = "%Y-%m-%d %H:%M" if keys == ["hour"] else "%Y-%m-%d"

        def span_of(row: tuple[Any, ...]) -> float:
            start = int(datetime.strptime(row[0], fmt).replace(tzinfo=UTC).timestamp() * 1000)
            return min(start + length, window_end) - max(start, window_start)
    else:
        def span_of(row: tuple[Any, ...]) -> float:
            return window_end - window_start
    i_msgs = table.columns.index("messages")
    table.columns.append("per_minute")
    table.types.append("double")
    table.rows = [
        (*row, round(row[i_msgs] / max(span_of(row), 60_000) * 60_000, 3)) for row in table.rows
    ]
    return table


def _legs_table(detail: Any, overall: Table) -> Table:
    """The overall row reshaped: one row per leg ("where does the time go")."""
    from pyspark.sql import functions as F

    row = overall.dicts()[0]
    counts = detail.agg(
        *[F.count(leg).alias(leg) for leg in LEG_NAMES],
        *[F.sum(f"clamped_{n}").alias(f"clamped_{n}") for n in _CROSS_LEGS],
        *[F.avg(leg).alias(f"{leg}_mean") for leg in LEG_NAMES],
    ).first()
    rows = []
    for leg in LEGS:
        rows.append((
            leg.name, leg.label, leg.clock, int(counts[leg.name] or 0),
            row[f"{leg.name}_p50"], row[f"{leg.name}_p90"], row[f"{leg.name}_p99"],
            row[f"{leg.name}_max"],
            None if counts[f"{leg.name}_mean"] is None else round(float(counts[f"{leg.name}_mean"]), 1),
            int(counts[f"clamped_{leg.name}"] or 0) if leg.clock == "cross" else 0,
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


def _histogram(detail: Any) -> Table:
    """Log-scale latency distribution of end to end and delivery (4 bins per decade)."""
    from pyspark.sql import functions as F

    vals = detail.select(
        F.expr("stack(2, 'e2e_ms', e2e_ms, 'delivery_ms', delivery_ms) as (metric, v)")
    ).where(F.col("v").isNotNull())
    binned = vals.select(
        "metric",
        F.when(F.col("v") < 1, F.lit(-1))
        .otherwise(F.floor(F.log10(F.col("v")) * HIST_BINS_PER_DECADE))
        .cast("long").alias("bin"),
    )
    rows = binned.groupBy("metric", "bin").count().orderBy("metric", "bin").collect()
    out = []
    for r in rows:
        b = int(r["bin"])
        lo = 0 if b < 0 else math.ceil(10 ** (b / HIST_BINS_PER_DECADE))
        hi = 1 if b < 0 else math.ceil(10 ** ((b + 1) / HIST_BINS_PER_DECADE))
        out.append((r["metric"], b, lo, hi, int(r["count"])))
    return Table(
        name="histogram", title="Latency distribution",
        columns=["metric", "bin", "low_ms", "high_ms", "messages"],
        types=["string", "long", "long", "long", "long"], rows=out,
        description="messages per log-scale bin [low_ms, high_ms)",
    )


def _stuck(detail: Any, stuck_after_ms: int, names: dict[int, str]) -> Table:
    from pyspark.sql import functions as F

    df = detail.where(F.col("outcome") == "stuck").orderBy("since", "lk0").select(
        "lk0", "source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "place",
        F.date_format(F.timestamp_millis(F.col("since")), "yyyy-MM-dd HH:mm:ss").alias("since_utc"),
        "since", "age_ms", "resends", "inquiries", "target_offline_ms", "evidence",
    )
    return _collect(
        df, "stuck", "Stuck messages",
        f"no end-to-end confirmation and older than {stuck_after_ms // 1000} s; "
        "place: where it is, since: when it got there (reference clock)",
        names=names,
    )


def _failed(detail: Any, names: dict[int, str]) -> Table:
    from pyspark.sql import functions as F

    df = detail.where(F.col("outcome") == "failed").orderBy("failed_at", "lk0").select(
        "lk0", "source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "failure", "code",
        F.date_format(F.timestamp_millis(F.col("failed_at")), "yyyy-MM-dd HH:mm:ss").alias("at_utc"),
        "evidence",
    )
    return _collect(df, "failed", "Not delivered (dropped, refused, expired, dead letters)",
                    names=names)


def _add_app_keys(spark: Any, events: Any, tables: list[Table]) -> None:
    """Add the AppKey subtype and key to per-message tables (they name the business record).

    The key is unique per document, so it is not carried through the
    aggregation (see _DICT_COLUMNS); it is read back for the listed messages only.
    """
    from pyspark.sql import functions as F

    wanted = sorted({row[0] for t in tables for row in t.rows})
    found: dict[str, tuple[str | None, str | None]] = {}
    if wanted:
        ids = spark.createDataFrame([(x,) for x in wanted], "lk0 string")
        for r in (
            events.join(F.broadcast(ids), "lk0")
            .groupBy("lk0")
            .agg(F.max("subtype").alias("subtype"), F.max("key").alias("key"))
            .collect()
        ):
            found[r.lk0] = (r.subtype, r.key)
    for t in tables:
        at = t.columns.index("data_type") + 1
        t.columns[at:at] = ["subtype", "key"]
        t.types[at:at] = ["string", "string"]
        t.rows = [(*row[:at], *found.get(row[0], (None, None)), *row[at:]) for row in t.rows]


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


def _offline_table(periods: list[Any], offsets: dict[str, ClockOffset], as_of: int) -> Table:
    by_node: dict[tuple[str, str], list[Any]] = {}
    for p in periods:
        by_node.setdefault((p.logger, p.node), []).append(p)
    rows = []
    for (logger, node), ps in sorted(by_node.items()):
        off = offsets[logger].offset_ms if logger in offsets else 0
        known = [p for p in ps if p.start is not None]
        durations = [((p.end if p.end is not None else as_of + off) - p.start) for p in known]
        still = next((p.start for p in ps if p.end is None and p.start is not None), None)
        rows.append((
            node, logger, len(known), sum(durations), max(durations, default=0),
            format_ms(still - off) if still is not None else "",
        ))
    return Table(
        name="offline", title="Target offline time (platform's view)",
        columns=["node", "platform", "periods", "offline_ms", "longest_ms", "offline_since_utc"],
        types=["string", "string", "long", "long", "long", "string"], rows=rows,
        description="from node_offline/node_online; a node still offline counts until the end of the log",
    )


def _inputs_table(per_logger: list[Any], node_events: list[tuple[str, str, int, str]],
                  offsets: dict[str, ClockOffset]) -> Table:
    node_counts: dict[str, int] = {}
    for lg, *_ in node_events:
        node_counts[lg] = node_counts.get(lg, 0) + 1
    rows = []
    for logger, messages, events, last in sorted(per_logger):
        rows.append((
            logger, messages, events + node_counts.get(logger, 0),
            format_ms(int(last)) if last is not None else "",
            offsets[logger].offset_ms if logger in offsets else 0,
        ))
    return Table(
        name="loggers", title="Logs read",
        columns=["logger", "messages", "events", "last_event_utc_own_clock", "clock_offset_ms"],
        types=["string", "long", "long", "string", "long"], rows=rows,
    )


# ---------------------------------------------------------------- compaction


def _date_dirs(out: str) -> dict[str, frozenset[str]] | None:
    """`date=...` partition directories of a local dataset and their files (None: not local)."""
    import os

    if "://" in out and not out.startswith("file://"):
        return None
    root = out.removeprefix("file://")
    if not os.path.isdir(root):
        return {}
    return {
        d.removeprefix("date="): frozenset(os.listdir(os.path.join(root, d)))
        for d in os.listdir(root)
        if d.startswith("date=") and os.path.isdir(os.path.join(root, d))
    }


def compact(spark: Any, inputs: Inputs, out: str,
            progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Write the logs as Parquet partitioned by UTC date (``OUT/date=YYYY-MM-DD/``).

    Dates present in the input replace the same dates in `out` (dynamic
    partition overwrite); other dates already there stay. Returns
    ``{"dates": [(date, events)], "replaced": [date], "events": n}`` for the
    dates written (for a URL `out`: every date in it, replaced unknown).
    Lines without a timestamp have no date and are not written.
    """
    from pyspark.sql import functions as F

    watch = _Stopwatch(progress)
    before = _date_dirs(out)
    events = load_events(spark, inputs)
    dated = events.withColumn(
        "date", F.to_date(F.timestamp_millis(F.col("ts")))
    ).where(F.col("date").isNotNull())
    # No shuffle: daily log files are per logger and per date already, so a
    # read task meets one date (two around midnight on a skewed clock) and
    # writes one file per date it meets.
    (
        dated.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("date")
        .parquet(out)
    )
    watch.lap("write Parquet", out)
    after = _date_dirs(out)
    written_df = spark.read.parquet(out)
    replaced: list[str] = []
    if before is not None and after is not None:
        written = sorted(d for d, files in after.items() if before.get(d) != files)
        replaced = [d for d in written if d in before]
        written_df = written_df.where(F.col("date").cast("string").isin(written))
    counts = written_df.groupBy("date").count().orderBy("date").collect()
    watch.lap("count", f"{len(counts)} date partition(s)")
    return {
        "dates": [(str(r["date"]), int(r["count"])) for r in counts],
        "replaced": replaced,
        "events": sum(int(r["count"]) for r in counts),
        "columns": list(FIELD_NAMES),
    }
