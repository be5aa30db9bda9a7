"""PlatformCore driven as the daemon drives it, without processes or
sockets: a snapshot of the targets' room (``Room``) and a fake
``RelayPort`` are all that crosses into the store thread. A DATA for an
online target leaves through the port before the commit, its ACK_FWD after
it; one for an offline target is stored; the stored copies' states change
as ``STORED_TABLE`` says; and no SQL in semq/platform names a state or a
kind by a bare number."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.platform.core import PlatformCore, Room
from semq.platform.daemon import ForwardPort, PlatformDaemon, PlatformSettings, Session
from semq.platform.engine import STORED_TABLE, StoredEvent, StoredState, stored_step
from semq.umxt_protocol import (
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    Frame,
    FrameDecoder,
    Inquiry,
    Kind,
)
from tests.platform.test_platform_store import _acks, _data, _raw

A, B, C = "10008", "56001", "56002"
PLATFORM_DIR = Path(__file__).resolve().parents[2] / "semq" / "platform"


class FakePort:
    """A RelayPort that records what it was given and whether the batch's
    transaction was still open then (the frames left before the commit)."""

    def __init__(self, core: PlatformCore) -> None:
        self.core = core
        self.puts: list[dict[Endpoint, list[bytes]]] = []
        self.in_transaction: list[bool] = []

    def put(self, frames: Mapping[Endpoint, list[bytes]]) -> None:
        self.puts.append({t: list(f) for t, f in frames.items()})
        self.in_transaction.append(self.core.conn.in_transaction)


@pytest.fixture
def core(tmp_path: Path) -> Any:
    c = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    c.register([A, B, C])
    yield c
    c.close()


def _kinds(data: list[bytes]) -> list[tuple[Kind, Kind | None]]:
    """(kind, ack kind of an ACK_BATCH) of each frame."""
    d = FrameDecoder()
    d.receive_data(b"".join(data))
    out: list[tuple[Kind, Kind | None]] = []
    while (raw := d.next_frame()) is not None:
        body = raw.frame().body
        out.append((raw.kind, body.ack_kind if isinstance(body, AckBatch) else None))
    return out


def _states(core: PlatformCore) -> list[tuple[int, int]]:
    return core.conn.execute("SELECT id, state FROM stored ORDER BY id").fetchall()


def test_data_for_an_online_target_leaves_through_the_port_before_the_commit(core: PlatformCore) -> None:
    a, b = Endpoint.org(A), Endpoint.org(B)
    port = FakePort(core)
    out = core.handle(a, _raw(_data(a, b, 1), _data(a, b, 2)), {b: 1 << 20}, port=port)
    assert len(port.puts) == 1 and list(port.puts[0]) == [b] and len(port.puts[0][b]) == 2
    assert port.in_transaction == [True]  # before the commit
    assert b not in out.sends and not out.forwards  # not twice
    assert _kinds(out.sends[a]) == [(Kind.ACK_BATCH, Kind.ACK_FWD)]  # the promise: after the commit
    assert _states(core) == []


def test_data_for_an_offline_target_is_stored(core: PlatformCore) -> None:
    a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
    port = FakePort(core)
    # B absent from the snapshot; C connected but its queue full (no room).
    out = core.handle(a, _raw(_data(a, b, 1), _data(a, c, 2)), {c: 0}, port=port)
    assert port.puts == []
    assert _kinds(out.sends[a]) == [(Kind.ACK_BATCH, Kind.ACK_SAVE)]
    rows = core.conn.execute("SELECT id, target_id, kind, state FROM stored ORDER BY id").fetchall()
    assert rows == [(1, B, int(Kind.DATA), int(StoredState.SS_INIT)), (2, C, int(Kind.DATA), int(StoredState.SS_INIT))]
    assert out.stored_for == {b, c}


def test_what_a_batch_forwards_counts_against_its_targets_room(core: PlatformCore) -> None:
    """The snapshot is taken before the batch: the core subtracts what the
    batch itself forwards, so a target past its high-water mark in the
    middle of a batch gets the rest stored (flow control)."""
    a, b = Endpoint.org(A), Endpoint.org(B)
    port = FakePort(core)
    out = core.handle(a, _raw(_data(a, b, 1), _data(a, b, 2), _data(a, b, 3)), {b: 1}, port=port)
    assert len(port.puts[0][b]) == 1 and out.forward_bytes[b] == len(port.puts[0][b][0])
    assert sorted(k for k, _ in _kinds(out.sends[a])) == [Kind.ACK_BATCH, Kind.ACK_BATCH]  # ACK_FWD, ACK_SAVE
    assert [r[0] for r in _states(core)] == [1, 2]  # the 2nd and 3rd stored


def test_without_a_port_the_forwards_join_the_sends(core: PlatformCore) -> None:
    a, b = Endpoint.org(A), Endpoint.org(B)
    out = core.handle(a, _raw(_data(a, b, 1)), {b: 1 << 20})
    assert _kinds(out.sends[b]) == [(Kind.DATA, None)]


def test_a_relayed_frame_for_an_online_target_goes_through_the_port(core: PlatformCore) -> None:
    """SPEC P.4: B's ACK2 for A is forwarded while A is online, kept for it otherwise."""
    a, b = Endpoint.org(A), Endpoint.org(B)
    port = FakePort(core)
    relayed = _raw(Frame(kind=Kind.ACK_BATCH, source=b, target=a, body=AckBatch(
        ack_kind=Kind.ACK2, entries=(AckEntry(1, 1, 9, 1, 1, 3, int(AckFlag.DELIVERY), 0),))))
    core.handle(b, relayed, {a: 1 << 20}, port=port)
    assert list(port.puts[0]) == [a] and port.in_transaction == [True]
    core.handle(b, relayed, {}, port=port)  # A offline: kept for it
    assert len(port.puts) == 1
    assert core.conn.execute("SELECT target_id, kind FROM stored").fetchall() == [(A, int(Kind.ACK_BATCH))]


def test_delivered_and_reconnected_move_copies_as_the_table_says(core: PlatformCore) -> None:
    a, b = Endpoint.org(A), Endpoint.org(B)
    core.handle(a, _raw(*(_data(a, b, i) for i in range(1, 4))), {})
    init = int(StoredState.SS_INIT)
    assert _states(core) == [(1, init), (2, init), (3, init)]
    assert core.claim_stored(b, 2)[1] == 2  # DELIVERED, held in memory: SS_INIT on disk
    assert _states(core) == [(1, init), (2, init), (3, init)] and core.held_count() == 2
    core.write_held_now()
    delivered = int(stored_step(StoredState.SS_INIT, StoredEvent.DELIVERED))
    assert delivered != init
    assert _states(core) == [(1, delivered), (2, delivered), (3, init)]
    assert core.conn.execute("SELECT attempts FROM stored ORDER BY id").fetchall() == [(1,), (1,), (0,)]
    # Id 3 delivered and held too; the reconnect writes it, then moves every copy in flight.
    assert core.claim_stored(b, 10)[1] == 1
    assert core.connected(b)
    back = int(stored_step(stored_step(StoredState.SS_INIT, StoredEvent.DELIVERED), StoredEvent.RECONNECTED))
    assert _states(core) == [(1, back), (2, back), (3, back)]
    assert core.conn.execute("SELECT attempts FROM stored ORDER BY id").fetchall() == [(1,), (1,), (1,)]
    # The target's ACK: SS_ACK, deleted (SPEC P.2).
    assert stored_step(StoredState(back), StoredEvent.ACK) is StoredState.SS_ACK
    core.handle(b, _acks(b, [1]), {b: 1 << 20})
    assert [r[0] for r in _states(core)] == [2, 3]


def test_every_state_change_the_sql_writes_is_in_the_table() -> None:
    """The moves the stored copies' SQL makes (DELIVERED, RECONNECTED) are
    pairs STORED_TABLE has, and change the state."""
    from semq.platform import copies as core_mod

    assert (core_mod._UNDELIVERED, StoredEvent.DELIVERED) in STORED_TABLE
    assert core_mod._DELIVERED is STORED_TABLE[(core_mod._UNDELIVERED, StoredEvent.DELIVERED)]
    assert core_mod._DELIVERED is not core_mod._UNDELIVERED
    moves = {(int(s), int(n)) for (s, e), n in STORED_TABLE.items() if e is StoredEvent.RECONNECTED and n is not s}
    assert set(core_mod._ON_RECONNECT) == moves and moves
    assert f"state={int(core_mod._DELIVERED)}," in core_mod._WRITE_DELIVERED
    assert core_mod._WRITE_DELIVERED.endswith(f"state={int(core_mod._UNDELIVERED)}")


def test_inquiries_ask_only_targets_with_room_in_the_snapshot(core: PlatformCore, monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.platform.core as core_mod

    t = [1_000_000]
    monkeypatch.setattr(core_mod, "now_ms", lambda: t[0])
    a, b = Endpoint.org(A), Endpoint.org(B)
    core.handle(a, _raw(_data(a, b, 1)), {})
    assert core.claim_stored(b, 10)[1] == 1
    t[0] += 3_600_000
    assert core.inquiries({}) == {}  # offline
    assert core.inquiries({b: 0}) == {}  # its queue full
    sends = core.inquiries({b: 1 << 20})
    d = FrameDecoder()
    d.receive_data(b"".join(sends[b]))
    body = next(iter(d)).frame().body
    assert isinstance(body, Inquiry) and [lk.record_id for lk in body.items] == [1]


# ---------------------------------------------------------------- daemon side


def _daemon(sessions: dict[Endpoint, int], high_water: int = 1000) -> PlatformDaemon:
    d = PlatformDaemon(None, PlatformSettings(high_water=high_water))  # type: ignore[arg-type]
    for ep, queued in sessions.items():
        s = Session(ep, None, 16)  # type: ignore[arg-type]
        s.queued = queued
        d.sessions[ep] = s
    return d


class _Msg:
    def __init__(self, target: Endpoint) -> None:
        self.target = target


def test_the_room_snapshot_is_data_taken_on_the_event_loop() -> None:
    a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
    d = _daemon({a: 0, b: 400, c: 1200})
    room: Room = d._room()
    assert dict(room) == {a: 1000, b: 600, c: -200}
    with pytest.raises(TypeError):
        room[a] = 5  # type: ignore[index]  # frozen
    d.sessions[b].queued = 0
    assert room[b] == 600  # a snapshot: later changes are not seen
    # More sessions than frames: only the batch's targets.
    assert dict(d._room([_Msg(b), _Msg(Endpoint.org("99999"))])) == {b: 1000}  # type: ignore[list-item]


async def test_the_forward_port_hands_frames_from_the_store_thread_to_the_event_loop() -> None:
    b = Endpoint.org(B)
    send, recv = trio.open_memory_channel[Mapping[Endpoint, list[bytes]]](math.inf)
    port = ForwardPort(trio.lowlevel.current_trio_token(), send)
    await trio.to_thread.run_sync(port.put, {b: [b"one"]})
    await trio.to_thread.run_sync(port.put, {b: [b"two"]})
    with trio.fail_after(5):
        assert [await recv.receive(), await recv.receive()] == [{b: [b"one"]}, {b: [b"two"]}]  # in order
    await send.aclose()
    await trio.to_thread.run_sync(port.put, {b: [b"late"]})  # closed: dropped, nothing raised
    await trio.sleep(0.01)


def test_the_forward_port_of_a_stopped_relay_drops_quietly() -> None:
    async def make() -> ForwardPort:
        send, _recv = trio.open_memory_channel[Mapping[Endpoint, list[bytes]]](math.inf)
        return ForwardPort(trio.lowlevel.current_trio_token(), send)

    port = trio.run(make)
    port.put({Endpoint.org(B): [b"x"]})  # the event loop is gone: as a broken connection


async def test_the_daemons_sessions_drain_the_port_into_their_targets_queues() -> None:
    a, b = Endpoint.org(A), Endpoint.org(B)
    d = _daemon({a: 0, b: 0})
    port = d._forwarder()
    assert d._forwarder() is port  # one per daemon
    async with trio.open_nursery() as nursery:
        nursery.start_soon(d._drain_forwards)
        nursery.start_soon(d._drain_forwards)  # a second session's: waits its turn
        await trio.to_thread.run_sync(port.put, {b: [b"1", b"22"]})
        await trio.to_thread.run_sync(port.put, {a: [b"333"], b: [b"4"]})
        with trio.fail_after(5):
            while d.sessions[b].queued < 4:
                await trio.sleep(0.001)
        assert d.sessions[b].queue == [b"1", b"22", b"4"] and d.sessions[a].queue == [b"333"]
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- the SQL

# A state or kind compared with, or set to, a bare number; and an INSERT
# whose VALUES hold one (a state or kind written as a literal).
_BARE = re.compile(r"\b(?:state|kind)\s*(?:=|!=|<>|<=|>=|<|>|\bIN\b)\s*\(?\s*\d", re.IGNORECASE)
_VALUES_DIGIT = re.compile(r"VALUES\s*\((?:[^)]*[,\s])?\d+\s*[,)]", re.IGNORECASE)


def test_no_sql_in_the_platform_names_a_state_or_kind_by_a_bare_number() -> None:
    found = []
    for path in sorted(PLATFORM_DIR.glob("*.py")):
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if _BARE.search(line) or _VALUES_DIGIT.search(line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "name states and kinds through their IntEnums:\n" + "\n".join(found)


def test_the_bare_number_check_finds_what_it_looks_for() -> None:
    for bad in ('"UPDATE stored SET state=1 WHERE id=?"', '" WHERE kind = 1 AND x"', '"state!=3"',
                '" VALUES (?,?,?,1,?)"', '"VALUES (0, ?)"', '" AND state IN (1, 3)"'):
        assert _BARE.search(bad) or _VALUES_DIGIT.search(bad), bad
    for good in ('f"UPDATE stored SET state={_DONE} WHERE id=?"', '" VALUES (?,?,?)"', '"state=?"',
                 'f"kind={_DATA} AND"', '"inquiries=inquiries+1"'):
        assert not (_BARE.search(good) or _VALUES_DIGIT.search(good)), good


def test_a_savefwd1_copy_sent_again_after_it_was_forwarded_is_answered_forwarded(core: PlatformCore) -> None:
    """SaveFwd 1: forwarded while B was online; the origin lost the ACK_FWD
    (a crash) and sends it again while B is offline. The platform says
    forwarded again (the origin then asks B), never dropped: dropped would
    report a delivered document lost. A copy it never forwarded is dropped."""
    from semq.umxt_protocol import LK0, Data, Nack

    a, b = Endpoint.org(A), Endpoint.org(B)

    def sf1(rid: int) -> Any:
        return _raw(Frame(kind=Kind.DATA, source=a, target=b, save_fwd=1,
                          body=Data(lk0=LK0(endpoint=a, record_id=rid), app_data=b"x")))

    out = core.handle(a, sf1(7), {b: 1 << 30})
    assert _kinds(out.sends[a]) == [(Kind.ACK_BATCH, Kind.ACK_FWD)]
    out = core.handle(a, sf1(7) + sf1(8), {})  # B offline now
    frames = FrameDecoder()
    frames.receive_data(b"".join(out.sends[a]))
    bodies = [r.frame().body for r in frames]
    assert [e.dest_ref_id for x in bodies if isinstance(x, AckBatch) for e in x.entries] == [7]
    assert [(n.lk0.record_id, n.code.name) for n in bodies if isinstance(n, Nack)] == [(8, "TARGET_OFFLINE_DROPPED")]
