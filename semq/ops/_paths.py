"""Where the operational files of a data directory live, and Unix socket
addresses that stay within the kernel's 107-byte limit."""

from __future__ import annotations

from pathlib import Path

# Shared with the applications' side (NodeClient waits on the admin socket).
from semq.session.inbox_wait import ADMIN_SOCKET_NAME, MAX_UNIX_PATH, unix_address

__all__ = ["ADMIN_SOCKET_NAME", "MAX_UNIX_PATH", "admin_socket_path", "unix_address"]


def admin_socket_path(directory: Path) -> Path:
    """The admin console's socket in a data directory (owner-only, 0600)."""
    return Path(directory) / ADMIN_SOCKET_NAME
