"""The node's features for trio programs: the check-back task of the
transactional messages (``run_checkbacks``: the node daemon runs it,
semq.node.daemon.background, and so does ``semq tx watch``) and request / reply
awaited (``request_async``).

This is the features' trio shell: everything it does to the store is the
synchronous code of semq.node.features.txn and semq.node.features.rpc, run
on a worker thread (through the daemon's store gate when it has one);
those modules never import trio.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING, Any

import trio

from semq.store.gate import StoreGate
from semq.umxt_protocol import LK0

from ._access import core_of
from .capabilities import TxSettings
from .rpc import POLL, Reply, ReplyTimeout, poll_reply, send_request
from .txn import Checkback, StoreRunner, TxChecker, open_node

if TYPE_CHECKING:
    from ..api import NodeClient
    from ..core import NodeCore

__all__ = ["request_async", "run_checkbacks"]

log = logging.getLogger("semq.tx")  # (the check-backs log as semq.node.features.txn does)


async def run_checkbacks(
    node: NodeClient | NodeCore | str | os.PathLike[str], interval: float = 1.0, *,
    checkback: Checkback | None = None, settings: TxSettings | None = None, gate: StoreRunner | None = None,
) -> None:
    """Run check-backs until cancelled: every ``interval`` seconds, ask
    about each due half message and apply the answer.

    ``node``: a data directory (a connection of our own, e.g. ``semq tx
    watch``), or — inside the node daemon — its NodeCore together with its
    store ``gate``: the store work then runs through the gate, and the
    check-back itself (seconds, maybe) runs on a thread of its own, outside
    it. (Do not open a second connection to the store inside the daemon's
    process: see docs/seed-capabilities.md, "Wiring".) Errors are logged
    and retried; they never end the task."""
    own = isinstance(node, str | os.PathLike)
    runner: StoreRunner = gate if gate is not None else StoreGate()
    store = await runner.run(open_node, node)
    checker = TxChecker(store, settings=settings, checkback=checkback)
    try:
        while True:
            delay = interval
            try:
                for msg in await runner.run(checker.claim_due):
                    decision, note = await trio.to_thread.run_sync(checker.ask, msg)
                    r = await runner.run(checker.apply, msg, decision, note)
                    for tx_id, err in r.errors:
                        log.warning("transaction %d: %s", tx_id, err)
            except Exception:  # a store or config problem: keep the daemon, try again
                delay = max(interval, 5.0)
                log.exception("check-back round failed; retrying in %.0f s", delay)
            await trio.sleep(delay)
    finally:
        if own:
            store.close()


_limiters: weakref.WeakKeyDictionary[Any, trio.CapacityLimiter] = weakref.WeakKeyDictionary()


async def request_async(node: NodeClient, to: str, data: bytes, *, data_type: str, timeout: float = 10.0,
                        poll: float = POLL, **options: Any) -> Reply:
    """``request`` for trio programs: store work runs on a worker thread
    (one at a time per node), waiting is ``trio.sleep`` (cancellable; a
    fake clock makes the timeout instant). Raises ReplyTimeout."""
    core = core_of(node)
    limiter = _limiters.get(core)
    if limiter is None:
        limiter = _limiters[core] = trio.CapacityLimiter(1)

    def _send() -> LK0:
        return send_request(node, to, data, data_type=data_type, timeout=timeout, **options)

    lk0 = await trio.to_thread.run_sync(_send, limiter=limiter)
    with trio.move_on_after(timeout):
        while True:
            got = await trio.to_thread.run_sync(poll_reply, node, lk0, limiter=limiter)
            if got is not None:
                return got
            await trio.sleep(poll)
    raise ReplyTimeout(lk0, to, timeout)
