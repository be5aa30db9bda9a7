"""The relay's settings (``semq.toml``'s ``[platform]`` and the command's
options, read by semq.cli). Plain data, read live: a reload changes the
window, the high-water mark and the per-organization bounds of a running
relay."""

from __future__ import annotations

from dataclasses import dataclass

from semq.identity.security import PlatformSecurity
from semq.settings.bounds import (
    FD_RESERVE,
    PLATFORM_BUFFER_MIB_PER_ORG,
    PLATFORM_HANDSHAKES,
    PLATFORM_HELLO_S,
    PLATFORM_MAX_CONNECTIONS,
)
from semq.umxt_protocol import DEFAULT_MAX_FRAME

__all__ = ["PlatformSettings"]


@dataclass
class PlatformSettings:
    host: str = "127.0.0.1"
    port: int = 7410
    window: int = 4096  # stored copies in flight to one node without its ACK
    batch: int = 512
    high_water: int = 16 * 1024 * 1024  # bytes queued for one node before it counts as offline
    hello_timeout: float = PLATFORM_HELLO_S
    idle_timeout: float = 60.0
    max_frame: int = DEFAULT_MAX_FRAME
    # Connections one organization may hold at once (its certificate's, from
    # the TLS handshake on; without security, from HELLO). A node needs
    # one; more while it reconnects.
    max_connections_per_org: int = 4
    # Units one organization's node may run (semq.umxt_protocol.units): what its HELLO
    # may claim at most; each unit granted to it (semq platform register
    # --units) holds a connection, one more each beyond the first.
    max_units_per_org: int = 8
    # The listener's bounds (semq.settings.bounds): connections in all, connections
    # not authenticated yet, descriptors kept for the relay's own use, and
    # the bytes one organization's connections may buffer together.
    max_connections: int = PLATFORM_MAX_CONNECTIONS
    max_handshakes: int = PLATFORM_HANDSHAKES
    fd_reserve: int = FD_RESERVE
    max_buffer_per_org: int = PLATFORM_BUFFER_MIB_PER_ORG << 20
    housekeeping_interval: float = 3600.0
    # Mutual TLS 1.3 and the certificate directory (semq.identity.security); None = plain TCP.
    security: PlatformSecurity | None = None
    crl_check_interval: float = 2.0
