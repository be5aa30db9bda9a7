"""Hostile peers, for the tests and the flood benchmark of semq.settings.bounds.

What an enrolled organization with bad intent, or a stranger, can do at a
listener (the platform's, a node's direct-link listener): connect and say
nothing, hold idle TLS links, send a frame header declaring a huge frame
before HELLO and stream its body, open sessions and stream huge frames in
each. Every function returns what happened (how many connections were
taken, how many the listener closed, how many bytes it read before it
closed them) so that a test or ``scripts/bench load flood`` can set it
beside the process's memory and descriptors (``process_usage``) and the
declared bound.

An organization's credentials are its node's data directory (the node need
not run: ``Identity.of``). A stranger has none: plain TCP, or TLS without a
client certificate.
"""

from __future__ import annotations

import os
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import trio

from semq.identity.security import NodeSecurity
from semq.node.large.manifest import ChunkSealer, Manifest
from semq.session.transport import FrameStream
from semq.umxt_protocol import (
    CHUNK_COMPRESSED,
    LK0,
    Chunk,
    Endpoint,
    Frame,
    Hello,
    Kind,
    RawFrame,
    encode_frame,
)

__all__ = [
    "Flood",
    "Identity",
    "LargeForgery",
    "Usage",
    "big_first_frames",
    "big_frames_in_sessions",
    "forge_large",
    "idle_links",
    "open_session",
    "process_usage",
    "silent_connections",
]

_HEAD = struct.Struct(">2sBBBBBBBBBBBBL")  # docs/protocol.md "Frame": the 18-byte header
_MAGIC, _VERSION = b"UX", 1
_BLOCK = 64 * 1024


@dataclass(frozen=True)
class Identity:
    """Who a hostile peer is: an enrolled organization's TLS contexts, or a
    stranger's (``org`` empty: no client certificate; None: plain TCP)."""

    org: str
    platform_tls: ssl.SSLContext | None
    direct_tls: ssl.SSLContext | None

    @classmethod
    def of(cls, directory: Path) -> Identity:
        """The organization whose node's data directory is ``directory``."""
        sec = NodeSecurity(Path(directory))
        return cls(sec.org, sec.ssl_context(), sec.direct_contexts()[1])

    @classmethod
    def stranger(cls, ca_file: Path | None = None) -> Identity:
        """No certificate: plain TCP, or (``ca_file``) TLS that presents none."""
        if ca_file is None:
            return cls("", None, None)
        ctx = ssl.create_default_context(cafile=str(ca_file))
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return cls("", ctx, ctx)


@dataclass
class Flood:
    """What a flood did: connections attempted, taken by the listener (still
    open when the flood ended, or answered by WELCOME), closed by it, and
    the bytes it read from them before closing."""

    attempted: int = 0
    held: int = 0
    welcomed: int = 0
    closed: int = 0
    bytes_read: int = 0
    errors: list[str] = field(default_factory=list)

    def refused(self, e: BaseException) -> None:
        """A connection the listener closed with ``e`` (the first few kept)."""
        self.closed += 1
        if len(self.errors) < 5:
            self.errors.append(f"{type(e).__name__}: {e}")

    def line(self) -> str:
        return (f"{self.attempted} tried, {self.held} held at the end, {self.welcomed} welcomed,"
                f" {self.closed} closed by the listener, {self.bytes_read / 2**20:.1f} MiB read before closing")


class Usage(NamedTuple):
    """What a process holds: resident memory now and at its peak (bytes), open descriptors."""

    rss: int
    peak: int
    fds: int


def process_usage(pid: int) -> Usage:
    """Usage of process ``pid`` now (Linux /proc)."""
    rss = peak = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return Usage(rss, peak, len(os.listdir(f"/proc/{pid}/fd")))


def _header(kind: Kind, source: str, target: str, body: int) -> bytes:
    """The header of a frame from organization ``source`` to ``target``
    declaring a body of ``body`` bytes (the bytes that follow are the
    sender's to choose: a listener must judge the frame by its header)."""
    # A header the decoder takes: LAYER_MASK 0 on DATA, 1 on the others;
    # Reliable; SaveFwd 3 on message kinds, 0 on session kinds.
    flags = (0 if kind is Kind.DATA else 0x01) | 0x02
    save_fwd = 3 if kind.is_message else 0
    s, t = source.encode(), target.encode()
    return _HEAD.pack(_MAGIC, _VERSION, int(kind), flags, save_fwd, 0, 1, 1, 1, len(s), len(t), len(s), 0,
                      body) + s + t + s


async def _connect(host: str, port: int, tls: ssl.SSLContext | None) -> trio.abc.Stream:
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if tls is not None:
        s = trio.SSLStream(stream, tls, server_hostname=host if tls.check_hostname else None)
        await s.do_handshake()
        stream = s
    return stream


async def _closed_by_peer(stream: trio.abc.Stream, seconds: float) -> bool:
    """Whether the peer closes ``stream`` within ``seconds`` (what it says meanwhile is read and dropped)."""
    with trio.move_on_after(seconds):
        try:
            while await stream.receive_some(_BLOCK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            pass
        return True
    return False


async def _many(n: int, one: object, concurrency: int = 64) -> None:
    limiter = trio.CapacityLimiter(concurrency)

    async def run(i: int) -> None:
        async with limiter:
            await one(i)  # type: ignore[operator]

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(run, i)


async def silent_connections(host: str, port: int, n: int, hold: float, tls: ssl.SSLContext | None = None) -> Flood:
    """``n`` connections that complete TCP (and, with ``tls``, the TLS
    handshake) and then say nothing for ``hold`` seconds."""
    out = Flood(attempted=n)

    async def one(_i: int) -> None:
        try:
            stream = await _connect(host, port, tls)
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            out.refused(e)
            return
        try:
            if await _closed_by_peer(stream, hold):
                out.closed += 1
            else:
                out.held += 1
        finally:
            await _aclose(stream)

    await _many(n, one, concurrency=n)
    return out


async def idle_links(host: str, port: int, who: Identity, target: str, n: int, hold: float, *,
                     direct: bool = True) -> Flood:
    """``n`` links of an enrolled organization that say HELLO and then
    nothing for ``hold`` seconds (a node's direct-link listener with
    ``direct``, else the platform)."""
    out = Flood(attempted=n)
    tls = who.direct_tls if direct else who.platform_tls
    me = Endpoint.org(who.org)
    to = Endpoint.org(target) if direct else Endpoint.platform(target)

    async def one(_i: int) -> None:
        try:
            stream = await _connect(host, port, tls)
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            out.refused(e)
            return
        fs = FrameStream(stream)
        try:
            await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=me, target=to, body=Hello())))
            first: list[RawFrame] = []
            with trio.move_on_after(min(hold, 10.0)):
                first = await fs.receive_batch()
            if first and first[0].kind is Kind.WELCOME:
                out.welcomed += 1
            if await _closed_by_peer(stream, hold):
                out.closed += 1
            else:
                out.held += 1
        except Exception as e:  # (closed under us, in any of the ways a stream says so)
            out.refused(e)
        finally:
            await fs.aclose()

    await _many(n, one, concurrency=64)
    return out


async def _stream_body(stream: trio.abc.Stream, size: int, seconds: float) -> int:
    """Send up to ``size`` bytes of zeros for at most ``seconds``: how many
    the peer took before it closed (or the time ran out)."""
    sent = 0
    block = bytes(_BLOCK)
    with trio.move_on_after(seconds):
        try:
            while sent < size:
                await stream.send_all(block[: min(_BLOCK, size - sent)])
                sent += min(_BLOCK, size - sent)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass
    return sent


async def big_first_frames(host: str, port: int, who: Identity, target: str, n: int, size: int,
                           seconds: float, *, direct: bool = True) -> Flood:
    """``n`` connections whose first frame (before any HELLO) declares
    ``size`` bytes, its body streamed for at most ``seconds``."""
    out = Flood(attempted=n)
    tls = who.direct_tls if direct else who.platform_tls

    async def one(_i: int) -> None:
        try:
            stream = await _connect(host, port, tls)
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            out.refused(e)
            return
        try:
            head = _header(Kind.DATA, who.org or "66666", target, size)
            await stream.send_all(head)
            sent = await _stream_body(stream, size, seconds)
            out.bytes_read += sent
            if sent < size and await _closed_by_peer(stream, 1.0):
                out.closed += 1
            else:
                out.held += 1
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            out.refused(e)
        finally:
            await _aclose(stream)

    await _many(n, one, concurrency=n)
    return out


async def big_frames_in_sessions(host: str, port: int, who: Identity, platform_id: str, target: str, n: int,
                                 size: int, seconds: float, *, units: int = 1) -> Flood:
    """``n`` sessions at the platform, each (HELLO claiming ``units``)
    welcomed and then streaming a frame declaring ``size`` bytes to
    ``target`` for at most ``seconds``."""
    out = Flood(attempted=n)
    me = Endpoint.org(who.org)

    async def one(i: int) -> None:
        unit = i % units + 1
        try:
            stream = await _connect(host, port, who.platform_tls)
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            out.refused(e)
            return
        fs = FrameStream(stream)
        try:
            await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=me, target=Endpoint.platform(platform_id),
                                             body=Hello(semq_id=unit, units=units))))
            first: list[RawFrame] = []
            with trio.move_on_after(10):
                first = await fs.receive_batch()
            if not first or first[0].kind is not Kind.WELCOME:
                out.closed += 1
                return
            out.welcomed += 1
            await stream.send_all(_header(Kind.DATA, who.org, target, size))
            sent = await _stream_body(stream, size, seconds)
            out.bytes_read += sent
            # Still open at the end: the relay neither closed it (a newer
            # session of the same unit replaces an older one) nor refused it.
            if await _closed_by_peer(stream, 0.5):
                out.closed += 1
            else:
                out.held += 1
        except Exception as e:  # (as above)
            out.refused(e)
        finally:
            await fs.aclose()

    await _many(n, one, concurrency=n)
    return out


async def _aclose(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass



@dataclass
class LargeForgery:
    """A large document an enrolled organization really sent (its manifest
    signed and sealed by its node, as any), whose chunks it then makes as
    it likes: sealed under the manifest's key, so genuine to the receiver."""

    manifest_frames: list[bytes]
    lk0: LK0
    manifest: Manifest
    source: Endpoint
    target: Endpoint

    def chunk(self, index: int, payload: bytes, *, compressed: bool = True) -> bytes:
        """CHUNK ``index`` carrying ``payload`` as its (compressed) content."""
        sealer = ChunkSealer(self.lk0, self.manifest)
        sealer._zstd = None  # (sealed as given: the payload is the partner's to choose)
        _, sealed = sealer.seal(index, payload)
        return encode_frame(Frame(kind=Kind.CHUNK, source=self.source, target=self.target,
                                  body=Chunk(lk0=self.lk0, index=index,
                                             flags=CHUNK_COMPRESSED if compressed else 0, payload=sealed)))


def forge_large(directory: Path, target: str, size: int = 6 << 20) -> LargeForgery:
    """Accept a large document of ``size`` random bytes for ``target`` in
    the (stopped) node at ``directory`` and claim its manifest, as the node
    would before sending it. The node must hold ``target``'s certificate
    (it sent ``target`` a document before)."""
    from semq.node.api import NodeClient
    from semq.node.core import NodeCore
    from semq.settings.config import load_config

    directory = Path(directory)
    src = directory / "forged.bin"
    src.write_bytes(os.urandom(size))
    with NodeClient(directory) as node:
        node.send_file(target, src)
    cfg = load_config(directory)
    core = NodeCore(cfg.store_path, cfg.org, security=NodeSecurity(directory))  # (as the daemon: it signs and seals)
    try:
        out = core.claim(10)
        if out.missing or not out.data:
            raise RuntimeError(f"the node at {directory} cannot seal for {target} (no certificate held)")
        doc = core.large_out.pending()[0]
        return LargeForgery(out.data, doc.lk0, doc.manifest, core.me, Endpoint.org(target))
    finally:
        core.close()


async def open_session(host: str, port: int, who: Identity, platform_id: str, *, units: int = 1,
                       semq_id: int = 1) -> tuple[FrameStream, list[RawFrame]]:
    """A session at the platform as ``who``: (its stream, the frames after WELCOME)."""
    stream = await _connect(host, port, who.platform_tls)
    fs = FrameStream(stream)
    await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=Endpoint.org(who.org),
                                     target=Endpoint.platform(platform_id),
                                     body=Hello(semq_id=semq_id, units=units))))
    first = await fs.receive_batch()
    if first[0].kind is not Kind.WELCOME:
        await fs.aclose()
        raise ConnectionError(f"the platform answered HELLO with {first[0].kind.name}: {first[0].frame().body}")
    return fs, first[1:]
