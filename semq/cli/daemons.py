"""Running a daemon in the foreground (``semq platform run``, ``semq node
run``): the checks before it starts (its addresses free, the operational
options), the trio main with its signals, status file and operations
(semq.ops.runtime), the collector tuned once it runs."""

from __future__ import annotations

import argparse
import errno
import gc
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from semq.cli._common import UsageError, require_port
from semq.settings.config import Config, check_option

__all__ = ["GC_THRESHOLDS", "AddressInUse", "check_free", "check_ops_addresses", "inquiry_interval_of",
           "raise_fd_limit", "run_daemon", "serve_web_console", "tune_gc", "write_status"]


def write_status(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, owner-only (0600) like the
    rest of a data directory (it names the platform, partners and ports):
    written to a 0600 temporary file, then renamed over it, so a reader
    never sees half of it and it is never readable by others. Not synced:
    it is rewritten every second and means nothing after a crash."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # (a .tmp left by an older version may have been 0644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def run_daemon(cfg: Config, make: Callable[[], Any], status: Callable[[Any], dict[str, Any]],
                ready: Callable[[Any], str], ops: Any = None) -> int:
    import trio

    async def amain() -> None:
        daemon = make()
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                result = await nursery.start(daemon.run)
                if ops is not None:  # admin socket, metrics, SIGHUP reload, drain (semq.ops)
                    await ops.start(nursery, daemon)
                tune_gc()
                print(ready(result), flush=True)

                async def report() -> None:
                    while True:
                        try:
                            write_status(cfg.status_path, {"pid": os.getpid(), "time_ms": int(time.time() * 1000),
                                                            **status(daemon), **(ops.status() if ops else {})})
                        except OSError as e:  # e.g. disk full: keep serving, say so
                            logging.getLogger("semq").warning("cannot write %s: %s", cfg.status_path, e)
                        await trio.sleep(1)

                nursery.start_soon(report)

                async def until_signal(scope: trio.CancelScope) -> None:
                    async for sig in signals:
                        logging.getLogger("semq").info("signal %d: stopping", sig)
                        break
                    scope.cancel()

                async with trio.open_nursery() as waiting:
                    waiting.start_soon(until_signal, waiting.cancel_scope)
                    if ops is not None:  # 'semq admin stop', or a drain that finished
                        await ops.drain.wait_stop()
                        waiting.cancel_scope.cancel()
                # Stop accepting; in-flight store calls finish (the gate's
                # threads are never abandoned), then exit 0.
                nursery.cancel_scope.cancel()
        cfg.status_path.unlink(missing_ok=True)

    try:
        trio.run(amain)
    except* OSError as eg:
        # e.g. the listen address is in use: one line, not a traceback.
        first = _first_leaf(eg)
        if first.errno == errno.EADDRINUSE:  # taken after check_free looked
            raise AddressInUse(f"an address this daemon is to listen on is in use ({first.strerror}); another"
                               f" instance may be running (semq status --dir {cfg.directory})") from None
        raise first from None
    return 0


async def serve_web_console(role: str, directory: Path, handlers: dict[str, Any], host: str, port: int, *,
                            ident: str, config: Any = None, waiters: Any = None,
                            task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """The web console OpsRuntime serves with ``--web`` (its ConsoleFactory:
    semq.web.server.serve_daemon_console), imported only when a daemon
    serves one: Starlette, Hypercorn and Jinja2 are heavy."""
    from semq.web.server import serve_daemon_console

    await serve_daemon_console(role, directory, handlers, host, port, ident=ident, config=config,
                               waiters=waiters, task_status=task_status)


def _first_leaf(eg: BaseExceptionGroup[OSError]) -> OSError:
    """The first exception of a (nested) exception group."""
    e: BaseException = eg
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    assert isinstance(e, OSError)
    return e


def inquiry_interval_of(args: argparse.Namespace, cfg: Config) -> float:
    """``--inquiry-interval``, checked like the configuration's key, else
    the configuration's; also checks ``--listen`` / ``--platform``."""
    for name in ("listen", "platform"):
        if getattr(args, name, None) is not None:
            check_option(name, getattr(args, name), f"--{name}")
    if args.inquiry_interval is None:
        return cfg.inquiry_interval
    return float(check_option("inquiry_interval", args.inquiry_interval, "--inquiry-interval"))


GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """For a daemon, once started: the ~40,000 objects of start-up (modules,
    classes, caches) leave the cyclic collector's sight (gc.freeze), and a
    young collection waits for 10,000 new container objects instead of 700.
    A document allocates a few dozen short-lived dicts and tuples, almost
    none in cycles; with the defaults a relay ran ~30 young collections per
    1,000 documents and a full one (8 ms, all of start-up again, the loop
    stopped meanwhile) every few thousand: ~5% of the cores' CPU
    (scripts/bench pipeline) and a latency spike each time.
    ``SEMQ_GC_DEFAULTS=1`` keeps Python's defaults (for comparisons)."""
    if os.environ.get("SEMQ_GC_DEFAULTS") == "1":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class AddressInUse(OSError):
    """An address a daemon is to listen on is taken (exit status 1)."""


def check_free(address: tuple[str, int], option: str, directory: Path) -> None:
    """Before a daemon starts: can ``address`` be listened on? Binds (and
    closes) a socket the way trio's listeners do, so a port held by another
    process is said in one line naming the address, before anything runs.
    Port 0 always can. Raises AddressInUse."""
    import socket

    host, port = address
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"{option} {host}:{port}: cannot resolve {host!r} ({e.strerror})") from None
    shown_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    for family, type_, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, type_, proto)
        except OSError:
            continue  # (an address family this machine lacks: trio skips it too)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(sockaddr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise AddressInUse(
                        f"cannot listen on {shown_address} ({option}): the address is in use; another instance"
                        f" may be running (semq status --dir {directory}), or another program holds the port"
                    ) from None
                if e.errno == errno.EADDRNOTAVAIL:
                    raise AddressInUse(f"cannot listen on {shown_address} ({option}): {host} is not an address"
                                       " of this machine") from None
                raise AddressInUse(f"cannot listen on {shown_address} ({option}): {e.strerror}") from None


def check_ops_addresses(args: argparse.Namespace, directory: Path, *, web: bool = True, units: int = 1) -> None:
    """The operational options of a daemon, before it starts: ``--metrics``
    and ``--web`` free (for a node of ``units`` units, the metrics port of
    each: the given one + K - 1), the durations in range."""
    from semq.ops.display import check_count
    from semq.ops.metrics import parse_metrics_address
    from semq.web import parse_web_address

    check_count(getattr(args, "drain_timeout", None), "--drain-timeout", 0.1, 86400.0)
    check_count(getattr(args, "stuck_after", None), "--stuck-after", 1.0, 86400.0 * 365)
    if getattr(args, "metrics", None):
        host, port = parse_metrics_address(args.metrics)
        for k in range(units if port else 1):
            check_free((host, port + k), "--metrics" if k == 0 else f"--metrics of unit {k + 1}", directory)
    if web and getattr(args, "web", None):
        require_port(args.web, "--web")
        check_free(parse_web_address(args.web), "--web", directory)


def raise_fd_limit() -> None:
    """One descriptor per connected organization: lift the soft limit on open
    files to the hard one (often 1024 -> 1M), so a relay with thousands of
    nodes is not refused by a default meant for desktop programs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            logging.getLogger("semq.platform").warning(
                "cannot raise the open-file limit from %s to %s: %s", soft, hard, e)
