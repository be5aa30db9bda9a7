"""A dishonest directory: the platform (or anyone able to change what it
answers) points an origin at the wrong listener. The origin checks the
listener's certificate against the target it meant to reach, refuses the
link, and its documents go through the platform, sealed, as before."""

from __future__ import annotations

import json
import re

import pytest

from semq.node.api import NodeClient
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77000"


def _status(c: Cluster, org: str) -> dict:  # type: ignore[type-arg]
    try:
        return json.loads((c.root / org / "status.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def test_an_origin_sent_to_another_organizations_listener_refuses_it(cluster: Cluster) -> None:
    cluster.add_org(A)
    cluster.add_org(C, direct=["--listen", "127.0.0.1:0"])
    cluster.start_platform()
    c_node = cluster.start_node(C)
    c_addr = re.search(r"direct links on (\S+)", c_node.log.read_text())
    assert c_addr is not None
    # B announces C's listener as its own: what a lying directory would say.
    cluster.add_org(B, direct=["--listen", "127.0.0.1:0", "--announce", c_addr.group(1)])
    cluster.start_node(B)
    cluster.start_node(A)
    with NodeClient(cluster.root / A) as node:
        for i in range(10):
            node.send(B, f"doc {i}".encode(), data_type="ORDER")
    wait_until(lambda: len(cluster.inbox(B)) == 10, 30, "10 documents in B's inbox (relayed)")
    why = wait_until(lambda: _status(cluster, A).get("direct", {}).get("waiting", {}).get(B, {}).get("why"), 30,
                     "A to say why it has no direct link to B")
    assert f"presented organization {C}'s certificate, not {B}'s" in why
    assert not _status(cluster, A).get("sent_direct")
    assert len(cluster.inbox(C)) == 0  # C never got a document, nor a link it could use
    assert f"direct link to {B} at {c_addr.group(1)} refused" in (cluster.root / f"{A}.log").read_text()
    wait_until(lambda: cluster.settled([A, B]), 30, "A's and B's tables cleaned up")
