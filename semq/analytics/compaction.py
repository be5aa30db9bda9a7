"""``semq report compact``: the logs as Parquet by UTC date, with the
per-message partial rows of every date beside them (layout and the rules for
reading them back: :mod:`.compacted`; docs/analytics.md "Performance").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .compacted import install_partials, list_dates
from .events import FIELD_NAMES, spark_schema
from .facts import facts_columns, message_facts
from .inputs import Inputs
from .permessage import PARTIAL_STRINGS, _level2, final_columns, message_partials, partial_columns
from .reading import _canonical, load_events
from .sparkutil import DAY_MS, _dates, _delete, _Stopwatch, _t, _typed

__all__ = ["compact"]

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

