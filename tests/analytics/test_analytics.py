"""Analytics without Spark: event validation, clocks, offline periods, inputs,
charts, rendering, synthetic logs, and CLI errors that must not start a JVM."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from semq.analytics import charts, cli
from semq.analytics.clocks import OrderBound, estimate_offsets
from semq.analytics.errors import ReportError
from semq.analytics.events import (
    parse_duration,
    parse_time,
    validate_event,
    validate_file,
)
from semq.analytics.inputs import resolve_inputs
from semq.analytics.periods import OfflinePeriod, offline_periods
from semq.analytics.synth import SynthConfig, generate


def test_importing_analytics_does_not_import_pyspark() -> None:
    code = (
        "import sys, semq.analytics, semq.analytics.cli, semq.analytics.jobs, "
        "semq.analytics.aggregates, semq.analytics.compaction, semq.analytics.facts, "
        "semq.analytics.latency, semq.analytics.legs, semq.analytics.permessage, "
        "semq.analytics.reading, semq.analytics.report_tables, semq.analytics.sparkutil, "
        "semq.analytics.report; print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- events


GOOD = {
    "v": 1, "ts": 1795000000000, "logger": "org:A", "role": "origin", "event": "queued",
    "lk0": "A/1/1/7", "source": "A", "target": "B", "domain": "trade", "data_type": "ORDER",
    "subtype": "PO", "key": "S1", "save_fwd": 3, "ack2": True, "reliable": True,
}


def test_validate_event_accepts_a_good_line_and_names_each_problem() -> None:
    assert validate_event(GOOD) == []
    assert validate_event({**GOOD, "extra": 1}) == []  # forward compatible
    assert validate_event({**GOOD, "event": "stored"}) == ["event 'stored' is not a origin event"]
    assert validate_event({**GOOD, "ts": "x"}) == ["ts='x' is not int"]
    assert validate_event({**GOOD, "ts": True}) == ["ts=True is not int"]
    assert "queued without lk0" in validate_event({k: v for k, v in GOOD.items() if k != "lk0"})
    node = {"v": 1, "ts": 1, "logger": "platform:P", "role": "platform", "event": "node_online"}
    assert validate_event(node) == ["node_online without node"]
    assert validate_event({**node, "node": "B"}) == []
    assert validate_event([1]) == ["not a JSON object but list"]
    assert validate_event({**GOOD, "event": "sent", "path": "direct"}) == []
    assert validate_event({**GOOD, "event": "sent", "path": "mesh"}) == [
        "path='mesh' is not direct, relay or local"]


def test_validate_file_reports_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "events-2026-11-22.jsonl"
    f.write_text(json.dumps(GOOD) + "\n\n{not json\n" + json.dumps({**GOOD, "save_fwd": 4}) + "\n")
    problems = [str(p) for p in validate_file(f)]
    assert problems[0].startswith("line 3: not JSON")
    assert problems[1] == "line 4: save_fwd=4 is not 1, 2 or 3"


def test_parse_time_and_duration() -> None:
    assert parse_time("2026-11-22") == parse_time("2026-11-22T00:00:00Z")
    assert parse_time("2026-11-22T01:00:00+01:00") == parse_time("2026-11-22")
    assert parse_time("1795000000000") == 1795000000000
    assert parse_duration("90s") == 90_000
    assert parse_duration("1h") == 3_600_000
    assert parse_duration("30") == 30_000
    assert parse_duration("1.5m") == 90_000
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")


# ---------------------------------------------------------------- clocks


def test_offsets_midpoint_of_causal_bounds() -> None:
    # A is 60 s ahead of P; trips take 10 ms one way and 30 ms the other.
    bounds = [
        OrderBound("org:A", "platform:P", 10 - 60_000, 5),  # A sent -> P received
        OrderBound("platform:P", "org:A", 30 + 60_000, 5),  # P forwarded -> A ack_fwd
    ]
    off = estimate_offsets(bounds)
    assert off["platform:P"].method == "reference"
    a = off["org:A"]
    assert a.method == "two-sided"
    # off_A >= 60_000 - 10 (the fastest trip to P), <= 60_000 + 30 (the fastest back).
    assert (a.low_ms, a.high_ms) == (59_990, 60_030)
    # The midpoint is off by half the asymmetry of the fastest trips (10 ms).
    assert a.offset_ms == 60_010


def test_offsets_one_sided_inconsistent_unknown_and_via() -> None:
    bounds = [
        # B only ever receives: off_B <= 5 - 0 is all we know, so no correction.
        OrderBound("platform:P", "org:B", 5, 3),
        # C receives and answers, with bounds that cross (clock stepped).
        OrderBound("platform:P", "org:C", 100, 1),
        OrderBound("org:C", "platform:P", -200, 1),
        # D talks only with C.
        OrderBound("org:C", "org:D", 50, 1),
        OrderBound("org:D", "org:C", 50, 1),
    ]
    off = estimate_offsets(bounds, {"org:E"})
    assert off["org:B"].offset_ms == 0 and off["org:B"].method == "one-sided"
    assert off["org:C"].method == "inconsistent"
    assert off["org:C"].offset_ms == 150  # midpoint of [200, 100]
    assert off["org:D"].via == "org:C" and off["org:D"].offset_ms == 150
    assert off["org:E"].method == "unknown" and off["org:E"].offset_ms == 0
    # A negative one-sided bound does force a correction.
    neg = estimate_offsets([OrderBound("platform:P", "org:B", -40_000, 1)])
    assert neg["org:B"].offset_ms == -40_000


# ---------------------------------------------------------------- periods


def test_offline_periods_pairing() -> None:
    evs = [
        ("platform:P", "B", 100, "node_offline"),
        ("platform:P", "B", 150, "node_offline"),  # repeated: keeps the first
        ("platform:P", "B", 300, "node_online"),
        ("platform:P", "B", 400, "node_online"),  # repeated: ignored
        ("platform:P", "B", 500, "node_offline"),
        ("platform:P", "C", 50, "node_online"),  # first seen connecting
    ]
    assert offline_periods(evs) == [
        OfflinePeriod("platform:P", "B", 100, 300),
        OfflinePeriod("platform:P", "B", 500, None),
        OfflinePeriod("platform:P", "C", None, 50),
    ]


# ---------------------------------------------------------------- inputs


def test_resolve_inputs_finds_logs_and_skips_days(tmp_path: Path) -> None:
    (tmp_path / "org-A" / "events").mkdir(parents=True)
    for day in ("2026-11-20", "2026-11-21", "2026-11-22"):
        (tmp_path / "org-A" / "events" / f"events-{day}.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "pq" / "date=2026-11-22").mkdir(parents=True)
    (tmp_path / "pq" / "date=2026-11-22" / "part-0.parquet").write_text("")
    (tmp_path / "semq-report").mkdir()  # a previous report's tables are not logs
    (tmp_path / "semq-report" / "by_pair.parquet").write_text("")
    found = resolve_inputs([str(tmp_path)], first_day_ms=parse_time("2026-11-21T12:00"))
    assert [Path(f).name for f in found.json_files] == ["events-2026-11-21.jsonl",
                                                       "events-2026-11-22.jsonl"]
    assert found.parquet_dirs == [str((tmp_path / "pq").resolve())]
    assert found.skipped_by_date == 1
    with pytest.raises(ReportError, match="no such file"):
        resolve_inputs([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no delivery logs"):
        resolve_inputs([str(tmp_path / "empty")])
    with pytest.raises(ReportError, match="outside it"):
        resolve_inputs([str(tmp_path / "org-A")], last_day_ms=parse_time("2026-11-01"))


def test_local_inputs_reach_spark_as_file_uris(tmp_path: Path) -> None:
    """A local path is read from the local file system of every executor, not
    from the cluster's default one (HDFS on YARN); URLs stay as given. Spark is
    not needed while no URL must be listed."""
    from semq.analytics.inputs import Inputs
    from semq.analytics.reading import _expand

    (tmp_path / "a b").mkdir()
    (tmp_path / "a b" / "events-2026-11-22.jsonl").write_text("")
    found = resolve_inputs([str(tmp_path)])
    expanded = _expand(None, found)
    assert expanded.json_files == [f"file://{tmp_path.resolve()}/a b/events-2026-11-22.jsonl"]
    assert _expand(None, expanded).json_files == expanded.json_files  # read twice per report
    urls = Inputs(json_files=["hdfs://nn/logs/x.jsonl"], parquet_dirs=["s3a://bucket/pq"])
    assert (_expand(None, urls).json_files, _expand(None, urls).parquet_dirs) == (
        ["hdfs://nn/logs/x.jsonl"], ["s3a://bucket/pq"])


# ---------------------------------------------------------------- CLI errors (no JVM)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="semq")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "latency", "--logs", "/nonexistent/semq-logs"], "no such file or directory"),
        (["report", "latency", "--logs", "{empty}"], "no delivery logs"),
        (["report", "latency", "--logs", "{empty}", "--since", "tomorrow"], "is not a time"),
        (["report", "latency", "--logs", "{empty}", "--stuck-after", "soon"], "is not a duration"),
        (["report", "latency", "--logs", "{empty}", "--since", "2026-11-22", "--until",
          "2026-11-21"], "is not before"),
        (["report", "compact", "--logs", "{empty}", "--out", "{empty}/pq"], "no delivery logs"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    argv = [a.replace("{empty}", str(tmp_path)) for a in argv]
    assert _cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert len([line for line in err if line.startswith("error")]) == 1


def test_cli_report_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli(["report"])
    assert exc.value.code == 2


# ---------------------------------------------------------------- synth, charts


def test_synth_is_deterministic_and_valid(tmp_path: Path) -> None:
    cfg = SynthConfig(messages=300, orgs=4, seed=7)
    a = generate(tmp_path / "a", cfg)
    b = generate(tmp_path / "b", cfg)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jsonl"))
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.jsonl"))
    assert files_a == files_b and files_a
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
        assert validate_file(tmp_path / "a" / rel) == []
    assert a.messages == 300 and sum(a.outcomes.values()) == 300
    assert a.events == b.events > 300 * 5
    with pytest.raises(FileExistsError):
        generate(tmp_path / "a", cfg)


def test_synth_direct_links(tmp_path: Path) -> None:
    """By default no line carries `path` (the logs of nodes before direct
    links); with `direct`, every send, arrival and ACK2 names its link, and
    the direct documents skip the platform."""
    plain = generate(tmp_path / "plain", SynthConfig(messages=300, orgs=4, seed=7))
    assert plain.paths == {"relay": 300}
    assert not any('"path"' in f.read_text() for f in (tmp_path / "plain").rglob("*.jsonl"))

    mixed = generate(tmp_path / "mixed", SynthConfig(messages=300, orgs=4, seed=7, direct=0.5))
    assert mixed.paths["direct"] > 50 and mixed.paths["relay"] > 50
    assert sum(mixed.paths.values()) == mixed.messages == 300
    lines = [json.loads(x) for f in (tmp_path / "mixed").rglob("*.jsonl")
             for x in f.read_text().splitlines()]
    paths: dict[tuple[str, str], set[str]] = {}
    for x in lines:
        if x["event"] in ("sent", "received", "ack2") and x["role"] != "platform":
            paths.setdefault((x["role"], x["event"]), set()).add(x["path"])
        else:
            assert "path" not in x, x
    assert paths == {(role, event): {"direct", "relay"} for role, event in
                     (("origin", "sent"), ("receiver", "received"), ("origin", "ack2"))}
    direct = {x["lk0"] for x in lines if x.get("path") == "direct" and x["event"] == "sent"}
    assert len(direct) == mixed.paths["direct"]
    assert not any(x["role"] == "platform" and x.get("lk0") in direct for x in lines)
    with pytest.raises(ValueError, match="direct"):
        SynthConfig(direct=1.5)


def test_charts_are_svg_without_urls() -> None:
    svg = charts.line_chart(["00:00", "01:00"], {"p50": [10, None], "p90": [100, 2000]}, "t")
    heat = charts.heatmap(["A", "B"], ["A", "B"], {("A", "B"): (120.0, 3), ("B", "A"): (None, 2)}, "h")
    hist = charts.histogram([(1, 2, 3), (10, 18, 1)], "d")
    for s in (svg, heat, hist, charts.bar_chart([("at_origin", 2)], "b"), charts.histogram([], "e")):
        assert s.startswith("<svg") and s.endswith("</svg>")
        assert "http://" not in s and "https://" not in s
    assert "A → B: 3 messages, 120 ms" in heat
    assert charts.fmt_duration(1500) == "1.5 s" and charts.fmt_duration(90 * 60_000) == "1.5 h"
