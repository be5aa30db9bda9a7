"""An AS4 receiver that shares nothing with SEMQ's adapter or the ``as4``
package: libxmlsec1 (python-xmlsec) checks the RSA-SHA256 signature and
opens the RSA-OAEP key and the AES-128-GCM attachment; libxml2's exclusive
canonicalization (lxml) and hashlib compute the references' digests; the
standard library parses the MIME and gunzips. What it checks is what the
Peppol AS4 profile requires of a message; what it returns is what it read."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
from collections.abc import Mapping
from email import policy
from email.parser import BytesParser

import xmlsec
from lxml import etree

NS = {
    "S12": "http://www.w3.org/2003/05/soap-envelope",
    "eb": "http://docs.oasis-open.org/ebxml-msg/ebms/v3.0/ns/core/200704/",
    "wsse": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd",
    "wsu": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd",
    "ds": "http://www.w3.org/2000/09/xmldsig#",
    "xenc": "http://www.w3.org/2001/04/xmlenc#",
    "ec": "http://www.w3.org/2001/10/xml-exc-c14n#",
}
RSA_SHA256 = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
EXC_C14N = "http://www.w3.org/2001/10/xml-exc-c14n#"
SHA256 = "http://www.w3.org/2001/04/xmlenc#sha256"
SWA_CONTENT = "http://docs.oasis-open.org/wss/oasis-wss-SwAProfile-1.1#Attachment-Content-Signature-Transform"
AES128_GCM = "http://www.w3.org/2009/xmlenc11#aes128-gcm"
RSA_OAEP = "http://www.w3.org/2009/xmlenc11#rsa-oaep"


class Rejected(Exception):
    pass


def _c14n(element: etree._Element, method: etree._Element | None) -> bytes:
    prefixes = []
    if method is not None:
        inclusive = method.find("ec:InclusiveNamespaces", NS)
        if inclusive is not None:
            prefixes = inclusive.get("PrefixList", "").split()
    return etree.tostring(element, method="c14n", exclusive=True, with_comments=False,
                          inclusive_ns_prefixes=prefixes or None)


def verify(headers: Mapping[str, str], body: bytes, sender_cert_pem: bytes, receiver_key_pem: bytes) -> dict:
    """The message's MessageId, parties, properties and the opened SBD;
    raises Rejected naming the first check that fails."""
    content_type = next(v for k, v in headers.items() if k.lower() == "content-type")
    mime = BytesParser(policy=policy.default).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    parts = {p.get_content_type(): p for p in mime.walk() if not p.is_multipart()}
    soap = parts["application/soap+xml"].get_payload(decode=True)
    attachment_part = parts["application/octet-stream"]
    attachment = attachment_part.get_payload(decode=True)
    cid = str(attachment_part["Content-ID"]).strip().strip("<>")
    root = etree.fromstring(soap, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))

    signature = root.find("S12:Header/wsse:Security/ds:Signature", NS)
    if signature is None:
        raise Rejected("no ds:Signature")
    signed_info = signature.find("ds:SignedInfo", NS)
    c14n_method = signed_info.find("ds:CanonicalizationMethod", NS)
    if c14n_method.get("Algorithm") != EXC_C14N:
        raise Rejected(f"canonicalization {c14n_method.get('Algorithm')}")
    if signed_info.find("ds:SignatureMethod", NS).get("Algorithm") != RSA_SHA256:
        raise Rejected("signature method is not RSA-SHA256")
    ctx = xmlsec.SignatureContext()
    ctx.key = xmlsec.Key.from_memory(sender_cert_pem, xmlsec.constants.KeyDataFormatCertPem, None)
    value = base64.b64decode("".join(signature.findtext("ds:SignatureValue", namespaces=NS).split()))
    try:
        ctx.verify_binary(_c14n(signed_info, c14n_method), xmlsec.constants.TransformRsaSha256, value)
    except xmlsec.Error as e:
        raise Rejected(f"libxmlsec1: the signature does not verify ({e})") from e

    by_id = {el.get(f"{{{NS['wsu']}}}Id"): el for el in root.iter() if el.get(f"{{{NS['wsu']}}}Id")}
    messaging = root.find("S12:Header/eb:Messaging", NS)
    body_el = root.find("S12:Body", NS)
    covered, attachment_digest = set(), None
    for ref in signed_info.findall("ds:Reference", NS):
        uri = ref.get("URI")
        if ref.find("ds:DigestMethod", NS).get("Algorithm") != SHA256:
            raise Rejected(f"{uri}: digest is not SHA-256")
        transform = ref.find("ds:Transforms/ds:Transform", NS)
        digest = ref.findtext("ds:DigestValue", namespaces=NS).strip()
        if uri.startswith("cid:"):
            if uri[4:] != cid or transform.get("Algorithm") != SWA_CONTENT:
                raise Rejected(f"{uri}: not the attachment, or not Attachment-Content-Signature-Transform")
            attachment_digest = digest
            continue
        target = by_id.get(uri.removeprefix("#"))
        if target is None or target not in (messaging, body_el):
            raise Rejected(f"{uri}: not this envelope's eb:Messaging or Body")
        mine = base64.b64encode(hashlib.sha256(_c14n(target, transform)).digest()).decode()
        if mine != digest:
            raise Rejected(f"{uri}: digest mismatch")
        covered.add(target.tag)
    if covered != {messaging.tag, body_el.tag} or attachment_digest is None:
        raise Rejected("the signature does not cover eb:Messaging, the Body and the attachment")

    # Decryption by libxmlsec1: the EncryptedKey and the attachment as one EncryptedData.
    security = root.find("S12:Header/wsse:Security", NS)
    encrypted_key = security.find("xenc:EncryptedKey", NS)
    method = encrypted_key.find("xenc:EncryptionMethod", NS)
    if method.get("Algorithm") != RSA_OAEP:
        raise Rejected("key transport is not RSA-OAEP (xmlenc11)")
    data_method = security.find("xenc:EncryptedData/xenc:EncryptionMethod", NS)
    if data_method.get("Algorithm") != AES128_GCM:
        raise Rejected("attachment encryption is not AES-128-GCM")
    X, D = f"{{{NS['xenc']}}}", f"{{{NS['ds']}}}"
    data = etree.Element(X + "EncryptedData", nsmap={"xenc": NS["xenc"], "ds": NS["ds"]})
    etree.SubElement(data, X + "EncryptionMethod", Algorithm=AES128_GCM)
    key_info = etree.SubElement(data, D + "KeyInfo")
    key = etree.SubElement(key_info, X + "EncryptedKey")
    key.append(copy.deepcopy(method))
    key.append(copy.deepcopy(encrypted_key.find("xenc:CipherData", NS)))
    etree.SubElement(etree.SubElement(data, X + "CipherData"), X + "CipherValue").text = \
        base64.b64encode(attachment).decode()
    manager = xmlsec.KeysManager()
    manager.add_key(xmlsec.Key.from_memory(receiver_key_pem, xmlsec.constants.KeyDataFormatPem, None))
    try:
        compressed = xmlsec.EncryptionContext(manager).decrypt(data)
    except xmlsec.Error as e:
        raise Rejected(f"libxmlsec1: the attachment does not decrypt ({e})") from e
    if base64.b64encode(hashlib.sha256(compressed).digest()).decode() != attachment_digest:
        raise Rejected("the attachment's digest does not match the signed one")
    sbd = gzip.decompress(compressed)
    um = messaging.find("eb:UserMessage", NS)
    return {
        "message_id": um.findtext("eb:MessageInfo/eb:MessageId", namespaces=NS),
        "from": um.findtext("eb:PartyInfo/eb:From/eb:PartyId", namespaces=NS),
        "to": um.findtext("eb:PartyInfo/eb:To/eb:PartyId", namespaces=NS),
        "service": um.findtext("eb:CollaborationInfo/eb:Service", namespaces=NS),
        "action": um.findtext("eb:CollaborationInfo/eb:Action", namespaces=NS),
        "properties": {p.get("name"): p.text for p in um.findall("eb:MessageProperties/eb:Property", NS)},
        "compression": {p.get("name"): p.text for p in
                        um.findall("eb:PayloadInfo/eb:PartInfo/eb:PartProperties/eb:Property", NS)},
        "sbd": sbd,
    }


def verify_signal(body: bytes, signer_cert_pem: bytes) -> etree._Element:
    """A signed ebMS signal (a receipt) checked whole by libxmlsec1: the
    signature and each same-document reference, the ids registered."""
    root = etree.fromstring(body, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))
    ctx = xmlsec.SignatureContext()
    for el in root.iter():
        if el.get(f"{{{NS['wsu']}}}Id"):
            ctx.register_id(el, "Id", NS["wsu"])
    ctx.key = xmlsec.Key.from_memory(signer_cert_pem, xmlsec.constants.KeyDataFormatCertPem, None)
    signature = root.find("S12:Header/wsse:Security/ds:Signature", NS)
    if signature is None:
        raise Rejected("the signal is not signed")
    try:
        ctx.verify(signature)
    except xmlsec.Error as e:
        raise Rejected(f"libxmlsec1: the signal's signature does not verify ({e})") from e
    return root
