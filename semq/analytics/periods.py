"""Offline periods of each node, from the platform's node_online/node_offline events.

Pure Python: the connection events are few (one per connect and disconnect),
so the report collects them to the driver and pairs them here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["OfflinePeriod", "offline_periods"]


@dataclass(frozen=True, slots=True)
class OfflinePeriod:
    """`node` was not connected to `logger` (a platform) from `start` until `end`.

    Both are on the platform's clock. ``start`` is None when the log begins
    with the node offline (it connected for the first time at ``end``);
    ``end`` is None when it was still offline when the log ends. The period
    is half-open: [start, end).
    """

    logger: str
    node: str
    start: int | None
    end: int | None


def offline_periods(events: Iterable[tuple[str, str, int, str]]) -> list[OfflinePeriod]:
    """Pair connection events ``(platform logger, node, ts, event)`` into periods.

    A repeated ``node_offline`` keeps the first one (the node went away then);
    a repeated ``node_online`` is ignored. Periods of one node never overlap.
    """
    by_node: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for logger, node, ts, event in events:
        if event not in ("node_online", "node_offline"):
            continue
        # At the same ms, offline sorts before online: a reconnect, not a gap.
        by_node.setdefault((logger, node), []).append((ts, 0 if event == "node_offline" else 1))
    periods: list[OfflinePeriod] = []
    for (logger, node), evs in sorted(by_node.items()):
        evs.sort()
        state: str | None = None  # unknown until the first event
        since: int | None = None
        for ts, kind in evs:
            if kind == 0:
                if state != "offline":
                    state, since = "offline", ts
            else:
                if state == "offline":
                    periods.append(OfflinePeriod(logger, node, since, ts))
                elif state is None:
                    periods.append(OfflinePeriod(logger, node, None, ts))
                state, since = "online", None
        if state == "offline":
            periods.append(OfflinePeriod(logger, node, since, None))
    return periods
