"""The suite's CPU-ceiling notes (scripts/benchmarks/suite.py): the
arithmetic that says how far a rate target is from what the CPU spent per
document allows, on made-up measurements."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchmarks import suite


def _results(cpu: dict[str, dict[str, float]]) -> suite.Results:
    res = suite.Results()
    for phase, per_role in cpu.items():
        res.semq[False][phase] = [{"cpu": dict(per_role)}]
    return res


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


def test_a_target_not_met_gets_its_ceiling_and_what_it_needs() -> None:
    cores = 2
    res = _results({"drain": {"P": 16.0, "A": 10.0, "B": 32.0}, "online": {"P": 19.0, "A": 24.0, "B": 36.0}})
    rates = {(False, "online"): 25_000.0, (False, "store"): 30_000.0, (False, "drain"): 24_000.0}
    notes = suite._ceiling_notes(res, rates, {("nats", "online"): 20_000.0, ("mosquitto", "online"): 15_000.0})
    assert len(notes) == 2  # drain < 45,000/s; online < 2x mosquitto; the rest met
    drain, online = notes
    assert drain.startswith("CPU ceiling, drain")
    assert "58 us per document (P 16, A 10, B 32)" in drain
    assert f"{cores} cores allow at most {cores * 1e6 / 58:,.0f}/s" in drain
    assert f"B's one interpreter about {1e6 / 32:,.0f}/s" in drain
    assert f"45,000/s needs <= {cores * 1e6 / 45_000:,.0f} us in all" in drain
    assert "2x mosquitto = 30,000/s" in online and "79 us per document" in online


def test_a_target_the_cpu_already_allows_says_so() -> None:
    res = _results({"online": {"P": 19.0, "A": 21.0, "B": 30.0}})
    rates = {(False, "online"): 25_000.0, (False, "store"): 30_000.0, (False, "drain"): 50_000.0}
    (note,) = suite._ceiling_notes(res, rates, {("nats", "online"): 20_000.0, ("mosquitto", "online"): 13_000.0})
    # 2x mosquitto = 26,000/s needs <= 77 us in all; the daemons used 70.
    assert "needs <= 77 us in all (the CPU already allows it" in note and "less)" not in note


def test_met_targets_and_missing_measurements_print_nothing() -> None:
    res = _results({"drain": {"P": 5.0, "A": 5.0}})  # B's CPU was not read
    rates = {(False, "online"): 40_000.0, (False, "store"): 30_000.0, (False, "drain"): 10_000.0}
    assert suite._ceiling_notes(res, rates, {("nats", "online"): 20_000.0, ("mosquitto", "online"): 15_000.0}) == []
