"""``semq admin ...`` in process against an admin console serving the real
node and platform handlers (the CLI runs on a worker thread, the console on
the trio loop): text and --json output, exit statuses, one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from semq.cli import main as semq_main
from semq.node.core import NodeCore
from semq.ops.admin import DrainControl, serve_admin
from semq.ops.cli import main as ops_main
from semq.ops.cli import parse_duration
from semq.ops.handlers import node_handlers, platform_handlers
from semq.ops.runtime import live_status
from semq.umxt_protocol import Endpoint
from tests.ops.test_ops_handlers import (
    B,
    NodeStandIn,
    PlatformStandIn,
    SessionStandIn,
    make_node,
    platform_with_stored,
)


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await trio.to_thread.run_sync(ops_main, list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def init_dir(d: Path) -> None:
    # semq.toml for a node whose store make_node() creates
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    (d / "node.sqlite").unlink()


async def test_node_admin_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "A"
    init_dir(d)
    core: NodeCore = make_node(d, 4)
    core.claim(2)
    daemon = NodeStandIn()
    daemon.in_flight = 2
    drain = DrainControl()
    try:
        h = node_handlers(daemon, core, reload=lambda: {"changed": {}}, drain=drain)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin, d / "admin.sock", h)
            rc, out, _ = await run(capsys, "admin", "status", "--dir", str(d))
            assert rc == 0 and "node 10008" in out and "connected to the platform" in out
            assert "2 waiting to be sent (SS_INIT)" in out
            assert re.search(rf"  {B:<12} +2  \S+ +sent, not acknowledged yet \(SS_SENT\)", out), out
            assert "direct links: policy prefer; listening on 127.0.0.1:7443" in out
            assert "to   56001      127.0.0.1:7444" in out and "sent 5, in flight 1" in out
            assert "to   56002      no link: it does not listen for direct links (tried again in 8.0 s)" in out
            rc, out, _ = await run(capsys, "admin", "status", "--dir", str(d), "--json")
            assert rc == 0 and json.loads(out)["outbox"] == {"SS_INIT": 2, "SS_SENT": 2}
            st = await trio.to_thread.run_sync(live_status, d)
            assert st is not None and st["org"] == "10008"

            rc, out, err = await run(capsys, "admin", "list", "--dir", str(d), "--state", "SS_SENT")
            assert rc == 0 and out.count("sent, not acknowledged yet (SS_SENT)") == 2 and "2 row(s)" in err and "trade/ORDER/PO/S0" in out
            rc, out, _ = await run(capsys, "admin", "show", "10008/1/1/2", "--dir", str(d))
            assert rc == 0 and "state: SS_SENT" in out and "lk0: 10008/1/1/2" in out
            rc, out, _ = await run(capsys, "admin", "stuck", "--dir", str(d), "--older-than", "0s")
            assert rc == 0 and out.startswith("4 stuck") and "sent_platform_ack_missing=2" in out
            rc, out, _ = await run(capsys, "admin", "resend", "1", "2", "--dir", str(d), "--dry-run")
            assert rc == 0 and "dry run: would have resent 2 of 2" in out
            rc, out, _ = await run(capsys, "admin", "resend", "--state", "SS_SENT", "--dir", str(d))
            assert rc == 0 and "resent 2 of 2 matched" in out and daemon.in_flight == 0
            rc, out, _ = await run(capsys, "admin", "requeue", "--all", "--dir", str(d))
            assert rc == 0 and "requeued 0 of 4 matched" in out and "skipped 4" in out
            rc, out, _ = await run(capsys, "admin", "purge", "4", "--dir", str(d), "--json")
            assert rc == 0 and json.loads(out)["ids"] == [4]
            rc, out, _ = await run(capsys, "admin", "reload", "--dir", str(d))
            assert rc == 0 and "reloaded: nothing changed" in out

            # mistakes: exit 2, one line
            rc, _, err = await run(capsys, "admin", "purge", "--dir", str(d))
            assert rc == 2 and err.startswith("error: admin purge needs") and err.count("\n") == 1
            rc, _, err = await run(capsys, "admin", "show", "99", "--dir", str(d))
            assert rc == 2 and err == "error: show: no outbox record 99 (confirmed records are cleaned up)\n"
            rc, _, err = await run(capsys, "admin", "list", "--state", "nope", "--dir", str(d))
            assert rc == 2 and "is not one of SS_INIT" in err

            rc, out, _ = await run(capsys, "admin", "drain", "--dir", str(d))
            assert rc == 0 and out.startswith("draining") and drain.requested and not drain.stopping
            rc, out, _ = await run(capsys, "admin", "stop", "--dir", str(d))
            assert rc == 0 and out == "stopping\n" and drain.stopping
            nursery.cancel_scope.cancel()
    finally:
        core.close()
    # no daemon: exit 1; no configuration: exit 2
    rc, _, err = await run(capsys, "admin", "status", "--dir", str(d))
    assert rc == 1 and "no daemon is listening on" in err
    assert await trio.to_thread.run_sync(live_status, d) is None
    rc, _, err = await run(capsys, "admin", "status", "--dir", str(tmp_path / "nothing"))
    assert rc == 2 and "no configuration" in err


async def test_platform_admin_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "P"
    assert semq_main(["platform", "init", "--dir", str(d), "--no-security"]) == 0
    (d / "platform.sqlite").unlink()
    core = platform_with_stored(d, 3)
    daemon = PlatformStandIn()
    daemon.sessions[Endpoint.org(B)] = SessionStandIn(queued=10)
    try:
        h = platform_handlers(daemon, core, reload=lambda: None, drain=DrainControl())
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin, d / "admin.sock", h)
            rc, out, _ = await run(capsys, "admin", "status", "--dir", str(d))
            assert rc == 0 and "platform platform" in out and "1 connected" in out
            assert f"online  {B}" in out and "offline 10008" in out and re.search(r"DATA +\d+ +\S+ +stored, not delivered yet \(SS_INIT\)", out)
            rc, out, _ = await run(capsys, "admin", "list", "--dir", str(d), "--target", B)
            assert rc == 0 and out.count("10008/1/1/") == 3
            rc, out, _ = await run(capsys, "admin", "purge", "--dir", str(d), "--older-than", "1h")
            assert rc == 0 and "purged 0 of 0" in out
            nursery.cancel_scope.cancel()
    finally:
        core.close()


def test_parse_duration() -> None:
    assert parse_duration("90") == 90 and parse_duration("15m") == 900 and parse_duration("2d") == 172800
    assert parse_duration("500ms") == 0.5
    with pytest.raises(Exception, match="not a duration"):
        parse_duration("soon")


async def test_status_and_admin_stuck_say_what_an_ordered_channel_waits_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from semq.node.core import NewDocument
    from semq.umxt_protocol import AppKey
    from tests._frames import decoded

    d = tmp_path / "B"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "56001", "--no-security"]) == 0
    a = NodeCore(tmp_path / "a.sqlite", "10008", create=True, synchronous="OFF")
    b = NodeCore(d / "node.sqlite", "56001", synchronous="OFF")
    try:
        ids = [lk.record_id for lk in a.accept([NewDocument(target="56001", app_data=b"x", channel="ORDERS",
                                                            app_key=AppKey(key=f"S{i}")) for i in range(3)])]
        frames = decoded(a.claim(10).data)
        b.handle(frames[1:])  # the first is late: two held
        capsys.readouterr()
        rc = await trio.to_thread.run_sync(semq_main, ["status", "--dir", str(d)])
        out = capsys.readouterr().out
        want = f"ordered channel ORDERS from 10008 waits for LK0 10008/1/1/{ids[0]} (2 documents held)"
        assert rc == 0 and want in out
        h = node_handlers(NodeStandIn(), b, reload=lambda: {"changed": {}}, drain=DrainControl())
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin, d / "admin.sock", h)
            rc, out, _ = await run(capsys, "admin", "stuck", "--dir", str(d))
            assert rc == 0 and out.startswith("0 stuck") and want in out
            nursery.cancel_scope.cancel()
    finally:
        a.close()
        b.close()
