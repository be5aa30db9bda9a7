"""`scripts/bench report`: the name issue 5 gives the Spark report benchmark
(the same run as `scripts/bench analytics`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("semq_bench_analytics", Path(__file__).with_name("analytics.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc: int = mod.main(argv)
    return rc
