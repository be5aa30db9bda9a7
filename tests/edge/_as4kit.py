"""What the AS4 tests share: certificates made here (RSA, as the Peppol
profile requires), two access points that know each other, a UBL invoice."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, replace
from email import policy
from email.parser import BytesParser

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from semq.edge.protocol import EdgePartner, OurKeys

DOC_TYPE = ("urn:oasis:names:specification:ubl:schema:xsd:Invoice-2::Invoice##urn:cen.eu:en16931:2017"
            "#compliant#urn:fdc:peppol.eu:2017:poacc:billing:3.0::2.1")
PROCESS = "urn:fdc:peppol.eu:2017:poacc:billing:01:1.0"

INVOICE = b"""<?xml version="1.0" encoding="UTF-8"?>
<Invoice xmlns="urn:oasis:names:specification:ubl:schema:xsd:Invoice-2"
 xmlns:cac="urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"
 xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">
 <cbc:CustomizationID>urn:cen.eu:en16931:2017#compliant#urn:fdc:peppol.eu:2017:poacc:billing:3.0</cbc:CustomizationID>
 <cbc:ProfileID>urn:fdc:peppol.eu:2017:poacc:billing:01:1.0</cbc:ProfileID>
 <cbc:ID>INV-0042</cbc:ID>
 <cbc:IssueDate>2026-12-08</cbc:IssueDate>
 <cac:AccountingSupplierParty><cac:Party>
  <cbc:EndpointID schemeID="0088">5790000435975</cbc:EndpointID>
  <cac:PostalAddress><cac:Country><cbc:IdentificationCode>BE</cbc:IdentificationCode></cac:Country></cac:PostalAddress>
 </cac:Party></cac:AccountingSupplierParty>
 <cac:AccountingCustomerParty><cac:Party>
  <cbc:EndpointID schemeID="0208">0123456789</cbc:EndpointID>
 </cac:Party></cac:AccountingCustomerParty>
 <cac:LegalMonetaryTotal><cbc:PayableAmount currencyID="EUR">1250.00</cbc:PayableAmount></cac:LegalMonetaryTotal>
</Invoice>
"""


@dataclass(frozen=True)
class AccessPoint:
    party_id: str
    cert_pem: bytes
    key_pem: bytes

    @property
    def keys(self) -> OurKeys:
        return OurKeys(cert_pem=self.cert_pem, key_pem=self.key_pem)


def access_point(party_id: str, bits: int = 2048) -> AccessPoint:
    """A self-signed RSA certificate whose CN is the access point's id (as Peppol's are)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party_id),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SEMQ test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return AccessPoint(
        party_id=party_id,
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
    )


def partner_of(me: AccessPoint, them: AccessPoint, **options: str) -> EdgePartner:
    """``them`` as ``me`` holds it: an AS4 partner with the options sending needs."""
    opts = {"sender": "0088:5790000435975", "recipient": "0208:0123456789", "document_type": DOC_TYPE,
            "process": PROCESS, "country": "BE", **options}
    return EdgePartner(id=them.party_id, protocol="as4", url="https://127.0.0.1/as4",
                       their_cert_pem=them.cert_pem, our_id=me.party_id, options=opts)


def with_cert(partner: EdgePartner, cert_pem: bytes) -> EdgePartner:
    return replace(partner, their_cert_pem=cert_pem)


def split(headers: dict[str, str] | Mapping[str, str], body: bytes) -> tuple[bytes, str, bytes]:
    """(SOAP envelope, attachment's Content-ID, attachment) of an AS4 POST."""
    message = BytesParser(policy=policy.default).parsebytes(
        b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body)
    soap = att = b""
    cid = ""
    for part in message.walk():
        if part.get_content_type() == "application/soap+xml":
            soap = part.get_payload(decode=True)
        elif part.get_content_type() == "application/octet-stream":
            att = part.get_payload(decode=True)
            cid = str(part["Content-ID"]).strip("<>")
    return soap, cid, att


def join(soap: bytes, cid: str, att: bytes, boundary: str = "b0undary-semq-test") -> tuple[dict[str, str], bytes]:
    """An AS4 POST (headers, body) from its parts, binary attachment as is."""
    body = (f"--{boundary}\r\nContent-Type: application/soap+xml; charset=UTF-8\r\n\r\n".encode() + soap
            + f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\nContent-ID: <{cid}>\r\n\r\n".encode()
            + att + f"\r\n--{boundary}--\r\n".encode())
    return {"Content-Type": f'multipart/related; type="application/soap+xml"; boundary="{boundary}"'}, body
