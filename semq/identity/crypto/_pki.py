"""Node identities and their certificates: keys, requests, the SEMQ
extensions (the X25519 key, the rollover endorsement), and verification
against the platform's CA (which is in _ca.py).

Choices (docs/security.md, "PKI"):

* The CA and the platform's TLS server certificate use **ECDSA P-256** with
  SHA-256: every TLS 1.3 stack accepts it (OpenSSL in every configuration,
  including FIPS policies that leave out Ed25519; Go, Java, browsers, `openssl
  s_client` for an operator debugging a connection).
* A node's certificate certifies **one Ed25519 key** (the subject key: TLS 1.3
  client authentication and document/receipt signatures, kept apart by
  distinct signed-content prefixes) **and one X25519 key** (end-to-end key
  wrapping) in a non-critical extension, ``SEMQ_X25519_OID``. The CA's
  signature covers both, so one certificate is one identity generation: the
  two keys roll over together and a directory look-up returns both at once.
* The organization is named twice: subject CN = ORG (for people) and a SAN URI
  ``semq:org:ORG`` (the authoritative, machine-read form); both must agree.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from dataclasses import dataclass, field
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.x509.oid import NameOID

from semq.umxt_protocol import Endpoint, ProtocolError

from ._errors import (
    CertificateError,
    CertificateExpired,
    CertificateRevoked,
    KeyFileError,
)
from ._files import (
    StrPath,
    load_certificate,
    load_private_key,
    save_private_key,
)

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_CA_DAYS",
    "DEFAULT_CRL_DAYS",
    "DEFAULT_NODE_DAYS",
    "DEFAULT_SERVER_DAYS",
    "KEY_ID_SIZE",
    "ORG_URI_PREFIX",
    "ROLLOVER_PREFIX",
    "SEMQ_ROLLOVER_OID",
    "SEMQ_X25519_OID",
    "Endorsement",
    "NodeCertificate",
    "NodeIdentity",
    "NodeKeys",
    "certificate_org",
    "csr_org",
    "endorse_rollover",
    "expiring_within",
    "fingerprint",
    "format_time",
    "key_id",
    "make_csr",
    "verify_crl",
    "verify_node_certificate",
]

DEFAULT_CA_DAYS: Final = 3650  # the platform CA: ten years
DEFAULT_NODE_DAYS: Final = 365  # a node certificate: one year (brief)
DEFAULT_SERVER_DAYS: Final = 365  # the platform's TLS server certificate
DEFAULT_CRL_DAYS: Final = 30  # a CRL's nextUpdate; the platform re-signs it on start and revoke
CLOCK_SKEW: Final = dt.timedelta(minutes=5)  # certificates start this much in the past
KEY_ID_SIZE: Final = 16  # bytes of a key id: SHA-256(raw public key)[:16]

# A private arc without registration: 2.25.<UUID as integer> (ITU-T X.667),
# UUID 16f24f17-dc47-408a-bb2d-06bc7d4b5fab allocated for SEMQ; .1 = X25519 key.
SEMQ_ARC: Final = "2.25.30501155947812844484512975407939280811"
SEMQ_X25519_OID: Final = x509.ObjectIdentifier(SEMQ_ARC + ".1")
# .2 = a rollover endorsement: the organization's previous signing key vouches
# for the keys of its next certificate (docs/security.md, "Pinning").
SEMQ_ROLLOVER_OID: Final = x509.ObjectIdentifier(SEMQ_ARC + ".2")
ROLLOVER_PREFIX: Final = b"SEMQ-ROLLOVER-v1\x00"
_ENDORSEMENT_VERSION: Final = 1
_ENDORSEMENT_SIZE: Final = 1 + 16 + 64  # version, signer key id, Ed25519 signature
ORG_URI_PREFIX: Final = "semq:org:"
PLATFORM_URI_PREFIX: Final = "semq:platform:"


# ---------------------------------------------------------------- helpers


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def format_time(t: dt.datetime) -> str:
    """``2026-01-01T00:00:00Z``: how every message of this package shows a time."""
    return _aware(t).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_id(public_key: ed25519.Ed25519PublicKey | x25519.X25519PublicKey) -> bytes:
    """The 16-byte id of a public key: SHA-256 of its raw 32 bytes, truncated.
    Names keys in signed containers, session key blobs and receipts; never a
    security decision by itself (the signature or AEAD check that follows is)."""
    return _raw_key_id(public_key.public_bytes_raw())


@functools.lru_cache(maxsize=1024)
def _raw_key_id(raw: bytes) -> bytes:
    """key_id of the raw public key bytes, remembered for the few keys a node
    uses again and again (its own, its peers')."""
    return hashlib.sha256(raw).digest()[:KEY_ID_SIZE]


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate, hex: for operators to compare out of band."""
    return cert.fingerprint(hashes.SHA256()).hex()


def _serial(serial: int) -> str:
    return f"0x{serial:x}"


def _check_org(org: str) -> str:
    try:
        Endpoint.org(org)
    except ProtocolError as e:
        raise CertificateError(f"organization id {org!r} is not a valid node id: {e}") from None
    return org


def _der_octet_string(value: bytes) -> bytes:
    assert len(value) < 128
    return bytes((0x04, len(value))) + value


def _x25519_extension(public_key: x25519.X25519PublicKey) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(
        SEMQ_X25519_OID, _der_octet_string(public_key.public_bytes_raw())
    )


def _read_x25519(extensions: x509.Extensions, what: str) -> x25519.X25519PublicKey:
    try:
        ext = extensions.get_extension_for_oid(SEMQ_X25519_OID)
    except x509.ExtensionNotFound:
        raise CertificateError(
            f"{what} has no X25519 encryption key (extension {SEMQ_X25519_OID.dotted_string})"
        ) from None
    value = ext.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(raw) != 34 or raw[:2] != b"\x04\x20":
        raise CertificateError(
            f"{what} has a malformed X25519 key extension of {len(raw)} bytes (want 34)"
        )
    return x25519.X25519PublicKey.from_public_bytes(raw[2:])


@dataclass(frozen=True, slots=True)
class Endorsement:
    """A rollover endorsement: the organization's current Ed25519 key (named
    by ``signer_key_id``) signs the public keys of its next certificate,

        "SEMQ-ROLLOVER-v1" 0x00 || len(org) u8 || org || new Ed25519 key (32) || new X25519 key (32)

    The CSR of ``semq node rollover`` carries it, the CA checks it against
    the organization's current certificate and copies it into the new one
    (non-critical extension SEMQ_ROLLOVER_OID, a DER OCTET STRING of
    version 1 (1) || signer key id (16) || signature (64)), and a node that
    pinned the old certificate accepts the new one on its strength."""

    signer_key_id: bytes
    signature: bytes

    def __post_init__(self) -> None:
        if len(self.signer_key_id) != KEY_ID_SIZE or len(self.signature) != 64:
            raise CertificateError(
                f"rollover endorsement with a {len(self.signer_key_id)}-byte key id and a"
                f" {len(self.signature)}-byte signature (want {KEY_ID_SIZE} and 64)"
            )

    def encode(self) -> bytes:
        return bytes((_ENDORSEMENT_VERSION,)) + self.signer_key_id + self.signature

    @classmethod
    def decode(cls, raw: bytes, what: str) -> Endorsement:
        if len(raw) != _ENDORSEMENT_SIZE or raw[0] != _ENDORSEMENT_VERSION:
            raise CertificateError(
                f"{what} has a malformed rollover endorsement of {len(raw)} bytes"
                f" (want {_ENDORSEMENT_SIZE}, version {_ENDORSEMENT_VERSION})"
            )
        return cls(raw[1:17], raw[17:])

    def extension(self) -> x509.UnrecognizedExtension:
        return x509.UnrecognizedExtension(SEMQ_ROLLOVER_OID, _der_octet_string(self.encode()))

    def verifies(self, endorser: ed25519.Ed25519PublicKey, org: str, signing_key_raw: bytes,
                 encryption_key_raw: bytes) -> bool:
        """True if ``endorser`` (whose key id must be ``signer_key_id``)
        signed these next keys of ``org``."""
        if key_id(endorser) != self.signer_key_id:
            return False
        try:
            endorser.verify(self.signature, rollover_message(org, signing_key_raw, encryption_key_raw))
        except InvalidSignature:
            return False
        return True


def rollover_message(org: str, signing_key_raw: bytes, encryption_key_raw: bytes) -> bytes:
    """What a rollover endorsement signs (see Endorsement)."""
    o = _check_org(org).encode("ascii")
    return ROLLOVER_PREFIX + bytes((len(o),)) + o + signing_key_raw + encryption_key_raw


def endorse_rollover(current: ed25519.Ed25519PrivateKey, org: str, new: NodeKeys) -> Endorsement:
    """``semq node rollover``: the current signing key of ``org`` vouches for
    the keys of its next generation ``new``."""
    msg = rollover_message(org, new.signing_key.public_key().public_bytes_raw(),
                           new.encryption_key.public_key().public_bytes_raw())
    return Endorsement(key_id(current.public_key()), current.sign(msg))


def _read_endorsement(extensions: x509.Extensions, what: str) -> Endorsement | None:
    try:
        ext = extensions.get_extension_for_oid(SEMQ_ROLLOVER_OID)
    except x509.ExtensionNotFound:
        return None
    value = ext.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(raw) < 2 or raw[0] != 0x04 or raw[1] != len(raw) - 2:
        raise CertificateError(f"{what} has a rollover endorsement that is not a DER OCTET STRING")
    return Endorsement.decode(raw[2:], what)


def _org_from(name: x509.Name, extensions: x509.Extensions, what: str) -> str:
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier)
                if u.startswith(ORG_URI_PREFIX)]
    except x509.ExtensionNotFound:
        uris = []
    if len(uris) != 1:
        raise CertificateError(
            f"{what} names {len(uris)} organizations; it needs exactly one SAN URI"
            f" {ORG_URI_PREFIX}ORG"
        )
    org = uris[0][len(ORG_URI_PREFIX):]
    cns = [a.value for a in name.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns != [org]:
        raise CertificateError(f"{what} has subject CN {cns!r} but SAN URI names org {org!r}")
    return _check_org(org)


def csr_org(csr: x509.CertificateSigningRequest) -> str:
    """The organization a certificate request names (not verified)."""
    return _org_from(csr.subject, csr.extensions, "certificate request")


def certificate_org(cert: x509.Certificate) -> str:
    """The organization a node certificate names (SAN URI ``semq:org:ORG``,
    equal to the subject CN). No verification: see verify_node_certificate.
    Raises CertificateError if it names none or two."""
    return _org_from(cert.subject, cert.extensions, f"certificate serial {_serial(cert.serial_number)}")


def expiring_within(cert: x509.Certificate | NodeCertificate, days: float, *,
                    now: dt.datetime | None = None) -> bool:
    """True if ``cert`` expires within ``days`` from ``now`` (or already has):
    for ``semq status`` warnings before a rollover is due."""
    c = cert.certificate if isinstance(cert, NodeCertificate) else cert
    t = _aware(now) if now is not None else _now()
    return c.not_valid_after_utc - t <= dt.timedelta(days=days)


# ---------------------------------------------------------------- node keys


@dataclass(frozen=True, slots=True)
class NodeKeys:
    """An organization's private keys of one generation: ``signing_key``
    (Ed25519: TLS client auth, document signatures, receipts) and
    ``encryption_key`` (X25519: unwrapping session keys)."""

    signing_key: ed25519.Ed25519PrivateKey
    encryption_key: x25519.X25519PrivateKey
    signing_key_id: bytes = field(init=False, repr=False, compare=False)
    encryption_key_id: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signing_key_id", key_id(self.signing_key.public_key()))
        object.__setattr__(self, "encryption_key_id", key_id(self.encryption_key.public_key()))

    @classmethod
    def generate(cls) -> NodeKeys:
        """Fresh keys from the OS's CSPRNG."""
        return cls(ed25519.Ed25519PrivateKey.generate(), x25519.X25519PrivateKey.generate())

    def save(self, signing_key_path: StrPath, encryption_key_path: StrPath, *,
             passphrase: bytes | None = None) -> None:
        """Write both keys as PEM, mode 0600 (see save_private_key). The
        signing key file doubles as the TLS client key file."""
        save_private_key(signing_key_path, self.signing_key, passphrase=passphrase)
        save_private_key(encryption_key_path, self.encryption_key, passphrase=passphrase)

    @classmethod
    def load(cls, signing_key_path: StrPath, encryption_key_path: StrPath, *,
             passphrase: bytes | None = None) -> NodeKeys:
        """Read both keys, refusing files group/others can access (KeyFileError)."""
        sk = load_private_key(signing_key_path, passphrase=passphrase)
        ek = load_private_key(encryption_key_path, passphrase=passphrase)
        if not isinstance(sk, ed25519.Ed25519PrivateKey):
            raise KeyFileError(f"key file {signing_key_path} holds a {type(sk).__name__},"
                               " not an Ed25519 signing key")
        if not isinstance(ek, x25519.X25519PrivateKey):
            raise KeyFileError(f"key file {encryption_key_path} holds a {type(ek).__name__},"
                               " not an X25519 encryption key")
        return cls(sk, ek)


def make_csr(keys: NodeKeys, org: str, *,
             endorsement: Endorsement | None = None) -> x509.CertificateSigningRequest:
    """A certificate signing request for organization ``org``: subject CN=ORG,
    SAN URI ``semq:org:ORG``, the X25519 key in the SEMQ extension, signed by
    the Ed25519 key (proof that the requester holds it); for a rollover, the
    current key's ``endorsement`` of these keys (endorse_rollover)."""
    _check_org(org)
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, org)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(ORG_URI_PREFIX + org)]),
            critical=False,
        )
        .add_extension(_x25519_extension(keys.encryption_key.public_key()), critical=False)
    )
    if endorsement is not None:
        builder = builder.add_extension(endorsement.extension(), critical=False)
    return builder.sign(keys.signing_key, None)


# ---------------------------------------------------------------- verified certificates


@dataclass(frozen=True, slots=True)
class NodeCertificate:
    """A node certificate that verified against the CA (and CRL, if one was
    given) at some time; produced by verify_node_certificate, never built by
    hand. Holds what the daemons need: the organization and both public keys."""

    org: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    signing_public_key: ed25519.Ed25519PublicKey
    encryption_public_key: x25519.X25519PublicKey
    signing_key_id: bytes
    encryption_key_id: bytes
    certificate: x509.Certificate
    # A rollover endorsement by the organization's previous key, if any.
    endorsement: Endorsement | None = None
    # signing_public_key's raw 32 bytes, read once (signature caches key on them)
    signing_key_raw: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signing_key_raw", self.signing_public_key.public_bytes_raw())

    @property
    def encryption_key_raw(self) -> bytes:
        return self.encryption_public_key.public_bytes_raw()

    def endorsed_by(self, endorser: ed25519.Ed25519PublicKey) -> bool:
        """True if this certificate's endorsement (a rollover) was signed by
        ``endorser`` over this certificate's organization and keys."""
        e = self.endorsement
        return e is not None and e.verifies(endorser, self.org, self.signing_key_raw,
                                            self.encryption_key_raw)

    @property
    def der(self) -> bytes:
        """The certificate in DER (what CertResponse carries)."""
        return self.certificate.public_bytes(serialization.Encoding.DER)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.certificate)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint.org(self.org)

    def describe(self) -> str:
        """One line for logs and ``semq status``."""
        return (f"org {self.org} serial {_serial(self.serial)} valid"
                f" {format_time(self.not_before)}..{format_time(self.not_after)}"
                f" sign-key {self.signing_key_id.hex()} enc-key {self.encryption_key_id.hex()}")


def _parse_node_certificate(cert: x509.Certificate) -> NodeCertificate:
    org = certificate_org(cert)
    what = f"certificate serial {_serial(cert.serial_number)} for org {org}"
    spk = cert.public_key()
    if not isinstance(spk, ed25519.Ed25519PublicKey):
        raise CertificateError(f"{what} certifies a {type(spk).__name__}, not an Ed25519 key")
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if bc.ca:
            raise CertificateError(f"{what} is a CA certificate, not a node certificate")
    except x509.ExtensionNotFound:
        pass
    epk = _read_x25519(cert.extensions, what)
    return NodeCertificate(
        org=org,
        serial=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        signing_public_key=spk,
        encryption_public_key=epk,
        signing_key_id=key_id(spk),
        encryption_key_id=key_id(epk),
        certificate=cert,
        endorsement=_read_endorsement(cert.extensions, what),
    )


def _load_der(cert: x509.Certificate | bytes) -> x509.Certificate:
    if isinstance(cert, x509.Certificate):
        return cert
    try:
        return x509.load_der_x509_certificate(bytes(cert))
    except ValueError as e:
        raise CertificateError(f"certificate of {len(cert)} bytes is not DER X.509: {e}") from e


def _check_ca(ca: x509.Certificate, at: dt.datetime) -> None:
    name = ca.subject.rfc4514_string()
    if not ca.not_valid_before_utc <= at <= ca.not_valid_after_utc:
        raise CertificateExpired(
            f"platform CA '{name}' is valid {format_time(ca.not_valid_before_utc)}.."
            f"{format_time(ca.not_valid_after_utc)}, not at {format_time(at)}"
        )


def verify_crl(crl: x509.CertificateRevocationList, *, ca: x509.Certificate,
               at: dt.datetime | None = None) -> None:
    """Check that ``crl`` was issued and signed by ``ca`` and is current
    (nextUpdate not passed). Raises CertificateError. A stale CRL fails
    closed: the platform re-signs it (CertificateAuthority.crl) on start."""
    t = _aware(at) if at is not None else _now()
    ca_name = ca.subject.rfc4514_string()
    if crl.issuer != ca.subject:
        raise CertificateError(
            f"revocation list issued by '{crl.issuer.rfc4514_string()}', not by the platform"
            f" CA '{ca_name}'"
        )
    pub = ca.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey) or not (
        crl.is_signature_valid(pub)
    ):
        raise CertificateError(f"revocation list signature does not verify with CA '{ca_name}'")
    nxt = crl.next_update_utc
    if nxt is not None and nxt < t:
        raise CertificateError(
            f"revocation list of CA '{ca_name}' expired on {format_time(nxt)};"
            " the platform must publish a fresh one"
        )


def verify_node_certificate(
    cert: x509.Certificate | bytes,
    *,
    ca: x509.Certificate,
    crl: x509.CertificateRevocationList | None,
    at: dt.datetime | None = None,
) -> NodeCertificate:
    """Verify a node certificate (object or DER) against the platform CA, the
    revocation list and the validity period at ``at`` (default now), and
    return what it certifies. ``crl=None`` skips the revocation check and must
    be a deliberate choice. Raises CertificateError (AUTH_FAILED) for a wrong
    issuer or signature or missing SEMQ fields, CertificateExpired for a time
    outside the validity period, CertificateRevoked (CERT_REVOKED)."""
    t = _aware(at) if at is not None else _now()
    c = _load_der(cert)
    _check_ca(ca, t)
    ca_name = ca.subject.rfc4514_string()
    label = f"certificate serial {_serial(c.serial_number)}"
    try:
        label = f"certificate for org {certificate_org(c)} (serial {_serial(c.serial_number)})"
    except CertificateError:
        pass
    try:
        c.verify_directly_issued_by(ca)
    except ValueError:
        raise CertificateError(
            f"{label} is issued by '{c.issuer.rfc4514_string()}', not by the platform CA"
            f" '{ca_name}'"
        ) from None
    except (InvalidSignature, TypeError):
        raise CertificateError(
            f"{label} has a signature that does not verify with the platform CA '{ca_name}'"
        ) from None
    info = _parse_node_certificate(c)
    if t > info.not_after:
        raise CertificateExpired(f"{label} expired on {format_time(info.not_after)}")
    if t < info.not_before:
        raise CertificateExpired(f"{label} is not valid before {format_time(info.not_before)}")
    if crl is not None:
        verify_crl(crl, ca=ca, at=t)
        entry = crl.get_revoked_certificate_by_serial_number(c.serial_number)
        if entry is not None:
            raise CertificateRevoked(
                f"{label} was revoked on {format_time(entry.revocation_date_utc)}"
            )
    return info


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """This node's keys of one generation together with their certificate.
    The constructor checks that the certificate certifies these keys."""

    keys: NodeKeys
    certificate: NodeCertificate

    def __post_init__(self) -> None:
        c = self.certificate
        if (c.signing_key_id != self.keys.signing_key_id
                or c.encryption_key_id != self.keys.encryption_key_id):
            raise CertificateError(
                f"certificate for org {c.org} (serial {_serial(c.serial)}) certifies keys"
                f" {c.signing_key_id.hex()}/{c.encryption_key_id.hex()}, not this node's keys"
                f" {self.keys.signing_key_id.hex()}/{self.keys.encryption_key_id.hex()}"
            )

    @property
    def org(self) -> str:
        return self.certificate.org

    @classmethod
    def load(
        cls,
        cert_file: StrPath,
        signing_key_file: StrPath,
        encryption_key_file: StrPath,
        *,
        ca: x509.Certificate,
        crl: x509.CertificateRevocationList | None = None,
        passphrase: bytes | None = None,
        at: dt.datetime | None = None,
    ) -> NodeIdentity:
        """What a node daemon does at start: read its keys (refusing files
        group/others can access: KeyFileError), read its certificate, verify
        it against the CA (and CRL) now (CertificateError, e.g. expired) and
        check that it certifies these keys."""
        keys = NodeKeys.load(signing_key_file, encryption_key_file, passphrase=passphrase)
        cert = load_certificate(cert_file)
        return cls(keys, verify_node_certificate(cert, ca=ca, crl=crl, at=at))
