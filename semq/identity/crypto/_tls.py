"""Mutual TLS 1.3 between nodes and the platform (SPEC "Security": nodes and
platform authenticate each other).

The contexts are plain ``ssl.SSLContext`` objects for ``trio.SSLStream``.
TLS 1.3 only; the server requires a client certificate; both sides verify
the peer against the platform CA with OpenSSL's strict X.509 checks and,
when a CRL file is given, its revocation list — so a certificate from another
CA, an expired one or a revoked one is refused at the handshake. After the
handshake the platform calls ``peer_organization`` on the peer's DER
certificate to bind the connection to the organization it names (and to
re-check revocation against the CRL it holds now, which may be newer than the
one the context was built with).
"""

from __future__ import annotations

import datetime as dt
import ssl

from cryptography import x509

from ._errors import CertificateError, KeyFileError
from ._files import StrPath, check_private_key_permissions
from ._pki import NodeCertificate, verify_node_certificate

__all__ = [
    "client_ssl_context",
    "peer_certificate",
    "peer_organization",
    "server_ssl_context",
]


def _configure(
    ctx: ssl.SSLContext,
    *,
    cert_file: StrPath,
    key_file: StrPath,
    ca_file: StrPath,
    crl_file: StrPath | None,
    key_password: bytes | None,
    check_key_permissions: bool,
) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    if check_key_permissions:
        check_private_key_permissions(key_file)
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file), key_password)
    except ssl.SSLError as e:
        raise KeyFileError(
            f"certificate {cert_file} and key {key_file} cannot be loaded together: {e.reason or e}"
        ) from e
    except OSError as e:
        raise KeyFileError(f"certificate {cert_file} or key {key_file} cannot be read: {e}") from e
    try:
        ctx.load_verify_locations(cafile=str(ca_file))
    except (ssl.SSLError, OSError) as e:
        raise CertificateError(f"CA file {ca_file} cannot be loaded: {e}") from e
    flags = ctx.verify_flags | ssl.VERIFY_X509_STRICT
    if crl_file is not None:
        try:
            # A PEM file's CRLs go into the same store as the CA (OpenSSL's
            # X509_load_cert_crl_file); CRL_CHECK_LEAF then refuses a revoked
            # peer, and also any peer while the CRL is missing or expired.
            ctx.load_verify_locations(cafile=str(crl_file))
        except (ssl.SSLError, OSError) as e:
            raise CertificateError(f"revocation list {crl_file} cannot be loaded: {e}") from e
        flags |= ssl.VERIFY_CRL_CHECK_LEAF
    ctx.verify_flags = flags
    return ctx


def server_ssl_context(
    *,
    cert_file: StrPath,
    key_file: StrPath,
    ca_file: StrPath,
    crl_file: StrPath | None = None,
    key_password: bytes | None = None,
    check_key_permissions: bool = True,
) -> ssl.SSLContext:
    """The platform's TLS context: TLS 1.3 only, presents ``cert_file`` /
    ``key_file``, requires a client certificate issued by the CA in
    ``ca_file``, checks it against ``crl_file`` if given (recommended; build a
    new context after the CRL changes). Session tickets are off, so every
    connection authenticates with a full handshake (no resumption past a
    revocation). Raises KeyFileError if the key file is accessible by
    group/others or does not match the certificate, CertificateError if the
    CA or CRL file cannot be loaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_TICKET
    # No session resumption: with OP_NO_TICKET alone, TLS 1.3 issues
    # *stateful* tickets, and every accepted connection left its session
    # (with the peer's certificate) in this context's cache, never resumed:
    # 12-17 MiB per 1,000 connections on the relay. No tickets, no cache.
    ctx.num_tickets = 0
    return _configure(
        ctx, cert_file=cert_file, key_file=key_file, ca_file=ca_file, crl_file=crl_file,
        key_password=key_password, check_key_permissions=check_key_permissions,
    )


def client_ssl_context(
    *,
    cert_file: StrPath,
    key_file: StrPath,
    ca_file: StrPath,
    crl_file: StrPath | None = None,
    key_password: bytes | None = None,
    check_key_permissions: bool = True,
) -> ssl.SSLContext:
    """A node's TLS context for connecting to the platform: TLS 1.3 only,
    presents the node certificate ``cert_file`` with its Ed25519 signing key
    ``key_file``, verifies the platform's certificate against ``ca_file`` and
    its host name (pass ``server_hostname`` to SSLStream: an address or name
    in the platform certificate's SAN), and against ``crl_file`` if given.
    Raises like server_ssl_context."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname=True
    return _configure(
        ctx, cert_file=cert_file, key_file=key_file, ca_file=ca_file, crl_file=crl_file,
        key_password=key_password, check_key_permissions=check_key_permissions,
    )


def peer_certificate(
    der: bytes | None,
    *,
    ca: x509.Certificate,
    crl: x509.CertificateRevocationList | None,
    at: dt.datetime | None = None,
) -> NodeCertificate:
    """Verify the peer's certificate as TLS handed it over
    (``ssl_object.getpeercert(binary_form=True)``) against the CA, the CRL and
    its validity period, and return it. Raises CertificateError (and its
    subclasses CertificateExpired, CertificateRevoked) otherwise, also when the
    peer presented no certificate."""
    if not der:
        raise CertificateError("the peer presented no certificate")
    return verify_node_certificate(der, ca=ca, crl=crl, at=at)


def peer_organization(
    der: bytes | None,
    *,
    ca: x509.Certificate,
    crl: x509.CertificateRevocationList | None,
    at: dt.datetime | None = None,
) -> str:
    """The organization id the peer's TLS certificate names, after the checks
    of peer_certificate. The platform binds the connection to it: frames whose
    source is another organization are refused (SOURCE_MISMATCH)."""
    return peer_certificate(der, ca=ca, crl=crl, at=at).org

