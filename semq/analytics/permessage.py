"""The per-message step of a report: every event of a message joined by its LK0.

One shuffle of the events by LK0, then two hash aggregations in the same
tasks (docs/analytics.md "Per message"): first by (message, identity of a
counted event), which drops exact duplicate lines, then by message: the first
time of every step of SPEC "The flow", the link the document took (direct
or relay), the counts (sends, resends, inquiries, duplicates), the
attributes. Strings travel as 64-bit hashes.
The first aggregation's rows are what ``semq report compact`` stores per date
(:func:`message_partials`, layout in :mod:`.compacted`); they merge exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final

from .events import EVENTS_BY_ROLE, FIELDS, NODE_EVENTS, ROLES
from .sparkutil import _t

__all__ = [
    "IDENTITY_FIELDS",
    "PARTIAL_STRINGS",
    "final_columns",
    "message_partials",
    "partial_columns",
]

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
# distinct values are few and are read back at the end (:func:`.latency._lookup`).
_DICT_COLUMNS: Final = ("source", "target", "domain", "data_type", "logger")


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
# The link of a document (docs/events.md "path"): that of the receiver's first
# `received` (the copy that reached the inbox), else of the origin's last
# `sent`. Each is kept as ``ts * 2 + direct`` (direct 1, relay 0): the min
# (max) of these numbers over the events is the first (last) one's time and
# link, a plain aggregate of one long that merges exactly like the others.
# Partials compacted before the column existed read it as null, which is
# right: their events were compacted without `path` either (relay).
_PATHS: Final = (
    ("r_received_path", "min", "receiver", "received"),
    ("o_sent_path", "max", "origin", "sent"),
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
                  ("receiver", "reack"), ("receiver", "held"), ("receiver", "gap_dropped"))
# Fields that tell two events of one message apart: lines equal in all of them
# are one event logged twice (a log copied or given twice).
IDENTITY_FIELDS: Final = ("logger", "role", "event", "lk0", "ts", "attempt", "code", "detail")


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
    """A string column as its 64-bit hash (null stays null), decoded by :func:`.latency._lookup`."""
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
    # The time and link of an event in one number (see _PATHS); a line
    # without `path` (written before direct links) is relay; a document
    # between users of one node (`local`) went through no relay: direct.
    path_ts = F.shiftleft(c("ts"), 1) + F.when(c("path").isin("direct", "local"), 1).otherwise(0)
    return (
        events.where(~F.coalesce(unused, F.lit(False)))
        .select("*", _event_code().alias("ec"))
        .select(
            key.alias("k"), "ts", "ec", "code", "attempt", "save_fwd", "ack2", "reliable",
            path_ts.alias("path_ts"),
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
    *[(name, how, "bigint") for name, how, _, _ in _PATHS],
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
    merge = {"min": F.min, "max": F.max}
    aggregates = [
        *[F.min(F.when(ec == _EVENT_CODES[(r, e)], ts)) for _, r, e in _FIRSTS],
        *[merge[how](F.when(ec == _EVENT_CODES[(r, e)], c("path_ts"))) for _, how, r, e in _PATHS],
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
    one message and counted event, see :class:`.reading._Sources`) the first
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
    *[(name, "bigint") for name, _, _, _ in _PATHS],
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
    merge = {"min": F.min, "max": F.max}
    aggregates = [
        *[F.min(name) for name, _, _ in _FIRSTS],
        *[merge[how](name) for name, how, _, _ in _PATHS],
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
