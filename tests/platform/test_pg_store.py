"""The platform core on PostgreSQL (a real server: SEMQ_TEST_PG, or a
throwaway cluster the session starts): the same routing, storing, claiming
and acking as on SQLite, the SQL rewritten for PostgreSQL, and what only
several instances on one store need: presence with epochs that fence a
stale instance, and the wake-up of the instance holding a target."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from semq.platform.cluster import HOP_MAX_FRAME, WakeListener
from semq.platform.core import PlatformCore
from semq.platform.engine import StoredState
from semq.store.db import StoreError
from semq.store.pg import translate_sql
from semq.umxt_protocol import LK0, Ack, AckFlag, Data, Endpoint, Frame, Kind, SaveFwd
from tests._frames import decoded, raws
from tests.platform.test_platform_store import _acks, _data, _saved

A, B, C = "10008", "56001", "56002"
a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)


@pytest.fixture
def pair(pg_url: str) -> Iterator[tuple[PlatformCore, PlatformCore]]:
    """Two instances of one platform on one PostgreSQL store."""
    one = PlatformCore(pg_url, create=True, instance="one")
    two = PlatformCore(pg_url, instance="two")
    one.register([A, B, C])
    one.join_cluster("127.0.0.1:1")
    two.join_cluster("127.0.0.1:2")
    yield one, two
    one.close()
    two.close()


@pytest.fixture
def listener(pg_url: str) -> Iterator[WakeListener]:
    """Instance two's wake-up listener, listening before anything is sent."""
    it = WakeListener(pg_url, "two")
    assert it.wait(0.05) == []
    yield it
    it.close()


def _rows(core: PlatformCore) -> list[tuple[int, int, int]]:
    return [tuple(r) for r in core.conn.execute("SELECT id, kind, state FROM stored ORDER BY id").fetchall()]


def test_sqlite_statements_are_rewritten_for_postgresql() -> None:
    assert translate_sql("SELECT id FROM stored WHERE id=? AND +target_id=?") == \
        "SELECT id FROM stored WHERE id=%s AND target_id=%s"
    assert translate_sql("INSERT OR IGNORE INTO nodes (a) VALUES (?)").endswith("ON CONFLICT DO NOTHING")
    assert "ON CONFLICT (origin_type, origin_id, semq_id, semq_db_id, record_id) DO UPDATE" in \
        translate_sql("INSERT OR REPLACE INTO seen VALUES (?,?)")
    assert "INDEXED BY" not in translate_sql("SELECT 1 FROM stored INDEXED BY stored_sent WHERE x LIKE '5%'")
    assert "'5%%'" in translate_sql("SELECT 1 FROM t WHERE x LIKE '5%'")


def test_an_uninitialized_database_is_refused_with_the_command_to_run(pg_url: str) -> None:
    with pytest.raises(StoreError, match=r"no platform store in .*semq platform init --store"):
        PlatformCore(pg_url)


def test_an_unreachable_server_is_one_line() -> None:
    with pytest.raises(StoreError, match="cannot be reached"):
        PlatformCore("postgresql://nobody:secret@127.0.0.1:9/none")


def test_store_deliver_ack_on_postgresql(pg_url: str) -> None:
    core = PlatformCore(pg_url, create=True)
    core.register([A, B])
    try:
        out = core.handle(a, raws(_data(a, b, 1), _data(a, b, 2), _data(a, b, 1)), {})
        saved = _saved(out.sends[a])
        assert [r for r, _ in saved] == [1, 2, 1]
        assert saved[0][1] == saved[2][1]  # a resend in the batch: the same LK1
        lk1s = sorted({lk1 for _, lk1 in saved})
        assert [(i, s) for i, _, s in _rows(core)] == [(lk1s[0], 0), (lk1s[1], 0)]
        assert core.connected(b)
        frames, n = core.claim_stored(b, 10)
        assert n == 2 and len(frames) == 2
        core.handle(b, _acks(b, lk1s), {})
        assert _rows(core) == []
        # the inquiry about it: stored, delivered, acked -> RECEIVED (from `seen`)
        row = core.conn.execute("SELECT action, lk1 FROM seen WHERE record_id=?", (1,)).fetchone()
        assert tuple(row) == (2, lk1s[0])
        assert core.housekeeping() == 0
        assert core.counts()["stored"] == {}
    finally:
        core.close()


def test_a_document_for_a_target_held_by_another_instance_is_handed_over_at_commit(
        pair: tuple[PlatformCore, PlatformCore], listener: WakeListener) -> None:
    one, two = pair
    assert two.connected(b)  # B is connected to instance two
    # A (on instance one) sends with SaveFwd 1: B is not here, but is
    # held by a live instance: handed to it one hop, ACK_FWD as for a
    # connection here, nothing stored.
    out = one.handle(a, raws(replace(_data(a, b, 7), save_fwd=SaveFwd(1))), {})
    assert _kinds(out.sends[a]) == [Kind.ACK_BATCH] and _saved(out.sends[a]) == []
    got = listener.wait(5.0)
    assert [ep for ep, _ in got] == [b]
    (frame,) = decoded(got[0][1] or b"")
    assert frame.kind is Kind.DATA and frame.source == one.me and frame.data_prefix()[0].record_id == 7
    assert _rows(one) == []
    assert one.conn.execute("SELECT action FROM seen WHERE record_id=7").fetchone()[0] == 1  # forwarded


def test_a_frame_too_large_for_a_hop_is_stored_and_the_holder_woken(
        pair: tuple[PlatformCore, PlatformCore], listener: WakeListener) -> None:
    one, two = pair
    assert two.connected(b)
    big = Frame(kind=Kind.DATA, source=a, target=b,
                body=Data(lk0=LK0(endpoint=a, record_id=8), app_data=b"x" * (HOP_MAX_FRAME + 1)))
    out = one.handle(a, raws(big), {})
    assert [r for r, _ in _saved(out.sends[a])] == [8]  # ACK_SAVE
    assert listener.wait(5.0) == [(b, None)]  # a wake-up, no frame
    _, n = two.claim_stored(b, 10)
    assert n == 1
    assert one.claim_stored(b, 10) == ([], 0)  # instance one may not claim B's copies: two holds B


def test_a_newer_connection_elsewhere_fences_the_older_instance(pair: tuple[PlatformCore, PlatformCore]) -> None:
    one, two = pair
    assert one.connected(b)
    one.handle(a, raws(_data(a, c, 1)), {})  # (C offline: stored)
    one.handle(a, raws(_data(a, b, 2), _data(a, b, 3)), {})  # B held by one but not in its room: stored
    assert two.connected(b)  # B reconnects to instance two; one has not noticed
    assert one.claim_stored(b, 10) == ([], 0)  # fenced: one delivers nothing more to B
    waiting, fenced = one.cluster_tick()
    assert fenced == [b] and b not in waiting
    waiting, fenced = two.cluster_tick()
    assert waiting == [b] and fenced == []
    _, n = two.claim_stored(b, 10)
    assert n == 2
    # one's late disconnect does not remove two's presence
    one.disconnected(b)
    assert two.presence is not None and two.presence.holds(b)
    assert one.presence is not None and one.presence.elsewhere(b) == "two"


def test_a_dead_instance_holds_nobody(pair: tuple[PlatformCore, PlatformCore]) -> None:
    one, two = pair
    assert two.connected(b)
    two.conn.execute("UPDATE instances SET heartbeat_ms=0 WHERE id='two'")  # its heartbeat stopped
    assert one.presence is not None
    one.presence._where.clear()
    # SaveFwd 1 to a target whose instance is gone: offline, dropped (NACK) as on one platform
    out = one.handle(a, raws(replace(_data(a, b, 9), save_fwd=SaveFwd(1))), {})
    assert _saved(out.sends[a]) == [] and _kinds(out.sends[a]) == [Kind.NACK]
    assert one.presence.elsewhere(b) is None


def test_claims_skip_rows_another_transaction_holds(pair: tuple[PlatformCore, PlatformCore], pg_url: str) -> None:
    import psycopg

    one, _two = pair
    one.handle(a, raws(_data(a, b, 1), _data(a, b, 2)), {})
    assert one.connected(b)
    first = _rows(one)[0][0]
    with psycopg.connect(pg_url) as other:  # another instance's claim, in flight
        other.execute("SELECT id FROM stored WHERE id=%s FOR UPDATE", (first,))
        _, n = one.claim_stored(b, 10)
        assert n == 1  # the locked one is skipped, not waited for
        other.rollback()
    one.write_held_now()
    states = {i: s for i, _, s in _rows(one)}
    assert states[first] == StoredState.SS_INIT and StoredState.SS_SENT in states.values()


def test_relayed_frames_to_another_instances_target_are_handed_over(
        pair: tuple[PlatformCore, PlatformCore], listener: WakeListener) -> None:
    one, two = pair
    assert two.connected(a)
    ack2 = Frame(kind=Kind.ACK2, source=b, target=a, body=Ack(dest_ref_id=5, ack_flag=AckFlag.DELIVERY))
    one.handle(b, raws(ack2), {})
    ((ep, frame),) = listener.wait(5.0)  # handed over, not stored
    assert ep == a and [r.kind for r in decoded(frame or b"")] == [Kind.ACK2]
    assert _rows(one) == []


def _kinds(data: list[bytes]) -> list[Kind]:
    return [r.kind for r in decoded(data)]


async def test_frames_handed_over_go_to_their_sessions_or_are_stored() -> None:
    """The receiving instance: into the target's queue like a forward of its
    own; for a target no longer here or over its high-water mark, stored (in
    one call of its store thread) and the target woken."""
    from tests.platform.test_platform_core import _daemon

    class Core:
        calls: list[list[bytes]] = []

        def store_handed_over(self, frames: list[bytes]) -> set[Endpoint]:
            self.calls.append(list(frames))
            return {b}

    d = _daemon({a: 0, b: 2000}, high_water=1000)
    d.core = Core()  # type: ignore[assignment]
    await d._hopped([(a, b"one"), (b, b"full"), (c, b"gone"), (a, b"two")])
    assert d.sessions[a].queue == [b"one", b"two"] and d.sessions[b].queue == []
    assert Core.calls == [[b"full", b"gone"]]
    assert d.stats["hops_in"] == 2 and d.stats["hops_stored"] == 2 and "hops_dropped" not in d.stats
    assert d.sessions[b].pending and d.sessions[b].wake_deliver.is_set()


async def test_a_savefwd1_document_handed_over_for_a_target_gone_is_dropped_not_stored() -> None:
    """SaveFwd 1 is forwarded now or dropped: its origin has its ACK_FWD and
    asks the target, which answers that it lacks it (reported dropped, 301).
    Stored, the copy would reach the target after that answer: delivered,
    yet reported dropped (scripts/chaos --platforms 2 --store postgresql)."""
    from semq.umxt_protocol import encode_frame
    from tests.platform.test_platform_core import _daemon

    class Core:
        calls: list[list[bytes]] = []

        def store_handed_over(self, frames: list[bytes]) -> set[Endpoint]:
            self.calls.append(list(frames))
            return {c}

    sf1 = encode_frame(replace(_data(a, c, 1), save_fwd=SaveFwd.DISCARD))
    sf2 = encode_frame(replace(_data(a, c, 2), save_fwd=SaveFwd.STORE))
    d = _daemon({a: 0}, high_water=1000)
    d.core = Core()  # type: ignore[assignment]
    await d._hopped([(c, sf1), (c, sf2)])
    assert Core.calls == [[sf2]]
    assert d.stats["hops_dropped"] == 1 and d.stats["hops_stored"] == 1


def test_frames_an_instance_cannot_deliver_are_stored_and_the_origin_learns_it(
        pair: tuple[PlatformCore, PlatformCore], listener: WakeListener) -> None:
    one, two = pair
    assert two.connected(b)
    ack2 = Frame(kind=Kind.ACK2, source=b, target=a, body=Ack(dest_ref_id=5, ack_flag=AckFlag.DELIVERY))
    out = one.handle(a, raws(_data(a, b, 11)), {})
    assert _saved(out.sends[a]) == []  # ACK_FWD: handed over
    got = listener.wait(5.0)
    # instance two cannot deliver it now (say B's queue is full): stored for B
    stored_for = two.store_handed_over([f for _, f in got if f is not None])
    assert stored_for == {b}
    rows = _rows(two)
    assert [(k, st) for _, k, st in rows] == [(int(Kind.DATA), int(StoredState.SS_INIT))]
    lk1 = rows[0][0]
    # the origin's inquiry now learns STORED with the copy's LK1
    assert tuple(two.conn.execute("SELECT action, lk1 FROM seen WHERE record_id=11").fetchone()) == (2, lk1)
    frames, n = two.claim_stored(b, 10)
    assert n == 1 and decoded(frames)[0].data_prefix()[0].record_id == 11
    # relayed frames too
    assert two.store_handed_over([raws(ack2)[0].raw]) == {a}
    assert [k for _, k, _ in _rows(two)][-1] == int(Kind.ACK2)


def test_array_literals_round_trip_through_postgresql(pg_url: str) -> None:
    import psycopg

    from semq.store.pg import pg_array

    odd = ["56001", 'a"b', "c\\d", "e,f", "{g}", ""]
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT %s::text[]", (pg_array(odd),)).fetchone()[0] == odd
        assert c.execute("SELECT %s::bigint[]", (pg_array([1, 2**40, -3]),)).fetchone()[0] == [1, 2**40, -3]


def test_an_instance_with_another_certificate_authority_is_refused(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An operator's mistake: a second `semq platform init` on the same store
    instead of a copy of the first directory. Its CA differs: refused with
    one line before it serves, and the store keeps the first CA's files."""
    from semq.cli import main as semq_main
    from tests.cli.test_cli import one_error

    assert semq_main(["platform", "init", "--dir", str(tmp_path / "P"), "--store", pg_url]) == 0
    core = PlatformCore(pg_url)
    try:
        core.share_ca(tmp_path / "P" / "ca")  # the first directory's CA is the platform's
    finally:
        core.close()
    # a second init on the store made by the first refuses nothing yet (an empty store is fine) ...
    assert semq_main(["platform", "init", "--dir", str(tmp_path / "Q"), "--store", pg_url]) == 0
    capsys.readouterr()
    # ... but running it is refused, naming the cause
    rc = semq_main(["platform", "run", "--dir", str(tmp_path / "Q"), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert rc != 0
    one_error(err, "is not this platform's", "copy of the same platform directory")


def test_whatever_else_is_notified_on_an_instances_channel_is_skipped(
        pair: tuple[PlatformCore, PlatformCore], pg_url: str, listener: WakeListener) -> None:
    """Anyone who may NOTIFY in the database can write on an instance's
    channel: lines that are not a wake-up or a frame are skipped (the rest of
    the notification still counts), never fatal to the listener."""
    import psycopg

    from semq.platform.cluster import channel

    with psycopg.connect(pg_url, autocommit=True) as c:
        junk = "\n".join(["X 1 56001", "F 1 56001 !!!notbase64", "W nine 56001", "F 99 56001 AAAA", "W 1",
                          "W 1 56001"])
        c.execute("SELECT pg_notify(%s, %s)", (channel("two").strip('"'), junk))
    assert listener.wait(5.0) == [(b, None)]


async def test_bytes_handed_over_that_are_no_frame_cost_the_batch_not_the_instance() -> None:
    from semq.umxt_protocol import RemoteProtocolError, ResultCode
    from tests.platform.test_platform_core import _daemon

    class Core:
        def store_handed_over(self, frames: list[bytes]) -> set[Endpoint]:
            raise RemoteProtocolError("not a frame", ResultCode.MALFORMED_FRAME)

    d = _daemon({}, high_water=1000)
    d.core = Core()  # type: ignore[assignment]
    await d._hopped([(b, b"garbage")])
    assert d.stats["hops_dropped"] == 1
