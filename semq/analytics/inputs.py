"""Turn `--logs PATH...` into the files Spark should read, before Spark starts.

A path may be a JSON-lines file, a directory holding logs at any depth (a
node's data directory, a folder of collected logs), a glob, a Parquet dataset
written by ``semq report compact``, or a URL Spark reads (``hdfs://``,
``s3a://``...). Local paths are checked here so a typo costs no JVM start; URLs
are listed later through Spark's own file systems (:func:`.reading.load_events`).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Final

from .errors import ReportError

__all__ = ["JSON_SUFFIXES", "Inputs", "resolve_inputs"]

JSON_SUFFIXES: Final = (".jsonl", ".jsonl.gz")
_DATED_RE: Final = re.compile(r"(\d{4}-\d{2}-\d{2})\.jsonl?(\.gz)?$")
_GLOB_CHARS: Final = frozenset("*?[")


@dataclass(kw_only=True)
class Inputs:
    """What to read: JSON-lines files, Parquet dataset roots, and URLs to list later."""

    json_files: list[str] = field(default_factory=list)
    parquet_dirs: list[str] = field(default_factory=list)
    remote: list[str] = field(default_factory=list)
    skipped_by_date: int = 0

    def describe(self) -> str:
        parts = []
        if self.json_files:
            parts.append(f"{len(self.json_files)} JSON-lines file(s)")
        if self.parquet_dirs:
            parts.append(f"{len(self.parquet_dirs)} Parquet dataset(s)")
        if self.remote:
            parts.append(f"{len(self.remote)} URL(s)")
        text = ", ".join(parts) or "nothing"
        if self.skipped_by_date:
            text += f" ({self.skipped_by_date} file(s) outside the time window skipped)"
        return text


def _is_url(path: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path)) and not path.startswith("file://")


def _file_date(path: str) -> date | None:
    m = _DATED_RE.search(os.path.basename(path))
    if not m:
        return None
    try:
        return date.fromisoformat(m.group(1))
    except ValueError:
        return None


def _is_parquet_dataset(path: str) -> bool:
    """A dataset Spark wrote (``compact``): date partitions or a _SUCCESS marker.

    Loose *.parquet files are not taken for logs: a report's own output
    (``semq-report/by_pair.parquet``...) may sit next to the logs.
    """
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(n.startswith("date=") or n == "_SUCCESS" for n in names)


def resolve_inputs(paths: list[str], *, first_day_ms: int | None = None,
                   last_day_ms: int | None = None) -> Inputs:
    """Find the logs under `paths`.

    Daily files named ``events-YYYY-MM-DD.jsonl`` whose UTC date lies wholly
    outside [first_day_ms, last_day_ms] are skipped without reading them.
    Raises :class:`ReportError` naming the path when a local path does not
    exist, and when nothing readable is found at all.
    """
    found = Inputs()
    seen: set[str] = set()
    lo = _day(first_day_ms)
    hi = _day(last_day_ms)

    def add_json(p: str) -> None:
        real = os.path.realpath(p)
        if real in seen:
            return
        seen.add(real)
        d = _file_date(p)
        if d is not None and ((lo and d < lo) or (hi and d > hi)):
            found.skipped_by_date += 1
            return
        found.json_files.append(real)

    def add_parquet(p: str) -> None:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            found.parquet_dirs.append(real)

    for raw in paths:
        if _is_url(raw):
            found.remote.append(raw)
            continue
        path = raw.removeprefix("file://")
        if _GLOB_CHARS & set(path):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ReportError(f"no file matches {raw}")
        elif not os.path.exists(path):
            raise ReportError(f"no such file or directory: {raw}")
        else:
            matches = [path]
        for p in matches:
            if os.path.isfile(p):
                if p.endswith(".parquet"):
                    add_parquet(p)
                else:
                    # A file named explicitly is a log whatever its suffix.
                    add_json(p)
                continue
            for dirpath, dirnames, filenames in os.walk(p, followlinks=True):
                if _is_parquet_dataset(dirpath) and not os.path.basename(dirpath).startswith("date="):
                    add_parquet(dirpath)
                    dirnames[:] = []  # the dataset is read whole, with its partitions
                    continue
                dirnames.sort()
                for name in sorted(filenames):
                    if name.endswith(JSON_SUFFIXES):
                        add_json(os.path.join(dirpath, name))
    if not (found.json_files or found.parquet_dirs or found.remote):
        if found.skipped_by_date:
            raise ReportError(
                f"no logs in the time window: all {found.skipped_by_date} daily file(s) "
                f"under {' '.join(paths)} are outside it"
            )
        raise ReportError(f"no delivery logs (*.jsonl or Parquet) found in {' '.join(paths)}")
    return found


def _day(ms: int | None) -> date | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date()
