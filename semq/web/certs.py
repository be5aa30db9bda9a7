"""The web console's TLS certificate: HTTPS always.

A daemon whose own certificate a browser accepts serves the console with it:
the platform's TLS identity (``tls/server.pem``, ECDSA P-256). A node's
certificate holds an Ed25519 key, which no browser accepts for a server, and
a daemon without security has none: the console then makes its own once, an
ECDSA P-256 self-signed certificate in ``<data dir>/console/`` (key 0600),
and logs its SHA-256 fingerprint for the operator to compare with what the
browser shows.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from semq.identity.crypto import ensure_private_directory, write_private_file

from .users import console_dir

__all__ = ["CONSOLE_CERT", "CONSOLE_DAYS", "CONSOLE_KEY", "ConsoleTLS", "console_tls"]

log = logging.getLogger("semq.web")

CONSOLE_CERT: Final = "console.pem"
CONSOLE_KEY: Final = "console.key.pem"
CONSOLE_DAYS: Final = 825  # the longest validity browsers accept for a server certificate


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsoleTLS:
    certfile: Path
    keyfile: Path
    source: str  # "platform" (tls/server.pem) or "console" (made for the console)
    fingerprint: str  # SHA-256 of the certificate, hex with colons
    not_after_ms: int


def _fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _browser_key(keyfile: Path) -> bool:
    """Whether browsers accept a server certificate of this key (ECDSA or RSA; not Ed25519)."""
    try:
        key = serialization.load_pem_private_key(keyfile.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    return isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)


def _valid(cert: x509.Certificate, days: float = 1) -> bool:
    return cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=days)


def _describe(certfile: Path, keyfile: Path, source: str) -> ConsoleTLS:
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    return ConsoleTLS(certfile=certfile, keyfile=keyfile, source=source, fingerprint=_fingerprint(cert),
                      not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000))


def _names(host: str) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.IPAddress(ipaddress.ip_address("::1"))]
    if host and host not in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _make(cdir: Path, host: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "SEMQ web console")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CONSOLE_DAYS))
            .add_extension(x509.SubjectAlternativeName(_names(host)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    ensure_private_directory(cdir)
    write_private_file(cdir / CONSOLE_KEY, key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    tmp = cdir / f".{CONSOLE_CERT}.tmp"
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.chmod(0o644)
    tmp.replace(cdir / CONSOLE_CERT)


def console_tls(role: str, directory: Path, host: str = "127.0.0.1") -> ConsoleTLS:
    """The certificate and key the console of ``role``'s daemon in
    ``directory`` serves HTTPS with (see the module's docstring). Creates
    the console certificate on first use, and again when it expires within
    a day."""
    directory = Path(directory)
    if role == "platform":
        cert, key = directory / "tls" / "server.pem", directory / "tls" / "server.key.pem"
        if cert.exists() and key.exists() and _browser_key(key):
            tls = _describe(cert, key, "platform")
            if tls.not_after_ms > (dt.datetime.now(dt.UTC).timestamp() + 86400) * 1000:
                log.info("web console: HTTPS with the platform's certificate %s (SHA-256 %s)", cert, tls.fingerprint)
                return tls
    cdir = console_dir(directory)
    cert, key = cdir / CONSOLE_CERT, cdir / CONSOLE_KEY
    made = False
    try:
        current = x509.load_pem_x509_certificate(cert.read_bytes())
        fresh = key.exists() and _valid(current)
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        _make(cdir, host)
        made = True
    tls = _describe(cert, key, "console")
    log.warning("web console: HTTPS with %s certificate %s, SHA-256 fingerprint %s (compare it with the"
                " one your browser shows)", "a new self-signed" if made else "its self-signed", cert, tls.fingerprint)
    return tls
