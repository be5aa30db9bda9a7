"""The user socket's answers (semq.ops.usersock): each request is answered
for the user its token, or its operating-system account, proves — and a
client cannot claim an account."""

from __future__ import annotations

import base64
import json
import os
import pwd
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.config import load_config
from semq.node.api import NodeClient
from semq.ops.admin import _dispatch
from semq.ops.usersock import user_handlers


async def call(h: dict, cmd: str, uid: int | None = None, **args: object) -> dict:
    line, _ = await _dispatch(json.dumps({"cmd": cmd, "args": args}).encode(), h, uid)
    return dict(json.loads(line))


@pytest.fixture
def node(tmp_path: Path) -> Path:
    d = tmp_path / "B"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "56001", "--no-security"]) == 0
    return d


async def test_a_token_or_the_tied_account_proves_a_user_and_nothing_else_does(node: Path) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    with NodeClient(node) as client:
        alice = client.add_user("alice")
        client.add_user("bob", os_user=me)
        client.send("bob", b"for bob", data_type="NOTE", user="alice")
    h = user_handlers(load_config(node))
    assert (await call(h, "whoami", user="alice", token=alice))["result"]["user"] == "alice"
    assert (await call(h, "whoami", os.getuid()))["result"]["user"] == "bob"  # by the kernel's word
    # A client-supplied uid is dropped: only the kernel's counts.
    got = await call(h, "whoami", None, peer_uid=os.getuid())
    assert not got["ok"] and "no token" in got["error"]
    got = await call(h, "whoami", os.getuid(), user="alice")  # the account is bob's, not alice's
    assert not got["ok"] and "is not tied to user alice" in got["error"]
    got = await call(h, "inbox", user="bob", token=alice)
    assert not got["ok"] and "user bob and this token do not match" in got["error"]
    # Alice sent it: it is not in her inbox; she cannot read or acknowledge it by its id.
    assert (await call(h, "inbox", user="alice", token=alice))["result"] == []
    got = await call(h, "send", user="alice", token=alice, to="bob", data=base64.b64encode(b"hi").decode(),
                     data_type="NOTE")
    assert got["ok"] and got["result"]["lk0"].startswith("56001/1/1/")
    got = await call(h, "send", user="alice", token=alice, to="bob", data="%%%", data_type="NOTE")
    assert not got["ok"] and "data is not base64" in got["error"]
    got = await call(h, "inbox", user="alice", token=alice, limit=0)
    assert not got["ok"] and "limit 0 is outside 1..10000" in got["error"]


def test_receive_and_inbox_for_a_user_give_that_users_documents_only(node: Path) -> None:
    from semq.umxt_protocol import Endpoint
    from tests._frames import decoded

    with NodeClient(node) as client:
        client.add_user("alice")
        client.add_user("bob")
        client.send("bob", b"1", data_type="NOTE", user="alice")
        client.send("alice", b"2", data_type="NOTE", user="bob")
        client.send("bob", b"3", data_type="NOTE")  # from the organization itself
        core, me = client.core, Endpoint.org("56001")
        out = core.claim(10)  # what the daemon's loopback does: claimed, received as from itself
        assert len(out.local) == 3 and out.data == []
        back = core.handle(decoded(out.local), direct=me)
        core.handle(decoded(back.data), direct=me)  # the ACK2s
        assert [(i.app_data, i.from_user) for i in client.receive(user="bob", timeout=0.2)] == [(b"1", "alice"),
                                                                                              (b"3", "")]
        assert [i.app_data for i in client.inbox(user="alice")] == [b"2"]
        assert len(client.inbox()) == 3  # the operator sees all
        assert client.messages() == []  # confirmed end to end and cleaned up
        item = client.inbox(user="alice")[0]
        with pytest.raises(KeyError):
            client.get(item.id, user="bob")
        assert client.acknowledge([item.id], user="bob") == 0
        assert client.acknowledge([item.id], user="alice") == 1
