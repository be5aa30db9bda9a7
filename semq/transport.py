"""A framed UMX-T connection over any trio Stream (TCP today; trio.SSLStream
wraps the same stream for mutual TLS). One reader drains complete frames in
batches; one send lock; frames are coalesced by the callers into one
``send_all`` per batch (MEASUREMENTS: 64 frames per send_all ~10x faster)."""

from __future__ import annotations

import trio

from semq.config import parse_hostport  # one definition, also used to check semq.toml
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    Endpoint,
    Error,
    Frame,
    FrameDecoder,
    Kind,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    encode_frame,
)

__all__ = ["ConnectionClosed", "FramePump", "FrameStream", "parse_hostport"]

READ_SIZE = 256 * 1024


class ConnectionClosed(Exception):
    """The peer closed the connection (or it broke)."""


class FrameStream:
    def __init__(self, stream: trio.abc.Stream, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(max_frame)
        self._send_lock = trio.Lock()
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_batch(self) -> list[RawFrame]:
        """Every complete frame available after one read (at least one).
        Raises ConnectionClosed on EOF and RemoteProtocolError on bad bytes."""
        while True:
            frames = self.decoder.frames()
            if frames:
                return frames
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                raise ConnectionClosed(str(e)) from e
            if not data:
                raise ConnectionClosed("end of stream")
            self.bytes_in += len(data)
            self.decoder.receive_data(bytes(data))

    async def send(self, data: bytes) -> None:
        if not data:
            return
        async with self._send_lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                raise ConnectionClosed(str(e)) from e
            self.bytes_out += len(data)

    async def send_error(self, me: Endpoint, peer: Endpoint | None, code: ResultCode, message: str) -> None:
        """Best effort: tell the peer why we close, then close."""
        frame = Frame(
            kind=Kind.ERROR, source=me, target=peer or me, body=Error(code=code, message=message[:1024])
        )
        with trio.move_on_after(2):
            try:
                await self.send(encode_frame(frame))
            except ConnectionClosed:
                pass
        await self.aclose()

    async def aclose(self) -> None:
        with trio.move_on_after(2) as scope:
            scope.shield = True
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


class FramePump:
    """Group commit on the receiving side: ``run`` reads continuously while
    the consumer works on the previous batch; ``take`` returns everything that
    arrived meanwhile. Without it, a TLS stream (one 16 KiB record per read)
    would make every batch, and so every store transaction, ~20x smaller.
    At most ``max_frames`` frames, or ``max_bytes`` of them, wait (then the
    pump stops reading: TCP pushes back): a peer sending large frames faster
    than they are stored cannot fill the reader's memory."""

    def __init__(self, fs: FrameStream, max_frames: int = 16_384, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.fs = fs
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._buf: list[RawFrame] = []
        self._bytes = 0
        self._ready = trio.Event()
        self._room = trio.Event()

    async def run(self) -> None:
        """Read until the stream ends (raises ConnectionClosed /
        RemoteProtocolError, like FrameStream.receive_batch)."""
        while True:
            while len(self._buf) >= self.max_frames or self._bytes >= self.max_bytes:
                self._room = trio.Event()
                await self._room.wait()
            frames = await self.fs.receive_batch()
            # (Not ``self._buf.extend(await ...)``: that binds the list before
            # the await, and take() may have swapped it meanwhile.)
            self._buf.extend(frames)
            self._bytes += sum(len(f.raw) for f in frames)
            self._ready.set()

    async def take(self) -> list[RawFrame]:
        while not self._buf:
            self._ready = trio.Event()
            await self._ready.wait()
        out, self._buf = self._buf, []
        self._bytes = 0
        self._room.set()
        return out


_ = RemoteProtocolError
