"""`scripts/bench history` (scripts/benchmarks/history.py) in a tiny
configuration, and the suite's note on what the history costs: the
history is built as a daemon builds it, every kind of question finds what
it should, and the figures are printed with the target's verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchmarks import history, suite


def test_the_history_benchmark_builds_searches_and_judges(capsys: Any, tmp_path: Path) -> None:
    assert history.main(["--rows", "3000", "--queries", "5", "--keep", str(tmp_path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["build"]["rows"] == 3000 and got["build"]["bytes"] > 0
    found = {q["query"]: q["found_per_query"] for q in got["queries"]}
    assert found["track KEY (exact)"] == 1.0 and found["track LK0 (timeline)"] == 1.0
    assert found["track --to ORG (newest 50)"] == 50.0 and found["newest 50 (console search)"] == 50.0
    assert all(q["p99_ms"] >= q["p50_ms"] > 0 for q in got["queries"])
    # Again on the kept file, as a table.
    assert history.main(["--rows", "3000", "--queries", "3", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "delivery history: 3,000 documents" in out and "target: every search p99 < 100 ms" in out


def test_the_suite_judges_the_history_on_paired_runs() -> None:
    res = suite.Results()
    res.history_off = [{"rate": 10_000.0, "with_history_ratio": 0.97, "with_history_cpu": {"A": 60.0, "B": 40.0},
                        "cpu": {"A": 58.0, "B": 38.0}},
                       {"rate": 9_000.0, "with_history_ratio": 0.91, "with_history_cpu": {"A": 61.0, "B": 41.0},
                        "cpu": {"A": 57.0, "B": 37.0}},
                       {"rate": 9_500.0, "with_history_ratio": 0.99, "with_history_cpu": {"A": 60.0, "B": 40.0},
                        "cpu": {"A": 58.0, "B": 38.0}}]

    def cpu(runs: list[dict[str, Any]]) -> float | None:
        return sum(sum(r["cpu"].values()) for r in runs) / len(runs) if runs else None

    note = suite._history_note(res, cpu)
    assert "online with it / without it = 97.0% (median of 3 paired run(s): 97.0%, 91.0%, 99.0%)" in note
    assert "CPU per document 101 us with it, 95 us without" in note and note.endswith("met.")
    res.history_off[0]["with_history_ratio"] = 0.90
    assert suite._history_note(res, cpu).endswith("NOT met.")
    assert "not measured" in suite._history_note(suite.Results(), cpu)
