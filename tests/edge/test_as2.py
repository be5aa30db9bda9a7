"""The AS2 adapter, sans-IO: two SEMQ edges talk to each other (every
option), OpenSSL-made messages open (PKCS#1 v1.5 and OAEP key transport),
and what must be refused is refused with the protocol's error."""

from __future__ import annotations

import base64
import subprocess
import zlib
from pathlib import Path

import pytest

from semq.edge import as2 as as2mod
from semq.edge.as2 import AS2
from semq.edge.mime import split_entity
from semq.edge.protocol import EdgePartner, EdgeRefusal, Outgoing, load_protocols
from semq.edge.smime import compress
from tests.edge.certs import make_keys

A = make_keys("alpha")
B = make_keys("beta")
DOC = b"ISA*00*          *00*          *ZZ*ALPHA*ZZ*BETA~\r\nIEA*1*000000001~\r\n"


def pair(**opts: str) -> tuple[EdgePartner, EdgePartner]:
    """(beta as alpha knows it, alpha as beta knows it)."""
    return (EdgePartner("BETA", "as2", "http://b/", B.cert_pem, "ALPHA", dict(opts)),
            EdgePartner("ALPHA", "as2", "http://a/", A.cert_pem, "BETA", dict(opts)))


def roundtrip(**opts: str) -> tuple[Outgoing, object]:
    to_b, to_a = pair(**opts)
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    got = AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    assert got.content == DOC and got.message_id == out.message_id and got.partner_id == "ALPHA"
    assert got.digest == out.digest
    status, headers, body = AS2.receipt_for(got, out.headers, to_a, B)
    result = AS2.read_receipt(status, headers, body, out, to_b, A)
    assert result.ok, result.reason
    assert result.proof
    return out, got


def test_registry_holds_as2() -> None:
    assert load_protocols()["as2"] is AS2


@pytest.mark.parametrize("opts", [
    {}, {"sign": "sha512"}, {"encrypt": "aes128-cbc"}, {"compress": "zlib"}, {"encrypt": "none"},
    {"sign": "none", "mdn": "unsigned"}, {"sign": "none", "encrypt": "none", "mdn": "unsigned"},
    {"key_transport": "rsa-oaep"}, {"key_transport": "rsa-oaep-sha512", "encoding": "base64"},
])
def test_two_edges_exchange_a_document_and_a_signed_mdn(opts: dict[str, str]) -> None:
    out, got = roundtrip(**opts)
    assert out.message_id == AS2.build("doc-1", DOC, "application/edi-x12", pair(**opts)[0], A).message_id
    assert got.filename == "doc-1.dat"  # type: ignore[attr-defined]


def test_a_mic_of_another_content_is_no_confirmation() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    got = AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    other = Outgoing(out.message_id, out.headers, out.body, "AAAA, sha-256")
    status, headers, body = AS2.receipt_for(got, out.headers, to_a, B)
    r = AS2.read_receipt(status, headers, body, other, to_b, A)
    assert not r.ok and "MIC" in (r.reason or "")


def test_an_mdn_signed_by_another_key_is_not_a_receipt() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    got = AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    mallory = make_keys("mallory")
    status, headers, body = AS2.receipt_for(got, out.headers, to_a, mallory)
    r = AS2.read_receipt(status, headers, body, out, to_b, A)
    assert not r.ok and r.proof == b"" and "verify" in (r.reason or "")


def test_an_unsigned_mdn_is_refused_when_a_signed_one_was_asked() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    got = AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    h = {k: v for k, v in out.headers.items() if k != "Disposition-Notification-Options"}
    status, headers, body = AS2.receipt_for(got, h, to_a, B)
    r = AS2.read_receipt(status, headers, body, out, to_b, A)
    assert not r.ok and r.proof == b""


def test_a_negative_mdn_fails_with_the_partners_words() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, make_keys("not-alpha"))
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    assert e.value.status == 200 and "authentication-failed" in e.value.reason
    r = AS2.read_receipt(e.value.status, e.value.headers, e.value.body, out, to_b, A)
    assert not r.ok and r.proof and "authentication-failed" in (r.reason or "")


def test_unknown_partner_and_wrong_as2_to_get_an_http_error() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, out.body, {}.get, B)
    assert e.value.status == 403
    wrong = EdgePartner("ALPHA", "as2", "http://a/", A.cert_pem, "SOMEONE-ELSE", {})
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, out.body, {"ALPHA": wrong}.get, B)
    assert e.value.status == 403
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound({"AS2-From": "ALPHA", "AS2-To": "BETA"}, b"", {"ALPHA": to_a}.get, B)
    assert e.value.status == 400


def test_a_message_without_the_agreed_security_is_refused() -> None:
    to_b, _ = pair(sign="none", encrypt="none")
    _, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, B)
    assert "insufficient-message-security" in e.value.reason


def test_a_tampered_signed_part_is_refused() -> None:
    to_b, to_a = pair(encrypt="none")
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    bad = out.body.replace(b"ALPHA*ZZ", b"ALPHA*ZY")
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, bad, {"ALPHA": to_a}.get, B)
    assert "authentication-failed" in e.value.reason


def test_a_message_for_another_certificate_does_not_open() -> None:
    to_b, to_a = pair()
    out = AS2.build("doc-1", DOC, "application/edi-x12", to_b, A)
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(out.headers, out.body, {"ALPHA": to_a}.get, make_keys("beta-2"))
    assert "decryption-failed" in e.value.reason


def test_a_compression_bomb_is_refused_without_inflating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(as2mod, "EDGE_MAX_INFLATED", 1 << 20)
    inner = b"Content-Type: text/plain\r\n\r\n" + b"\0" * (50 << 20)
    der = compress(inner)
    assert len(der) < 100_000
    _, to_a = pair(sign="none", encrypt="none", require="none")
    headers = {"AS2-From": "ALPHA", "AS2-To": "BETA", "Message-ID": "<bomb@x>",
               "Content-Type": "application/pkcs7-mime; smime-type=compressed-data"}
    with pytest.raises(EdgeRefusal) as e:
        AS2.read_inbound(headers, der, {"ALPHA": to_a}.get, B)
    assert "inflates past" in e.value.reason
    assert len(zlib.compress(b"")) < 100  # (the module bound, not the test's, decides above)


def _openssl(tmp: Path, *args: str, data: bytes) -> bytes:
    return subprocess.run(["openssl", *args], input=data, capture_output=True, check=True, cwd=tmp).stdout


@pytest.mark.parametrize("keyopt", [[], ["-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha512"]])
def test_a_message_signed_and_encrypted_by_openssl_opens(tmp_path: Path, keyopt: list[str]) -> None:
    """OpenSSL as the partner: signed with ``openssl cms -sign``, encrypted to
    us with PKCS#1 v1.5 or RSAES-OAEP SHA-512 (what libas2 sends)."""
    (tmp_path / "a.pem").write_bytes(A.cert_pem)
    (tmp_path / "ak.pem").write_bytes(A.key_pem)
    (tmp_path / "b.pem").write_bytes(B.cert_pem)
    part = b"Content-Type: application/edi-x12\r\nContent-Disposition: attachment; filename=x.edi\r\n\r\n" + DOC
    sig = _openssl(tmp_path, "cms", "-sign", "-binary", "-signer", "a.pem", "-inkey", "ak.pem", "-outform", "DER",
                   "-md", "sha256", data=part)
    b = "bnd"
    signed = (b"Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; micalg=sha-256; "
              b"boundary=\"bnd\"\r\n\r\n--bnd\r\n" + part + b"\r\n--bnd\r\nContent-Type: application/pkcs7-signature"
              b"\r\nContent-Transfer-Encoding: base64\r\n\r\n" + base64.encodebytes(sig) + b"\r\n--bnd--\r\n")
    assert b
    env = _openssl(tmp_path, "cms", "-encrypt", "-binary", "-aes256", "-outform", "DER", "-recip", "b.pem",
                   *keyopt, data=signed)
    _, to_a = pair()
    headers = {"AS2-From": "ALPHA", "AS2-To": "BETA", "Message-ID": "<o@x>", "Disposition-Notification-To": "x",
               "Disposition-Notification-Options": "signed-receipt-protocol=optional, pkcs7-signature; "
                                                   "signed-receipt-micalg=optional, sha-256",
               "Content-Type": "application/pkcs7-mime; smime-type=enveloped-data"}
    got = AS2.read_inbound(headers, env, {"ALPHA": to_a}.get, B)
    assert got.content == DOC and got.filename == "x.edi"
    status, rh, rb = AS2.receipt_for(got, headers, to_a, B)
    assert status == 200 and rh["Content-Type"].startswith("multipart/signed")
    mdn = b"Content-Type: " + rh["Content-Type"].encode() + b"\r\n\r\n" + rb
    report = _openssl(tmp_path, "cms", "-verify", "-noverify", "-certfile", "b.pem", data=mdn)
    fields = split_entity(report)[1]
    assert b"Original-Message-ID: <o@x>" in fields and got.digest.encode() in fields
