"""The admin commands against real node and platform cores in a temporary
directory, through the daemon's store gate (a stand-in daemon object with
the attributes the real daemons have)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon import NodeSettings
from semq.ops.admin import AdminCommandError, DrainControl
from semq.ops.handlers import node_busy, node_handlers, platform_busy, platform_handlers
from semq.platform.core import PlatformCore
from semq.settings.config import Address
from semq.store.gate import StoreGate
from semq.umxt_protocol import AppKey, Endpoint, FrameDecoder, SaveFwd

A, B = "10008", "56001"


class LinksStandIn:
    """What node_handlers uses of semq.node.daemon.DirectLinks."""

    def snapshot(self) -> dict[str, Any]:
        return {"policy": "prefer", "listening": "127.0.0.1:7443",
                "links": [{"peer": "56001", "direction": "out", "address": "127.0.0.1:7444", "state": "up",
                           "since_ms": 1, "sent": 5, "received": 2, "error": "", "in_flight": 1}],
                "waiting": {"56002": {"retry_in_s": 8.0, "why": "it does not listen for direct links"}}}


class NodeStandIn:
    """What node_handlers uses of semq.node.daemon.NodeDaemon."""

    def __init__(self) -> None:
        self.gate = StoreGate()
        self.connected = True
        self.s = NodeSettings(addresses=[Address("127.0.0.1", 7411), Address("127.0.0.1", 7412)])
        self.address: Address | None = self.s.addresses[1]
        self.sessions = 1
        self.in_flight = 0
        self.stats = {"sent": 0, "received": 0, "delivered": 0, "refused": 0}
        self.woken = 0
        self.links = LinksStandIn()

    def wake(self) -> None:
        self.woken += 1


@dataclass
class SessionStandIn:
    queued: int = 0
    in_flight: int = 0
    window: int = 4096
    wake_deliver: trio.Event = field(default_factory=trio.Event)


@dataclass
class SettingsStandIn:
    host: str = "127.0.0.1"


class PlatformStandIn:
    def __init__(self) -> None:
        self.gate = StoreGate()
        self.sessions: dict[Endpoint, SessionStandIn] = {}
        self.stats = {"connections": 0, "frames_in": 0, "refused": 0, "tls_refused": 0}
        self.port = 7410
        self.s = SettingsStandIn()


def sql(path: Path, q: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(str(path), timeout=10) as c:
        return c.execute(q, args).fetchall()


def events(directory: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(directory.glob("events-*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


def make_node(tmp: Path, n: int = 5) -> NodeCore:
    core = NodeCore(tmp / "node.sqlite", A, create=True, events_dir=tmp / "events")
    core.accept([NewDocument(target=B, app_data=b"secret order %d" % i,
                             app_key=AppKey(domain="trade", data_type="ORDER", subtype="PO", key=f"S{i}"),
                             save_fwd=SaveFwd.MUST_DELIVER) for i in range(n)])
    return core


async def test_node_status_list_show(tmp_path: Path) -> None:
    core = make_node(tmp_path)
    d = NodeStandIn()
    core.claim(2)  # ids 1, 2 -> SS_SENT
    d.in_flight = 2
    reloads: list[int] = []
    h = node_handlers(d, core, reload=lambda: reloads.append(1) or {"x": 1}, drain=DrainControl())
    try:
        st = await h["status"]({})
        assert st["role"] == "node" and st["org"] == A and st["connected"] is True
        # The address connected now, and every one the node may use.
        assert st["platform"] == "127.0.0.1:7412" and st["platforms"] == ["127.0.0.1:7411", "127.0.0.1:7412"]
        assert st["outbox"] == {"SS_INIT": 3, "SS_SENT": 2}
        assert {(q["target"], q["state"], q["count"]) for q in st["queues"]} == {(B, "SS_INIT", 3), (B, "SS_SENT", 2)}
        assert st["oldest_unconfirmed_ms"] and st["store_bytes"] > 0 and st["in_flight"] == 2
        json.dumps(st)

        rows = (await h["list"]({"state": "sent"}))["rows"]
        assert [r["id"] for r in rows] == [1, 2] and rows[0]["state"] == "SS_SENT"
        assert "app_data" not in rows[0] and rows[0]["size"] == len(b"secret order 0")
        assert (await h["list"]({"target": "nobody"}))["count"] == 0
        assert [r["id"] for r in (await h["list"]({"after": 3, "limit": 1}))["rows"]] == [4]
        with pytest.raises(AdminCommandError, match="not one of"):
            await h["list"]({"state": "SS_BOGUS"})

        one = await h["show"]({"lk0": f"{A}/1/1/3"})
        assert one["id"] == 3 and one["app_key"]["key"] == "S2" and one["receipt"] is None
        assert "secret" not in json.dumps(one)
        with pytest.raises(AdminCommandError, match="no outbox record 99"):
            await h["show"]({"id": 99})
        with pytest.raises(AdminCommandError, match="not of this node"):
            await h["show"]({"lk0": f"{B}/1/1/3"})

        assert await h["reload"]({}) == {"reloaded": True, "x": 1} and reloads == [1]
        assert (await h["ping"]({}))["role"] == "node"
    finally:
        core.close()


async def test_node_stuck_requeue_resend_purge(tmp_path: Path) -> None:
    core = make_node(tmp_path, 6)
    d = NodeStandIn()
    core.claim(3)  # 1..3 SS_SENT
    d.in_flight = 3
    old = int(time.time() * 1000) - 7200_000
    db = tmp_path / "node.sqlite"
    sql(db, "UPDATE outbox SET state=9, code=301, attempts=2 WHERE id=1")  # failed (NACK)
    sql(db, "UPDATE outbox SET state=3 WHERE id=2")  # stored at the platform
    sql(db, "UPDATE outbox SET created_ms=? WHERE id IN (2, 3, 4)", old)
    h = node_handlers(d, core, reload=lambda: None, drain=DrainControl())
    try:
        st = await h["stuck"]({})  # default 1 h
        assert st["count"] == 3
        assert st["by_place"] == {"stored_at_platform": 1, "sent_platform_ack_missing": 1, "at_origin_not_sent": 1}
        assert {r["id"]: r["place"] for r in st["rows"]} == {
            2: "stored_at_platform", 3: "sent_platform_ack_missing", 4: "at_origin_not_sent"}
        assert (await h["stuck"]({"older_than": 0}))["count"] == 5  # the failed one is not stuck

        # selections must name something
        with pytest.raises(AdminCommandError, match="all=true"):
            await h["purge"]({})
        # requeue: failed rows only
        r = await h["requeue"]({"ids": [1, 2]})
        assert r["changed"] == 1 and r["ids"] == [1] and r["skipped"] == [{"id": 2, "state": "SS_ACK"}]
        assert sql(db, "SELECT state, attempts, code FROM outbox WHERE id=1") == [(0, 0, 0)]
        # resend: unconfirmed rows back to SS_INIT; the window gets its credit
        r = await h["resend"]({"state": "SS_SENT,SS_ACK", "dry_run": True})
        assert r["dry_run"] and r["would"] == 2 and r["changed"] == 0
        assert sql(db, "SELECT state FROM outbox WHERE id IN (2,3) ORDER BY id") == [(3,), (1,)]
        r = await h["resend"]({"state": ["SS_SENT", "SS_ACK"]})
        assert r["changed"] == 2 and d.in_flight == 2 and d.woken >= 1
        assert sql(db, "SELECT count(*) FROM outbox WHERE state=0") == [(6,)]
        # purge by age
        r = await h["purge"]({"older_than": 3600})
        assert r["changed"] == 3 and r["ids"] == [2, 3, 4]
        assert sql(db, "SELECT id FROM outbox ORDER BY id") == [(1,), (5,), (6,)]
        ev = [e for e in events(tmp_path / "events") if e.get("detail", "").endswith("by the operator")]
        assert [(e["event"], e["lk0"]) for e in ev] == [
            ("resend", f"{A}/1/1/1"), ("resend", f"{A}/1/1/2"), ("resend", f"{A}/1/1/3"),
            ("dead", f"{A}/1/1/2"), ("dead", f"{A}/1/1/3"), ("dead", f"{A}/1/1/4")]
        assert all(e["role"] == "origin" and e["target"] == B for e in ev)
        sql(db, "UPDATE outbox SET state=9 WHERE id=5")
        r = await h["purge"]({"all": True})
        assert r["changed"] == 3 and sql(db, "SELECT count(*) FROM outbox") == [(0,)]
        last = [(e["event"], e["lk0"]) for e in events(tmp_path / "events")][-3:]
        assert last == [("dead", f"{A}/1/1/1"), ("cleaned", f"{A}/1/1/5"), ("dead", f"{A}/1/1/6")]
    finally:
        core.close()


async def test_node_inbound_and_drain_stop(tmp_path: Path) -> None:
    core = make_node(tmp_path, 1)
    d = NodeStandIn()
    db = tmp_path / "node.sqlite"
    old = int(time.time() * 1000) - 7200_000
    sql(db, "INSERT INTO inbound (origin_type, origin_id, semq_id, semq_db_id, record_id, p_ack, s_ack,"
            " received_ms, last_inquiry_ms) VALUES (1, ?, 1, 1, 77, 1, 0, ?, ?)", B, old, old)
    drain = DrainControl(timeout=5)
    h = node_handlers(d, core, reload=lambda: None, drain=drain)
    try:
        rows = (await h["list"]({"table": "inbound"}))["rows"]
        assert rows[0]["lk0"] == f"{B}/1/1/77" and rows[0]["s_ack"] == "AS_INIT"
        st = await h["stuck"]({})
        assert st["by_place"] == {"received_confirmation_missing": 1}
        assert (await h["drain"]({"reason": "maintenance"}))["requested"] is True
        assert drain.requested and not drain.stopping and drain.reason == "maintenance"
        d.in_flight = 4
        assert node_busy(d) == 4
        res = await h["stop"]({})
        assert not drain.stopping  # only after the answer is written
        res.action()
        assert drain.stopping and res.result["stopping"] is True
    finally:
        core.close()


def platform_with_stored(tmp: Path, n: int = 4) -> PlatformCore:
    node = make_node(tmp / "a", n)
    try:
        frames = node.claim(n).data
    finally:
        node.close()
    core = PlatformCore(tmp / "platform.sqlite", create=True, events_dir=tmp / "events")
    core.register([A, B])
    dec = FrameDecoder()
    dec.receive_data(b"".join(frames))
    out = core.handle(Endpoint.org(A), list(dec), {})  # B offline: stored
    assert not out.errors
    return core


async def test_platform_handlers(tmp_path: Path) -> None:
    core = platform_with_stored(tmp_path)
    d = PlatformStandIn()
    db = tmp_path / "platform.sqlite"
    try:
        _frames, n = core.claim_stored(Endpoint.org(B), 2)  # LK1 1, 2 delivered, not acked
        assert n == 2
        session = SessionStandIn(in_flight=2)
        d.sessions[Endpoint.org(B)] = session
        h = platform_handlers(d, core, reload=lambda: None, drain=DrainControl())
        st = await h["status"]({})
        assert st["connections"] == 1 and st["online"] == [B] and st["sessions"][0]["node"] == B
        assert st["listen"] == "127.0.0.1:7410"
        assert {n["node"]: n["online"] for n in st["nodes"]} == {A: False, B: True}
        assert {(q["target"], q["state"], q["count"]) for q in st["queues"]} == {(B, "SS_INIT", 2), (B, "SS_SENT", 2)}
        assert st["stored"][B]["stored"] == 4
        json.dumps(st)

        rows = (await h["list"]({"state": "SS_SENT"}))["rows"]
        assert [r["id"] for r in rows] == [1, 2] and rows[0]["lk0"] == f"{A}/1/1/1" and rows[0]["target_online"]
        one = await h["show"]({"id": 3})
        assert one["kind"] == "DATA" and one["state"] == "SS_INIT" and one["seen"]["action"] == "stored"
        by_lk0 = await h["show"]({"lk0": f"{A}/1/1/4"})
        assert [r["id"] for r in by_lk0["rows"]] == [4]
        with pytest.raises(AdminCommandError, match="no stored record 99"):
            await h["show"]({"id": 99})

        assert (await h["stuck"]({}))["count"] == 0
        st2 = await h["stuck"]({"older_than": 0})
        assert st2["count"] == 4 and st2["by_place_listed"] == {"delivered_not_acked": 2, "stored_waiting_delivery": 2}

        r = await h["requeue"]({"all": True})
        assert r["changed"] == 2 and r["ids"] == [1, 2] and len(r["skipped"]) == 2
        assert session.in_flight == 0 and session.wake_deliver.is_set()
        assert sql(db, "SELECT count(*) FROM stored WHERE state=0") == [(4,)]
        assert platform_busy(d) == 0

        r = await h["purge"]({"ids": [3]})
        assert r["changed"] == 1 and sql(db, "SELECT id FROM stored ORDER BY id") == [(1,), (2,), (4,)]
        dropped = [e for e in events(tmp_path / "events") if e["event"] == "dropped"]
        assert len(dropped) == 1 and dropped[0]["lk0"] == f"{A}/1/1/3" and dropped[0]["lk1"] == "1/1/3"
    finally:
        core.close()


async def test_async_reload_and_errors(tmp_path: Path) -> None:
    core = make_node(tmp_path, 1)
    d = NodeStandIn()

    async def reload() -> dict[str, Any]:
        await trio.sleep(0)
        raise ValueError("semq.toml: bad window")

    h = node_handlers(d, core, reload=reload, drain=DrainControl())
    try:
        with pytest.raises(ValueError, match="bad window"):
            await h["reload"]({})
        with pytest.raises(AdminCommandError, match="integer"):
            await h["show"]({"id": "x"})
        with pytest.raises(AdminCommandError, match="outside"):
            await h["list"]({"limit": 10**9})
        with pytest.raises(AdminCommandError, match="seconds"):
            await h["stuck"]({"older_than": "soon"})
    finally:
        core.close()


async def test_node_commands_see_the_states_held_in_memory(tmp_path: Path) -> None:
    """A forwarded row's SS_ACK_FWD waits in memory for up to a second
    (docs/design.md); the operator's commands write it first, so
    status, list and show say what the node knows."""
    from semq.umxt_protocol import (
        AckBatch,
        AckEntry,
        AckFlag,
        ForwardFlag,
        Frame,
        Kind,
        encode_frame,
    )

    core = make_node(tmp_path, 3)
    d = NodeStandIn()
    core.claim(3)
    p = Endpoint.platform()
    dec = FrameDecoder()
    dec.receive_data(encode_frame(Frame(
        kind=Kind.ACK_BATCH, source=p, target=Endpoint.org(A), origin=p,
        body=AckBatch(ack_kind=Kind.ACK_FWD, entries=tuple(
            AckEntry(1, 1, 0, 1, 1, i, int(AckFlag.PLATFORM), int(ForwardFlag.FORWARDED)) for i in (1, 2))))))
    core.handle(list(dec))
    assert core.deferred() and len(core.outbox.fwd) == 2 and len(core.outbox.sent) == 3 and not core.pending_acks.deferred
    assert sql(core.path, "SELECT state FROM outbox ORDER BY id") == [(0,), (0,), (0,)]  # SS_INIT on disk
    h = node_handlers(d, core, reload=lambda: {}, drain=DrainControl())
    try:
        rows = (await h["list"]({}))["rows"]
        assert [r["state"] for r in rows] == ["SS_ACK_FWD", "SS_ACK_FWD", "SS_SENT"]
        assert not core.deferred() and not core.outbox.sent and not core.outbox.fwd and not core.pending_acks.deferred
        st = await h["status"]({})
        assert st["outbox"] == {"SS_SENT": 1, "SS_ACK_FWD": 2}
        assert {(q["state"], q["count"]) for q in st["queues"]} == {("SS_SENT", 1), ("SS_ACK_FWD", 2)}
        assert (await h["show"]({"id": 1}))["state"] == "SS_ACK_FWD"
    finally:
        core.close()


@pytest.mark.parametrize("verb", ["requeue", "resend", "purge"])
async def test_node_commands_follow_the_operator_table_in_every_state(tmp_path: Path, verb: str) -> None:
    """One row in each SendState, the command asked of all of them by id:
    what changes, to what, and what is skipped is OPERATOR_TABLE's word."""
    from semq.node.engine import OPERATOR_TABLE, OperatorAction, SendState

    action = OperatorAction(verb)
    states = list(SendState)
    core = make_node(tmp_path, len(states))
    d = NodeStandIn()
    for rid, s in enumerate(states, start=1):
        sql(core.path, "UPDATE outbox SET state=?, attempts=2, code=7 WHERE id=?", int(s), rid)
    h = node_handlers(d, core, reload=lambda: None, drain=DrainControl())
    try:
        r = await h[verb]({"ids": list(range(1, len(states) + 1))})
        moved = {rid for rid, s in enumerate(states, start=1) if (s, action) in OPERATOR_TABLE}
        assert r["ids"] == sorted(moved) and r["changed"] == len(moved)
        assert r["skipped"] == [{"id": rid, "state": s.name} for rid, s in enumerate(states, start=1)
                                if rid not in moved]
        after = dict(sql(core.path, "SELECT id, state FROM outbox"))
        reset = action is OperatorAction.REQUEUE
        for rid, s in enumerate(states, start=1):
            if rid not in moved:
                assert after[rid] == int(s)
            elif (nxt := OPERATOR_TABLE[(s, action)]) is None:
                assert rid not in after
            else:
                assert after[rid] == int(nxt)
                assert sql(core.path, "SELECT attempts, code FROM outbox WHERE id=?", rid) == (
                    [(0, 0)] if reset else [(2, 7)])
    finally:
        core.close()


@pytest.mark.parametrize("verb", ["requeue", "resend", "purge"])
async def test_platform_commands_follow_the_stored_operator_table_in_every_state(tmp_path: Path,
                                                                                 verb: str) -> None:
    from semq.node.engine import OperatorAction
    from semq.platform.engine import STORED_OPERATOR_TABLE, StoredState

    action = OperatorAction(verb)
    states = list(StoredState)
    core = platform_with_stored(tmp_path, len(states))
    d = PlatformStandIn()
    db = tmp_path / "platform.sqlite"
    for rid, s in enumerate(states, start=1):
        sql(db, "UPDATE stored SET state=? WHERE id=?", int(s), rid)
    h = platform_handlers(d, core, reload=lambda: None, drain=DrainControl())
    try:
        r = await h[verb]({"ids": list(range(1, len(states) + 1))})
        moved = {rid for rid, s in enumerate(states, start=1) if (s, action) in STORED_OPERATOR_TABLE}
        assert r["ids"] == sorted(moved) and len(r["skipped"]) == len(states) - len(moved)
        after = dict(sql(db, "SELECT id, state FROM stored"))
        for rid, s in enumerate(states, start=1):
            nxt = STORED_OPERATOR_TABLE.get((s, action), s)
            assert after.get(rid) == (None if nxt is None else int(nxt))
    finally:
        core.close()
