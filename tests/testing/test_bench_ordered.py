"""`scripts/bench ordered` (scripts/benchmarks/ordered.py): the ratio
ordered / unordered per round and its notes on made-up measurements, and
the benchmark itself run in a tiny configuration with real processes."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchmarks import e2e, ordered


def _row(rnd: int, rate: float, a: float, p: float, b: float, held: int | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"round": rnd, "docs": 1000, "seconds": 1000 / rate, "rate": rate, "p50": 10.0,
                           "p99": 20.0, "cpu": {"P": p, "A": a, "B": b}, "accept": 30_000.0, "ack_save": 0}
    if held is not None:
        row["held"] = held
    return row


def test_the_ratio_is_the_median_of_each_rounds_ratio_and_the_aim_is_judged_on_it() -> None:
    runs = {
        "unordered": [_row(1, 20_000.0, 20, 15, 30), _row(2, 10_000.0, 20, 15, 30), _row(3, 16_000.0, 20, 15, 30)],
        "ordered": [_row(1, 18_000.0, 20, 15, 33, 0), _row(2, 9_000.0, 20, 15, 33, 0),
                    _row(3, 8_000.0, 20, 15, 33, 0)],
        "held": [_row(1, 14_000.0, 22, 15, 45, 250), _row(2, 7_000.0, 22, 15, 45, 250),
                 _row(3, 12_000.0, 22, 15, 45, 250)],
    }
    assert ordered.ratios(runs, "ordered") == pytest.approx([0.9, 0.9, 0.5])
    a = argparse.Namespace(held_every=4, secure=False, synchronous="FULL", repeat=3)
    rows, notes = ordered.report(a, runs, 12.0)
    by_variant = {r[0]: dict(zip(ordered.HEADERS, r, strict=True)) for r in rows}
    assert by_variant["unordered"]["x unordered"] == "1.00x"
    assert by_variant["ordered (one channel)"]["x unordered"] == "0.90x"  # median of 0.9, 0.9, 0.5
    assert by_variant["ordered (one channel)"]["docs/s"] == "9,000"
    held = by_variant["ordered, every 4th at priority 1 (held)"]
    assert (held["x unordered"], held["held"], held["CPU B us/doc"], held["CPU total us/doc"]) == (
        "0.70x", "250", "45", "82")
    text = "\n".join(notes)
    assert ("ordered (one channel) / unordered: docs/s 0.90x (per round: 0.90, 0.90, 0.50; of the medians"
            " 0.56x), aim >= 80%: met; CPU per document A 1.00x, P 1.00x, B 1.10x, total 1.05x.") in text
    assert "(held) / unordered: docs/s 0.70x (per round: 0.70, 0.70, 0.75;" in text
    assert "aim >= 80%: NOT met" in text


@pytest.mark.e2e
def test_a_tiny_run_measures_each_variant_and_prints_both_rates_and_the_ratio(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert ordered.main(["--count", "40", "--repeat", "1", "--held-every", "4", "--phase-timeout", "60"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("variant"))
    assert re.split(r"\s{2,}", lines[head].strip()) == ordered.HEADERS
    cells = [dict(zip(ordered.HEADERS, re.split(r"\s{2,}", line.strip()), strict=True))
             for line in lines[head + 2: head + 5]]
    rows = {c["variant"]: c for c in cells}
    assert set(rows) == {"unordered", "ordered (one channel)", "ordered, every 4th at priority 1 (held)"}
    for c in cells:  # each variant's rate, its ratio to unordered, and the CPU per document of A and B
        assert c["docs"] == "40" and float(c["docs/s"].replace(",", "")) > 0
        assert re.fullmatch(r"\d+\.\d\dx", c["x unordered"])
        assert c["CPU A us/doc"] != "-" and c["CPU B us/doc"] != "-"
    assert rows["unordered"]["x unordered"] == "1.00x" and rows["unordered"]["held"] == "-"
    assert rows["ordered, every 4th at priority 1 (held)"]["held"] == "10"  # every 4th of 40
    assert re.search(r"ordered \(one channel\) / unordered: docs/s \d+\.\d\dx .* aim >= 80%: (met|NOT met)", out)


def test_json_has_every_round_and_the_ratios(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the runs and the per-round ratios instead of the table
    (the phases are made up here: no processes)."""
    rates = {"unordered": 10_000.0, "ordered": 9_500.0, "held": 8_000.0}

    def phase(tmp: Path, n: int, a: argparse.Namespace, name: str = "", **kw: Any) -> dict[str, Any]:
        assert (kw["inspect"] is None) == (name == "unordered")
        return _row(0, rates[name], 20, 15, 30, None if name == "unordered" else 0)

    monkeypatch.setattr(e2e, "phase_online", phase)
    assert ordered.main(["--count", "100", "--repeat", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["round"] for r in got["runs"]["ordered"]] == [1, 2]
    assert got["ratios"] == {"ordered": [0.95, 0.95], "held": [0.8, 0.8]}


def test_ordered_documents_are_one_channel_and_the_held_variant_raises_every_kth() -> None:
    docs = ordered.documents_of("held", 4)(0, 8)
    assert {d["ordered"] for d in docs} == {ordered.CHANNEL}
    assert [d.get("priority", 0) for d in docs] == [0, 0, 0, 1, 0, 0, 0, 1]
    plain = ordered.documents_of("ordered", 4)(0, 4)
    assert all(d["ordered"] == ordered.CHANNEL and "priority" not in d for d in plain)
    assert ordered.documents_of("unordered", 4)(0, 2) == e2e.documents(0, 2)
    assert "ordered" not in e2e.documents(0, 1)[0]
