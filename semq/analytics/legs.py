"""What a latency report measures per message, and its derivation.

The legs of a message's way (SPEC "The flow": queued, sent, forwarded or
stored, delivered, in the inbox, confirmed by ACK2), each on the clock that
measures it, cross-clock legs corrected by the estimated offsets; its outcome
(confirmed, delivered, failed, best effort, in flight, stuck), the link it
took (direct or relay) and, when not confirmed, where it is
(docs/analytics.md "Per message"). :func:`_derive` computes them for every
message from the per-message table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .options import ReportOptions
from .periods import OfflinePeriod
from .permessage import PARTIAL_STRINGS
from .sparkutil import DAY_MS, HOUR_MS, _literal_table, _t

__all__ = ["LEGS", "LEG_NAMES", "OUTCOMES", "PERCENTILES", "PLACES", "Leg"]

# The percentiles of every leg a report gives (p50, p90, p99; docs/analytics.md "Aggregates").
PERCENTILES: Final = (0.5, 0.9, 0.99)
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


def _ref(col: str) -> Any:
    """A timestamp moved to the reference clock (by its party's offset)."""
    from pyspark.sql import functions as F

    return F.col(col) - F.col(f"{col[0]}_off")


def _clamp(x: Any) -> Any:
    """A leg no shorter than 0; greatest() would turn a missing leg into 0:
    a missing leg stays null."""
    from pyspark.sql import functions as F

    return F.when(x.isNotNull(), F.greatest(x, F.lit(0)))


def _with_legs(messages: Any, offsets: dict[int, int]) -> Any:
    """The per-message table with each party's clock offset, the message's
    first time on the reference clock (``t0``) and its legs: those on one
    clock as they are, the cross-clock ones skew-corrected (and flagged when
    the correction had to clamp them)."""
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
    ref, clamp = _ref, _clamp
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
    return m.select(
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


def _derive(spark: Any, messages: Any, offsets: dict[int, int], periods: list[OfflinePeriod],
            as_of: int, opts: ReportOptions) -> Any:
    """Per-message legs on one clock, skew-corrected cross legs, outcome and place."""
    from pyspark.sql import functions as F

    c = F.col
    m = _with_legs(messages, offsets)
    if opts.since_ms is not None:
        m = m.where(c("t0") >= opts.since_ms)
    if opts.until_ms is not None:
        m = m.where(c("t0") < opts.until_ms)

    m = _with_target_offline(spark, m, periods, as_of)

    reliable = F.coalesce(c("reliable"), F.lit(True))
    ack2_asked = F.coalesce(c("ack2"), F.lit(True))
    confirmed = c("o_ack2").isNotNull() | c("r_reack2").isNotNull()
    received = c("r_received").isNotNull() | c("r_inbox").isNotNull() | c("p_acked").isNotNull()
    failed_at = F.least(_ref("o_nack"), _ref("p_dropped"), _ref("p_refused"), _ref("o_expired"),
                        _ref("o_dead"))
    failure = (
        F.when(c("p_dropped").isNotNull(), "dropped")
        .when(c("p_refused").isNotNull(), "refused")
        .when(c("o_nack").isNotNull(), "nack")
        .when(c("o_expired").isNotNull(), "expired")
        .when(c("o_dead").isNotNull(), "dead")
    )
    age = F.lit(as_of) - c("t0")
    # The receiver's first arrival decides, else the origin's last send
    # (:data:`.permessage._PATHS`: the low bit is the link).
    path_bits = F.coalesce(c("r_received_path"), c("o_sent_path"))
    path = F.when(path_bits.bitwiseAND(F.lit(1)) == 1, "direct").otherwise("relay")
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
               F.coalesce(_ref("r_inbox"), _ref("r_received")))
        .when(c("p_stored").isNotNull(), _ref("p_stored"))
        .when(c("p_forwarded").isNotNull(), _ref("p_forwarded"))
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
        path.alias("path"),
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
