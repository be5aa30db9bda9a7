"""The user socket (semq.ops.usersock) over a real Unix socket, served
in-process: a connection is the user its first line proves — by its token,
or by its operating-system account, which a client cannot claim — and
nothing larger than that line is read before; later requests need no
token, may not speak as another user, and stop working when the proof no
longer holds. Documents over one block are uploaded in blocks (staged
privately, refused when they do not add up, swept when stale) and read in
blocks."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pwd
import socket
import stat
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.large.manifest import Manifest
from semq.ops.admin import Limits, serve_admin
from semq.ops.uploads import UPLOADS_DIR, Uploads
from semq.ops.usersock import (
    UserClient,
    UserGate,
    UserSocketError,
    _Store,
    serve_user_socket,
    user_handlers,
)
from semq.settings.bounds import (
    USER_AUTH_BYTES,
    USER_AUTH_S,
    USER_BLOCK_BYTES,
    USER_MAX_CONNECTIONS_PER_USER,
    USER_MAX_REQUEST,
)
from semq.settings.config import Config, load_config

MIB = 1 << 20


class Line:
    """A raw connection: one JSON line out, one back."""

    def __init__(self, path: Path) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(str(path))
        self.buf = b""

    def ask(self, cmd: str, **args: Any) -> dict[str, Any]:
        self.s.sendall(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
        return self.answer()

    def answer(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            assert chunk, "closed without an answer"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return dict(json.loads(line))

    def closed(self) -> bool:
        """True once the server closed its end (after any answer)."""
        try:
            return self.s.recv(65536) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.s.close()


@contextlib.contextmanager
def served(cfg: Config, **kw: Any) -> Iterator[Path]:
    """serve_user_socket on ``<dir>/user.sock``, in a trio loop of its own
    (a thread), for a synchronous test; stopped at the end (bounded)."""
    path = cfg.directory / "user.sock"
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as n:
            box["scope"], box["token"] = n.cancel_scope, trio.lowlevel.current_trio_token()
            await n.start(partial(serve_user_socket, path, cfg, **kw))
            ready.set()

    t = threading.Thread(target=lambda: box.setdefault("error", _run(main)), daemon=True)
    t.start()
    assert ready.wait(20), f"the user socket did not start: {box.get('error')}"
    try:
        yield path
    finally:
        trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
        t.join(20)
        assert not t.is_alive()


def _run(main: Any) -> BaseException | None:
    try:
        trio.run(main)
    except BaseException as e:  # (said by the fixture when it did not start)
        return e
    return None


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / "B"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "56001", "--no-security"]) == 0
    return d


def test_a_token_or_the_tied_account_proves_a_user_and_nothing_else_does(node: Path) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    with NodeClient(node) as client:
        alice = client.add_user("alice")
        client.add_user("bob", os_user=me)
        client.send("bob", b"for bob", data_type="NOTE", user="alice")
    with served(load_config(node)) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        c = Line(path)
        got = c.ask("whoami", user="alice", token=alice)
        assert got["ok"] and got["result"]["user"] == "alice" and got["result"]["block"] == USER_BLOCK_BYTES
        # Later requests carry no token: the connection is alice's.
        assert c.ask("inbox")["result"] == []  # alice sent it: not in her inbox
        got = c.ask("send", to="bob", data=base64.b64encode(b"hi").decode(), data_type="NOTE")
        assert got["ok"] and got["result"]["lk0"].startswith("56001/1/1/")
        assert "data is not base64" in c.ask("send", to="bob", data="%%%", data_type="NOTE")["error"]
        assert "limit 0 is outside 1..10000" in c.ask("inbox", limit=0)["error"]
        # Speaking as another user, or with a token that is not alice's, is refused; the connection stays hers.
        got = c.ask("inbox", user="bob")
        assert "this connection is alice's (its first line); a request as bob needs a connection of its own" \
            in got["error"]
        assert "user alice and this token do not match" in c.ask("inbox", token="semq_not-hers")["error"]
        assert c.ask("inbox", user="alice", token=alice)["ok"]
        assert c.ask("whoami")["result"]["user"] == "alice"
        # The kernel's word: this process's account is bob's.
        b = Line(path)
        assert b.ask("whoami")["result"]["user"] == "bob"
        assert b.ask("inbox", data=True)["ok"]
        # A client-supplied uid or session is dropped: only the kernel and the first line count.
        x = Line(path)
        got = x.ask("whoami", user="alice", peer_uid=0, session="alice")
        assert not got["ok"] and "is not tied to user alice" in got["error"] and x.closed()
        # A wrong token: one line, closed.
        x = Line(path)
        got = x.ask("inbox", user="bob", token=alice)
        assert got == {"ok": False, "error": "inbox: user bob and this token do not match"} and x.closed()
        # Removing alice ends what her open connection may do.
        with NodeClient(node) as client:
            client.remove_user("alice")
        assert "user alice was removed or given a new token" in c.ask("inbox")["error"]
        for conn in (c, b, x):
            conn.close()


def test_the_first_line_is_short_and_prompt_and_connections_are_counted(node: Path) -> None:
    with NodeClient(node) as client:
        alice = client.add_user("alice")
    with served(load_config(node), max_connections=12) as path:
        # Megabytes without a newline: read up to the first line's limit, then one line and closed.
        c = Line(path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            c.s.sendall(b"x" * (4 * MIB))
        got = c.answer()
        assert f"{USER_AUTH_BYTES + 1} bytes without a newline exceed the {USER_AUTH_BYTES}-byte limit" \
            in got["error"] and c.closed()
        # A first line that is not JSON: refused and closed; so is one that proves nothing.
        c = Line(path)
        c.s.sendall(b"hello\n")
        assert "request is not JSON" in c.answer()["error"] and c.closed()
        # One account holds at most 8 connections that have not authenticated.
        silent = [Line(path) for _ in range(8)]
        c = Line(path)
        got = c.answer()
        assert got["error"] == (f"uid {os.getuid()} has 8 connections that have not authenticated yet, the limit"
                                " of 8 per account") and c.closed()
        for s in silent:
            s.close()
        # A user holds at most 8.
        mine = [Line(path) for _ in range(USER_MAX_CONNECTIONS_PER_USER)]
        for m in mine:
            assert m.ask("whoami", user="alice", token=alice)["ok"]
        c = Line(path)
        got = c.ask("whoami", user="alice", token=alice)
        assert got["error"] == "whoami: user alice has 8 connections open, the limit of 8 per user; close one"
        # And the socket max_connections (12 here): 8 of alice's + 4 more, then one line naming the limit.
        others = [Line(path) for _ in range(4)]
        c = Line(path)
        assert c.answer()["error"] == ("12 connections are open on the user socket, its limit of 12;"
                                       " try again later") and c.closed()
        for m in mine + others:
            m.close()


async def test_a_silent_connection_is_closed_after_the_time_to_authenticate(
        node: Path, autojump_clock: trio.testing.MockClock) -> None:
    """On trio's fake clock: USER_AUTH_S (5 s) pass at once."""
    cfg = load_config(node)
    path = node / "user.sock"
    async with trio.open_nursery() as n:
        await n.start(partial(serve_admin, path, user_handlers(cfg), mode=0o666, credentials=True,
                              limits=Limits(max_request=USER_MAX_REQUEST), gate=UserGate(_Store(cfg)),
                              what="the user socket"))
        stream = await trio.open_unix_socket(str(path))
        t0 = trio.current_time()
        await stream.send_all(b'{"cmd": "who')
        got = b""
        while not got.endswith(b"\n"):
            got += await stream.receive_some(65536)
        assert json.loads(got)["error"] == (f"no authenticating first line within {USER_AUTH_S:g} s (12 bytes came"
                                            " without a newline)")
        assert trio.current_time() - t0 == pytest.approx(USER_AUTH_S, abs=0.1)
        assert await stream.receive_some(65536) == b""  # closed
        await stream.aclose()
        n.cancel_scope.cancel()


def _upload_options(node: Path) -> Path:
    """A 6 MiB file (over one block and over large_from_mib: a large
    document) and the user alice; the file's path."""
    src = node.parent / "plan.dwg"
    with open(src, "wb") as f:
        for i in range(6):
            f.write(os.urandom(MIB // 2) + bytes([i]) * (MIB // 2))
    return src


def test_a_document_of_several_blocks_is_uploaded_whole_and_taken_in_without_a_copy(node: Path) -> None:
    with NodeClient(node) as client:
        alice = client.add_user("alice")
    src = _upload_options(node)
    want = hashlib.sha256(src.read_bytes()).digest()
    small = os.urandom(3 * MIB)  # over one block, under large_from_mib: one document
    with served(load_config(node)) as path, UserClient(path, "alice", alice) as me:
        assert stat.S_IMODE((node / UPLOADS_DIR).stat().st_mode) == 0o700
        seen: list[int] = []
        lk0 = me.send_file("10008", src, data_type="CAD", progress=seen.append)
        assert seen == [USER_BLOCK_BYTES] * 6
        lk1 = me.send("10008", small, data_type="CAD", key="small")
        assert not any((node / UPLOADS_DIR).iterdir())  # nothing left staged
    with NodeClient(node) as client:
        rows = client.core.conn.execute("SELECT path, manifest, size FROM large_out").fetchall()
        assert len(rows) == 1 and rows[0][2] == 6 * MIB
        m = Manifest.decode(rows[0][1])
        assert m.sha256 == want and m.size == 6 * MIB
        copy = node / rows[0][0]
        assert hashlib.sha256(copy.read_bytes()).digest() == want and stat.S_IMODE(copy.stat().st_mode) == 0o600
        sent = {str(r.lk0): r for r in client.messages(user="alice")}
        assert set(sent) == {lk0, lk1}
        data = client.core.conn.execute("SELECT app_data FROM outbox WHERE large=0").fetchone()[0]
        assert bytes(data) == small


def test_blocks_that_do_not_add_up_are_refused_with_one_line(node: Path) -> None:
    with NodeClient(node) as client:
        alice = client.add_user("alice")
        bob = client.add_user("bob")
    b64 = base64.b64encode
    with served(load_config(node)) as path:
        c = Line(path)
        assert c.ask("whoami", user="alice", token=alice)["ok"]
        up = c.ask("upload_begin", size=2 * MIB + 5, to="10008", data_type="CAD")["result"]["upload"]
        block = os.urandom(MIB)
        assert c.ask("upload_block", upload=up, offset=0, data=b64(block).decode())["result"] == {"staged": MIB}
        got = c.ask("upload_block", upload=up, offset=0, data=b64(block).decode())  # the same block again
        assert got["error"] == (f"upload_block: block at offset 0 of upload {up}, which holds {MIB} of its"
                                f" {2 * MIB + 5} bytes: blocks come in order, the next at {MIB}")
        got = c.ask("upload_block", upload=up, offset=2 * MIB, data=b64(b"x").decode())  # a gap
        assert "block at offset 2097152" in got["error"] and f"the next at {MIB}" in got["error"]
        got = c.ask("upload_send", upload=up)
        assert got["error"] == (f"upload_send: upload {up} holds {MIB} of its {2 * MIB + 5} bytes: its blocks do"
                                f" not add up; send the next from offset {MIB}")
        assert c.ask("upload_block", upload=up, offset=MIB, data=b64(block).decode())["ok"]
        got = c.ask("upload_block", upload=up, offset=2 * MIB, data=b64(b"123456").decode())
        assert got["error"] == (f"upload_block: block of 6 bytes at offset {2 * MIB} goes past the"
                                f" {2 * MIB + 5} bytes declared for upload {up}")
        too_big = b64(os.urandom(MIB + 1)).decode()
        got = c.ask("upload_block", upload=up, offset=2 * MIB, data=too_big)
        assert got["error"] == (f"upload_block: data of {MIB + 1} bytes exceeds one block of {MIB} bytes; a larger"
                                " document is sent in blocks (upload_begin, upload_block, upload_send)")
        assert "exceeds one block" in c.ask("send", to="10008", data=too_big, data_type="CAD")["error"]
        # Bob cannot see, feed or send alice's upload: it is "no upload" to him.
        d = Line(path)
        assert d.ask("whoami", user="bob", token=bob)["ok"]
        got = d.ask("upload_status", upload=up)
        assert got["error"].startswith(f"upload_status: no upload '{up}' of user bob")
        # A wrong digest: refused, and the upload removed.
        assert c.ask("upload_block", upload=up, offset=2 * MIB, data=b64(b"12345").decode())["ok"]
        got = c.ask("upload_send", upload=up, sha256="00" * 32)
        assert "its blocks' SHA-256 is" in got["error"] and "removed; upload the document again" in got["error"]
        assert not any((node / UPLOADS_DIR).iterdir())
        # Over the node's limit, or a large document for a colleague: refused before a byte is staged.
        got = c.ask("upload_begin", size=(4096 << 20) + 1, to="10008", data_type="CAD")
        assert "exceeds this node's limit" in got["error"]
        got = c.ask("upload_begin", size=5 * MIB, to="bob", data_type="CAD")
        assert "cannot go to a user of this node" in got["error"]
        assert "save_fwd 'x' is not int" in c.ask("upload_begin", size=5, to="10008", save_fwd="x")["error"]
        # At most 4 uploads of one user at once.
        ids = [c.ask("upload_begin", size=5, to="10008", data_type="CAD")["result"]["upload"] for _ in range(4)]
        got = c.ask("upload_begin", size=5, to="10008", data_type="CAD")
        assert got["error"].startswith("upload_begin: 4 uploads of user alice are open, the limit of 4 per user")
        assert c.ask("upload_abort", upload=ids[0])["result"] == {"removed": 0}
        assert c.ask("upload_begin", size=5, to="10008", data_type="CAD")["ok"]


def test_a_stale_upload_is_removed_with_its_file(node: Path) -> None:
    with NodeClient(node) as client:
        alice = client.add_user("alice")
    now = [1000.0]
    uploads = Uploads(node / UPLOADS_DIR, clock=lambda: now[0])
    (node / UPLOADS_DIR).mkdir(mode=0o700)
    (node / UPLOADS_DIR / "left-by-a-crash.part").write_bytes(b"x")
    with served(load_config(node), uploads=uploads) as path:
        assert not (node / UPLOADS_DIR / "left-by-a-crash.part").exists()  # emptied at start
        c = Line(path)
        assert c.ask("whoami", user="alice", token=alice)["ok"]
        up = c.ask("upload_begin", size=10, to="10008", data_type="CAD")["result"]["upload"]
        assert c.ask("upload_block", upload=up, offset=0, data=base64.b64encode(b"12345").decode())["ok"]
        staged = node / UPLOADS_DIR / f"{up}.part"
        assert staged.read_bytes() == b"12345" and stat.S_IMODE(staged.stat().st_mode) == 0o600
        now[0] += 599
        assert uploads.sweep() == []  # a block 599 s ago: not stale yet
        now[0] += 1
        assert uploads.sweep() == [up]
        assert not staged.exists()
        got = c.ask("upload_block", upload=up, offset=5, data=base64.b64encode(b"67890").decode())
        assert got["error"].startswith(f"upload_block: no upload '{up}' of user alice (sent, aborted, removed after"
                                       " 600 s without a block, or the node restarted)")


def test_a_client_makes_its_connection_again_when_the_node_closed_it(node: Path) -> None:
    with NodeClient(node) as client:
        alice = client.add_user("alice")
    cfg = load_config(node)
    me = UserClient(cfg.directory / "user.sock", "alice", alice, timeout=5)
    with served(cfg):
        assert me.whoami() == "alice"
    with pytest.raises(UserSocketError, match="no node answers on"):
        me.whoami()
    with served(cfg):  # a restarted node: the old connection is gone, a new one authenticates
        assert me.whoami() == "alice" and me.inbox() == []
    me.close()
