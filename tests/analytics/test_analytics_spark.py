"""Spark reports on hand-built logs with known answers (one shared local session).

Scenario (true times in ms after T0; the platform's clock is true, org A's runs
60 s ahead, org B's 30 s behind, C, D, E keep time):

- M1 A→B forwarded at once; M2 A→B stored while B was offline 1000..61000;
  M3 A→B lost once (inquiry + resend), and B suppressed a duplicate;
  M4 A→B SaveFwd 1 while B offline: dropped; M10 best effort; M11 no ACK2 asked.
- Stuck (older than 1 h at the end of the logs): M5 at the origin, M6 stored
  at the platform (D offline for good), M7 delivered but unconfirmed, M8
  forwarded but never received. M9 is as unconfirmed but young: in flight.
- 100 messages E→F with end to end i seconds (i = 1..100): exact percentiles.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semq.analytics import cli
from semq.analytics.compacted import partials_path
from semq.analytics.events import parse_time
from semq.analytics.inputs import resolve_inputs
from semq.analytics.jobs import LEG_NAMES, OUTCOMES, ReportOptions, build_report, compact
from semq.analytics.report import render_html, render_text
from semq.analytics.synth import SynthConfig, generate
from semq.analytics.tables import ReportData
from tests.analytics._runs import FORWARDED, STORED, real_run_logs

pytestmark = pytest.mark.spark

T0 = parse_time("2026-11-22")
SKEW = {"platform:P1": 0, "org:A": 60_000, "org:B": -30_000, "org:C": 0, "org:D": 0, "org:E": 0}
HOUR = 3_600_000


class Logs:
    """Writes what each party logs, stamped with its own (skewed) clock."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self.count = 0

    def msg(self, lk0: str, src: str, dst: str, **attrs: Any) -> dict[str, Any]:
        base = {"lk0": lk0, "source": src, "target": dst, "domain": "trade", "data_type": "ORDER",
                "subtype": "PO", "key": f"K-{lk0}", "save_fwd": 3, "ack2": True, "reliable": True,
                "priority": 4, "size": 100}
        base.update(attrs)
        return base

    def add(self, logger: str, role: str, event: str, t: int, m: dict[str, Any] | None = None,
            **extra: Any) -> None:
        line = {"v": 1, "ts": T0 + t + SKEW[logger], "logger": logger, "role": role, "event": event}
        line.update(m or {})
        line.update(extra)
        self.lines.setdefault(logger, []).append(json.dumps(line))
        self.count += 1

    def o(self, m: dict[str, Any], event: str, t: int, **extra: Any) -> None:
        self.add(f"org:{m['source']}", "origin", event, t, m, **extra)

    def p(self, m: dict[str, Any], event: str, t: int, **extra: Any) -> None:
        self.add("platform:P1", "platform", event, t, m, **extra)

    def r(self, m: dict[str, Any], event: str, t: int, **extra: Any) -> None:
        self.add(f"org:{m['target']}", "receiver", event, t, m, **extra)

    def write(self, root: Path) -> None:
        for logger, lines in self.lines.items():
            folder = root / logger.replace(":", "-") / "events"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "events-2026-11-22.jsonl").write_text("\n".join(lines) + "\n")


def scenario() -> Logs:
    L = Logs()
    node = "platform:P1"
    L.add(node, "platform", "node_offline", 1000, node="B")
    L.add(node, "platform", "node_online", 61_000, node="B")
    L.add(node, "platform", "node_offline", 10_500, node="D")

    m1 = L.msg("A/1/1/1", "A", "B")
    for fn, ev, t in ((L.o, "queued", 0), (L.o, "sent", 10), (L.p, "received", 30),
                      (L.p, "forwarded", 32), (L.o, "ack_fwd", 50), (L.r, "received", 60),
                      (L.r, "inbox", 65), (L.r, "ack2_sent", 66), (L.o, "ack2", 100),
                      (L.r, "reack2", 120), (L.o, "cleaned", 101)):
        fn(m1, ev, t)
    m2 = L.msg("A/1/1/2", "A", "B", save_fwd=2)
    for fn, ev, t in ((L.o, "queued", 2000), (L.o, "sent", 2010), (L.p, "received", 2030),
                      (L.p, "stored", 2032), (L.o, "ack_save", 2050), (L.p, "delivered", 61_500),
                      (L.r, "received", 61_520), (L.r, "inbox", 61_525), (L.r, "ack2_sent", 61_526),
                      (L.p, "acked", 61_540), (L.o, "ack2", 61_600)):
        fn(m2, ev, t)
    m3 = L.msg("A/1/1/3", "A", "B")
    L.o(m3, "queued", 5000)
    L.o(m3, "sent", 5010, attempt=1)
    L.o(m3, "inquiry", 20_010, detail="platform")
    L.o(m3, "resend", 20_011)
    L.o(m3, "sent", 20_012, attempt=2)
    for fn, ev, t in ((L.p, "received", 20_030), (L.p, "forwarded", 20_032), (L.o, "ack_fwd", 20_050),
                      (L.r, "received", 20_060), (L.r, "inbox", 20_065), (L.r, "ack2_sent", 20_066),
                      (L.o, "ack2", 20_100), (L.r, "duplicate", 40_000)):
        fn(m3, ev, t)
    m4 = L.msg("A/1/1/4", "A", "B", save_fwd=1)
    for fn, ev, t in ((L.o, "queued", 3000), (L.o, "sent", 3010), (L.p, "received", 3030)):
        fn(m4, ev, t)
    L.p(m4, "dropped", 3031, code=404)
    L.o(m4, "nack", 3050, code=404)
    m10 = L.msg("A/1/1/10", "A", "B", reliable=False, ack2=False)
    for fn, ev, t in ((L.o, "queued", 6000), (L.o, "sent", 6010), (L.p, "received", 6030),
                      (L.p, "forwarded", 6032), (L.r, "received", 6060), (L.r, "inbox", 6065)):
        fn(m10, ev, t)
    m11 = L.msg("A/1/1/11", "A", "B", ack2=False)
    for fn, ev, t in ((L.o, "queued", 7000), (L.o, "sent", 7010), (L.p, "received", 7030),
                      (L.p, "forwarded", 7032), (L.o, "ack_fwd", 7050), (L.r, "received", 7060),
                      (L.r, "inbox", 7065)):
        fn(m11, ev, t)

    m5 = L.msg("C/1/1/5", "C", "D")
    L.o(m5, "queued", 10_000)
    L.o(m5, "sent", 10_010)
    m6 = L.msg("C/1/1/6", "C", "D")
    for fn, ev, t in ((L.o, "queued", 11_000), (L.o, "sent", 11_010), (L.p, "received", 11_030),
                      (L.p, "stored", 11_032), (L.o, "ack_save", 11_050)):
        fn(m6, ev, t)
    m7 = L.msg("C/1/1/7", "C", "B")
    for fn, ev, t in ((L.o, "queued", 12_000), (L.o, "sent", 12_010), (L.p, "received", 12_030),
                      (L.p, "forwarded", 12_032), (L.o, "ack_fwd", 12_050), (L.r, "received", 12_060),
                      (L.r, "inbox", 12_065), (L.r, "ack2_sent", 12_066)):
        fn(m7, ev, t)
    m8 = L.msg("C/1/1/8", "C", "A")
    for fn, ev, t in ((L.o, "queued", 13_000), (L.o, "sent", 13_010), (L.p, "received", 13_030),
                      (L.p, "forwarded", 13_032), (L.o, "ack_fwd", 13_050)):
        fn(m8, ev, t)
    m9 = L.msg("C/1/1/9", "C", "A")
    L.o(m9, "queued", 3 * HOUR)
    L.o(m9, "sent", 3 * HOUR + 10)

    for i in range(1, 101):
        m = L.msg(f"E/1/1/{i}", "E", "F", domain="finance", data_type="PAYMENT")
        q = 20_000 + i * 1000
        L.o(m, "queued", q)
        L.o(m, "sent", q + 1)
        L.o(m, "ack_fwd", q + 2)
        L.o(m, "ack2", q + i * 1000)
    return L


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from semq.analytics.session import start_session

    session, created = start_session("local[2]", app_name="semq-tests")
    yield session
    if created:
        session.stop()


@pytest.fixture(scope="module")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logs")
    scenario().write(root)
    return root


@pytest.fixture(scope="module")
def report(spark: Any, logs_dir: Path) -> ReportData:
    return build_report(spark, resolve_inputs([str(logs_dir)]), ReportOptions(with_messages=True))


def by_lk0(report: ReportData) -> dict[str, dict[str, Any]]:
    return {r["lk0"]: r for r in report["messages"].dicts()}


def test_one_clock_legs_are_exact(report: ReportData) -> None:
    m = by_lk0(report)
    m1, m2, m3 = m["A/1/1/1"], m["A/1/1/2"], m["A/1/1/3"]
    assert (m1["queue_ms"], m1["platform_ack_ms"], m1["platform_ms"], m1["inbox_ms"],
            m1["confirm_ms"], m1["e2e_ms"]) == (10, 40, 2, 5, 50, 100)
    assert m1["dwell_ms"] is None and m1["target_ack_ms"] is None
    assert (m2["dwell_ms"], m2["target_ack_ms"], m2["e2e_ms"]) == (61_500 - 2032, 40, 61_600 - 2000)
    assert m2["target_offline_ms"] == 60_000  # B offline 1000..61000
    assert m1["target_offline_ms"] is None
    # M3: the first send was lost; legs run from the first send, resends counted.
    assert (m3["platform_ack_ms"], m3["e2e_ms"]) == (20_050 - 5010, 15_100)
    assert (m3["resends"], m3["inquiries"], m3["duplicates"]) == (1, 1, 1)
    # Missing events leave legs empty rather than guessed.
    assert m["C/1/1/5"]["platform_ack_ms"] is None and m["C/1/1/5"]["e2e_ms"] is None


def test_skewed_clocks_are_estimated_and_never_give_negative_legs(report: ReportData) -> None:
    skew = {r["logger"]: r for r in report["clock_skew"].dicts()}
    assert skew["platform:P1"]["method"] == "reference"
    assert abs(skew["org:A"]["offset_ms"] - 60_000) <= 20
    assert abs(skew["org:B"]["offset_ms"] + 30_000) <= 20
    assert skew["org:A"]["low_ms"] <= 60_000 <= skew["org:A"]["high_ms"]
    assert skew["org:E"]["method"] == "unknown"  # E's log shows no other party
    rows = report["messages"].dicts()
    for r in rows:
        for leg in LEG_NAMES:
            assert r[leg] is None or r[leg] >= 0, (r["lk0"], leg, r[leg])
    m1 = by_lk0(report)["A/1/1/1"]
    # Raw cross-clock differences are a minute off; corrected they are near the truth.
    assert abs(m1["to_platform_ms"] - 20) <= 20
    assert abs(m1["to_target_ms"] - 28) <= 30
    assert abs(m1["delivery_ms"] - 65) <= 40 and m1["delivery_ms"] <= m1["e2e_ms"]
    assert report.meta["reference_clock"] == "platform:P1"


def test_outcomes_and_stuck_places(report: ReportData) -> None:
    overall = report["overall"].dicts()[0]
    assert overall["messages"] == 111
    assert {k: overall[k] for k in ("confirmed", "delivered", "failed", "best_effort",
                                    "in_flight", "stuck")} == {
        "confirmed": 103, "delivered": 1, "failed": 1, "best_effort": 1, "in_flight": 1, "stuck": 4}
    stuck = {r["lk0"]: r for r in report["stuck"].dicts()}
    assert {k: v["place"] for k, v in stuck.items()} == {
        "C/1/1/5": "at_origin",
        "C/1/1/6": "stored_at_platform",
        "C/1/1/7": "delivered_unconfirmed",
        "C/1/1/8": "forwarded_not_received",
    }
    # "since" is on the platform's clock; C's offset is estimated within its
    # uncertainty (-20..18 ms here: the fastest trips each way took 20 and 18 ms).
    assert abs(stuck["C/1/1/5"]["since"] - (T0 + 10_000)) <= 20
    assert stuck["C/1/1/6"]["since"] == T0 + 11_032
    assert abs(stuck["C/1/1/7"]["since"] - (T0 + 12_065)) <= 20  # B's clock, corrected
    assert stuck["C/1/1/6"]["key"] == "K-C/1/1/6" and stuck["C/1/1/6"]["subtype"] == "PO"
    # D went offline at 10_500 and never came back: offline until the end of the log.
    assert abs(stuck["C/1/1/6"]["target_offline_ms"] - (3 * HOUR + 10 - 10_500)) <= 20
    failed = report["failed"].dicts()
    assert [(f["lk0"], f["failure"], f["code"]) for f in failed] == [("A/1/1/4", "dropped", 404)]
    assert by_lk0(report)["C/1/1/9"]["outcome"] == "in_flight"


def test_exact_percentiles_on_small_data(report: ReportData) -> None:
    pair = {(r["source"], r["target"]): r for r in report["by_pair"].dicts()}
    ef = pair[("E", "F")]
    assert ef["messages"] == ef["confirmed"] == 100
    assert (ef["e2e_ms_p50"], ef["e2e_ms_p90"], ef["e2e_ms_p99"], ef["e2e_ms_max"]) == (
        50_000, 90_000, 99_000, 100_000)
    appkey = {(r["domain"], r["data_type"]): r["messages"] for r in report["by_appkey"].dicts()}
    assert appkey == {("finance", "PAYMENT"): 100, ("trade", "ORDER"): 11}
    by_sf = {r["save_fwd"]: r["messages"] for r in report["by_save_fwd"].dicts()}
    assert by_sf == {1: 1, 2: 1, 3: 109}
    overall = report["overall"].dicts()[0]
    assert overall["resends"] == 1 and overall["duplicates_suppressed"] == 1
    assert [r["day"] for r in report["by_day"].dicts()] == ["2026-11-22"]
    hist = report["histogram"].dicts()
    assert sum(r["messages"] for r in hist if r["metric"] == "e2e_ms") == 103
    legs = {r["leg"]: r for r in report["legs"].dicts()}
    assert legs["e2e_ms"]["messages"] == 103 and legs["dwell_ms"]["p50_ms"] == 61_500 - 2032


def test_logs_without_a_path_count_as_relay(report: ReportData) -> None:
    """The scenario's logs are from before direct links: no line has `path`."""
    overall = report["overall"].dicts()[0]
    [relay] = report["by_path"].dicts()
    assert relay["path"] == "relay" and relay["messages"] == overall["messages"] == 111
    for col in ("e2e_ms_p50", "e2e_ms_p90", "e2e_ms_p99", "e2e_ms_max", "delivery_ms_p50"):
        assert relay[col] == overall[col], col
    assert {m["path"] for m in report["messages"].dicts()} == {"relay"}


def path_scenario() -> Logs:
    """Documents over the platform relay and over direct links, with known ends
    to end, and the cases of the rule (docs/events.md "path")."""
    L = Logs()
    for i in range(1, 101):  # relay, end to end i s
        m = L.msg(f"A/1/2/{i}", "A", "B")
        q = i * 1000
        L.o(m, "queued", q)
        L.o(m, "sent", q + 1, attempt=1, path="relay")
        for fn, ev, t in ((L.p, "received", q + 20), (L.p, "forwarded", q + 22),
                          (L.o, "ack_fwd", q + 40)):
            fn(m, ev, t)
        L.r(m, "received", q + 50, path="relay")
        L.r(m, "inbox", q + 55)
        L.r(m, "ack2_sent", q + 56)
        L.o(m, "ack2", q + i * 1000, path="relay")
    for i in range(1, 21):  # direct, end to end i * 100 ms
        m = L.msg(f"C/1/2/{i}", "C", "D")
        q = 200_000 + i * 1000
        L.o(m, "queued", q)
        L.o(m, "sent", q + 1, attempt=1, path="direct")
        L.r(m, "received", q + 10, path="direct")
        L.r(m, "inbox", q + 12)
        L.r(m, "ack2_sent", q + 13)
        L.o(m, "ack2", q + i * 100, path="direct")
    # No ACK2 asked from here on: these add documents, no end to end.
    q = 300_000
    m = L.msg("C/1/3/1", "C", "D", ack2=False)  # sent direct, nothing from the receiver
    L.o(m, "queued", q)
    L.o(m, "sent", q + 1, attempt=1, path="direct")
    m = L.msg("C/1/3/2", "C", "D", ack2=False)  # last send direct, first arrival relay
    L.o(m, "queued", q)
    L.o(m, "sent", q + 1, attempt=1, path="relay")
    L.o(m, "sent", q + 20_000, attempt=2, path="direct")
    L.r(m, "received", q + 50, path="relay")
    L.r(m, "inbox", q + 55)
    L.r(m, "received", q + 20_010, path="direct")
    L.r(m, "duplicate", q + 20_010)
    m = L.msg("C/1/3/3", "C", "D", ack2=False)  # last send relay, first arrival direct
    L.o(m, "queued", q)
    L.o(m, "sent", q + 1, attempt=1, path="direct")
    L.o(m, "sent", q + 20_000, attempt=2, path="relay")
    L.r(m, "received", q + 10, path="direct")
    L.r(m, "inbox", q + 12)
    m = L.msg("C/1/3/4", "C", "D", ack2=False)  # sent direct, arrival logged without path
    L.o(m, "queued", q)
    L.o(m, "sent", q + 1, attempt=1, path="direct")
    L.r(m, "received", q + 10)
    L.r(m, "inbox", q + 12)
    m = L.msg("A/1/3/5", "A", "B", ack2=False)  # no path anywhere: an older node
    for fn, ev, t in ((L.o, "queued", q), (L.o, "sent", q + 1), (L.p, "received", q + 20),
                      (L.p, "forwarded", q + 22), (L.o, "ack_fwd", q + 40),
                      (L.r, "received", q + 50), (L.r, "inbox", q + 55)):
        fn(m, ev, t)
    return L


def test_latency_by_path(spark: Any, tmp_path: Path) -> None:
    """Per path: the documents and exact percentiles of their ends to end; a
    document's path is its first arrival's, else its origin's last send's,
    else relay. Compacted, the logs give the same tables."""
    path_scenario().write(tmp_path / "logs")
    report = build_report(spark, resolve_inputs([str(tmp_path / "logs")]),
                          ReportOptions(with_messages=True))
    paths = {m["lk0"]: m["path"] for m in report["messages"].dicts()}
    assert {k: v for k, v in paths.items() if "/1/3/" in k} == {
        "C/1/3/1": "direct", "C/1/3/2": "relay", "C/1/3/3": "direct", "C/1/3/4": "relay",
        "A/1/3/5": "relay"}
    rows = {r["path"]: r for r in report["by_path"].dicts()}
    assert [r["path"] for r in report["by_path"].dicts()] == ["direct", "relay"]
    assert (rows["direct"]["messages"], rows["relay"]["messages"]) == (22, 103)
    assert (rows["direct"]["confirmed"], rows["relay"]["confirmed"]) == (20, 100)
    e2e = [f"e2e_ms_{q}" for q in ("p50", "p90", "p99", "max")]
    assert [rows["direct"][c] for c in e2e] == [1000, 1800, 2000, 2000]
    assert [rows["relay"][c] for c in e2e] == [50_000, 90_000, 99_000, 100_000]
    # Queued → inbox: 12 ms direct, 55 ms relay (within the clock estimate).
    assert rows["direct"]["delivery_ms_max"] <= 20 < rows["relay"]["delivery_ms_p50"]
    text = render_text(report)
    assert "Latency by path" in text and "1.8 s" in text and "1.7 min" in text
    assert "<h2>Latency by path</h2>" in render_html(report)

    compact(spark, resolve_inputs([str(tmp_path / "logs")]), str(tmp_path / "pq"))
    again = build_report(spark, resolve_inputs([str(tmp_path / "pq")]), ReportOptions(with_messages=True))
    assert again.meta["compacted_final"]
    assert_same_tables(report, again)


def test_compacted_parquet_gives_the_same_tables(spark: Any, logs_dir: Path, tmp_path: Path,
                                                 report: ReportData) -> None:
    out = tmp_path / "pq"
    result = compact(spark, resolve_inputs([str(logs_dir)]), str(out))
    assert result["events"] == scenario().count
    # B's clock runs 30 s behind: its first events are dated the day before.
    assert [d for d, _ in result["dates"]] == ["2026-11-21", "2026-11-22"]
    assert result["partials"] == ["2026-11-21", "2026-11-22"]
    again = build_report(spark, resolve_inputs([str(out)]), ReportOptions(with_messages=True))
    assert again.meta["compacted_dates"] == {"partials": 2, "events": 0}
    assert again.meta["compacted_final"]  # one compaction run: closed messages as they are
    assert_same_tables(report, again)


def assert_same_tables(want: ReportData, got: ReportData) -> None:
    assert got.tables.keys() == want.tables.keys()
    for name, table in want.tables.items():
        assert got[name].columns == table.columns, name
        assert got[name].rows == table.rows, name


# ---------------------------------------------------------------- compacted datasets

# Small enough that every group holds under SKETCH_K values: percentiles are
# exact, so two reports agree to the last digit. Over three days, with
# messages stored for offline targets and skewed clocks, many messages have
# events on two dates. A quarter of the documents go over direct links.
SYNTH = SynthConfig(messages=800, orgs=4, seed=11, duration_ms=3 * 86_400_000, direct=0.25)


def _log_days(root: Path) -> list[str]:
    return sorted({p.name.removeprefix("events-").removesuffix(".jsonl")
                   for p in root.glob("*/events/events-*.jsonl")})


@pytest.fixture(scope="module")
def synth_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    generate(root, SYNTH)
    return root


@pytest.fixture(scope="module")
def synth_report(spark: Any, synth_logs: Path) -> ReportData:
    return build_report(spark, resolve_inputs([str(synth_logs)]), ReportOptions(with_messages=True))


@pytest.fixture(scope="module")
def compacted_by_day(spark: Any, synth_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic logs compacted one date per run, as a daily job would."""
    out = tmp_path_factory.mktemp("compacted") / "pq"
    for day in _log_days(synth_logs):
        result = compact(spark, resolve_inputs([str(synth_logs / "*" / "events" / f"events-{day}.jsonl")]),
                         str(out))
        assert [d for d, _ in result["dates"]] == [day]
        assert result["partials"] == [day]
    return out


@pytest.fixture(scope="module")
def compacted_at_once(spark: Any, synth_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic logs compacted in one run: a report takes the finished
    rows of the messages closed in a date and merges only the open ones."""
    out = tmp_path_factory.mktemp("compacted") / "pq"
    result = compact(spark, resolve_inputs([str(synth_logs)]), str(out))
    assert [d for d, _ in result["dates"]] == result["partials"] == _log_days(synth_logs)
    return out


def _partial_keys(spark: Any, root: Path, subset: str) -> Any:
    """(k, d): the message keys of one set of partial rows (:mod:`.compacted`) per date."""
    from pyspark.sql import functions as F

    return functools.reduce(lambda a, b: a.unionByName(b), [
        spark.read.schema("k string").parquet(partials_path(str(root), d, subset))
        .select("k", F.lit(d).alias("d"))
        for d in sorted(p.name.removeprefix("date=") for p in root.glob("date=*"))
    ])


def test_every_aggregate_table_agrees_with_the_per_message_table(synth_report: ReportData) -> None:
    """Tables computed by Spark (pairs, hours), rolled up from the AppKey x
    SaveFwd combinations (AppKey, SaveFwd) and summed from the hours (days,
    overall) all equal a direct aggregation of the per-message rows."""
    messages = synth_report["messages"].dicts()
    for table, key in (("overall", ()), ("by_pair", ("source", "target")),
                       ("by_appkey", ("domain", "data_type")), ("by_save_fwd", ("save_fwd",)),
                       ("by_path", ("path",)), ("by_day", ("day",)), ("by_hour", ("hour",))):
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for m in messages:
            groups.setdefault(tuple(m[k] for k in key), []).append(m)
        rows = synth_report[table].dicts()
        assert len(rows) == len(groups), table
        for row in rows:
            ms = groups[tuple(row[k] for k in key)]
            assert row["messages"] == len(ms), (table, row)
            for outcome in OUTCOMES:
                assert row[outcome] == sum(m["outcome"] == outcome for m in ms), (table, outcome)
            for name in (*LEG_NAMES, "target_offline"):
                values = [m[f"{name}_ms" if name == "target_offline" else name] for m in ms]
                values = [v for v in values if v is not None]
                column = "target_offline_max_ms" if name == "target_offline" else f"{name}_max"
                assert row[column] == (max(values) if values else None), (table, column)
            assert row["resends"] == sum(m["resends"] for m in ms), table
    assert {r["path"] for r in synth_report["by_path"].dicts()} == {"direct", "relay"}


def test_partials_of_separate_compaction_runs_merge(spark: Any, synth_logs: Path, compacted_by_day: Path,
                                                    synth_report: ReportData) -> None:
    """A message whose events lie on several dates has partial rows from several
    compaction runs; merged, they give exactly the report of the raw logs.
    Each run saw one date, so such a message is closed in the dates of both
    runs: its finished rows must not be taken as they are."""
    from pyspark.sql import functions as F

    days = _log_days(synth_logs)
    assert len(days) >= 4  # the day before (skewed clocks), three days, the day after
    closed = _partial_keys(spark, compacted_by_day, "closed")
    assert _partial_keys(spark, compacted_by_day, "open").count() < 10  # the rows of no message
    spanning = closed.groupBy("k").agg(F.countDistinct("d").alias("n")).where("n > 1").count()
    assert spanning >= 20
    got = build_report(spark, resolve_inputs([str(compacted_by_day)]), ReportOptions(with_messages=True))
    assert got.meta["compacted_dates"] == {"partials": len(days), "events": 0}
    assert not got.meta["compacted_final"]
    assert_same_tables(synth_report, got)
    for key in ("events", "duplicate_events", "malformed_events", "messages"):
        assert got.meta[key] == synth_report.meta[key], key


def test_one_compaction_run_takes_closed_messages_as_they_are(
        spark: Any, synth_logs: Path, compacted_at_once: Path, synth_report: ReportData) -> None:
    """Compacted in one run, a message with events on one date only has its
    finished row there; one with events on several dates has only partial
    rows, in each of them, which the report merges: the same tables."""
    from pyspark.sql import functions as F

    days = _log_days(synth_logs)
    final = _partial_keys(spark, compacted_at_once, "final").where(~F.col("k").startswith("\u0001"))
    closed = _partial_keys(spark, compacted_at_once, "closed").where(~F.col("k").startswith("\u0001"))
    opened = _partial_keys(spark, compacted_at_once, "open").where(~F.col("k").startswith("\u0001"))
    assert final.count() == final.select("k").distinct().count() == closed.select("k").distinct().count()
    assert final.join(opened, "k").count() == 0
    spanning = opened.groupBy("k").agg(F.countDistinct("d").alias("n"))
    assert spanning.where("n < 2").count() == 0 and spanning.count() >= 20
    assert final.count() + spanning.count() == synth_report.meta["messages"]
    got = build_report(spark, resolve_inputs([str(compacted_at_once)]), ReportOptions(with_messages=True))
    assert got.meta["compacted_dates"] == {"partials": len(days), "events": 0}
    assert got.meta["compacted_final"]
    assert_same_tables(synth_report, got)
    for key in ("events", "duplicate_events", "malformed_events", "messages"):
        assert got.meta[key] == synth_report.meta[key], key


@pytest.mark.parametrize("runs", ["by_day", "at_once"])
def test_compacted_dates_are_reported_from_their_partials_alone(
        spark: Any, compacted_by_day: Path, compacted_at_once: Path, synth_report: ReportData,
        tmp_path: Path, runs: str) -> None:
    """Partials carry everything a report needs, names and the AppKeys of the
    stuck and failed lists included: with the events' files gone, the report
    is the same."""
    import shutil

    out = tmp_path / "pq"
    shutil.copytree(compacted_by_day if runs == "by_day" else compacted_at_once, out)
    removed = [p for p in out.glob("date=*/part-*") if p.is_file()]
    assert removed
    for p in removed:
        p.unlink()
    got = build_report(spark, resolve_inputs([str(out)]), ReportOptions(with_messages=True))
    assert len(got["stuck"]) and len(got["failed"])
    assert_same_tables(synth_report, got)


@pytest.mark.parametrize("runs", ["by_day", "at_once"])
@pytest.mark.parametrize("window", [(1, 5, 2, 0), (1, 5, None, None), (1, 0, 1, 12)])
def test_a_window_reads_cut_dates_from_events_and_whole_dates_from_partials(
        spark: Any, synth_logs: Path, compacted_by_day: Path, compacted_at_once: Path,
        window: tuple[Any, ...], runs: str) -> None:
    """--since/--until apply to compacted input exactly as to the logs: a date
    the window of event times cuts is read from its events, a date wholly
    inside it from its partials (of one run: closed messages as they are, the
    open ones merged with the events of the cut dates)."""
    start = SYNTH.start_ms
    since = start + window[0] * 86_400_000 + window[1] * HOUR
    until = None if window[2] is None else start + window[2] * 86_400_000 + window[3] * HOUR
    opts = ReportOptions(since_ms=since, until_ms=until, with_messages=True)
    want = build_report(spark, resolve_inputs([str(synth_logs)]), opts)
    got = build_report(spark, resolve_inputs([str(compacted_by_day if runs == "by_day" else compacted_at_once)]),
                       opts)
    assert_same_tables(want, got)
    assert got.meta["compacted_final"] == (runs == "at_once")
    used = got.meta["compacted_dates"]
    # Event times read: [since - 1 h, until + 24 h); the dates in the logs are
    # 10-31 (skewed clocks, connection events), 11-01..11-03, maybe 11-04.
    assert used == {(1, 5, 2, 0): {"partials": 1, "events": 1},  # 11-02 cut, 11-03 whole
                    (1, 5, None, None): {"partials": len(_log_days(synth_logs)) - 3, "events": 1},
                    (1, 0, 1, 12): {"partials": 1, "events": 2}}[window]  # 11-01 and 11-03 cut


def test_dates_without_complete_partials_are_read_from_events(
        spark: Any, synth_logs: Path, compacted_by_day: Path, synth_report: ReportData,
        tmp_path: Path) -> None:
    """A compaction that stopped before the marker, a dataset from before
    partials, a marker of another layout version: those dates are read from
    their events. The next compaction into the dataset adds their partials."""
    import shutil

    from semq.analytics.compacted import PARTIALS_MARKER

    out = tmp_path / "pq"
    shutil.copytree(compacted_by_day, out)
    days = _log_days(synth_logs)

    def marker(day: str) -> Path:
        [found] = Path(partials_path(str(out), day)).glob(f"{PARTIALS_MARKER}.*")
        return found

    marker(days[1]).unlink()
    shutil.rmtree(partials_path(str(out), days[2]))
    marker(days[3]).rename(marker(days[3]).with_name("_COMPLETE_V2"))
    got = build_report(spark, resolve_inputs([str(out)]), ReportOptions(with_messages=True))
    assert got.meta["compacted_dates"] == {"partials": len(days) - 3, "events": 3}
    assert_same_tables(synth_report, got)

    result = compact(spark, resolve_inputs([str(synth_logs / "*" / "events" / f"events-{days[0]}.jsonl")]),
                     str(out))
    assert result["replaced"] == [days[0]]
    assert result["partials"] == [days[0], days[1], days[2], days[3]]
    again = build_report(spark, resolve_inputs([str(out)]), ReportOptions(with_messages=True))
    assert again.meta["compacted_dates"] == {"partials": len(days), "events": 0}
    assert_same_tables(synth_report, again)


def test_a_date_compacted_again_by_another_run(spark: Any, synth_logs: Path, compacted_at_once: Path,
                                              synth_report: ReportData, tmp_path: Path) -> None:
    """One date compacted again, alone: its messages that also have events on
    the neighbouring dates are closed in it for the new run and open in the
    old run's dates. Dates of two runs: every closed message is merged too."""
    import shutil

    from pyspark.sql import functions as F

    out = tmp_path / "pq"
    shutil.copytree(compacted_at_once, out)
    days = _log_days(synth_logs)
    result = compact(spark, resolve_inputs([str(synth_logs / "*" / "events" / f"events-{days[2]}.jsonl")]),
                     str(out))
    assert result["replaced"] == result["partials"] == [days[2]]
    now_closed = _partial_keys(spark, out, "final").where(F.col("d") == days[2])
    assert now_closed.join(_partial_keys(spark, out, "open"), "k").count() >= 10
    got = build_report(spark, resolve_inputs([str(out)]), ReportOptions(with_messages=True))
    assert got.meta["compacted_dates"] == {"partials": len(days), "events": 0}
    assert not got.meta["compacted_final"]
    assert_same_tables(synth_report, got)


@pytest.mark.parametrize("runs", ["by_day", "at_once"])
def test_compacted_and_raw_logs_together(spark: Any, synth_logs: Path, compacted_by_day: Path,
                                         compacted_at_once: Path, tmp_path: Path, runs: str) -> None:
    """Partials merge with events read from JSON in the same report: a log given
    both compacted and raw counts like a log given twice (the same lines read
    twice, duplicates of counted events ignored)."""
    import shutil

    copy = tmp_path / "again"
    shutil.copytree(synth_logs, copy)
    twice = build_report(spark, resolve_inputs([str(synth_logs), str(copy)]),
                         ReportOptions(with_messages=True))
    mixed = build_report(spark, resolve_inputs([str(compacted_by_day if runs == "by_day" else compacted_at_once),
                                                str(copy)]),
                         ReportOptions(with_messages=True))
    assert not mixed.meta["compacted_final"]
    assert_same_tables(twice, mixed)
    for key in ("events", "duplicate_events", "malformed_events", "messages"):
        assert mixed.meta[key] == twice.meta[key], key
    assert twice.meta["duplicate_events"] > 0


@pytest.mark.parametrize("runs", ["by_day", "at_once"])
def test_two_compacted_datasets_with_the_same_dates(spark: Any, synth_logs: Path, compacted_by_day: Path,
                                                     compacted_at_once: Path, tmp_path: Path,
                                                     runs: str) -> None:
    """A report over one dataset takes its partial rows as they are (each
    counted event in one row); over two that hold the same dates, the rows
    are merged per counted event first: the same as the logs given twice."""
    import shutil

    copy = tmp_path / "pq-again"
    compacted = compacted_by_day if runs == "by_day" else compacted_at_once
    shutil.copytree(compacted, copy)
    logs_again = tmp_path / "again"
    shutil.copytree(synth_logs, logs_again)
    twice = build_report(spark, resolve_inputs([str(synth_logs), str(logs_again)]),
                         ReportOptions(with_messages=True))
    both = build_report(spark, resolve_inputs([str(compacted), str(copy)]),
                        ReportOptions(with_messages=True))
    assert both.meta["compacted_dates"]["events"] == 0
    assert not both.meta["compacted_final"]
    assert_same_tables(twice, both)
    assert both.meta["duplicate_events"] == twice.meta["duplicate_events"] > 0


def test_html_is_self_contained_and_text_summarizes(report: ReportData) -> None:
    html = render_html(report)
    assert html.count("<svg") >= 6  # 2 time series, 2 heat maps, 2 histograms, stuck bars
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html and "<link" not in html
    assert "stored_at_platform" in html and "C/1/1/6" in html
    text = render_text(report)
    assert "STUCK 4" in text and "C/1/1/5" in text and "org:A" in text


def test_cli_writes_report_files(spark: Any, logs_dir: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="semq")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    out = tmp_path / "rep"
    args = parser.parse_args(["report", "latency", "--logs", str(logs_dir), "--out", str(out),
                              "--since", "2026-11-22T00:00:00Z", "--until", "2026-11-22T02:00",
                              "--stuck-after", "30m"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "report.html")
    assert "join events by LK0" in captured.err  # progress on stderr
    html = (out / "report.html").read_text()
    assert "<svg" in html and "http://" not in html and "https://" not in html
    for name in ("overall", "legs", "by_pair", "by_appkey", "by_save_fwd", "by_path", "by_hour", "by_day",
                 "histogram", "stuck", "failed", "clock_skew", "offline", "loggers"):
        assert (out / f"{name}.csv").stat().st_size > 0
        assert (out / f"{name}.parquet").stat().st_size > 0
    # --until 02:00 leaves out M9 (queued at 03:00).
    first = (out / "overall.csv").read_text().splitlines()[1].split(",")
    assert first[0] == "110"


@pytest.mark.parametrize("direct", [0.0, 0.3])
def test_synthetic_logs_match_their_ground_truth(spark: Any, tmp_path: Path, direct: float) -> None:
    stats = generate(tmp_path / "syn", SynthConfig(messages=3000, orgs=5, seed=3, max_skew_ms=600_000,
                                                   direct=direct))
    data = build_report(spark, resolve_inputs([str(tmp_path / "syn")]), ReportOptions())
    overall = data["overall"].dicts()[0]
    assert overall["messages"] == stats.messages
    by_path = {r["path"]: r for r in data["by_path"].dicts()}
    assert {p: r["messages"] for p, r in by_path.items()} == stats.paths
    if direct:  # one hop each way and no platform: faster
        assert by_path["direct"]["e2e_ms_p50"] < by_path["relay"]["e2e_ms_p50"]
        assert by_path["direct"]["delivery_ms_p50"] < by_path["relay"]["delivery_ms_p50"]
    for outcome in ("confirmed", "delivered", "failed", "best_effort"):
        assert overall[outcome] == stats.outcomes[outcome], outcome
    # The generator knows the true end of the log; the report only knows the
    # last event, a few seconds earlier: messages right at the threshold may
    # fall on either side.
    assert overall["stuck"] + overall["in_flight"] == stats.outcomes["stuck"] + stats.outcomes["in_flight"]
    assert abs(overall["stuck"] - stats.outcomes["stuck"]) <= 3
    places: dict[str, int] = {}
    for r in data["stuck"].dicts():
        places[r["place"]] = places.get(r["place"], 0) + 1
    assert places.keys() == stats.stuck.keys()
    for place, n in stats.stuck.items():
        assert abs(places[place] - n) <= 3, place
    true_skew = stats.skew_ms
    for r in data["clock_skew"].dicts():
        assert abs(r["offset_ms"] - true_skew[r["logger"]]) <= 25, r
    for r in data["legs"].dicts():
        assert r["p50_ms"] is None or r["p50_ms"] >= 0


# ---------------------------------------------------------------- the logs of a real run


def test_report_on_the_logs_of_a_real_run(spark: Any, tmp_path: Path) -> None:
    """Platform and two organizations as real processes (security on): some
    documents forwarded at once, some stored while the target was offline.
    The report joins the three logs: every document confirmed, no leg
    negative, the stored ones with a platform dwell."""
    logs = [str(d) for d in real_run_logs(tmp_path / "run")]
    report = build_report(spark, resolve_inputs(logs), ReportOptions(with_messages=True))
    msgs = report["messages"].dicts()
    assert len(msgs) == STORED + FORWARDED
    assert {m["outcome"] for m in msgs} == {"confirmed"}
    for m in msgs:
        for leg in LEG_NAMES:
            assert m.get(leg) is None or m[leg] >= 0, (m["lk0"], leg, m[leg])
    stored = [m for m in msgs if m["dwell_ms"] is not None]
    assert len(stored) == STORED  # the documents that waited for B at the platform
    assert report["stuck"].dicts() == []


# ---------------------------------------------------------------- duplicate lines


def _counted_once(line: dict[str, Any]) -> bool:
    """A line the report dedupes (docs/analytics.md, "Duplicate lines")."""
    if line["event"] in ("node_online", "node_offline", "resend", "inquiry", "duplicate"):
        return True
    return line["event"] in ("sent", "delivered") and "attempt" not in line


def test_duplicate_lines_are_counted_once(spark: Any, tmp_path: Path) -> None:
    """A log copied twice and single lines logged twice change nothing but the
    lines read; repeats that are not copies (two resends, two inquiries at
    different times) still count."""
    L = scenario()
    m = L.msg("A/1/1/12", "A", "B")
    L.o(m, "queued", 8000)
    L.o(m, "sent", 8010, attempt=1)
    for k in (1, 2):  # lost twice: two inquiries and two resends
        L.o(m, "inquiry", 8010 + k * 15_000, detail="platform")
        L.o(m, "resend", 8011 + k * 15_000)
        L.o(m, "sent", 8012 + k * 15_000, attempt=k + 1)
    for fn, ev, t in ((L.p, "received", 38_030), (L.p, "forwarded", 38_032), (L.o, "ack_fwd", 38_050),
                      (L.r, "received", 38_060), (L.r, "inbox", 38_065), (L.r, "ack2_sent", 38_066),
                      (L.o, "ack2", 38_100)):
        fn(m, ev, t)
    clean, dup = tmp_path / "clean", tmp_path / "dup"
    L.write(clean)
    L.write(dup)
    # The origin's log copied into a second folder (a log collected twice)...
    origin_log = dup / "org-A" / "events" / "events-2026-11-22.jsonl"
    (dup / "collected-again").mkdir()
    (dup / "collected-again" / "events-2026-11-22.jsonl").write_bytes(origin_log.read_bytes())
    copied = [json.loads(x) for x in origin_log.read_text().splitlines()]
    # ...the platform's first lines (connection events, M1) written twice...
    platform_log = dup / "platform-P1" / "events" / "events-2026-11-22.jsonl"
    lines = platform_log.read_text().splitlines()
    platform_log.write_text("\n".join(lines + lines[:5]) + "\n")
    copied += [json.loads(x) for x in lines[:5]]
    # ...and the receiver's "duplicate" event of M3 twice.
    receiver_log = dup / "org-B" / "events" / "events-2026-11-22.jsonl"
    lines = receiver_log.read_text().splitlines()
    twice = next(x for x in lines if '"duplicate"' in x)
    receiver_log.write_text("\n".join([*lines, twice]) + "\n")
    copied.append(json.loads(twice))

    want = build_report(spark, resolve_inputs([str(clean)]), ReportOptions(with_messages=True))
    got = build_report(spark, resolve_inputs([str(dup)]), ReportOptions(with_messages=True))
    for name, table in want.tables.items():
        if name != "loggers":  # lines read: the copies are lines too
            assert got[name].rows == table.rows, name
    # Compacted in one run, the messages' finished rows count the same.
    compact(spark, resolve_inputs([str(dup)]), str(tmp_path / "pq"))
    compacted = build_report(spark, resolve_inputs([str(tmp_path / "pq")]), ReportOptions(with_messages=True))
    assert compacted.meta["compacted_final"]
    assert_same_tables(got, compacted)
    assert compacted.meta["duplicate_events"] == got.meta["duplicate_events"]
    assert got.meta["duplicate_events"] == sum(_counted_once(x) for x in copied) == 15
    assert want.meta["duplicate_events"] == 0
    lines_read = {r["logger"]: r["events"] for r in got["loggers"].dicts()}
    assert lines_read["org:A"] == 2 * {r["logger"]: r["events"] for r in want["loggers"].dicts()}["org:A"]
    msgs = by_lk0(got)
    assert (msgs["A/1/1/12"]["resends"], msgs["A/1/1/12"]["inquiries"]) == (2, 2)
    assert (msgs["A/1/1/3"]["resends"], msgs["A/1/1/3"]["inquiries"], msgs["A/1/1/3"]["duplicates"]) == (1, 1, 1)
    overall = got["overall"].dicts()[0]
    assert (overall["resends"], overall["inquiries"], overall["duplicates_suppressed"]) == (3, 3, 1)
    offline = {r["node"]: r["periods"] for r in got["offline"].dicts()}
    assert offline == {"B": 1, "D": 1}


def test_malformed_and_cleanup_lines(spark: Any, tmp_path: Path) -> None:
    """Lines without a role, an event or an LK0, and unknown events are counted
    as malformed and change no table; cleanup lines (``cleaned``, the
    receiver's ``reack``) are not read at all, for the per-logger counts either."""
    L = scenario()
    clean, messy = tmp_path / "clean", tmp_path / "messy"
    L.write(clean)
    m1 = L.msg("A/1/1/1", "A", "B")
    L.add("org:A", "origin", "queued", 1, {**m1, "lk0": None})  # no LK0
    L.add("org:A", "origin", "bogus", 2, m1)  # not an origin event
    L.add("org:B", "sender", "received", 3, m1)  # no such role
    L.add("platform:P1", "platform", "forwarded", 4, {**m1, "role": None})  # no role
    L.add("platform:P1", "platform", "forwarded", 5, {**m1, "event": None})  # no event
    L.p(m1, "cleaned", 200)
    L.r(m1, "cleaned", 201)
    L.r(m1, "reack", 202)
    L.write(messy)
    want = build_report(spark, resolve_inputs([str(clean)]), ReportOptions(with_messages=True))
    got = build_report(spark, resolve_inputs([str(messy)]), ReportOptions(with_messages=True))
    for name, table in want.tables.items():
        if name != "loggers":
            assert got[name].rows == table.rows, name
    assert (want.meta["malformed_events"], got.meta["malformed_events"]) == (0, 5)
    # Lines read per logger: the cleanup lines are not among them (the
    # LK0-less queued line, with a valid role and event, is a line of org:A).
    lines = {r["logger"]: r["events"] for r in want["loggers"].dicts()}
    assert {r["logger"]: r["events"] for r in got["loggers"].dicts()} == {**lines, "org:A": lines["org:A"] + 1}
