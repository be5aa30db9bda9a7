"""Receiving from an AS4 partner: open and verify its POST
(``read_inbound``), answer it with a signed receipt (``receipt_for``), or
refuse it with the ebMS3 error signal the specification names. Sans-IO.

The order of the checks, each refusal with its ebMS3 error (core spec
6.7.1, AS4 profile; the ``as4`` package's codes):

1. the POST's size against ``MAX_MESSAGE`` (EBMS:0004 Other, HTTP 413);
2. the MIME message: a SOAP part and one attachment (EBMS:0009 InvalidHeader);
3. the SOAP envelope: XML with no DTD (SOAP 1.2 part 1, 5: "MUST NOT contain
   a document type declaration"), parsed without entities, network or huge
   trees (EBMS:0009);
4. MessageId, one eb:Messaging with its wsu:Id (EBMS:0003 ValueInconsistent);
5. the sender: ``PartyInfo/From`` names a known AS4 partner (else EBMS:0101
   FailedAuthentication), ``To`` names us (EBMS:0003);
6. the signature, with the partner's certificate as we hold it (pinned: the
   certificate the message carries is not trusted for anything): present
   (EBMS:0103 PolicyNoncompliance), over this eb:Messaging and this Body by
   their ids (no element moved elsewhere), over each attachment, every digest
   verified on the parts delivered (EBMS:0101);
7. decryption (EBMS:0102 FailedDecryption), decompression bounded by the
   partner's ``max_bytes`` (EBMS:0303 DecompressionFailure);
8. the SBDH: schema-valid, agreeing with originalSender / finalRecipient,
   the final recipient one we accept (EBMS:0004, ``PEPPOL:NOT_SERVICED``);
9. the business document: no DTD (EBMS:0004), as it reaches the inbox as is.

Every refusal is signed with our key, as the partner verifies our signals."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from as4 import AS4ParseContext, ParticipantNotServicedError, SecurityPolicy
from as4.core.common import AS4InternalParty
from as4.core.message import AS4Message
from as4.errors import (
    BaseAS4ReceiptableError,
    BaseFailedAuthenticationException,
    BaseInvalidHeaderException,
    BaseProfileLevelException,
    BaseValueInconsistentException,
    MalformedSoapEnvelopeException,
)
from as4.models.common import NAMESPACES
from as4.models.ebms.user_message import PartyFrom
from as4.peppol import PeppolAS4Profile
from as4.profiles.peppol.receipt import PeppolAS4Receipt
from as4.utils.mime_handler import MIMEHandler
from cryptography import x509
from lxml import etree

from semq.edge.as4 import references
from semq.edge.as4.options import (
    MAX_MESSAGE,
    accepted_participants,
    check_certificate,
    document_limit,
    our_party,
    their_certificate,
)
from semq.edge.protocol import EdgePartner, EdgeRefusal, Inbound, OurKeys

__all__ = ["read_inbound", "receipt_for"]

_WSU_ID = "{http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd}Id"
_SIGNAL_HEADERS = {"Content-Type": "application/soap+xml; charset=utf-8"}


class _UnknownSender(BaseFailedAuthenticationException):
    description = "The sending access point is not a partner of this node"


class _NotAddressedToUs(BaseValueInconsistentException):
    description = "PartyInfo/To does not name this access point"


class _Oversize(BaseProfileLevelException):
    description = "The message exceeds the size this access point accepts"


class _Unreadable(BaseInvalidHeaderException):
    description = "The message could not be read"


class _PayloadDtd(BaseProfileLevelException):
    description = "The business document carries a document type declaration"


class _WrappedSignature(BaseFailedAuthenticationException):
    description = "The signature does not cover this message's eb:Messaging and Body by their ids"


def _parser() -> etree.XMLParser:
    # No entities, no DTD, no network, no huge trees: a billion laughs or an
    # external entity is never expanded, and the DTD is refused below anyway.
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                           dtd_validation=False)


def _refusal(error: BaseAS4ReceiptableError, status: int, signer: AS4InternalParty,
             message_id: str = "", messaging_id: str = "") -> EdgeRefusal:
    """The ebMS3 error signal for ``error``, signed with our key."""
    reason = f"{error.error_code} {error.short_description}: {error.detail or error.description}"
    signal = PeppolAS4Receipt.create_error_signal_from_exception(
        exception=error, local_party=signer,
        referenced_message_id=message_id, referenced_messaging_id=messaging_id)
    _, body = signal.get_request_data()
    return EdgeRefusal(reason, status, {"Content-Type": _SIGNAL_HEADERS["Content-Type"]}, body)


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def _signer_for(partner: EdgePartner, cert: x509.Certificate) -> Callable[[PartyFrom, x509.Certificate | None],
                                                                           x509.Certificate]:
    def resolve(party_from: PartyFrom, embedded: x509.Certificate | None) -> x509.Certificate:
        # The partner's certificate as the operator gave it: never the one the message carries.
        return cert
    return resolve


def _check_signed_ids(root: etree._Element, messaging_id: str) -> None:
    """The signature must name this envelope's eb:Messaging and Body by their
    wsu:Id. The ``as4`` package checks that some signed element is an
    eb:Messaging and some a Body; a signed copy moved elsewhere in the
    envelope (XML signature wrapping) would satisfy that."""
    header = root.find("S12:Header", namespaces=NAMESPACES)
    body = root.find("S12:Body", namespaces=NAMESPACES)
    if header is None or body is None or len(header.findall("eb3:Messaging", namespaces=NAMESPACES)) != 1:
        raise MalformedSoapEnvelopeException(detail="the envelope needs one Header with one eb:Messaging, and a Body")
    signed = {uri for uri in root.xpath(
        "S12:Header/wsse:Security/ds:Signature/ds:SignedInfo/ds:Reference/@URI",
        namespaces={**NAMESPACES, "wsse": "http://docs.oasis-open.org/wss/2004/01/"
                    "oasis-200401-wss-wssecurity-secext-1.0.xsd", "ds": "http://www.w3.org/2000/09/xmldsig#"})}
    body_id = body.get(_WSU_ID)
    if not signed:
        return  # no signature: the as4 package refuses it (EBMS:0103)
    if f"#{messaging_id}" not in signed or not body_id or f"#{body_id}" not in signed:
        raise _WrappedSignature()


def _check_no_dtd(content: bytes, us: AS4InternalParty, message_id: str, messaging_id: str) -> None:
    """The document goes to the inbox as signed; one with a DTD would have
    its entities expanded by whichever application parses it next (the
    as4 package parsed it without expanding them). Peppol's SBD has none."""
    try:
        info = etree.fromstring(content, parser=_parser()).getroottree().docinfo
    except etree.XMLSyntaxError as e:
        raise _refusal(_PayloadDtd(detail=f"the business document is not XML: {e}"), 500, us,
                       message_id, messaging_id) from e
    if info.doctype or info.internalDTD is not None:
        raise _refusal(_PayloadDtd(detail="the business document must not contain a DTD"), 500, us,
                       message_id, messaging_id)


def read_inbound(headers: Mapping[str, str], body: bytes, partners: Callable[[str], EdgePartner | None],
                 ours: OurKeys) -> Inbound:
    """Verify and open a partner's AS4 message; raises EdgeRefusal carrying
    the signed ebMS3 error signal (HTTP 500; 413 for an oversize POST)."""
    anyone = our_party("", ours)  # signs the refusals sent before we know the partner
    if len(body) > MAX_MESSAGE:
        raise _refusal(_Oversize(detail=f"a message of {len(body)} bytes exceeds the {MAX_MESSAGE}-byte limit"),
                       413, anyone)
    content_type = _header(headers, "content-type").replace("\r", " ").replace("\n", " ")
    try:
        payload = MIMEHandler.payload_from_request({"Content-Type": content_type}, body)
        soap, attachments = PeppolAS4Profile.unpack_message(payload)
    except BaseAS4ReceiptableError as e:
        raise _refusal(e, 500, anyone) from e
    try:
        root = etree.fromstring(soap, parser=_parser())
    except etree.XMLSyntaxError as e:
        raise _refusal(MalformedSoapEnvelopeException(detail=f"the SOAP part is not XML: {e}"), 500, anyone) from e
    tree = root.getroottree()
    if tree.docinfo.doctype or tree.docinfo.internalDTD is not None:
        raise _refusal(MalformedSoapEnvelopeException(detail="a SOAP message must not contain a DTD"), 500, anyone)
    try:
        message_id, messaging_id = AS4Message.pre_validate(root)
    except BaseAS4ReceiptableError as e:
        raise _refusal(e, 500, anyone) from e
    from_id = root.findtext("S12:Header/eb3:Messaging/eb3:UserMessage/eb3:PartyInfo/eb3:From/eb3:PartyId",
                            namespaces=NAMESPACES)
    to_id = root.findtext("S12:Header/eb3:Messaging/eb3:UserMessage/eb3:PartyInfo/eb3:To/eb3:PartyId",
                          namespaces=NAMESPACES)
    partner = partners(from_id.strip()) if from_id and from_id.strip() else None
    if partner is None or partner.protocol != "as4":
        raise _refusal(_UnknownSender(detail=f"PartyInfo/From {from_id!r} is not a partner"), 500, anyone,
                       message_id, messaging_id)
    us = our_party(partner.our_id, ours)
    if (why := check_certificate(partner.their_cert_pem)) is not None:
        raise _refusal(_UnknownSender(detail=f"the certificate held for {from_id!r} cannot verify it: {why}"),
                       500, us, message_id, messaging_id)
    if (to_id or "").strip() != partner.our_id:
        raise _refusal(_NotAddressedToUs(detail=f"PartyInfo/To {to_id!r} is not {partner.our_id!r}"), 500, us,
                       message_id, messaging_id)
    try:
        _check_signed_ids(root, messaging_id)
    except BaseAS4ReceiptableError as e:
        raise _refusal(e, 500, us, message_id, messaging_id) from e
    accepted = accepted_participants(partner)

    def accept(participant: str) -> None:
        if accepted is not None and participant not in accepted:
            raise ParticipantNotServicedError(participant)

    policy = SecurityPolicy(signer_resolver=_signer_for(partner, their_certificate(partner)),
                            maximum_decompressed_size=document_limit(partner))
    context = AS4ParseContext(local_party=us, accept_participant=accept, security_policy=policy)
    try:
        message = PeppolAS4Profile.message_class().parse(context, soap, attachments)
    except Exception as e:  # the library boundary: anything else is a message we cannot read
        # The as4 package answers most bad input with its own ebMS errors; some
        # escape it (a BinarySecurityToken that is not base64 or not DER raises
        # binascii.Error / ValueError): translated here, at the one boundary.
        raise _refusal(_Unreadable(detail=f"{type(e).__name__}: {str(e)[:200]}"), 500, us,
                       message_id, messaging_id) from e
    if message.parse_error is not None:
        raise _refusal(message.parse_error, 500, us, message_id, messaging_id)
    attachment_id = next(iter(attachments))
    content = message.decrypted_data.get(attachment_id)
    if content is None:  # pragma: no cover - the as4 package refuses a message without it
        raise _refusal(MalformedSoapEnvelopeException(detail="no decrypted payload"), 500, us,
                       message_id, messaging_id)
    _check_no_dtd(bytes(content), us, message_id, messaging_id)
    return Inbound(partner_id=partner.id, message_id=message_id, content=bytes(content),
                   content_type="application/xml", filename=None,
                   digest=references.encode(message.signed_references))


def receipt_for(inbound: Inbound, headers: Mapping[str, str], partner: EdgePartner,
                ours: OurKeys) -> tuple[int, dict[str, str], bytes]:
    """The signed ebMS3 Receipt for ``inbound``: NonRepudiationInformation
    repeating the references its sender signed and we verified."""
    receipt = PeppolAS4Receipt.create_non_repudiation_receipt(
        referenced_message_id=inbound.message_id,
        referenced_messaging_id="",
        non_repudiated_references=references.to_references(references.decode(inbound.digest)),
        local_party=our_party(partner.our_id, ours),
    )
    out_headers, body = receipt.get_request_data()
    return 200, dict(out_headers), body
