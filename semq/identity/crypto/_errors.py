"""Errors of ``semq.identity.crypto``.

Every error is one line naming the value and the reason or limit (STYLE 3)
and carries ``code``: the UMX-T result code a daemon sends back to the peer
(or logs) when the error is about a peer's document, certificate or receipt.
"""

from __future__ import annotations

from semq.umxt_protocol import ResultCode

__all__ = [
    "BadSignature",
    "CertificateError",
    "CertificateExpired",
    "CertificateRevoked",
    "CryptoError",
    "DecryptError",
    "KeyFileError",
    "UnknownCertificate",
]


class CryptoError(Exception):
    """Base of every ``semq.identity.crypto`` error. ``code`` is the result code to
    report to the peer (ResultCode)."""

    default_code: ResultCode = ResultCode.INTERNAL_ERROR
    code: ResultCode

    def __init__(self, message: str, code: ResultCode | None = None) -> None:
        super().__init__(message)
        self.code = self.default_code if code is None else code


class CertificateError(CryptoError):
    """A certificate, CSR or revocation list is not acceptable: wrong issuer,
    bad signature, missing SEMQ fields, not (yet) valid."""

    default_code = ResultCode.AUTH_FAILED


class CertificateExpired(CertificateError):
    """The certificate's validity period ended (or has not begun)."""


class CertificateRevoked(CertificateError):
    """The certificate's serial number is on the CA's revocation list."""

    default_code = ResultCode.CERT_REVOKED


class UnknownCertificate(CertificateError):
    """No usable certificate is known for an endpoint or key id."""

    default_code = ResultCode.UNKNOWN_CERTIFICATE


class DecryptError(CryptoError):
    """A sealed document could not be opened: malformed or tampered session key
    blob, ciphertext or associated data, or no wrap for any of our keys."""

    default_code = ResultCode.DECRYPT_FAILED


class BadSignature(CryptoError):
    """A signed document or receipt did not verify (or is malformed)."""

    default_code = ResultCode.BAD_SIGNATURE


class KeyFileError(CryptoError):
    """A private key file is unsafe (group/others can access it) or unreadable.
    Local, never sent to a peer: a daemon refuses to start and prints it."""
