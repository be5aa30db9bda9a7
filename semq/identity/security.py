"""Where the keys and certificates of a data directory live, and the few
operations the CLI and daemons need (semq.identity.crypto does the cryptography).

Platform directory::

    ca/ca.key.pem ca/ca.pem ca/crl.pem ca/issued/*.pem   the CA (CertificateAuthority.save)
    tls/server.key.pem tls/server.pem                    the platform's TLS identity

Node directory::

    keys/sign.key.pem keys/enc.key.pem   Ed25519 (TLS client, signatures) and X25519 (E2E)
    node.csr.pem                         the request for the platform operator
    node.pem                             the certificate the platform issued
    ca.pem                               the platform's CA certificate
    crl.pem                              the newest revocation list the platform sent (CRL frames)
    pins.json                            the certificates of other organizations it trusts (semq.identity.trust)
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from semq.identity.crypto import (
    DEFAULT_CRL_DAYS,
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
    UnknownCertificate,
    certificate_org,
    client_ssl_context,
    csr_org,
    endorse_rollover,
    ensure_private_directory,
    expiring_within,
    fingerprint,
    load_certificate,
    load_crl,
    load_csr,
    make_csr,
    peer_organization,
    save_certificate,
    save_crl,
    save_csr,
    server_ssl_context,
    verify_crl,
)
from semq.identity.trust import Admission, PinStore
from semq.umxt_protocol import CertResponse, Endpoint, NodeType, ResultCode

__all__ = [
    "WAITING_CODES",
    "AlreadyEnrolled",
    "CertAnswer",
    "NodeSecurity",
    "PlatformSecurity",
    "SecurityError",
    "check_not_enrolled",
    "enroll",
    "import_certificate",
    "init_node_keys",
    "init_platform_pki",
    "revoke",
    "rollover_keys",
    "waiting_reason",
]

log = logging.getLogger("semq.identity.security")

#: Why a document to a known organization waits for a certificate (it stays
#: SS_INIT with this code, is retried with backoff, and goes once a usable,
#: trusted certificate comes): the code and what it means for the user.
WAITING_CODES: Final = {
    int(ResultCode.UNKNOWN_CERTIFICATE): "no usable certificate yet",
    int(ResultCode.CERT_REVOKED): "its certificate is revoked, no successor yet",
    int(ResultCode.AUTH_FAILED): "its certificate expired or does not verify",
    int(ResultCode.CERT_NOT_TRUSTED): "its certificate is not the one pinned here: see 'semq node trust'",
}


def waiting_reason(target: str, code: int) -> str:
    """``waiting for a certificate of 56001: CERT_REVOKED (...)`` for a
    document that waits; '' for any other code."""
    what = WAITING_CODES.get(int(code))
    if what is None:
        return ""
    return f"waiting for a certificate of {target}: {ResultCode(code).name} ({what})"


class SecurityError(Exception):
    """A missing or unusable key/certificate, as one line for the user."""


class AlreadyEnrolled(SecurityError):
    """``semq platform enroll`` for an organization that holds a valid
    certificate, without ``--rollover`` (a user's mistake: exit 2)."""


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
    from semq.identity.crypto import save_private_key

    save_private_key(tls / "server.key.pem", key)
    save_certificate(tls / "server.pem", cert)


def enroll(pdir: Path, csr_path: Path, org: str | None, out: Path | None, *,
           rollover: bool = False) -> tuple[str, Path]:
    """Issue a node certificate from a CSR (the operator's ``semq platform
    enroll``). Returns (org, certificate path).

    One organization, one identity: whoever holds a valid certificate of an
    organization can open the documents sealed to it and sign receipts in
    its name, so a second valid certificate is issued only as a
    ``rollover`` (AlreadyEnrolled otherwise). Revoked or expired earlier
    certificates do not count. A request from ``semq node rollover``
    carries the current key's endorsement, which the CA checks and copies
    (nodes that pinned the old certificate accept the new one on it)."""
    ca = CertificateAuthority.load(_ca_dir(pdir))
    try:
        csr = load_csr(csr_path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"cannot read certificate request {csr_path}: {e}") from e
    if not rollover:
        _refuse_second(ca, csr_org(csr))
    cert = ca.issue_node_certificate(csr, org=org)
    ca.save(_ca_dir(pdir))

    name = certificate_org(cert)
    path = out or Path(f"{name}.pem")
    save_certificate(path, cert)
    return name, path


def _refuse_second(ca: CertificateAuthority, org: str) -> None:
    current = ca.current_certificates(org)
    if current:
        c = current[0]
        raise AlreadyEnrolled(
            f"organization {org} already holds a valid certificate (serial {c.serial_number:x},"
            f" fingerprint {fingerprint(c)}); a second one only as a key rollover: --rollover")


def check_not_enrolled(pdir: Path, org: str) -> None:
    """AlreadyEnrolled if ``org`` holds a valid certificate of the CA in
    ``pdir`` (``node init --enroll-from`` asks before it writes anything)."""
    _refuse_second(CertificateAuthority.load(_ca_dir(pdir)), org)


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


def rollover_keys(ndir: Path, org: str, *, endorse: bool = True) -> Path:
    """Certificate rollover, step 1: a new key generation in ``next/`` and its
    certificate request; the current identity keeps working until the new
    certificate is imported (``import_certificate``). With ``endorse`` the
    request carries the current signing key's endorsement of the new keys
    (semq.identity.crypto.Endorsement): nodes that pinned the current certificate
    then accept the new one without their operator."""
    nd = ndir / "next"
    if nd.exists():
        shutil.rmtree(nd)  # an unfinished earlier rollover: start again
    if not endorse:
        return init_node_keys(nd, org)
    current = NodeKeys.load(ndir / "keys" / "sign.key.pem", ndir / "keys" / "enc.key.pem")
    keys = NodeKeys.generate()
    kd = nd / "keys"
    ensure_private_directory(kd)
    keys.save(kd / "sign.key.pem", kd / "enc.key.pem")
    path = nd / "node.csr.pem"
    save_csr(path, make_csr(keys, org, endorsement=endorse_rollover(current.signing_key, org, keys)))
    return path


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
                ensure_private_directory(keep)  # old/ and old/SERIAL/, each 0700
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


def _stamp(*paths: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """What tells a file or directory changed: inode (our writes replace
    files), mtime in ns and size; None if it is missing."""
    out: list[tuple[int, int, int] | None] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass
class PlatformSecurity:
    """What the platform daemon needs: the TLS context, the CRL-aware peer
    check, the certificate directory it serves to nodes, and the signed
    revocation list it sends them."""

    pdir: Path
    ca: CertificateAuthority = field(init=False)
    directory: CertificateDirectory = field(init=False)
    crl_der: bytes = field(init=False, default=b"")
    # org -> why it has no usable certificate (CERT_REVOKED, AUTH_FAILED
    # for expired ones), for organizations the CA issued certificates to.
    unusable: dict[str, ResultCode] = field(init=False, default_factory=dict)
    # org -> fingerprints of its usable certificates (a change is pushed).
    fingerprints: dict[str, tuple[str, ...]] = field(init=False, default_factory=dict)
    _seen: tuple[tuple[int, int, int] | None, ...] = field(init=False, default=())
    _crl_next: dt.datetime | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not (_ca_dir(self.pdir) / "ca.pem").exists():
            raise SecurityError(f"{self.pdir} has no certificate authority; run 'semq platform init'"
                                " (or set security = false in semq.toml)")
        self.reload()

    def _files(self) -> tuple[Path, Path]:
        d = _ca_dir(self.pdir)
        return d / "crl.pem", d / "issued"

    def reload(self) -> None:
        """(Re)read the CA state: what ``semq platform enroll`` / ``revoke``
        wrote (another process). The revocation list is re-signed when half
        its validity is gone (a stale one fails closed everywhere), and only
        then: writing it on every reload could put back a list older than a
        ``revoke`` that ran meanwhile."""
        d = _ca_dir(self.pdir)
        seen = _stamp(*self._files())  # before reading: a change while we read shows next time
        self.ca = CertificateAuthority.load(d)
        crl_file = d / "crl.pem"
        try:
            crl = load_crl(crl_file)
            verify_crl(crl, ca=self.ca.certificate)
            due = self._due(crl)
        except CryptoError:
            due = True
        if due:
            self.ca.save(d)
            crl = load_crl(crl_file)
            seen = _stamp(*self._files())
        self._crl_next = crl.next_update_utc
        self.crl_der = crl.public_bytes(Encoding.DER)
        self.directory = CertificateDirectory.from_authority(self.ca)
        self.fingerprints = self.directory.fingerprints()
        now = dt.datetime.now(dt.UTC)
        # Why the others have none: a revoked certificate says more than an
        # expired one (AUTH_FAILED, CertificateExpired's code), which says
        # more than one that does not verify.
        rank = {ResultCode.CERT_REVOKED: 3, ResultCode.AUTH_FAILED: 2, ResultCode.UNKNOWN_CERTIFICATE: 1}
        unusable: dict[str, ResultCode] = {}
        for cert in self.ca.issued.values():
            try:
                org = certificate_org(cert)
            except CertificateError:
                continue  # the platform's own TLS certificate
            if org in self.fingerprints:
                continue
            if cert.serial_number in self.ca.revoked:
                code = ResultCode.CERT_REVOKED
            elif not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
                code = ResultCode.AUTH_FAILED
            else:
                code = ResultCode.UNKNOWN_CERTIFICATE
            if rank[code] > rank.get(unusable.get(org, ResultCode.OK), 0):
                unusable[org] = code
        self.unusable = unusable
        self._seen = seen

    @staticmethod
    def _due(crl: x509.CertificateRevocationList) -> bool:
        nxt = crl.next_update_utc
        return nxt is None or nxt - dt.datetime.now(dt.UTC) < dt.timedelta(days=DEFAULT_CRL_DAYS / 2)

    def changed(self) -> bool:
        """Whether the CA's files changed since the last reload (two stats:
        the revocation list, replaced by every save, and the directory of
        issued certificates, which a new one changes), or the list is due
        for re-signing."""
        if _stamp(*self._files()) != self._seen:
            return True
        nxt = self._crl_next
        return nxt is not None and nxt - dt.datetime.now(dt.UTC) < dt.timedelta(days=DEFAULT_CRL_DAYS / 2)

    def cert_response(self, who: Endpoint) -> CertResponse | None:
        """The answer to CERT_REQUEST from what the CA issued: the usable
        certificates; or why an organization it issued certificates to has
        none (CERT_REVOKED, AUTH_FAILED for expired ones); None for an
        organization the CA never issued a certificate to (the caller tells
        "known, no certificate yet" from "unknown" with the platform's
        registrations)."""
        resp = self.directory.cert_response(who)
        if resp.code is ResultCode.OK:
            return resp
        if who.node_type is NodeType.ORGANIZATION:
            code = self.unusable.get(who.node_id)
            if code is not None:
                return CertResponse(endpoint=who, code=code)
        return None

    def revoked_orgs(self) -> set[str]:
        """Organizations with revoked certificates and no usable one."""
        return {o for o, code in self.unusable.items() if code is ResultCode.CERT_REVOKED}

    def ssl_context(self) -> ssl.SSLContext:
        d = _ca_dir(self.pdir)
        return server_ssl_context(cert_file=self.pdir / "tls" / "server.pem",
                                  key_file=self.pdir / "tls" / "server.key.pem",
                                  ca_file=d / "ca.pem", crl_file=d / "crl.pem")

    def peer_org(self, der: bytes | None) -> str:
        crl = load_crl(_ca_dir(self.pdir) / "crl.pem")
        return peer_organization(der, ca=self.ca.certificate, crl=crl)


@dataclass
class CertAnswer:
    """What a node made of a CERT_RESPONSE (NodeSecurity.accept_response):
    ``code`` OK when it now holds usable, trusted certificates of
    ``endpoint``; otherwise why not (UNKNOWN_TARGET: the platform does not
    know the organization; one of WAITING_CODES: known, no usable
    certificate; CERT_NOT_TRUSTED: none that is pinned here)."""

    endpoint: Endpoint
    code: ResultCode
    detail: str = ""
    admission: Admission | None = None


def _crl_number(crl: x509.CertificateRevocationList) -> int:
    try:
        return int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        return -1


@dataclass
class NodeSecurity:
    """A node's identity, its view of other organizations' certificates
    (filled from the platform's directory, each verified against the CA and
    the newest revocation list the platform sent, and filtered through the
    node's pins), and the amortizing sealer/opener."""

    ndir: Path
    identity: NodeIdentity = field(init=False)
    ca: x509.Certificate = field(init=False)
    directory: CertificateDirectory = field(init=False)
    pins: PinStore = field(init=False)
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
        self._load_crl()
        try:
            self.directory.add(self.identity.certificate.der)
        except CryptoError as e:
            log.warning("our own certificate is not usable: %s", e)
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
            try:
                self.directory.add(old.certificate.der)
            except CryptoError:
                pass  # revoked: it still opens what was sealed to it, nobody verifies with it
        self.pins = PinStore(self.ndir)
        self._load_remembered()
        self.sealer = Sealer()
        self.opener = Opener([self.identity.keys.encryption_key,
                              *(p.keys.encryption_key for p in self.previous)])
        self.cache = SignatureCache()

    @property
    def org(self) -> str:
        return self.identity.org

    # ------------------------------------------------------------ revocation

    def _load_crl(self) -> None:
        """The revocation list the platform sent last (kept in crl.pem). A
        stale or foreign one is left aside: the platform sends a fresh one
        when the node connects."""
        path = self.ndir / "crl.pem"
        if not path.exists():
            return
        try:
            self.directory.set_crl(load_crl(path))
        except CryptoError as e:
            log.warning("revocation list %s not used (%s); the platform sends a fresh one on connect", path, e)

    def apply_crl(self, der: bytes) -> bool:
        """A revocation list from the platform (CRL frame): checked against
        the CA (signature, not stale), applied if newer than the one held
        (by CRL number: the relay cannot bring back an older list), and kept
        in crl.pem for the next start. Returns True if it was applied.
        Raises CertificateError if it does not verify."""
        try:
            crl = x509.load_der_x509_crl(der)
        except ValueError as e:
            raise CertificateError(f"revocation list of {len(der)} bytes is not DER: {e}") from e
        verify_crl(crl, ca=self.ca)
        held = self.directory.crl
        if held is not None and _crl_number(held) >= _crl_number(crl):
            return False
        self.directory.set_crl(crl)
        save_crl(self.ndir / "crl.pem", crl)
        return True

    # ------------------------------------------------------------ other organizations

    def accept_response(self, response: CertResponse) -> CertAnswer:
        """Apply the platform's CERT_RESPONSE: verify every certificate (CA,
        revocation list, validity, organization), keep those the pins allow
        (semq.identity.trust: first use pins them; later only pinned ones and
        rollovers endorsed by a pinned key), and make them what the node
        seals to and verifies with. Public-key work and, on a change, a
        write of pins.json: call it off the event loop."""
        ep = response.endpoint
        if response.code is ResultCode.CERT_REVOKED and ep.node_type is NodeType.ORGANIZATION:
            # The platform says every certificate of it is revoked: stop using
            # them now, even before (or without) the revocation list.
            self.directory.remove(ep.node_id)
        if response.code is not ResultCode.OK:
            return CertAnswer(ep, response.code, f"the platform has no usable certificate for {ep}:"
                                                 f" {response.code.name}")
        if ep.node_type is not NodeType.ORGANIZATION:
            return CertAnswer(ep, ResultCode.UNKNOWN_CERTIFICATE, f"{ep} is not an organization")
        org = ep.node_id
        try:
            good, errors = self.directory.verify_response(response)
        except CryptoError as e:
            return CertAnswer(ep, getattr(e, "code", ResultCode.UNKNOWN_CERTIFICATE), str(e))
        if not good:
            e0 = errors[0] if errors else UnknownCertificate(f"the platform answered no certificate for {ep}")
            return CertAnswer(ep, e0.code, str(e0))
        if org == self.org:
            return CertAnswer(ep, ResultCode.OK)  # our own: we know our certificates
        adm = self.pins.admit(org, good)
        self.directory.replace(org, adm.accepted)
        if not adm.accepted:
            return CertAnswer(ep, ResultCode.CERT_NOT_TRUSTED,
                              f"no certificate of {org} is pinned here ({len(adm.refused)} refused)", adm)
        self.remember(org)
        return CertAnswer(ep, ResultCode.OK, "", adm)

    def certs(self, who: Endpoint | str) -> list[NodeCertificate]:
        """Usable certificates of an organization, newest first; [] when none
        is known (yet), expired or revoked."""
        try:
            return list(self.directory.lookup(who))
        except CryptoError:
            return []

    def _load_remembered(self) -> None:
        """The other organizations' certificates kept in certs/ (``remember``)
        that still verify (CA, the revocation list held, validity) and are
        pinned here: used from the start, so a node that restarts verifies
        the receipts that come first and seals without asking the platform
        (it asks anyway, and its answers replace these)."""
        from semq.identity.crypto import load_certificates

        d = self.ndir / "certs"
        if not d.is_dir():
            return
        pinned = self.pins.snapshot()
        for p in sorted(d.glob("*.pem")):
            org = p.stem
            if org == self.org or not pinned.get(org):
                continue
            try:
                found = CertificateDirectory(self.ca, self.directory.crl)
                found.add_many(load_certificates(p))
                usable = [c for c in found.lookup(org) if c.fingerprint in pinned[org]]
            except (CryptoError, OSError, ValueError) as e:
                log.warning("certificates of %s kept in %s not used: %s", org, p, e)
                continue
            if usable:
                self.directory.replace(org, usable)

    def remember(self, org: str) -> None:
        """Keep the verified certificates of ``org`` on disk (certs/ORG.pem)
        so receipts can be checked later without the daemon."""
        from semq.identity.crypto import save_certificates

        certs = self.certs(org)
        if certs:
            (self.ndir / "certs").mkdir(exist_ok=True)
            save_certificates(self.ndir / "certs" / f"{org}.pem",
                              [x509.load_der_x509_certificate(c.der) for c in certs])

    def ssl_context(self) -> ssl.SSLContext:
        return client_ssl_context(cert_file=self.ndir / "node.pem", key_file=self.ndir / "keys" / "sign.key.pem",
                                  ca_file=self.ndir / "ca.pem")

    def direct_contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """TLS contexts for direct links between nodes, (listening, dialling):
        both present this node's certificate and require the peer's, issued
        by the CA. The peer's organization, revocation and (dialling) that
        it is a certificate this node holds for the organization it meant
        to reach are checked after the handshake (semq.node.daemon.direct): a node
        certificate names an organization, not a host."""
        cert, key, ca = self.ndir / "node.pem", self.ndir / "keys" / "sign.key.pem", self.ndir / "ca.pem"
        server = server_ssl_context(cert_file=cert, key_file=key, ca_file=ca)
        client = client_ssl_context(cert_file=cert, key_file=key, ca_file=ca)
        # Node certificates are issued for TLS clients (the platform's
        # connections), so OpenSSL's purpose check would refuse one a
        # listening node presents. The dialler verifies it in full after
        # the handshake instead (semq.node.daemon.direct: CA, revocation list,
        # validity, organization, and one this node already trusts); the
        # handshake has proven the peer holds its key either way.
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        return server, client

    def expires_in_days(self) -> float:
        na = self.identity.certificate.not_after
        return (na - dt.datetime.now(dt.UTC)).total_seconds() / 86400

    def expiring(self, days: float = 30) -> bool:
        return expiring_within(self.identity.certificate, days)

