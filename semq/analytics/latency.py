"""``semq report latency``: every job of the report, in order, and its tables.

:func:`build_report` reads the logs (:mod:`.reading`), joins each message's
events (:mod:`.permessage`), learns the clocks and offline periods from the
small facts job (:mod:`.facts`, :mod:`.clocks`, :mod:`.periods`), derives the
legs (:mod:`.legs`), aggregates them (:mod:`.aggregates`), reads back the
strings behind the hashes (:func:`_lookup`) and collects the tables
(:mod:`.report_tables`). docs/analytics.md describes the report.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from .aggregates import _Aggregated, _aggregates, _histogram, _message_rows, _stuck_and_failed_rows
from .clocks import ClockOffset, OrderBound, estimate_offsets
from .errors import ReportError
from .facts import _Facts, _merge_facts, _message_facts, message_facts
from .inputs import Inputs
from .legs import _derive
from .options import ReportOptions
from .periods import offline_periods
from .permessage import _DICT_COLUMNS, PARTIAL_STRINGS, _per_message
from .reading import _expand, _message_sources, _Sources
from .report_tables import _inputs_table, _offline_table, _skew_table, _stuck_and_failed
from .sparkutil import _literal_table, _Stopwatch, _t
from .tables import ReportData

__all__ = ["ReportOptions", "build_report"]


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
    fast = sources.final is not None and sources.facts is not None
    grouped, stored, facts = _join(sources, fast)
    watch.lap("join events by LK0", f"{facts.total_messages:,} messages, {facts.duplicates:,} "
              f"duplicate lines ignored, {facts.malformed:,} malformed")
    if not facts.total_messages:
        stored.unpersist()
        raise ReportError("the logs hold no message events in the time window")

    periods = offline_periods(facts.node_events)
    offsets = estimate_offsets(facts.bounds, {facts.names[h] for h in facts.messages})
    watch.lap("clock offsets", f"{len(offsets)} clocks, {len(periods)} offline periods")
    off_by_hash = {h: offsets[n].offset_ms for h, n in facts.names.items() if n in offsets}
    as_of = _as_of(facts, off_by_hash)

    messages = grouped.where(~grouped["k"].startswith("\u0001")).withColumnRenamed("k", "lk0")
    # Stored by the first aggregation over it (see grouped in _join).
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
    report.meta.update(_meta(spark, inputs, sources, opts, facts, aggregated, offsets, as_of, watch))
    return report


def _join(sources: _Sources, fast: bool) -> tuple[Any, Any, _Facts]:
    """Each message's events joined (and, with compacted finished rows, the
    closed messages' rows beside the open ones): (the per-message table,
    what to unpersist once the legs are stored, the facts collected)."""
    final, stored_facts = sources.final, sources.facts
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
    return grouped, stored, _message_facts(facts_rows.collect())


def _as_of(facts: _Facts, off_by_hash: dict[int, int]) -> int:
    """The time the report is as of: the last event any logger wrote,
    corrected by its clock's offset."""
    last_by_logger = {facts.names[h]: ts for h, ts in facts.last.items()}
    for lg, _node, ts, _ev in facts.node_events:
        last_by_logger[lg] = max(last_by_logger.get(lg, ts), ts)
    by_name = {n: h for h, n in facts.names.items()}
    return max(
        (last - off_by_hash.get(by_name.get(lg, 0), 0) for lg, last in last_by_logger.items()),
        default=0,
    )


def _meta(spark: Any, inputs: Inputs, sources: _Sources, opts: ReportOptions, facts: _Facts, aggregated: _Aggregated,
          offsets: dict[str, ClockOffset], as_of: int, watch: _Stopwatch) -> dict[str, Any]:
    """What the report says about itself: its window, its inputs, its counts, its stages' times."""
    return {
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
