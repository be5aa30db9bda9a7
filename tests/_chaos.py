"""Shared helpers of the reliability tests: the chaos machinery of
scripts/chaos.py (loaded from its file: scripts/ is not a package), and small
readers of the stores and event logs."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from semq.node.api import NodeClient

ROOT = Path(__file__).resolve().parent.parent


def _load_chaos() -> Any:
    name = "semq_scripts_chaos"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "chaos.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


chaos = _load_chaos()
ChaosConfig = chaos.ChaosConfig
Net = chaos.Net
run_chaos = chaos.run_chaos

__all__ = ["ChaosConfig", "Net", "chaos", "event_lk0s", "events", "run_chaos", "send_docs", "wait_for"]


def events(directory: Path) -> Iterator[dict[str, Any]]:
    """Records of a data directory's JSON-lines event logs (a line torn by a
    SIGKILL is skipped; docs/events.md: the store is the truth)."""
    for p in sorted((Path(directory) / "events").glob("*.jsonl")):
        for line in p.read_text(errors="replace").splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue


def event_lk0s(directory: Path, event: str) -> set[str]:
    """LK0s (``NODE/SEMQ/DB/RECORD``) with at least one ``event`` record."""
    return {e["lk0"] for e in events(directory) if e.get("event") == event and "lk0" in e}


def send_docs(node_dir: Path, to: str, n: int, *, seed: str, size: int = 1024,
              **kw: Any) -> dict[str, bytes]:
    """Hand ``n`` seeded documents to a node (Python API); returns
    ``{"ORIGIN/RECORD": bytes}`` as tests/_procs.Cluster.inbox keys them."""
    rng = random.Random(seed)
    with NodeClient(node_dir) as node:
        docs = [dict(to=to, data=rng.randbytes(rng.randint(1, size)), data_type="ORDER", key=f"K{i}", **kw)
                for i in range(n)]
        lks = node.send_many(docs)
    return {f"{lk.endpoint.node_id}/{lk.record_id}": d["data"] for lk, d in zip(lks, docs, strict=True)}


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
