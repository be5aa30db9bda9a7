"""Serving the web console inside the running daemon: Hypercorn's trio
worker (``hypercorn.trio.serve``) in the daemon's own nursery, so the
console's handlers run on the daemon's trio thread and reach its store
through the same gate as the admin socket. HTTPS only (semq.web.certs).

``serve_console`` follows trio's ``serve_*`` convention: started with
``nursery.start``, it reports the bound port (``HOST:0`` picks a free one)
and serves until its nursery is cancelled.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio

from semq.ops.admin import Handler
from semq.ops.runtime import parse_web_address
from semq.settings.bounds import CONSOLE_HANDSHAKE_S, CONSOLE_IDLE_S, CONSOLE_MAX_HEADER

from .app import Console, make_app
from .audit import AuditLog
from .backend import ConsoleBackend
from .certs import ConsoleTLS, console_tls
from .users import UserStore

__all__ = ["console_for", "parse_web_address", "serve_console", "serve_daemon_console"]

log = logging.getLogger("semq.web")


def console_for(role: str, directory: Path, handlers: dict[str, Handler], *, ident: str, config: Any = None,
                host: str = "127.0.0.1", waiters: Any = None) -> tuple[Console, ConsoleTLS]:
    """The console of a running daemon (its handlers called in-process) and
    the certificate it serves HTTPS with. A node of several units: this is
    unit 1's, whose search covers every unit's history and whose actions go
    to the unit that holds the row."""
    directory = Path(directory)
    unit_dirs = [directory]
    unit = 1
    if role == "node" and config is not None:
        unit_dirs = list(config.unit_dirs)
        unit = int(config.unit)
    tls = console_tls(role, directory, host)
    extra = [("web console", tls.certfile)] if tls.source == "console" else []
    backend = ConsoleBackend(role=role, ident=ident, directory=directory, handlers=handlers, unit_dirs=unit_dirs,
                             unit=unit, config=config, extra_certs=extra)
    api = None
    if role == "node" and config is not None:  # the HTTP API for applications (semq.web.api)
        from .api import ApiService

        api = ApiService(config, handlers=handlers, waiters=waiters)
    console = Console(backend=backend, users=UserStore(directory), audit=AuditLog(directory),
                      tls_note=f"{tls.source} certificate, SHA-256 {tls.fingerprint}", api=api)
    if not console.users.list():
        log.warning("web console: no accounts yet; add one with 'semq console user add NAME --role operator"
                    " --dir %s'", directory)
    return console, tls


async def serve_console(console: Console, tls: ConsoleTLS, host: str, port: int, *,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``console`` over HTTPS on ``host:port`` until cancelled;
    reports the bound port. Raises OSError when it cannot be bound."""
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve

    cfg = HyperConfig()
    cfg.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    cfg.certfile = str(tls.certfile)
    cfg.keyfile = str(tls.keyfile)
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("semq.web.http")
    cfg.include_server_header = False
    cfg.graceful_timeout = 1.0
    # Bounds on a hostile client (semq.settings.bounds, "web console"). HTTP/1.1 only:
    # the pages are few and small, and HTTP/2 would bring a second parser
    # with its own limits (100 streams per connection, 64 KiB of headers).
    cfg.alpn_protocols = ["http/1.1"]
    cfg.h11_max_incomplete_size = CONSOLE_MAX_HEADER  # a longer head: 431 and the connection closed
    cfg.ssl_handshake_timeout = CONSOLE_HANDSHAKE_S  # (Hypercorn's default is 60 s)
    # The idle timer runs from the connection's start (and after each
    # response) until a request's head is complete, so it also bounds a
    # head sent slowly; the body of a form is bounded by CONSOLE_FORM_S.
    cfg.keep_alive_timeout = CONSOLE_IDLE_S
    # Left as they are, on purpose: read_timeout (it would also cut a slow
    # response, since the client says nothing while it waits), max_requests
    # (it stops the whole server after that many requests: the console
    # would vanish from a running daemon), backlog (the kernel's queue of
    # connections not yet accepted; trio accepts at once, so it bounds
    # nothing here) and keep_alive_max_requests (a client simply connects
    # again; Hypercorn offers no bound on connections in total).
    app = make_app(console)

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, cfg, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        if console.api is not None:
            await console.api.start()
            nursery.start_soon(console.api.sweep_forever)
        binds: list[str] = await nursery.start(run)
        bound = int(binds[0].rpartition(":")[2])
        log.info("web console on https://%s:%d/ (%s)", host, bound, console.tls_note)
        task_status.started(bound)


async def serve_daemon_console(role: str, directory: Path, handlers: dict[str, Handler], host: str, port: int, *,
                               ident: str, config: Any = None, waiters: Any = None,
                               task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """The console of a running daemon (``console_for``), served on
    ``host:port`` until cancelled; reports the bound port. What the command
    hands semq.ops.runtime.OpsRuntime as its ``console``
    (semq.ops.runtime.ConsoleFactory). Raises what ``console_for`` and
    ``serve_console`` raise, before reporting."""
    console, tls = console_for(role, directory, handlers, ident=ident, config=config, host=host, waiters=waiters)
    await serve_console(console, tls, host, port, task_status=task_status)
