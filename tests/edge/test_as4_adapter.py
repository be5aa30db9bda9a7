"""The AS4 adapter, sans-IO: two access points made here exchange an
invoice (build -> read_inbound -> receipt_for -> read_receipt), and every
way a message or a receipt can be wrong is refused with the ebMS3 error
the specification names."""

from __future__ import annotations

import gzip
import re
import time
import tracemalloc
from dataclasses import replace

import pytest

from semq.edge.as4 import AS4, check_options, message_id_for
from semq.edge.protocol import PROTOCOLS, EdgePartner, EdgeRefusal, Outgoing
from semq.settings.bounds import EDGE_MAX_BODY
from tests.edge._as4kit import (
    INVOICE,
    AccessPoint,
    access_point,
    join,
    partner_of,
    split,
    with_cert,
)

A_ID, B_ID = "POP000001", "POP000002"


@pytest.fixture(scope="module")
def aps() -> tuple[AccessPoint, AccessPoint, AccessPoint]:
    return access_point(A_ID), access_point(B_ID), access_point("POP000666")


def _lookup(*partners: EdgePartner):
    table = {p.id: p for p in partners}
    return table.get


def _refused(excinfo: pytest.ExceptionInfo[EdgeRefusal], code: str) -> None:
    refusal = excinfo.value
    assert refusal.reason.startswith(code), refusal.reason
    assert f'errorCode="{code}"'.encode() in refusal.body, refusal.body[:400]


def test_registered_and_claims() -> None:
    assert PROTOCOLS["as4"] is AS4
    assert AS4.claims({"Content-Type": 'multipart/related; type="application/soap+xml"; boundary="x"'})
    assert AS4.claims({"content-type": "application/soap+xml; charset=utf-8"})
    assert not AS4.claims({"Content-Type": "application/pkcs7-mime", "AS2-Version": "1.2"})
    assert not AS4.claims({"Content-Type": 'multipart/related; type="application/soap+xml"', "AS2-From": "x"})
    assert not AS4.claims({"Content-Type": "text/plain"})


def test_round_trip_invoice_and_receipt(aps) -> None:
    a, b, _ = aps
    to_b, to_a = partner_of(a, b), partner_of(b, a)
    out = AS4.build("10008/1/1/1795329835412001", INVOICE, "application/xml", to_b, a.keys)
    assert out.message_id == "10008/1/1/1795329835412001@semq"
    soap, _, att = split(out.headers, out.body)
    assert b"PEPPOL" not in att and b"INV-0042" not in out.body  # encrypted
    for needle in (b"http://www.w3.org/2001/04/xmldsig-more#rsa-sha256", b"http://www.w3.org/2009/xmlenc11#aes128-gcm",
                   b"http://www.w3.org/2009/xmlenc11#rsa-oaep", b"http://www.w3.org/2009/xmlenc11#mgf1sha256",
                   b"application/gzip", b"cenbii-procid-ubl", b"busdox-docid-qns::urn:oasis",
                   f">{A_ID}</".encode(), f">{B_ID}</".encode(), b"urn:fdc:peppol.eu:2017:agreements:tia:ap_provider"):
        assert needle in soap, needle

    got = AS4.read_inbound(out.headers, out.body, _lookup(to_a), b.keys)
    assert (got.partner_id, got.message_id, got.content_type) == (A_ID, out.message_id, "application/xml")
    assert b"StandardBusinessDocumentHeader" in got.content and b"<cbc:ID>INV-0042</cbc:ID>" in got.content
    assert b"0208:0123456789" in got.content and got.digest == out.digest

    status, headers, receipt = AS4.receipt_for(got, {}, to_a, b.keys)
    assert status == 200 and headers["Content-Type"].startswith("application/soap+xml")
    assert b"NonRepudiationInformation" in receipt and out.message_id.encode() in receipt
    result = AS4.read_receipt(status, headers, receipt, out, to_b, a.keys)
    assert (result.ok, result.reason, result.proof) == (True, None, receipt)


def test_a_resend_is_the_same_message_until_answered(aps) -> None:
    """Sending a document again posts the same bytes (its receipt lost, the
    partner answers the duplicate with the receipt of the first, which must
    still match); once a receipt is judged, a new build is a new message
    with the same MessageId."""
    a, b, _ = aps
    to_b, to_a = partner_of(a, b), partner_of(b, a)
    one = AS4.build("10008/1/1/7", INVOICE, "application/xml", to_b, a.keys)
    two = AS4.build("10008/1/1/7", INVOICE, "application/xml", to_b, a.keys)
    assert two is one and one.message_id == message_id_for("10008/1/1/7")
    got = AS4.read_inbound(one.headers, one.body, _lookup(to_a), b.keys)
    first_receipt = AS4.receipt_for(got, {}, to_a, b.keys)
    # the receipt of the first post answers the resend too
    assert AS4.read_receipt(*first_receipt, two, to_b, a.keys).ok
    three = AS4.build("10008/1/1/7", INVOICE, "application/xml", to_b, a.keys)
    assert three.message_id == one.message_id and three.body != one.body and three.digest != one.digest
    # another content, partner option or document is another message
    assert AS4.build("10008/1/1/7", INVOICE + b" ", "application/xml", to_b, a.keys).body != three.body
    assert AS4.build("10008/1/1/8", INVOICE, "application/xml", to_b, a.keys).message_id != three.message_id
    assert message_id_for("a b<c>@d") == "a.b.c..d@semq"
    # A duplicate opens again (answering it once is the node's business, not the adapter's).
    for _ in range(2):
        assert AS4.read_inbound(three.headers, three.body, _lookup(to_a), b.keys).message_id == one.message_id


def test_receipt_judged(aps) -> None:
    a, b, mallory = aps
    to_b, to_a = partner_of(a, b), partner_of(b, a)
    out = AS4.build("d/1", INVOICE, "application/xml", to_b, a.keys)
    other = AS4.build("d/2", INVOICE, "application/xml", to_b, a.keys)
    got = AS4.read_inbound(out.headers, out.body, _lookup(to_a), b.keys)
    status, headers, receipt = AS4.receipt_for(got, {}, to_a, b.keys)
    # for another message
    result = AS4.read_receipt(status, headers, receipt, other, to_b, a.keys)
    assert not result.ok and "names message d/1@semq, not d/2@semq" in (result.reason or "")
    # same id, other references (what was sent is not what was acknowledged)
    result = AS4.read_receipt(status, headers, receipt, replace(out, digest=other.digest), to_b, a.keys)
    assert not result.ok and "do not match" in (result.reason or "")
    # signed by someone else
    forged = AS4.receipt_for(got, {}, to_a, mallory.keys)
    result = AS4.read_receipt(*forged, out, to_b, a.keys)
    assert not result.ok and "not a verified ebMS signal" in (result.reason or "")
    # tampered after signing
    result = AS4.read_receipt(status, headers, receipt.replace(b"d/1@semq", b"d/3@semq"), out, to_b, a.keys)
    assert not result.ok
    for junk in (b"", b"<html>502 Bad Gateway</html>", b"\x00" * 10):
        result = AS4.read_receipt(502, {"Content-Type": "text/html"}, junk, out, to_b, a.keys)
        assert not result.ok and "HTTP 502" in (result.reason or "")
        assert result.proof == b""  # nothing proven: the node sends the message again


def test_error_signal_gives_the_partners_code_and_words(aps) -> None:
    a, b, _ = aps
    to_b = partner_of(a, b)
    out = AS4.build("d/9", INVOICE, "application/xml", to_b, a.keys)
    # B does not serve the final recipient: the Peppol profile's EBMS:0004 PEPPOL:NOT_SERVICED
    with pytest.raises(EdgeRefusal) as refused:
        AS4.read_inbound(out.headers, out.body, _lookup(partner_of(b, a, participants="0208:999")), b.keys)
    _refused(refused, "EBMS:0004")
    result = AS4.read_receipt(refused.value.status, refused.value.headers, refused.value.body, out, to_b, a.keys)
    assert not result.ok and result.reason == ("the partner refused the message: EBMS:0004 Other: "
                                               "PEPPOL:NOT_SERVICED")
    assert result.proof == refused.value.body  # a verified refusal: kept, the document fails
    # the same error, not signed by the partner: proves nothing, the message is sent again
    forged = AS4.read_receipt(500, refused.value.headers, refused.value.body, out,
                              with_cert(to_b, a.cert_pem), a.keys)
    assert not forged.ok and forged.proof == b""


def test_refusals(aps) -> None:
    a, b, mallory = aps
    to_b, to_a = partner_of(a, b), partner_of(b, a)
    out = AS4.build("d/3", INVOICE, "application/xml", to_b, a.keys)
    soap, cid, att = split(out.headers, out.body)

    def refused(headers, body, *partners: EdgePartner, code: str, keys=b.keys) -> EdgeRefusal:
        with pytest.raises(EdgeRefusal) as info:
            AS4.read_inbound(headers, body, _lookup(*(partners or (to_a,))), keys)
        _refused(info, code)
        return info.value

    # unknown sender; known, but an AS2 partner
    refused(out.headers, out.body, partner_of(b, mallory), code="EBMS:0101")
    refused(out.headers, out.body, replace(to_a, protocol="as2"), code="EBMS:0101")
    # the partner's certificate as we hold it is another one: the embedded one is not trusted
    refused(out.headers, out.body, with_cert(to_a, mallory.cert_pem), code="EBMS:0101")
    # the certificate held for it has no RSA key (an EC one): refused, not a crash
    import datetime as dt

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509 import CertificateBuilder, Name, NameAttribute, random_serial_number
    from cryptography.x509.oid import NameOID
    eck = ec.generate_private_key(ec.SECP256R1())
    name = Name([NameAttribute(NameOID.COMMON_NAME, A_ID)])
    now = dt.datetime.now(dt.UTC)
    ec_pem = (CertificateBuilder().subject_name(name).issuer_name(name).public_key(eck.public_key())
              .serial_number(random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
              .sign(eck, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    assert "not RSA" in refused(out.headers, out.body, with_cert(to_a, ec_pem), code="EBMS:0101").reason
    # addressed to another access point
    refused(out.headers, out.body, replace(to_a, our_id="POP000999"), code="EBMS:0003")
    # encrypted for someone else: B cannot open it
    refused(out.headers, out.body, to_a, keys=mallory.keys, code="EBMS:0102")
    # a signed header changed (originalSender)
    refused(*join(soap.replace(b"0088:5790000435975", b"0088:5790000435976"), cid, att), code="EBMS:0101")
    # the encrypted attachment changed: AES-GCM's tag fails
    refused(*join(soap, cid, att[:-1] + bytes([att[-1] ^ 1])), code="EBMS:0102")
    # the signature removed
    unsigned = re.sub(rb"<ds:Signature\b.*?</ds:Signature>", b"", soap, flags=re.S)
    assert unsigned != soap
    refused(*join(unsigned, cid, att), code="EBMS:0103")
    # no attachment, not MIME, not XML
    refused({"Content-Type": "application/soap+xml"}, soap, code="EBMS:0009")
    refused(*join(b"<not xml", cid, att), code="EBMS:0009")
    # over the size limit (checked before anything is parsed)
    big = refused(out.headers, out.body + b" " * EDGE_MAX_BODY, code="EBMS:0004")
    assert big.status == 413


def test_signature_wrapping_refused(aps) -> None:
    """A captured message replayed under a new MessageId: the signed
    eb:Messaging moved into the Security header, a copy with the new id put
    in its place. Every signed digest still verifies and the as4 package's
    own check (some signed element is an eb:Messaging) passes, so without
    ours the partner's duplicate detection would see a new message; the
    ids bind the signature to this envelope's eb:Messaging."""
    a, b, _ = aps
    out = AS4.build("d/4", INVOICE, "application/xml", partner_of(a, b), a.keys)
    soap, cid, att = split(out.headers, out.body)
    messaging = re.search(rb"<eb3:Messaging\b.*?</eb3:Messaging>", soap, flags=re.S)
    assert messaging is not None
    signed = messaging.group(0)
    forged = re.sub(rb'wsu:Id="[^"]+"', b'wsu:Id="forged"', signed).replace(b"d/4@semq", b"replayed@semq")
    wrapped = soap.replace(signed, forged).replace(b"</wsse:Security>", signed + b"</wsse:Security>")
    with pytest.raises(EdgeRefusal) as info:
        AS4.read_inbound(*join(wrapped, cid, att), _lookup(partner_of(b, a)), b.keys)
    _refused(info, "EBMS:0101")


@pytest.mark.parametrize("bomb", [
    # billion laughs: ten levels of ten
    b'<?xml version="1.0"?><!DOCTYPE S12:Envelope [<!ENTITY l0 "lol">'
    + b"".join(b'<!ENTITY l%d "%s">' % (i, b"&l%d;" % (i - 1) * 10) for i in range(1, 10))
    + b"]>",
    # an external entity
    b'<?xml version="1.0"?><!DOCTYPE S12:Envelope [<!ENTITY x SYSTEM "file:///etc/passwd">]>',
])
def test_xml_bombs_refused_in_bounded_memory(aps, bomb: bytes) -> None:
    a, b, _ = aps
    out = AS4.build("d/5", INVOICE, "application/xml", partner_of(a, b), a.keys)
    soap, cid, att = split(out.headers, out.body)
    ref = b"&l9;" if b"l9" in bomb else b"&x;"
    poisoned = bomb + soap.replace(b"<eb3:MessageId>", b"<eb3:MessageId>" + ref, 1)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(EdgeRefusal) as info:
            AS4.read_inbound(*join(poisoned, cid, att), _lookup(partner_of(b, a)), b.keys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _refused(info, "EBMS:0009")
    assert b"root:" not in info.value.body
    assert peak < 8 * 1024 * 1024, peak  # 10**9 "lol"s would be 3 GB
    assert time.monotonic() - started < 5


def test_a_signed_payload_with_a_dtd_is_refused(aps, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partner signs and encrypts an SBD carrying a billion-laughs DTD (the
    as4 package's builder drops DTDs, so the test slips one in where it
    compresses): everything verifies, and the document is still refused,
    as the inbox would hand the entities to the next parser."""
    import types

    import as4.profiles.peppol.message as as4_message
    a, b, _ = aps
    dtd = b'<!DOCTYPE x [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>'
    monkeypatch.setattr(as4_message, "gzip", types.SimpleNamespace(compress=lambda p: gzip.compress(dtd + p)))
    out = AS4.build("d/10", INVOICE, "application/xml", partner_of(a, b), a.keys)
    monkeypatch.undo()
    with pytest.raises(EdgeRefusal) as info:
        AS4.read_inbound(out.headers, out.body, _lookup(partner_of(b, a)), b.keys)
    _refused(info, "EBMS:0004")
    assert "must not contain a DTD" in info.value.reason


def test_compression_bomb_stops_at_the_partners_limit(aps) -> None:
    """A signed, encrypted message whose attachment inflates to 50 MB, to a
    partner allowed 1 MB: refused with EBMS:0303, memory near the limit."""
    a, b, _ = aps
    chunk = b"<b>" + b"x" * 1_000_000 + b"</b>"
    big = b"<a>" + chunk * 50 + b"</a>"
    out = AS4.build("d/6", big, "application/xml", partner_of(a, b), a.keys)
    assert len(out.body) < 1_000_000  # gzip: 50 MB become a few hundred KB
    assert len(gzip.compress(big)) < 1_000_000
    tracemalloc.start()
    try:
        with pytest.raises(EdgeRefusal) as info:
            AS4.read_inbound(out.headers, out.body, _lookup(partner_of(b, a, max_bytes="1000000")), b.keys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _refused(info, "EBMS:0303")
    assert peak < 16 * 1024 * 1024, peak


def test_build_refuses_what_it_cannot_send(aps) -> None:
    a, b, _ = aps
    with pytest.raises(ValueError, match="is not XML"):
        AS4.build("d/7", b"%PDF-1.7 not xml", "application/pdf", partner_of(a, b), a.keys)
    bare = replace(partner_of(a, b), options={})
    with pytest.raises(ValueError, match="lacks the option"):
        AS4.build("d/8", INVOICE, "application/xml", bare, a.keys)


def test_check_options() -> None:
    assert check_options({"document_type": "x", "max_bytes": "0", "country": "Belgium", "colour": "red"}) == [
        "unknown AS4 option 'colour' (known: party_id, sender, recipient, document_type, process, country, "
        "participants, max_bytes)",
        "AS4 option document_type 'x' is not a busdox-docid-qns identifier (ROOT_NS::ROOT##CUSTOMIZATION::VERSION)",
        "AS4 option max_bytes '0' is not a whole number from 1 to 67108864",
        "AS4 option country 'Belgium' is not a two-letter country code (ISO 3166-1)",
    ]
    assert check_options(partner_of(access_point("X", 1024), access_point("Y", 1024)).options) == []




def test_resends_kept_within_their_bytes() -> None:
    from semq.edge.as4.resend import Resends
    kept = Resends(max_bytes=250)
    outs = [Outgoing(message_id=f"m{i}", headers={}, body=b"x" * 100, digest="") for i in range(3)]
    for i, out in enumerate(outs):
        kept.put(bytes([i]), out)
    assert kept.get(b"\x00") is None and kept.get(b"\x01") is outs[1] and kept.get(b"\x02") is outs[2]
    kept.forget("m1")
    assert kept.get(b"\x01") is None
    kept.put(b"big", Outgoing(message_id="big", headers={}, body=b"x" * 251, digest=""))
    assert kept.get(b"big") is None and kept.get(b"\x02") is outs[2]


def test_a_receipt_with_an_xml_bomb_confirms_nothing_in_bounded_memory(aps) -> None:
    a, b, _ = aps
    to_b, to_a = partner_of(a, b), partner_of(b, a)
    out = AS4.build("d/11", INVOICE, "application/xml", to_b, a.keys)
    got = AS4.read_inbound(out.headers, out.body, _lookup(to_a), b.keys)
    status, headers, receipt = AS4.receipt_for(got, {}, to_a, b.keys)
    laughs = (b'<?xml version="1.0"?><!DOCTYPE S12:Envelope [<!ENTITY l0 "lol">'
              + b"".join(b'<!ENTITY l%d "%s">' % (i, b"&l%d;" % (i - 1) * 10) for i in range(1, 10)) + b"]>")
    bombed = laughs + receipt.replace(b"d/11@semq</eb3:RefToMessageId>", b"d/11@semq&l9;</eb3:RefToMessageId>")
    assert bombed != laughs + receipt
    tracemalloc.start()
    try:
        result = AS4.read_receipt(status, headers, bombed, out, to_b, a.keys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not result.ok and result.proof == b"" and peak < 8 * 1024 * 1024, (result, peak)
