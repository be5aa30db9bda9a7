"""A connection's way into the relay, up to a HELLO it may accept: mutual
TLS (the organization the client certificate names, its fingerprint), the
listener's admission (semq.session.admission: connections in all, not
authenticated yet, per organization, its units granted counting), a frame
of at most PLATFORM_PRE_AUTH_BYTES before HELLO, the HELLO within
``hello_timeout``. What passes goes to the relay's session
(``PlatformDaemon._session``), which checks it against the store."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable

import trio

from semq.identity.crypto import CryptoError
from semq.session.admission import Admission
from semq.session.transport import ConnectionClosed, FrameStream
from semq.settings.bounds import PLATFORM_PRE_AUTH_BYTES
from semq.umxt_protocol import (
    Endpoint,
    Hello,
    Kind,
    NodeType,
    ProtocolError,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
)

from ..core import PlatformCore
from .ca import CaWatch
from .session import Admitted, Seen, peer_host
from .settings import PlatformSettings

__all__ = ["Door", "Enter"]

log = logging.getLogger("semq.platform")

# The relay's session for an accepted HELLO: (stream, organization, HELLO,
# its body, the frames read with it, the organization its certificate
# names (None without TLS), what the relay saw of the connection).
Enter = Callable[[FrameStream, Endpoint, RawFrame, Hello, list[RawFrame], str | None, Seen], Awaitable[None]]


class Door:
    """The listener's side of each connection until its HELLO passes.
    ``grants``: the units granted to each organization seen (the relay
    keeps it up to date), for its connection allowance; ``stats``: the
    relay's counters."""

    def __init__(self, settings: PlatformSettings, core: PlatformCore, ca: CaWatch, grants: dict[str, int],
                 stats: dict[str, int], enter: Enter) -> None:
        self.s = settings
        self.core = core
        self._ca = ca
        self.grants = grants
        self.stats = stats
        self._enter = enter
        self.admission = Admission("platform", total=settings.max_connections, handshakes=settings.max_handshakes,
                                   per_identity=self._allowance, reserve=settings.fd_reserve)

    async def _tls(self, stream: trio.abc.Stream) -> tuple[trio.abc.Stream, str, str] | None:
        """Mutual TLS 1.3: a certificate not issued by our CA, expired or
        revoked is refused at the handshake. Returns the stream, the
        organization the client certificate names and its fingerprint, or
        None (closed)."""
        context = self._ca.ssl_context
        assert context is not None and self.s.security is not None
        tls = trio.SSLStream(stream, context, server_side=True)
        try:
            with trio.fail_after(self.s.hello_timeout):
                await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
            org = self.s.security.peer_org(der)
            fp = hashlib.sha256(der).hexdigest() if der else ""
        except (trio.BrokenResourceError, trio.TooSlowError, CryptoError) as e:
            self.stats["tls_refused"] += 1
            log.warning("TLS handshake refused: %s", e.__cause__ or e)
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()
            return None
        return tls, org, fp

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection accepted by the listener, for as long as it lasts."""
        self.stats["connections"] += 1
        adm = self.admission
        if adm.enter() is not None:  # (said in the log, rate-limited)
            self.stats["connections_refused"] = self.stats.get("connections_refused", 0) + 1
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()
            return
        admitted = Admitted()
        try:
            await self._connection(stream, admitted)
        finally:
            adm.leave(admitted.org)

    async def _connection(self, stream: trio.abc.Stream, admitted: Admitted) -> None:
        bound: str | None = None
        seen = Seen(peer_host(stream))
        if self._ca.ssl_context is not None:
            res = await self._tls(stream)
            if res is None:
                return
            stream, bound, seen.fingerprint = res
        # Until its HELLO is accepted, a peer gets no more than a small frame.
        fs = FrameStream(stream, max_frame=min(PLATFORM_PRE_AUTH_BYTES, self.s.max_frame))
        if bound is not None and not await self._admit(fs, bound, admitted):
            return
        await self._serve(fs, bound, seen, admitted)

    def _allowance(self, org: str) -> int:
        """Connections ``org`` may hold: ``max_connections_per_org``, one more
        per unit granted beyond the first (never what its HELLO says)."""
        units = min(self.grants.get(org, 1), self.s.max_units_per_org)
        return self.s.max_connections_per_org + units - 1

    async def _admit(self, fs: FrameStream, org: str, admitted: Admitted) -> bool:
        """Count the connection for ``org`` (Admission), or refuse it."""
        why = self.admission.admit(org)
        if why is not None:
            self.stats["connections_refused"] = self.stats.get("connections_refused", 0) + 1
            await fs.send_error(self.core.me, Endpoint.org(org), ResultCode.TOO_MANY_CONNECTIONS, why)
            return False
        admitted.org = org
        return True

    async def _serve(self, fs: FrameStream, bound: str | None, seen: Seen, admitted: Admitted) -> None:
        try:
            with trio.fail_after(self.s.hello_timeout):
                first = await fs.receive_batch()
        except trio.TooSlowError:
            await fs.send_error(self.core.me, None, ResultCode.HANDSHAKE_TIMEOUT, "no HELLO within the time limit")
            return
        except RemoteProtocolError as e:
            await fs.send_error(self.core.me, None, e.code, str(e))
            return
        except ConnectionClosed:
            await fs.aclose()
            return
        hello = first[0]
        if hello.kind is not Kind.HELLO:
            await fs.send_error(self.core.me, hello.source, ResultCode.NOT_AUTHENTICATED,
                                f"first frame must be HELLO, not {hello.kind.name}")
            return
        try:
            body = hello.frame().body
            assert isinstance(body, Hello)
        except ProtocolError as e:
            await fs.send_error(self.core.me, hello.source, e.code, str(e))
            return
        ep = hello.source
        if ep.node_type is not NodeType.ORGANIZATION:
            await fs.send_error(self.core.me, ep, ResultCode.AUTH_FAILED,
                                f"only organizations connect here, not a {ep.node_type.name.lower()} ({ep})")
            return
        if bound is None and not await self._admit(fs, ep.node_id, admitted):
            return  # (without TLS the organization is known from HELLO on)
        await self._enter(fs, ep, hello, body, first, bound, seen)
