"""The edge listener: AS2 / AS4 partners POST their messages here
(``edge_listen``; HTTPS with ``edge_tls``, plain HTTP otherwise, as AS2
commonly runs). A small ASGI app served by Hypercorn's trio worker in the
daemon's nursery, like the web console (semq.web.server).

Each request: the body read up to EDGE_MAX_BODY (a larger one is refused,
413, before anything parses it) within EDGE_REQUEST_S; the adapter that
``claims`` its headers opens it in a worker thread (verify, decrypt: refused
with the protocol's own error, nothing stored); a message id already
received gets the receipt stored with it, byte for byte, and is not
delivered again; a new one is put in the inbox and its receipt stored in one
commit, and only then answered."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio

from semq.edge.protocol import EdgePartner, EdgeProtocol, EdgeRefusal, OurKeys, load_protocols
from semq.edge.store import EdgeStore
from semq.settings.bounds import EDGE_MAX_BODY, EDGE_MAX_CONNECTIONS, EDGE_REQUEST_S

__all__ = ["EdgeApp", "serve_edge"]

log = logging.getLogger("semq.edge")
Gate = Callable[..., Awaitable[Any]]
_TEXT: Final = [(b"content-type", b"text/plain; charset=utf-8")]


class EdgeApp:
    """The ASGI application."""

    def __init__(self, store: EdgeStore, gate: Gate, keys: OurKeys,
                 arrived: Callable[[], None] | None = None) -> None:
        self.store = store
        self.gate = gate
        self.keys = keys
        self.arrived = arrived
        self.limiter = trio.CapacityLimiter(EDGE_MAX_CONNECTIONS)
        self.stats = {"edge_received": 0, "edge_replayed": 0, "edge_refused": 0}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await _answer(send, 405, [*_TEXT, (b"allow", b"POST")], b"POST an AS2 or AS4 message here\n")
            return
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            headers[k.decode("latin-1")] = v.decode("latin-1")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > EDGE_MAX_BODY:
            self.stats["edge_refused"] += 1
            await _answer(send, 413, _TEXT, f"a message is at most {EDGE_MAX_BODY} bytes\n".encode())
            return
        body = bytearray()
        with trio.move_on_after(EDGE_REQUEST_S) as timer:
            while True:
                msg = await receive()
                if msg["type"] != "http.request":
                    return  # the client went away
                body += msg.get("body", b"")
                if len(body) > EDGE_MAX_BODY:
                    self.stats["edge_refused"] += 1
                    await _answer(send, 413, _TEXT, f"a message is at most {EDGE_MAX_BODY} bytes\n".encode())
                    return
                if not msg.get("more_body", False):
                    break
        if timer.cancelled_caught:
            await _answer(send, 408, _TEXT, f"the request took over {EDGE_REQUEST_S:g} s\n".encode())
            return
        async with self.limiter:
            status, out_headers, out_body = await self.handle(headers, bytes(body))
        await _answer(send, status, [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                     for k, v in out_headers.items()], out_body)

    async def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        proto: EdgeProtocol | None = next((p for p in load_protocols().values() if p.claims(headers)), None)
        if proto is None:
            self.stats["edge_refused"] += 1
            return 400, {"Content-Type": "text/plain"}, b"not an AS2 or AS4 message\n"
        known: dict[str, EdgePartner] = {p.id: p for p in await self.gate(self.store.partners)
                                         if p.protocol == proto.name}
        try:
            got = await trio.to_thread.run_sync(proto.read_inbound, headers, body, known.get, self.keys)
        except EdgeRefusal as e:
            self.stats["edge_refused"] += 1
            log.info("edge: %s message refused: %s", proto.name, e.reason)
            return e.status, dict(e.headers), e.body
        partner = known[got.partner_id]
        before = await self.gate(self.store.answered, proto.name, got.partner_id, got.message_id)
        if before is not None:
            self.stats["edge_replayed"] += 1
            return before
        answer = await trio.to_thread.run_sync(proto.receipt_for, got, headers, partner, self.keys)
        delivered, stored = await self.gate(self.store.deliver, proto.name, got, answer, int(time.time() * 1000))
        if delivered:
            self.stats["edge_received"] += 1
            if self.arrived is not None:
                self.arrived()
        else:
            self.stats["edge_replayed"] += 1
        return stored


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def serve_edge(app: EdgeApp, host: str, port: int, *, tls: tuple[Path, Path] | None = None,
                     task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; reports the bound port."""
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve

    from semq.settings.bounds import CONSOLE_MAX_HEADER

    cfg = HyperConfig()
    cfg.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    if tls is not None:
        cfg.certfile, cfg.keyfile = str(tls[0]), str(tls[1])
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("semq.edge.http")
    cfg.include_server_header = False
    cfg.graceful_timeout = 1.0
    cfg.alpn_protocols = ["http/1.1"]
    cfg.h11_max_incomplete_size = CONSOLE_MAX_HEADER
    cfg.keep_alive_timeout = EDGE_REQUEST_S

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, cfg, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(run)
        bound = int(binds[0].rpartition(":")[2])
        log.info("edge listener on %s://%s:%d/", "https" if tls else "http", host, bound)
        task_status.started(bound)
