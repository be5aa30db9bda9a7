"""The direct-link listener: the links other nodes dial to us (semq.node.daemon.direct
says what each side checks). Bounded against hostile partners
(semq.settings.bounds): links in all and per organization, links not
authenticated yet, the time to authenticate, descriptors kept for the
node's own use (semq.session.admission), a small frame before HELLO, and one
byte budget per organization for what its links buffer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from semq.identity.crypto import CryptoError, peer_certificate
from semq.session.admission import Admission, raise_descriptor_limit
from semq.session.transport import ByteBudget, ConnectionClosed, FrameStream
from semq.settings.bounds import DIRECT_PRE_AUTH_BYTES
from semq.settings.config import Address
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    Endpoint,
    Frame,
    Kind,
    RemoteProtocolError,
    ResultCode,
    Welcome,
    encode_frame,
)

from .link import WILDCARDS, Link, LinkHost, close_stream, read_link
from .link import why as error_text
from .settings import DirectSettings

__all__ = ["DirectListener"]

log = logging.getLogger("semq.node.direct")


class DirectListener:
    """Our listener. The links it accepts go into ``inbound`` (the
    DirectLinks' list, for ``semq status``) and its counts into ``stats``;
    ``tls`` gives the node's (server, client) TLS contexts."""

    def __init__(self, host: LinkHost, settings: DirectSettings, inbound: list[Link], stats: dict[str, int],
                 tls: Callable[[], tuple[Any, Any]]) -> None:
        self.host = host
        self.s = settings
        self.inbound = inbound
        self.stats = stats
        self._tls = tls
        self.bound: Address | None = None  # where it listens (its port when 0 was asked)
        # Who may hold a link here, and the bytes each organization's links buffer together.
        self.admission = Admission("direct-link listener", total=settings.max_links,
                                   handshakes=settings.handshakes, per_identity=lambda _org: self.s.max_links_per_org,
                                   reserve=settings.fd_reserve)
        self.budgets: dict[str, ByteBudget] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listen = self.s.listen
        assert listen is not None
        host = None if listen.host in WILDCARDS else listen.host
        try:
            listeners = await trio.open_tcp_listeners(listen.port, host=host)
        except OSError as e:
            raise OSError(f"cannot listen for direct links on {listen}: {e.strerror or e} (another node may"
                          " be running there)") from e
        port = listeners[0].socket.getsockname()[1]
        self.bound = Address(listen.host, port)
        raise_descriptor_limit()
        log.info("listening for direct links on %s", self.bound)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._accept, listeners)
            task_status.started()

    async def _accept(self, stream: trio.SocketStream) -> None:
        adm = self.admission
        if adm.enter() is not None:  # (said in the log, rate-limited)
            self.stats["refused_in"] += 1
            await close_stream(stream)
            return
        org: list[str] = []  # the organization it was admitted as, once it is
        try:
            await self._serve(stream, org)
        except Exception:
            # A bug must cost one link, never the node.
            log.exception("direct link failed")
            await close_stream(stream)
        finally:
            adm.leave(org[0] if org else None)

    async def _serve(self, stream: trio.SocketStream, admitted: list[str]) -> None:
        """One link dialled to us: TLS, then (within ``hello_timeout`` of
        the connect, both together) the allow-list and the organization's
        allowance checked on its certificate before any frame is read, then
        a HELLO of at most DIRECT_PRE_AUTH_BYTES; only an accepted link
        reads documents, within its organization's byte budget."""
        try:
            peer_host = str(stream.socket.getpeername()[0])
        except OSError:
            peer_host = "?"
        server, _ = self._tls()
        sec = self.host.sec
        assert sec is not None
        me = self.host.me
        deadline = trio.current_time() + self.s.hello_timeout
        tls = trio.SSLStream(stream, server, server_side=True)
        try:
            with trio.fail_at(deadline):
                await tls.do_handshake()
            cert = peer_certificate(tls.getpeercert(binary_form=True), ca=sec.ca, crl=sec.directory.crl)
        except (trio.BrokenResourceError, trio.TooSlowError, CryptoError) as e:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s refused at the TLS handshake: %s", peer_host, e.__cause__ or e)
            await close_stream(stream)
            return
        fs = FrameStream(tls, max_frame=DIRECT_PRE_AUTH_BYTES)
        org = Endpoint.org(cert.org)
        refusal = None
        if self.s.allowed and cert.org not in self.s.allowed:
            # Right after the handshake: an organization we do not accept
            # gets no frame read at all.
            refusal = (ResultCode.DIRECT_NOT_ALLOWED, f"{me} does not accept direct links from {cert.org}")
        elif (why := self.admission.admit(cert.org)) is not None:
            refusal = (ResultCode.TOO_MANY_CONNECTIONS, why)
        else:
            admitted.append(cert.org)
        if refusal is not None:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) refused: %s", cert.org, peer_host, refusal[1])
            await fs.send_error(me, org, *refusal)
            return
        try:
            with trio.fail_at(deadline):
                first = await fs.receive_batch()
        except (trio.TooSlowError, ConnectionClosed, RemoteProtocolError) as e:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) closed before its HELLO: %s", org, peer_host, e)
            await fs.aclose()
            return
        hello = first[0]
        refusal = None
        if hello.kind is not Kind.HELLO:
            refusal = (ResultCode.NOT_AUTHENTICATED, f"first frame must be HELLO, not {hello.kind.name}")
        elif hello.source != org or hello.origin != org:
            refusal = (ResultCode.AUTH_FAILED, f"the TLS certificate names organization {cert.org}, not"
                                               f" {hello.source}")
        elif hello.target != me:
            refusal = (ResultCode.UNEXPECTED_FRAME, f"this is {me}, not {hello.target}")
        elif not sec.certs(cert.org):
            # Its documents could not be opened: they would wait in memory
            # for its certificate (lost if we stop), and an inquiry meanwhile
            # would be answered "not received" (a SaveFwd 1 one is then
            # reported dropped, and delivered when the certificate comes:
            # scripts/chaos --seed 2 --direct). A restarted node holds none
            # until the platform sends them: ask, and take the link once held.
            await self.host.ask_platform({org})
            with trio.move_on_after(self.s.timeout / 2):
                while not sec.certs(cert.org):
                    await trio.sleep(0.05)
            if not sec.certs(cert.org):
                refusal = (ResultCode.UNKNOWN_CERTIFICATE, f"{me} holds no certificate of {cert.org} yet (asked"
                                                           " the platform)")
        if refusal is not None:
            self.stats["refused_in"] += 1
            log.warning("direct link from %s (%s) refused: %s", cert.org, peer_host, refusal[1])
            await fs.send_error(me, org, *refusal)
            return
        # Accepted: documents up to the frame limit, within the budget its
        # organization's links share.
        fs.decoder.max_frame_size = DEFAULT_MAX_FRAME
        budget = self.budgets.get(cert.org)
        if budget is None:
            budget = self.budgets[cert.org] = ByteBudget(max(self.s.max_buffer_per_org, DEFAULT_MAX_FRAME))
        fs.budget = budget
        link = Link(cert.org, "in", peer_host, state="up")
        self.inbound.append(link)
        self.stats["links_in"] += 1
        log.info("direct link from %s (%s) up", cert.org, peer_host)
        try:
            await fs.send(encode_frame(Frame(kind=Kind.WELCOME, source=me, target=org,
                                             body=Welcome(window=self.host.s.window, server_time_ms=now_ms()))))
            await read_link(self.host, link, org, fs, first[1:], self.s.idle_timeout)
        except* (ConnectionClosed, OSError, trio.BrokenResourceError, RemoteProtocolError, trio.TooSlowError) as eg:
            link.error = error_text(eg)
        finally:
            link.state = "down"
            self.inbound.remove(link)
            log.info("direct link from %s down%s", cert.org, f": {link.error}" if link.error else "")
            await fs.aclose()
            if not len(budget):
                self.budgets.pop(cert.org, None)
