"""A token guesser against a real node's HTTP API: each wrong token is a
401, and after ``API_AUTH_FAILURES`` of them in a minute its address is
answered 429 without a look at its tokens (its own node: the lock would
hold the other tests' address too)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semq.settings.bounds import API_AUTH_FAILURES
from semq.web.api import PREFIX
from tests._procs import Cluster, read_status, wait_until
from tests.web._api import _token

pytestmark = pytest.mark.e2e

A = "10001"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext, str]]:
    c = Cluster(tmp_path, inquiry_interval=0.5)
    try:
        c.add_org(A)
        token = _token(tmp_path / A, "alice")
        c.start_platform()
        c.start_node(A, "--web", "127.0.0.1:0")
        url = "https://" + wait_until(lambda: read_status(tmp_path / A).get("web"), 30, "A's console")
        yield url, ssl.create_default_context(cafile=str(tmp_path / A / "console" / "console.pem")), token
    finally:
        c.stop_all()


def test_a_token_guesser_is_held_off_by_address(node: tuple[str, ssl.SSLContext, str]) -> None:
    url, ctx, token = node
    with httpx.Client(base_url=url, verify=ctx, timeout=30) as h:
        assert h.get(f"{PREFIX}/whoami", headers={"authorization": f"Bearer {token}"}).status_code == 200
        for i in range(API_AUTH_FAILURES):
            r = h.get(f"{PREFIX}/inbox", headers={"authorization": f"Bearer semq_guess{i}"})
            assert r.status_code == 401, (i, r.text)
        r = h.get(f"{PREFIX}/inbox", headers={"authorization": "Bearer semq_guess-more"})
        assert r.status_code == 429 and r.json()["limit"] == API_AUTH_FAILURES, r.text
        assert "127.0.0.1" in r.json()["error"] and "minute" in r.json()["error"]
        # Unchecked: the right token from that address waits its minute too; the description stays open.
        assert h.get(f"{PREFIX}/whoami", headers={"authorization": f"Bearer {token}"}).status_code == 429
        assert h.get(f"{PREFIX}/openapi.json").status_code == 200
