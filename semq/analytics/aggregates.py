"""The aggregates of a latency report, collected from the legs of every message.

Two passes over the cached legs, both over grouping sets (pair, AppKey x
SaveFwd x path, hour): counts, sums and maxima, then mergeable KLL sketches
for the percentiles, rolled up on the driver into the AppKey, SaveFwd, path,
day and overall rows (docs/analytics.md "Aggregates", "Performance"). Also the
latency histogram, the stuck and failed messages and, for tests, every
message's row. The rows become tables in :mod:`.report_tables`.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any, Final

from .legs import _CROSS_LEGS, LEG_NAMES, OUTCOMES, PERCENTILES
from .options import ReportOptions
from .permessage import PARTIAL_STRINGS
from .report_tables import _aggregate_table, _legs_table, _MessageRows
from .sparkutil import DAY_MS, _t
from .tables import Table

__all__ = ["HIST_BINS_PER_DECADE", "SKETCH_K"]

# KLL sketch size (kll_sketch_agg_bigint). A sketch keeps every value until it
# holds more than K, so percentiles are exact for groups of up to K values
# (the tests rely on that); above, the rank error is about 0.3% of the group
# (99% confidence). Measured on 1 M messages: the same time for K = 200..4000
# (the cost is per value, not per K), 3x less than percentile_approx; K sets
# the memory of a sketch (at most ~3K values).
SKETCH_K: Final = 1_000
HIST_BINS_PER_DECADE: Final = 4


# (name, title, grouping columns of the detail table)
_GROUPINGS: Final = (
    ("by_pair", "Per source → target", ("source_h", "target_h")),
    ("by_appkey", "Per AppKey domain and type", ("domain_h", "data_type_h")),
    ("by_save_fwd", "Per SaveFwd mode", ("save_fwd",)),
    ("by_path", "Latency by path", ("path",)),
    ("by_hour", "Per hour (UTC)", ("hour",)),
)
_GROUP_COLUMNS: Final = ("source_h", "target_h", "domain_h", "data_type_h", "save_fwd", "path", "hour")
# The grouping sets Spark aggregates: every message goes into one group of
# each (a copy of the row per set). The AppKey, SaveFwd and path tables are
# rolled up from their combinations (a few dozen groups, at most twice as
# many with both paths), so a message is counted and sketched three times
# instead of five.
_COMBINED: Final = ("domain_h", "data_type_h", "save_fwd", "path")
_SETS: Final = (("source_h", "target_h"), _COMBINED, ("hour",))
_ROLLED_UP: Final = (("domain_h", "data_type_h"), ("save_fwd",), ("path",))
# What a table's rows are, where the title does not say it (under the HTML table).
_DESCRIPTIONS: Final = {
    "by_path": "direct: the document reached the receiver over a direct node-to-node link; "
    "relay: through the platform. The link of the copy the receiver got first, else of the "
    "origin's last send; logs without a path field count as relay (docs/events.md)",
}


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
        for name, title, keys in (("overall", "All messages", ()), *_GROUPINGS[:-1],
                                  ("by_day", "Per day (UTC)", ("day",)), _GROUPINGS[-1]):
            out.append(_aggregate_table(name, title, list(keys), self.rows[name],
                                        self.window_start, self.window_end, names,
                                        _DESCRIPTIONS.get(name, "")))
            if name == "overall":
                out.append(_legs_table(self.rows["overall"][0]))
        return out


def _aggregates(detail: Any, opts: ReportOptions, as_of: int) -> _Aggregated | None:
    """Every aggregate table from two passes over the legs (None: no message in the window).

    Both passes aggregate the same grouping sets (:data:`_SETS`: pair, AppKey
    x SaveFwd x path, hour). The first computes counts, sums and maxima: a hash
    aggregation in generated code, whose AppKey, SaveFwd, path, per-day and overall
    rows are summed up from the combination and hourly rows here on the
    driver. The second sketches every leg (KLL); the AppKey, SaveFwd, path, day
    and overall sketches merge those, so no value is sketched twice. They are apart because Spark runs a sketch, an object aggregate,
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
    combined = [r for r in rows if r["gid"] == _grouping_id(_COMBINED)]
    rows = [r for r in rows if r["gid"] != _grouping_id(_COMBINED)]
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
    # AppKey, SaveFwd and path from the sketches of their combinations.
    combined = sketched.where(c("gid") == _grouping_id(_COMBINED))
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


def _message_rows(detail: Any) -> _MessageRows:
    df = detail.drop(*PARTIAL_STRINGS).orderBy("t0", "lk0")
    return _MessageRows(fields=list(df.schema.fields), rows=df.collect())
