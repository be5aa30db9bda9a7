"""scripts/demo runs the real thing end to end and ends by itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_to_the_end(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SEMQ_DIR", None)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--timeout", "20"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, f"demo exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = r.stdout
    for line in (
        "$ semq send --dir A --to 56001 --type ORDER --domain trade --subtype PO --key S0001",
        "10008/1/1/",  # the order's LK0: its record id starts at the store's creation time
        "stored for: 56001=3",
        "trade/ORDER/PO/S0001",
        '<order id="S0001" buyer="10008" seller="56001">',
        "trade/ORDRSP/PO/S0001",  # B's answer, online path
        "pending-send: 1 failed (SS_FAILED)",
        "stored for: nothing",
        "$ semq report latency --logs ",
        "demo OK: 4 documents delivered exactly once",
    ):
        assert line in out, f"{line!r} missing from the demo's output:\n{out}"
    # the SaveFwd=1 document: dropped, and A was told (its state in words, the code beside)
    assert re.search(r"failed \(SS_FAILED\) +1 +0 +1 +301", out), out
    for who in ("B", "A", "platform"):
        assert f"{who}: exit 0" in out
    # The summary: every document has its row, with the path it took.
    summary = out[out.index("milliseconds after the document was queued"):]
    paths = [line.split()[5] for line in summary.splitlines() if line.strip().startswith(("10008/", "56001/"))]
    assert paths == ["stored", "stored", "stored", "dropped", "forwarded"], summary
    # Nothing left behind: the demo directory is removed.
    assert not list(tmp_path.glob("semq-demo-*"))
