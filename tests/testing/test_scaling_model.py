"""scripts/scaling_model.py (docs/scaling.md): deterministic, quick, and
its verdicts follow from the measured costs it carries."""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import scaling_model as model


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert model.main(list(argv)) == 0
    return out.getvalue()


def test_the_model_is_deterministic_and_quick() -> None:
    t = time.monotonic()
    first = _run()
    assert _run() == first
    assert time.monotonic() - t < 5


def test_one_process_saturates_on_idle_connections_before_100000_organizations() -> None:
    c, m = model.Costs(), model.Machine()
    t = model.Traffic(orgs=100_000, docs_per_org_day=100, online=0.7, peak=3)
    v = model.sqlite_design(t, c, m)
    assert not v.fits and "CPU" in v.limit
    assert model.pg_design(t, c, m).fits


def test_more_instances_hand_more_documents_over_and_store_no_more() -> None:
    t = model.Traffic(orgs=1000, docs_per_org_day=100, online=0.7, peak=3)
    assert abs(model.stored_share(t, 1) - 0.3) < 1e-9 and model.stored_share(t, 4) == model.stored_share(t, 1)
    assert model.crossing_share(t, 1) == 0
    assert model.crossing_share(t, 4) > model.crossing_share(t, 2) > 0
    c = model.Costs()
    assert model.pg_needs(t, c, 1000, 0.3, 0.5)[0] > model.pg_needs(t, c, 1000, 0.3, 0.0)[0]


def test_a_bad_argument_is_a_usage_error() -> None:
    assert model.main(["--online", "2"]) == 2
