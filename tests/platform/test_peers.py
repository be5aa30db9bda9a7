"""The platform as a directory of direct links (semq.platform.peers): what
an announcement records, and who learns it — on the SQLite store and shared
by two instances on one PostgreSQL store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.platform.core import PlatformCore
from semq.platform.peers import observed_addresses
from semq.umxt_protocol import Endpoint, LocalProtocolError, PeerAnnounce, ResultCode

A, B, C = "10008", "56001", "56002"
a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)


@pytest.fixture
def core(tmp_path: Path) -> Iterator[PlatformCore]:
    it = PlatformCore(tmp_path / "p.sqlite", create=True)
    it.register([A, B, C])
    yield it
    it.close()


def test_observed_host_is_added_with_each_announced_port() -> None:
    ann = PeerAnnounce(ttl_s=60, addresses=("10.0.0.5:7500", "0.0.0.0:7501"), observe=True)
    assert observed_addresses(ann, "203.0.113.7") == ["10.0.0.5:7500", "0.0.0.0:7501", "203.0.113.7:7500",
                                                      "203.0.113.7:7501"]
    assert observed_addresses(ann, "2001:db8::1")[2] == "[2001:db8::1]:7500"
    plain = PeerAnnounce(ttl_s=60, addresses=("10.0.0.5:7500",))
    assert observed_addresses(plain, "203.0.113.7") == ["10.0.0.5:7500"]  # not asked to
    many = PeerAnnounce(ttl_s=60, addresses=tuple(f"10.0.0.{i}:7500" for i in range(8)), observe=True)
    assert len(observed_addresses(many, "203.0.113.7")) == 8


def test_lookup_answers_the_announced_addresses_with_the_fingerprint(core: PlatformCore) -> None:
    assert core.lookup_peer(a, b).code is ResultCode.NO_DIRECT_ADDRESS  # nothing announced
    core.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",), observe=True), "192.0.2.9", "ab" * 32)
    info = core.lookup_peer(a, b)
    assert info.code is ResultCode.OK
    assert info.addresses == ("127.0.0.1:7500", "192.0.2.9:7500")
    assert info.fingerprint == "ab" * 32 and info.expires_ms > 0
    assert [d["node"] for d in core.counts()["direct"]] == [B]


def test_only_allowed_organizations_learn_the_addresses(core: PlatformCore) -> None:
    core.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",), allowed=(A,)), None, "")
    assert core.lookup_peer(a, b).addresses == ("127.0.0.1:7500",)
    refused = core.lookup_peer(c, b)
    assert refused.code is ResultCode.DIRECT_NOT_ALLOWED and refused.addresses == () and refused.fingerprint == ""


def test_expired_and_withdrawn_announcements_answer_no_address(core: PlatformCore) -> None:
    core.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",)), None, "")
    core.conn.execute("UPDATE peers SET expires_ms=1")
    assert core.lookup_peer(a, b).code is ResultCode.NO_DIRECT_ADDRESS
    core.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",)), None, "")
    assert core.lookup_peer(a, b).code is ResultCode.OK
    core.announce_peer(b, PeerAnnounce(ttl_s=0), None, "")  # withdrawn
    assert core.lookup_peer(a, b).code is ResultCode.NO_DIRECT_ADDRESS


def test_unknown_organizations_are_not_looked_up(core: PlatformCore) -> None:
    assert core.lookup_peer(a, Endpoint.org("99999")).code is ResultCode.UNKNOWN_TARGET


def test_an_announcement_is_validated_when_built() -> None:
    with pytest.raises(LocalProtocolError, match="allowed organization '1111"):
        PeerAnnounce(ttl_s=60, allowed=("1" * 65,))
    with pytest.raises(LocalProtocolError, match="not one text"):
        PeerAnnounce(ttl_s=60, addresses="127.0.0.1:1")  # type: ignore[arg-type]


def test_instances_on_one_postgresql_store_share_the_directory(pg_url: str) -> None:
    one = PlatformCore(pg_url, create=True, instance="one")
    two = PlatformCore(pg_url, instance="two")
    try:
        one.register([A, B, C])
        one.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",), allowed=(A,)), None, "cd")
        assert two.lookup_peer(a, b).addresses == ("127.0.0.1:7500",)
        assert two.lookup_peer(c, b).code is ResultCode.DIRECT_NOT_ALLOWED
        one.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7600",)), None, "cd")  # replaced
        assert two.lookup_peer(c, b).addresses == ("127.0.0.1:7600",)
    finally:
        one.close()
        two.close()


def test_housekeeping_forgets_announcements_a_day_after_they_expired(core: PlatformCore) -> None:
    core.announce_peer(b, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",)), None, "")
    core.announce_peer(c, PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7600",)), None, "")
    core.conn.execute("UPDATE peers SET expires_ms=1 WHERE node_id=?", (C,))
    assert core.housekeeping() == 1
    assert [d["node"] for d in core.counts()["direct"]] == [B]
