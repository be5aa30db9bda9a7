"""The suite's notes on the receiver as units (scripts/benchmarks/suite.py)
and the per-process figures they rest on (scripts/benchmarks/e2e.py), on
made-up measurements."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchmarks import e2e, suite


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


def test_a_node_of_units_is_the_sum_of_its_processes() -> None:
    cpu = {"P": 20.0, "A": 10.0, "B": None, "B/sup": 0.1, "B/1": 18.0, "B/2": 17.0}
    assert e2e.of_node(cpu, "B") == pytest.approx(35.1)
    assert e2e.of_node(cpu, "P") == 20.0
    assert e2e.of_node({"P": 1.0, "B": None}, "B") is None
    rows = [{"cpu": cpu}, {"cpu": {**cpu, "B/1": 20.0}}, {"cpu": {**cpu, "B/1": 22.0}}]
    assert e2e.per_process(rows) == {"P": 20.0, "A": 10.0, "B/sup": 0.1, "B/1": 20.0, "B/2": 17.0}


def _res() -> suite.Results:
    res = suite.Results()
    one = {"P": 16.0, "A": 10.0, "B": 34.0}
    two = {"P": 20.0, "A": 12.0, "B": None, "B/sup": 0.0, "B/1": 19.0, "B/2": 19.0}
    for r, (rate1, rate2) in enumerate([(20_000.0, 26_000.0), (22_000.0, 24_000.0)]):
        res.semq[False]["drain"].append({"rate": rate1, "cpu": one, "repeat": r})
        res.units["drain"].append({"rate": rate2, "cpu": two, "repeat": r})
    for k in ("online", "store"):
        res.semq[False][k].append({"rate": 20_000.0, "cpu": one})
        res.units[k].append({"rate": 25_000.0, "cpu": two})
    res.peers["nats"].append({"drain_cpu_parts": {"broker": 10.0, "subscriber": 36.0}})
    return res


def test_the_aims_say_met_or_not_with_the_ratios_and_the_ceiling() -> None:
    a = argparse.Namespace(receiver_units=2, sender_units=1)
    res = _res()
    rate = {(False, k): suite._median([x["rate"] for x in res.semq[False][k]]) for k in suite.UNIT_PHASES}
    units_rate = {k: suite._median([x["rate"] for x in res.units[k]]) for k in res.units}
    units_cpu = {k: (70.0 if res.units[k] else None) for k in res.units}
    peer_rate: dict[tuple[str, str], float | None] = {("nats", "online"): 20_000.0, ("nats", "drain"): 20_000.0}
    peer_cpu: dict[tuple[str, str], float | None] = {("nats", "online"): 90.0, ("nats", "store"): 34.0,
                                                     ("nats", "drain"): 46.0}
    semq_cpu: dict[tuple[bool, str], float | None] = {(False, k): 60.0 for k in suite.UNIT_PHASES}
    notes = suite._units_notes(a, res, rate, peer_rate, semq_cpu, peer_cpu, units_rate, units_cpu)
    text = "\n".join(notes)
    # drain: 25,000 (median) / 20,000 = 1.25x NATS (aim 1.3x), / 21,000 = 1.19x one unit (aim 1.2x).
    assert "aim drain, B as 2 units >= 1.3x NATS JetStream's drain: 25,000 / 20,000 = 1.25x, NOT met" in text
    assert "26,000/s needs <= 77 us" in text  # the ceiling beside an aim not met
    assert "SEMQ's drain with B as one unit: 25,000 / 21,000 = 1.19x (per repeat: 1.30, 1.09), NOT met" in text
    assert "aim online, B as 2 units >= 1.3x NATS JetStream's online: 25,000 / 20,000 = 1.25x, NOT met" in text
    # CPU: 60 / 90 met online; 70 / 46 not met in the drain; per process listed.
    assert "online (security off): B as one unit 60 / 90 us = 0.67x, met; B as 2 units 70 / 90 us = 0.78x, met" in text
    assert "drain (security off): B as one unit 60 / 46 us = 1.30x, NOT met" in text
    assert ("drain (security off, medians): SEMQ, B as one unit: P 16, A 10, B 34; B as 2 units: P 20, A 12,"
            " B supervisor 0.0, B unit 1 19, B unit 2 19; NATS JetStream: broker 10, subscriber 36.") in text
