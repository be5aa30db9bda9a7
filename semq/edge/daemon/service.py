"""The edge inside the node daemon: the sender always (it idles while no
document waits for a partner), the listener when ``edge_listen`` is set."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from semq.edge.daemon.listener import EdgeApp, serve_edge
from semq.edge.daemon.sender import EdgeSender
from semq.edge.keys import edge_dir, load_or_make_keys
from semq.edge.store import EdgeStore
from semq.node.core import NodeCore

__all__ = ["EdgeService", "EdgeSettings"]


@dataclass
class EdgeSettings:
    directory: Path  # the data directory (its edge/ holds our edge certificate and key)
    our_name: str  # the certificate's name when it is made
    listen: tuple[str, int] | None = None  # edge_listen
    tls: bool = False  # edge_tls: HTTPS with edge/cert.pem and edge/key.pem


class EdgeService:
    def __init__(self, core: NodeCore, gate: Callable[..., Awaitable[Any]], settings: EdgeSettings,
                 arrived: Callable[[], None] | None = None) -> None:
        self.s = settings
        keys = load_or_make_keys(settings.directory, settings.our_name)
        store = EdgeStore(core)
        self.sender = EdgeSender(store, gate, keys)
        self.app = EdgeApp(store, gate, keys, arrived)
        self.bound: int | None = None

    @property
    def stats(self) -> dict[str, int]:
        return {**self.sender.stats, **self.app.stats}

    async def run(self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.s.listen is not None:
                d = edge_dir(self.s.directory)
                tls = (d / "cert.pem", d / "key.pem") if self.s.tls else None
                self.bound = await nursery.start(partial(serve_edge, self.app, self.s.listen[0], self.s.listen[1],
                                                         tls=tls))
            task_status.started(self.bound)
            nursery.start_soon(self.sender.run)
