"""Real ``semq`` processes on 127.0.0.1 for end-to-end tests. Every wait is
bounded; every process is killed at teardown."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from semq.cli import main as semq_main
from semq.settings.config import load_config, write_config
from semq.testing.faultproxy import FaultPlan, FaultProxy
from semq.testing.netports import free_port

__all__ = ["Cluster", "ThreadedFaultProxy", "free_port", "read_status", "set_config", "wait_until"]


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Proc:
    def __init__(self, name: str, args: list[str], log: Path, ready: str, timeout: float = 20,
                 module: list[str] | None = None, may_exit: bool = False) -> None:
        """``may_exit``: a process that may be done already once it said
        ``ready`` (one made to crash early)."""
        self.name = name
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.p = subprocess.Popen([sys.executable, "-m", *(module or ["semq"]), *args], stdout=log.open("ab"),
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        wait_until(lambda: ready in log.read_text(errors="replace") or self.p.poll() is not None,
                   timeout, f"{name} to start")
        if self.p.poll() is not None and not (may_exit and ready in log.read_text(errors="replace")):
            raise AssertionError(f"{name} exited {self.p.returncode}:\n{log.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
        return self.p.wait(timeout=20)


class _PgQuery:
    """The platform's PostgreSQL store, asked as the tests ask SQLite ones."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.c = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, args: Any = ()) -> Any:
        from semq.store.pg import translate_sql

        return self.c.execute(translate_sql(sql), args or None)

    def close(self) -> None:
        self.c.close()


class Cluster:
    """A platform and organizations in one temporary directory."""

    def __init__(self, root: Path, *, inquiry_interval: float = 0.5, security: bool = True,
                 store: str = "", platforms: int = 1) -> None:
        """``store``: the platform's PostgreSQL URL (else its SQLite file);
        ``platforms``: instances of the platform on it, each from its own
        copy of the platform's directory (P, P2, P3...), on its own port.
        Nodes get every instance's address."""
        self.root = root
        self.ports = [free_port() for _ in range(platforms)]
        self.port = self.ports[0]
        self.iq = str(inquiry_interval)
        self.security = security
        self.store = store
        self.procs: dict[str, Proc] = {}
        self.units: dict[str, int] = {}  # organization -> its node's units
        plain = [] if security else ["--no-security"]
        on = ["--store", store] if store else []
        assert semq_main(["platform", "init", "--dir", str(root / "P"), *plain, *on]) == 0
        for i in range(2, platforms + 1):
            shutil.copytree(root / "P", root / f"P{i}", ignore=shutil.ignore_patterns("events", "status.json"))

    def addresses(self, instance: int | None = None, prefer: int = 1) -> str:
        """The platform's addresses a node is given: every instance's
        (``prefer``'s first), or ``instance``'s only."""
        ports = self.ports[prefer - 1:] + self.ports[:prefer - 1]
        if instance is not None:
            ports = [self.ports[instance - 1]]
        return ",".join(f"127.0.0.1:{p}" for p in ports)

    def add_org(self, org: str, instance: int | None = None, prefer: int = 1, *, direct: Sequence[str] = (),
                units: int = 1) -> Path:
        """An organization whose node knows every instance of the platform
        (tried from ``prefer`` on), or ``instance`` only. ``direct``: its
        direct-link options (``--listen 127.0.0.1:0``, ``--direct only``...);
        ``units``: its node's units (semq.umxt_protocol.units)."""
        d = self.root / org
        self.units[org] = units
        if units > 1:
            direct = (*direct, "--units", str(units))
        if not self.security:
            assert semq_main(["node", "init", "--dir", str(d), "--org", org, "--platform",
                              self.addresses(instance, prefer), "--no-security", *direct]) == 0
            assert semq_main(["platform", "register", "--dir", str(self.root / "P"), org,
                              *(["--units", str(units)] if units > 1 else [])]) == 0
            return d
        # Secure by default: keys, certificate issued by the platform's CA.
        assert semq_main(["node", "init", "--dir", str(d), "--org", org, "--platform",
                          self.addresses(instance, prefer), "--enroll-from", str(self.root / "P"), *direct]) == 0
        return d

    def start_platform(self, plan: Path | None = None, instance: int = 1) -> Proc:
        """The platform (its ``instance``: 1, 2...); with ``plan``, the dishonest relay of
        semq.testing.dishonest (the same platform, cheating as the plan says)."""
        name = "P" if instance == 1 else f"P{instance}"
        p = Proc("platform", ["platform", "run", "--dir", str(self.root / name), "--listen",
                              f"127.0.0.1:{self.ports[instance - 1]}", "--inquiry-interval", self.iq],
                 self.root / f"platform{'' if instance == 1 else instance}.log", "listening on",
                 module=["semq.testing.dishonest", "--plan", str(plan)] if plan else None)
        self.procs[name] = p
        return p

    def start_node(self, org: str, *extra: str) -> Proc:
        """A node (every unit of it: the supervisor says so once all run)."""
        ready = "running as" if self.units.get(org, 1) > 1 else "running"
        p = Proc(org, ["node", "run", "--dir", str(self.root / org), "--inquiry-interval", self.iq, *extra],
                 self.root / f"{org}.log", ready, timeout=40 if ready == "running as" else 20)
        self.procs[org] = p
        return p

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        return self.procs.pop(name).kill(sig)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def unit_dir(self, org: str, unit: int) -> Path:
        """Where unit ``unit`` of ``org``'s node keeps its store and status."""
        return self.root / org if unit == 1 else self.root / org / f"unit-{unit}"

    def db(self, name: str, unit: int = 1) -> Any:
        if name == "P" and self.store:
            return _PgQuery(self.store)
        if name == "P":
            return sqlite3.connect(str(self.root / name / "platform.sqlite"), timeout=10)
        return sqlite3.connect(str(self.unit_dir(name, unit) / "node.sqlite"), timeout=10)

    def q(self, name: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` on the platform, or on every unit store of a node."""
        rows: list[tuple[Any, ...]] = []
        for unit in range(1, (1 if name == "P" else self.units.get(name, 1)) + 1):
            c = self.db(name, unit)
            try:
                rows += c.execute(sql, args).fetchall()
            finally:
                c.close()
        return rows

    def count(self, name: str, sql: str, *args: Any) -> int:
        """A count(*) on the platform, or summed over a node's unit stores."""
        return sum(int(r[0]) for r in self.q(name, sql, *args))

    def inbox(self, org: str) -> dict[str, bytes]:
        """Every unit's inbox, by ``ORIGIN/RECORD`` (``ORIGIN/UNIT/RECORD``
        from an origin's unit > 1); a document twice fails."""
        rows = self.q(org, "SELECT origin_id, semq_id, record_id, app_data FROM inbox")
        out: dict[str, bytes] = {}
        for o, s, r, d in rows:
            key = doc_key(o, s, r)
            assert key not in out, f"{key} delivered twice to {org}"
            out[key] = d
        return out

    def settled(self, orgs: list[str]) -> bool:
        """Every pending-send and pending-ack row gone, nothing stored."""
        return (all(self.count(o, "SELECT count(*) FROM outbox") == 0 and
                    self.count(o, "SELECT count(*) FROM inbound") == 0 for o in orgs)
                and self.count("P", "SELECT count(*) FROM stored") == 0)


def doc_key(origin: str, unit: int, record: int) -> str:
    """How Cluster.inbox names a document: ``ORIGIN/RECORD`` (or
    ``ORIGIN/UNIT/RECORD`` from a unit other than 1)."""
    return f"{origin}/{record}" if unit == 1 else f"{origin}/{unit}/{record}"


# ---------------------------------------------------------------- direct links (tests/e2e/test_direct.py)


def read_status(directory: Path) -> dict[str, Any]:
    """A daemon's status.json (rewritten every second); {} while it is
    missing or caught half-written."""
    try:
        return dict(json.loads((Path(directory) / "status.json").read_text("utf-8")))
    except (OSError, ValueError):
        return {}


def set_config(directory: Path, **values: Any) -> None:
    """Change keys of a data directory's semq.toml (checked by their rules)."""
    write_config(dataclasses.replace(load_config(directory), **values))


class ThreadedFaultProxy:
    """A semq.testing.faultproxy.FaultProxy on 127.0.0.1 (a free port) in
    front of ``upstream_port``, run by a trio loop of its own in a thread,
    so a synchronous test drives it: ``call(FaultProxy.cut_all)``. Closed
    by ``close`` (bounded)."""

    def __init__(self, upstream_port: int, plan: FaultPlan | None = None) -> None:
        self.proxy = FaultProxy(plan)
        self._token: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

        async def serve() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.proxy.serve, "127.0.0.1", 0, "127.0.0.1", upstream_port)
                self._ready.set()

        def run() -> None:
            try:
                trio.run(serve)
            except BaseException as e:  # reported by __init__ or close
                self._error = e
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=run, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self.proxy.port is None:
            raise AssertionError(f"the fault proxy did not start: {self._error!r}")
        self.port: int = self.proxy.port

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` in the proxy's trio thread (its commands and
        ``statistics`` must run there)."""
        return trio.from_thread.run_sync(functools.partial(fn, *args, **kw), trio_token=self._token)

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self.call(self.proxy.close)
            except RuntimeError:  # (its loop already ended)
                pass
            self._thread.join(10)
        assert not self._thread.is_alive(), "the fault proxy did not stop"
