"""The layout of a dataset ``semq report compact`` writes, and its per-message partials.

::

    DIR/date=YYYY-MM-DD/part-*.parquet                 the events of that UTC date
    DIR/date=YYYY-MM-DD/_messages/part-*.parquet       their per-message partial rows
    DIR/date=YYYY-MM-DD/_messages/_COMPLETE_V2         written once those rows are all there

The events are the log lines, unchanged (docs/events.md). The partial rows
are the first aggregation of the report's per-message step over the events
of that date (:func:`.jobs.message_partials`): one row per message and
counted event, which a report merges with the rows of the message's other
dates, compaction runs and inputs instead of shuffling every event again;
with the AppKey subtype and key of each message and one row per distinct
party, logger and AppKey type naming its hash, so a report over compacted
dates reads no event at all.

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
    "DatasetDates",
    "install_partials",
    "list_dates",
    "partials_path",
]

PARTIALS_DIR: Final = "_messages"
# The version in the name: a reader that knows another layout of the partial
# rows finds no marker and reads the events of the date instead.
PARTIALS_MARKER: Final = "_COMPLETE_V2"
_DATE_DIR_RE: Final = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


@dataclass(kw_only=True)
class DatasetDates:
    """The date partitions of one compacted dataset, and which have complete partials."""

    dates: list[str] = field(default_factory=list)  # YYYY-MM-DD, sorted
    with_partials: frozenset[str] = frozenset()


def partials_path(root: str, day: str) -> str:
    return f"{root.rstrip('/')}/date={day}/{PARTIALS_DIR}"


def _fs(spark: Any, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def list_dates(spark: Any, root: str) -> DatasetDates:
    """The ``date=`` partitions under `root` and those whose partials are complete.

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
                f"{root.rstrip('/')}/date=*/{PARTIALS_DIR}/{PARTIALS_MARKER}")
        ) or []
    except Exception as exc:  # py4j wraps the JVM's IOException
        raise ReportError(f"cannot list {root}: {str(exc).splitlines()[0]}") from exc
    complete = set()
    for status in markers:
        m = _DATE_DIR_RE.match(status.getPath().getParent().getParent().getName())
        if m:
            complete.add(m.group(1))
    found.dates.sort()
    found.with_partials = frozenset(complete & set(found.dates))
    return found


def install_partials(spark: Any, staging: str, root: str, dates: list[str]) -> None:
    """Move ``staging/date=D/`` (a dataset partitioned by date) to
    ``root/date=D/_messages/`` for every date in `dates` and mark each complete.

    A date with no partial rows (only cleanup events) gets an empty, complete
    directory, so it is not computed again. Any ``_messages`` already there is
    replaced. The marker is written last: a date is never taken as complete
    with files missing, also on stores whose rename is a copy (S3).
    """
    fs, _ = _fs(spark, root)
    jvm = spark.sparkContext._jvm
    for day in dates:
        src = jvm.org.apache.hadoop.fs.Path(f"{staging.rstrip('/')}/date={day}")
        dst = jvm.org.apache.hadoop.fs.Path(partials_path(root, day))
        if fs.exists(dst):
            fs.delete(dst, True)
        if fs.exists(src):
            if not fs.rename(src, dst):
                raise ReportError(f"cannot move {src.toString()} to {dst.toString()}")
        else:
            fs.mkdirs(dst)
        fs.create(jvm.org.apache.hadoop.fs.Path(dst, PARTIALS_MARKER), True).close()
