"""One node's session at the relay, as data: its outgoing queue and the
one task that writes it (``Session.write``), its delivery window, what the
relay saw of its connection; and the ``ForwardPort`` through which the
store thread hands the frames for online targets to the sessions before
its commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from semq.session.transport import FrameStream
from semq.tracking.events import now_ms
from semq.umxt_protocol import Endpoint

__all__ = ["Admitted", "ForwardPort", "Forwards", "Seen", "Session", "peer_host"]

_SLICE: Final = 1 << 20  # bytes per write to a node


@dataclass
class Admitted:
    """Which organization a connection was admitted as (Admission), once known."""

    org: str | None = None


@dataclass
class Seen:
    """What the platform saw of a connection: the host it came from (a
    direct-link announcement may ask for it) and the fingerprint of the
    certificate it presented."""

    host: str | None
    fingerprint: str = ""


def peer_host(stream: trio.abc.Stream) -> str | None:
    sock = getattr(stream, "socket", None)
    try:
        return str(sock.getpeername()[0]) if sock is not None else None
    except (OSError, IndexError):
        return None


class Session:
    """One connected node: its outgoing queue (bounded by high_water: a slow
    node gets its documents stored, not buffered) and its delivery window."""

    def __init__(self, endpoint: Endpoint, fs: FrameStream, window: int) -> None:
        self.endpoint = endpoint
        self.fs = fs
        self.queue: list[bytes] = []
        self.queued = 0
        self.window = self.max_window = window
        self.in_flight = 0
        # Stored copies may wait for this node: true at the start, set when
        # something is stored for it, cleared when a claim finds nothing.
        self.pending = True
        self.wake_writer = trio.Event()
        self.wake_deliver = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.seen = Seen(None)
        self.announced_at = -1e9  # when its last direct-link announcement was recorded (trio time)
        self.asked_at = -1e9  # when its last PRESENCE_QUERY was answered (trio time)
        self.since_ms = now_ms()  # when it connected (what PRESENCE tells its partners)

    def enqueue(self, data: Sequence[bytes]) -> None:
        if data:
            self.queue.extend(data)
            self.queued += sum(map(len, data))
            self.wake_writer.set()

    async def write(self) -> None:
        """The session's writer, its one task that writes: the queue goes
        out ~1 MiB per send, coalesced, yet never a second copy of a whole
        queue; ``queued`` (what high_water bounds) counts a slice until it
        is written. Wakes the deliverer when the window has room."""
        while True:
            await self.wake_writer.wait()
            self.wake_writer = trio.Event()
            q = self.queue
            while q:
                end, size = 0, 0
                while end < len(q) and size < _SLICE:
                    size += len(q[end])
                    end += 1
                chunk = b"".join(q[:end])
                del q[:end]
                await self.fs.send(chunk)
                self.queued -= size
            if self.in_flight < self.window:
                self.wake_deliver.set()


Forwards = Mapping[Endpoint, list[bytes]]


class ForwardPort:
    """The daemon's RelayPort (semq.session.ports): the store thread puts
    the frames for online targets here before its batch's commit; they go
    into a memory channel that the sessions drain on the event loop
    (``PlatformDaemon._drain_forwards``). It holds a trio token and the
    channel's send end, nothing of the daemon. ``put`` does not wait for the
    event loop (``run_sync_soon``, not ``from_thread.run_sync``): the commit
    goes on while the frames travel."""

    def __init__(self, token: trio.lowlevel.TrioToken, channel: trio.MemorySendChannel[Forwards]) -> None:
        self._token = token
        self._channel = channel

    def put(self, frames: Forwards) -> None:
        """On the store thread."""
        try:
            self._token.run_sync_soon(self._send, frames)
        except trio.RunFinishedError:
            pass  # the relay has stopped: lost as on a broken connection

    def _send(self, frames: Forwards) -> None:
        # On the event loop, outside any task: it must not raise (the
        # channel's buffer is unbounded; each item is one batch's frames).
        try:
            self._channel.send_nowait(frames)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
