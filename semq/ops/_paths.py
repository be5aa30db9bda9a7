"""Where the operational files of a data directory live, and Unix socket
addresses that stay within the kernel's 107-byte limit."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = ["ADMIN_SOCKET_NAME", "MAX_UNIX_PATH", "admin_socket_path", "unix_address"]

ADMIN_SOCKET_NAME: Final = "admin.sock"
#: sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_PATH: Final = 107


def admin_socket_path(directory: Path) -> Path:
    """The admin console's socket in a data directory (owner-only, 0600)."""
    return Path(directory) / ADMIN_SOCKET_NAME


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """An address for ``bind``/``connect`` naming ``path``. Data directories
    can be deeper than sun_path allows; on Linux a long path is reached
    through ``/proc/self/fd/<dirfd>/<name>`` (the directory stays open
    while the address is used). Raises OSError naming the path otherwise."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= MAX_UNIX_PATH:
        yield text
        return
    if not sys.platform.startswith("linux"):
        raise OSError(f"socket path {text} is longer than {MAX_UNIX_PATH} bytes; use a shorter data directory")
    fd = os.open(os.path.dirname(text) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        short = f"/proc/self/fd/{fd}/{os.path.basename(text)}"
        if len(os.fsencode(short)) > MAX_UNIX_PATH:
            raise OSError(f"socket name {os.path.basename(text)!r} is too long")
        yield short
    finally:
        os.close(fd)
