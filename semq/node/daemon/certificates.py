"""A node's certificates of other organizations, on the trio side (security
on; the keys and pins themselves are semq.identity.security's): asking the
platform for the certificates our documents need (CERT_REQUEST, with
backoff), applying what it answers or pushes (CERT_RESPONSE, CRL), the
pins changed by ``semq node trust`` in another process, and the documents
that wait for a certificate — ours to an organization without one (kept
SS_INIT with the reason as their code), and DATA from an origin whose
certificate has not come yet (``deferred``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from semq.identity.crypto import CryptoError
from semq.session.transport import FrameStream
from semq.umxt_protocol import (
    CertRequest,
    CertResponse,
    Crl,
    Endpoint,
    Frame,
    Kind,
    NodeType,
    RawFrame,
    ResultCode,
    encode_frame,
)

if TYPE_CHECKING:
    from semq.identity.security import CertAnswer

    from ..core import NodeCore

__all__ = ["CertSettings", "Certificates"]

log = logging.getLogger("semq.node")

DEFERRED_MAX: Final = 10_000  # DATA kept for its origin's certificate; beyond it the origin's inquiry brings them again


class CertSettings(Protocol):
    """The settings the certificates read (semq.node.daemon.settings.NodeSettings)."""

    cert_retry: float  # s before an organization without a usable certificate is asked again; doubles
    cert_retry_max: float
    cert_refresh: float  # s between look-ups of every organization held
    pins_check: float  # s between looks at pins.json


class Certificates:
    """The certificates' state of one node daemon. ``store`` runs a call
    through the daemon's store gate; ``wake`` wakes its senders (documents
    may go now)."""

    def __init__(self, core: NodeCore, settings: CertSettings, store: Callable[..., Awaitable[Any]],
                 wake: Callable[[], None]) -> None:
        self.core = core
        self.s = settings
        self._store = store
        self._wake = wake
        self.asked: dict[Endpoint, float] = {}  # certificate look-ups in flight: endpoint -> when
        self.retry: dict[Endpoint, float] = {}  # s until an organization without a usable certificate is asked again
        self.waiting: dict[Endpoint, ResultCode] = {}  # organizations our documents wait for, and why
        self.deferred: list[RawFrame] = []  # DATA waiting for its origin's certificate
        self._limiter = trio.CapacityLimiter(1)  # certificate and pin work, off the event loop

    def new_session(self) -> None:
        """A new platform session: ask at once again."""
        self.asked.clear()
        self.retry.clear()

    def skip(self, now: float) -> frozenset[str]:
        """Organizations asked about recently and not answered with a usable
        certificate: the claims leave their documents for now."""
        return frozenset(ep.node_id for ep, t in self.asked.items() if now - t < self._retry_after(ep))

    def defer(self, frames: list[RawFrame]) -> None:
        """DATA whose origin's certificate we lack, kept until it comes
        (bounded: beyond it the origin's inquiry brings them again)."""
        if frames:
            self.deferred = (self.deferred + frames)[-DEFERRED_MAX:]

    def _retry_after(self, ep: Endpoint) -> float:
        return self.retry.get(ep, self.s.cert_retry)

    def ask(self, missing: set[Endpoint]) -> bytes:
        """CERT_REQUEST frames for certificates not asked for recently (an
        organization that had none usable is asked again with backoff)."""
        now = trio.current_time()
        frames = []
        for ep in missing:
            if now - self.asked.get(ep, -1e9) >= self._retry_after(ep):
                self.asked[ep] = now
                frames.append(self.request(ep))
        return b"".join(frames)

    def not_asked(self, eps: set[Endpoint]) -> None:
        """The requests for ``eps`` never left (the session broke)."""
        for ep in eps:
            self.asked.pop(ep, None)

    def request(self, ep: Endpoint) -> bytes:
        return encode_frame(Frame(kind=Kind.CERT_REQUEST, source=self.core.me, target=self.core.platform,
                                  body=CertRequest(endpoint=ep)))

    async def response(self, raw: RawFrame) -> list[RawFrame] | None:
        """The session's CERT_RESPONSE handler: when the organization now has
        usable certificates, the documents deferred for want of them are
        handed back, to be handled with the batch, ahead of its own."""
        if await self.apply(raw):
            released, self.deferred = self.deferred, []
            return released
        return None

    async def apply(self, raw: RawFrame) -> bool:
        """Apply a CERT_RESPONSE (asked for, or pushed by the platform after
        a rollover, an enrollment or a revocation): every certificate is
        verified against the CA and the revocation list and filtered
        through the pins (NodeSecurity.accept_response, in a worker
        thread). True if the organization now has usable certificates;
        otherwise our documents to it wait, or fail if the platform does
        not know it (_no_certificate)."""
        body = raw.frame().body
        assert isinstance(body, CertResponse)
        sec = self.core.sec
        if sec is None:
            return False
        ep = body.endpoint
        held = ep.node_type is NodeType.ORGANIZATION and bool(sec.directory.certificates(ep))
        if not (held or ep in self.asked or ep in self.waiting):
            return False  # a push about an organization we have nothing to do with
        try:
            answer = await trio.to_thread.run_sync(sec.accept_response, body, limiter=self._limiter)
        except (OSError, ValueError) as e:
            # pins.json cannot be written (disk full) or read (damaged): use
            # nothing we could not pin; asked again later.
            log.error("certificates of %s not applied: %s", ep, e)
            return False
        self._log_answer(answer)
        if answer.code is not ResultCode.OK:
            await self._no_certificate(ep, answer)
            return False
        self.asked.pop(ep, None)
        self.retry.pop(ep, None)
        if self.waiting.pop(ep, None) is not None:
            from semq.identity.security import WAITING_CODES

            await self._store(self.core.wait_target, ep, ResultCode.OK, WAITING_CODES)
            log.info("%s has a usable certificate again: its documents go", ep)
        self._wake()
        return True

    def _log_answer(self, answer: CertAnswer) -> None:
        adm = answer.admission
        if adm is None:
            return
        org = answer.endpoint.node_id
        for c, how in adm.pinned:
            if adm.pinned_before:
                log.warning("new certificate of organization %s accepted and pinned: fingerprint %s (serial"
                            " 0x%x), %s", org, c.fingerprint, c.serial, how)
            else:
                log.info("certificate of organization %s pinned on first use: fingerprint %s (serial 0x%x)",
                         org, c.fingerprint, c.serial)
        for c, why in adm.new_refusals:
            log.warning("certificate of organization %s NOT TRUSTED (%s): fingerprint %s (serial 0x%x) is %s;"
                        " it is not used (pinned: %s). If %s really has new keys, compare this fingerprint"
                        " with them out of band, then run: semq node trust %s %s",
                        org, ResultCode.CERT_NOT_TRUSTED.name, c.fingerprint, c.serial, why,
                        ", ".join(adm.pinned_before) or "none", org, org, c.fingerprint)

    async def _no_certificate(self, ep: Endpoint, answer: CertAnswer) -> None:
        """No usable, trusted certificate of ``ep``. An organization the
        platform does not know (UNKNOWN_TARGET): our documents to it fail,
        like UNKNOWN_TARGET without security. A known one (no certificate
        yet, revoked without a successor, expired, not trusted here): a
        passing condition — our SaveFwd 2/3 documents to it stay SS_INIT
        with the reason as their code and are retried with backoff;
        SaveFwd 1 ones fail as they would offline. Documents from it
        cannot be verified: dropped; its inquiries bring them again."""
        from semq.identity.security import WAITING_CODES

        code = answer.code
        detail = answer.detail or f"no usable certificate for {ep}"
        if code is ResultCode.UNKNOWN_TARGET:
            n = await self._store(self.core.fail_target, ep, code, detail)
            waiting = 0
            self.waiting.pop(ep, None)
        else:
            if int(code) not in WAITING_CODES:
                code = ResultCode.UNKNOWN_CERTIFICATE
            n = await self._store(partial(self.core.fail_target, ep, code, detail, save_fwd=1))
            waiting = await self._store(self.core.wait_target, ep, code, WAITING_CODES)
            delay = min(self.s.cert_retry_max, 2 * self.retry[ep]) if ep in self.retry else self.s.cert_retry
            self.retry[ep] = delay
            self.asked[ep] = trio.current_time()
            if self.waiting.get(ep) is not code:
                log.warning("documents to %s wait for a certificate: %s (%s); asking again in %.0f s, then"
                            " less often", ep, code.name, detail, delay)
            self.waiting[ep] = code
        before = len(self.deferred)
        self.deferred = [d for d in self.deferred if d.origin != ep]
        if n or waiting or before != len(self.deferred):
            log.warning("no certificate for %s (%s): %d document(s) to it failed, %d marked waiting, %d from it"
                        " dropped", ep, code.name, n, waiting, before - len(self.deferred))

    async def crl(self, raw: RawFrame) -> None:
        """The session's CRL handler: the platform's revocation list,
        checked against the CA and applied if newer than ours (then kept
        for the next start). Senders stop sealing to a revoked certificate
        at the next claim."""
        sec = self.core.sec
        if sec is None:
            return
        body = raw.frame().body
        assert isinstance(body, Crl)
        try:
            applied = await trio.to_thread.run_sync(sec.apply_crl, body.der, limiter=self._limiter)
        except (CryptoError, OSError) as e:
            log.warning("revocation list from the platform not applied: %s", e)
            return
        if applied:
            crl = sec.directory.crl
            log.info("revocation list applied (%d revoked certificate(s))", len(list(crl)) if crl else 0)
            self._wake()

    async def refresher(self, fs: FrameStream) -> None:
        """A task of the platform session, the pull side of certificate
        updates (the platform pushes them too): every cert_refresh s, from
        the start of a session, ask for the certificates of every
        organization held; and when pins.json changes (``semq node trust``
        in another process) read it again and ask for the organizations
        whose pins changed."""
        sec = self.core.sec
        assert sec is not None
        me = self.core.me.node_id
        last = -1e18
        while True:
            now = trio.current_time()
            if now - last >= self.s.cert_refresh:
                last = now
                orgs = [Endpoint.org(o) for o in sec.directory.orgs() if o != me]
                if orgs:
                    await fs.send(b"".join(self.request(ep) for ep in orgs))
            if sec.pins.changed():
                before = sec.pins.snapshot()
                try:
                    await trio.to_thread.run_sync(sec.pins.reload, limiter=self._limiter)
                except (ValueError, OSError) as e:
                    log.error("%s", e)
                else:
                    after = sec.pins.snapshot()
                    changed = sorted(o for o in before.keys() | after.keys() if before.get(o) != after.get(o))
                    if changed:
                        log.info("pins changed for %s: asking for their certificates again", ", ".join(changed))
                        eps = [Endpoint.org(o) for o in changed]
                        for ep in eps:
                            self.retry.pop(ep, None)
                        await fs.send(b"".join(self.request(ep) for ep in eps))
            await trio.sleep(self.s.pins_check)
