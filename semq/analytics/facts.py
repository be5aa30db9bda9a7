"""The small job over the per-message table: what the report needs to know
before it derives any leg.

One aggregation per combination of loggers and attributes gives the causal
bounds between clocks (each a cause and its effect of SPEC "The flow", for
:mod:`.clocks`; docs/analytics.md "Clock skew"), messages, lines and last time
stamps per logger, the platform's connection events (for :mod:`.periods`),
duplicate and malformed lines. Its rows merge exactly, so compaction stores
them for the messages closed in each date.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .clocks import OrderBound
from .permessage import _BAD_KEY, _NAME_KEY

__all__ = ["facts_columns", "message_facts"]

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
    """The small aggregation of the per-message table (rows of :func:`.permessage._level2`)
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
    # its role and hash; :func:`.clocks.estimate_offsets` only needs to tell platforms.
    for h in set(facts.lines) | {h for pair in upper for h in pair}:
        facts.names.setdefault(h, f"platform:#{h}" if h in platforms else f"org:#{h}")
    facts.bounds = [OrderBound(facts.names[a], facts.names[b], d, n) for (a, b), (d, n) in upper.items()]
    return facts
