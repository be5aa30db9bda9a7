"""Users inside an organization and ordered channels, as real processes on
127.0.0.1 with security on: documents between users of two organizations
and between colleagues of one are SEMQ records like any other; a user's
token reads that user's documents only; an ordered channel reaches its
application in send order across platform storage and restarts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.ops.usersock import UserClient, UserSocketError
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def _users(c: Cluster, org: str, *names: str) -> dict[str, str]:
    with NodeClient(c.root / org) as node:
        return {n: node.add_user(n) for n in names}


def _sock(c: Cluster, org: str) -> Path:
    return c.root / org / "user.sock"


def test_users_of_two_organizations_exchange_documents_and_each_reads_only_their_own(cluster: Cluster) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B)
    carol = _users(c, A, "carol")["carol"]
    tokens = _users(c, B, "alice", "bob")
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    with UserClient(_sock(c, A), "carol", carol) as me:
        assert me.whoami() == "carol"
        to_alice = me.send(f"{B}/alice", b"<order>for alice</order>", data_type="ORDER", key="PO-1")
        me.send(f"{B}/bob", b"<order>for bob</order>", data_type="ORDER", key="PO-2")
        me.send(B, b"<order>for the organization</order>", data_type="ORDER", key="PO-3")
    alice = UserClient(_sock(c, B), "alice", tokens["alice"])
    bob = UserClient(_sock(c, B), "bob", tokens["bob"])
    got = wait_until(lambda: alice.inbox(data=True), 30, "alice's document")
    assert [(d["lk0"], d["from"], d["from_user"], d["to_user"], d["data"]) for d in got] == [
        (to_alice, A, "carol", "alice", b"<order>for alice</order>")]
    wait_until(lambda: bob.inbox(), 30, "bob's document")
    # Bob's token reads Bob's documents only; Alice's is "not in the inbox".
    assert [d["app_key"]["key"] for d in bob.inbox()] == ["PO-2"]
    with pytest.raises(UserSocketError, match=f"{got[0]['id']} is not in the inbox of bob"):
        bob.get(got[0]["id"])
    assert bob.acknowledge([got[0]["id"]]) == 0
    # A token proves its own user only; no token, no answer.
    for who, token in (("alice", tokens["bob"]), ("mallory", tokens["bob"])):
        with pytest.raises(UserSocketError, match=f"user {who} and this token do not match"):
            UserClient(_sock(c, B), who, token).inbox()
    with pytest.raises(UserSocketError, match="no token"):
        UserClient(_sock(c, B), "alice").inbox()
    assert alice.acknowledge([got[0]["id"]]) == 1
    # The operator sees all, with who each is for.
    with NodeClient(c.root / B) as node:
        seen = {(i.app_key.key, i.from_user, i.to_user) for i in node.inbox(unread=False)}
    assert seen == {("PO-1", "carol", "alice"), ("PO-2", "carol", "bob"), ("PO-3", "carol", "")}
    # Each went through the relay, end to end confirmed (carol's rows are cleaned up).
    wait_until(lambda: c.count(A, "SELECT count(*) FROM outbox") == 0, 30, "Ack2 for carol's documents")
    # The relay never learnt who they were from or for: the envelope travels sealed.
    relay_log = "".join(p.read_text() for p in (c.root / "P" / "events").glob("*.jsonl"))
    for name in ("alice", "bob", "carol"):
        assert name not in relay_log


def test_colleagues_exchange_records_that_never_leave_the_node_also_with_the_platform_down(
        cluster: Cluster) -> None:
    c = cluster
    c.add_org(A)
    tokens = _users(c, A, "alice", "bob")
    c.start_platform()
    c.start_node(A)
    alice = UserClient(_sock(c, A), "alice", tokens["alice"])
    bob = UserClient(_sock(c, A), "bob", tokens["bob"])
    lk0 = alice.send("bob", b"lunch at noon?", data_type="NOTE", key="N1")
    first = next(bob.receive(timeout=20))  # wakes when it arrives
    assert (first["lk0"], first["data"]) == (lk0, b"lunch at noon?")
    got = wait_until(lambda: bob.inbox(data=True), 20, "bob's note")
    assert [(d["lk0"], d["from"], d["from_user"], d["data"]) for d in got] == [(lk0, A, "alice", b"lunch at noon?")]
    assert alice.inbox() == []
    # Same tables and states as any record: confirmed end to end (Ack2, with
    # a receipt that verifies), then cleaned up; the events say "local".
    wait_until(lambda: c.count(A, "SELECT count(*) FROM outbox") == 0, 20, "the note's Ack2")
    rid = int(lk0.rsplit("/", 1)[1])
    with NodeClient(c.root / A) as node:
        assert node.receipt(rid)["verified"] is True
    events = "".join(p.read_text() for p in (c.root / A / "events").glob("*.jsonl"))
    assert '"path": "local"' in events or '"path":"local"' in events
    assert not c.q("P", "SELECT 1 FROM seen")  # the platform never saw it
    # With the platform gone, colleagues still reach each other.
    c.kill("P")
    lk0 = bob.send("alice", b"yes", data_type="NOTE", key="N2")
    got = wait_until(lambda: alice.inbox(data=True), 20, "alice's answer with the platform down")
    assert [(d["lk0"], d["from_user"], d["data"]) for d in got] == [(lk0, "bob", b"yes")]
    # Bad addresses: a user this node does not have.
    with pytest.raises(UserSocketError, match="is not an organization id nor a user of this node"):
        alice.send("zed", b"x", data_type="NOTE")


def test_the_cli_adds_users_and_a_token_reads_only_its_user(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    def semq(*args: str, token: str | None = None, data: bytes | None = None) -> subprocess.CompletedProcess[str]:
        e = {**env, "SEMQ_TOKEN": token} if token else {k: v for k, v in env.items() if k != "SEMQ_TOKEN"}
        return subprocess.run([sys.executable, "-m", "semq", *args], env=e, capture_output=True, text=True,
                              input=data.decode() if data else None, timeout=60)

    r = semq("user", "add", "alice", "--dir", str(c.root / B))
    assert r.returncode == 0, r.stderr
    alice = r.stdout.strip()
    assert alice.startswith("semq_") and "shown this once" in r.stderr
    bob = semq("user", "add", "bob", "--dir", str(c.root / B)).stdout.strip()
    assert semq_main(["user", "add", "carol", "--dir", str(c.root / A)]) == 0
    assert semq("user", "add", "alice", "--dir", str(c.root / B)).returncode == 2  # exists already
    for key in ("K1", "K2"):
        r = semq("send", "--dir", str(c.root / A), "--to", f"{B}/alice", "--user", "carol", "--type", "ORDER",
                 "--key", key, "--ordered", "orders", "-", data=f"doc {key}".encode())
        assert r.returncode == 0, r.stderr
    listed = wait_until(lambda: semq("inbox", "--dir", str(c.root / B), "--user", "alice", "--json",
                                     token=alice).stdout.count('"lk0"') == 2 or None, 30, "alice's two documents")
    assert listed
    r = semq("inbox", "--dir", str(c.root / B), "--user", "alice", "--json", token=alice)
    import json

    items = json.loads(r.stdout)
    assert [(i["app_key"]["key"], i["channel"]) for i in items] == [("K1", "orders"), ("K2", "orders")]
    # Bob's token cannot read Alice's document, nor pretend to be Alice.
    r = semq("inbox", "show", str(items[0]["id"]), "--dir", str(c.root / B), "--user", "bob", token=bob)
    assert r.returncode == 1 and f"document {items[0]['id']} is not in the inbox of bob" in r.stderr
    r = semq("inbox", "--dir", str(c.root / B), "--user", "alice", token=bob)
    assert r.returncode == 2 and "user alice and this token do not match" in r.stderr
    # A user's application needs only the socket, not the node's directory.
    r = semq("inbox", "--dir", str(tmp_path / "nowhere"), "--socket", str(c.root / B / "user.sock"),
             "--user", "alice", "--json", token=alice)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 2, r.stderr
    r = semq("send", "--dir", str(tmp_path / "nowhere"), "--socket", str(c.root / B / "user.sock"), "--user",
             "alice", "--to", f"{A}/carol", "--type", "NOTE", "-", token=alice, data=b"thanks")
    assert r.returncode == 0 and r.stdout.startswith(f"{B}/1/1/"), r.stderr
    r = semq("user", "list", "--dir", str(c.root / B))
    assert r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines()] == ["alice", "bob"]


def test_an_ordered_channel_arrives_in_order_through_storage_and_restarts(cluster: Cluster) -> None:
    """B is offline: the platform stores the channel's documents; the
    platform and A restart midway; B then gets them all, in order, once."""
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    sent = []
    with NodeClient(c.root / A) as node:
        for batch in range(4):
            docs = [dict(to=B, data=f"{batch}-{i}".encode(), data_type="ORDER", key=f"O{batch}-{i}",
                         ordered="ledger") for i in range(50)]
            docs += [dict(to=B, data=b"u", data_type="NOTE", key=f"U{batch}-{i}") for i in range(10)]
            sent += [str(lk) for lk, d in zip(node.send_many(docs), docs, strict=True) if d.get("ordered")]
            if batch == 1:
                wait_until(lambda: c.count("P", "SELECT count(*) FROM stored") >= 100, 30, "the first stored")
                c.kill("P")
                c.kill(A)
                c.start_platform()
                c.start_node(A)
    wait_until(lambda: c.count(A, "SELECT count(*) FROM outbox WHERE state = 0") == 0, 60, "every document sent")
    c.start_node(B)
    wait_until(lambda: c.count(B, "SELECT count(*) FROM inbox WHERE channel='ledger'") >= 200, 60,
               "the channel at B")
    got = [f"{o}/{s}/{d}/{r}" for o, s, d, r in c.q(
        B, "SELECT origin_id, semq_id, semq_db_id, record_id FROM inbox WHERE channel='ledger' ORDER BY id")]
    assert got == sent
    assert c.count(B, "SELECT count(*) FROM channel_held") == 0
    wait_until(lambda: c.settled([A, B]), 60, "everything confirmed")


def test_an_ordered_channel_to_a_node_of_several_units_is_kept_by_its_first_unit(cluster: Cluster) -> None:
    """B runs as 2 units: the platform spreads B's documents over them by
    LK0, but delivers the ordered ones (flag Ordered) to unit 1, which keeps
    the channel in order; part of them are stored while B is away."""
    c = cluster
    c.add_org(A)
    c.add_org(B, units=2)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    sent: list[str] = []
    with NodeClient(c.root / A) as node:
        for batch in range(3):
            docs = [dict(to=B, data=b"o", data_type="ORDER", key=f"O{batch}-{i}", ordered="ledger")
                    for i in range(100)]
            docs += [dict(to=B, data=b"u", data_type="NOTE", key=f"U{batch}-{i}") for i in range(40)]
            sent += [str(lk) for lk, d in zip(node.send_many(docs), docs, strict=True) if d.get("ordered")]
            if batch == 0:
                c.kill(B)  # the rest is stored for B's units
                wait_until(lambda: c.count("P", "SELECT count(*) FROM stored WHERE kind=1") > 0 or
                           c.count(A, "SELECT count(*) FROM outbox WHERE state=0") == 0, 30, "A sending on")
            if batch == 1:
                c.start_node(B)
    wait_until(lambda: c.count(B, "SELECT count(*) FROM inbox") >= 420, 60, "every document at B")
    unit1 = c.db(B, 1)
    try:
        got = [f"{o}/{s}/{d}/{r}" for o, s, d, r in unit1.execute(
            "SELECT origin_id, semq_id, semq_db_id, record_id FROM inbox WHERE channel='ledger' ORDER BY id")]
    finally:
        unit1.close()
    assert got == sent
    per_unit = [c.db(B, k) for k in (1, 2)]
    try:
        unordered = [conn.execute("SELECT count(*) FROM inbox WHERE channel=''").fetchone()[0] for conn in per_unit]
        assert per_unit[1].execute("SELECT count(*) FROM inbox WHERE channel!=''").fetchone()[0] == 0
    finally:
        for conn in per_unit:
            conn.close()
    assert sum(unordered) == 120 and min(unordered) > 0  # the unordered ones spread over both units
    assert c.count(B, "SELECT count(*) FROM channel_held") == 0
    wait_until(lambda: c.settled([A, B]), 60, "everything confirmed")
