"""Words that do not mislead, against real processes: an operator's resend
of a confirmed document says by whom and when it was confirmed and how to
send a new copy; ``semq inbox`` says "2 of 3" for a page and that a node
just started is still connecting; states and steps are shown in plain words
with their code beside, from one table."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.analytics.events import EVENTS_BY_ROLE
from semq.node.api import NodeClient
from semq.node.engine import AckStatus, SendState
from semq.ops.display import PLAIN, counts_shown, plain
from semq.platform.engine import StoredState
from tests._procs import Cluster, wait_until

A, B = "10008", "56001"


def semq(*argv: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SEMQ_DIR", "SEMQ_TOKEN")}
    r = subprocess.run([sys.executable, "-m", "semq", *argv], capture_output=True, text=True, timeout=60, env=env)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def plain_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, security=False)
    try:
        yield c
    finally:
        c.stop_all()


def test_every_state_and_step_has_its_plain_words() -> None:
    for kind, enum in (("node", SendState), ("platform", StoredState), ("ack", AckStatus)):
        assert set(PLAIN[kind]) == {m.name for m in enum}, kind
    assert set(PLAIN["step"]) == set().union(*EVENTS_BY_ROLE.values())
    assert plain("SS_ACK") == "stored at the platform (SS_ACK)"
    assert plain("SS_ACK", "platform") == "acknowledged by the target (SS_ACK)"
    assert plain("reack2", "step") == "confirmation sent again (reack2)"
    assert plain("ack_save", "step") == "stored at the platform (ack_save)"
    assert plain("SOMETHING_NEW\x1b") == "SOMETHING_NEW\\x1b" and plain(None) == "-"
    assert counts_shown({"SS_INIT": 3, "SS_ACK": 1}) == "3 waiting to be sent (SS_INIT), 1 stored at the platform (SS_ACK)"
    assert counts_shown({}) == "empty"


@pytest.mark.e2e
def test_resend_of_a_confirmed_document_says_so_and_inbox_pages_say_of_how_many(plain_cluster: Cluster) -> None:
    c = plain_cluster
    for org in (A, B):
        c.add_org(org)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    with NodeClient(c.root / A) as n:
        lk0s = [str(n.send(B, f"<d n='{i}'/>".encode(), data_type="ORDER", key=f"K{i}")) for i in range(3)]
    wait_until(lambda: len(c.inbox(B)) == 3, 30, "the three documents in B's inbox")
    rc, out, err = semq("inbox", "--dir", str(c.root / B), "--limit", "2")
    assert rc == 0 and len(out.splitlines()) == 3  # the header and two
    assert err.startswith("2 of 3 document(s), the oldest first (--limit N lists up to 10,000;"), err
    rc, out, err = semq("inbox", "--dir", str(c.root / B))
    assert rc == 0 and err == "3 document(s)\n"  # connected: no note
    with NodeClient(c.root / B) as n:
        n.acknowledge([i.id for i in n.inbox()])
    wait_until(lambda: c.count(A, "SELECT count(*) FROM outbox") == 0, 30, "A's rows confirmed and cleaned")

    def confirmed_in_history() -> str | None:
        rc, out, err = semq("admin", "resend", "--dir", str(c.root / A), lk0s[0])
        return err if rc == 2 and out == "" and "already confirmed" in err else None

    err = wait_until(confirmed_in_history, 20, "the confirmation in A's history", interval=0.5)
    assert err.startswith(f"error: {lk0s[0]} is already confirmed by {B} (at 20") and err.count("\n") == 1, err
    assert err.rstrip().endswith("nothing to resend; to send a new copy, send its content again as a new"
                                 f" document (semq send --to {B} ...)")
    rc, out, err = semq("admin", "resend", "--dir", str(c.root / A), lk0s[1].rsplit("/", 1)[1], "999")
    assert rc == 2 and out == ""
    first, second = err.splitlines()
    assert first.startswith(f"error: {lk0s[1]} is already confirmed by {B}")
    assert second.startswith("error: 999: no such document here to resend")
    rc, _, err = semq("admin", "purge", "--dir", str(c.root / A), lk0s[2])
    assert rc == 2 and err.rstrip().endswith("nothing to purge")
    # What a person reads of the document's way: words, the code beside.
    rc, out, _ = semq("track", "--dir", str(c.root / A), lk0s[0])
    assert rc == 0 and "confirmed by the receiver (ack2)" in out and "accepted (queued)" in out


@pytest.mark.e2e
def test_inbox_notes_a_node_still_connecting(plain_cluster: Cluster) -> None:
    c = plain_cluster
    c.add_org(A)
    c.start_node(A)  # the platform is not running: A keeps connecting
    rc, out, err = semq("inbox", "--dir", str(c.root / A))
    assert rc == 0 and out.splitlines()[1:] == []
    assert err.splitlines() == ["0 document(s)", "note: the node is still connecting to the platform (not connected"
                                " since it started): documents waiting there arrive once it is; 'semq status' shows"
                                " the connection"]
    c.start_platform()
    wait_until(lambda: "note:" not in semq("inbox", "--dir", str(c.root / A))[2], 30, "the note gone once connected",
               interval=0.5)
