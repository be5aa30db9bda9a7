"""Where the keys and certificates of a data directory live, and the few
operations the CLI and daemons need (semq.crypto does the cryptography).

Platform directory::

    ca/ca.key.pem ca/ca.pem ca/crl.pem ca/issued/*.pem   the CA (CertificateAuthority.save)
    tls/server.key.pem tls/server.pem                    the platform's TLS identity

Node directory::

    keys/sign.key.pem keys/enc.key.pem   Ed25519 (TLS client, signatures) and X25519 (E2E)
    node.csr.pem                         the request for the platform operator
    node.pem                             the certificate the platform issued
    ca.pem                               the platform's CA certificate
"""

from __future__ import annotations

import datetime as dt
import shutil
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from semq.crypto import (
    CertificateAuthority,
    CertificateDirectory,
    CertificateError,
    CryptoError,
    NodeCertificate,
    NodeIdentity,
    NodeKeys,
    Opener,
    Sealer,
    SignatureCache,
    client_ssl_context,
    ensure_private_directory,
    expiring_within,
    load_certificate,
    load_crl,
    load_csr,
    make_csr,
    peer_organization,
    save_certificate,
    save_csr,
    server_ssl_context,
)
from semq.umxt_protocol import Endpoint

__all__ = [
    "NodeSecurity",
    "PlatformSecurity",
    "SecurityError",
    "enroll",
    "import_certificate",
    "init_node_keys",
    "init_platform_pki",
    "revoke",
]


class SecurityError(Exception):
    """A missing or unusable key/certificate, as one line for the user."""


def _ca_dir(pdir: Path) -> Path:
    return pdir / "ca"


def init_platform_pki(pdir: Path, platform_id: str, names: list[str]) -> None:
    """The platform's CA and TLS certificate (SAN: 127.0.0.1, ::1, localhost
    and ``names``)."""
    ca = CertificateAuthority.create(f"SEMQ platform CA ({platform_id})")
    key, cert = ca.issue_server_certificate(names=names, platform_id=platform_id)
    ca.save(_ca_dir(pdir))
    tls = pdir / "tls"
    ensure_private_directory(tls)
    from semq.crypto import save_private_key

    save_private_key(tls / "server.key.pem", key)
    save_certificate(tls / "server.pem", cert)


def enroll(pdir: Path, csr_path: Path, org: str | None, out: Path | None) -> tuple[str, Path]:
    """Issue a node certificate from a CSR (the operator's ``semq platform
    enroll``). Returns (org, certificate path)."""
    ca = CertificateAuthority.load(_ca_dir(pdir))
    try:
        csr = load_csr(csr_path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"cannot read certificate request {csr_path}: {e}") from e
    cert = ca.issue_node_certificate(csr, org=org)
    ca.save(_ca_dir(pdir))
    from semq.crypto import certificate_org

    name = certificate_org(cert)
    path = out or Path(f"{name}.pem")
    save_certificate(path, cert)
    return name, path


def revoke(pdir: Path, target: str | int) -> list[int]:
    ca = CertificateAuthority.load(_ca_dir(pdir))
    serials = ca.revoke(target)
    ca.save(_ca_dir(pdir))  # writes a freshly signed crl.pem; a running platform reloads it
    return serials


def init_node_keys(ndir: Path, org: str) -> Path:
    keys = NodeKeys.generate()
    kd = ndir / "keys"
    ensure_private_directory(kd)
    keys.save(kd / "sign.key.pem", kd / "enc.key.pem")
    path = ndir / "node.csr.pem"
    save_csr(path, make_csr(keys, org))
    return path


def rollover_keys(ndir: Path, org: str) -> Path:
    """Certificate rollover, step 1: a new key generation in ``next/`` and its
    certificate request; the current identity keeps working until the new
    certificate is imported (``import_certificate``)."""
    nd = ndir / "next"
    if nd.exists():
        shutil.rmtree(nd)  # an unfinished earlier rollover: start again
    return init_node_keys(nd, org)


def import_certificate(ndir: Path, cert_path: Path, ca_path: Path) -> NodeIdentity:
    """Install the issued certificate and the CA certificate; verify they
    fit the node's keys before anything is replaced. A certificate for the
    keys of a pending rollover (``next/``) makes them current; the previous
    generation moves to ``old/<serial>/`` and stays usable to open documents
    sealed to it until its certificate expires (docs/security.md, rollover)."""
    try:
        ca = load_certificate(ca_path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"cannot read CA certificate {ca_path}: {e}") from e
    nxt = ndir / "next" / "keys"
    if nxt.exists():
        try:
            ident = NodeIdentity.load(cert_path, nxt / "sign.key.pem", nxt / "enc.key.pem", ca=ca)
        except CertificateError:
            ident = None
        if ident is not None:
            if (ndir / "node.pem").exists():
                current = load_certificate(ndir / "node.pem")
                keep = ndir / "old" / f"{current.serial_number:x}"
                keep.mkdir(mode=0o700, parents=True, exist_ok=True)
                if (keep / "keys").exists():
                    shutil.rmtree(keep / "keys")
                shutil.move(str(ndir / "keys"), str(keep / "keys"))
                shutil.copyfile(ndir / "node.pem", keep / "node.pem")
            shutil.move(str(nxt), str(ndir / "keys"))
            shutil.copyfile(cert_path, ndir / "node.pem")  # (it may live in next/)
            shutil.copyfile(ca_path, ndir / "ca.pem")
            shutil.rmtree(ndir / "next")
            return ident
    kd = ndir / "keys"
    ident = NodeIdentity.load(cert_path, kd / "sign.key.pem", kd / "enc.key.pem", ca=ca)
    shutil.copyfile(cert_path, ndir / "node.pem")
    shutil.copyfile(ca_path, ndir / "ca.pem")
    return ident


@dataclass
class PlatformSecurity:
    """What the platform daemon needs: the TLS context, the CRL-aware peer
    check, and the certificate directory it serves to nodes."""

    pdir: Path
    ca: CertificateAuthority = field(init=False)
    directory: CertificateDirectory = field(init=False)
    crl_mtime: float = 0.0

    def __post_init__(self) -> None:
        if not (_ca_dir(self.pdir) / "ca.pem").exists():
            raise SecurityError(f"{self.pdir} has no certificate authority; run 'semq platform init'"
                                " (or set security = false in semq.toml)")
        self.reload()

    def reload(self) -> None:
        """(Re)read the CA state; re-sign the CRL so it never goes stale
        while the platform runs (a stale CRL fails closed)."""
        self.ca = CertificateAuthority.load(_ca_dir(self.pdir))
        self.ca.save(_ca_dir(self.pdir))
        self.directory = CertificateDirectory.from_authority(self.ca)
        self.crl_mtime = (_ca_dir(self.pdir) / "crl.pem").stat().st_mtime

    def changed(self) -> bool:
        try:
            return (_ca_dir(self.pdir) / "crl.pem").stat().st_mtime != self.crl_mtime
        except OSError:
            return False

    def revoked_orgs(self) -> set[str]:
        from semq.crypto import certificate_org

        out = set()
        for serial in self.ca.revoked:
            cert = self.ca.issued.get(serial)
            if cert is not None:
                try:
                    out.add(certificate_org(cert))
                except CertificateError:
                    pass
        # An org with another, still valid certificate stays allowed.
        def usable(o: str) -> bool:
            try:
                return bool(self.directory.lookup(o))
            except CryptoError:
                return False

        return {o for o in out if not usable(o)}

    def ssl_context(self) -> ssl.SSLContext:
        d = _ca_dir(self.pdir)
        return server_ssl_context(cert_file=self.pdir / "tls" / "server.pem",
                                  key_file=self.pdir / "tls" / "server.key.pem",
                                  ca_file=d / "ca.pem", crl_file=d / "crl.pem")

    def peer_org(self, der: bytes | None) -> str:
        crl = load_crl(_ca_dir(self.pdir) / "crl.pem")
        return peer_organization(der, ca=self.ca.certificate, crl=crl)


@dataclass
class NodeSecurity:
    """A node's identity, its view of other organizations' certificates
    (filled from the platform's directory), and the amortizing sealer/opener."""

    ndir: Path
    identity: NodeIdentity = field(init=False)
    ca: x509.Certificate = field(init=False)
    directory: CertificateDirectory = field(init=False)
    sealer: Sealer = field(init=False)
    opener: Opener = field(init=False)
    cache: SignatureCache = field(init=False)

    def __post_init__(self) -> None:
        if not (self.ndir / "node.pem").exists():
            raise SecurityError(
                f"{self.ndir} has no certificate yet: send {self.ndir / 'node.csr.pem'} to the platform"
                " operator ('semq platform enroll'), then 'semq node import --cert FILE --ca CA.pem'"
                " (or set security = false in semq.toml)")
        self.ca = load_certificate(self.ndir / "ca.pem")
        kd = self.ndir / "keys"
        self.identity = NodeIdentity.load(self.ndir / "node.pem", kd / "sign.key.pem", kd / "enc.key.pem",
                                          ca=self.ca)
        self.directory = CertificateDirectory(self.ca, None)
        self.directory.add(self.identity.certificate.der)
        # Rollover overlap: earlier generations still open what was sealed to
        # them, until their certificates expire.
        self.previous: list[NodeIdentity] = []
        for d in sorted((self.ndir / "old").glob("*/")):
            try:
                old = NodeIdentity.load(d / "node.pem", d / "keys" / "sign.key.pem", d / "keys" / "enc.key.pem",
                                        ca=self.ca)
            except CryptoError:
                continue  # expired (or unusable): its documents can no longer be opened
            self.previous.append(old)
            self.directory.add(old.certificate.der)
        self.sealer = Sealer()
        self.opener = Opener([self.identity.keys.encryption_key,
                              *(p.keys.encryption_key for p in self.previous)])
        self.cache = SignatureCache()

    @property
    def org(self) -> str:
        return self.identity.org

    def certs(self, who: Endpoint | str) -> list[NodeCertificate]:
        """Usable certificates of an organization, newest first; [] when none
        is known (yet), expired or revoked."""
        try:
            return list(self.directory.lookup(who))
        except CryptoError:
            return []

    def remember(self, org: str) -> None:
        """Keep the verified certificates of ``org`` on disk (certs/ORG.pem)
        so receipts can be checked later without the daemon."""
        from semq.crypto import save_certificates

        certs = self.certs(org)
        if certs:
            (self.ndir / "certs").mkdir(exist_ok=True)
            save_certificates(self.ndir / "certs" / f"{org}.pem",
                              [x509.load_der_x509_certificate(c.der) for c in certs])

    def ssl_context(self) -> ssl.SSLContext:
        return client_ssl_context(cert_file=self.ndir / "node.pem", key_file=self.ndir / "keys" / "sign.key.pem",
                                  ca_file=self.ndir / "ca.pem")

    def expires_in_days(self) -> float:
        na = self.identity.certificate.not_after
        return (na - dt.datetime.now(dt.UTC)).total_seconds() / 86400

    def expiring(self, days: float = 30) -> bool:
        return expiring_within(self.identity.certificate, days)
