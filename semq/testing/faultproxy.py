"""A seeded, byte-level TCP fault proxy for reliability tests (docs/reliability.md).

It sits between clients (nodes) and an upstream (the platform) and, driven by a
:class:`FaultPlan`, delays and stalls chunks, cuts connections at chosen byte
offsets in either direction, and refuses reconnects for a while. It never
parses UMX-T: a cut lands wherever the offset says, mid-frame included, which is
exactly what the node and platform decoders must survive.

Determinism: every random choice comes from ``random.Random`` seeded with a
string derived from ``(plan.seed, connection index, direction)``. String seeds
are hashed with SHA-512 by :mod:`random`, so they do not depend on
``PYTHONHASHSEED`` and the same seed gives the same faults in every process.
What a connection will suffer is a pure function, :meth:`FaultPlan.connection_faults`,
so a test can ask for the planned cut offset and check that it happened there.
Chunk boundaries on real sockets depend on the kernel, so per-chunk delays are
reproducible only as far as the chunking is; byte offsets are exact.

Layout (trio conventions, STYLE "trio"): ``serve_fault_proxy(..., task_status=...)``
for ``nursery.start``; :class:`FaultProxy` for runtime control
(``cut_all``, ``refuse_for``, ``stall_for``, ``set_pass_through``),
``statistics()`` and ``aclose()``; ``open_fault_proxy`` as an async context
manager. ``python -m semq.testing.faultproxy`` runs it as a process for the
chaos script. The plan, its knobs and what it draws for each connection are
:mod:`semq.testing.faultplan` (re-exported here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import signal
import socket
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Final

import trio

from semq.testing.faultplan import (
    DEFAULT_MAX_CHUNK,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionFaults,
    Direction,
    FaultPlan,
    RefuseMode,
)

__all__ = [
    "DEFAULT_MAX_CHUNK",
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionFaults",
    "Direction",
    "FaultPlan",
    "FaultProxy",
    "FaultProxyStatistics",
    "RefuseMode",
    "main",
    "open_fault_proxy",
    "serve_fault_proxy",
]

_ACCEPT_ERROR_BACKOFF: Final = 0.1  # seconds to wait after EMFILE & co. (as trio.serve_listeners)
_LISTEN_BACKLOG: Final = 128

# An upstream connector: returns a fresh stream to the upstream for each client.
UpstreamConnector = Callable[[], Awaitable[trio.abc.Stream]]


@dataclass(frozen=True, kw_only=True)
class FaultProxyStatistics:
    """Counters since the proxy was created (``statistics()``)."""

    accepted: int  # every accepted client connection, refused ones included
    connections: int  # forwarded: upstream reached
    active: int  # open right now
    refusals: int  # accepted then refused (refuse period or max_connections)
    upstream_failures: int  # upstream could not be reached: client closed
    bytes_up: int  # forwarded client -> upstream
    bytes_down: int  # forwarded upstream -> client
    cuts: int  # connections cut (planned or by cut_all)
    delays: int  # chunks delayed by the plan
    stalls: int  # chunks stalled by the plan


@dataclass
class _Counters:
    accepted: int = 0
    connections: int = 0
    refusals: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    cuts: int = 0
    delays: int = 0
    stalls: int = 0


@dataclass(eq=False)
class _Connection:
    faults: ConnectionFaults
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    cut: bool = False  # set before scope.cancel(): closing must abort, and count once
    reset: bool = False


class _Cut(Exception):
    """A pump reached the planned cut offset."""


class FaultProxy:
    """The proxy engine and its runtime control.

    Explicit commands (``cut_all``, ``refuse_for``, ``stall_for``) always act;
    ``set_pass_through(True)`` switches off the *planned* faults only. Each
    command is synchronous and must be called from the trio thread that runs
    the proxy.
    """

    def __init__(self, plan: FaultPlan | None = None) -> None:
        self.plan: Final = plan if plan is not None else FaultPlan()
        self.port: int | None = None  # bound port once serve() has started
        self._pass_through = self.plan.pass_through
        self._next_index = 0
        self._active: set[_Connection] = set()
        self._counters = _Counters()
        self._refuse_until = -math.inf  # explicit refuse_for()
        self._refuse_mode = self.plan.refuse_mode
        self._plan_refuse_until = -math.inf  # refusal drawn by the plan after a cut
        self._stall_until = -math.inf
        self._serve_scope: trio.CancelScope | None = None
        self._closed = False
        self._stopped = trio.Event()

    # --- runtime control -------------------------------------------------

    def cut_all(self, *, reset: bool | None = None) -> int:
        """Cut every open connection now (FIN, or RST when ``reset``; default
        ``plan.cut_reset``). Returns how many were cut."""
        cut = 0
        for conn in list(self._active):
            if not conn.cut:
                conn.cut = True
                conn.reset = self.plan.cut_reset if reset is None else reset
                conn.scope.cancel()
                self._counters.cuts += 1
                cut += 1
        return cut

    def refuse_for(self, seconds: float, *, mode: RefuseMode | None = None) -> None:
        """Refuse new connections for ``seconds`` from now (open ones are kept;
        combine with ``cut_all`` to force reconnects into the refusal)."""
        if not seconds >= 0:
            raise ValueError(f"refuse_for({seconds!r}): seconds must be >= 0")
        self._refuse_until = trio.current_time() + seconds
        self._refuse_mode = mode if mode is not None else self.plan.refuse_mode

    def stall_for(self, seconds: float) -> None:
        """Forward nothing, in either direction on any connection, for ``seconds``."""
        if not seconds >= 0:
            raise ValueError(f"stall_for({seconds!r}): seconds must be >= 0")
        self._stall_until = trio.current_time() + seconds

    def set_pass_through(self, on: bool) -> None:
        """Switch the planned faults off (True) or back on (False). A refusal
        period the plan already started ends too when switched on."""
        self._pass_through = on
        if on:
            self._plan_refuse_until = -math.inf

    @property
    def pass_through(self) -> bool:
        return self._pass_through

    def statistics(self) -> FaultProxyStatistics:
        c = self._counters
        return FaultProxyStatistics(
            accepted=c.accepted,
            connections=c.connections,
            active=len(self._active),
            refusals=c.refusals,
            upstream_failures=c.upstream_failures,
            bytes_up=c.bytes_up,
            bytes_down=c.bytes_down,
            cuts=c.cuts,
            delays=c.delays,
            stalls=c.stalls,
        )

    def close(self) -> None:
        """Stop serving and close every connection (synchronous; see ``aclose``)."""
        self._closed = True
        if self._serve_scope is not None:
            self._serve_scope.cancel()
        for conn in list(self._active):
            conn.scope.cancel()

    async def aclose(self) -> None:
        """Close, and wait until ``serve`` has returned if it was running."""
        self.close()
        if self._serve_scope is not None:
            await self._stopped.wait()

    # --- serving ---------------------------------------------------------

    async def serve(
        self,
        listen_host: str,
        listen_port: int,
        upstream_host: str,
        upstream_port: int,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``listen_host:listen_port`` (0 = a free port) and forward
        to ``upstream_host:upstream_port`` until cancelled or closed. Reports
        the bound port through ``task_status``. Closing cancels every
        connection task; each closes its two sockets on the way out."""
        if self._serve_scope is not None or self._closed:
            raise RuntimeError("a FaultProxy serves once; make a new one")
        listener = await _open_listener(listen_host, listen_port)

        async def connect() -> trio.abc.Stream:
            return await trio.open_tcp_stream(upstream_host, upstream_port)

        try:
            async with listener, trio.open_nursery() as nursery:
                self._serve_scope = nursery.cancel_scope
                self.port = listener.socket.getsockname()[1]
                task_status.started(self.port)
                while True:  # one accept per iteration; ends by cancellation
                    try:
                        stream = await listener.accept()
                    except OSError:
                        # EMFILE/ENFILE/ENOBUFS: out of resources for a moment.
                        # Back off instead of spinning, like trio.serve_listeners.
                        await trio.sleep(_ACCEPT_ERROR_BACKOFF)
                        continue
                    nursery.start_soon(self.handle_connection, stream, connect)
        finally:
            self._stopped.set()

    async def handle_connection(
        self, client: trio.abc.Stream, connect_upstream: UpstreamConnector
    ) -> None:
        """Proxy one accepted client stream to a fresh upstream stream, applying
        the plan. Usable directly over memory streams in tests. Always closes
        ``client`` (and the upstream stream) before returning; never raises for
        the peers' I/O errors."""
        upstream: trio.abc.Stream | None = None
        conn: _Connection | None = None
        try:
            if self._closed:
                return
            self._counters.accepted += 1
            if self._refusing():
                self._counters.refusals += 1
                if self._refuse_mode_now() is RefuseMode.HOLD:
                    # Bounded: sleeps until the refusal ends (or the proxy closes).
                    await trio.sleep_until(self._refusal_end())
                return
            if len(self._active) >= self.plan.max_connections:
                self._counters.refusals += 1
                return
            index = self._next_index
            self._next_index += 1
            conn = _Connection(faults=self.plan.connection_faults(index))
            self._active.add(conn)
            with conn.scope:
                with trio.move_on_after(self.plan.connect_timeout):
                    try:
                        upstream = await connect_upstream()
                    except OSError:
                        pass
                if upstream is None:
                    self._counters.upstream_failures += 1
                    return
                self._counters.connections += 1
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, conn, client, upstream, Direction.UP)
                        nursery.start_soon(self._pump, conn, upstream, client, Direction.DOWN)
                except* _Cut:
                    pass
                except* (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # one peer went away: the connection ends, like a real link
        finally:
            if conn is not None:
                self._active.discard(conn)
            reset = conn is not None and conn.cut and conn.reset
            for stream in (client, upstream):
                if stream is not None:
                    if reset:
                        _set_linger_zero(stream)
                    await trio.aclose_forcefully(stream)

    async def _pump(
        self,
        conn: _Connection,
        src: trio.abc.Stream,
        dst: trio.abc.Stream,
        direction: Direction,
    ) -> None:
        plan = self.plan
        rng = plan.chunk_rng(conn.faults.index, direction)
        cut_at = conn.faults.cut_offset if conn.faults.cut_direction is direction else None
        forwarded = 0
        # Bounded: each iteration consumes at least one byte from src (or ends
        # at EOF); memory per direction is at most max_chunk.
        while True:
            data = await src.receive_some(plan.max_chunk)
            if not data:
                # Propagate the half-close so request/response peers still work.
                if isinstance(dst, trio.abc.HalfCloseableStream):
                    await dst.send_eof()
                return
            faulty = not self._pass_through
            # Draw the chunk's random values even in pass-through, so switching
            # modes at runtime does not shift the sequence for later chunks.
            delay = rng.uniform(*plan.delay)
            stall_roll = rng.random()
            stall = rng.uniform(*plan.stall_seconds)
            if faulty and delay > 0:
                self._counters.delays += 1
                await trio.sleep(delay)
            if faulty and stall_roll < plan.stall_probability:
                self._counters.stalls += 1
                await trio.sleep(stall)
            # Explicit stall_for(): re-check because it may be extended while we sleep.
            while trio.current_time() < self._stall_until:
                await trio.sleep_until(self._stall_until)
            if faulty and cut_at is not None and forwarded + len(data) >= cut_at:
                head = data[: cut_at - forwarded]
                await self._send(dst, head, direction, rng)
                conn.cut = True
                conn.reset = plan.cut_reset
                self._counters.cuts += 1
                if conn.faults.refuse_seconds > 0:
                    self._plan_refuse_until = max(
                        self._plan_refuse_until, trio.current_time() + conn.faults.refuse_seconds
                    )
                raise _Cut
            await self._send(dst, data, direction, rng)
            forwarded += len(data)

    async def _send(
        self,
        dst: trio.abc.Stream,
        data: bytes | bytearray,
        direction: Direction,
        rng: random.Random,
    ) -> None:
        if not data:
            return
        if self.plan.fragment > 0 and not self._pass_through:
            view = memoryview(data)
            pos = 0
            while pos < len(data):  # bounded: advances by >= 1 byte
                size = rng.randint(1, self.plan.fragment)
                await dst.send_all(view[pos : pos + size])
                self._count(direction, min(size, len(data) - pos))
                pos += size
        else:
            await dst.send_all(data)
            self._count(direction, len(data))

    def _count(self, direction: Direction, n: int) -> None:
        if direction is Direction.UP:
            self._counters.bytes_up += n
        else:
            self._counters.bytes_down += n

    def _refusing(self) -> bool:
        now = trio.current_time()
        if now < self._refuse_until:
            return True
        return not self._pass_through and now < self._plan_refuse_until

    def _refuse_mode_now(self) -> RefuseMode:
        if trio.current_time() < self._refuse_until:
            return self._refuse_mode
        return self.plan.refuse_mode

    def _refusal_end(self) -> float:
        now = trio.current_time()
        ends = [t for t in (self._refuse_until, self._plan_refuse_until) if t > now]
        return max(ends, default=now)


def _set_linger_zero(stream: trio.abc.Stream) -> None:
    """Make the next close send RST instead of FIN (SO_LINGER on, timeout 0)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already closed by the peer: nothing to reset


async def _open_listener(host: str, port: int) -> trio.SocketListener:
    # One socket on the first address only: trio.open_tcp_listeners binds every
    # address of a name, and with port 0 each would get a different port.
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    if not infos:
        raise OSError(f"cannot resolve listen address {host!r}")
    family, type_, proto, _, sockaddr = infos[0]
    sock = trio.socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(sockaddr)
        sock.listen(_LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_fault_proxy(
    listen_host: str,
    listen_port: int,
    upstream_host: str,
    upstream_port: int,
    *,
    plan: FaultPlan,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a fault proxy until cancelled; start with ``nursery.start``, which
    returns the bound port. For runtime control and statistics make the
    :class:`FaultProxy` yourself: ``await nursery.start(FaultProxy(plan).serve, ...)``."""
    await FaultProxy(plan).serve(
        listen_host, listen_port, upstream_host, upstream_port, task_status=task_status
    )


@asynccontextmanager
async def open_fault_proxy(
    listen_host: str,
    listen_port: int,
    upstream_host: str,
    upstream_port: int,
    *,
    plan: FaultPlan,
) -> AsyncIterator[FaultProxy]:
    """Run a proxy for the duration of the block; yields it with ``port`` set.
    Leaving the block closes the listener and every connection."""
    proxy = FaultProxy(plan)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve, listen_host, listen_port, upstream_host, upstream_port)
        try:
            yield proxy
        finally:
            proxy.close()


# --- command line ----------------------------------------------------------


class _UsageError(Exception):
    pass


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise _UsageError(f"{text!r}: expected HOST:PORT")
    try:
        value = int(port)
    except ValueError:
        raise _UsageError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 <= value <= 65535:
        raise _UsageError(f"{text!r}: port {value} is outside 0..65535")
    return host.strip("[]"), value


def _float_range(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        return (float(lo), float(hi if sep else lo))
    except ValueError:
        raise _UsageError(f"{text!r}: expected LOW:HIGH (seconds) or one number") from None


def _int_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo), int(hi if sep else lo))
    except ValueError:
        raise _UsageError(f"{text!r}: expected LOW:HIGH (bytes) or one number") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semq.testing.faultproxy",
        description=(
            "Seeded TCP fault proxy. Prints the bound port on the first line of stdout. "
            "SIGUSR1 cuts every connection; SIGUSR2 toggles pass-through; "
            "SIGTERM/SIGINT stop it and print statistics as JSON on stderr."
        ),
    )
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0 = free port)")
    p.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chaos", action="store_true", help="start from FaultPlan.chaos(seed)")
    p.add_argument("--delay", help="LOW:HIGH seconds before each chunk")
    p.add_argument("--stall-probability", type=float)
    p.add_argument("--stall-seconds", help="LOW:HIGH")
    p.add_argument("--cut-probability", type=float, help="per connection")
    p.add_argument("--cut-offset", help="LOW:HIGH bytes")
    p.add_argument("--cut-direction", choices=["up", "down", "both"])
    p.add_argument("--cut-reset", action="store_true", help="cut with RST instead of FIN")
    p.add_argument("--refuse-probability", type=float, help="after a planned cut")
    p.add_argument("--refuse-seconds", help="LOW:HIGH")
    p.add_argument("--refuse-mode", choices=[m.value for m in RefuseMode])
    p.add_argument("--fragment", type=int, help="forward in pieces of 1..N bytes")
    p.add_argument("--pass-through", action="store_true")
    p.add_argument("--max-connections", type=int)
    return p


def _plan_from_args(args: argparse.Namespace) -> FaultPlan:
    base = FaultPlan.chaos(args.seed) if args.chaos else FaultPlan(seed=args.seed)
    changes: dict[str, object] = {}
    if args.delay is not None:
        changes["delay"] = _float_range(args.delay)
    if args.stall_probability is not None:
        changes["stall_probability"] = args.stall_probability
    if args.stall_seconds is not None:
        changes["stall_seconds"] = _float_range(args.stall_seconds)
    if args.cut_probability is not None:
        changes["cut_probability"] = args.cut_probability
    if args.cut_offset is not None:
        changes["cut_offset"] = _int_range(args.cut_offset)
    if args.cut_direction is not None:
        changes["cut_directions"] = (
            (Direction.UP, Direction.DOWN)
            if args.cut_direction == "both"
            else (Direction(args.cut_direction),)
        )
    if args.cut_reset:
        changes["cut_reset"] = True
    if args.refuse_probability is not None:
        changes["refuse_probability"] = args.refuse_probability
    if args.refuse_seconds is not None:
        changes["refuse_seconds"] = _float_range(args.refuse_seconds)
    if args.refuse_mode is not None:
        changes["refuse_mode"] = RefuseMode(args.refuse_mode)
    if args.fragment is not None:
        changes["fragment"] = args.fragment
    if args.pass_through:
        changes["pass_through"] = True
    if args.max_connections is not None:
        changes["max_connections"] = args.max_connections
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


async def _run_cli(proxy: FaultProxy, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve, *listen, *upstream)
            # The first stdout line is the port, for scripts that start us.
            print(port, flush=True)
            async for signum in signals:  # one signal per iteration; ends on SIGTERM
                if signum == signal.SIGUSR1:
                    proxy.cut_all()
                elif signum == signal.SIGUSR2:
                    proxy.set_pass_through(not proxy.pass_through)
                else:
                    break
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Exit 0 on SIGTERM/SIGINT, 2 on a usage error, 1 when
    the listen address cannot be bound."""
    try:
        args = _parser().parse_args(argv)
        listen = _host_port(args.listen)
        upstream = _host_port(args.upstream)
        plan = _plan_from_args(args)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    proxy = FaultProxy(plan)
    try:
        trio.run(_run_cli, proxy, listen, upstream)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"error: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(proxy.statistics())), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
