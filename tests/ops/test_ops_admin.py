"""The admin console over a real Unix socket: JSON lines both ways, errors
as one line, limits, several clients at once, owner-only permissions,
stale sockets, answer-then-act (stop), and the client's errors."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.ops.admin import (
    AdminCommandError,
    AdminCommandFailed,
    AdminUnavailable,
    AfterReply,
    DrainControl,
    admin_call,
    admin_request,
    serve_admin,
)
from semq.settings.bounds import ADMIN_IDLE_S, ADMIN_MAX_CLIENTS, ADMIN_MAX_REQUEST


def make_handlers(log: list[str]) -> dict[str, Any]:
    gate = trio.Event()

    async def echo(args: dict[str, Any]) -> dict[str, Any]:
        return {"args": args}

    async def bad(args: dict[str, Any]) -> None:
        raise AdminCommandError("record 42 is\nnot there")

    async def bug(args: dict[str, Any]) -> None:
        raise RuntimeError("boom\nsecond line")

    async def blocking(args: dict[str, Any]) -> str:
        await gate.wait()
        return "released"

    async def release(args: dict[str, Any]) -> str:
        gate.set()
        return "ok"

    async def later(args: dict[str, Any]) -> AfterReply:
        return AfterReply({"stopping": True}, lambda: log.append("acted"))

    async def unjson(args: dict[str, Any]) -> object:
        return {"x": object(), "b": b"secret document"}

    return {"echo": echo, "bad": bad, "bug": bug, "block": blocking, "release": release, "later": later,
            "unjson": unjson}


async def call(path: Path, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return await trio.to_thread.run_sync(admin_request, path, cmd, args)


async def test_requests_errors_and_permissions(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        got = await nursery.start(serve_admin, path, make_handlers(log))
        assert got == path
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert await call(path, "echo", {"a": 1}) == {"ok": True, "result": {"args": {"a": 1}}}
        r = await call(path, "bad")
        assert r == {"ok": False, "error": "bad: record 42 is not there"}
        r = await call(path, "bug")
        assert r["ok"] is False and "\n" not in r["error"] and "RuntimeError: boom second line" in r["error"]
        r = await call(path, "nope")
        assert not r["ok"] and "unknown command 'nope'" in r["error"] and "echo" in r["error"]
        # bytes never leave as contents; other objects as text
        r = await call(path, "unjson")
        assert r["ok"] and r["result"]["b"] == "<15 bytes>"
        # answer first, then act
        assert log == []
        r = await call(path, "later")
        assert r == {"ok": True, "result": {"stopping": True}}
        assert log == ["acted"]
        with pytest.raises(AdminCommandFailed, match="record 42"):
            await trio.to_thread.run_sync(admin_call, path, "bad")
        nursery.cancel_scope.cancel()
    assert not path.exists()  # removed on exit


def raw_exchange(path: Path, payload: bytes) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass  # the server closed on bytes it did not read (a request over the limit): its answer came first
    return [json.loads(line) for line in data.splitlines()]


async def test_malformed_oversized_and_pipelined(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        answers = await trio.to_thread.run_sync(
            raw_exchange, path,
            b'not json\n["list"]\n{"cmd": "echo", "args": [1]}\n\n{"cmd": "echo", "args": {"n": 2}}\n')
        assert [a["ok"] for a in answers] == [False, False, False, True]
        assert "not JSON" in answers[0]["error"] and "args must be an object" in answers[2]["error"]
        assert answers[3]["result"] == {"args": {"n": 2}}
        big = b'{"cmd": "echo", "args": {"x": "' + b"y" * (ADMIN_MAX_REQUEST + 10) + b'"}}\n'
        answers = await trio.to_thread.run_sync(raw_exchange, path, big)
        assert len(answers) == 1 and not answers[0]["ok"] and "limit" in answers[0]["error"]
        # the server survives all of it
        assert (await call(path, "echo"))["ok"]
        nursery.cancel_scope.cancel()


async def test_several_clients_at_once(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    results: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))

        async def blocked() -> None:
            results.append(await call(path, "block"))

        async with trio.open_nursery() as clients:
            for _ in range(3):
                clients.start_soon(blocked)
            await trio.sleep(0.2)
            # three clients wait inside a handler; others are still served
            assert (await call(path, "echo", {"k": 1}))["ok"]
            assert results == []
            assert (await call(path, "release"))["ok"]
        assert [r["result"] for r in results] == ["released"] * 3
        nursery.cancel_scope.cancel()


async def test_stale_socket_replaced_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a killed daemon's file: nothing listens
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        assert (await call(path, "echo"))["ok"]
        with pytest.raises(OSError, match="already serves"):
            await serve_admin(path, {})
        nursery.cancel_scope.cancel()
    path.write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        await serve_admin(path, {})


async def test_long_directory_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "admin.sock"
    assert len(str(path)) > 108
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        assert (await call(path, "echo", {"deep": True}))["result"] == {"args": {"deep": True}}
        nursery.cancel_scope.cancel()


def test_client_without_daemon(tmp_path: Path) -> None:
    with pytest.raises(AdminUnavailable, match="no daemon is listening"):
        admin_request(tmp_path / "admin.sock", "status")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    dead.close()
    with pytest.raises(AdminUnavailable):
        admin_request(tmp_path / "dead.sock", "status")


async def test_drain_control_supervise() -> None:
    drain = DrainControl(timeout=5)
    busy = [3]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain.supervise, lambda: busy[0])
        await trio.sleep(0.05)
        assert not drain.requested and not drain.stopping
        drain.request("test")
        await trio.sleep(0.3)
        assert drain.requested and not drain.stopping  # still busy
        busy[0] = 0
        with trio.fail_after(2):
            await drain.wait_stop()
        assert drain.status()["stop_reason"] == "drained" and drain.reason == "test"


async def test_drain_times_out(autojump_clock: trio.abc.Clock) -> None:
    drain = DrainControl(timeout=30)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain.supervise, lambda: 1)
        drain.request()
        with trio.fail_after(60):
            await drain.wait_stop()
    assert drain.stopping and drain.stop_reason == "drain timed out"


def test_socket_is_owner_only_even_with_open_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_admin, tmp_path / "admin.sock", {})
                assert stat.S_IMODE((tmp_path / "admin.sock").stat().st_mode) == 0o600
                nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        os.umask(old)


async def _answer(stream: trio.SocketStream) -> dict[str, Any]:
    got = b""
    while not got.endswith(b"\n"):
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed without an answer (had {got[:200]!r})"
        got += chunk
    return dict(json.loads(got))


async def test_a_stream_without_a_newline_is_refused_at_the_limit_never_buffered_beyond(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        stream = await trio.open_unix_socket(str(path))
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(b"y" * (ADMIN_MAX_REQUEST + 1))  # all the server reads: then it answers
        got = await _answer(stream)
        assert got["error"] == (f"{ADMIN_MAX_REQUEST + 1} bytes without a newline exceed the {ADMIN_MAX_REQUEST}-byte"
                                f" limit of a line; a request is at most {ADMIN_MAX_REQUEST} bytes")
        await stream.aclose()
        assert (await call(path, "echo"))["ok"]
        nursery.cancel_scope.cancel()


async def test_a_connection_without_a_whole_request_is_closed_after_the_idle_time(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """On trio's fake clock: a request dripped so slowly it is not whole
    within ADMIN_IDLE_S of the previous answer ends the connection."""
    path = tmp_path / "admin.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        stream = await trio.open_unix_socket(str(path))
        await stream.send_all(b'{"cmd": "echo"}\n')
        assert (await _answer(stream))["ok"]
        t0 = trio.current_time()
        closed = False
        for _ in range(100):  # a byte every 10 s: each arrives long before the idle time, the line never does
            try:
                await stream.send_all(b" ")
            except trio.BrokenResourceError:
                closed = True
                break
            with trio.move_on_after(10):
                try:
                    # The server closes with bytes of ours unread: the kernel
                    # may report that as a reset rather than an end of stream.
                    if await stream.receive_some(65536) == b"":
                        closed = True
                        break
                except trio.BrokenResourceError:
                    closed = True
                    break
        assert closed and trio.current_time() - t0 == pytest.approx(ADMIN_IDLE_S, abs=10.1)
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_one_connection_over_the_limit_gets_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, path, make_handlers([]))
        held = [await trio.open_unix_socket(str(path)) for _ in range(ADMIN_MAX_CLIENTS)]
        await trio.sleep(0.2)
        extra = await trio.open_unix_socket(str(path))
        got = await _answer(extra)
        assert got["error"] == (f"{ADMIN_MAX_CLIENTS} connections are open on the admin console, its limit of"
                                f" {ADMIN_MAX_CLIENTS}; try again later")
        for s in [*held, extra]:
            await s.aclose()
        nursery.cancel_scope.cancel()
