"""The node daemon's background work for its features: check-backs of
transactional messages, the dead-letter max-attempts rule, and the
retention of the transaction and request/reply tables. One call for the daemon to start::

    nursery.start_soon(partial(run_background_tasks, self.core, gate=self.gate))

Its store work runs through the daemon's store gate on the daemon's own
connection (short transactions; a check-back command runs on a thread of
its own, outside the gate). It reads ``capabilities.toml`` when it
changes, and never ends on an error.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING, Final

from ..features import dead, rpc
from ..features.capabilities import load_capabilities
from ..features.tasks import run_checkbacks
from ..features.txn import Checkback, StoreRunner, Transactions, open_node

if TYPE_CHECKING:
    from ..api import NodeClient
    from ..core import NodeCore

__all__ = ["maintain", "run_background_tasks"]

log = logging.getLogger("semq.features")

RETENTION_EVERY: Final = 3600.0  # s between retention passes


def maintain(node: NodeClient | NodeCore, *, retention: bool = True) -> dict[str, int]:
    """One maintenance pass (sync): the max-attempts sweep when
    ``[dead] max_attempts`` is set, and with ``retention`` the purge of
    decided half messages (7 days) and old request/reply records (30 days)."""
    from ..features._access import node_dir

    caps = load_capabilities(node_dir(node))
    out = {"dead": dead.sweep(node, caps.dead.max_attempts)}
    if retention:
        out["tx_purged"] = Transactions(node).purge()
        out["rpc_purged"] = rpc.purge(node)
    return out


async def run_background_tasks(
    node: NodeClient | NodeCore | str | os.PathLike[str], *, gate: StoreRunner | None = None,
    interval: float = 1.0, maintenance_interval: float = 60.0, checkback: Checkback | None = None,
) -> None:
    """Run until cancelled: check-backs every ``interval`` seconds, the
    dead-letter sweep every ``maintenance_interval``, retention hourly.
    In the node daemon: ``run_background_tasks(self.core, gate=self.gate)`` —
    the store work goes through the daemon's gate, check-back commands run
    on threads of their own. With a directory: a connection of its own."""
    import trio

    from semq.store.gate import StoreGate

    runner: StoreRunner = gate if gate is not None else StoreGate()
    own = isinstance(node, str | os.PathLike)
    store = await runner.run(open_node, node)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_checkbacks, store, interval, checkback=checkback, gate=runner))
            last_retention = -RETENTION_EVERY
            while True:
                now = trio.current_time()
                retention = now - last_retention >= RETENTION_EVERY
                try:
                    done = await runner.run(maintain, store, retention=retention)
                    if retention:
                        last_retention = now
                    if any(done.values()):
                        log.info("background maintenance: %s", done)
                except Exception:  # keep the daemon; try again next time
                    log.exception("background maintenance failed")
                await trio.sleep(maintenance_interval)
    finally:
        if own:
            store.close()
