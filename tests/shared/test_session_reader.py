"""The session layer's one reader (semq.session.reader), over memory
streams with trio's fake clock: message frames reach the role in whole
batches, the session kinds are answered once here, a role's handlers and
screen see what they registered for, and silence ends the session."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from semq.session.early import EarlySends
from semq.session.reader import SessionIdle, SessionReader, first_exception, ping_every
from semq.session.transport import ConnectionClosed, FrameStream
from semq.umxt_protocol import (
    LK0,
    Bye,
    Crl,
    Data,
    Endpoint,
    Error,
    Frame,
    FrameDecoder,
    Kind,
    Ping,
    Pong,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
)

ME, PEER = Endpoint.org("10008"), Endpoint.platform()


def _data(i: int, source: Endpoint = PEER) -> bytes:
    return encode_frame(Frame(kind=Kind.DATA, source=source, target=ME,
                              body=Data(lk0=LK0(endpoint=Endpoint.org("56001"), record_id=i), app_data=b"x")))


def _frame(kind: Kind, body: object, source: Endpoint = PEER) -> bytes:
    return encode_frame(Frame(kind=kind, source=source, target=ME, body=body))  # type: ignore[arg-type]


class _Role:
    """What a role registers, recording what reached it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.screened = 0

    async def messages(self, msgs: list[RawFrame]) -> None:
        self.batches.append([m.data_prefix()[0].record_id for m in msgs])


def _pair() -> tuple[trio.abc.Stream, FrameStream]:
    theirs, ours = trio.testing.memory_stream_pair()
    return theirs, FrameStream(ours)


def _received(data: bytes) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(data)
    return list(dec)


async def test_a_batch_of_messages_reaches_the_role_in_one_call_and_a_ping_is_answered(
        autojump_clock: trio.testing.MockClock) -> None:
    theirs, fs = _pair()
    role = _Role()
    reader = SessionReader(fs, me=ME, peer=PEER, name="platform", messages=role.messages, idle=45)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run, _received(_data(1)))  # a frame that came with the handshake
            await trio.testing.wait_all_tasks_blocked()
            await theirs.send_all(b"".join([_data(2), _frame(Kind.PING, Ping(nonce=7)), _data(3), _data(4)]))
            pong = _received(await theirs.receive_some())
            await theirs.send_all(_frame(Kind.BYE, Bye()))  # (BYE has no body)
    assert isinstance(first_exception(caught.value), ConnectionClosed)
    assert str(first_exception(caught.value)) == "platform said BYE"
    assert role.batches == [[1], [2, 3, 4]]  # one call per batch, the PING taken out
    assert [r.kind for r in pong] == [Kind.PONG]
    body = pong[0].frame().body
    assert isinstance(body, Pong) and body.nonce == 7 and pong[0].source == ME and pong[0].target == PEER


async def test_silence_ends_the_session_after_its_idle_time(autojump_clock: trio.testing.MockClock) -> None:
    theirs, fs = _pair()
    role = _Role()
    reader = SessionReader(fs, me=ME, peer=PEER, name="platform", messages=role.messages, idle=45)
    t0 = trio.current_time()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run)
            await trio.sleep(30)
            await theirs.send_all(_data(1))  # traffic: the 45 s start again
    idle = first_exception(caught.value)
    assert isinstance(idle, SessionIdle) and isinstance(idle, trio.TooSlowError)
    assert trio.current_time() - t0 == pytest.approx(75)
    assert role.batches == [[1]]


async def test_an_error_is_logged_unless_the_role_asks_not_to(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    for log_errors in (True, False):
        caplog.clear()
        theirs, fs = _pair()
        reader = SessionReader(fs, me=ME, peer=PEER, name="platform", messages=_Role().messages,
                               log_errors=log_errors)
        with caplog.at_level(logging.WARNING, "semq.session"), trio.move_on_after(1):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader.run)
                await theirs.send_all(_frame(Kind.ERROR, Error(code=ResultCode.QUOTA_EXCEEDED, message="full")))
        said = [r.getMessage() for r in caplog.records]
        assert said == ([f"platform says QUOTA_EXCEEDED ({int(ResultCode.QUOTA_EXCEEDED)}): full"] if log_errors else [])


async def test_a_role_handler_may_hand_back_messages_and_a_screen_sees_the_whole_batch(
        autojump_clock: trio.testing.MockClock) -> None:
    theirs, fs = _pair()
    role = _Role()
    held = _received(_data(9))
    seen: list[int] = []

    async def screen(batch: list[RawFrame]) -> list[RawFrame]:
        seen.append(len(batch))
        return [r for r in batch if not (r.kind is Kind.DATA and r.data_prefix()[0].record_id == 2)]

    async def release(_raw: RawFrame) -> list[RawFrame]:
        return held

    reader = SessionReader(fs, me=ME, peer=PEER, name="platform", messages=role.messages, screen=screen,
                           handlers={Kind.CRL: release})
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run)
            await theirs.send_all(b"".join([_data(1), _data(2), _frame(Kind.CRL, Crl(der=b"x")), _data(3)]))
    assert seen == [4]
    assert role.batches == [[9, 1, 3]]  # released ahead of the batch's own; 2 screened out


async def test_a_screen_may_end_the_session() -> None:
    theirs, fs = _pair()

    async def only_from_peer(batch: list[RawFrame]) -> list[RawFrame]:
        for raw in batch:
            if raw.source != PEER:
                raise RemoteProtocolError(f"{raw.source} on the link of {PEER}", ResultCode.SOURCE_MISMATCH)
        return batch

    reader = SessionReader(fs, me=ME, peer=PEER, name="platform", messages=_Role().messages, screen=only_from_peer)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run)
            await theirs.send_all(_data(1, source=Endpoint.org("77002")))
    e = first_exception(caught.value)
    assert isinstance(e, RemoteProtocolError) and e.code is ResultCode.SOURCE_MISMATCH


def test_the_session_kinds_are_the_readers() -> None:
    _, fs = _pair()

    async def mine(_raw: RawFrame) -> None:
        return None

    with pytest.raises(ValueError, match="PING"):
        SessionReader(fs, me=ME, peer=PEER, name="platform", messages=_Role().messages, handlers={Kind.PING: mine})


async def test_ping_every_pings_at_its_interval(autojump_clock: trio.testing.MockClock) -> None:
    theirs, fs = _pair()
    got: list[RawFrame] = []
    with trio.move_on_after(35):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping_every, fs, ME, PEER, 10.0)
            while True:
                got += _received(await theirs.receive_some())
    pings = [r.frame().body for r in got]
    assert [p.nonce for p in pings if isinstance(p, Ping)] == [1, 2, 3] and len(pings) == 3


async def test_early_sends_write_in_order_and_drop_what_comes_after_their_session() -> None:
    theirs, fs = _pair()
    async with trio.open_nursery() as nursery:
        port = EarlySends()
        nursery.start_soon(port.run, fs)
        await trio.to_thread.run_sync(port.put, [_data(1), _data(2)])  # from another thread, as the store's
        await trio.to_thread.run_sync(port.put, [_data(3)])
        got: list[RawFrame] = []
        while len(got) < 3:
            got += _received(await theirs.receive_some())
        nursery.cancel_scope.cancel()
    assert [r.data_prefix()[0].record_id for r in got] == [1, 2, 3]
    port.put([_data(4)])  # the session is over: dropped, never raised
    await trio.testing.wait_all_tasks_blocked()
