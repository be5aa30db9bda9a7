"""The node's edge identity: the certificate AS2 / AS4 partners know this
node by, and its key, in the data directory's ``edge/`` (0600). Made once,
self-signed (RSA 2048, three years), when first needed; an operator may put
a CA-issued pair in its place (``cert.pem``, ``key.pem``)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from semq.edge.protocol import OurKeys

__all__ = ["edge_dir", "load_or_make_keys"]


def edge_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "edge"


def load_or_make_keys(data_dir: Path, name: str) -> OurKeys:
    d = edge_dir(data_dir)
    cert, key = d / "cert.pem", d / "key.pem"
    if cert.is_file() and key.is_file():
        return OurKeys(cert_pem=cert.read_bytes(), key_pem=key.read_bytes())
    d.mkdir(mode=0o700, exist_ok=True)
    priv = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or "semq")])
    now = dt.datetime.now(dt.UTC)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(priv.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
         .not_valid_after(now + dt.timedelta(days=3 * 365))
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(priv.public_key()), critical=False)
         .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=True, key_encipherment=True,
                                      data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                      crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
         .sign(priv, hashes.SHA256()))
    key_pem = priv.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    cert_pem = c.public_bytes(serialization.Encoding.PEM)
    for path, data in ((key, key_pem), (cert, cert_pem)):
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return OurKeys(cert_pem=cert_pem, key_pem=key_pem)
