from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
