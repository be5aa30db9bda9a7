"""Reading the delivery event logs (schema: docs/events.md) for a report.

JSON files, Parquet datasets and URLs listed through Hadoop's file systems,
cut to the window of event times a report needs (``SKEW_MARGIN_MS`` before
``--since``, ``FOLLOW_UP_MS`` after ``--until``). For the per-message step,
:func:`_message_sources` reads each compacted date either as the partial rows
``semq report compact`` stored (:mod:`.compacted`) or as its events
(docs/analytics.md "Performance").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from .compacted import list_dates, partials_path
from .errors import ReportError
from .events import FIELDS, parse_time, spark_schema
from .facts import facts_columns
from .inputs import JSON_SUFFIXES, Inputs
from .permessage import PARTIAL_STRINGS, final_columns, partial_columns
from .sparkutil import DAY_MS, _dates, _struct, _t, _utc_date

__all__ = ["FOLLOW_UP_MS", "SKEW_MARGIN_MS", "load_events"]

# Events this much before --since are read too: a message queued just after
# `since` on the reference clock may carry earlier stamps on a skewed clock.
SKEW_MARGIN_MS: Final = 3_600_000
# Events up to this long after --until are read to finish the legs of messages
# queued before `until` (stored for an offline target, confirmed later).
FOLLOW_UP_MS: Final = 86_400_000


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


def _local_uri(path: str) -> str:
    """A local absolute path as a ``file://`` URI; anything else as it is.

    Spark resolves a path without a scheme against the cluster's default file
    system, which is HDFS on YARN: ``/mnt/logs`` would be read from HDFS there
    although :func:`.inputs.resolve_inputs` found it on the local disk. As a
    ``file://`` URI every executor reads it from its own file system (the
    same files where that is a shared mount). Not percent-encoded: Hadoop's
    ``Path`` takes the characters as they are.
    """
    return f"file://{path}" if path.startswith("/") else path


def _expand(spark: Any, inputs: Inputs) -> Inputs:
    """`inputs` with local paths as ``file://`` URIs (:func:`_local_uri`) and
    its URLs listed into JSON files and Parquet datasets.

    Raises :class:`ReportError` when a URL holds no logs.
    """
    json_files = [_local_uri(p) for p in inputs.json_files]
    parquet_dirs = [_local_uri(p) for p in inputs.parquet_dirs]
    if not inputs.remote:
        return Inputs(json_files=json_files, parquet_dirs=parquet_dirs,
                      skipped_by_date=inputs.skipped_by_date)
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
    partials: Any | None  # partial rows of compacted dates (:func:`.permessage.message_partials`)
    partial_days: int
    # The partial rows come from one dataset, one row per (message, counted
    # event) at most: each date's rows are of one compaction and an event has
    # one date. Then nothing needs merging per (message, counted event).
    partials_distinct: bool = False
    # Finished per-message rows (:func:`.permessage.final_columns`) of the messages closed
    # in a date, when every date read is of one compaction run: no other row
    # read belongs to these messages. `partials` then holds only the open rows.
    final: Any | None = None
    # With `final`: their facts rows (:func:`.facts.message_facts`), per date.
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
