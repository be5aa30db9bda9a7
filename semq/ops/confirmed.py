"""Which of a node's documents, named to an operator command that found no
row for them (``admin resend|requeue|purge ID``), were confirmed end to
end, by whom and when: from the delivery history (semq.tracking.history),
which keeps them after the store has cleaned their rows."""

from __future__ import annotations

from pathlib import Path

from semq.settings.config import Config
from semq.tracking.history import HistoryReader, history_paths

__all__ = ["confirmations"]


def _lk0s(cfg: Config, ref: str) -> list[str]:
    """The LK0s ``ref`` may name: itself, or a bare record id in each unit."""
    if "/" in ref:
        return [ref]
    return [f"{cfg.org}/{unit}/1/{ref}" for unit in range(1, cfg.units + 1)]


def confirmations(directory: Path, cfg: Config, refs: list[str]) -> dict[str, tuple[str, str, int]]:
    """ref -> (its LK0, the organization that confirmed it, when: epoch ms)
    for those of ``refs`` (record ids or LK0s) the history shows confirmed
    (ack2 at the origin)."""
    paths = history_paths(directory)
    if not paths or not refs:
        return {}
    reader = HistoryReader(paths)
    out: dict[str, tuple[str, str, int]] = {}
    try:
        for ref in refs:
            for lk0 in _lk0s(cfg, ref):
                row = next((r for r in reader.document(lk0) if r["role"] == "origin" and r["state"] == "ack2"), None)
                if row is not None:
                    out[ref] = (lk0, str(row["target"]), int(row["last_ms"]))
                    break
    finally:
        reader.close()
    return out
