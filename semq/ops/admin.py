"""The admin console (seed 004): a control socket in the data directory.

Protocol (one JSON object per line, UTF-8, both ways; a connection may
carry several requests, answered in order)::

    -> {"cmd": "status", "args": {}}
    <- {"ok": true, "result": {...}}
    <- {"ok": false, "error": "one line"}

The socket is a Unix domain socket, mode 0600, in the data directory (itself
0700): only the daemon's user (and root) can talk to it; there is no other
authentication. It is bound under a temporary name, chmod-ed, then renamed
into place, so it is never reachable with looser permissions.

Limits (semq.settings.bounds): a request line is at most ``ADMIN_MAX_REQUEST``
bytes (a longer one gets an error and the connection is closed; no more
than that is ever buffered, semq.ops.lines); at most ``ADMIN_MAX_CLIENTS``
connections are served at once (one more gets an error line naming the
limit); a connection that sends no whole request within ``ADMIN_IDLE_S``
seconds of its previous answer, or does not take an answer within as long,
is closed. Every handler failure becomes one ``error`` line; it never takes
the daemon down. Handlers run on the daemon's trio thread and must reach
the store through the daemon's gate (semq.ops.handlers).

The node's user socket (semq.ops.usersock) is served by the same code with
its own limits and a ``Gate``: its first line must authenticate, within a
few KiB and seconds, before anything larger is read.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import trio

from semq.settings.bounds import ADMIN_IDLE_S, ADMIN_MAX_CLIENTS, ADMIN_MAX_REQUEST

from ._paths import admin_socket_path, unix_address
from .lines import LineBuffer, LineTooLong

__all__ = [
    "MAX_RESPONSE",
    "AdminCommandError",
    "AdminCommandFailed",
    "AdminError",
    "AdminUnavailable",
    "AfterReply",
    "DrainControl",
    "Gate",
    "Handler",
    "Limits",
    "Session",
    "admin_call",
    "admin_request",
    "admin_socket_path",
    "one_line",
    "serve_admin",
    "until_hangup",
]

log = logging.getLogger("semq.ops.admin")

MAX_RESPONSE: Final = 64 * 1024 * 1024  # bytes the client accepts in one answer
_READ: Final = 65536  # bytes asked of a socket per read (never more than a line's room)
_REFUSE_S: Final = 1.0  # s a refusal's one line may take to leave before the connection is closed

#: A command: takes the request's ``args`` and returns a JSON-able result
#: (or an AfterReply). Raise AdminCommandError (or ValueError/LookupError)
#: for the operator's mistakes; anything else is logged as a bug.
Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class AdminError(Exception):
    """The admin client could not get an answer (one line for the user)."""


class AdminUnavailable(AdminError):
    """No daemon listens on the socket (not running, or started without it)."""


class AdminCommandFailed(AdminError):
    """The daemon answered ``ok: false``; the message is its error line."""


class AdminCommandError(ValueError):
    """Raised by a handler: the request is wrong (bad id, bad filter). A
    ValueError, so a CLI maps it to exit status 2."""


@dataclass(frozen=True)
class AfterReply:
    """A handler result whose ``action`` runs after the answer was written
    (``stop`` answers first, then stops the daemon)."""

    result: Any
    action: Callable[[], None]


def one_line(text: object, limit: int = 1000) -> str:
    """``text`` as a single line of at most ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------- drain


class DrainControl:
    """Drain and stop requests for a daemon (seed 004: the console stops
    servers cleanly).

    ``request()`` asks the daemon to stop taking new work (the node claims
    no new SS_INIT rows, the platform refuses new sessions and delivers no
    more stored copies) and finish what is in flight; ``supervise(busy)``
    then waits until ``busy()`` is 0 (or ``timeout`` passes) and calls
    ``stop()``. ``stop()`` asks for an immediate, clean stop: the process
    waits in ``wait_stop()`` and cancels its nursery. Nothing is lost either
    way: every state change is committed before its ack left, and whatever
    is unacknowledged is sent again after the restart (SPEC A.5, P.3)."""

    def __init__(self, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._drain = trio.Event()
        self._stop = trio.Event()
        self.requested_at_ms: int | None = None
        self.reason = ""  # why the drain was requested
        self.stop_reason = ""  # why the daemon stops (drained, timed out, stop, signal)

    @property
    def requested(self) -> bool:
        """True once a drain (or stop) was asked for: take no new work."""
        return self._drain.is_set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request(self, reason: str = "drain requested") -> None:
        if not self._drain.is_set():
            self.requested_at_ms = int(time.time() * 1000)
            self.reason = reason
            log.info("drain: %s", reason)
            self._drain.set()

    def stop(self, reason: str = "stop requested") -> None:
        self.request(reason)
        if not self._stop.is_set():
            log.info("stop: %s", reason)
            self.stop_reason = reason
            self._stop.set()

    async def wait(self) -> None:
        """Until a drain is requested."""
        await self._drain.wait()

    async def wait_stop(self) -> None:
        """Until the daemon should stop."""
        await self._stop.wait()

    async def supervise(self, busy: Callable[[], int], *, poll: float = 0.1) -> None:
        """Run for the daemon's life: after a drain request, wait for
        ``busy()`` to reach 0 (at most ``timeout`` s), then ``stop()``."""
        await self.wait()
        with trio.move_on_after(self.timeout) as scope:
            while busy() > 0:
                await trio.sleep(poll)
        if scope.cancelled_caught:
            log.warning("drain: still %d in flight after %.0f s; stopping anyway (they are resent later)",
                        busy(), self.timeout)
        self.stop("drained" if not scope.cancelled_caught else "drain timed out")

    def status(self) -> dict[str, Any]:
        return {"requested": self.requested, "stopping": self.stopping, "since_ms": self.requested_at_ms,
                "reason": self.reason, "stop_reason": self.stop_reason, "timeout_s": self.timeout}


# ---------------------------------------------------------------- server


def _json_default(o: object) -> Any:
    if isinstance(o, bytes | bytearray | memoryview):
        return f"<{len(o)} bytes>"  # never contents
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return str(o)


class _HungUp(Exception):
    """The client closed its connection while its wait was open."""


def until_hangup(handler: Handler) -> Handler:
    """Mark a handler that waits (``wait_inbox``): while it runs, the
    server reads its connection, and the client closing it cancels the
    handler, so an abandoned wait holds nothing. Only for handlers that
    change nothing (a cancelled one must leave no state half-changed)."""
    handler.until_hangup = True  # type: ignore[attr-defined]
    return handler


async def _unless_hangup(call: Awaitable[Any], hangup: Callable[[], Awaitable[None]]) -> Any:
    box: list[Any] = []
    hung = False
    try:
        async with trio.open_nursery() as nursery:
            async def run() -> None:
                box.append(await call)
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal hung
                await hangup()
                hung = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)
            nursery.start_soon(watch)
    except BaseExceptionGroup as eg:  # the handler's own error, as _dispatch expects it
        first: BaseException = eg
        while isinstance(first, BaseExceptionGroup) and len(first.exceptions) == 1:
            first = first.exceptions[0]
        if first is not eg:
            raise first from None
        raise
    if not box:
        if hung:
            raise _HungUp()
        raise RuntimeError("a waiting handler ended without an answer")
    return box[0]


def _error(text: object) -> bytes:
    return json.dumps({"ok": False, "error": one_line(text)}).encode() + b"\n"


#: Keys of a request's ``args`` that only the server sets: a client's are
#: dropped (only the kernel says who connected; only the first line's
#: authentication says which user a connection is).
_SERVER_KEYS: Final = ("peer_uid", "session")


def _parse(line: bytes) -> tuple[str, dict[str, Any]] | bytes:
    """A request line as (command, args), or the error line to answer."""
    try:
        req = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return _error(f"request is not JSON: {e}")
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        return _error('a request is an object {"cmd": NAME, "args": {...}}')
    cmd = req["cmd"]
    args = req.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _error(f"{cmd}: args must be an object, not {type(args).__name__}")
    for key in _SERVER_KEYS:
        args.pop(key, None)
    return cmd, args


async def _dispatch(line: bytes, handlers: Mapping[str, Handler], peer_uid: int | None = None,
                    hangup: Callable[[], Awaitable[None]] | None = None,
                    session: Session | None = None) -> tuple[bytes, Callable[[], None] | None]:
    """Answer one request line: the answer's bytes and what to do once they
    are written. ``peer_uid`` (the kernel's word) and ``session`` (what the
    connection's first line proved) reach the handler in its args."""
    parsed = _parse(line)
    if isinstance(parsed, bytes):
        return parsed, None
    cmd, args = parsed
    if peer_uid is not None:
        args["peer_uid"] = peer_uid
    if session is not None:
        args["session"] = session
    handler = handlers.get(cmd)
    if handler is None:
        return _error(f"unknown command {cmd!r}; known: {', '.join(sorted(handlers))}"), None
    try:
        if hangup is not None and getattr(handler, "until_hangup", False):
            result = await _unless_hangup(handler(args), hangup)
        else:
            result = await handler(args)
    except _HungUp:
        raise
    except (ValueError, LookupError) as e:
        text = e.args[0] if isinstance(e, KeyError) and e.args else e
        return _error(f"{cmd}: {text}"), None
    except Exception as e:  # a bug or a store failure: one line for the client, details in the log
        log.exception("admin command %s failed", cmd)
        return _error(f"{cmd} failed: {type(e).__name__}: {e}"), None
    after = None
    if isinstance(result, AfterReply):
        result, after = result.result, result.action
    try:
        data = json.dumps({"ok": True, "result": result}, default=_json_default, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        log.exception("admin command %s returned something that is not JSON", cmd)
        return _error(f"{cmd} failed: result is not JSON: {e}"), None
    return data.encode() + b"\n", after


def _peer_uid(stream: trio.SocketStream) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    try:
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return int(struct.unpack("3i", raw)[1])


# ---------------------------------------------------------------- connections


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What a socket's server allows (semq.settings.bounds): ``max_request`` bytes
    per request line, ``max_clients`` connections at once, ``idle_s``
    seconds for a whole request to come after the previous answer, and for
    an answer to be taken."""

    max_request: int = ADMIN_MAX_REQUEST
    max_clients: int = ADMIN_MAX_CLIENTS
    idle_s: float = ADMIN_IDLE_S

    def __post_init__(self) -> None:
        if self.max_request < 1 or self.max_clients < 1 or not self.idle_s > 0:
            raise ValueError(f"limits {self} are not all positive")


class Session(Protocol):
    """What a connection's first line proved (a user of the user socket);
    ``close()`` when the connection ends (it gives back its share)."""

    def close(self) -> None: ...


class Gate(Protocol):
    """How a socket admits a connection by its first line (the user
    socket's authentication; the admin socket has none). The first line
    is at most ``first_bytes`` bytes and must come whole within
    ``first_s`` seconds of the connect."""

    first_bytes: int
    first_s: float

    def arrive(self, peer_uid: int | None) -> str | None:
        """A connection from ``peer_uid`` before its first line: None when
        it is counted, else the error line's text (over a limit)."""

    def depart(self, peer_uid: int | None) -> None:
        """That connection was admitted or ended (once per ``arrive`` that
        returned None)."""

    async def admit(self, cmd: str, args: dict[str, Any], peer_uid: int | None) -> Session:
        """Who the first request proves the connection is. Raises
        AdminCommandError with the error line's text."""
        ...


async def _say(stream: trio.SocketStream, line: bytes, within: float) -> bool:
    """Write one answer, waiting at most ``within`` s for the client to take
    it: False when it did not (the connection is then closed)."""
    with trio.move_on_after(within):
        await stream.send_all(line)
        return True
    return False


async def _refuse(stream: trio.SocketStream, text: str) -> None:
    """One error line (bounded), then the caller closes the connection."""
    try:
        await _say(stream, _error(text), _REFUSE_S)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _read_line(stream: trio.SocketStream, lines: LineBuffer) -> bytes | None:
    """The next whole request line, reading at most the buffer's room; None
    when the client closed its end. Raises LineTooLong."""
    while (line := lines.next_line()) is None:
        data = await stream.receive_some(min(_READ, lines.room()))
        if not data:
            return None
        lines.feed(data)
    return line


async def _admit(stream: trio.SocketStream, lines: LineBuffer, gate: Gate,
                 peer_uid: int | None) -> tuple[Session, bytes] | None:
    """Read and authenticate the first line within the gate's bytes and
    seconds: the session and that line (to be answered like any other), or
    None after one error line."""
    refusal = gate.arrive(peer_uid)
    if refusal is not None:
        await _refuse(stream, refusal)
        return None
    try:
        line: bytes | None = None
        with trio.move_on_after(gate.first_s) as scope:
            try:
                line = await _read_line(stream, lines)
            except LineTooLong as e:
                await _refuse(stream, f"the first line authenticates (user and token) and is at most"
                                      f" {gate.first_bytes} bytes: {e}")
                return None
        if line is None:
            if scope.cancelled_caught:
                await _refuse(stream, f"no authenticating first line within {gate.first_s:g} s"
                                      f" ({lines.buffered} bytes came without a newline)")
            return None
        parsed = _parse(line)
        if isinstance(parsed, bytes):
            with trio.move_on_after(_REFUSE_S):
                await stream.send_all(parsed)
            return None
        cmd, args = parsed
        try:
            session = await gate.admit(cmd, args, peer_uid)
        except AdminCommandError as e:
            await _refuse(stream, f"{cmd}: {e}")
            return None
        return session, line
    finally:
        gate.depart(peer_uid)


async def _serve_client(stream: trio.SocketStream, handlers: Mapping[str, Handler], slots: trio.Semaphore,
                        limits: Limits, *, credentials: bool = False, gate: Gate | None = None,
                        what: str = "the admin console") -> None:
    """One connection: its slot (or one error line naming the limit), its
    first line through ``gate`` when there is one, then request after
    request, never buffering more than a line of the current limit."""
    peer_uid = _peer_uid(stream) if credentials else None
    async with stream:
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            await _refuse(stream, f"{limits.max_clients} connections are open on {what}, its limit of"
                                  f" {limits.max_clients}; try again later")
            return
        session: Session | None = None
        try:
            lines = LineBuffer(gate.first_bytes if gate is not None else limits.max_request)
            pending: bytes | None = None
            if gate is not None:
                admitted = await _admit(stream, lines, gate, peer_uid)
                if admitted is None:
                    return
                session, pending = admitted
                lines.limit = limits.max_request

            async def hangup() -> None:
                """Returns once the client closed its end; what it sends
                meanwhile (a next request) waits in ``lines``, within the
                limit (when that is full, the hangup is not seen: the wait
                ends at its own timeout)."""
                while lines.room():
                    try:
                        data = await stream.receive_some(min(_READ, lines.room()))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    if not data:
                        return
                    lines.feed(data)
                await trio.sleep_forever()

            while True:
                line: bytes | None = pending
                pending = None
                if line is None:
                    # A whole request within idle_s of the previous answer:
                    # a slow drip cannot hold the connection for ever either.
                    with trio.move_on_after(limits.idle_s):
                        try:
                            line = await _read_line(stream, lines)
                        except LineTooLong as e:
                            await _refuse(stream, f"{e}; a request is at most {limits.max_request} bytes")
                            return
                    if line is None:
                        return  # closed by the client, or idle for idle_s
                if not line.strip():
                    continue
                try:
                    answer, after = await _dispatch(line, handlers, peer_uid, hangup, session)
                except _HungUp:
                    return  # the client left while it waited
                if not await _say(stream, answer, limits.idle_s):
                    return  # the client does not take its answers
                if after is not None:
                    after()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client went away
        except Exception:  # never let one connection take the daemon down
            log.exception("connection to %s failed", what)
        finally:
            if session is not None:
                session.close()
            slots.release()


def _probe(path: Path) -> bool:
    """True if something accepts connections on the socket at ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        with unix_address(path) as addr:
            s.connect(addr)
        return True
    except OSError:
        return False
    finally:
        s.close()


async def _bind(path: Path, mode: int = 0o600, what: str = "the admin console",
                backlog: int = ADMIN_MAX_CLIENTS) -> tuple[trio.socket.SocketType, int]:
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{path} exists and is not a socket; refusing to replace it")
        if await trio.to_thread.run_sync(_probe, path):
            raise OSError(f"another process already serves {what} on {path}")
        path.unlink(missing_ok=True)  # stale: left by a daemon that was killed
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_address(tmp) as addr:
            await sock.bind(addr)
        os.chmod(tmp, mode)  # (0600: owner-only) before anyone can reach it by its real name
        sock.listen(backlog)
        os.replace(tmp, path)
    except BaseException:
        sock.close()
        tmp.unlink(missing_ok=True)
        raise
    return sock, path.stat().st_ino


async def serve_admin(
    path: Path,
    handlers: Mapping[str, Handler],
    *,
    mode: int = 0o600,
    limits: Limits | None = None,
    credentials: bool = False,
    gate: Gate | None = None,
    what: str = "the admin console",
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin console on the Unix socket ``path`` until cancelled
    (start with ``nursery.start``; ``task_status`` gets the path). A stale
    socket file (its daemon was killed) is replaced; a live one, or a file
    that is not a socket, raises OSError. The socket file is removed on
    exit if it is still ours.

    The same server answers the node's user socket
    (semq.ops.usersock.serve_user_socket): ``mode`` 0666, ``credentials``
    (each request's args get ``peer_uid``, the connecting process's uid
    from the kernel; a client cannot set it), its own ``limits``, and a
    ``gate`` that admits each connection by its short first line."""
    path = Path(path)
    limits = limits or Limits()
    sock, ino = await _bind(path, mode, what, limits.max_clients)
    listener = trio.SocketListener(sock)
    slots = trio.Semaphore(limits.max_clients)
    log.info("%s on %s", what, path)

    async def handle(stream: trio.SocketStream) -> None:
        await _serve_client(stream, handlers, slots, limits, credentials=credentials, gate=gate, what=what)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, [listener])
            task_status.started(path)
    finally:
        try:
            if path.stat().st_ino == ino:
                path.unlink()
        except OSError:
            pass
        sock.close()


# ---------------------------------------------------------------- client


def admin_request(path: Path, cmd: str, args: Mapping[str, Any] | None = None,
                  timeout: float = 5.0, *, max_response: int = MAX_RESPONSE) -> dict[str, Any]:
    """Send one command to the daemon listening on ``path`` and return its
    answer (``{"ok": True, "result": ...}`` or ``{"ok": False, "error":
    ...}``). Synchronous (the CLI's side).

    Raises AdminUnavailable when nothing listens there, AdminError when no
    complete answer comes within ``timeout`` seconds."""
    path = Path(path)
    deadline = time.monotonic() + timeout
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        try:
            with unix_address(path) as addr:
                s.connect(addr)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise AdminUnavailable(f"no daemon is listening on {path} (not running, or started"
                                   " without the admin console)") from e
        except PermissionError as e:
            raise AdminError(f"permission denied on {path}: run this as the daemon's user") from e
        except OSError as e:
            raise AdminError(f"cannot reach the admin console on {path}: {e}") from e
        req = json.dumps({"cmd": cmd, "args": dict(args or {})}, separators=(",", ":")).encode() + b"\n"
        buf = bytearray()
        try:
            s.sendall(req)
            start = 0
            while (nl := buf.find(b"\n", start)) < 0:
                start = len(buf)
                s.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise AdminError(f"the daemon closed {path} without answering {cmd!r}")
                buf += chunk
                if len(buf) > max_response:
                    raise AdminError(f"answer to {cmd!r} exceeds {max_response} bytes")
        except TimeoutError as e:
            raise AdminError(f"no answer to {cmd!r} from {path} within {timeout:g} s") from e
        except OSError as e:
            raise AdminError(f"admin connection to {path} failed: {e}") from e
    finally:
        s.close()
    try:
        resp = json.loads(bytes(buf[:nl]))
    except ValueError as e:
        raise AdminError(f"the daemon's answer is not JSON: {e}") from e
    if not isinstance(resp, dict) or "ok" not in resp:
        raise AdminError("the daemon's answer has no 'ok' field")
    return resp


def admin_call(path: Path, cmd: str, args: Mapping[str, Any] | None = None, timeout: float = 5.0) -> Any:
    """Like admin_request, but returns the result and raises
    AdminCommandFailed with the daemon's error line when it is not ok."""
    resp = admin_request(path, cmd, args, timeout)
    if not resp.get("ok"):
        raise AdminCommandFailed(str(resp.get("error", "failed")))
    return resp.get("result")
