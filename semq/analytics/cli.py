"""`semq report ...`: the analytics commands, registered into the `semq` CLI.

``semq.cli`` calls :func:`register` with its sub-parsers. Importing this module
imports no pyspark: the commands import it when they run (STYLE.md, "Heavy
extras are lazy"). Mistakes (no logs, a bad time, no Java) print one
``error: ...`` line on stderr and return 2; progress goes to stderr, so stdout
carries only the result (the report's path, or the text summary).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Final

from .errors import ReportError
from .events import parse_duration, parse_time

__all__ = ["register", "run_compact", "run_latency"]

DEFAULT_OUT: Final = "semq-report"
PROG: Final = "report"


def _progress(stage: str) -> Any:
    start = time.monotonic()

    def say(message: str) -> None:
        print(f"[{stage} {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def register(subparsers: Any) -> None:
    """Add ``report latency`` and ``report compact`` to an argparse sub-parsers action."""
    report = subparsers.add_parser(
        "report",
        help="delivery-latency reports over the event logs (Apache Spark)",
        description="Spark reports over the delivery event logs of nodes and the platform "
        "(docs/analytics.md).",
    )
    sub = report.add_subparsers(dest="report_command", metavar="{latency,compact}")
    sub.required = True

    latency = sub.add_parser(
        "latency",
        help="per-message legs, percentiles per pair/AppKey/SaveFwd/path/hour/day, stuck messages",
        description="Join every message's events across all logs (on LK0) and report where "
        "the time goes and what is stuck. Writes report.html plus CSV and Parquet of every "
        "table to --out (default ./semq-report), or prints a summary with --format text.",
    )
    latency.add_argument("--logs", nargs="+", required=True, metavar="PATH",
                         help="JSON-lines logs, directories holding them, globs, compacted "
                         "Parquet, or URLs Spark reads (hdfs://, s3a://)")
    latency.add_argument("--since", metavar="T",
                         help="only messages queued at or after T (ISO 8601, UTC unless a zone is given)")
    latency.add_argument("--until", metavar="T", help="only messages queued before T")
    latency.add_argument("--out", metavar="DIR",
                         help=f"output directory (default ./{DEFAULT_OUT} for html; none for text)")
    latency.add_argument("--master", metavar="URL",
                         help="Spark master (default local[*]; spark://, yarn, k8s:// run on a cluster)")
    latency.add_argument("--format", choices=("html", "text"), default="html",
                         help="html: write the report files; text: print a summary (default html)")
    latency.add_argument("--stuck-after", metavar="DURATION", default="1h",
                         help="unconfirmed messages older than this are stuck (default 1h; e.g. 30m, 2h, 1d)")
    latency.set_defaults(func=run_latency)

    compact = sub.add_parser(
        "compact",
        help="raw logs to date-partitioned Parquet, so repeated reports are fast",
        description="Write the logs as Parquet partitioned by UTC date (DIR/date=YYYY-MM-DD/). "
        "Dates present in the input replace the same dates in DIR; give every log of a day in "
        "one run. `report latency --logs DIR` reads the result.",
    )
    compact.add_argument("--logs", nargs="+", required=True, metavar="PATH",
                         help="JSON-lines logs or directories holding them")
    compact.add_argument("--out", required=True, metavar="DIR", help="Parquet dataset directory")
    compact.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    compact.set_defaults(func=run_compact)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _spark_error(exc: Exception) -> int | None:
    """One line for an error Spark raised about the input (bad path, unreadable file)."""
    try:
        from pyspark.errors import PySparkException
    except ImportError:
        return None
    if isinstance(exc, PySparkException):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: spark: {first}", file=sys.stderr)
        return 1
    return None


def run_latency(args: argparse.Namespace) -> int:
    """`semq report latency`: returns the exit code."""
    from .inputs import resolve_inputs
    from .jobs import FOLLOW_UP_MS, SKEW_MARGIN_MS

    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
        stuck_after = parse_duration(args.stuck_after)
    except ValueError as exc:
        return _fail(str(exc))
    if since is not None and until is not None and since >= until:
        return _fail(f"--since {args.since} is not before --until {args.until}")
    say = _progress("report")
    try:
        inputs = resolve_inputs(
            args.logs,
            first_day_ms=None if since is None else since - SKEW_MARGIN_MS,
            last_day_ms=None if until is None else until + FOLLOW_UP_MS,
        )
        say(f"reading {inputs.describe()}")
        out = args.out or (DEFAULT_OUT if args.format == "html" else None)
        return _latency(args, inputs, since, until, stuck_after, out, say)
    except ReportError as exc:
        return _fail(str(exc))
    except Exception as exc:
        code = _spark_error(exc)
        if code is None:
            raise
        return code


def _latency(args: argparse.Namespace, inputs: Any, since: int | None, until: int | None,
             stuck_after: int, out: str | None, say: Any) -> int:
    from .jobs import ReportOptions, build_report
    from .report import render_text, write_report, write_tables
    from .session import start_session, stop_session

    say(f"starting Spark ({args.master or 'local[*]'})")
    spark, created = start_session(args.master, class_archive=True)
    try:
        data = build_report(
            spark, inputs,
            ReportOptions(since_ms=since, until_ms=until, stuck_after_ms=stuck_after, progress=say),
        )
    finally:
        if created:
            stop_session(spark)
    if args.format == "text":
        if out:
            write_tables(data, out)
            say(f"wrote {len(data.tables)} tables (CSV and Parquet) to {out}")
        sys.stdout.write(render_text(data))
        return 0
    assert out is not None
    html = write_report(data, out)
    say(f"wrote {html} and {len(data.tables)} tables (CSV and Parquet)")
    print(html)
    return 0


def run_compact(args: argparse.Namespace) -> int:
    """`semq report compact`: returns the exit code."""
    from .inputs import resolve_inputs
    from .jobs import compact
    from .session import start_session

    say = _progress("compact")
    try:
        inputs = resolve_inputs(args.logs)
        out_real = os.path.realpath(args.out)
        if out_real in inputs.parquet_dirs or any(
            f.startswith(out_real + os.sep) for f in inputs.json_files
        ):
            return _fail(f"--out {args.out} is one of the inputs; compact into a new directory")
        say(f"reading {inputs.describe()}")
        say(f"starting Spark ({args.master or 'local[*]'})")
        spark, created = start_session(args.master, app_name="semq-compact")
        try:
            result = compact(spark, inputs, args.out, progress=say)
        finally:
            if created:
                spark.stop()
    except ReportError as exc:
        return _fail(str(exc))
    except Exception as exc:
        code = _spark_error(exc)
        if code is None:
            raise
        return code
    if result["replaced"]:
        say(f"replaced {len(result['replaced'])} date partition(s) that were already there: "
            + ", ".join(result["replaced"]))
    print(f"{args.out}: {result['events']:,} events in {len(result['dates'])} date partition(s)")
    return 0
