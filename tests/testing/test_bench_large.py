"""`scripts/bench large` (scripts/benchmarks/large.py) in a tiny
configuration: real processes, security on, a 2 MiB document (one frame)
and a 20 MiB one (chunked) delivered intact, the baselines and the fairness
phases measured, every figure in the JSON. No performance figure is
asserted: the aims are the benchmark's to report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchmarks import large

pytestmark = pytest.mark.e2e

PROCS = ("P", "A", "B", "send")


def test_the_large_documents_benchmark_delivers_measures_and_reports(capsys: Any, tmp_path: Path) -> None:
    keep = tmp_path / "run"
    assert large.main(["--sizes", "2,20", "--small-rate", "10", "--small-seconds", "1", "--timeout", "60",
                       "--keep", str(keep), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)

    assert got["sizes_mib"] == [2, 20] and got["content"] == "random" and got["large_from_mib"] == 4
    assert "semq from" in got["version"]
    base = got["baseline"]
    assert base["disk_write"]["mib"] == 20 and base["disk_write"]["mb_s"] > 0
    assert base["loopback_tcp"]["mb_s"] > 0
    assert base["loopback_tls"]["mb_s"] > 0 and base["loopback_tls"]["cipher"].startswith("TLS_")

    small, chunked = got["sizes"]
    # 2 MiB: one frame (its content in the inbox row); 20 MiB: chunked (a file).
    assert small["mib"] == 2 and small["path"] == "one frame" and small["inbox_path"] is None
    assert chunked["mib"] == 20 and chunked["path"] == "chunked" and chunked["chunks"] == 20
    assert chunked["resent"] is not None and Path(chunked["inbox_path"]).name.endswith(".doc")
    assert chunked["transfer_s"] > 0 and chunked["total_s"] > chunked["send_s"]
    for s in got["sizes"]:
        assert s["intact"] is True and len(s["sha256"]) == 64 and s["bytes"] == s["mib"] << 20
        assert s["total_s"] > 0 and s["send_s"] > 0 and s["e2e_mb_s"] > 0 and s["send_mb_s"] > 0
        # (a one-frame document may be delivered before the command has ended)
        assert (s["transfer_s"] is None) == s["delivered_before_send_returned"]
        assert set(s["cpu_s"]) == {*PROCS, "total"} and set(s["cpu_ms_per_mib"]) == {*PROCS, "total"}
        assert s["cpu_s"]["send"] > 0
        assert set(s["rss_peak_mib"]) == set(PROCS) and all(v > 0 for v in s["rss_peak_mib"].values())
        assert s["peak_reset"] is True and set(s["rss_before_mib"]) == {"P", "A", "B"}

    # Fairness: every small document of both phases arrived.
    sb = got["small_baseline"]
    assert sb["sent"] == sb["delivered"] > 0 and sb["p99_ms"] >= sb["p50_ms"] >= 0
    sd = chunked["small_during"]
    assert sd["sent"] == sd["delivered"] and 0 <= sd["before_large"] <= sd["sent"]
    assert "small_during" not in small

    v = got["verdicts"]
    assert v["largest_mib"] == 20 and v["rss_compared_sizes"] == [2, 20]
    assert set(v["rss_growth_mib"]) == set(PROCS)
    assert isinstance(v["rss_under_aim"], bool) and isinstance(v["disk_aim_met"], bool)
    assert v["of_disk"] > 0 and v["of_loopback_tcp"] > 0 and v["of_loopback_tls"] > 0

    # Kept: the data directories; every process stopped (the daemons' logs end).
    assert (keep / "B" / "node.sqlite").exists() and (keep / "A.log").exists()
    assert not (keep / "src" / "doc-20MiB.bin").exists()  # the sources go once checked


def test_the_report_says_every_section_with_units(capsys: Any) -> None:
    """The tables from a result (no processes): titles, units, verdicts."""
    size = {"mib": 1024, "bytes": 1 << 30, "path": "chunked", "chunks": 1024, "resent": 0, "send_s": 4.0,
            "transfer_s": 16.0, "total_s": 20.0, "send_mb_s": 268.4, "transfer_mb_s": 67.1, "e2e_mb_s": 53.7,
            "intact": True, "cpu_s": dict.fromkeys((*PROCS, "total"), 1.0),
            "cpu_ms_per_mib": dict.fromkeys((*PROCS, "total"), 1.0),
            "rss_peak_mib": {"P": 90.0, "A": 95.0, "B": 91.0, "send": 70.0},
            "rss_before_mib": {"P": 80.0, "A": 85.0, "B": 81.0}, "peak_reset": True,
            "a_large_out_files": [], "helpers": {},
            "small_during": {"sent": 300, "delivered": 300, "before_large": 290, "seconds": 16.0,
                             "p50_ms": 40.0, "p99_ms": 200.0, "max_ms": 250.0}}
    out = {"version": "semq from /x at git abc1234", "machine": "2 of 2 CPUs", "sizes_mib": [1024],
           "content": "random", "data_dir": "/tmp/x", "filesystem": "ext4 at /", "large_from_mib": 16,
           "small_rate": 20.0, "small_seconds": 5.0,
           "baseline": {"disk_write": {"mib": 1024, "seconds": 1.0, "fsync_s": 0.5, "mb_s": 1073.7},
                        "loopback_tcp": {"mib": 1024, "seconds": 0.5, "mb_s": 2147.5, "cipher": ""},
                        "loopback_tls": None},
           "small_baseline": {"sent": 100, "delivered": 100, "seconds": 5.0, "p50_ms": 12.0, "p99_ms": 30.0,
                              "max_ms": 31.0},
           "sizes": [size]}
    out["verdicts"] = large.verdicts(out)
    large.report(out)
    text = capsys.readouterr().out
    for title in ("Baselines, this machine in this run", "Throughput:", "CPU:", "Peak RSS per process, MiB",
                  "Fairness:"):
        assert title in text
    assert "git abc1234" in text and "MB/s" in text and "ms/MiB" in text
    assert "aim: every process under 150 MiB: met (highest 95.0 MiB, A at 1 GiB)" in text
    assert "aim: constant memory (flat across sizes): not judged" in text  # one size: nothing to compare
    assert "aim: 1 GiB end to end >= 50% of the disk's write rate: 53.7 MB/s = 5% of 1,073.7 MB/s, NOT met" in text
