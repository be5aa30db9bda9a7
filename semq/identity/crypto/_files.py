"""PEM files: private keys owner-only, certificates, CSRs, revocation lists.

Private keys are written 0600 inside directories created 0700, atomically
(temporary file in the same directory, fsync, rename), so a crash never leaves
a half-written key and no other user can ever read one, not even briefly.
Loading a private key first checks its mode (``check_private_key_permissions``)
so a daemon refuses to start with keys others can read, and says so.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519

from ._errors import CertificateError, KeyFileError

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PrivateKey",
    "check_private_key_permissions",
    "ensure_private_directory",
    "load_certificate",
    "load_certificates",
    "load_crl",
    "load_csr",
    "load_private_key",
    "save_certificate",
    "save_certificates",
    "save_crl",
    "save_csr",
    "save_private_key",
    "write_private_file",
    "write_public_file",
]

PRIVATE_FILE_MODE: Final = 0o600  # private keys: owner read/write only
PRIVATE_DIR_MODE: Final = 0o700  # directories we create for keys
PUBLIC_FILE_MODE: Final = 0o644  # certificates, CSRs, CRLs: public by nature

PrivateKey = ed25519.Ed25519PrivateKey | x25519.X25519PrivateKey | ec.EllipticCurvePrivateKey

StrPath = str | os.PathLike[str]


def ensure_private_directory(path: StrPath) -> Path:
    """Create ``path`` (and missing parents) with mode 0700. An existing
    directory is left as it is: we never chmod a directory we did not make."""
    p = Path(path)
    if not p.is_dir():
        missing = []
        q = p
        while not q.exists():
            missing.append(q)
            q = q.parent
        for d in reversed(missing):
            d.mkdir(mode=PRIVATE_DIR_MODE)
            os.chmod(d, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
    return p


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    if mode == PRIVATE_FILE_MODE:
        ensure_private_directory(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    # O_EXCL + an explicit mode: the file is never, even for an instant,
    # readable by anyone but the owner (the umask can only remove bits).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def check_private_key_permissions(path: StrPath) -> None:
    """Raise KeyFileError if group or others have any access to the key file
    ``path`` (the file a symlink points to is what counts), or if it is not a
    regular file. The message names the path and the mode and says how to fix
    it. No-op on Windows, where POSIX modes do not apply."""
    p = Path(path)
    if os.name == "nt":  # pragma: no cover
        return
    try:
        st = p.stat()
    except FileNotFoundError:
        raise KeyFileError(f"key file {p} does not exist") from None
    except OSError as e:
        raise KeyFileError(f"key file {p} cannot be read: {e.strerror}") from e
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"key file {p} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        what = []
        if mode & 0o044:
            what.append("readable")
        if mode & 0o022:
            what.append("writable")
        if mode & 0o011:
            what.append("executable")
        raise KeyFileError(
            f"key file {p} is {'/'.join(what)} by group/others (mode {mode:04o});"
            f" run chmod 600 {p}"
        )


def save_private_key(path: StrPath, key: PrivateKey, *, passphrase: bytes | None = None) -> Path:
    """Write ``key`` as PKCS#8 PEM to ``path`` with mode 0600 (parent
    directories created 0700), atomically; optionally encrypted with
    ``passphrase``. Returns the path."""
    p = Path(path)
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    _atomic_write(p, pem, PRIVATE_FILE_MODE)
    return p


def load_private_key(
    path: StrPath, *, passphrase: bytes | None = None, check_permissions: bool = True
) -> PrivateKey:
    """Read a PEM private key (Ed25519, X25519 or EC). Checks the file's mode
    first (KeyFileError, see ``check_private_key_permissions``) unless
    ``check_permissions`` is false. Raises KeyFileError if the file is not a
    key of a supported type or the passphrase is wrong."""
    p = Path(path)
    if check_permissions:
        check_private_key_permissions(p)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise KeyFileError(f"key file {p} cannot be read: {e.strerror}") from e
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"key file {p} is not a readable PEM private key: {e}") from e
    if not isinstance(
        key, ed25519.Ed25519PrivateKey | x25519.X25519PrivateKey | ec.EllipticCurvePrivateKey
    ):
        raise KeyFileError(
            f"key file {p} holds a {type(key).__name__}; SEMQ uses Ed25519, X25519 and EC P-256"
        )
    return key


def write_private_file(path: StrPath, data: bytes) -> Path:
    """Write an owner-only file (0600; its directory created 0700 if new)
    atomically: never seen half-written, never readable by others."""
    p = Path(path)
    _atomic_write(p, data, PRIVATE_FILE_MODE)
    return p


def write_public_file(path: StrPath, data: bytes) -> Path:
    """Write a public file (certificate, CSR, CRL) atomically, mode 0644."""
    p = Path(path)
    _atomic_write(p, data, PUBLIC_FILE_MODE)
    return p


def save_certificate(path: StrPath, cert: x509.Certificate) -> Path:
    """Write one certificate as PEM."""
    return write_public_file(path, cert.public_bytes(serialization.Encoding.PEM))


def save_certificates(path: StrPath, certs: Sequence[x509.Certificate]) -> Path:
    """Write several certificates into one PEM file (e.g. a node's old and new
    certificate during rollover, newest first)."""
    return write_public_file(
        path, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CertificateError(f"{what} file {path} cannot be read: {e.strerror}") from e


def load_certificate(path: StrPath) -> x509.Certificate:
    """Read the first certificate of a PEM file (CertificateError if none)."""
    certs = load_certificates(path)
    return certs[0]


def load_certificates(path: StrPath) -> list[x509.Certificate]:
    """Read every certificate of a PEM file, in file order (CertificateError
    if there is none or the file is not PEM)."""
    p = Path(path)
    data = _read(p, "certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise CertificateError(f"certificate file {p} is not PEM certificates: {e}") from e
    return certs


def save_csr(path: StrPath, csr: x509.CertificateSigningRequest) -> Path:
    """Write a certificate signing request as PEM."""
    return write_public_file(path, csr.public_bytes(serialization.Encoding.PEM))


def load_csr(path: StrPath) -> x509.CertificateSigningRequest:
    """Read a PEM certificate signing request (CertificateError otherwise)."""
    p = Path(path)
    data = _read(p, "CSR")
    try:
        return x509.load_pem_x509_csr(data)
    except ValueError as e:
        raise CertificateError(f"CSR file {p} is not a PEM certificate request: {e}") from e


def save_crl(path: StrPath, crl: x509.CertificateRevocationList) -> Path:
    """Write a certificate revocation list as PEM."""
    return write_public_file(path, crl.public_bytes(serialization.Encoding.PEM))


def load_crl(path: StrPath) -> x509.CertificateRevocationList:
    """Read a PEM revocation list (CertificateError otherwise)."""
    p = Path(path)
    data = _read(p, "revocation list")
    try:
        return x509.load_pem_x509_crl(data)
    except ValueError as e:
        raise CertificateError(f"revocation list file {p} is not a PEM CRL: {e}") from e
