"""``semq partners`` and the "why" line, as real processes on 127.0.0.1
with security on: a partner that goes offline is shown offline since
about then, with the documents waiting for it, as the platform says
(PRESENCE_QUERY); online again once it reconnects; ``semq track`` of a
document waiting for it ends with a line naming that; a document an
ordered channel holds back says what it waits for; ``admin stuck`` says
how many younger documents it does not show."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.identity.crypto import load_certificate
from semq.node.api import NodeClient
from tests._procs import Cluster, wait_until

pytestmark = pytest.mark.e2e

A, B = "10008", "56001"


def _run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = semq_main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def _partners(capsys: Any, d: Path) -> dict[str, dict[str, Any]]:
    rc, out, err = _run(capsys, "partners", "--dir", str(d), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert isinstance(res["asked_ms"], int)
    return {p["org"]: p for p in res["partners"]}


def test_partners_shows_a_partner_offline_since_then_with_its_backlog_and_online_again(
        cluster: Cluster, capsys: Any) -> None:
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    with NodeClient(c.root / A) as node:
        node.send(B, b"<order n='1'/>", data_type="ORDER", key="PO-1")
    wait_until(lambda: c.settled([A, B]), 30, "the first document confirmed")
    p = wait_until(lambda: (got := _partners(capsys, c.root / A).get(B)) and got["online"] and got, 15,
                   "the platform saying B is online")
    assert p["backlog_out"] == 0 and p["oldest_waiting_ms"] is None
    # A direct link is wanted (policy prefer) but B listens for none.
    assert (p["link"], p["link_detail"]) == ("not offered", "it does not listen for direct links")
    assert {"outbox", "pins"} & set(p["known_from"])
    # Its certificate's expiry, from the certificate held (pinned) here.
    cert = load_certificate(c.root / B / "node.pem")
    assert p["cert_expires_ms"] == int(cert.not_valid_after_utc.timestamp() * 1000)

    went = int(time.time() * 1000)
    c.kill(B)
    p = wait_until(lambda: (got := _partners(capsys, c.root / A).get(B)) and got["online"] is False and got, 15,
                   "the platform saying B is offline")
    assert went - 2000 <= p["since_ms"] <= int(time.time() * 1000), (went, p)
    assert p["last_seen_ms"] == p["since_ms"]

    # A document for it waits at the platform: the backlog and its age.
    with NodeClient(c.root / A) as node:
        lk0 = str(node.send(B, b"<order n='2'/>", data_type="ORDER", key="PO-2"))
    wait_until(lambda: c.q(A, "SELECT state FROM outbox WHERE id=?", int(lk0.split("/")[-1])) == [(3,)], 15,
               "stored at the platform (SS_ACK)")
    p = _partners(capsys, c.root / A)[B]
    assert p["backlog_out"] == 1 and p["oldest_waiting_ms"] >= went
    rc, out, _ = _run(capsys, "partners", "--dir", str(c.root / A))
    assert rc == 0 and out.splitlines()[0].split()[:3] == ["PARTNER", "PLATFORM", "SAYS"]
    line = next(x for x in out.splitlines() if x.startswith(B))
    assert "offline since" in line and " 1 " in line, line

    # semq track of it ends with one line: where it is and why it waits.
    wait_until(lambda: _run(capsys, "track", "--dir", str(c.root / A), lk0)[0] == 0, 15, "the history")
    rc, out, _ = _run(capsys, "track", "--dir", str(c.root / A), lk0)
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("why: stored at the platform (SS_ACK): 56001 is offline since "), last
    assert "What to do:" in last and "when 56001 connects" in last
    rc, out, _ = _run(capsys, "track", "--dir", str(c.root / A), lk0, "--json")
    [row] = json.loads(out)
    assert row["why"]["code"] == "partner_offline" and row["why"]["since_ms"] == p["since_ms"]
    # admin show carries the same why.
    rc, out, _ = _run(capsys, "admin", "show", "--dir", str(c.root / A), lk0, "--json")
    assert json.loads(out)["why"]["code"] == "partner_offline"

    # admin stuck hides it (younger than an hour) and says so.
    rc, out, _ = _run(capsys, "admin", "stuck", "--dir", str(c.root / A))
    assert rc == 0 and out.startswith("0 stuck"), out
    assert "1 not confirmed yet but younger than 1 h not shown (--older-than 0 shows them all" in out
    rc, out, _ = _run(capsys, "admin", "stuck", "--dir", str(c.root / A), "--older-than", "0")
    assert out.startswith("1 stuck") and "not shown" not in out, out

    back = int(time.time() * 1000)
    c.start_node(B)
    p = wait_until(lambda: (got := _partners(capsys, c.root / A).get(B)) and got["online"] and got, 15,
                   "the platform saying B is online again")
    assert p["since_ms"] >= back - 1000
    wait_until(lambda: c.settled([A, B]), 30, "the waiting document delivered")
    assert _partners(capsys, c.root / A)[B]["backlog_out"] == 0


def test_track_of_a_document_held_behind_its_ordered_predecessor_says_so(tmp_path: Path, capsys: Any) -> None:
    """The relay holds back the first document of an ordered channel (the
    dishonest relay's ``delay``); the two after it reach B, which holds
    them: ``semq track`` at B says what they wait for."""
    c = Cluster(tmp_path, inquiry_interval=30)  # no inquiry sends the first again meanwhile
    try:
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"rules": [{"action": "delay", "kind": "DATA", "source": A, "count": 1,
                                               "seconds": 60}]}))
        c.add_org(A)
        c.add_org(B)
        c.start_platform(plan)
        c.start_node(A)
        c.start_node(B)
        with NodeClient(c.root / A) as node:
            lk0s = [str(node.send(B, f"<order n='{i}'/>".encode(), data_type="ORDER", key=f"PO-{i}",
                                  ordered="ORDERS")) for i in range(3)]
        wait_until(lambda: c.count(B, "SELECT count(*) FROM channel_held") == 2, 20, "two documents held at B")
        wait_until(lambda: _run(capsys, "track", "--dir", str(c.root / B), lk0s[2])[0] == 0, 15, "B's history")
        rc, out, _ = _run(capsys, "track", "--dir", str(c.root / B), lk0s[2])
        last = out.rstrip().splitlines()[-1]
        assert rc == 0 and last.startswith("why: received here, held back (ordered channel ORDERS): held behind its ordered"
                               f" predecessor {lk0s[0]} of {A}, which has not arrived"), last
        # B's partner A: the two documents no application has yet.
        assert _partners(capsys, c.root / B)[A]["backlog_in"] == 2
    finally:
        c.stop_all()


def test_a_document_says_when_the_platform_is_unreachable_and_when_the_daemon_is_stopped(
        cluster: Cluster, capsys: Any) -> None:
    """The platform stops: a new document waits at its origin, its why line
    names the platform unreachable (since about then), and ``semq partners``
    says its answer is what the platform said last. The node's daemon stops
    too: the why line says so and how to start it."""
    c = cluster
    c.add_org(A)
    c.add_org(B)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)
    wait_until(lambda: json.loads(_run(capsys, "partners", "--dir", str(c.root / A), "--json")[1])["connected"],
               15, "A connected to the platform")
    went = int(time.time() * 1000)
    c.kill("P")
    with NodeClient(c.root / A) as node:
        lk0 = str(node.send(B, b"<order n='3'/>", data_type="ORDER", key="PO-3"))
    wait_until(lambda: _run(capsys, "track", "--dir", str(c.root / A), lk0)[0] == 0, 15, "the history")

    def why() -> dict[str, Any]:
        rc, out, _ = _run(capsys, "track", "--dir", str(c.root / A), lk0, "--json")
        assert rc == 0, out
        w: dict[str, Any] = json.loads(out)[0]["why"]
        return w

    w = wait_until(lambda: (x := why()) and x["code"] == "platform_unreachable" and x, 15, "unreachable")
    assert w["where"] == "in this node's outbox, not sent (SS_INIT)"
    assert went - 2000 <= w["since_ms"] <= int(time.time() * 1000)
    rc, out, err = _run(capsys, "partners", "--dir", str(c.root / A))
    assert rc == 0 and "note: the platform is unreachable now" in err, err
    assert json.loads(_run(capsys, "partners", "--dir", str(c.root / A), "--json")[1])["connected"] is False

    c.kill(A)
    rc, out, _ = _run(capsys, "track", "--dir", str(c.root / A), lk0)
    assert out.rstrip().splitlines()[-1] == (
        "why: in this node's outbox: the node's daemon is not running, so nothing is sent or asked."
        " What to do: start it: semq node run (or systemctl start semq-node-ORG)")
    rc, _, err = _run(capsys, "partners", "--dir", str(c.root / A))
    assert rc == 1 and err.startswith("error: the node's daemon does not answer") and "semq node run" in err
