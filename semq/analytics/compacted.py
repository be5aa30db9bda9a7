"""The layout of a dataset ``semq report compact`` writes, and its per-message partials.

::

    DIR/date=YYYY-MM-DD/part-*.parquet                  the events of that UTC date
    DIR/date=YYYY-MM-DD/_messages/final/part-*.parquet  per-message rows of its closed messages
    DIR/date=YYYY-MM-DD/_messages/facts/part-*.parquet  what the report's first small job needs of them
    DIR/date=YYYY-MM-DD/_messages/closed/part-*.parquet their partial rows
    DIR/date=YYYY-MM-DD/_messages/open/part-*.parquet   partial rows of the other messages
    DIR/date=YYYY-MM-DD/_messages/_COMPLETE_V4.<run>    written once all of those are there

The events are the log lines, unchanged (docs/events.md). The partial rows
are the first aggregation of the report's per-message step over the events
of that date (:func:`.permessage.message_partials`): one row per message and
counted event, which a report merges with the rows of the message's other
dates, compaction runs and inputs instead of shuffling every event again;
with the AppKey subtype and key of each message and one row per distinct
party, logger and AppKey type naming its hash, so a report over compacted
dates reads no event at all.

One compaction run computes the partials of all the dates it writes
together (``<run>``, a random id, names the run in the marker). A message
whose events in that run all lie in one date is *closed* in that date: its
partial rows go to ``closed/`` and its finished per-message row (the
report's second aggregation, :func:`.permessage.final_columns`) to ``final/``,
with the facts the report's first small job takes from them (causal bounds
between clocks, counts per logger: :func:`.facts.message_facts`, a few
thousand rows) to ``facts/``.
Every other message's partial rows (events on several dates of the run)
go to ``open/``; rows that are not messages (names of parties, loggers,
AppKey types) follow the same one-date rule, and readers of ``final/``
skip them. A report that reads
only dates of one run takes ``final/`` and ``facts/`` as they are and
merges only ``open/`` (no shuffle of the closed messages, no pass over them
before their legs); any other report merges ``closed/`` and ``open/`` as
before, because a message closed in one run may have events in a date
another run wrote.

Why the partials live *inside* their date's directory: ``compact`` replaces
a date by deleting its directory and moving the new one in (Spark's dynamic
partition overwrite), so partials can never outlive, or belong to other
events than, the events beside them. A date whose ``_messages`` directory
lacks the marker (compaction stopped half-way, a dataset from before
partials existed, a marker of another version) is read from its events.
Spark's readers skip names that start with ``_``, so the events read exactly
as before, also by older versions of semq.

Everything goes through Hadoop's file systems (the JVM of the session), so a
dataset on ``hdfs://`` or ``s3a://`` works like a local one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import ReportError

__all__ = [
    "PARTIALS_DIR",
    "PARTIALS_MARKER",
    "PARTIAL_SETS",
    "DatasetDates",
    "install_partials",
    "list_dates",
    "marker_name",
    "partials_path",
]

PARTIALS_DIR: Final = "_messages"
# The version in the name: a reader that knows another layout of the partial
# rows finds no marker and reads the events of the date instead. The marker's
# full name is ``_COMPLETE_V4.<run>`` (see the module docstring). V4: the
# event codes of the partial rows count the origin's bad_receipt and
# bad_refusal events (codes are numbered over the sorted event names).
# Still V4 with the path columns (:data:`.permessage._PATHS`): older V4 rows
# lack them and read as null, relay, as do their events (compacted without
# `path`), so they stay valid.
PARTIALS_MARKER: Final = "_COMPLETE_V4"
# The subdirectories of ``_messages`` (see the module docstring).
PARTIAL_SETS: Final = ("final", "facts", "closed", "open")
_DATE_DIR_RE: Final = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_RUN_RE: Final = re.compile(r"^[0-9a-f]{8,64}$")


@dataclass(kw_only=True)
class DatasetDates:
    """The date partitions of one compacted dataset, and which have complete partials."""

    dates: list[str] = field(default_factory=list)  # YYYY-MM-DD, sorted
    with_partials: frozenset[str] = frozenset()
    # The compaction run of each date in with_partials.
    runs: dict[str, str] = field(default_factory=dict)


def partials_path(root: str, day: str, subset: str | None = None) -> str:
    """``root/date=day/_messages``, or one of its :data:`PARTIAL_SETS`."""
    path = f"{root.rstrip('/')}/date={day}/{PARTIALS_DIR}"
    return path if subset is None else f"{path}/{subset}"


def marker_name(run: str) -> str:
    return f"{PARTIALS_MARKER}.{run}"


def _fs(spark: Any, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def list_dates(spark: Any, root: str) -> DatasetDates:
    """The ``date=`` partitions under `root`, those whose partials are complete and
    the compaction run of each (a date with two markers counts as incomplete).

    Two listings however many dates there are (one of the root, one glob for
    the markers). A root that is a file, or holds no date partitions, has no
    dates. Raises :class:`ReportError` when the root cannot be listed.
    """
    found = DatasetDates()
    try:
        fs, path = _fs(spark, root)
        if not fs.exists(path) or fs.getFileStatus(path).isFile():
            return found
        for status in fs.listStatus(path):
            m = _DATE_DIR_RE.match(status.getPath().getName())
            if m and status.isDirectory():
                found.dates.append(m.group(1))
        markers = fs.globStatus(
            spark.sparkContext._jvm.org.apache.hadoop.fs.Path(
                f"{root.rstrip('/')}/date=*/{PARTIALS_DIR}/{PARTIALS_MARKER}.*")
        ) or []
        named = [(status.getPath().getParent().getParent().getName(), status.getPath().getName())
                 for status in markers]
    except Exception as exc:  # py4j wraps the JVM's IOException
        raise ReportError(f"cannot list {root}: {str(exc).splitlines()[0]}") from exc
    runs: dict[str, set[str]] = {}
    for date_dir, name in named:
        m = _DATE_DIR_RE.match(date_dir)
        run = name.removeprefix(f"{PARTIALS_MARKER}.")
        if m and _RUN_RE.match(run):
            runs.setdefault(m.group(1), set()).add(run)
    found.dates.sort()
    found.runs = {d: next(iter(r)) for d, r in runs.items() if len(r) == 1 and d in found.dates}
    found.with_partials = frozenset(found.runs)
    return found


def install_partials(spark: Any, staging: str, root: str, dates: list[str], run: str) -> None:
    """Move ``staging/SET/date=D/`` (datasets partitioned by date, one per
    :data:`PARTIAL_SETS`) to ``root/date=D/_messages/SET/`` for every date in
    `dates` and mark each complete, as computed by compaction run `run`.

    A set with no rows on a date gets an empty directory, so it is not
    computed again. Any ``_messages`` already there is replaced. The marker
    is written last: a date is never taken as complete with files missing,
    also on stores whose rename is a copy (S3).
    """
    if not _RUN_RE.match(run):
        raise ValueError(f"bad compaction run id {run!r}: it must match {_RUN_RE.pattern}")
    fs, _ = _fs(spark, root)
    jvm = spark.sparkContext._jvm
    for day in dates:
        dst = jvm.org.apache.hadoop.fs.Path(partials_path(root, day))
        if fs.exists(dst):
            fs.delete(dst, True)
        fs.mkdirs(dst)
        for subset in PARTIAL_SETS:
            src = jvm.org.apache.hadoop.fs.Path(f"{staging.rstrip('/')}/{subset}/date={day}")
            to = jvm.org.apache.hadoop.fs.Path(partials_path(root, day, subset))
            if fs.exists(src):
                if not fs.rename(src, to):
                    raise ReportError(f"cannot move {src.toString()} to {to.toString()}")
            else:
                fs.mkdirs(to)
        fs.create(jvm.org.apache.hadoop.fs.Path(dst, marker_name(run)), True).close()
