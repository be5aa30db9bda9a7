"""The certificate directory: organization -> its node certificates, each
verified against the platform CA and revocation list.

The platform serves it (CERT_REQUEST / CERT_RESPONSE); a node keeps its own
copy, fills it from the platform's answers and verifies every certificate
itself against the CA, so the relay cannot hand it a key the CA never
certified. Several certificates per organization (newest first) make
rollover work: documents are sealed to every valid one, and signatures and
receipts verify with whichever key made them.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable

from cryptography import x509

from semq.umxt_protocol import CertResponse, Endpoint, NodeType, ResultCode

from ._ca import CertificateAuthority
from ._errors import (
    CertificateError,
    CertificateExpired,
    CertificateRevoked,
    UnknownCertificate,
)
from ._pki import (
    NodeCertificate,
    expiring_within,
    format_time,
    verify_crl,
    verify_node_certificate,
)

__all__ = ["MAX_CERTS_PER_ORG", "CertificateDirectory"]

MAX_CERTS_PER_ORG = 8  # = umxt_protocol MAX_CERTIFICATES: what one CERT_RESPONSE carries


def _org_of(endpoint: Endpoint | str) -> str:
    if isinstance(endpoint, str):
        return endpoint
    if endpoint.node_type is not NodeType.ORGANIZATION:
        raise UnknownCertificate(f"{endpoint} is not an organization; only organizations have"
                                 " node certificates")
    return endpoint.node_id


class CertificateDirectory:
    """org -> verified NodeCertificates, newest first (at most
    MAX_CERTS_PER_ORG). Every certificate is verified on the way in (CA
    signature, SEMQ fields, validity, CRL) and again for time and revocation
    on each ``lookup``. ``crl=None`` disables revocation checks (only for a
    node that has no CRL; the platform always passes one). ``clock`` returns
    the current UTC time (tests pass a fixed one). Thread-safe."""

    def __init__(
        self,
        ca: x509.Certificate,
        crl: x509.CertificateRevocationList | None,
        *,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.ca = ca
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        if crl is not None:
            verify_crl(crl, ca=ca, at=self._clock())
        self.crl = crl
        self._revoked_memo: tuple[object, dict[int, x509.RevokedCertificate | None]] = (None, {})
        self._lock = threading.RLock()
        self._certs: dict[str, list[NodeCertificate]] = {}

    @classmethod
    def from_authority(cls, authority: CertificateAuthority, *,
                       clock: Callable[[], dt.datetime] | None = None) -> CertificateDirectory:
        """The platform's directory: every node certificate its CA issued
        that is valid now and not revoked, with a freshly signed CRL."""
        now = clock() if clock else None
        d = cls(authority.certificate, authority.crl(now=now), clock=clock)
        d.add_many(authority.issued.values())
        return d

    # ---------------------------------------------------------------- updates

    def add(self, cert: x509.Certificate | bytes) -> NodeCertificate:
        """Verify ``cert`` (object or DER) now and add it. Raises
        CertificateError (or a subclass) and adds nothing if it fails."""
        info = verify_node_certificate(cert, ca=self.ca, crl=self.crl, at=self._clock())
        with self._lock:
            certs = [c for c in self._certs.get(info.org, []) if c.serial != info.serial]
            certs.append(info)
            certs.sort(key=lambda c: (c.not_before, c.serial), reverse=True)
            self._certs[info.org] = certs[:MAX_CERTS_PER_ORG]
        return info

    def add_many(self, certs: Iterable[x509.Certificate | bytes]) -> list[CertificateError]:
        """Add every certificate that verifies; return the errors of the
        others (e.g. the platform's own server certificate, expired ones)."""
        errors = []
        for c in certs:
            try:
                self.add(c)
            except CertificateError as e:
                errors.append(e)
        return errors

    def remove(self, org: str) -> None:
        """Forget an organization's certificates."""
        with self._lock:
            self._certs.pop(org, None)

    def set_crl(self, crl: x509.CertificateRevocationList) -> None:
        """Replace the revocation list (checked against the CA first:
        CertificateError). Lookups apply it from now on."""
        verify_crl(crl, ca=self.ca, at=self._clock())
        with self._lock:
            self.crl = crl

    def verify_response(self, response: CertResponse) -> tuple[list[NodeCertificate], list[CertificateError]]:
        """The certificates of the platform's answer that verify (CA, CRL,
        validity) and name ``response.endpoint``'s organization, newest
        first, and the errors of the others. Changes nothing (a node filters
        them through its pins first: semq.identity.trust). Raises UnknownCertificate
        for an answer with an error code."""
        org = _org_of(response.endpoint)
        if response.code is not ResultCode.OK:
            raise UnknownCertificate(
                f"platform has no certificate for {response.endpoint}: {response.code.name}",
                response.code,
            )
        good: list[NodeCertificate] = []
        errors: list[CertificateError] = []
        for der in response.certificates:
            try:
                info = verify_node_certificate(der, ca=self.ca, crl=self.crl, at=self._clock())
                if info.org != org:
                    raise CertificateError(
                        f"directory answer for org {org} holds a certificate for org {info.org}"
                    )
                good.append(info)
            except CertificateError as e:
                errors.append(e)
        good.sort(key=lambda c: (c.not_before, c.serial), reverse=True)
        return good, errors

    def replace(self, org: str, certs: Iterable[NodeCertificate]) -> None:
        """What we know of ``org`` becomes ``certs`` (already verified;
        newest first is kept). An empty list forgets the organization."""
        keep = sorted(certs, key=lambda c: (c.not_before, c.serial), reverse=True)[:MAX_CERTS_PER_ORG]
        with self._lock:
            if keep:
                self._certs[org] = keep
            else:
                self._certs.pop(org, None)

    def fingerprints(self) -> dict[str, tuple[str, ...]]:
        """org -> the fingerprints of its usable certificates now (what the
        platform compares before and after a CA change)."""
        out: dict[str, tuple[str, ...]] = {}
        for org in self.orgs():
            try:
                out[org] = tuple(c.fingerprint for c in self.lookup(org))
            except CertificateError:
                continue
        return out

    def apply_cert_response(self, response: CertResponse) -> list[NodeCertificate]:
        """Replace what we know of ``response.endpoint`` by the certificates
        of the platform's answer that verify and name that organization.
        Returns them, newest first. Raises UnknownCertificate for an answer
        with an error code, or the first error when none verifies (then the
        old entries are kept)."""
        good, errors = self.verify_response(response)
        if not good:
            if errors:
                raise errors[0]
            raise UnknownCertificate(f"platform answered no certificate for org {_org_of(response.endpoint)}")
        org = good[0].org
        self.replace(org, good)
        with self._lock:
            return list(self._certs[org])

    # ---------------------------------------------------------------- queries

    def _revoked(self, serial: int) -> x509.RevokedCertificate | None:
        """The CRL's entry for ``serial`` (None: not revoked or no CRL),
        remembered per serial for the CRL object held now: a lookup per
        document would otherwise search the CRL each time. The memo is tied
        to that (immutable) CRL object and dropped when ``crl`` changes."""
        crl = self.crl
        if crl is None:
            return None
        memo = self._revoked_memo
        if memo[0] is not crl:
            memo = self._revoked_memo = (crl, {})
        try:
            return memo[1][serial]
        except KeyError:
            entry = crl.get_revoked_certificate_by_serial_number(serial)
            if len(memo[1]) >= 4096:
                memo[1].clear()
            memo[1][serial] = entry
            return entry

    def _usable(self, c: NodeCertificate, now: dt.datetime) -> CertificateError | None:
        if c.not_before <= now <= c.not_after and self._revoked(c.serial) is None:
            return None
        label = f"certificate for org {c.org} (serial 0x{c.serial:x})"
        if now > c.not_after:
            return CertificateExpired(f"{label} expired on {format_time(c.not_after)}")
        if now < c.not_before:
            return CertificateExpired(f"{label} is not valid before {format_time(c.not_before)}")
        entry = self._revoked(c.serial)
        if entry is not None:
            return CertificateRevoked(
                f"{label} was revoked on {format_time(entry.revocation_date_utc)}"
            )
        return None

    def lookup(self, endpoint: Endpoint | str) -> list[NodeCertificate]:
        """The organization's certificates usable now (valid, not revoked),
        newest first — seal to all of them; verify signatures with the one
        whose key id matches. Raises UnknownCertificate if none is known (ask
        the platform: CERT_REQUEST), CertificateExpired / CertificateRevoked
        naming the newest one when all known ones are unusable."""
        org = _org_of(endpoint)
        now = self._clock()
        with self._lock:
            certs = list(self._certs.get(org, ()))
        if not certs:
            raise UnknownCertificate(f"no certificate is known for org {org}; ask the platform")
        usable = [c for c in certs if self._usable(c, now) is None]
        if not usable:
            err = self._usable(certs[0], now)
            assert err is not None
            raise err
        return usable

    def certificates(self, endpoint: Endpoint | str) -> list[NodeCertificate]:
        """Everything known for the organization, usable or not (for status)."""
        with self._lock:
            return list(self._certs.get(_org_of(endpoint), ()))

    def cert_response(self, endpoint: Endpoint) -> CertResponse:
        """The platform's answer to CERT_REQUEST: the usable certificates in
        DER, newest first, or UNKNOWN_CERTIFICATE / CERT_REVOKED."""
        try:
            certs = self.lookup(endpoint)
        except CertificateError as e:
            return CertResponse(endpoint=endpoint, code=e.code)
        return CertResponse(endpoint=endpoint, certificates=tuple(c.der for c in certs))

    def orgs(self) -> list[str]:
        with self._lock:
            return sorted(self._certs)

    def expiring(self, days: float) -> list[NodeCertificate]:
        """Certificates that expire within ``days`` (for ``semq status``)."""
        now = self._clock()
        with self._lock:
            every = [c for certs in self._certs.values() for c in certs]
        return [c for c in every if expiring_within(c, days, now=now)]
