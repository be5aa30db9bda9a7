"""A throwaway PostgreSQL server for tests, benchmarks and chaos runs: a
cluster made by ``initdb`` in a temporary directory, listening on a free
port of 127.0.0.1 only, trust authentication, stopped and removed at the
end. Or, when ``SEMQ_TEST_PG`` holds a URL, that server (each user of it
gets a database of its own, dropped at the end).

Why not pytest-postgresql: the chaos run and ``scripts/bench`` need the same
server outside pytest, and the chaos run restarts it mid-stream
(``restart``), which is two pg_ctl calls here."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from .netports import free_port

__all__ = ["PgServer", "find_pg_bin", "pg_database", "throwaway_pg"]

ENV_URL: Final = "SEMQ_TEST_PG"
_START_TIMEOUT_S: Final = 60


def find_pg_bin() -> Path | None:
    """The directory of the installed server binaries (initdb, pg_ctl): on
    PATH, or Debian's /usr/lib/postgresql/<version>/bin (newest first)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return Path(found[-1]).parent if found else None


class PgServer:
    """One PostgreSQL cluster of our own: ``start``, ``stop``, ``restart``,
    ``url(db)``. The data directory is kept across restarts."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        bindir = find_pg_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found:"
                               " install Debian's postgresql package (scripts/test does)")
        self.bin = bindir
        self.root = Path(root)
        self.data = self.root / "data"
        self.port = port or free_port()
        self.log = self.root / "server.log"
        self._user_args: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: run as a user that exists
            self._user_args = ["runuser", "-u", "postgres", "--"] if _has_user("postgres") else []
        self.user = "postgres"

    def _run(self, *args: str) -> None:
        r = subprocess.run([*self._user_args, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=_START_TIMEOUT_S)
        if r.returncode:
            raise RuntimeError(f"{Path(args[0]).name} {args[-1]} failed (exit {r.returncode}): {r.stderr.strip()}")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user_args:
            shutil.chown(self.root, "postgres")
            os.chmod(self.root.parent, os.stat(self.root.parent).st_mode | 0o011)  # (a private temporary one)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                  "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            # What SEMQ's durability rests on stays as in production
            # (fsync and synchronous_commit on); only the footprint is small.
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                    "shared_buffers = 128MB\n")

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(_START_TIMEOUT_S), "start")

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        """Stop (fast: sessions are cut), stay down ``down_s``, start again."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def throwaway_pg(root: Path | None = None) -> Iterator[PgServer]:
    """A started PgServer, stopped and removed on exit."""
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="semq-pg-")
        root = Path(tmp)
    server = PgServer(Path(root) / "pg")
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def pg_database(server: PgServer | None = None) -> Iterator[str]:
    """The URL of a new, empty database: on ``server``, else on the server at
    ``SEMQ_TEST_PG``. Dropped on exit."""
    import psycopg

    base = server.url() if server is not None else os.environ[ENV_URL]
    name = f"semq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    head, _, _ = base.rpartition("/")
    try:
        yield f"{head}/{name}"
    finally:
        with contextlib.suppress(Exception), psycopg.connect(base, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
