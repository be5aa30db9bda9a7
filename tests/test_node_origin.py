"""The origin's claim (SPEC A.2) with ``early``: DATA leaves before the
commit, and a commit that fails after the frames left loses nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import (
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Kind,
    RawFrame,
    encode_frame,
)

A, B = "10008", "56001"
P = Endpoint.platform()


def _raw(frame: Frame) -> RawFrame:
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    raw = dec.next_frame()
    assert raw is not None
    return raw


def _acks(kind: Kind, source: Endpoint, ids: list[int]) -> RawFrame:
    flag = int(ForwardFlag.FORWARDED) if kind is Kind.ACK_FWD else 0
    ack_flag = AckFlag.PLATFORM if kind is Kind.ACK_FWD else AckFlag.DELIVERY
    entries = tuple(AckEntry(1, 1, 100 + i, 1, 1, i, int(ack_flag), flag) for i in ids)
    return _raw(Frame(kind=Kind.ACK_BATCH, source=source, target=Endpoint.org(A), origin=source,
                      body=AckBatch(ack_kind=kind, entries=entries)))


def _states(path: Path) -> list[tuple[int, int, int]]:
    c = sqlite3.connect(path)
    try:
        return c.execute("SELECT id, state, attempts FROM outbox ORDER BY id").fetchall()
    finally:
        c.close()


def test_early_frames_leave_before_the_commit(tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, synchronous="FULL", platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(3)])
        seen: list[tuple[int, list[tuple[int, int, int]]]] = []

        def early(frames: list[bytes]) -> None:
            # Another connection still sees the rows as they were: not committed yet.
            seen.append((len(frames), _states(store)))

        out = a.claim(10, early=early)
        assert seen == [(3, [(1, 0, 0), (2, 0, 0), (3, 0, 0)])]
        assert (out.data, out.early) == ([], 3)
        assert _states(store) == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
        assert a.claim(10, early=early).early == 0  # nothing left: not called
        assert len(seen) == 1
    finally:
        a.close()


def test_a_commit_that_fails_after_the_frames_left_loses_nothing(tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, synchronous="FULL", platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(2)])
        sent: list[bytes] = []

        def early_then_fail(frames: list[bytes]) -> None:
            sent.extend(frames)
            raise sqlite3.OperationalError("disk I/O error")  # as a failed COMMIT would

        with pytest.raises(sqlite3.OperationalError):
            a.claim(10, early=early_then_fail)
        assert len(sent) == 2
        assert _states(store) == [(1, 0, 0), (2, 0, 0)]  # SS_INIT, as if never claimed
        # The platform's ACK_FWD for the copies that left finds the rows SS_INIT:
        # unchanged (ORIGIN_TABLE), so they go again ...
        a.handle([_acks(Kind.ACK_FWD, P, [1, 2])])
        assert _states(store) == [(1, 0, 0), (2, 0, 0)]
        again = a.claim(10)
        assert len(again.data) == 2 and _states(store) == [(1, 1, 1), (2, 1, 1)]
        # ... the receiver's ACK2 (of either copy, same LK0) confirms them.
        out = a.handle([_acks(Kind.ACK2, Endpoint.org(B), [1, 2])])
        assert _states(store) == []  # SS_ACK2: confirmed end to end and cleaned up
        assert len(out.data) == 1  # one ACK_BATCH of REACK2 back to the receiver
    finally:
        a.close()


def test_no_partial_index_uses_an_in_list(tmp_path: Path) -> None:
    """SQLite evaluates a partial index's condition for the old and the new row
    of every UPDATE, and an IN list of constants through a temporary table:
    ``state IN (1, 2, 3)`` in outbox_due cost an origin 16 us per document
    (node schema v7 writes it ``BETWEEN``). Guard every store's indexes."""
    from semq.node.store import open_node_store
    from semq.platform.store import open_platform_store

    for db in (open_node_store(tmp_path / "n.sqlite", create=True), open_platform_store(tmp_path / "p.sqlite", create=True)):
        try:
            sqls = [r[0] for r in db.execute_sql("SELECT sql FROM sqlite_master WHERE type='index' AND sql IS NOT NULL")]
            assert sqls
            for sql in sqls:
                where = sql.upper().partition(" WHERE ")[2]
                assert " IN (" not in where and " IN(" not in where, sql
        finally:
            db.close()
    a = NodeCore(tmp_path / "n.sqlite", A)
    try:
        plan = a.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM outbox INDEXED BY outbox_due WHERE reliable=1 AND state BETWEEN 1 AND 3"
            " AND due_ms <= 5 ORDER BY due_ms").fetchall()
        assert any("outbox_due" in str(r) for r in plan)
    finally:
        a.close()
