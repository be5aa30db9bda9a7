from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._procs import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Platform and nodes with security on (mutual TLS, E2E), as deployed."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def plain_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Security off (plain TCP): for speaking raw UMX-T bytes to the platform."""
    c = Cluster(tmp_path, security=False)
    try:
        yield c
    finally:
        c.stop_all()


class NodeClock:
    """The clock of the node core (``semq.node.batch.now_ms``), in ms, moved by the test."""

    def __init__(self, t: int) -> None:
        self.t = t


@pytest.fixture
def node_clock(monkeypatch: pytest.MonkeyPatch) -> NodeClock:
    """The node core reads this clock instead of the real one (starts at 1,000,000 ms)."""
    import semq.node.batch as core_mod

    clock = NodeClock(1_000_000)
    monkeypatch.setattr(core_mod, "now_ms", lambda: clock.t)
    return clock


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A PostgreSQL server for the session: the one at SEMQ_TEST_PG (a URL)
    when set (then None here), else a throwaway cluster of our own (initdb
    in a temporary directory outside pytest's, whose root pytest keeps
    private to root while the server runs as the postgres user; a free
    port of 127.0.0.1), stopped and removed at the end."""
    import os

    from semq.testing.pgserver import ENV_URL, throwaway_pg

    if os.environ.get(ENV_URL):
        yield None
        return
    with throwaway_pg() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Any) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped after the test."""
    from semq.testing.pgserver import pg_database

    with pg_database(pg_server) as url:
        yield url
