"""Free TCP ports for the daemons that tests, the chaos runs and the
PostgreSQL test server start on 127.0.0.1.

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range
(``ip_local_port_range``, 32768-60999 by default), the range it also uses
for the local end of every outgoing connection. Such a port is free when
probed, but once a daemon that listened on it stops (a chaos run kills a
node and starts it again on the address it announced), any connection on
the machine may take it as its local port, and the restarted daemon cannot
listen there for as long as that connection lives. So ports are drawn
below that range, where only an explicit bind lands, at random (several
test workers draw at once) and probed before they are handed out.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

__all__ = ["free_port"]

_LOWEST: Final = 15_000
_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_draw = random.SystemRandom()  # (not the global generator: tests reseed it, and workers would draw alike)


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that nothing listens on now, below the kernel's
    ephemeral range when that leaves room (else any free port)."""
    top = _ephemeral_low() - 1
    if top - _LOWEST >= 1_000:
        for _ in range(200):
            port = _draw.randint(_LOWEST, top)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
