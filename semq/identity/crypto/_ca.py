"""The platform's certificate authority (``CertificateAuthority``): it
issues the platform's TLS server certificate and the nodes' certificates,
keeps what it issued, revokes, and signs the revocation list; saved to and
loaded from a CA directory. The certificates it issues and their checks are
_pki.py's (docs/security.md, "PKI")."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ._errors import CertificateError, KeyFileError
from ._files import (
    StrPath,
    ensure_private_directory,
    load_certificate,
    load_certificates,
    load_crl,
    load_private_key,
    save_certificate,
    save_crl,
    save_private_key,
)
from ._pki import (
    CLOCK_SKEW,
    DEFAULT_CA_DAYS,
    DEFAULT_CRL_DAYS,
    DEFAULT_NODE_DAYS,
    DEFAULT_SERVER_DAYS,
    ORG_URI_PREFIX,
    PLATFORM_URI_PREFIX,
    Endorsement,
    _aware,
    _now,
    _org_from,
    _read_endorsement,
    _read_x25519,
    _serial,
    _x25519_extension,
    certificate_org,
)

__all__ = ["CA_CERT_FILE", "CA_CRL_FILE", "CA_ISSUED_DIR", "CA_KEY_FILE", "CertificateAuthority"]

# Layout of a CA directory (CertificateAuthority.save / load).
CA_KEY_FILE: Final = "ca.key.pem"
CA_CERT_FILE: Final = "ca.pem"
CA_CRL_FILE: Final = "crl.pem"
CA_ISSUED_DIR: Final = "issued"


def _ski(pub: ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey) -> x509.SubjectKeyIdentifier:
    return x509.SubjectKeyIdentifier.from_public_key(pub)


class CertificateAuthority:
    """The platform's CA: issues the platform's TLS certificate and node
    certificates, keeps the record of what it issued, revokes, and signs the
    revocation list. Synchronous, not thread-safe (one operator command or
    the platform daemon's start-up uses it)."""

    def __init__(
        self,
        key: ec.EllipticCurvePrivateKey,
        certificate: x509.Certificate,
        *,
        issued: Iterable[x509.Certificate] = (),
        revoked: dict[int, dt.datetime] | None = None,
    ) -> None:
        pub = certificate.public_key()
        if not isinstance(pub, ec.EllipticCurvePublicKey) or pub.public_numbers() != (
            key.public_key().public_numbers()
        ):
            raise CertificateError(
                f"CA key does not match CA certificate '{certificate.subject.rfc4514_string()}'"
            )
        self.key: Final = key
        self.certificate: Final = certificate
        self.issued: dict[int, x509.Certificate] = {c.serial_number: c for c in issued}
        self.revoked: dict[int, dt.datetime] = dict(revoked or {})

    @property
    def name(self) -> str:
        return self.certificate.subject.rfc4514_string()

    @classmethod
    def create(cls, name: str = "SEMQ platform CA", *, days: int = DEFAULT_CA_DAYS,
               now: dt.datetime | None = None) -> CertificateAuthority:
        """A new self-signed CA (ECDSA P-256, SHA-256) named ``CN=name``."""
        t = _aware(now) if now is not None else _now()
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(t - CLOCK_SKEW)
            .not_valid_after(t + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(_ski(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
                 | ed25519.Ed25519PublicKey, not_before: dt.datetime,
                 not_after: dt.datetime) -> x509.CertificateBuilder:
        # A certificate never outlives the CA that vouches for it.
        not_after = min(not_after, self.certificate.not_valid_after_utc)
        ca_pub = self.key.public_key()
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_ski(public_key), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_pub), critical=False
            )
        )

    @staticmethod
    def _validity(days: int, not_before: dt.datetime | None,
                  now: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
        if days <= 0:
            raise CertificateError(f"validity of {days} days is not positive")
        if not_before is not None:
            nb = _aware(not_before)
            return nb, nb + dt.timedelta(days=days)
        t = _aware(now) if now is not None else _now()
        return t - CLOCK_SKEW, t + dt.timedelta(days=days)

    def issue_server_certificate(
        self,
        *,
        names: Sequence[str] = (),
        platform_id: str = "platform",
        days: int = DEFAULT_SERVER_DAYS,
        now: dt.datetime | None = None,
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A fresh ECDSA P-256 key and the platform's TLS server certificate
        for it: SAN 127.0.0.1, ::1, localhost, plus ``names`` (DNS names or IP
        addresses), and URI ``semq:platform:<platform_id>``; EKU serverAuth."""
        key = ec.generate_private_key(ec.SECP256R1())
        nb, na = self._validity(days, None, now)
        general: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
            x509.DNSName("localhost"),
        ]
        for n in names:
            try:
                gn: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(n))
            except ValueError:
                gn = x509.DNSName(n)
            if gn not in general:
                general.append(gn)
        general.append(x509.UniformResourceIdentifier(PLATFORM_URI_PREFIX + platform_id))
        cert = (
            self._builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, platform_id)]),
                key.public_key(), nb, na,
            )
            .add_extension(x509.SubjectAlternativeName(general), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.issued[cert.serial_number] = cert
        return key, cert

    def issue_node_certificate(
        self,
        csr: x509.CertificateSigningRequest,
        *,
        org: str | None = None,
        days: int = DEFAULT_NODE_DAYS,
        not_before: dt.datetime | None = None,
        now: dt.datetime | None = None,
    ) -> x509.Certificate:
        """Issue a node certificate from ``csr`` (see make_csr). Checks the
        CSR's signature (the requester holds the Ed25519 key), that it names
        exactly one organization and, if ``org`` is given (what the operator
        typed), that it is that one. Only the fields the CA vouches for are
        copied: CN, SAN URI, the two keys. Valid ``days`` from ``not_before``
        (default: now minus CLOCK_SKEW), never past the CA's own expiry."""
        what = "certificate request"
        if not csr.is_signature_valid:
            raise CertificateError(f"{what} has a bad signature (proof of key possession failed)")
        spk = csr.public_key()
        if not isinstance(spk, ed25519.Ed25519PublicKey):
            raise CertificateError(f"{what} carries a {type(spk).__name__}, not an Ed25519 key")
        csr_org = _org_from(csr.subject, csr.extensions, what)
        if org is not None and csr_org != org:
            raise CertificateError(f"{what} is for org {csr_org!r}, not {org!r}")
        epk = _read_x25519(csr.extensions, f"{what} for org {csr_org}")
        endorsement = _read_endorsement(csr.extensions, f"{what} for org {csr_org}")
        if endorsement is not None:
            self._check_endorsement(endorsement, csr_org, spk, epk, now)
        nb, na = self._validity(days, not_before, now)
        builder = (
            self._builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, csr_org)]), spk, nb, na
            )
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(ORG_URI_PREFIX + csr_org)]
                ),
                critical=False,
            )
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=True, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(_x25519_extension(epk), critical=False)
        )
        if endorsement is not None:
            builder = builder.add_extension(endorsement.extension(), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        self.issued[cert.serial_number] = cert
        return cert

    def _check_endorsement(self, endorsement: Endorsement, org: str, spk: ed25519.Ed25519PublicKey,
                           epk: x25519.X25519PublicKey, now: dt.datetime | None) -> None:
        """A request that carries a rollover endorsement is issued only if a
        current certificate of ``org`` holds the key that signed it: the CA
        never vouches for an endorsement nodes would then trust."""
        current = self.current_certificates(org, now=now)
        for c in current:
            pub = c.public_key()
            if isinstance(pub, ed25519.Ed25519PublicKey) and endorsement.verifies(
                    pub, org, spk.public_bytes_raw(), epk.public_bytes_raw()):
                return
        raise CertificateError(
            f"certificate request for org {org} carries a rollover endorsement by key"
            f" {endorsement.signer_key_id.hex()} that does not verify under any current certificate"
            f" of org {org} ({len(current)} current); make a request without it"
            " ('semq node rollover --no-endorse')"
        )

    def current_certificates(self, org: str, *, now: dt.datetime | None = None) -> list[x509.Certificate]:
        """Node certificates of ``org`` usable at ``now``: not revoked, within
        their validity. Newest first. (An organization holds one identity;
        a second certificate is a rollover: semq.identity.security.enroll.)"""
        t = _aware(now) if now is not None else _now()
        return [c for c in self.certificates_of(org) if c.serial_number not in self.revoked
                and c.not_valid_before_utc <= t <= c.not_valid_after_utc]

    def certificates_of(self, org: str) -> list[x509.Certificate]:
        """Node certificates issued to ``org``, newest (latest notBefore) first."""
        out = []
        for c in self.issued.values():
            try:
                if certificate_org(c) == org:
                    out.append(c)
            except CertificateError:
                continue  # the platform's server certificate
        return sorted(out, key=lambda c: c.not_valid_before_utc, reverse=True)

    def revoke(self, target: str | int, *, now: dt.datetime | None = None) -> list[int]:
        """Revoke every certificate issued to organization ``target`` (a str)
        or the one certificate with serial number ``target`` (an int). Returns
        the serials now on the list; revoking again keeps the first date.
        Raises CertificateError when nothing matches. Call ``crl()`` (and
        ``save``) afterwards to publish the new list."""
        t = _aware(now) if now is not None else _now()
        if isinstance(target, int):
            if target not in self.issued:
                raise CertificateError(f"no certificate with serial {_serial(target)} was issued")
            serials = [target]
        else:
            serials = [c.serial_number for c in self.certificates_of(target)]
            if not serials:
                raise CertificateError(f"no certificate was issued to org {target!r}")
        for s in serials:
            self.revoked.setdefault(s, t)
        return serials

    def crl(self, *, now: dt.datetime | None = None,
            days: int = DEFAULT_CRL_DAYS) -> x509.CertificateRevocationList:
        """A freshly signed revocation list of everything revoked, valid
        ``days`` (nextUpdate). Verifiers refuse it after that (fail closed),
        so the platform re-signs it on start and after each revoke."""
        t = _aware(now) if now is not None else _now()
        b = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.certificate.subject)
            .last_update(t - CLOCK_SKEW)
            .next_update(t + dt.timedelta(days=days))
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .add_extension(x509.CRLNumber(int(t.timestamp() * 1000)), critical=False)
        )
        for serial, when in sorted(self.revoked.items()):
            b = b.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(when)
                .build()
            )
        return b.sign(self.key, hashes.SHA256())

    # ------------------------------------------------------------ files

    def save(self, directory: StrPath, *, passphrase: bytes | None = None,
             now: dt.datetime | None = None) -> Path:
        """Write the CA to ``directory`` (created 0700): ``ca.key.pem`` (0600),
        ``ca.pem``, ``crl.pem`` (freshly signed) and ``issued/<serial>.pem``."""
        d = ensure_private_directory(directory)
        save_private_key(d / CA_KEY_FILE, self.key, passphrase=passphrase)
        save_certificate(d / CA_CERT_FILE, self.certificate)
        save_crl(d / CA_CRL_FILE, self.crl(now=now))
        issued = d / CA_ISSUED_DIR
        for serial, cert in self.issued.items():
            p = issued / f"{serial:x}.pem"
            if not p.exists():
                save_certificate(p, cert)
        return d

    @classmethod
    def load(cls, directory: StrPath, *, passphrase: bytes | None = None) -> CertificateAuthority:
        """Read a CA written by ``save``. The key file must be owner-only
        (KeyFileError otherwise); the revocations come from ``crl.pem``,
        whose signature is checked."""
        d = Path(directory)
        key = load_private_key(d / CA_KEY_FILE, passphrase=passphrase)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise KeyFileError(f"key file {d / CA_KEY_FILE} is not an EC P-256 CA key")
        cert = load_certificate(d / CA_CERT_FILE)
        issued: list[x509.Certificate] = []
        if (d / CA_ISSUED_DIR).is_dir():
            for p in sorted((d / CA_ISSUED_DIR).glob("*.pem")):
                issued.extend(load_certificates(p))
        revoked: dict[int, dt.datetime] = {}
        if (d / CA_CRL_FILE).exists():
            crl = load_crl(d / CA_CRL_FILE)
            if crl.issuer != cert.subject or not crl.is_signature_valid(key.public_key()):
                raise CertificateError(f"revocation list {d / CA_CRL_FILE} is not signed by this CA")
            revoked = {r.serial_number: r.revocation_date_utc for r in crl}
        return cls(key, cert, issued=issued, revoked=revoked)
