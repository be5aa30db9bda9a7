"""The node daemon's settings (``semq.toml``'s ``[node]`` and the command's
options, read by semq.cli): the platform session's, and the direct links'
(``DirectSettings``). Plain data; the daemon reads them live (a reload
changes ``window`` and ``addresses`` under a running session)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from semq.settings.bounds import (
    DIRECT_HANDSHAKES,
    DIRECT_HELLO_S,
    DIRECT_MAX_LINKS,
    DIRECT_MAX_LINKS_PER_ORG,
    FD_RESERVE,
    PLATFORM_BUFFER_MIB_PER_ORG,
)
from semq.settings.config import Address

__all__ = ["INITIAL_DELAY", "DirectSettings", "NodeSettings"]

INITIAL_DELAY = 0.1  # s before reconnecting after a steady session; doubles each failed round


@dataclass
class DirectSettings:
    policy: str = "prefer"  # prefer | never | only
    listen: Address | None = None  # None: no listener
    announce: list[str] = field(default_factory=list)  # addresses to announce; [] = the listening one
    allowed: tuple[str, ...] = ()  # organizations that may connect; () = all
    timeout: float = 2.0  # s for a look-up, or a connection up to WELCOME
    retry: float = 10.0  # s before a target is tried again after a failure; doubles
    retry_max: float = 120.0
    steady_after: float = 5.0  # a link up this long was steady: after it breaks, tried again at once
    announce_ttl: int = 300  # s an announcement lives at the platform; renewed at a third of it
    idle_timeout: float = 45.0  # s without a frame before a link is given up (the dialler pings)
    idle_close: float = 600.0  # s without a document to send before a link we dialled is closed
    # The listener's bounds (semq.settings.bounds): links in all, links of one
    # organization, links not authenticated yet, the time to authenticate,
    # descriptors kept for the node's own use, and the bytes one
    # organization's links may buffer together.
    max_links: int = DIRECT_MAX_LINKS
    max_links_per_org: int = DIRECT_MAX_LINKS_PER_ORG
    handshakes: int = DIRECT_HANDSHAKES
    hello_timeout: float = DIRECT_HELLO_S
    fd_reserve: int = FD_RESERVE
    max_buffer_per_org: int = PLATFORM_BUFFER_MIB_PER_ORG << 20


@dataclass
class NodeSettings:
    # The edge (semq.edge.daemon.service.EdgeSettings): AS2 / AS4 partners; None: no edge tasks.
    edge: Any = None
    # The platform's addresses (semq.settings.config.parse_platform_addresses), tried
    # in turn: the next one when connecting fails or a session ends early.
    addresses: list[Address] = field(default_factory=lambda: [Address("127.0.0.1", 7410)])
    window: int = 4096  # DATA frames in flight without platform ack
    units: int = 1  # the node's units (semq.umxt_protocol.units); this one is the core's ``unit``
    # Rows claimed per transaction. 1024 rather than 512: one claim commit
    # (fsync) and one ACK batch per 1,024 documents; scripts/bench e2e,
    # alternated: store +9%, online +5%, full-load p50 47 -> 81-92 ms,
    # half load unchanged (batches are small there); 2048 added ~4% online,
    # nothing to store, and doubled full-load latency again.
    batch: int = 1024
    poll_interval: float = 0.05  # s between looks at the pending-send table when idle
    connect_timeout: float = 5.0
    hello_timeout: float = 10.0
    ping_interval: float = 10.0
    idle_timeout: float = 45.0
    backoff_max: float = 5.0
    # A session that got WELCOME and lasted this long (s) proves its address:
    # after it the node dials that address again first, after INITIAL_DELAY.
    # A shorter one counts as a failed attempt, so a platform that welcomes
    # and drops at once is not redialled ten times a second.
    steady_after: float = 5.0
    housekeeping_interval: float = 3600.0
    # How to reach the platform at an address: None = TCP. Tests pass a
    # function returning one end of trio.testing.memory_stream_pair().
    connect: Callable[[Address], Awaitable[trio.abc.Stream]] | None = None
    # Mutual TLS 1.3 (semq.identity.security.NodeSecurity.ssl_context()); None = plain TCP.
    ssl_context: ssl.SSLContext | None = None
    # Certificates (security on). A document to an organization without a
    # usable, trusted certificate waits: asked again after cert_retry s,
    # doubling up to cert_retry_max (the platform also pushes a new one).
    cert_retry: float = 5.0
    cert_retry_max: float = 300.0
    # Direct links to other nodes (semq.node.daemon.direct): listening, policy, retries.
    direct: DirectSettings = field(default_factory=DirectSettings)
    cert_refresh: float = 300.0  # s between look-ups of every organization held (besides the pushes)
    pins_check: float = 1.0  # s between looks at pins.json ('semq node trust' from another process)
    # s between looks at the store's data_version while idle: a document an
    # application writes into the store (another process) is claimed within
    # this, not within poll_interval. 0 = off.
    watch_interval: float = 0.002
    watch_max: float = 0.05  # ... stretched up to this while nothing changes

    @property
    def host(self) -> str:
        """The first platform address's host (``NodeDaemon.address`` is the
        one connected now)."""
        return self.addresses[0].host

    @property
    def port(self) -> int:
        """The first platform address's port."""
        return self.addresses[0].port
