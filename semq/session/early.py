"""Frames that leave before their commit: the ``FramePort``
(semq.session.ports) of one session, for the DATA a node's claim hands over
on the store thread just before its transaction commits (they promise
nothing; semq.node.core says why that is safe). They travel while the
fsync runs.

``put`` passes them to the event loop as data (a trio token and a memory
channel, never a closure of the daemon); ``run``, a task of the session,
writes them in order through the connection's send lock. A session that
is over drops them: its channel is closed, and the rows go again in the
next session."""

from __future__ import annotations

import math

import trio

from .transport import FrameStream

__all__ = ["EarlySends"]


class EarlySends:
    """One session's FramePort. Made on the event loop (it takes the
    running loop's token); ``run`` is started in the session's nursery."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        # Unbounded: what a claim hands over is bounded by the window.
        self._chunks, self._receive = trio.open_memory_channel[bytes](math.inf)

    def put(self, frames: list[bytes]) -> None:
        """On the store thread: never waits for the event loop."""
        chunk = b"".join(frames)
        try:
            self._token.run_sync_soon(self._queue, chunk)
        except trio.RunFinishedError:
            pass

    def _queue(self, chunk: bytes) -> None:
        # On the event loop, outside any task: must not raise.
        try:
            self._chunks.send_nowait(chunk)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the session is over

    async def run(self, fs: FrameStream) -> None:
        """Write what the claims handed over, in order, until the session
        ends; then close the port (later frames are dropped)."""
        try:
            async for chunk in self._receive:
                await fs.send(chunk)
        finally:
            self._chunks.close()
            self._receive.close()
