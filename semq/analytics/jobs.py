"""The Spark side of the reports: read the logs, join each message's events, aggregate.

Shape of the work (docs/analytics.md; what costs what is measured by ``scripts/bench report``):

1. **One shuffle of the events by LK0**, then two hash aggregations in the same
   tasks: first by (message, identity of a counted event), which drops exact
   duplicate lines of the events that are counted (resends, inquiries,
   suppressed duplicates; sends and deliveries count by their ``attempt``),
   then by message: the first time of every step, the counts, the attributes.
   Strings travel as 64-bit hashes (Spark's fast hash aggregation keeps only
   fixed-width values per group). Cleanup events are not read: they are in no
   leg. The per-message table is cached (``localCheckpoint``). Compacted
   dates are read as the rows of the first aggregation that ``compact``
   stored (:mod:`.compacted`), about one per message and date instead of
   twelve events, and merged like the rows of the events.
2. One small aggregation of that table (a few thousand groups) gives the
   causal bounds between clocks, per-logger facts and connection events;
   clock offsets (:mod:`.clocks`) and offline periods (:mod:`.periods`) are
   computed on the driver. The legs of every message are derived from the
   cached table (offsets as a literal map, offline periods through one small
   broadcast join on time buckets) and cached again.
3. **All aggregates in two passes** over the cached legs, both over grouping
   sets (pair, AppKey x SaveFwd, hour): counts, sums and maxima in generated
   code, then mergeable KLL sketches for the percentiles; the AppKey and
   SaveFwd rows merge the rows and sketches of their combinations, the
   per-day rows and the overall row the hourly ones, so no value is
   sketched twice. The legs are computed and stored (``localCheckpoint``) by
   the first of these passes. Percentiles are exact for groups of up to
   :data:`SKETCH_K` values.
4. Stuck and failed messages: one filter over the cached legs; the strings
   behind the hashes (one message per distinct party, logger and AppKey type)
   and the AppKey subtype and key of the listed messages come from the
   compacted partials, or from one more scan of the events read as events
   (JSON, dates without partials).

pyspark is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .clocks import ClockOffset, OrderBound, estimate_offsets
from .compacted import install_partials, list_dates, partials_path
from .errors import ReportError
from .events import (
    EVENTS_BY_ROLE,
    FIELD_NAMES,
    FIELDS,
    NODE_EVENTS,
    ROLES,
    format_ms,
    parse_time,
    spark_schema,
)
from .inputs import JSON_SUFFIXES, Inputs
from .periods import OfflinePeriod, offline_periods
from .tables import ReportData, Table

__all__ = [
    "FOLLOW_UP_MS",
    "LEGS",
    "OUTCOMES",
    "PLACES",
    "SKETCH_K",
    "SKEW_MARGIN_MS",
    "Leg",
    "ReportOptions",
    "build_report",
    "compact",
    "facts_columns",
    "final_columns",
    "load_events",
    "message_facts",
    "message_partials",
    "partial_columns",
]

# Events this much before --since are read too: a message queued just after
# `since` on the reference clock may carry earlier stamps on a skewed clock.
SKEW_MARGIN_MS: Final = 3_600_000
# Events up to this long after --until are read to finish the legs of messages
# queued before `until` (stored for an offline target, confirmed later).
FOLLOW_UP_MS: Final = 86_400_000
PERCENTILES: Final = (0.5, 0.9, 0.99)
# KLL sketch size (kll_sketch_agg_bigint). A sketch keeps every value until it
# holds more than K, so percentiles are exact for groups of up to K values
# (the tests rely on that); above, the rank error is about 0.3% of the group
# (99% confidence). Measured on 1 M messages: the same time for K = 200..4000
# (the cost is per value, not per K), 3x less than percentile_approx; K sets
# the memory of a sketch (at most ~3K values).
SKETCH_K: Final = 1_000
HIST_BINS_PER_DECADE: Final = 4
HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000
# Keys of the rows that ride along with the messages (_per_message): they start
# with a character no LK0 holds.
_NODE_KEY: Final = "\u0001node|"
_BAD_KEY: Final = "\u0001bad"
# Compacted partials also hold one row per distinct string of the hashed
# columns, "\x01name|<column>|<value>", its hash in the column's own place
# (loggers: o_lh): the report then names what it shows without reading events.
_NAME_KEY: Final = "\u0001name|"
# Strings of a message that compacted partials keep for the stuck and failed
# lists; the report never aggregates them.
PARTIAL_STRINGS: Final = ("subtype", "key")
# String attributes carried through the per-message aggregation as 64-bit hashes:
# Spark's fast hash aggregation keeps only fixed-width values per group, and a
# string aggregate (first(), max()) forces a sort of every event instead. On
# 1 M messages / 11.6 M events in Parquet that was 32 s against 8 s. The
# distinct values are few and are read back at the end (:func:`_lookup`).
_DICT_COLUMNS: Final = ("source", "target", "domain", "data_type", "logger")

OUTCOMES: Final = ("confirmed", "delivered", "failed", "best_effort", "in_flight", "stuck")
PLACES: Final = ("at_origin", "forwarded_not_received", "stored_at_platform", "delivered_unconfirmed")

# Every (role, event) of docs/events.md as a small number: the per-message
# aggregation compares one byte per condition instead of two strings. Codes of
# one role are consecutive (origin first), so a role is a range of codes.
_EVENT_CODES: Final[dict[tuple[str, str], int]] = {
    re: i for i, re in enumerate(((r, e) for r in ROLES for e in sorted(EVENTS_BY_ROLE[r])), start=1)
}
_ROLE_CODES: Final[dict[str, tuple[int, int]]] = {
    r: (min(i for (rr, _), i in _EVENT_CODES.items() if rr == r),
        max(i for (rr, _), i in _EVENT_CODES.items() if rr == r))
    for r in ROLES
}
# The first time of these steps, per message: (column, role, event).
_FIRSTS: Final = (
    ("o_queued", "origin", "queued"),
    ("o_sent", "origin", "sent"),
    ("o_ack_fwd", "origin", "ack_fwd"),
    ("o_ack_save", "origin", "ack_save"),
    ("o_ack2", "origin", "ack2"),
    ("o_nack", "origin", "nack"),
    ("o_expired", "origin", "expired"),
    ("o_dead", "origin", "dead"),
    ("p_received", "platform", "received"),
    ("p_forwarded", "platform", "forwarded"),
    ("p_stored", "platform", "stored"),
    ("p_dropped", "platform", "dropped"),
    ("p_refused", "platform", "refused"),
    ("p_delivered", "platform", "delivered"),
    ("p_acked", "platform", "acked"),
    ("r_received", "receiver", "received"),
    ("r_inbox", "receiver", "inbox"),
    ("r_ack2_sent", "receiver", "ack2_sent"),
    ("r_reack2", "receiver", "reack2"),
)
# Events that are counted per message. Exact duplicate lines of these are
# counted once (first and last times are not changed by a repeated line).
_COUNTS: Final = (
    ("o_sends", "origin", "sent"),
    ("o_resends", "origin", "resend"),
    ("o_inquiries", "origin", "inquiry"),
    ("p_deliveries", "platform", "delivered"),
    ("p_inquiries", "platform", "inquiry"),
    ("r_duplicates", "receiver", "duplicate"),
)
# A failure code is taken from these events.
_FAILURES: Final = (("origin", "nack"), ("origin", "expired"), ("origin", "dead"),
                    ("platform", "dropped"), ("platform", "refused"))
# Events in no leg and no count: not read by the per-message step.
_UNUSED: Final = (("origin", "cleaned"), ("platform", "cleaned"), ("receiver", "cleaned"),
                  ("receiver", "reack"))
# Fields that tell two events of one message apart: lines equal in all of them
# are one event logged twice (a log copied or given twice).
IDENTITY_FIELDS: Final = ("logger", "role", "event", "lk0", "ts", "attempt", "code", "detail")


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


def _canonical(df: Any, *keep: str) -> Any:
    """The log columns in schema order and type; missing ones as nulls; then `keep`."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    return df.select(
        *[
            (F.col(n).cast(_t(t)) if n in have else F.lit(None).cast(_t(t))).alias(n)
            for n, _, t in FIELDS
        ],
        *keep,
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


def _expand(spark: Any, inputs: Inputs) -> Inputs:
    """`inputs` with its URLs listed into JSON files and Parquet datasets.

    Raises :class:`ReportError` when a URL holds no logs.
    """
    if not inputs.remote:
        return inputs
    json_files = list(inputs.json_files)
    parquet_dirs = list(inputs.parquet_dirs)
    for url in inputs.remote:
        j, p = _list_remote(spark, url)
        if not (j or p):
            raise ReportError(f"no delivery logs (*.jsonl or Parquet) found in {url}")
        json_files += j
        parquet_dirs += p
    return Inputs(json_files=json_files, parquet_dirs=parquet_dirs,
                  skipped_by_date=inputs.skipped_by_date)


def _window(since_ms: int | None, until_ms: int | None) -> tuple[int | None, int | None]:
    """The event times read for messages queued in [since, until): [lo, hi)."""
    return (None if since_ms is None else since_ms - SKEW_MARGIN_MS,
            None if until_ms is None else until_ms + FOLLOW_UP_MS)


def _in_window(events: Any, lo: int | None, hi: int | None) -> Any:
    from pyspark.sql import functions as F

    if lo is not None:
        events = events.where(F.col("ts") >= lo)
    if hi is not None:
        events = events.where(F.col("ts") < hi)
    return events


def load_events(spark: Any, inputs: Inputs, since_ms: int | None = None,
                until_ms: int | None = None) -> Any:
    """One DataFrame of all log events (schema of docs/events.md), time-filtered.

    Events are kept from ``since - SKEW_MARGIN_MS`` to ``until + FOLLOW_UP_MS``.
    Raises :class:`ReportError` when a URL holds no logs.
    """
    from pyspark.sql import functions as F

    inputs = _expand(spark, inputs)
    lo, hi = _window(since_ms, until_ms)
    frames = []
    if inputs.json_files:
        # The explicit schema saves Spark a full pass to infer one (docs/analytics.md).
        frames.append(spark.read.schema(spark_schema()).json(inputs.json_files))
    for d in inputs.parquet_dirs:
        # The log schema given, as for JSON: Spark then reads no Parquet footers
        # to infer one (a job of its own before the report starts). Columns a
        # dataset lacks read as nulls; the date partitions are still discovered.
        df = spark.read.schema(spark_schema()).parquet(d)
        if "date" in df.columns:
            # Partition pruning: whole days outside the window are not read.
            if lo is not None:
                df = df.where(F.col("date") >= F.lit(_utc_date(lo - 86_400_000)))
            if hi is not None:
                df = df.where(F.col("date") <= F.lit(_utc_date(hi + 86_400_000)))
        frames.append(_canonical(df))
    return _in_window(functools.reduce(lambda a, b: a.unionByName(b), frames), lo, hi)


@dataclass(kw_only=True)
class _Sources:
    """What the per-message step reads (:func:`_message_sources`)."""

    events: Any | None  # log lines: JSON, and dates read from their events
    partials: Any | None  # partial rows of compacted dates (:func:`message_partials`)
    partial_days: int
    # The partial rows come from one dataset, one row per (message, counted
    # event) at most: each date's rows are of one compaction and an event has
    # one date. Then nothing needs merging per (message, counted event).
    partials_distinct: bool = False
    # Finished per-message rows (:func:`final_columns`) of the messages closed
    # in a date, when every date read is of one compaction run: no other row
    # read belongs to these messages. `partials` then holds only the open rows.
    final: Any | None = None
    # With `final`: their facts rows (:func:`message_facts`), per date.
    facts: Any | None = None
    event_days: int

    def describe(self) -> str:
        if not (self.partial_days or self.event_days):
            return ""
        return (f"compacted dates: {self.partial_days} from per-message partials"
                f"{' (one compaction run)' if self.final is not None else ''}, "
                f"{self.event_days} from their events")


def _message_sources(spark: Any, inputs: Inputs, since_ms: int | None,
                     until_ms: int | None) -> _Sources:
    """The inputs of the per-message step, for messages queued in [since, until).

    A compacted date wholly inside the window of event times and with complete
    partials (:mod:`.compacted`) is read as its partial rows. A date the window
    cuts is read as events filtered by time, as JSON is, because its partial
    rows would include events outside the window; so are dates without
    complete partials. Dates outside the window are not read. The result is
    the same as from the logs themselves: partial rows merge exactly.

    When the input is one compacted dataset and every date read of it has
    partials of the same compaction run, a message closed in a date (all its
    events of that run in it) has no row in any other date read, so its
    finished row is taken as it is (``final``) and only the open rows are
    merged. Otherwise the closed messages' partial rows are merged too.
    """
    from pyspark.sql import functions as F

    inputs = _expand(spark, inputs)
    lo, hi = _window(since_ms, until_ms)
    frames = []
    if inputs.json_files:
        frames.append(spark.read.schema(spark_schema()).json(inputs.json_files))
    partial_dates: list[tuple[str, str]] = []  # (dataset, date)
    runs: set[str | None] = set()
    event_days = 0
    for d in inputs.parquet_dirs:
        dates = list_dates(spark, d)
        if not dates.dates:  # not partitioned by date: only the events
            frames.append(_canonical(spark.read.schema(spark_schema()).parquet(d)))
            runs.add(None)
            continue
        from_events = []
        for day in dates.dates:
            start = parse_time(day)
            end = start + DAY_MS
            if (lo is not None and end <= lo) or (hi is not None and start >= hi):
                continue
            runs.add(dates.runs.get(day))
            inside = (lo is None or start >= lo) and (hi is None or end <= hi)
            if inside and day in dates.with_partials:
                partial_dates.append((d, day))
            else:
                from_events.append(day)
        if from_events:
            event_days += len(from_events)
            df = spark.read.schema(spark_schema()).parquet(d)
            # The partition value is the UTC date of `ts` (compact): exact pruning.
            frames.append(_canonical(df.where(F.col("date").isin(*_dates(from_events)))))
    events = None
    if frames:
        events = _in_window(functools.reduce(lambda a, b: a.unionByName(b), frames), lo, hi)
    one_run = (bool(partial_dates) and not inputs.json_files and len(inputs.parquet_dirs) == 1
               and len(runs) == 1 and None not in runs)
    partials = final = facts = None
    if partial_dates:
        columns = [*partial_columns(), *[(n, "string") for n in PARTIAL_STRINGS]]
        merged = ("open",) if one_run else ("closed", "open")
        partials = spark.read.schema(_struct(columns)).parquet(
            *[partials_path(d, day, subset) for d, day in partial_dates for subset in merged])
        if one_run:
            final = spark.read.schema(_struct(final_columns())).parquet(
                *[partials_path(d, day, "final") for d, day in partial_dates])
            facts = spark.read.schema(_struct(facts_columns())).parquet(
                *[partials_path(d, day, "facts") for d, day in partial_dates])
    roots = {d for d, _ in partial_dates}
    return _Sources(events=events, partials=partials, partial_days=len(partial_dates),
                    partials_distinct=len(roots) == 1 and len(set(partial_dates)) == len(partial_dates),
                    final=final, facts=facts, event_days=event_days)


def _t(name: str) -> Any:
    """The Spark type of a type name, as an object.

    Casts and schemas are given to Spark as type objects (sent as JSON), not
    as names or DDL text, which Spark parses with its SQL grammar (ANTLR):
    in a fresh JVM that parser's warm-up and JIT compilation measured about
    1.6 s of CPU per report.
    """
    from pyspark.sql import types as T

    kinds = {"string": T.StringType, "bigint": T.LongType, "long": T.LongType,
             "int": T.IntegerType, "tinyint": T.ByteType, "boolean": T.BooleanType,
             "double": T.DoubleType, "date": T.DateType}
    return kinds[name]()


def _struct(columns: list[tuple[str, str]]) -> Any:
    """A StructType of (name, type name) (see :func:`_t`)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(n, _t(t), True) for n, t in columns])


def _dates(days: list[str]) -> list[Any]:
    """`date` partition values as literals (no cast of every partition value)."""
    from datetime import date

    from pyspark.sql import functions as F

    return [F.lit(date.fromisoformat(d)) for d in days]


def _utc_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date().isoformat()


# ---------------------------------------------------------------- per message


def _event_code() -> Any:
    """The (role, event) of a line as its :data:`_EVENT_CODES` number, 0 when unknown."""
    from pyspark.sql import functions as F

    role, event = F.col("role"), F.col("event")
    expr: Any = None
    for r in ROLES:
        inner: Any = None
        for e in sorted(EVENTS_BY_ROLE[r]):
            code = _EVENT_CODES[(r, e)]
            inner = F.when(event == e, code) if inner is None else inner.when(event == e, code)
        expr = F.when(role == r, inner.otherwise(0)) if expr is None else expr.when(role == r, inner.otherwise(0))
    return expr.otherwise(0).cast(_t("tinyint"))


def _codes(pairs: Iterable[tuple[str, str]]) -> list[int]:
    return [_EVENT_CODES[p] for p in pairs]


def _hash(col: str) -> Any:
    """A string column as its 64-bit hash (null stays null), decoded by :func:`_lookup`."""
    from pyspark.sql import functions as F

    return F.when(F.col(col).isNotNull(), F.xxhash64(F.col(col)))


def _prepared(events: Any, *keep: str) -> Any:
    """Each event as the per-message step needs it: the group key ``k``, the
    event code, the hashed strings, and ``dk`` (see :func:`_per_message`).
    Columns named in `keep` (e.g. ``date``) are passed through."""
    from pyspark.sql import functions as F

    c = F.col
    ec = c("ec")
    complete = c("ts").isNotNull() & c("logger").isNotNull() & c("role").isNotNull() & c("event").isNotNull()
    node_event = c("event").isin(*NODE_EVENTS) & c("node").isNotNull()
    key = (
        F.when(complete & node_event,
               F.concat_ws("|", F.lit(_NODE_KEY[:-1]), c("logger"), c("node"), c("event"),
                           c("ts").cast(_t("string"))))
        .when(complete & (ec != 0) & c("lk0").isNotNull(), c("lk0"))
        .otherwise(F.lit(_BAD_KEY))
    )

    def present(col: str, kind: str) -> Any:
        # Spark's hashes skip nulls: a null must hash differently from any value.
        missing = F.lit("\u0000") if kind == "string" else F.lit(-(1 << 31)).cast(_t(kind))
        return F.coalesce(c(col).cast(_t(kind)), missing)

    identity = F.xxhash64(*[
        present(f, "string" if t == "string" else "long")
        for f, _, t in FIELDS if f in IDENTITY_FIELDS
    ])
    sent, delivered = _EVENT_CODES[("origin", "sent")], _EVENT_CODES[("platform", "delivered")]
    counted = ec.isin(*_codes((r, e) for _, r, e in _COUNTS if e not in ("sent", "delivered"))) | (
        ec.isin(sent, delivered) & c("attempt").isNull()
    )
    # Unused events are dropped on the raw strings: a filter on the event code
    # would be pushed below the projection that computes it and evaluate the
    # code's CASE chain twice per line. A null role or event is kept (as code 0).
    unused = functools.reduce(lambda a, b: a | b, [
        (c("role") == r) & (c("event") == e) for r, e in _UNUSED
    ])
    return (
        events.where(~F.coalesce(unused, F.lit(False)))
        .select("*", _event_code().alias("ec"))
        .select(
            key.alias("k"), "ts", "ec", "code", "attempt", "save_fwd", "ack2", "reliable",
            _hash("logger").alias("lh"),
            *[_hash(col).alias(f"{col}_h") for col in _DICT_COLUMNS if col != "logger"],
            F.when(counted, identity).alias("dk"),
            *keep,
        )
    )


_ATTRIBUTES: Final = ("save_fwd", "ack2", "reliable",
                      *[f"{col}_h" for col in _DICT_COLUMNS if col != "logger"])
_ATTRIBUTE_TYPES: Final = {"save_fwd": "int", "ack2": "boolean", "reliable": "boolean"}
# (column, how two rows merge, type) of :func:`_level1`, in its order. Apart
# from the aggregates so that merging stored partials builds none of them
# (each Spark column built is a round trip to the JVM).
_LEVEL1_LAYOUT: Final = (
    *[(name, "min", "bigint") for name, _, _ in _FIRSTS],
    ("code", "max", "int"),
    ("sent_attempt", "max", "int"),
    ("delivered_attempt", "max", "int"),
    *[(f"{p}_lh", "max", "bigint") for p in "opr"],
    *[(f"{p}_last", "max", "bigint") for p in "opr"],
    *[(f"{p}_lines", "sum", "bigint") for p in "opr"],
    *[(a, "max", _ATTRIBUTE_TYPES.get(a, "bigint")) for a in _ATTRIBUTES],
    ("first_ts", "min", "bigint"),
    ("ec", "max", "tinyint"),
    ("lines", "sum", "bigint"),
)


def _level1() -> list[tuple[str, Any, str, str]]:
    """The first aggregation of the per-message step, per (message, ``dk``):
    ``(column, aggregate over events, how two rows of it merge, type)``.

    Every aggregate is a min, max or count, so rows computed from separate
    parts of the events (compaction runs, dates, inputs) merge into exactly the
    row of all the events together: min and max merge as themselves, counts
    as sums. :func:`partial_columns` names this table's output.
    """
    from pyspark.sql import functions as F

    c = F.col
    ec, ts = c("ec"), c("ts")
    sent, delivered = _EVENT_CODES[("origin", "sent")], _EVENT_CODES[("platform", "delivered")]
    roles = {p: ec.between(*_ROLE_CODES[r]) for p, r in (("o", "origin"), ("p", "platform"), ("r", "receiver"))}
    aggregates = [
        *[F.min(F.when(ec == _EVENT_CODES[(r, e)], ts)) for _, r, e in _FIRSTS],
        F.max(F.when(ec.isin(*_codes(_FAILURES)), c("code"))),
        F.max(F.when(ec == sent, c("attempt"))),
        F.max(F.when(ec == delivered, c("attempt"))),
        *[F.max(F.when(is_role, c("lh"))) for is_role in roles.values()],
        *[F.max(F.when(is_role, ts)) for is_role in roles.values()],
        *[F.count(F.when(is_role, 1)) for is_role in roles.values()],
        # Every message event carries the same attributes; max() picks the one
        # value (booleans: true if any event says so).
        *[F.max(a) for a in _ATTRIBUTES],
        F.min(ts),
        F.max("ec"),
        F.count(F.lit(1)),
    ]
    return [(name, agg, how, kind)
            for (name, how, kind), agg in zip(_LEVEL1_LAYOUT, aggregates, strict=True)]


def partial_columns() -> list[tuple[str, str]]:
    """``(name, Spark type)`` of a per-message partial row, as compaction writes it."""
    return [("k", "string"), ("dk", "bigint"), *[(n, t) for n, _, t in _LEVEL1_LAYOUT]]


def message_partials(events: Any, *keys: str, strings: bool = False) -> Any:
    """The first aggregation of the per-message step over `events`, per
    (message, ``dk``, `keys`...): the partial rows ``semq report compact``
    stores, in :func:`partial_columns` order and types, then `keys`.

    With `strings`, also the :data:`PARTIAL_STRINGS` of each message (on its
    row without ``dk``) and the name rows of every hashed string (key
    ``\x01name|<column>|<value>``), for the stuck and failed lists.
    """
    from pyspark.sql import functions as F

    level1 = _level1()
    columns = [F.col(n).cast(_t(t)).alias(n) for n, t in partial_columns()]
    if not strings:
        return (
            _prepared(events, *keys)
            .groupBy("k", "dk", *keys)
            .agg(*[agg.alias(name) for name, agg, _, _ in level1])
            .select(*columns, *keys)
        )
    # Strings cannot be kept per group by Spark's hash aggregation. The events
    # of a message that carry them (its queued and received lines) share one
    # value, so they are grouping keys first: about two rows per message and
    # date, which a sort-based aggregation then merges (instead of sorting
    # every event).
    merge = {"min": F.min, "max": F.max, "sum": F.sum}
    rows = (
        _prepared(events, *keys, *PARTIAL_STRINGS)
        .repartition("k")
        .groupBy("k", "dk", *keys, *PARTIAL_STRINGS)
        .agg(*[agg.alias(name) for name, agg, _, _ in level1])
        .groupBy("k", "dk", *keys)
        .agg(*[merge[how](name).alias(name) for name, _, how, _ in level1],
             *[F.max(col).alias(col) for col in PARTIAL_STRINGS])
        .select(*columns, *keys, *PARTIAL_STRINGS)
    )
    return rows.unionByName(_name_rows(events, *keys), allowMissingColumns=True)


def _name_rows(events: Any, *keys: str) -> Any:
    """One partial row per distinct value of each hashed column (see _NAME_KEY)."""
    from pyspark.sql import functions as F

    c = F.col
    # Distinct combinations first (a few thousand), exploded only then.
    combos = events.select(*keys, *_DICT_COLUMNS).distinct()
    values = (
        combos.select(*keys, F.explode(F.array(*[
            F.struct(F.lit(col).alias("column"), c(col).alias("value")) for col in _DICT_COLUMNS
        ])).alias("n"))
        .select(*keys, "n.column", "n.value")
        .where(c("value").isNotNull())
        .distinct()
    )
    carrier = {col: f"{col}_h" for col in _DICT_COLUMNS if col != "logger"} | {"logger": "o_lh"}
    return values.select(
        F.concat(F.lit(_NAME_KEY), c("column"), F.lit("|"), c("value")).alias("k"),
        *[F.when(c("column") == col, F.xxhash64("value")).alias(place) for col, place in carrier.items()],
        *keys,
    )


def _per_message(events: Any | None, partials: Any | None = None, *,
                 partials_distinct: bool = False, strings: bool = False) -> Any:
    """Group all events by LK0: first time of every step, counts, attributes.

    `events` are log lines; `partials` are rows :func:`message_partials` made
    earlier (``semq report compact``) from other lines. At least one is given.

    Two aggregations after one shuffle (by the message key), in the same
    tasks. The first groups by (message, ``dk``): ``dk`` identifies one
    counted event (a hash of :data:`IDENTITY_FIELDS`) and is null for every
    other event, so exact duplicate lines of counted events collapse into one
    row while the other events of a message become a single row of first
    times. Partial rows are merged by the same key, so a counted event that is
    in two inputs still counts once. The second groups by message. Sends and
    platform deliveries are counted by their highest ``attempt`` (a repeated
    line does not change it); only lines without one are counted one by one.

    Two kinds of rows ride along, so that this one pass over the input also
    yields them: each platform connection event is its own tiny group (key
    ``\\x01node|logger|node|event|ts``, once however often it was logged), and
    malformed lines (no time, logger, role or event; an unknown event; a
    message event without LK0) are counted in the group ``\\x01bad``.

    With `partials_distinct` (partials only, from one dataset: no two rows of
    one message and counted event, see :class:`_Sources`) the first
    aggregation is skipped: it would only copy every row into a hash map of a
    million groups.

    With `strings`, the :data:`PARTIAL_STRINGS` of the partial rows are kept
    (a string aggregate: Spark sorts the rows, so only for few rows).
    """
    from pyspark.sql import functions as F

    kept = list(PARTIAL_STRINGS) if strings and partials is not None else []
    if partials is None:
        # repartition("k") is the one shuffle; both aggregations find their
        # input clustered by k already (a subset of their keys) and add none.
        rows = (_prepared(events).repartition("k").groupBy("k", "dk")
                .agg(*[agg.alias(name) for name, agg, _, _ in _level1()]))
    elif events is None and partials_distinct:
        rows = partials.select(*[n for n, _ in partial_columns()], *kept).repartition("k")
    else:
        partials = partials.select(*[n for n, _ in partial_columns()], *kept)
        if events is not None:
            partials = partials.unionByName(message_partials(events), allowMissingColumns=True)
        merge = {"min": F.min, "max": F.max, "sum": F.sum}
        rows = (partials.repartition("k").groupBy("k", "dk")
                .agg(*[merge[how](name).alias(name) for name, how, _ in _LEVEL1_LAYOUT],
                     *[F.max(col).alias(col) for col in kept]))
    return rows.groupBy("k").agg(*[agg.alias(name) for name, agg in _level2()],
                                 *[F.max(col).alias(col) for col in kept])


# (column, type) of the per-message rows (:func:`_level2`), after the key ``k``.
_LEVEL2_LAYOUT: Final = (
    *[(name, "bigint") for name, _, _ in _FIRSTS],
    *[(name, "bigint") for name, _, _ in _COUNTS],
    ("code", "int"),
    *[(f"{p}_lh", "bigint") for p in "opr"],
    *[(f"{p}_last", "bigint") for p in "opr"],
    *[(f"{p}_lines", "bigint") for p in "opr"],
    *[(a, _ATTRIBUTE_TYPES.get(a, "bigint")) for a in _ATTRIBUTES],
    ("first_ts", "bigint"),
    ("lines", "bigint"),
    ("duplicate_lines", "bigint"),
)


def _level2() -> list[tuple[str, Any]]:
    """The second aggregation of the per-message step, per message over the
    rows of :func:`_level1` (merged): ``(column, aggregate)`` in
    :data:`_LEVEL2_LAYOUT` order."""
    from pyspark.sql import functions as F

    c = F.col
    ec = c("ec")
    is_counted = c("dk").isNotNull()

    def count(r: str, e: str) -> Any:
        return F.count(F.when(is_counted & (ec == _EVENT_CODES[(r, e)]), 1))

    counts = {
        "o_sends": F.greatest(F.max("sent_attempt"), count("origin", "sent")),
        "o_resends": count("origin", "resend"),
        "o_inquiries": count("origin", "inquiry"),
        "p_deliveries": F.greatest(F.max("delivered_attempt"), count("platform", "delivered")),
        "p_inquiries": count("platform", "inquiry"),
        "r_duplicates": count("receiver", "duplicate"),
    }
    aggregates = [
        *[F.min(name) for name, _, _ in _FIRSTS],
        *[counts[name] for name, _, _ in _COUNTS],
        F.max("code"),
        *[F.max(f"{p}_lh") for p in "opr"],
        *[F.max(f"{p}_last") for p in "opr"],
        *[F.sum(f"{p}_lines") for p in "opr"],
        *[F.max(a) for a in _ATTRIBUTES],
        F.min("first_ts"),
        F.sum("lines"),
        # Lines dropped as exact duplicates (counted events and connection events).
        F.sum(F.when(is_counted | c("k").startswith(_NODE_KEY), c("lines") - 1).otherwise(0)),
    ]
    return [(name, agg) for (name, _), agg in zip(_LEVEL2_LAYOUT, aggregates, strict=True)]


def final_columns() -> list[tuple[str, str]]:
    """``(name, Spark type)`` of a finished per-message row as compaction stores
    it for a message closed in one date (:mod:`.compacted`)."""
    return [("k", "string"), *_LEVEL2_LAYOUT, *[(n, "string") for n in PARTIAL_STRINGS]]


def _typed(df: Any, columns: list[tuple[str, str]]) -> Any:
    from pyspark.sql import functions as F

    return df.select(*[F.col(n).cast(_t(t)).alias(n) for n, t in columns])


@dataclass(kw_only=True)
class _Facts:
    """What the small job over the per-message table found (:func:`_message_facts`)."""

    bounds: list[OrderBound]  # logger names provisional (see names)
    names: dict[int, str]  # logger hash -> name (provisional until _lookup)
    messages: dict[int, int]  # logger hash -> messages it logged events of
    lines: dict[int, int]  # logger hash -> lines read (cleanup lines are not read)
    last: dict[int, int]  # logger hash -> latest time stamp, own clock
    node_events: list[tuple[str, str, int, str]]
    representatives: dict[tuple[str, int], int]  # (column, hash) -> xxhash64 of an LK0 that has it
    strings: dict[int, str]  # hash -> string, from the name rows of compacted partials
    total_messages: int
    duplicates: int
    malformed: int


_CODED_COLUMNS: Final = ("o_lh", "p_lh", "r_lh", "source_h", "target_h", "domain_h", "data_type_h")


# The causal pairs of :func:`_fact_deltas` as (earlier party, later party).
_FACT_PAIRS: Final = (("o_lh", "p_lh"), ("p_lh", "o_lh"), ("p_lh", "o_lh"), ("p_lh", "r_lh"),
                      ("r_lh", "p_lh"), ("o_lh", "r_lh"), ("r_lh", "o_lh"), ("o_lh", "r_lh"))
# (column, how two rows of it merge) of a facts row (:func:`message_facts`), after its keys.
_FACTS_LAYOUT: Final = (
    *[x for i in range(len(_FACT_PAIRS)) for x in ((f"d{i}", "min"), (f"n{i}", "sum"))],
    ("n", "sum"),
    ("rep", "min"),
    *[(f"{x}_last", "max") for x in "opr"],
    *[(f"{x}_lines", "sum") for x in "opr"],
    ("lines", "sum"),
    ("dup", "sum"),
    ("first_ts", "min"),
)


def _fact_deltas() -> list[Any]:
    """Later ts - earlier ts of each pair of :data:`_FACT_PAIRS`: each pair is a
    cause and its effect (SPEC "The flow"), first occurrences only: the first
    effect cannot precede the first cause."""
    from pyspark.sql import functions as F

    c = F.col
    return [
        c("p_received") - c("o_sent"),
        F.least(c("o_ack_fwd"), c("o_ack_save")) - F.least(c("p_forwarded"), c("p_stored")),
        c("o_nack") - c("p_dropped"),
        c("r_received") - F.least(c("p_forwarded"), c("p_delivered")),
        c("p_acked") - c("r_inbox"),
        c("r_received") - c("o_sent"),
        c("o_ack2") - c("r_ack2_sent"),
        c("r_reack2") - c("o_ack2"),
    ]


def facts_columns() -> list[tuple[str, str]]:
    """``(name, Spark type)`` of a facts row (:func:`message_facts`), keys first."""
    return [*[(col, "bigint") for col in _CODED_COLUMNS], ("special", "string"),
            *[(name, "bigint") for name, _ in _FACTS_LAYOUT]]


def message_facts(grouped: Any, *keys: str) -> Any:
    """The small aggregation of the per-message table (rows of :func:`_level2`)
    that :func:`_message_facts` reads, per combination of loggers and
    attributes (and `keys`): the smallest time difference of every causal
    pair (for :mod:`.clocks`), messages, lines and last time stamps, and one
    LK0 to read the strings behind the hashes from; connection events,
    duplicate and malformed lines as rows of their own (``special``). Every
    column is a min, max, count or sum: rows of disjoint sets of messages
    merge exactly (:func:`_merge_facts`), so compaction stores them for the
    messages closed in each date.
    """
    from pyspark.sql import functions as F

    c = F.col
    special = F.when(c("k").startswith("\u0001"), c("k"))
    aggs = []
    for i, d in enumerate(_fact_deltas()):
        aggs += [F.min(d).alias(f"d{i}"), F.count(d).alias(f"n{i}")]
    aggs += [
        F.count(F.lit(1)).alias("n"),
        # A message to read the strings of this combination from, by the hash
        # of its LK0 (a string aggregate would make Spark sort the rows).
        F.min(F.xxhash64("k")).alias("rep"),
        *[F.max(f"{x}_last").alias(f"{x}_last") for x in "opr"],
        *[F.sum(f"{x}_lines").alias(f"{x}_lines") for x in "opr"],
        F.sum("lines").alias("lines"),
        F.sum("duplicate_lines").alias("dup"),
        F.min("first_ts").alias("first_ts"),
    ]
    return grouped.groupBy(*_CODED_COLUMNS, special.alias("special"), *keys).agg(*aggs)


def _merge_facts(rows: Any) -> Any:
    """Facts rows of disjoint sets of messages as the facts of all of them."""
    from pyspark.sql import functions as F

    merge = {"min": F.min, "max": F.max, "sum": F.sum}
    return rows.groupBy(*_CODED_COLUMNS, "special").agg(
        *[merge[how](name).alias(name) for name, how in _FACTS_LAYOUT])


class _Record(dict[str, Any]):
    """A collected row as a dict, its fields also as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _message_facts(rows: list[Any]) -> _Facts:
    """What the facts rows (:func:`message_facts`, collected) say: causal
    bounds between loggers, names, per-logger counts, connection events."""
    facts = _Facts(bounds=[], names={}, messages={}, lines={}, last={}, node_events=[],
                   representatives={}, strings={}, total_messages=0, duplicates=0, malformed=0)
    platforms: set[int] = set()
    upper: dict[tuple[int, int], tuple[int, int]] = {}
    # A pyspark Row finds a field by name with a linear search; each row is
    # read by name some fifty times.
    for row in (_Record(zip(r.__fields__, r, strict=True)) for r in rows):
        if row.special is not None and row.special.startswith(_NAME_KEY):
            # "\x01name|<column>|<value>", the hash in the column's place: no
            # lines, no logger activity, only the name.
            _, column, value = row.special.split("|", 2)
            h = row["o_lh" if column == "logger" else f"{column}_h"]
            if h is not None:
                facts.strings[int(h)] = value
            continue
        facts.duplicates += int(row.dup or 0)
        for x in "opr":
            h = row[f"{x}_lh"]
            if h is None:
                continue
            if x == "p":
                platforms.add(h)
            facts.lines[h] = facts.lines.get(h, 0) + int(row[f"{x}_lines"] or 0)
            if row[f"{x}_last"] is not None:
                facts.last[h] = max(facts.last.get(h, row[f"{x}_last"]), int(row[f"{x}_last"]))
        if row.special == _BAD_KEY:
            facts.malformed += int(row.lines)
            continue
        if row.special is not None:
            # "\x01node|<platform logger>|<node>|<event>|<ts>": its logger is named here.
            parts = row.special.split("|")
            if len(parts) >= 5 and row.first_ts is not None:
                facts.node_events.append((parts[1], "|".join(parts[2:-2]), int(row.first_ts), parts[-2]))
                if row.p_lh is not None:
                    facts.names[int(row.p_lh)] = parts[1]
            continue
        facts.total_messages += int(row.n)
        for col in _CODED_COLUMNS:
            h = row[col]
            if h is None:
                continue
            if col.endswith("_lh"):
                facts.messages[h] = facts.messages.get(h, 0) + int(row.n)
            name = "logger" if col.endswith("_lh") else col.removesuffix("_h")
            known = facts.representatives.get((name, h))
            if known is None or row.rep < known:
                facts.representatives[(name, h)] = int(row.rep)
        for i, (a, b) in enumerate(_FACT_PAIRS):
            ha, hb, d, n = row[a], row[b], row[f"d{i}"], int(row[f"n{i}"] or 0)
            if ha is None or hb is None or d is None or ha == hb:
                continue
            old = upper.get((ha, hb))
            upper[(ha, hb)] = (int(d), n) if old is None else (min(old[0], int(d)), old[1] + n)
    # Until the logs are read for the strings (_lookup), a logger is named by
    # its role and hash; :func:`estimate_offsets` only needs to tell platforms.
    for h in set(facts.lines) | {h for pair in upper for h in pair}:
        facts.names.setdefault(h, f"platform:#{h}" if h in platforms else f"org:#{h}")
    facts.bounds = [OrderBound(facts.names[a], facts.names[b], d, n) for (a, b), (d, n) in upper.items()]
    return facts


def _literal_table(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> Any:
    """A small DataFrame of Python rows, shipped as one JSON literal.

    ``spark.createDataFrame`` pickles the rows and unpickles them in tasks; in
    a fresh JVM that first use cost more than a second. `schema`: ``"name
    type, ..."`` (type names of :func:`_t`).
    """
    import json

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    columns = [(f.split()[0], f.split()[1]) for f in schema.split(",")]
    text = json.dumps([dict(zip([n for n, _ in columns], r, strict=True)) for r in rows])
    return (
        spark.range(1)
        .select(F.explode(F.from_json(F.lit(text), T.ArrayType(_struct(columns)))).alias("r"))
        .select("r.*")
    )


def _name(names: dict[int, str], h: int | None) -> str:
    if h is None:
        return ""
    return names.get(int(h), f"#{h}")


def _lookup(spark: Any, sources: _Sources, listed: Any | None,
            representatives: dict[tuple[str, int], int], *, partials: bool = True) -> tuple[
                dict[int, str], dict[str, tuple[str | None, str | None]]]:
    """One scan for the strings the report shows but did not carry.

    Returns the dictionary of hashed strings (parties, loggers, AppKey types:
    read from one representative message each, found by the hash of its LK0,
    in the events read) and the AppKey subtype and key of the listed messages
    (`listed`: a DataFrame of their ``lk0``, the stored per-message table
    filtered and joined here, not sent through the driver as a literal; the
    key is unique per document, so it is not carried through the
    aggregation), from the events and from the strings compacted partials
    keep. Compacted dates name their strings themselves (name rows), so with
    compacted input only, no event is read here.
    """
    from pyspark.sql import functions as F

    c = F.col
    reps = sorted(set(representatives.values())) if sources.events is not None else []
    names: dict[int, str] = {}
    keys: dict[str, tuple[str | None, str | None]] = {}
    if listed is None and not reps:
        return names, keys
    # Both kinds are joined on the 64-bit hash of the LK0 (a listed message also
    # by its LK0, against collisions).
    wanted = []
    if listed is not None:
        wanted.append(listed.select(F.xxhash64("lk0").alias("kh"), c("lk0").alias("want"),
                                    F.lit(False).alias("rep")))
    if reps:
        wanted.append(_literal_table(spark, [(h,) for h in reps], "rep_h long").select(
            c("rep_h").alias("kh"), F.lit(None).cast(_t("string")).alias("want"),
            F.lit(True).alias("rep")))
    ids = functools.reduce(lambda a, b: a.unionByName(b), wanted)
    parts = []
    if sources.events is not None:
        parts.append(sources.events.where(c("lk0").isNotNull())
                     .select("lk0", *PARTIAL_STRINGS, *_DICT_COLUMNS))
    if partials and sources.partials is not None and listed is not None:
        parts.append(sources.partials.where(~c("k").startswith("\u0001") & c("key").isNotNull())
                     .select(c("k").alias("lk0"), *PARTIAL_STRINGS,
                             *[F.lit(None).cast(_t("string")).alias(col) for col in _DICT_COLUMNS]))
    if not parts:
        return names, keys
    rows = (
        functools.reduce(lambda a, b: a.unionByName(b), parts)
        .select("*", F.xxhash64("lk0").alias("kh"))
        .join(F.broadcast(ids), "kh")
        .where(c("rep") | (c("want") == c("lk0")))
        .groupBy("rep", F.when(~c("rep"), c("lk0")).alias("lk0"),
                 *[F.when(c("rep"), c(col)).alias(col) for col in _DICT_COLUMNS])
        .agg(F.max("subtype").alias("subtype"), F.max("key").alias("key"))
        .select("*", *[F.xxhash64(col).alias(f"{col}_h") for col in _DICT_COLUMNS])
        .collect()
    )
    for r in rows:
        if r.rep:
            for col in _DICT_COLUMNS:
                if r[col] is not None:
                    names[int(r[f"{col}_h"])] = r[col]
        else:
            keys[r.lk0] = (r.subtype, r.key)
    return names, keys


# ---------------------------------------------------------------- the report


def build_report(spark: Any, inputs: Inputs, options: ReportOptions | None = None) -> ReportData:
    """Run every job of `semq report latency` and collect the tables.

    Raises :class:`ReportError` when the logs hold no message in the window.
    """
    _require_sketches()
    opts = options or ReportOptions()
    watch = _Stopwatch(opts.progress)
    inputs = _expand(spark, inputs)
    sources = _message_sources(spark, inputs, opts.since_ms, opts.until_ms)
    if sources.describe():
        opts.progress(sources.describe())
    final, stored_facts = sources.final, sources.facts
    fast = final is not None and stored_facts is not None
    grouped = _per_message(sources.events, sources.partials, partials_distinct=sources.partials_distinct,
                           strings=fast)
    if fast:
        assert final is not None and stored_facts is not None
        # The closed messages' rows are read once, by the first aggregation
        # over the legs; their facts were stored with them. Only the open
        # messages are merged here (and stored, for the facts and the legs).
        # The stored rows have the types the same aggregations give (each
        # DataFrame call costs the driver an analysis of the plan: no casts).
        opened = stored = grouped.localCheckpoint(eager=False)
        facts_rows = _merge_facts(stored_facts.unionByName(message_facts(opened)))
        grouped = final.unionByName(opened)
    else:
        # localCheckpoint keeps the rows as they are (memory, spilling to
        # disk); persist() would first build compressed column batches, which
        # measured several times slower on this 1 M-row table. Not eager: the
        # first job over the table (the facts) computes and stores it in the
        # same pass, instead of a count job storing it and the facts job
        # reading it back.
        grouped = stored = grouped.localCheckpoint(eager=False)
        facts_rows = message_facts(grouped)
    facts = _message_facts(facts_rows.collect())
    watch.lap("join events by LK0", f"{facts.total_messages:,} messages, {facts.duplicates:,} "
              f"duplicate lines ignored, {facts.malformed:,} malformed")
    if not facts.total_messages:
        stored.unpersist()
        raise ReportError("the logs hold no message events in the time window")

    periods = offline_periods(facts.node_events)
    offsets = estimate_offsets(facts.bounds, {facts.names[h] for h in facts.messages})
    watch.lap("clock offsets", f"{len(offsets)} clocks, {len(periods)} offline periods")
    off_by_hash = {h: offsets[n].offset_ms for h, n in facts.names.items() if n in offsets}
    last_by_logger = {facts.names[h]: ts for h, ts in facts.last.items()}
    for lg, _node, ts, _ev in facts.node_events:
        last_by_logger[lg] = max(last_by_logger.get(lg, ts), ts)
    by_name = {n: h for h, n in facts.names.items()}
    as_of = max(
        (last - off_by_hash.get(by_name.get(lg, 0), 0) for lg, last in last_by_logger.items()),
        default=0,
    )

    messages = grouped.where(~grouped["k"].startswith("\u0001")).withColumnRenamed("k", "lk0")
    # Stored by the first aggregation over it (see grouped above).
    detail = _derive(spark, messages, off_by_hash, periods, as_of, opts).localCheckpoint(eager=False)
    stored.unpersist()
    watch.lap("legs per message")

    aggregated = _aggregates(detail, opts, as_of)
    if aggregated is None:
        detail.unpersist()
        raise ReportError("no message was queued in the time window")
    watch.lap("aggregates", "pair, AppKey, SaveFwd, day, hour")
    histogram = _histogram(detail)
    stuck_rows, failed_rows = _stuck_and_failed_rows(detail)
    message_rows = _message_rows(detail) if opts.with_messages else None
    unnamed = {k: v for k, v in facts.representatives.items() if k[1] not in facts.strings}
    listed = detail.where(detail["outcome"].isin("stuck", "failed"))
    if fast:
        # The listed messages' AppKey strings came with their rows; those
        # without may have them only in events read (dates the window cuts).
        app_keys = {r.lk0: (r.subtype, r.key) for r in (*stuck_rows, *failed_rows)
                    if r.subtype is not None or r.key is not None}
        missing = sources.events is not None and len(app_keys) < len(stuck_rows) + len(failed_rows)
        names, found = _lookup(spark, sources, listed.where(detail["key"].isNull()).select("lk0")
                               if missing else None, unnamed, partials=False)
        app_keys.update(found)
    else:
        names, app_keys = _lookup(spark, sources, listed.select("lk0") if stuck_rows or failed_rows else None,
                                  unnamed)
    detail.unpersist()
    watch.lap("stuck and failed", f"{len(stuck_rows):,} stuck, {len(failed_rows):,} failed")

    # The real names of the loggers, from now on.
    names = {**facts.strings, **names}
    renamed = {facts.names[h]: names.get(h, facts.names[h]) for h in facts.names}
    names = {**facts.names, **names}
    offsets = _rename_offsets(offsets, renamed)
    bounds = [OrderBound(renamed.get(b.earlier, b.earlier), renamed.get(b.later, b.later),
                         b.min_delta_ms, b.samples) for b in facts.bounds]
    report = ReportData()
    for table in aggregated.tables(names):
        report.add(table)
    report.add(histogram)
    stuck, failed = _stuck_and_failed(stuck_rows, failed_rows, opts.stuck_after_ms, names, app_keys)
    report.add(stuck)
    report.add(failed)
    if message_rows is not None:
        report.add(message_rows.table(names))
    report.add(_skew_table(offsets, bounds))
    report.add(_offline_table(periods, offsets, as_of))
    report.add(_inputs_table(facts, names, offsets))
    report.meta.update(
        {
            "generated_at": int(time.time() * 1000),
            "inputs": inputs.describe(),
            "since_ms": opts.since_ms,
            "until_ms": opts.until_ms,
            "window_start_ms": aggregated.window_start,
            "window_end_ms": aggregated.window_end,
            "as_of_ms": as_of,
            "stuck_after_ms": opts.stuck_after_ms,
            "events": sum(facts.lines.values()) + facts.malformed,
            "duplicate_events": facts.duplicates,
            "malformed_events": facts.malformed,
            "messages": aggregated.messages,
            "reference_clock": next(
                (o.reference for o in offsets.values()), None
            ),
            "master": spark.sparkContext.master,
            # Dates of compacted datasets read as per-message partials / as events.
            "compacted_dates": {"partials": sources.partial_days, "events": sources.event_days},
            # Closed messages taken from their finished rows (dates of one compaction run).
            "compacted_final": sources.final is not None,
            "stage_seconds": dict(watch.stages),
        }
    )
    return report


def _rename_offsets(offsets: dict[str, ClockOffset], renamed: dict[str, str]) -> dict[str, ClockOffset]:
    def n(x: str | None) -> str | None:
        return None if x is None else renamed.get(x, x)

    out = {}
    for o in offsets.values():
        logger = renamed.get(o.logger, o.logger)
        out[logger] = dataclasses.replace(o, logger=logger, reference=n(o.reference) or o.reference,
                                          via=n(o.via))
    return out


def _require_sketches() -> None:
    from pyspark.sql import functions as F

    if not hasattr(F, "kll_merge_agg_bigint"):
        import pyspark

        raise ReportError(
            f"Spark reports need pyspark 4.1.2 or newer (KLL sketches), this is {pyspark.__version__}: "
            "pip install -U 'semq[analytics]'"
        )


def _derive(spark: Any, messages: Any, offsets: dict[int, int], periods: list[OfflinePeriod],
            as_of: int, opts: ReportOptions) -> Any:
    """Per-message legs on one clock, skew-corrected cross legs, outcome and place."""
    from pyspark.sql import functions as F

    c = F.col
    # The offsets are few: a literal map from logger hash to offset, no join.
    hashes = {h: int(o) for h, o in offsets.items()}
    if hashes:
        off_map = F.create_map(*[x for h, o in sorted(hashes.items()) for x in (F.lit(h), F.lit(o))])
    # One select per step: each DataFrame call costs the driver an analysis of the plan.
    m = messages.select("*", *[
        (F.coalesce(off_map[c(f"{prefix}_lh")], F.lit(0)) if hashes else F.lit(0))
        .cast(_t("long")).alias(f"{prefix}_off")
        for prefix in ("o", "p", "r")
    ])

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

    m = _with_target_offline(spark, m, periods, as_of)

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
        # Hour bucket as epoch ms (formatted on the driver: date_format per row is slow).
        (c("t0") - F.pmod(c("t0"), F.lit(HOUR_MS))).alias("hour"),
        (c("t0") - F.pmod(c("t0"), F.lit(DAY_MS))).alias("day"),
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
        # The AppKey strings of the listed messages, when the rows carry them
        # (closed messages of compacted dates).
        *[(F.when(outcome.isin("stuck", "failed"), c(col)) if col in messages.columns
           else F.lit(None).cast(_t("string"))).alias(col) for col in PARTIAL_STRINGS],
    )


def _with_target_offline(spark: Any, m: Any, periods: list[OfflinePeriod], as_of: int) -> Any:
    """Add ``target_offline_ms``: how long the target was offline, for messages
    the platform found it offline (stored or dropped them).

    The period containing that moment is found with an equi-join on time
    buckets: each period is listed once per bucket it touches, so a message
    meets only the one or two periods of its own bucket (a join on the time
    range alone would test every period of the node for every message).
    """
    from pyspark.sql import functions as F

    c = F.col
    found = F.least(c("p_stored"), c("p_dropped"))
    finite = [x for p in periods for x in (p.start, p.end) if x is not None]
    if not finite:
        return m.withColumn("target_offline_ms", F.lit(None).cast(_t("long")))
    first, last = min(finite), max(finite)
    width = max(HOUR_MS, (last - first) // 1024 + 1)
    lowest, highest = -(1 << 62), 1 << 62
    rows = []
    for p in periods:
        lo = lowest if p.start is None else p.start
        hi = highest if p.end is None else p.end
        for b in range((max(lo, first) - first) // width, (min(hi, last) - first) // width + 1):
            rows.append((p.logger, p.node, b, p.start, lo, p.end, hi))
    pdf = _literal_table(
        spark, rows,
        "per_logger string, per_node string, per_b long, per_start long, per_lo long, "
        "per_end long, per_hi long",
    ).select(
        "*", F.xxhash64("per_logger").alias("per_lh"), F.xxhash64("per_node").alias("per_nh"),
        F.xxhash64(F.xxhash64("per_logger"), F.xxhash64("per_node"), "per_b").alias("per_key"),
    )
    # The bucket of the moment (clamped into the periods' span), as computed
    # for the periods above; exact in doubles: epoch ms are far below 2**53.
    bucket = F.floor(
        (F.least(F.greatest(found, F.lit(first)), F.lit(last)) - F.lit(first)) / F.lit(width)
    )
    m = m.select("*", found.alias("found_offline"),
                 F.when(found.isNotNull(), F.xxhash64(c("p_lh"), c("target_h"), bucket)).alias("offline_key"))
    cond = (
        (c("offline_key") == c("per_key"))
        & (c("p_lh") == c("per_lh")) & (c("target_h") == c("per_nh"))
        & (c("found_offline") >= c("per_lo")) & (c("found_offline") < c("per_hi"))
    )
    m = m.join(F.broadcast(pdf), cond, "left")
    offline = (
        F.coalesce(c("per_end") - c("p_off"), F.lit(as_of))
        - (F.coalesce(c("per_start"), c("found_offline")) - c("p_off"))
    )
    return m.withColumn(
        "target_offline_ms",
        F.when(c("per_node").isNotNull(), F.when(offline.isNotNull(), F.greatest(offline, F.lit(0)))),
    )


# ---------------------------------------------------------------- tables


_SPARK_TO_TABLE: Final = {
    "string": "string", "bigint": "long", "int": "long", "double": "double", "boolean": "bool",
    "float": "double", "smallint": "long", "tinyint": "long",
}


def _format_hour(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:00")


def _format_day(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


# (name, title, grouping columns of the detail table)
_GROUPINGS: Final = (
    ("by_pair", "Per source → target", ("source_h", "target_h")),
    ("by_appkey", "Per AppKey domain and type", ("domain_h", "data_type_h")),
    ("by_save_fwd", "Per SaveFwd mode", ("save_fwd",)),
    ("by_hour", "Per hour (UTC)", ("hour",)),
)
_GROUP_COLUMNS: Final = ("source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "hour")
# The grouping sets Spark aggregates: every message goes into one group of
# each (a copy of the row per set). The AppKey and SaveFwd tables are rolled
# up from their combinations (a few dozen groups), so a message is counted
# and sketched three times instead of four.
_APPKEY_SAVE_FWD: Final = ("domain_h", "data_type_h", "save_fwd")
_SETS: Final = (("source_h", "target_h"), _APPKEY_SAVE_FWD, ("hour",))
_ROLLED_UP: Final = (("domain_h", "data_type_h"), ("save_fwd",))


def _grouping_id(keys: tuple[str, ...]) -> int:
    """Spark's grouping_id() of a grouping set: bit set = column not in the set (first column highest)."""
    n = len(_GROUP_COLUMNS)
    return sum(1 << (n - 1 - i) for i, col in enumerate(_GROUP_COLUMNS) if col not in keys)


@dataclass(kw_only=True)
class _Aggregated:
    """The collected aggregate rows; tables are built once the names are known."""

    rows: dict[str, list[dict[str, Any]]]  # table name -> rows (hash keys, hour/day as ms)
    window_start: int
    window_end: int
    messages: int

    def tables(self, names: dict[int, str]) -> list[Table]:
        out = []
        for name, title, keys in (("overall", "All messages", ()), *_GROUPINGS[:3],
                                  ("by_day", "Per day (UTC)", ("day",)), _GROUPINGS[3]):
            out.append(_aggregate_table(name, title, list(keys), self.rows[name],
                                        self.window_start, self.window_end, names))
            if name == "overall":
                out.append(_legs_table(self.rows["overall"][0]))
        return out


def _aggregates(detail: Any, opts: ReportOptions, as_of: int) -> _Aggregated | None:
    """Every aggregate table from two passes over the legs (None: no message in the window).

    Both passes aggregate the same grouping sets (:data:`_SETS`: pair, AppKey
    x SaveFwd, hour). The first computes counts, sums and maxima: a hash
    aggregation in generated code, whose AppKey, SaveFwd, per-day and overall
    rows are summed up from the combination and hourly rows here on the
    driver. The second sketches every leg (KLL); the AppKey, SaveFwd, day and
    overall sketches merge those, so no value is sketched twice. They are apart because Spark runs a sketch, an object aggregate,
    in its generic aggregation path, where each count, sum or max beside it
    cost several times what it costs in generated code (measured on 1 M
    messages: one combined pass 11.6 s of task CPU; the two passes 3.2 s
    and 4.5 s).
    """
    from pyspark.sql import functions as F

    c = F.col
    plain = [F.count(F.lit(1)).alias("messages")]
    plain += [F.count(F.when(c("outcome") == o, 1)).alias(o) for o in OUTCOMES]
    for leg in LEG_NAMES:
        plain += [F.max(leg).alias(f"{leg}_max"), F.count(leg).alias(f"{leg}__n"),
                  F.sum(leg).alias(f"{leg}__sum")]
    plain += [F.sum(f"clamped_{n}").alias(f"clamped_{n}") for n in _CROSS_LEGS]
    plain += [
        F.sum("resends").alias("resends"),
        F.count(F.when(c("resends") > 0, 1)).alias("resent"),
        F.sum("inquiries").alias("inquiries"),
        F.sum("duplicates").alias("duplicates_suppressed"),
        F.sum("redeliveries").alias("redeliveries"),
        F.max("target_offline_ms").alias("target_offline_max_ms"),
        F.min("t0").alias("first_ms"),
        F.max("t0").alias("last_ms"),
    ]
    sets = [list(keys) for keys in _SETS]
    hour_gid = _grouping_id(("hour",))
    rows = [
        r.asDict()
        for r in detail.groupingSets(sets, *_GROUP_COLUMNS)
        .agg(F.grouping_id().alias("gid"), *plain).collect()
    ]
    combined = [r for r in rows if r["gid"] == _grouping_id(_APPKEY_SAVE_FWD)]
    rows = [r for r in rows if r["gid"] != _grouping_id(_APPKEY_SAVE_FWD)]
    for keys in _ROLLED_UP:
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in combined:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r)
        rows += [{**dict.fromkeys(_GROUP_COLUMNS), **_merge_plain(rs), **dict(zip(keys, key, strict=True)),
                  "gid": _grouping_id(keys)} for key, rs in groups.items()]
    hours = [r for r in rows if r["gid"] == hour_gid]
    by_day: dict[int, list[dict[str, Any]]] = {}
    for r in hours:
        by_day.setdefault(r["hour"] - r["hour"] % DAY_MS, []).append(r)
    rows += [{**_merge_plain(rs), "gid": -1, "hour": day} for day, rs in sorted(by_day.items())]
    if hours:
        rows.append({**_merge_plain(hours), "gid": -2, "hour": None})
    overall = [r for r in rows if r["gid"] == -2]
    if not overall or not overall[0]["messages"]:
        return None

    sketched = (
        detail.groupingSets(sets, *_GROUP_COLUMNS)
        .agg(F.grouping_id().alias("gid"),
             *[F.kll_sketch_agg_bigint(leg, SKETCH_K).alias(leg) for leg in LEG_NAMES])
        .localCheckpoint(eager=True)
    )
    hourly = sketched.where(c("gid") == hour_gid)
    merge = [F.kll_merge_agg_bigint(leg, SKETCH_K).alias(leg) for leg in LEG_NAMES]
    # Days and the overall row (gid -1, -2) from the hourly sketches.
    merged = (
        hourly.groupBy((c("hour") - F.pmod(c("hour"), F.lit(DAY_MS))).alias("hour"))
        .agg(*merge).select(F.lit(-1).alias("gid"), "*")
        .unionByName(hourly.agg(*merge).select(F.lit(-2).alias("gid"),
                                               F.lit(None).cast(_t("long")).alias("hour"), "*"),
                     allowMissingColumns=True)
    )
    # AppKey and SaveFwd from the sketches of their combinations.
    combined = sketched.where(c("gid") == _grouping_id(_APPKEY_SAVE_FWD))
    for keys in _ROLLED_UP:
        merged = merged.unionByName(
            combined.groupBy(*keys).agg(*merge).select(F.lit(_grouping_id(keys)).alias("gid"), "*"),
            allowMissingColumns=True,
        )
    ranks = F.array(*[F.lit(p) for p in PERCENTILES])

    def finish(df: Any) -> Any:
        cols: list[Any] = [col for col in df.columns if col not in LEG_NAMES]
        for leg in LEG_NAMES:
            pct = F.when(F.kll_sketch_get_n_bigint(leg) > 0, F.kll_sketch_get_quantile_bigint(leg, ranks))
            cols += [pct[i].alias(f"{leg}_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)]
        return df.select(*cols)

    percentiles = {
        _group_key(r): r
        for r in (x.asDict() for x in finish(sketched).unionByName(finish(merged),
                                                                   allowMissingColumns=True).collect())
    }
    sketched.unpersist()
    names = [f"{leg}_p{round(p * 100)}" for leg in LEG_NAMES for p in PERCENTILES]
    for r in rows:
        found = percentiles.get(_group_key(r), {})
        r.update({n: found.get(n) for n in names})
    top = overall[0]
    by_table: dict[str, list[dict[str, Any]]] = {
        "overall": overall,
        "by_day": [{**r, "day": r["hour"]} for r in rows if r["gid"] == -1],
    }
    for name, _, keys in _GROUPINGS:
        by_table[name] = [r for r in rows if r["gid"] == _grouping_id(keys)]
    return _Aggregated(
        rows=by_table,
        window_start=opts.since_ms if opts.since_ms is not None else int(top["first_ms"]),
        window_end=opts.until_ms if opts.until_ms is not None else as_of,
        messages=int(top["messages"]),
    )


def _group_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Which aggregate row this is: grouping set and its key values."""
    return (row["gid"], *[row.get(col) for col in _GROUP_COLUMNS])


def _merge_plain(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts, sums, maxima and minima of several aggregate rows as one row
    (nulls ignored; null when every row has null, as Spark's aggregates)."""
    out: dict[str, Any] = {}
    for name in rows[0]:
        if name in _GROUP_COLUMNS or name == "gid":
            continue
        values = [r[name] for r in rows if r[name] is not None]
        if not values:
            out[name] = None
        elif name.endswith("_max") or name in ("target_offline_max_ms", "last_ms"):
            out[name] = max(values)
        elif name == "first_ms":
            out[name] = min(values)
        else:
            out[name] = sum(values)
    return out


_AGG_TYPES: Final = {"messages": "long", "resend_rate": "double", "per_minute": "double"}


def _aggregate_table(name: str, title: str, keys: list[str], rows: list[dict[str, Any]],
                     window_start: int, window_end: int, names: dict[int, str]) -> Table:
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
    return Table(name=name, title=title, columns=columns, types=types, rows=out)


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


def _histogram(detail: Any) -> Table:
    """Log-scale latency distribution of end to end and delivery (4 bins per decade)."""
    from pyspark.sql import functions as F

    vals = detail.select(
        F.stack(F.lit(2), F.lit("e2e_ms"), F.col("e2e_ms"), F.lit("delivery_ms"), F.col("delivery_ms"))
        .alias("metric", "v")
    ).where(F.col("v").isNotNull())
    binned = vals.select(
        "metric",
        F.when(F.col("v") < 1, F.lit(-1))
        .otherwise(F.floor(F.log10(F.col("v")) * HIST_BINS_PER_DECADE))
        .cast(_t("long")).alias("bin"),
    )
    rows = sorted(
        (r["metric"], int(r["bin"]), int(r["count"]))
        for r in binned.groupBy("metric", "bin").count().collect()
    )
    out = []
    for metric, b, count in rows:
        lo = 0 if b < 0 else math.ceil(10 ** (b / HIST_BINS_PER_DECADE))
        hi = 1 if b < 0 else math.ceil(10 ** ((b + 1) / HIST_BINS_PER_DECADE))
        out.append((metric, b, lo, hi, count))
    return Table(
        name="histogram", title="Latency distribution",
        columns=["metric", "bin", "low_ms", "high_ms", "messages"],
        types=["string", "long", "long", "long", "long"], rows=out,
        description="messages per log-scale bin [low_ms, high_ms)",
    )


_Listed = collections.namedtuple("_Listed", (
    "lk0", "source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "outcome", "place",
    "since", "age_ms", "resends", "inquiries", "target_offline_ms", "evidence", "failure",
    "code", "failed_at", "subtype", "key",  # the last two: PARTIAL_STRINGS
))


def _stuck_and_failed_rows(detail: Any) -> tuple[list[Any], list[Any]]:
    """The stuck and the failed messages, from one filter over the legs."""
    from pyspark.sql import functions as F

    # As named tuples: a pyspark Row finds a field by name with a linear
    # search, which for tens of thousands of listed messages took a second.
    rows = [_Listed._make(r) for r in detail.where(F.col("outcome").isin("stuck", "failed"))
            .select(*_Listed._fields).collect()]
    stuck = sorted((r for r in rows if r.outcome == "stuck"),
                   key=lambda r: (r.since is None, r.since or 0, r.lk0))
    failed = sorted((r for r in rows if r.outcome == "failed"),
                    key=lambda r: (r.failed_at is None, r.failed_at or 0, r.lk0))
    return stuck, failed


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


def _message_rows(detail: Any) -> _MessageRows:
    df = detail.drop(*PARTIAL_STRINGS).orderBy("t0", "lk0")
    return _MessageRows(fields=list(df.schema.fields), rows=df.collect())


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
    """Write the logs as Parquet partitioned by UTC date (``OUT/date=YYYY-MM-DD/``),
    each date with its per-message partial rows (layout: :mod:`.compacted`).

    Dates present in the input replace the same dates in `out` (dynamic
    partition overwrite); other dates already there stay. Partials are then
    computed for every date of `out` that has none (the dates just written,
    and dates compacted before partials existed). Returns ``{"dates": [(date,
    events)], "replaced": [date], "events": n, "partials": [date]}`` for the
    dates written (for a URL `out`: every date in it, replaced unknown). Lines
    without a timestamp have no date and are not written.
    """
    import uuid

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    watch = _Stopwatch(progress)
    before = _date_dirs(out)
    events = load_events(spark, inputs)
    # The UTC date of `ts` whatever the session's time zone: reports rely on
    # a date partition holding exactly the events of that day.
    dated = events.withColumn(
        "date", F.date_from_unix_date(F.floor(F.col("ts") / DAY_MS).cast(_t("int")))
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
        written_df = written_df.where(F.col("date").isin(*_dates(written)))
    counts = written_df.groupBy("date").count().orderBy("date").collect()
    watch.lap("count", f"{len(counts)} date partition(s)")

    dates = list_dates(spark, out)
    todo = [d for d in dates.dates if d not in dates.with_partials]
    if todo:
        # From the events just written, not from the input: Parquet is read
        # many times faster than JSON is parsed, and the partials are then
        # by construction those of the events beside them.
        run = uuid.uuid4().hex
        staging = f"{out.rstrip('/')}/_staging-{run}"
        raw = spark.read.schema(spark_schema()).parquet(out)
        raw = _canonical(raw.where(F.col("date").isin(*_dates(todo))), "date")
        rows = message_partials(raw, "date", strings=True)
        # A message is closed in a date when all its rows of this run are in it
        # (layout: :mod:`.compacted`).
        by_message = Window.partitionBy("k")
        rows = rows.withColumn(
            "_closed", F.min("date").over(by_message) == F.max("date").over(by_message)
        ).localCheckpoint(eager=True)
        level1 = [*partial_columns(), *[(n, "string") for n in PARTIAL_STRINGS], ("date", "date")]
        closed = rows.where(F.col("_closed"))
        final = closed.groupBy("k", "date").agg(
            *[agg.alias(name) for name, agg in _level2()],
            *[F.max(col).alias(col) for col in PARTIAL_STRINGS],
        ).localCheckpoint(eager=True)
        try:
            for subset, df, columns in (
                ("final", final, [*final_columns(), ("date", "date")]),
                ("facts", message_facts(final, "date"), [*facts_columns(), ("date", "date")]),
                ("closed", closed, level1),
                ("open", rows.where(~F.col("_closed")), level1),
            ):
                _typed(df, columns).write.partitionBy("date").parquet(f"{staging}/{subset}")
            install_partials(spark, staging, out, todo, run)
        finally:
            rows.unpersist()
            final.unpersist()
            _delete(spark, staging)
        watch.lap("per-message partials", f"{len(todo)} date partition(s)")
    return {
        "dates": [(str(r["date"]), int(r["count"])) for r in counts],
        "replaced": replaced,
        "events": sum(int(r["count"]) for r in counts),
        "columns": list(FIELD_NAMES),
        "partials": todo,
    }


def _delete(spark: Any, path: str) -> None:
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(p):
        fs.delete(p, True)
