"""What the stores keep, and for how long: the node's and the platform's
hourly housekeeping delete each kind of row once its retention has passed,
and not a moment before (docs/exactly-once.md, docs/design.md,
docs/cli.md, docs/seed-capabilities.md, docs/security.md "Receipts").

- the dedup table remembers every LK0 for 30 days; a copy arriving after
  that is not new to the receiver: its creation time is refused (STALE);
- failed rows (dead letters) are kept 7 days after they failed;
- inbox documents the application acknowledged are kept a day, unread
  ones until they are read;
- delivery receipts are kept 400 days;
- the platform remembers the LK0s it accepted (``seen``) for 30 days and
  keeps a stored copy until it is delivered, however old."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.platform.core import PlatformCore
from semq.umxt_protocol import (
    LK0,
    Data,
    Endpoint,
    Frame,
    Kind,
    Nack,
    ResultCode,
)
from tests._frames import decoded, raws
from tests.conftest import NodeClock

A, B = "10008", "56001"
P = Endpoint.platform()
MINUTE = 60_000
DAY = 86_400_000


_raw, _raw_bytes = raws, decoded


def _copy(record_id: int, created_ms: int) -> Frame:
    """A document from A as the platform forwards it to B."""
    a = Endpoint.org(A)
    return Frame(kind=Kind.DATA, source=P, origin=a, target=Endpoint.org(B), ack2=True,
                 body=Data(lk0=LK0(endpoint=a, record_id=record_id), created_ms=created_ms,
                           app_data=b"doc %d" % record_id))


def test_node_housekeeping_keeps_each_row_for_its_retention(tmp_path: Path, node_clock: NodeClock) -> None:
    d = tmp_path / B
    assert semq_main(["node", "init", "--dir", str(d), "--org", B, "--no-security"]) == 0
    t0 = node_clock.t = int(time.time() * 1000)  # NodeClient.acknowledge stamps with the real clock
    b = NodeCore(d / "node.sqlite", B, platform=P)
    try:
        # Received from A: two documents (inbox and dedup rows).
        assert b.handle(_raw(_copy(7, t0), _copy(8, t0))).delivered == 2
        # Sent by B: one the platform refused (a dead letter, SS_FAILED).
        [lk0] = b.accept([NewDocument(target="77000", app_data=b"to nobody")])
        assert len(b.claim(10).data) == 1
        b.handle(_raw(Frame(kind=Kind.NACK, source=P, target=Endpoint.org(B), origin=P,
                            body=Nack(lk0=lk0, code=ResultCode.UNKNOWN_TARGET, message="unknown target"))))
        b.conn.execute("INSERT INTO receipts (record_id, target_id, digest, receipt, verified, received_ms)"
                       " VALUES (99, ?, x'00', x'00', 1, ?)", (A, t0))
        b.write_deferred_now()
        with NodeClient(d) as app:  # the application has processed document 7
            [seven] = [i.id for i in app.inbox() if i.lk0.record_id == 7]
            assert app.acknowledge([seven]) == 1

        def left() -> dict[str, int]:
            b.housekeeping()
            q = b.conn.execute
            return {"dedup": q("SELECT count(*) FROM dedup").fetchone()[0],
                    "inbox read": q("SELECT count(*) FROM inbox WHERE consumed_ms IS NOT NULL").fetchone()[0],
                    "inbox unread": q("SELECT count(*) FROM inbox WHERE consumed_ms IS NULL").fetchone()[0],
                    "failed": q("SELECT count(*) FROM outbox WHERE state=9").fetchone()[0],
                    "receipts": q("SELECT count(*) FROM receipts").fetchone()[0]}

        every = {"dedup": 2, "inbox read": 1, "inbox unread": 1, "failed": 1, "receipts": 1}
        node_clock.t = t0 + DAY - MINUTE
        assert left() == every
        node_clock.t = t0 + DAY + MINUTE
        assert left() == {**every, "inbox read": 0}
        node_clock.t = t0 + 7 * DAY - MINUTE
        assert left() == {**every, "inbox read": 0}
        node_clock.t = t0 + 7 * DAY + MINUTE
        assert left() == {**every, "inbox read": 0, "failed": 0}
        node_clock.t = t0 + 30 * DAY - MINUTE
        assert left() == {**every, "inbox read": 0, "failed": 0}
        node_clock.t = t0 + 30 * DAY + MINUTE
        assert left() == {**every, "inbox read": 0, "failed": 0, "dedup": 0}
        # A copy of document 8 arriving now is no longer known as a duplicate,
        # and is not delivered again: its creation time is refused.
        out = b.handle(_raw(_copy(8, t0)))
        assert out.delivered == 0
        nacks = [r.frame().body for r in _raw_bytes(out.data) if r.kind is Kind.NACK]
        assert [n.code for n in nacks] == [ResultCode.STALE]  # type: ignore[union-attr]
        assert b.conn.execute("SELECT count(*) FROM inbox WHERE record_id=8").fetchone() == (1,)
        assert b.conn.execute("SELECT count(*) FROM dedup").fetchone() == (0,)
        node_clock.t = t0 + 400 * DAY - MINUTE
        assert left()["receipts"] == 1
        node_clock.t = t0 + 400 * DAY + MINUTE
        assert left()["receipts"] == 0
        assert left()["inbox unread"] == 1  # until the application reads it
    finally:
        b.close()


def test_the_platform_remembers_lk0s_30_days_and_keeps_stored_copies_until_delivered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.platform.core as core_mod

    clock = [1_000_000_000_000]
    monkeypatch.setattr(core_mod, "now_ms", lambda: clock[0])
    t0 = clock[0]
    p = PlatformCore(tmp_path / "platform.sqlite", create=True, synchronous="OFF")
    try:
        p.register([A, B])
        a, b = Endpoint.org(A), Endpoint.org(B)
        for rid, target_online in ((1, True), (2, False)):  # forwarded at once / stored for an offline B
            p.handle(a, _raw(Frame(kind=Kind.DATA, source=a, target=b,
                                   body=Data(lk0=LK0(endpoint=a, record_id=rid), app_data=b"doc"))),
                     {b: 1 << 40} if target_online else {})

        def left() -> tuple[int, int]:
            p.housekeeping()
            return (p.conn.execute("SELECT count(*) FROM seen").fetchone()[0],
                    p.conn.execute("SELECT count(*) FROM stored WHERE kind=1").fetchone()[0])

        assert left() == (2, 1)
        clock[0] = t0 + 30 * DAY - MINUTE
        assert left() == (2, 1)
        clock[0] = t0 + 30 * DAY + MINUTE
        assert left() == (0, 1)  # the stored copy waits for B however long it takes
        clock[0] = t0 + 365 * DAY
        assert left() == (0, 1)
    finally:
        p.close()
