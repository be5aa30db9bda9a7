"""The client side of a running node's ``wait_inbox`` request: wait, without
polling, until a unit's inbox holds an unacknowledged document above a row
id. Below NodeClient (which opens the stores but is no client of the
daemon), so the applications' API can wait too; the server side is
semq.ops.waiters.

The request is the admin console's protocol (one JSON object per line,
semq.ops.admin), sent to each unit's admin socket (``<unit dir>/admin.sock``)
or to the node's user socket::

    -> {"cmd": "wait_inbox", "args": {"after_id": 41, "timeout": 30, "user": "alice"}}
    <- {"ok": true, "result": {"ready": true, "top": 57}}

``ready``: the store holds an unacknowledged row above ``after_id``
(``top`` is its highest), answered as soon as a commit puts one there;
``ready`` false: ``timeout`` passed first (the daemon caps it at
``MAX_WAIT``). Closing the connection ends the wait on the daemon's side.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "ADMIN_SOCKET_NAME",
    "MAX_UNIX_PATH",
    "MAX_WAIT",
    "DaemonAway",
    "WaitRefused",
    "await_any",
    "unix_address",
    "wait_any",
]

ADMIN_SOCKET_NAME: Final = "admin.sock"
#: sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_PATH: Final = 107
MAX_WAIT: Final = 30.0  # s one wait_inbox request lasts at most (the daemon caps longer ones)
_MAX_ANSWER: Final = 64 * 1024  # a wait's answer is a few dozen bytes


class DaemonAway(Exception):
    """No daemon answers on a socket (not running, or restarting)."""


class WaitRefused(Exception):
    """The daemon answered the wait with an error (its one line): a bad
    argument, a refused token, or too many waits at once."""


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


def _request(args: Mapping[str, Any]) -> bytes:
    return json.dumps({"cmd": "wait_inbox", "args": dict(args)}, separators=(",", ":")).encode() + b"\n"


def _answer(path: Path, line: bytes) -> dict[str, Any]:
    try:
        resp = json.loads(line)
    except ValueError as e:
        raise WaitRefused(f"{path}: the daemon's answer is not JSON: {e}") from None
    if not isinstance(resp, dict) or not resp.get("ok"):
        raise WaitRefused(str(resp.get("error", "refused")) if isinstance(resp, dict) else "refused")
    result = resp.get("result")
    if not isinstance(result, dict):
        raise WaitRefused(f"{path}: the daemon's answer has no result")
    return result


def wait_any(requests: Sequence[tuple[Path, Mapping[str, Any]]], timeout: float, *,
             also: Sequence[int] = ()) -> dict[int, dict[str, Any]]:
    """Send ``wait_inbox`` with each ``(socket path, args)`` at once and
    return as soon as one answers ``ready`` (or all answered, or ``timeout``
    passed, or one of the descriptors ``also`` is readable — a caller's
    other events): ``{index: result}`` of those that answered. Synchronous; the
    other connections are closed, which ends their waits at the daemons.

    Raises DaemonAway naming the first socket nothing listens on (no wait
    is left open then), WaitRefused with a daemon's error line."""
    deadline = time.monotonic() + timeout
    socks: list[socket.socket] = []
    sel = selectors.DefaultSelector()
    try:
        for i, (path, args) in enumerate(requests):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(s)
            s.settimeout(5.0)
            try:
                with unix_address(path) as addr:
                    s.connect(addr)
                s.sendall(_request({"timeout": timeout, **args}))
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise DaemonAway(f"no daemon is listening on {path}") from e
            except OSError as e:
                raise DaemonAway(f"cannot reach the daemon on {path}: {e}") from e
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, (i, path, bytearray()))
        for fd in also:
            sel.register(fd, selectors.EVENT_READ, None)
        out: dict[int, dict[str, Any]] = {}
        while len(out) < len(requests):
            left = deadline - time.monotonic()
            # The daemon answers at its timeout; a little longer here.
            events = sel.select(max(0.0, left + 1.0))
            if not events:
                break
            theirs = False
            for key, _ in events:
                if key.data is None:  # one of the caller's own descriptors
                    theirs = True
                    continue
                i, path, buf = key.data
                try:
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    raise DaemonAway(f"the daemon on {path} went away: {e}") from e
                if not chunk:
                    raise DaemonAway(f"the daemon on {path} closed the connection")
                buf += chunk
                if len(buf) > _MAX_ANSWER:
                    raise WaitRefused(f"{path}: answer exceeds {_MAX_ANSWER} bytes")
                nl = buf.find(b"\n")
                if nl >= 0:
                    out[i] = _answer(path, bytes(buf[:nl]))
                    sel.unregister(key.fileobj)
                    if out[i].get("ready"):
                        return out
            if theirs:
                return out  # the caller's own event: its turn
        return out
    finally:
        sel.close()
        for s in socks:
            s.close()


async def await_any(requests: Sequence[tuple[Path, Mapping[str, Any]]], timeout: float) -> dict[int, dict[str, Any]]:
    """``wait_any`` for trio: the same answers and errors; cancelling it
    closes the connections (which ends the waits at the daemons)."""
    import trio

    out: dict[int, dict[str, Any]] = {}

    async def one(i: int, path: Path, args: Mapping[str, Any], done: trio.CancelScope) -> None:
        try:
            with unix_address(path) as addr:
                stream = await trio.open_unix_socket(addr)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise DaemonAway(f"no daemon is listening on {path}") from e
        except OSError as e:
            raise DaemonAway(f"cannot reach the daemon on {path}: {e}") from e
        async with stream:
            buf = bytearray()
            try:
                await stream.send_all(_request({"timeout": timeout, **args}))
                while (nl := buf.find(b"\n")) < 0:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        raise DaemonAway(f"the daemon on {path} closed the connection")
                    buf += chunk
                    if len(buf) > _MAX_ANSWER:
                        raise WaitRefused(f"{path}: answer exceeds {_MAX_ANSWER} bytes")
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise DaemonAway(f"the daemon on {path} went away: {e}") from e
        out[i] = _answer(path, bytes(buf[:nl]))
        if out[i].get("ready"):
            done.cancel()

    try:
        with trio.move_on_after(timeout + 1.0):
            async with trio.open_nursery() as nursery:
                for i, (path, args) in enumerate(requests):
                    nursery.start_soon(one, i, Path(path), args, nursery.cancel_scope)
    except BaseExceptionGroup as eg:  # the first one's words, not a group
        first = eg.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return out
