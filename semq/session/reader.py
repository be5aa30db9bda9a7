"""The session layer: one reader per UMX-T connection (trio-websocket's
shape: one reader task draining events through a ``{EventType: handler}``
table, one send lock).

Every connection SEMQ speaks — a node's session with the platform, each
node's session at the relay, both directions of a direct link — is read by
one ``SessionReader``. Its ``FramePump`` reads ahead while the previous
batch is in the store; the reader takes everything that arrived, lets the
role *screen* the whole batch (flow control, who may speak on the link),
then walks it once: message frames (kinds 1..31) are gathered into one list
handed to the role in one call — one store transaction per batch, the
group commit the daemons' speed rests on — and every session frame goes
through the ``{Kind: handler}`` table.

The session kinds are handled here, once, for every role:

- PING is answered with PONG (through the role's ``send``: the
  connection's one send lock, or the relay's outgoing queue);
- PONG needs nothing (its arrival is the traffic that keeps a session up);
- a peer's ERROR is logged (unless the role asks not to: a relay does not
  let every node write into its log);
- BYE ends the session: ``ConnectionClosed``;
- nothing read for ``idle`` seconds ends it: ``SessionIdle`` (a
  ``trio.TooSlowError``, as ``trio.fail_after`` would raise).

A role adds handlers for its own session kinds (CERT_REQUEST at the relay,
CERT_RESPONSE at a node, ...); a kind nobody handles is ignored, as it
always was. ``ping_every`` is the pinger of the sides that ping.

The reader never returns normally: it ends by the exception that ended the
session (``ConnectionClosed``, ``RemoteProtocolError``, ``SessionIdle``, or
whatever a handler raised), inside an exception group (its pump runs in a
nursery of its own): catch with ``except*``, name the cause with
``first_exception``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

import trio

from semq.tracking.events import now_ms
from semq.umxt_protocol import Endpoint, Error, Frame, Kind, Ping, Pong, RawFrame, encode_frame

from .transport import ConnectionClosed, FramePump, FrameStream

__all__ = ["SESSION_KINDS", "Handler", "Messages", "Screen", "SessionIdle", "SessionReader", "first_exception",
           "ping_every"]

_log = logging.getLogger("semq.session")

# A handler of one session frame. What it returns, if anything, are message
# frames to handle with this batch, ahead of the batch's own (a node's
# documents held back for a certificate that has just come).
Handler = Callable[[RawFrame], Awaitable[Sequence[RawFrame] | None]]
# The role's handler of a batch's message frames: one call, one transaction.
Messages = Callable[[list[RawFrame]], Awaitable[None]]
# The role's look at a whole batch before its frames are dispatched: returns
# the frames to go on with (flow control may refuse some), or raises to end
# the session (a frame from someone the link is not with).
Screen = Callable[[list[RawFrame]], Awaitable[list[RawFrame]]]

# The kinds the reader itself handles; a role cannot take them over.
SESSION_KINDS: Final = frozenset({Kind.PING, Kind.PONG, Kind.ERROR, Kind.BYE})


class SessionIdle(trio.TooSlowError):
    """Nothing came from the peer for the session's idle time."""


def first_exception(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the session's
    nurseries nest them."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _ignore(_raw: RawFrame) -> None:
    return None


class SessionReader:
    """Reads one connection for as long as it lasts (module docstring).

    ``me`` / ``peer``: the endpoints of this side and of the other (a PONG
    goes from ``me`` to ``peer``); ``name``: the peer in the log and in
    ``ConnectionClosed`` ("platform", an organization). ``send``: how this
    side writes a frame (default: ``fs.send``, the connection's send lock).
    """

    def __init__(self, fs: FrameStream, *, me: Endpoint, peer: Endpoint, name: str, messages: Messages,
                 handlers: Mapping[Kind, Handler] | None = None, screen: Screen | None = None,
                 send: Callable[[bytes], Awaitable[None]] | None = None, idle: float | None = None,
                 log_errors: bool = True, log: logging.Logger = _log) -> None:
        self.fs = fs
        self.me = me
        self.peer = peer
        self.name = name
        self.idle = idle
        self.log = log
        self._messages = messages
        self._screen = screen
        self._send = send if send is not None else fs.send
        taken = SESSION_KINDS.intersection(handlers or ())
        if taken:
            raise ValueError(f"session kinds are the reader's: {sorted(k.name for k in taken)}")
        self.table: dict[Kind, Handler] = {
            Kind.PING: self._ping, Kind.PONG: _ignore, Kind.ERROR: self._error if log_errors else _ignore,
            Kind.BYE: self._bye, **(handlers or {}),
        }

    async def run(self, first: Sequence[RawFrame] = ()) -> None:
        """Read until the session ends (module docstring: never returns
        normally). ``first``: frames that came with the handshake's, still
        to be handled."""
        pump = FramePump(self.fs)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.run)
            await self._drain(pump, list(first))

    async def _drain(self, pump: FramePump, batch: list[RawFrame]) -> None:
        table, messages, screen, idle = self.table, self._messages, self._screen, self.idle
        while True:
            if not batch:
                if idle is None:
                    batch = await pump.take()
                else:
                    with trio.move_on_after(idle):
                        batch = await pump.take()
                    if not batch:
                        raise SessionIdle(f"nothing received from {self.name} for {idle:.0f} s")
            if screen is not None:
                batch = await screen(batch)
            msgs: list[RawFrame] = []
            for raw in batch:
                if raw.kind.is_message:  # (the hot path: one test, one append)
                    msgs.append(raw)
                    continue
                handler = table.get(raw.kind)
                if handler is not None:
                    more = await handler(raw)
                    if more:
                        msgs[:0] = more
            batch = []
            if msgs:
                await messages(msgs)

    async def _ping(self, raw: RawFrame) -> None:
        ping = raw.frame().body
        assert isinstance(ping, Ping)
        await self._send(encode_frame(Frame(kind=Kind.PONG, source=self.me, target=self.peer,
                                            body=Pong(nonce=ping.nonce, time_ms=now_ms()))))

    async def _error(self, raw: RawFrame) -> None:
        err = raw.frame().body
        assert isinstance(err, Error)
        self.log.warning("%s says %s (%d): %s", self.name, err.code.name, err.code, err.message)

    async def _bye(self, _raw: RawFrame) -> None:
        raise ConnectionClosed(f"{self.name} said BYE")


async def ping_every(fs: FrameStream, me: Endpoint, peer: Endpoint, interval: float) -> None:
    """PING the peer every ``interval`` s, for ever: its PONG (any frame)
    is the traffic that keeps both sides' idle timeouts from firing."""
    nonce = 0
    while True:
        await trio.sleep(interval)
        nonce += 1
        await fs.send(encode_frame(Frame(kind=Kind.PING, source=me, target=peer,
                                         body=Ping(nonce=nonce, time_ms=now_ms()))))
