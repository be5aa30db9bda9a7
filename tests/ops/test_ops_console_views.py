"""The admin commands behind the web console's Outbox, Organizations and
Instances pages (semq.ops.handlers), on real stores: a node's ``list`` by
record ids, a platform's ``organizations`` and ``instances``."""

from __future__ import annotations

import json
from pathlib import Path

from semq.ops.admin import DrainControl
from semq.ops.handlers import node_handlers, platform_handlers
from semq.umxt_protocol import Endpoint
from tests.ops.test_ops_handlers import (
    A,
    B,
    NodeStandIn,
    PlatformStandIn,
    SessionStandIn,
    make_node,
    platform_with_stored,
)


async def test_node_list_names_rows_by_id(tmp_path: Path) -> None:
    core = make_node(tmp_path)
    try:
        core.claim(2)  # ids 1, 2 -> SS_SENT
        h = node_handlers(NodeStandIn(), core, reload=lambda: None, drain=DrainControl())
        assert [r["id"] for r in (await h["list"]({"ids": [2, 4]}))["rows"]] == [2, 4]
        # with the other filters: every one holds
        assert [r["id"] for r in (await h["list"]({"ids": [2, 4], "state": "SS_SENT"}))["rows"]] == [2]
        assert (await h["list"]({"ids": [99]}))["count"] == 0
    finally:
        core.close()


async def test_platform_organizations_and_instances(tmp_path: Path) -> None:
    core = platform_with_stored(tmp_path)  # A's 4 documents stored for B (offline)
    d = PlatformStandIn()
    try:
        core.register(["30003"], units=3)
        core.revoke("30003")
        core.quota_bytes = 1 << 20
        d.sessions[Endpoint.org(A)] = SessionStandIn()
        d.sessions[Endpoint.org("30003:2")] = SessionStandIn()  # (a unit's route: its organization is online)
        h = platform_handlers(d, core, reload=lambda: None, drain=DrainControl())
        res = await h["organizations"]({})
        json.dumps(res)
        by = {r["org"]: r for r in res["rows"]}
        assert list(by) == sorted([A, B, "30003"]) and res["quota_bytes"] == 1 << 20 and not res["more"]
        assert by[A]["online"] and by[A]["instances"] == ["this"] and by[A]["stored"] == 0
        assert by[A]["stored_bytes"] > 0  # its documents, stored for B: what its quota counts
        assert not by[B]["online"] and by[B]["stored"] == 4 and by[B]["oldest_stored_ms"] > 0
        assert by[B]["stored_bytes"] == 0
        assert by["30003"]["revoked"] and by["30003"]["online"] and by["30003"]["units_granted"] == 3
        assert (await h["organizations"]({"limit": 2}))["more"]

        inst = await h["instances"]({})
        assert inst["store"] == "sqlite" and len(inst["rows"]) == 1
        one = inst["rows"][0]
        assert one["alive"] and one["this"] and one["address"] == "127.0.0.1:7410" and one["holds"] == 2
    finally:
        core.close()
