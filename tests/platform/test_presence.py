"""What the platform tells a node that asks whether organizations are
online (PRESENCE_QUERY, docs/security.md "What presence tells"): only
the organizations named, at most MAX_PRESENCE_ITEMS of them; an unknown or
revoked one is UNKNOWN and nothing more; online since its connection
began, offline since it was last seen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.platform.core import PlatformCore
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    MAX_PRESENCE_ITEMS,
    Endpoint,
    LocalProtocolError,
    PresenceEntry,
    PresenceQuery,
    PresenceState,
)

A, B, C = "10008", "56001", "77000"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[PlatformCore]:
    c = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    c.register([A, B, C])
    yield c
    c.close()


def test_online_offline_and_unknown_are_all_it_says(core: PlatformCore) -> None:
    t0 = now_ms()
    assert core.connected(Endpoint.org(B))
    core.disconnected(Endpoint.org(B))  # B was here and left: offline since then
    t1 = now_ms()
    core.revoke(C)
    answer = core.presence_of([B, A, C, "99999"], {A: t0})
    by = {e.org: e for e in answer.entries}
    assert [e.org for e in answer.entries] == [B, A, C, "99999"]  # one per name asked, in order
    assert by[A].state is PresenceState.ONLINE and by[A].since_ms == t0
    assert by[B].state is PresenceState.OFFLINE and t0 <= by[B].since_ms <= t1
    assert by[B].last_seen_ms == by[B].since_ms
    # Revoked, or never registered: the same answer, and nothing else told.
    for org in (C, "99999"):
        assert by[org] == PresenceEntry(org, PresenceState.UNKNOWN, 0, 0)


def test_an_organization_never_seen_is_offline_since_never(core: PlatformCore) -> None:
    (e,) = core.presence_of([C], {}).entries
    assert e == PresenceEntry(C, PresenceState.OFFLINE, 0, 0)


def test_a_query_names_one_to_max_organizations_no_more() -> None:
    PresenceQuery(orgs=tuple(str(70000 + i) for i in range(MAX_PRESENCE_ITEMS)))
    with pytest.raises(LocalProtocolError, match=f"65 organizations is outside 1..{MAX_PRESENCE_ITEMS}"):
        PresenceQuery(orgs=tuple(str(70000 + i) for i in range(MAX_PRESENCE_ITEMS + 1)))
    with pytest.raises(LocalProtocolError, match="0 organizations"):
        PresenceQuery(orgs=())
    with pytest.raises(LocalProtocolError, match="organization 'a b'"):
        PresenceQuery(orgs=("a b",))


def test_a_clustered_platform_tells_who_is_online_at_another_instance(pg_url: str) -> None:
    """Two instances on one PostgreSQL store: B connected to instance one
    (one of its units, B:2, too) is online at instance two's answer, since
    its earliest connection; gone from one, it is offline since then."""
    from semq.umxt_protocol.units import route_of

    one = PlatformCore(pg_url, create=True, instance="one")
    two = PlatformCore(pg_url, instance="two")
    try:
        one.register([A, B])
        one.join_cluster("127.0.0.1:1")
        two.join_cluster("127.0.0.1:2")
        t0 = now_ms()
        assert one.connected(route_of(Endpoint.org(B), 2), 2)
        assert one.connected(Endpoint.org(B), 2)
        (e,) = two.presence_of([B], {}).entries
        assert e.state is PresenceState.ONLINE and t0 <= e.since_ms <= now_ms()
        one.disconnected(route_of(Endpoint.org(B), 2))
        one.disconnected(Endpoint.org(B))
        (e,) = two.presence_of([B], {}).entries
        assert e.state is PresenceState.OFFLINE and t0 <= e.since_ms <= now_ms()
    finally:
        one.close()
        two.close()
