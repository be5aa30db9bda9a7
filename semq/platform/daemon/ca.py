"""The relay's certificate authority, live (security on): the TLS context
every new connection is checked with, the answers to CERT_REQUEST, and the
CA's state picked up without a restart when ``semq platform revoke`` /
``enroll`` (or another instance, through the shared store) change it —
then pushed to every connected node: the new revocation list (CRL) and the
changed organizations' certificates; revoked organizations' sessions
closed."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from semq.identity.crypto import CryptoError
from semq.store.db import STORE_ERRORS
from semq.umxt_protocol import (
    CertResponse,
    Crl,
    Endpoint,
    Error,
    Frame,
    Kind,
    NodeType,
    ResultCode,
    encode_frame,
)
from semq.umxt_protocol.units import route_org

from ..core import PlatformCore
from .session import Session
from .settings import PlatformSettings

__all__ = ["CaWatch"]

log = logging.getLogger("semq.platform")


class CaWatch:
    """The CA's state as the relay serves it. ``store`` runs a call through
    the relay's store gate; ``sessions`` are the relay's, by endpoint."""

    def __init__(self, settings: PlatformSettings, core: PlatformCore, store: Callable[..., Awaitable[Any]],
                 sessions: Mapping[Endpoint, Session]) -> None:
        self.s = settings
        self.core = core
        self._store = store
        self._sessions = sessions
        self.ssl_context: ssl.SSLContext | None = settings.security.ssl_context() if settings.security else None
        self._lock = trio.Lock()  # one reload of the CA state at a time (check)

    async def cert_response(self, to: Endpoint, about: Endpoint) -> bytes:
        """The answer to a CERT_REQUEST: the usable certificates the CA
        issued; or, for an organization without one, why: CERT_REVOKED,
        AUTH_FAILED (expired), UNKNOWN_CERTIFICATE (known here, none
        issued yet) — the node's documents to it wait — or UNKNOWN_TARGET
        (the platform does not know it: they fail)."""
        sec = self.s.security
        body: CertResponse | None
        if sec is None:
            body = CertResponse(endpoint=about, code=ResultCode.UNKNOWN_CERTIFICATE)
        else:
            body = sec.cert_response(about)
            if body is None:
                # Perhaps enrolled a moment ago by another process (semq
                # platform enroll, node init --enroll-from): the CA issued
                # it, so it is served from then on, not from our next look.
                await self.check()
                body = sec.cert_response(about)
            if body is None:
                known = about.node_type is NodeType.ORGANIZATION and await self._store(self.core.is_known, about)
                body = CertResponse(endpoint=about,
                                    code=ResultCode.UNKNOWN_CERTIFICATE if known else ResultCode.UNKNOWN_TARGET)
        return encode_frame(Frame(kind=Kind.CERT_RESPONSE, source=self.core.me, target=to, body=body))

    def crl_frame(self, to: Endpoint) -> bytes:
        assert self.s.security is not None
        return encode_frame(Frame(kind=Kind.CRL, source=self.core.me, target=to,
                                  body=Crl(der=self.s.security.crl_der)))

    async def watch(self) -> None:
        """``semq platform revoke`` / ``enroll`` rewrite the CA files; pick
        them up without a restart (``check``)."""
        while True:
            await trio.sleep(self.s.crl_check_interval)
            if self.core.pg:  # another instance's enrollments and revocations, through the store
                try:
                    await self._store(self.core.share_ca, self.s.security.pdir / "ca")  # type: ignore[union-attr]
                except (*STORE_ERRORS, OSError) as e:
                    log.error("sharing the CA state through the store: %s", e)
            await self.check()

    async def check(self) -> None:
        """If the CA's state changed (two stats; or its revocation list is
        due for re-signing): reload it — new TLS context, new directory —
        and tell every connected node: the new revocation list (CRL frame)
        and, for each organization whose usable certificates changed (a
        rollover, an enrollment, a revocation), its new CERT_RESPONSE, so
        senders stop sealing to a revoked key and pick up a new one within
        seconds. Sessions of revoked organizations are closed."""
        sec = self.s.security
        assert sec is not None
        async with self._lock:
            if not sec.changed():
                return
            before, crl_before = dict(sec.fingerprints), sec.crl_der
            try:
                await trio.to_thread.run_sync(sec.reload)
            except (OSError, CryptoError) as e:
                # e.g. a file half-restored by hand, a full disk: keep serving
                # with what we hold, look again at the next check.
                log.error("cannot reload the CA state: %s", e)
                return
            self.ssl_context = sec.ssl_context()
            after = sec.fingerprints
            changed = sorted(o for o in before.keys() | after.keys() if before.get(o) != after.get(o))
            revoked = sec.revoked_orgs()
            answers = [sec.cert_response(Endpoint.org(o)) for o in changed]
            for ep, session in list(self._sessions.items()):
                if ep.node_id in revoked:
                    log.warning("%s is revoked: closing its session", ep)
                    session.enqueue([encode_frame(Frame(kind=Kind.ERROR, source=self.core.me, target=route_org(ep),
                                                        body=Error(code=ResultCode.CERT_REVOKED,
                                                                   message="certificate revoked")))])
                    session.cancel_scope.deadline = trio.current_time() + 1
                    continue
                push = [self.crl_frame(route_org(ep))] if sec.crl_der != crl_before else []
                push += [encode_frame(Frame(kind=Kind.CERT_RESPONSE, source=self.core.me, target=route_org(ep), body=a))
                         for a in answers if a is not None]
                session.enqueue(push)
            log.info("CA state reloaded (%d revoked organizations; certificates changed for %s)", len(revoked),
                     ", ".join(changed) or "none")
