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


def test_more_instances_send_more_documents_through_the_store() -> None:
    t = model.Traffic(orgs=1000, docs_per_org_day=100, online=0.7, peak=3)
    assert abs(model.stored_share(t, 1) - 0.3) < 1e-9
    assert model.stored_share(t, 4) > model.stored_share(t, 2) > model.stored_share(t, 1)


def test_a_bad_argument_is_a_usage_error() -> None:
    assert model.main(["--online", "2"]) == 2
