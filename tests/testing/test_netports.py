"""Ports for test daemons come from below the kernel's ephemeral range, so
that no outgoing connection can hold the port of a daemon being restarted
on its announced address (semq.testing.netports)."""

from __future__ import annotations

import socket

import pytest

from semq.testing import netports


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low = netports._ephemeral_low()
    ports = {netports.free_port() for _ in range(50)}
    assert len(ports) > 40, "drawn at random, not handed out in order"
    assert all(netports._LOWEST <= p < low for p in ports)
    with socket.socket() as s:  # and free: a daemon can listen there
        s.bind(("127.0.0.1", next(iter(ports))))
        s.listen()


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port free a moment ago (taken - 1 may be any connection's)
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, taken, free])

        class Fixed:
            def randint(self, a: int, b: int) -> int:
                return next(draws)

        monkeypatch.setattr(netports, "_draw", Fixed())
        monkeypatch.setattr(netports, "_ephemeral_low", lambda: 65_535)
        assert netports.free_port() == free
