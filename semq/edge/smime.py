"""S/MIME's CMS layer for the edge (RFC 5652, 3274), sans-IO.

Signing and encrypting use ``cryptography``'s PKCS#7 builders. Verifying
and decrypting are done here, over ``asn1crypto``'s parse of the CMS
structures and ``cryptography``'s primitives, because ``cryptography``'s own
``pkcs7_decrypt_*`` accepts only RSA PKCS#1 v1.5 key transport and has no
signature verification, while AS2 partners send RSAES-OAEP too (libas2:
OAEP with SHA-512). Compression (RFC 3274, zlib) is ours as well, with a
bound on the output (a compression bomb is refused, never inflated whole).

Every failure is one ``SmimeError`` with a short reason."""

from __future__ import annotations

import hashlib
import hmac
import os
import zlib
from typing import Final

from asn1crypto import cms
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
from cryptography.hazmat.primitives import hashes, padding, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric import padding as apad
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.serialization import pkcs7

__all__ = [
    "HASHES",
    "KEY_TRANSPORTS",
    "SmimeError",
    "compress",
    "decompress",
    "decrypt",
    "encrypt",
    "encrypt_oaep",
    "load_cert",
    "load_key",
    "sign_detached",
    "verify_detached",
]


class SmimeError(Exception):
    """A CMS structure that does not open, verify or decompress."""


#: the digests we sign with and accept, by their AS2 names (RFC 5751 micalg)
HASHES: Final[dict[str, type[hashes.HashAlgorithm]]] = {
    "sha-256": hashes.SHA256, "sha-384": hashes.SHA384, "sha-512": hashes.SHA512, "sha1": hashes.SHA1,
}
_ASN1_HASH: Final = {"sha1": "sha1", "sha256": "sha-256", "sha384": "sha-384", "sha512": "sha-512"}
_ENCRYPTIONS: Final[dict[str, type[algorithms.AES128] | type[algorithms.AES256]]] = {
    "aes128-cbc": algorithms.AES128, "aes256-cbc": algorithms.AES256}


def load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise SmimeError(f"not a PEM certificate ({e})") from None


def load_key(pem: bytes) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, None)
    except (ValueError, TypeError) as e:
        raise SmimeError(f"not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise SmimeError("the edge key must be RSA or EC")
    return key


def sign_detached(data: bytes, cert_pem: bytes, key_pem: bytes, micalg: str = "sha-256") -> bytes:
    """A detached CMS signature (DER) of ``data``, taken as is (binary)."""
    hash_cls = HASHES.get(micalg)
    if hash_cls is None or micalg == "sha1":
        raise SmimeError(f"cannot sign with {micalg!r} (sha-256, sha-384, sha-512)")
    builder = pkcs7.PKCS7SignatureBuilder().set_data(data).add_signer(
        load_cert(cert_pem), load_key(key_pem), hash_cls())  # type: ignore[arg-type]
    return builder.sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Binary])


def verify_detached(data: bytes, signature: bytes, signer: x509.Certificate) -> str:
    """Check a detached CMS signature of ``data`` made by ``signer``'s key;
    the digest's AS2 name. Raises ``SmimeError``."""
    try:
        info = cms.ContentInfo.load(signature)
        if info["content_type"].native != "signed_data":
            raise SmimeError("the signature is not CMS signed-data")
        signers = list(info["content"]["signer_infos"])
    except (ValueError, TypeError, KeyError) as e:
        raise SmimeError(f"the signature does not parse ({e})") from None
    if not signers:
        raise SmimeError("the signature has no signer")
    reasons = []
    for si in signers:
        try:
            return _verify_one(si, data, signer)
        except (SmimeError, ValueError, TypeError, KeyError) as e:
            reasons.append(str(e))
    raise SmimeError("; ".join(reasons))


def _verify_one(si: cms.SignerInfo, data: bytes, signer: x509.Certificate) -> str:
    digest_name = si["digest_algorithm"]["algorithm"].native
    micalg = _ASN1_HASH.get(digest_name)
    if micalg is None:
        raise SmimeError(f"digest {digest_name} is not accepted")
    hash_cls = HASHES[micalg]
    attrs = si["signed_attrs"]
    if attrs.native is not None and len(attrs):
        digests = [a["values"][0].native for a in attrs if a["type"].native == "message_digest"]
        if len(digests) != 1:
            raise SmimeError("the signature has no message digest")
        ours = hashlib.new(digest_name, data).digest()
        if not hmac.compare_digest(digests[0], ours):
            raise SmimeError("the content's digest differs from the signed one")
        raw = attrs.dump()
        signed = b"\x31" + raw[1:]  # the SET OF the signature is over ([0] IMPLICIT in the SignerInfo)
    else:
        signed = data
    sig = si["signature"].native
    key = signer.public_key()
    algo = si["signature_algorithm"]
    try:
        if isinstance(key, rsa.RSAPublicKey):
            if algo.signature_algo == "rsassa_pss":
                params = algo["parameters"]
                pss_hash = HASHES[_ASN1_HASH[params["hash_algorithm"]["algorithm"].native]]()
                key.verify(sig, signed, apad.PSS(apad.MGF1(pss_hash), params["salt_length"].native), pss_hash)
            else:  # rsaEncryption or sha*WithRSAEncryption: PKCS#1 v1.5 with the digest algorithm
                key.verify(sig, signed, apad.PKCS1v15(), hash_cls())
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(sig, signed, ec.ECDSA(hash_cls()))
        else:
            raise SmimeError("the partner's key is neither RSA nor EC")
    except InvalidSignature:
        raise SmimeError("the signature does not verify with the partner's certificate") from None
    except (UnsupportedAlgorithm, KeyError) as e:
        raise SmimeError(f"unsupported signature algorithm ({e})") from None
    return micalg


def encrypt(data: bytes, recipient_pem: bytes, algorithm: str = "aes256-cbc") -> bytes:
    """CMS enveloped-data (DER) of ``data`` for the recipient (RSA PKCS#1
    v1.5 key transport: what every AS2 implementation opens)."""
    cipher = _ENCRYPTIONS.get(algorithm)
    if cipher is None:
        raise SmimeError(f"cannot encrypt with {algorithm!r} ({', '.join(_ENCRYPTIONS)})")
    builder = (pkcs7.PKCS7EnvelopeBuilder().set_data(data).add_recipient(load_cert(recipient_pem))
               .set_content_encryption_algorithm(cipher))
    return builder.encrypt(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])


#: key transports we encrypt with (the option's value -> the OAEP hash; None: PKCS#1 v1.5)
KEY_TRANSPORTS: Final = {"rsa": None, "rsa-oaep": "sha256", "rsa-oaep-sha512": "sha512"}


def encrypt_oaep(data: bytes, recipient_pem: bytes, algorithm: str = "aes256-cbc", oaep_hash: str = "sha256") -> bytes:
    """CMS enveloped-data (DER) with RSAES-OAEP key transport (RFC 3560),
    built here: ``cryptography``'s builder only wraps with PKCS#1 v1.5,
    which some receivers no longer open (Node.js 20 refuses PKCS#1 v1.5
    private decryption: CVE-2023-46809)."""
    cipher = _ENCRYPTIONS.get(algorithm)
    if cipher is None:
        raise SmimeError(f"cannot encrypt with {algorithm!r} ({', '.join(_ENCRYPTIONS)})")
    cert = load_cert(recipient_pem)
    pub = cert.public_key()
    if not isinstance(pub, rsa.RSAPublicKey):
        raise SmimeError("the partner's certificate has no RSA key")
    h = HASHES[_ASN1_HASH[oaep_hash]]()
    cek, iv = os.urandom(cipher.key_size // 8), os.urandom(16)
    padder = padding.PKCS7(128).padder()
    enc = Cipher(algorithms.AES(cek), modes.CBC(iv)).encryptor()
    encrypted = enc.update(padder.update(data) + padder.finalize()) + enc.finalize()
    wrapped = pub.encrypt(cek, apad.OAEP(apad.MGF1(h), h, None))
    from asn1crypto import algos
    from asn1crypto import x509 as ax509

    issuer = ax509.Name.load(cert.issuer.public_bytes())
    hash_alg = {"algorithm": oaep_hash}
    return cms.ContentInfo({
        "content_type": "enveloped_data",
        "content": cms.EnvelopedData({
            "version": "v0",
            "recipient_infos": [cms.RecipientInfo(name="ktri", value=cms.KeyTransRecipientInfo({
                "version": "v0",
                "rid": cms.RecipientIdentifier(name="issuer_and_serial_number", value=cms.IssuerAndSerialNumber(
                    {"issuer": issuer, "serial_number": cert.serial_number})),
                "key_encryption_algorithm": {"algorithm": "rsaes_oaep", "parameters": algos.RSAESOAEPParams({
                    "hash_algorithm": hash_alg,
                    "mask_gen_algorithm": {"algorithm": "mgf1", "parameters": hash_alg}})},
                "encrypted_key": wrapped}))],
            "encrypted_content_info": {
                "content_type": "data",
                "content_encryption_algorithm": {"algorithm": "aes256_cbc" if cipher is algorithms.AES256
                                                 else "aes128_cbc", "parameters": iv},
                "encrypted_content": encrypted},
        }),
    }).dump()


def decrypt(der: bytes, cert_pem: bytes, key_pem: bytes) -> bytes:
    """Open CMS enveloped-data addressed to our certificate: key transport
    RSA PKCS#1 v1.5 or RSAES-OAEP (SHA-1/256/384/512), content AES-CBC
    (128, 192, 256) or 3DES-CBC."""
    cert, key = load_cert(cert_pem), load_key(key_pem)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SmimeError("decryption needs an RSA key")
    try:
        info = cms.ContentInfo.load(der)
        if info["content_type"].native != "enveloped_data":
            raise SmimeError("not CMS enveloped-data")
        env = info["content"]
        ktri = _our_recipient(env["recipient_infos"], cert)
        eci = env["encrypted_content_info"]
        calg = eci["content_encryption_algorithm"]
        cipher_name, iv, key_len = calg.encryption_cipher, calg.encryption_iv, calg.key_length
        encrypted = eci["encrypted_content"].native or b""
        kalg = ktri["key_encryption_algorithm"]
        wrapped = ktri["encrypted_key"].native
        kname = kalg["algorithm"].native
    except (ValueError, TypeError, KeyError) as e:
        raise SmimeError(f"the encrypted message does not parse ({e})") from None
    if kname == "rsaes_oaep":
        params = kalg["parameters"]
        h = HASHES[_ASN1_HASH[params["hash_algorithm"]["algorithm"].native]]()
        mgf = HASHES[_ASN1_HASH[params["mask_gen_algorithm"]["parameters"]["algorithm"].native]]()
        try:
            cek = key.decrypt(wrapped, apad.OAEP(apad.MGF1(mgf), h, None))
        except ValueError:
            raise SmimeError("decryption failed") from None
    elif kname in ("rsa", "rsaes_pkcs1v15"):
        try:
            cek = key.decrypt(wrapped, apad.PKCS1v15())
        except ValueError:
            cek = os.urandom(key_len)  # no oracle: a bad key fails later, the same way as bad content
    else:
        raise SmimeError(f"key transport {kname} is not accepted")
    return _decrypt_content(cipher_name, cek, iv, encrypted)


def _our_recipient(infos: cms.RecipientInfos, cert: x509.Certificate) -> cms.KeyTransRecipientInfo:
    ski = None
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    except x509.ExtensionNotFound:
        pass
    issuer = cert.issuer.public_bytes()
    for ri in infos:
        if ri.name != "ktri":
            continue
        rid = ri.chosen["rid"]
        if rid.name == "issuer_and_serial_number":
            ias = rid.chosen
            if ias["serial_number"].native == cert.serial_number and ias["issuer"].dump() == issuer:
                return ri.chosen
        elif rid.name == "subject_key_identifier" and ski is not None and rid.chosen.native == ski:
            return ri.chosen
    raise SmimeError("the message is not encrypted for our certificate")


def _decrypt_content(cipher_name: str, cek: bytes, iv: bytes, encrypted: bytes) -> bytes:
    try:
        if cipher_name == "aes":
            algo: algorithms.AES | TripleDES = algorithms.AES(cek)
        elif cipher_name == "tripledes":
            algo = TripleDES(cek)
        else:
            raise SmimeError(f"content encryption {cipher_name} is not accepted")
        dec = Cipher(algo, modes.CBC(iv)).decryptor()
        padded = dec.update(encrypted) + dec.finalize()
        unpad = padding.PKCS7(algo.block_size).unpadder()
        return unpad.update(padded) + unpad.finalize()
    except ValueError:
        raise SmimeError("decryption failed") from None


def compress(data: bytes) -> bytes:
    """CMS compressed-data (RFC 3274, zlib), DER."""
    return cms.ContentInfo({
        "content_type": "compressed_data",
        "content": cms.CompressedData({
            "version": "v0",
            "compression_algorithm": {"algorithm": "zlib"},
            "encap_content_info": {"content_type": "data", "content": zlib.compress(data)},
        }),
    }).dump()


def decompress(der: bytes, limit: int) -> bytes:
    """The content of CMS compressed-data, refused past ``limit`` bytes of
    output (inflated at most ``limit`` + 1 bytes: a bomb is never inflated
    whole)."""
    try:
        info = cms.ContentInfo.load(der)
        if info["content_type"].native != "compressed_data":
            raise SmimeError("not CMS compressed-data")
        cd = info["content"]
        if cd["compression_algorithm"]["algorithm"].native != "zlib":
            raise SmimeError("compression other than zlib is not accepted")
        packed = cd["encap_content_info"]["content"].native or b""
    except (ValueError, TypeError, KeyError) as e:
        raise SmimeError(f"the compressed message does not parse ({e})") from None
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(packed, limit + 1)
    except zlib.error:
        raise SmimeError("the compressed content is corrupt") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise SmimeError(f"the compressed content inflates past {limit} bytes")
    if not inflater.eof:
        raise SmimeError("the compressed content is truncated")
    return out
