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
   sets (pair, AppKey x SaveFwd x path, hour): counts, sums and maxima in
   generated code, then mergeable KLL sketches for the percentiles; the
   AppKey, SaveFwd and path rows merge the rows and sketches of their combinations, the
   per-day rows and the overall row the hourly ones, so no value is
   sketched twice. The legs are computed and stored (``localCheckpoint``) by
   the first of these passes. Percentiles are exact for groups of up to
   :data:`SKETCH_K` values.
4. Stuck and failed messages: one filter over the cached legs; the strings
   behind the hashes (one message per distinct party, logger and AppKey type)
   and the AppKey subtype and key of the listed messages come from the
   compacted partials, or from one more scan of the events read as events
   (JSON, dates without partials).

Where each part lives: :mod:`.reading` (step 1's input), :mod:`.permessage`
(step 1), :mod:`.facts` (step 2's small aggregation), :mod:`.legs` (the legs,
outcomes and places, step 2), :mod:`.aggregates` (steps 3 and 4),
:mod:`.report_tables` (the tables made of the collected rows),
:mod:`.latency` (:func:`build_report`, the steps in order, and the strings
read back), :mod:`.compaction` (``semq report compact``) and
:mod:`.sparkutil` (the helpers they share). This module gathers their public
names, the ones ``semq report`` (:mod:`.cli`) and the tests import.

pyspark is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

from .aggregates import HIST_BINS_PER_DECADE, SKETCH_K
from .compaction import compact
from .facts import facts_columns, message_facts
from .latency import build_report
from .legs import LEG_NAMES, LEGS, OUTCOMES, PERCENTILES, PLACES, Leg
from .options import ReportOptions
from .permessage import (
    IDENTITY_FIELDS,
    PARTIAL_STRINGS,
    final_columns,
    message_partials,
    partial_columns,
)
from .reading import FOLLOW_UP_MS, SKEW_MARGIN_MS, load_events
from .sparkutil import DAY_MS, HOUR_MS

__all__ = [
    "DAY_MS",
    "FOLLOW_UP_MS",
    "HIST_BINS_PER_DECADE",
    "HOUR_MS",
    "IDENTITY_FIELDS",
    "LEGS",
    "LEG_NAMES",
    "OUTCOMES",
    "PARTIAL_STRINGS",
    "PERCENTILES",
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
