"""Everything operational a running daemon starts, in one object: the admin
console, drain/stop, SIGHUP reload, and (with ``--metrics``) the Prometheus
endpoint, the store poller and the event-loop lag probe.

``semq ... run`` uses it like this (see docs/operations.md, "Wiring")::

    ops = OpsRuntime("node", cfg.directory, core, ops_options(args),  # before the daemon runs
                     console=serve_daemon_console)  # semq.web.server's, served with --web
    ...
    await nursery.start(daemon.run)
    await ops.start(nursery, daemon)        # admin socket, metrics, SIGHUP, drain supervisor
    ...
    await ops.drain.wait_stop()             # alongside the SIGTERM/SIGINT receiver
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from ._paths import admin_socket_path
from .admin import AdminError, DrainControl, Handler, admin_request, serve_admin
from .handlers import (
    DEFAULT_STUCK_AFTER,
    node_busy,
    node_handlers,
    platform_busy,
    platform_handlers,
)

__all__ = ["ConsoleFactory", "OpsOptions", "OpsRuntime", "add_run_options", "live_status", "ops_options",
           "parse_web_address", "start_history_indexer", "stop_history_indexer"]

log = logging.getLogger("semq.ops")


@dataclass(frozen=True, kw_only=True)
class OpsOptions:
    admin: bool = True  # serve <dir>/admin.sock
    metrics: str | None = None  # HOST:PORT of the Prometheus endpoint; None = off (the default)
    metrics_interval: float = 15.0  # s between store polls for the gauges
    stuck_after: float = DEFAULT_STUCK_AFTER  # s without end-to-end confirmation = stuck
    drain_timeout: float = 60.0  # s a drain waits for in-flight work before it stops anyway
    sighup: bool = True  # SIGHUP reloads (main thread only)
    lag_interval: float = 0.5  # s between event-loop lag probes
    web: str | None = None  # HOST:PORT of the web console (HTTPS; semq.web); None = off (the default)


class ConsoleFactory(Protocol):
    """Serves the web console of a running daemon beside its admin socket,
    calling the same ``handlers`` in-process: started with ``nursery.start``,
    it reports the bound port and serves until cancelled (trio's
    ``serve_*``). The console (semq.web) sits above ops, whose handlers it
    calls, so ops never imports it: the command that starts the daemon hands
    OpsRuntime this factory (semq.web.server.serve_daemon_console)."""

    async def __call__(self, role: str, directory: Path, handlers: dict[str, Handler], host: str, port: int, *,
                       ident: str, config: Any = None, waiters: Any = None,
                       task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None: ...


def parse_web_address(text: str) -> tuple[str, int]:
    """``--web HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 = any free port).
    Raises ValueError naming the text."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--web {text!r} is not HOST:PORT (e.g. 127.0.0.1:8443)")
    return host, int(port)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The operational options of ``semq node run`` / ``semq platform run``."""
    g = parser.add_argument_group("operations")
    g.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (off by default)")
    g.add_argument("--web", metavar="HOST:PORT",
                   help="serve the web console on https://HOST:PORT/ (off by default; port 0 = any free port;"
                        " a node of several units: unit 1 serves it)")
    g.add_argument("--no-admin", action="store_true", help="do not serve the admin socket <dir>/admin.sock")
    g.add_argument("--drain-timeout", type=float, default=60.0, metavar="S",
                   help="a drain waits this long for in-flight work (0.1..86400, default 60)")
    g.add_argument("--stuck-after", type=float, default=DEFAULT_STUCK_AFTER, metavar="S",
                   help="seconds without end-to-end confirmation that count as stuck (1..31536000, default 3600)")
    g.add_argument("--log-format", choices=["text", "json"], default=None,
                   help="structured logs: key=value (text) or JSON lines; default: the classic format")
    g.add_argument("--log-file", metavar="FILE", help="also log to FILE (0600; reopened after logrotate)")
    g.add_argument("--log-level", default=None, metavar="LEVEL", help="DEBUG, INFO (default), WARNING, ERROR")


def ops_options(args: argparse.Namespace) -> OpsOptions:
    """OpsOptions from parsed ``add_run_options`` arguments (missing ones
    take the defaults). Also configures logging when --log-format,
    --log-file or --log-level was given."""
    fmt, file, level = (getattr(args, n, None) for n in ("log_format", "log_file", "log_level"))
    if fmt or file or level:
        from .logs import configure_logging

        configure_logging(level or "INFO", fmt or "text", Path(file) if file else None, exclusive=True)
    metrics = getattr(args, "metrics", None)
    if metrics:
        from .metrics import parse_metrics_address

        parse_metrics_address(metrics)  # a typo is the user's mistake, before anything starts
    web = getattr(args, "web", None)
    if web:
        parse_web_address(web)  # a typo is the user's mistake, before anything starts
    return OpsOptions(admin=not getattr(args, "no_admin", False), metrics=metrics, web=web,
                      drain_timeout=getattr(args, "drain_timeout", 60.0) or 60.0,
                      stuck_after=getattr(args, "stuck_after", DEFAULT_STUCK_AFTER) or DEFAULT_STUCK_AFTER)


class OpsRuntime:
    """Create before the daemon starts (it instruments the core's event log
    when metrics are on), ``start`` once the daemon runs. ``console`` serves
    the web console when the options ask for one (``--web``)."""

    def __init__(self, role: str, directory: Path, core: Any, options: OpsOptions | None = None, *,
                 admin_dir: Path | None = None, user_socket: Path | None = None, config: Any = None,
                 history_days: int = 0, console: ConsoleFactory | None = None) -> None:
        if role not in ("node", "platform"):
            raise ValueError(f"role {role!r} is not node or platform")
        self.role = role
        self.directory = Path(directory)
        # Where the admin socket is: the data directory, or a unit's (semq.umxt_protocol.units).
        self.admin_dir = Path(admin_dir) if admin_dir is not None else self.directory
        self.core = core
        self.options = options or OpsOptions()
        self.console = console
        self.drain = DrainControl(timeout=self.options.drain_timeout)
        self.metrics: Any = None
        self.waiters: Any = None  # a node's semq.ops.waiters.InboxWaiters, once started
        self.admin_path: Path | None = None
        # A node's user socket (semq.ops.usersock): where, and the node's configuration.
        self.user_socket = user_socket
        self.config = config
        self.user_path: Path | None = None
        self.metrics_port: int | None = None
        self.web_port: int | None = None
        # The delivery history (semq.tracking.history), beside the store: indexed
        # from the event log files (every unit's and the applications') by
        # a process of its own at idle priority, started by unit 1 alone.
        self.history: Any = None  # the indexer's Popen, once started
        self.history_days = history_days
        log_ = getattr(core, "log", None)
        self.events_dir: Path | None = log_.directory if log_ is not None else None
        if history_days <= 0 or self.admin_dir != self.directory:
            self.events_dir = None
        if self.options.metrics:
            from .metrics import Metrics, instrument_core

            self.metrics = Metrics(role, core.me.node_id)
            instrument_core(core, self.metrics)

    async def start(self, nursery: trio.Nursery, daemon: Any, *,
                    reload: Callable[[], Any] | None = None) -> None:
        """Start the operational tasks in ``nursery`` (they run until it is
        cancelled). Sets ``daemon.drain`` so the daemon can check
        ``drain.requested``. ``reload`` defaults to semq.ops.reload's
        reloader for the role. Raises OSError when the admin socket or the
        metrics port cannot be bound (another daemon on this directory)."""
        from .reload import node_reloader, platform_reloader

        daemon.drain = self.drain
        core = self.core
        if self.events_dir is not None:
            self.history = start_history_indexer(self.events_dir, self.directory, self.history_days)
        if reload is None:
            reload = (node_reloader(daemon, core, self.directory) if self.role == "node"
                      else platform_reloader(daemon, core, self.directory))
        busy = node_busy if self.role == "node" else platform_busy
        if self.role == "node":
            # Clients waiting for documents (wait_inbox), woken by the daemon's commits.
            from semq.settings.bounds import API_FOLLOWS, USER_MAX_CONNECTIONS

            from .waiters import ADMIN_WAITS, InboxWaiters

            # Waits hold connections: at most half of each socket's (commands still get in).
            user_max = getattr(self.config, "user_socket_max_connections", None) or USER_MAX_CONNECTIONS
            self.waiters = InboxWaiters({"admin": ADMIN_WAITS, "user": max(1, user_max // 2),
                                         "api": API_FOLLOWS})  # (the HTTP API's follows, semq.web.api)
            daemon.inbox_signal = self.waiters
            handlers = node_handlers(daemon, core, reload=reload, drain=self.drain, metrics=self.metrics,
                                     stuck_after=self.options.stuck_after, waiters=self.waiters)
        else:
            handlers = platform_handlers(daemon, core, reload=reload, drain=self.drain, metrics=self.metrics,
                                         stuck_after=self.options.stuck_after)
        if self.options.admin:
            self.admin_path = await nursery.start(serve_admin, admin_socket_path(self.admin_dir), handlers)
        if self.user_socket is not None and self.config is not None:
            from .usersock import serve_user_socket

            self.user_socket.parent.mkdir(parents=True, exist_ok=True)
            self.user_path = await nursery.start(serve_user_socket, self.user_socket, self.config, self.waiters)
        if self.metrics is not None and self.options.metrics:
            from .metrics import parse_metrics_address, poll_store, probe_loop_lag, serve_metrics

            host, port = parse_metrics_address(self.options.metrics)
            self.metrics_port = await nursery.start(serve_metrics, host, port, self.metrics)
            nursery.start_soon(probe_loop_lag, self.metrics)
            nursery.start_soon(lambda: poll_store(self.metrics, daemon, core, interval=self.options.metrics_interval,
                                                  stuck_after=self.options.stuck_after))
        if self.options.web and (self.config is None or getattr(self.config, "unit", 1) == 1):
            # The web console: in this nursery, on this trio thread, calling
            # the same handlers in-process. Unit 1 serves it for every unit.
            if self.console is None:
                raise ValueError(f"--web {self.options.web}: no web console was handed to OpsRuntime")
            host, port = parse_web_address(self.options.web)
            self.web_port = await nursery.start(functools.partial(
                self.console, self.role, self.directory, handlers, host, port, ident=core.me.node_id,
                config=self.config if self.role == "node" else None, waiters=self.waiters))
        if self.options.sighup:
            from .service import reload_on_sighup

            await nursery.start(reload_on_sighup, reload)
        nursery.start_soon(lambda: self.drain.supervise(lambda: busy(daemon)))

    def close(self) -> None:
        """After the daemon stopped: stop the history's indexer (it goes on
        where it stopped at the next start)."""
        if self.history is not None:
            stop_history_indexer(self.history)
            self.history = None

    def status(self) -> dict[str, Any]:
        """For status.json: where the admin console, the web console and the metrics are."""
        return {"admin": str(self.admin_path) if self.admin_path else None,
                "user_socket": str(self.user_path) if self.user_path else None,
                "metrics": (f"{self.options.metrics.rsplit(':', 1)[0]}:{self.metrics_port}"
                            if self.options.metrics and self.metrics_port else None),
                "web": (f"{self.options.web.rsplit(':', 1)[0]}:{self.web_port}"
                        if self.options.web and self.web_port else None),
                "draining": self.drain.requested}


def start_history_indexer(events_dir: Path, directory: Path, days: int) -> subprocess.Popen[bytes] | None:
    """``python -m semq.tracking.history`` for a daemon's data directory: it indexes
    the event logs into ``history.sqlite`` at idle priority and stops when
    the daemon is gone (also after a SIGKILL). None when it cannot start
    (said once; the daemon runs without a history)."""
    from semq.tracking.history import HISTORY_FILE

    cmd = [sys.executable, "-m", "semq.tracking.history", "--events", str(events_dir), "--db",
           str(directory / HISTORY_FILE), "--days", str(days), "--parent", str(os.getpid())]
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=False)
    except OSError as e:
        log.warning("the delivery history is not kept: its indexer did not start: %s", e)
        return None


def stop_history_indexer(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def live_status(directory: Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The running daemon's ``status`` over the admin socket, or None when
    no daemon answers there (``semq status`` then reads the store)."""
    try:
        resp = admin_request(admin_socket_path(directory), "status", timeout=timeout)
    except AdminError:
        return None
    return resp.get("result") if resp.get("ok") else None
