"""Every state transition is decided by the engine tables and reached
through the cores (SPEC "States"; docs/architecture.md).

For every (state, event) pair of the origin — every table entry and every
pair the table leaves unchanged — a pending-send row is put in that state,
the frame (or call) that carries the event goes through ``NodeCore``, and
the row ends where ``origin_step`` says: the core decides nothing itself.
The same for the receiver's pending-ack confirmations (PENDING_ACK_TABLE)
and the platform's stored copies (STORED_TABLE, through ``PlatformCore``).
And no module outside the owners of the state tables writes a state
column in SQL.
"""

from __future__ import annotations

import itertools
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.node.engine import (
    BY_SAVE_FWD,
    ORIGIN_TABLE,
    PENDING_ACK_TABLE,
    AckEvent,
    AckStatus,
    OriginEvent,
    SendState,
    origin_step,
    pending_ack_step,
    receiver_may_clean,
)
from semq.platform.core import PlatformCore
from semq.platform.engine import StoredEvent, StoredState, stored_step
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Data,
    Endpoint,
    ForwardFlag,
    Frame,
    Inquiry,
    InquiryAnswer,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    RawFrame,
    ResultCode,
    SaveFwd,
)
from tests._frames import raw

A, B = "10008", "56001"
P = Endpoint.platform()
ME, TARGET = Endpoint.org(A), Endpoint.org(B)
ROOT = Path(__file__).resolve().parents[2]


_raw = raw


def _ack(kind: Kind, source: Endpoint) -> RawFrame:
    flag = {Kind.ACK_FWD: int(ForwardFlag.FORWARDED), Kind.ACK_SAVE: int(ForwardFlag.STORED)}.get(kind, 0)
    ack_flag = AckFlag.PLATFORM if kind in (Kind.ACK_FWD, Kind.ACK_SAVE) else AckFlag.DELIVERY
    return _raw(Frame(kind=Kind.ACK_BATCH, source=source, target=ME, origin=source,
                      body=AckBatch(ack_kind=kind, entries=(AckEntry(1, 1, 7, 1, 1, 1, int(ack_flag), flag),))))


def _resp(source: Endpoint, result: InquiryResult) -> RawFrame:
    return _raw(Frame(kind=Kind.INQUIRY_RESP, source=source, target=ME, origin=source,
                      body=InquiryResp(topic=InquiryTopic.RECEIVED,
                                       answers=(InquiryAnswer(LK0(endpoint=ME, record_id=1), result),))))


#: How each origin event reaches the core: a frame through ``handle``, or a call.
FRAMES: dict[OriginEvent, Callable[[], RawFrame]] = {
    OriginEvent.ACK_FWD: lambda: _ack(Kind.ACK_FWD, P),
    OriginEvent.ACK_SAVE: lambda: _ack(Kind.ACK_SAVE, P),
    OriginEvent.ACK2: lambda: _ack(Kind.ACK2, TARGET),
    OriginEvent.NACK: lambda: _raw(Frame(kind=Kind.NACK, source=P, target=ME, origin=P,
                                         body=Nack(lk0=LK0(endpoint=ME, record_id=1), code=ResultCode.UNKNOWN_TARGET))),
    OriginEvent.PLATFORM_HAS: lambda: _resp(P, InquiryResult.RECEIVED),
    OriginEvent.PLATFORM_LACKS: lambda: _resp(P, InquiryResult.NOT_RECEIVED),
    OriginEvent.TARGET_HAS: lambda: _resp(TARGET, InquiryResult.RECEIVED),
    OriginEvent.TARGET_LACKS: lambda: _resp(TARGET, InquiryResult.NOT_RECEIVED),
    OriginEvent.TARGET_ASKS: lambda: _raw(Frame(kind=Kind.INQUIRY, source=TARGET, target=ME, origin=TARGET,
                                                body=Inquiry(topic=InquiryTopic.STATE,
                                                             items=(LK0(endpoint=ME, record_id=1),)))),
}
CALLS: dict[OriginEvent, Callable[[NodeCore], object]] = {
    OriginEvent.SENT: lambda core: core.claim(10),
    OriginEvent.SENT_DIRECT: lambda core: core.claim(10, only=B),
    OriginEvent.EXPIRED: lambda core: core.claim(10),
    OriginEvent.CANNOT_SEND: lambda core: core.fail_target(TARGET, ResultCode.UNKNOWN_TARGET, "unknown"),
}
#: Calls that may find the row in any state: a direct link that broke.
ANY_STATE: dict[OriginEvent, Callable[[NodeCore], object]] = {
    OriginEvent.LINK_LOST: lambda core: core.send_again([1]),
}
#: The SaveFwd variants of an event (BY_SAVE_FWD): reached through the
#: event, on a row of that SaveFwd.
VARIANTS: dict[OriginEvent, tuple[OriginEvent, int]] = {r: (b, sf) for (b, sf), r in BY_SAVE_FWD.items()}


def test_every_origin_event_has_a_way_into_the_core() -> None:
    assert set(FRAMES) | set(CALLS) | set(ANY_STATE) | set(VARIANTS) == set(OriginEvent)
    assert set(ORIGIN_TABLE) <= set(itertools.product(SendState, OriginEvent))


def _row_state(store: Path) -> int | None:
    c = sqlite3.connect(store)
    try:
        row = c.execute("SELECT state FROM outbox WHERE id=1").fetchone()
        return None if row is None else int(row[0])
    finally:
        c.close()


@pytest.mark.parametrize(("state", "event", "save_fwd", "ack2"), [
    (s, e, sf, ack2) for s, e in itertools.product(SendState, OriginEvent) for sf in (1, 2, 3) for ack2 in (False, True)
    # A claim and a failure only ever see SS_INIT rows (they select them);
    # an event's SaveFwd variant is reached on a row of that SaveFwd.
    if (e not in CALLS or s is SendState.SS_INIT) and (e not in VARIANTS or VARIANTS[e][1] == sf)
])
def test_each_origin_pair_goes_where_the_table_says(tmp_path: Path, state: SendState, event: OriginEvent,
                                                    save_fwd: int, ack2: bool) -> None:
    store = tmp_path / "node.sqlite"
    core = NodeCore(store, A, create=True, synchronous="OFF", platform=P)
    try:
        expired = event is OriginEvent.EXPIRED
        core.accept([NewDocument(target=B, app_data=b"order", save_fwd=SaveFwd(save_fwd), ack2=ack2,
                                 expires_ms=1 if expired else None, created_ms=1 if expired else None)])
        with core._tx():
            core.conn.execute("UPDATE outbox SET state=?, attempts=1 WHERE id=1", (int(state),))
        way = VARIANTS[event][0] if event in VARIANTS else event
        if way in FRAMES:
            core.handle([FRAMES[way]()])
        elif way in ANY_STATE:
            ANY_STATE[way](core)
        else:
            CALLS[way](core)
        core.write_deferred_now()
        want = origin_step(state, event, save_fwd=save_fwd, ack2=ack2)
        # A pair the table leaves unchanged leaves the row alone (a late or
        # duplicate frame never moves it); a change cleans it when it may go.
        expected = int(state) if not want.changed else None if want.clean else int(want.state)
        assert _row_state(store) == expected, (state, event, want)
    finally:
        core.close()


def _inbound(core: NodeCore, p_ack: AckStatus, s_ack: AckStatus) -> None:
    cols = ("id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id, lk1_semq_db_id,"
            " lk1_record_id, platform_type, platform_id, p_ack, s_ack, received_ms, last_inquiry_ms")
    with core._tx():
        core.conn.execute(f"INSERT INTO inbound ({cols}) VALUES (5, 1, ?, 1, 1, 9, 1, 1, 90, 2, '', ?, ?, 1, 1)",
                          (A, int(p_ack), int(s_ack)))


@pytest.mark.parametrize(("p", "s", "event"), list(itertools.product(AckStatus, AckStatus, AckEvent)))
def test_each_confirmation_goes_where_the_pending_ack_table_says(
        tmp_path: Path, p: AckStatus, s: AckStatus, event: AckEvent) -> None:
    """A REACK from the platform and a REACK2 from the document's origin,
    through ``handle``, on a pending-ack row in every (P_ACK, S_ACK) pair."""
    assert set(PENDING_ACK_TABLE) == set(itertools.product(itertools.product(AckStatus, AckStatus), AckEvent))
    core = NodeCore(tmp_path / "node.sqlite", B, create=True, synchronous="OFF", platform=P)
    try:
        _inbound(core, p, s)
        kind, source, flag = ((Kind.REACK, P, AckFlag.PLATFORM) if event is AckEvent.PLATFORM_CONFIRMS
                              else (Kind.REACK2, ME, AckFlag.DELIVERY))
        frame = Frame(kind=Kind.ACK_BATCH, source=source, target=TARGET, origin=source,
                      body=AckBatch(ack_kind=kind, entries=(AckEntry(1, 1, 9, 1, 1, 5, int(flag), 0),)))
        core.handle([_raw(frame)])
        want = pending_ack_step(p, s, event)
        row = core.conn.execute("SELECT p_ack, s_ack FROM inbound WHERE id=5").fetchone()
        assert row == (None if receiver_may_clean(*want) else tuple(int(x) for x in want))
    finally:
        core.close()


# A state column written in SQL: ``UPDATE <table> SET ... state=`` (or
# p_ack / s_ack), or an INSERT that names a state column.
_WRITES = re.compile(r"UPDATE\s+(outbox|stored|inbound)\s+SET[^\"']*\b(state|p_ack|s_ack)\s*=", re.I)
#: The modules where a store's state is written: the owners of the node's
#: state tables (semq.node.origin.outbox, semq.node.receiver.pending_ack),
#: the platform's core, and the stores' migrations.
ALLOWED = {
    "semq/node/origin/outbox.py", "semq/node/receiver/pending_ack.py", "semq/node/store.py",
    "semq/platform/copies.py", "semq/platform/store.py",
}


def test_no_module_outside_the_cores_writes_a_state_column() -> None:
    offenders = []
    for path in sorted((ROOT / "semq").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for m in _WRITES.finditer(path.read_text()):
            line = path.read_text()[:m.start()].count("\n") + 1
            offenders.append(f"{rel}:{line}: {m.group(0)[:60]}")
    assert offenders == []


# ------------------------------------------------------------ the platform's stored copies


def _stored_frames(event: StoredEvent, b: Endpoint) -> list[RawFrame]:
    """The frame from target ``b`` that carries ``event`` about stored copy 1
    (the document ME/1)."""
    lk0 = LK0(endpoint=ME, record_id=1)
    if event is StoredEvent.ACK:
        body: object = AckBatch(ack_kind=Kind.ACK, entries=(AckEntry(1, 1, 0, 1, 1, 1, int(AckFlag.PLATFORM), 0),))
        kind = Kind.ACK_BATCH
    elif event is StoredEvent.TARGET_ASKS:
        body, kind = Inquiry(topic=InquiryTopic.STATE, items=(LK0(endpoint=P, record_id=1),)), Kind.INQUIRY
    else:
        result = InquiryResult.RECEIVED if event is StoredEvent.TARGET_HAS else InquiryResult.NOT_RECEIVED
        body = InquiryResp(topic=InquiryTopic.RECEIVED, answers=(InquiryAnswer(lk0, result),))
        kind = Kind.INQUIRY_RESP
    return [_raw(Frame(kind=kind, source=b, target=P, origin=b, body=body))]  # type: ignore[arg-type]


@pytest.mark.parametrize(("state", "event"), [
    (s, e) for s, e in itertools.product(StoredState, StoredEvent)
    # A claim only ever sees undelivered copies (it selects them).
    if e is not StoredEvent.DELIVERED or s is StoredState.SS_INIT
])
def test_each_stored_copy_pair_goes_where_the_table_says(tmp_path: Path, state: StoredState,
                                                         event: StoredEvent) -> None:
    """Every (state, event) pair of a platform's stored copy, through
    ``PlatformCore``: the claim (DELIVERED), a target's reconnect, its ACK,
    its inquiry answers and its own inquiry. Acked copies are deleted at
    once (SPEC P.2)."""
    store = tmp_path / "platform.sqlite"
    p = PlatformCore(store, create=True, synchronous="OFF")
    try:
        p.register([A, B])
        p.handle(ME, [_raw(Frame(kind=Kind.DATA, source=ME, target=TARGET,
                                 body=Data(lk0=LK0(endpoint=ME, record_id=1), app_data=b"order")))], {})
        with p._tx():
            p.conn.execute("UPDATE stored SET state=? WHERE id=1", (int(state),))
        if event is StoredEvent.DELIVERED:
            p.claim_stored(TARGET, 10)
        elif event is StoredEvent.RECONNECTED:
            p.connected(TARGET)
        else:
            p.handle(TARGET, _stored_frames(event, TARGET), {TARGET: 1 << 40})
        p.write_held_now()
        nxt = stored_step(state, event)
        row = p.conn.execute("SELECT state FROM stored WHERE id=1").fetchone()
        expected = (int(state),) if nxt is state else None if nxt is StoredState.SS_ACK else (int(nxt),)
        assert row == expected, (state, event, nxt)
    finally:
        p.close()
