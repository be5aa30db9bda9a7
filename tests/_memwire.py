"""The daemons without sockets or processes: node daemons connected to the
platform daemon through ``trio.testing.memory_stream_pair()``, under the
fake clock of pytest-trio's ``autojump_clock`` (docs/STYLE: "Test the
daemons over memory streams with a fake clock").

- ``Wire`` connects any number of node daemons to one platform daemon (and
  runs the platform's inquiry and CA-watch tasks, which
  ``PlatformDaemon.run`` starts beside its listeners). Each node's link can
  be cut alone (``cut("56001")``), at an exact frame (``cut_when``), or
  every link at once; a node in ``down`` (everyone while ``up`` is false)
  cannot reconnect. Every frame a node writes and reads is recorded
  (``sent`` / ``received``, ``link``) with the fake time it passed.
- ``FakePlatform`` holds the platform's end of one node's link, to send the
  node what no honest platform would (more than its window) or nothing;
  ``Peer`` is the same for a hand-made node talking to the real platform.
- ``InlineGate`` runs each store call on the event loop instead of a
  worker thread (``Wire`` and ``FakePlatform`` set it; ``inline_threads``
  does the same for the certificate work): the fake clock then jumps only
  when every task truly waits, so ``autojump_threshold = 0`` is safe and no
  wait depends on how loaded the machine is. The worker threads run in the
  end-to-end tests with real processes.
- ``couple_clocks`` makes the cores' millisecond clocks (inquiry schedules,
  expiry, the quota's recount) follow the fake clock, so backoffs of
  minutes take no real time.
- Stores are read through a sqlite connection of the test's own, as an
  application would (the daemon's connection belongs to its store thread).

Every wait is bounded in fake time (``trio.fail_after``)."""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon import NodeDaemon, NodeSettings
from semq.platform.core import PlatformCore
from semq.platform.daemon import PlatformDaemon, PlatformSettings
from semq.settings.config import Address
from semq.store.gate import StoreGate
from semq.umxt_protocol import Frame, FrameDecoder, Kind, RawFrame, encode_frame

__all__ = [
    "A",
    "B",
    "C",
    "FakePlatform",
    "InlineGate",
    "Peer",
    "Seen",
    "Wire",
    "accept",
    "cores",
    "count",
    "couple_clocks",
    "fake_now_ms",
    "inline_threads",
    "node_core",
    "platform",
    "platform_core",
    "rows",
    "wait_for",
]

A, B, C = "10008", "56001", "77002"
T = TypeVar("T")
_SEQ = itertools.count()


@dataclass(frozen=True)
class Seen:
    """One frame that passed a link: when (fake s), its place in the order
    of every frame recorded (both ways: several pass at one fake instant),
    and the frame."""

    at: float
    seq: int
    raw: RawFrame

    @property
    def frame(self) -> Frame:
        return self.raw.frame()

    @property
    def record_id(self) -> int:
        """The LK0 record id of a DATA frame."""
        return self.raw.data_prefix()[0].record_id


class InlineGate(StoreGate):
    """A store gate that calls the store on the event loop: one call at a
    time, as the real gate, and never abandoned half-way (nothing can
    cancel a synchronous call)."""

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self.calls += 1
        await trio.lowlevel.checkpoint()
        return fn(*args, **kwargs)


class _Tap(trio.abc.Stream):
    """One end of a memory stream pair that records the frames passing it
    both ways (one decoder per direction per connection: a cut mid-frame
    leaves only its own decoder with half a frame)."""

    def __init__(self, inner: trio.abc.Stream, sent: list[Seen], received: list[Seen],
                 after: Callable[[], None]) -> None:
        self.inner = inner
        self._out, self._in = FrameDecoder(), FrameDecoder()
        self._sent, self._received = sent, received
        self._after = after

    def _feed(self, dec: FrameDecoder, data: bytes, into: list[Seen]) -> None:
        dec.receive_data(bytes(data))
        now = trio.current_time()
        into.extend(Seen(now, next(_SEQ), raw) for raw in dec)
        self._after()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._feed(self._out, bytes(data), self._sent)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self._feed(self._in, bytes(data), self._received)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class Wire:
    """Connects node daemons to ``platform`` through memory streams.

    ``node(core)`` makes a node daemon whose connections go through this
    wire; ``cut(node_id)`` closes that node's link (both ends, as a broken
    TCP connection would), ``cut()`` every link; a node in ``down`` (or
    every node while ``up`` is false) cannot connect: its daemon backs off
    and tries again. ``sent[node_id]`` / ``received[node_id]``: the frames
    the node wrote / read, over all its connections (``tap=False``: none
    recorded, for TLS links whose bytes are ciphertext)."""

    def __init__(self, platform: PlatformDaemon, nursery: trio.Nursery, *, tap: bool = True,
                 inline: bool = True) -> None:
        self.platform = platform
        self.inline = inline
        if inline:
            platform.gate = InlineGate()
        # What PlatformDaemon.run starts besides its listeners: the inquiries
        # about delivered, unacknowledged copies and the CA watch.
        nursery.start_soon(platform._inquirer)
        if platform.s.security is not None:
            nursery.start_soon(platform.ca.watch)
        self.nursery = nursery
        self.tap = tap
        self.links: dict[str, list[trio.abc.Stream]] = {}
        self.up = True
        self.down: set[str] = set()
        self.connects: dict[str, int] = {}
        self.sent: dict[str, list[Seen]] = {}
        self.received: dict[str, list[Seen]] = {}
        self._cut_when: dict[str, tuple[Callable[[], bool], trio.Event]] = {}
        self._stay_down: set[str] = set()

    def connector(self, node_id: str) -> Callable[[Address], Any]:
        async def connect(_address: Address) -> trio.abc.Stream:
            return await self._connect(node_id)
        return connect

    async def connect(self, _address: Address | None = None) -> trio.abc.Stream:
        """A connection not attributed to a node (``cut()`` still closes it)."""
        return await self._connect("")

    async def _connect(self, node_id: str) -> trio.abc.Stream:
        if not self.up or node_id in self.down:
            raise OSError(f"platform unreachable from {node_id or 'a node'}")
        client, server = trio.testing.memory_stream_pair()
        self.links.setdefault(node_id, []).extend([client, server])
        self.connects[node_id] = self.connects.get(node_id, 0) + 1
        self.nursery.start_soon(self.platform._handle, server)
        if not self.tap:
            return client
        return _Tap(client, self.sent.setdefault(node_id, []), self.received.setdefault(node_id, []),
                    partial(self._check, node_id))

    def cut_when(self, node_id: str, cond: Callable[[], bool], *, stay_down: bool = False) -> trio.Event:
        """Cut ``node_id``'s link as soon as ``cond()`` holds, checked at every
        frame recorded on it (so mid-stream, at an exact point, even when the
        whole stream passes at one fake instant); ``stay_down``: and keep the
        node from reconnecting (until the test removes it from ``down``).
        The event is set once cut."""
        done = trio.Event()
        self._cut_when[node_id] = (cond, done)
        if stay_down:
            self._stay_down.add(node_id)
        return done

    def _check(self, node_id: str) -> None:
        when = self._cut_when.get(node_id)
        if when is not None and when[0]():
            del self._cut_when[node_id]
            if node_id in self._stay_down:
                self._stay_down.discard(node_id)
                self.down.add(node_id)
            self.nursery.start_soon(self._cut_and_tell, node_id, when[1])

    async def _cut_and_tell(self, node_id: str, done: trio.Event) -> None:
        await self.cut(node_id)
        done.set()

    def node(self, core: NodeCore, **settings: Any) -> NodeDaemon:
        """A node daemon for ``core`` that connects through this wire."""
        d = NodeDaemon(core, NodeSettings(connect=self.connector(core.me.node_id), **settings))
        if self.inline:
            d.gate = InlineGate()
        return d

    async def start(self, core: NodeCore, **settings: Any) -> NodeDaemon:
        d = self.node(core, **settings)
        await self.nursery.start(d.run)
        return d

    async def cut(self, node_id: str | None = None) -> None:
        """Close one node's link (``node_id``) or every link (None)."""
        for nid in [node_id] if node_id is not None else list(self.links):
            for e in self.links.pop(nid, []):
                await e.aclose()

    def frames(self, node_id: str, kind: Kind, *, direction: str = "sent") -> list[Seen]:
        """The frames of ``kind`` the node wrote (``direction="received"``: read)."""
        log = (self.sent if direction == "sent" else self.received).get(node_id, [])
        return [s for s in log if s.raw.kind is kind]

    def link(self, node_id: str) -> list[tuple[str, Seen]]:
        """Both directions of a node's link in the order the frames passed:
        ("sent" or "received", frame)."""
        both = [("sent", s) for s in self.sent.get(node_id, [])]
        both += [("received", s) for s in self.received.get(node_id, [])]
        return sorted(both, key=lambda e: e[1].seq)


class Peer:
    """The test's end of a memory stream pair: what the other end writes is
    read with ``read_until`` and kept in ``got``; ``send`` writes frames.
    ``pair()`` makes a new pair and returns the other end (a new decoder:
    a cut leaves the old connection's half frame behind)."""

    def __init__(self) -> None:
        self.ends: list[trio.abc.Stream] = []
        self.end: trio.abc.Stream | None = None
        self._dec = FrameDecoder()
        self.got: list[Seen] = []
        self.connects = 0

    def pair(self) -> trio.abc.Stream:
        theirs, ours = trio.testing.memory_stream_pair()
        self.ends += [theirs, ours]
        self.end, self._dec = ours, FrameDecoder()
        self.connects += 1
        return theirs

    async def send(self, *frames: Frame | bytes) -> None:
        assert self.end is not None, "not connected"
        await self.end.send_all(b"".join(f if isinstance(f, bytes) else encode_frame(f) for f in frames))

    async def read_until(self, done: Callable[[], bool], timeout: float = 30) -> None:
        """Read what the other end writes until ``done()`` (fake seconds)."""
        with trio.fail_after(timeout):
            while not done():
                assert self.end is not None, "not connected"
                chunk = await self.end.receive_some(65536)
                if not chunk:
                    raise AssertionError(f"the other end closed; got {[s.raw.kind.name for s in self.got]}")
                self._dec.receive_data(bytes(chunk))
                now = trio.current_time()
                self.got += [Seen(now, next(_SEQ), raw) for raw in self._dec]

    def frames(self, kind: Kind) -> list[Seen]:
        return [s for s in self.got if s.raw.kind is kind]

    async def cut(self) -> None:
        for e in self.ends:
            await e.aclose()
        self.ends.clear()
        self.end = None


class FakePlatform(Peer):
    """The test standing in for the platform on one node's link, to send
    the node what no honest platform would (more than its window) or
    nothing at all. ``node(core)`` makes the daemon that connects here."""

    async def connect(self, _address: Address | None = None) -> trio.abc.Stream:
        return self.pair()

    def node(self, core: NodeCore, **settings: Any) -> NodeDaemon:
        d = NodeDaemon(core, NodeSettings(connect=self.connect, **settings))
        d.gate = InlineGate()
        return d


async def wait_for(pred: Callable[[], object], what: str, timeout: float = 600, every: float = 0.05) -> None:
    """Until ``pred()`` holds, looking every ``every`` fake seconds (a long
    wait looks less often: each look is a turn of the event loop); fails
    after ``timeout`` fake seconds naming ``what``."""
    try:
        with trio.fail_after(timeout):  # fake seconds
            while not pred():
                await trio.sleep(every)
    except trio.TooSlowError:
        raise AssertionError(f"timed out after {timeout} fake s waiting for {what}") from None


def rows(core: NodeCore | PlatformCore, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Read through a connection of our own, as an application would (the
    daemon's connection belongs to its store thread)."""
    c = sqlite3.connect(str(core.path))
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def count(core: NodeCore | PlatformCore, sql: str, *args: Any) -> int:
    return int(rows(core, sql, *args)[0][0])


def accept(core: NodeCore, docs: Sequence[NewDocument]) -> list[int]:
    """Hand ``docs`` over as an application does, through its own handle
    of the store; returns their record ids."""
    app = NodeCore(core.path, core.me.node_id, synchronous="OFF")
    try:
        return [lk.record_id for lk in app.accept(list(docs))]
    finally:
        app.close()


def platform_core(tmp_path: Path, orgs: Sequence[str] = (A, B), **kw: Any) -> PlatformCore:
    pcore = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF", **{"inquiry_interval": 15, **kw})
    pcore.register(list(orgs))
    return pcore


def node_core(tmp_path: Path, org: str, **kw: Any) -> NodeCore:
    return NodeCore(tmp_path / f"{org}.sqlite", org, create=True, synchronous="OFF",
                    **{"inquiry_interval": 15, **kw})


def cores(tmp_path: Path) -> tuple[PlatformCore, NodeCore, NodeCore]:
    """The platform (with 10008 and 56001 registered) and the two nodes' cores."""
    return platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)


@dataclass
class _Monotonic:
    """``time`` as semq.platform.core sees it, its monotonic clock the fake one."""

    clock: trio.testing.MockClock
    real: Any = field(default=time)

    def monotonic(self) -> float:
        return self.clock.current_time()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


START_MS = 1_800_000_000_000  # the cores' time (ms) at fake time 0 once coupled


def fake_now_ms() -> int:
    """The cores' clock once coupled (``couple_clocks``), read in a trio task."""
    return START_MS + int(trio.current_time() * 1000)


async def _inline_to_thread(fn: Callable[..., T], *args: Any, **_: Any) -> T:
    await trio.lowlevel.checkpoint()
    return fn(*args)


def inline_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trio.to_thread.run_sync`` (the daemons' certificate work) on the
    event loop too, for the reason of ``InlineGate``."""
    monkeypatch.setattr(trio.to_thread, "run_sync", _inline_to_thread)


def couple_clocks(monkeypatch: pytest.MonkeyPatch, clock: trio.testing.MockClock,
                  start_ms: int = START_MS) -> Callable[[], int]:
    """The node and platform cores' clocks (ms) follow the fake clock from
    ``start_ms`` on: inquiry schedules, expiry and the quota's recount run
    in fake time. Returns that clock. (``MockClock.current_time`` is safe
    from the store threads: it reads, never moves, the clock.)"""
    import semq.node.batch
    import semq.platform.copies
    import semq.platform.core
    import semq.platform.nodes
    import semq.platform.quota

    def now_ms() -> int:
        return start_ms + int(clock.current_time() * 1000)

    monkeypatch.setattr(semq.node.batch, "now_ms", now_ms)
    monkeypatch.setattr(semq.platform.core, "now_ms", now_ms)  # (the facade reads the clock for its roles)
    for module in (semq.platform.quota, semq.platform.nodes, semq.platform.copies):  # their monotonic clocks
        monkeypatch.setattr(module, "time", _Monotonic(clock))
    return now_ms


def platform(pcore: PlatformCore, **settings: Any) -> PlatformDaemon:
    return PlatformDaemon(pcore, PlatformSettings(**settings))
