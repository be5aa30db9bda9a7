"""The HTTP API of a node of two units (semq.umxt_protocol.units), real
processes on 127.0.0.1: unit 1 serves it for both; an inbox page counts and
lists both units' documents, and a follow wakes for a document either unit
commits and moves its cursor per unit, so none is skipped or given twice."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semq.node.api import NodeClient
from semq.web.api import PREFIX
from tests._procs import Cluster, read_status, wait_until
from tests.web._api import _token

pytestmark = pytest.mark.e2e

A, B = "10001", "20002"


@pytest.fixture
def two_units(tmp_path: Path) -> Iterator[tuple[Cluster, str, str]]:
    c = Cluster(tmp_path, inquiry_interval=0.5)
    try:
        c.add_org(A)
        c.add_org(B, units=2)
        token = _token(tmp_path / B, "bob")
        c.start_platform()
        c.start_node(A)
        c.start_node(B, "--web", "127.0.0.1:0")
        url = "https://" + wait_until(lambda: read_status(tmp_path / B).get("web"), 30, "B's console")
        yield c, url, token
    finally:
        c.stop_all()


def _send(c: Cluster, i: int) -> str:
    with NodeClient(c.root / A) as node:
        return str(node.send(f"{B}/bob", b"doc %d" % i, key=f"U{i}"))


def test_follow_on_a_node_of_two_units_gets_every_document_once(two_units: tuple[Cluster, str, str]) -> None:
    c, url, token = two_units
    ctx = ssl.create_default_context(cafile=str(c.root / B / "console" / "console.pem"))
    got: list[dict[str, object]] = []
    cursors: list[str] = []

    def follow() -> None:
        with httpx.Client(base_url=url, verify=ctx, headers={"authorization": f"Bearer {token}"},
                          timeout=60) as h:
            after = "0"
            while len(got) < 12:
                r = h.get(f"{PREFIX}/inbox/follow", params={"after": after, "timeout": 20, "limit": 3})
                assert r.status_code == 200, r.text
                got.extend(r.json()["documents"])
                after = r.json()["next"]
                cursors.append(after)

    t = threading.Thread(target=follow)
    t.start()
    sent = [_send(c, i) for i in range(12)]
    t.join(90)
    assert not t.is_alive()
    assert sorted(str(d["lk0"]) for d in got) == sorted(sent)  # each once
    assert {d["unit"] for d in got} == {1, 2}
    assert all(len(x.split(",")) == 2 for x in cursors)
    with httpx.Client(base_url=url, verify=ctx, headers={"authorization": f"Bearer {token}"}) as h:
        page = h.get(f"{PREFIX}/inbox", params={"limit": 5}).json()
        assert page["total"] == 12 and len(page["documents"]) == 5
        ids = []
        after_id = 0
        while True:
            p = h.get(f"{PREFIX}/inbox", params={"after": after_id, "limit": 5}).json()
            ids += [d["id"] for d in p["documents"]]
            if p["next"] is None:
                break
            after_id = p["next"]
        assert sorted(ids) == sorted(int(str(d["id"])) for d in got)
        one = got[-1]
        assert h.get(f"{PREFIX}/inbox/{one['id']}/content").content.startswith(b"doc ")
