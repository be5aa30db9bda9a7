"""The relay's answer to PRESENCE_QUERY over a session (memory streams, a
fake clock): an organization asks about the partners it names and is told
online / offline / unknown, nothing more; a flood of queries is answered
once every 2 s, the rest ignored (docs/security.md "What presence tells")."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from semq.umxt_protocol import (
    Endpoint,
    Frame,
    Hello,
    Kind,
    Presence,
    PresenceQuery,
    PresenceState,
    encode_frame,
)
from tests._memwire import A, B, C, InlineGate, Peer, platform, platform_core, wait_for

P = Endpoint.platform()


async def test_a_flood_of_presence_queries_gets_one_answer_every_two_seconds(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    pcore = platform_core(tmp_path)
    pcore.register([A, B, C])
    p = platform(pcore)
    p.gate = InlineGate()
    asker, partner = Endpoint.org(A), Endpoint.org(B)
    query = encode_frame(Frame(kind=Kind.PRESENCE_QUERY, source=asker, target=P,
                               body=PresenceQuery(orgs=(B, C, "99999"))))
    async with trio.open_nursery() as nursery:
        a, b = Peer(), Peer()
        nursery.start_soon(p._handle, b.pair())
        await b.send(Frame(kind=Kind.HELLO, source=partner, target=P, body=Hello()))
        await b.read_until(lambda: bool(b.frames(Kind.WELCOME)))
        nursery.start_soon(p._handle, a.pair())
        await a.send(Frame(kind=Kind.HELLO, source=asker, target=P, body=Hello()))
        await a.read_until(lambda: bool(a.frames(Kind.WELCOME)))
        await a.send(query * 20)
        await a.read_until(lambda: len(a.frames(Kind.PRESENCE)) == 1)
        await wait_for(lambda: p.stats.get("presence_ignored") == 19, "the rest of the flood ignored")
        await trio.sleep(2.1)
        await a.send(query)
        await a.read_until(lambda: len(a.frames(Kind.PRESENCE)) == 2)
        nursery.cancel_scope.cancel()
    answer = a.frames(Kind.PRESENCE)[0].frame.body
    assert isinstance(answer, Presence)
    online, never, unknown = answer.entries
    assert (online.org, online.state) == (B, PresenceState.ONLINE) and online.since_ms > 0
    assert (never.org, never.state, never.since_ms, never.last_seen_ms) == (C, PresenceState.OFFLINE, 0, 0)
    assert (unknown.org, unknown.state, unknown.since_ms, unknown.last_seen_ms) == (
        "99999", PresenceState.UNKNOWN, 0, 0)
    pcore.close()
