"""Sending to an AS4 partner: the message (``build``) and the judgement of
its synchronous answer (``read_receipt``). Sans-IO.

The message follows the Peppol AS4 profile (2.x) as the ``as4`` package
builds it: an ebMS3 UserMessage (PartyInfo with the access points' ids,
CollaborationInfo with the process as Service and the document type as
Action, MessageProperties originalSender / finalRecipient), the document
wrapped in a Standard Business Document (SBDH) as the one MIME attachment,
gzip-compressed, signed (RSA-SHA256, exclusive C14N, SHA-256 digests over
eb:Messaging, the Body and the compressed attachment) and encrypted
(AES-128-GCM, the key sent with RSA-OAEP / MGF1-SHA-256 to the partner's
certificate)."""

from __future__ import annotations

from collections.abc import Mapping
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import cast

from as4 import ReceiptVerificationError
from as4.core.references import AS4References
from as4.peppol import PeppolAS4Profile, PeppolSendingExchange
from as4.profiles.peppol.receipt import PeppolAS4Receipt
from lxml import etree

from semq.edge.as4 import references
from semq.edge.as4.options import (
    builder_args,
    message_id_for,
    our_party,
    their_certificate,
    their_party,
)
from semq.edge.as4.resend import Resends
from semq.edge.protocol import EdgePartner, OurKeys, Outgoing, ReceiptResult

__all__ = ["build", "read_receipt"]

#: The largest answer read_receipt reads (a receipt is a few KiB).
MAX_ANSWER = 1024 * 1024


_RESENDS = Resends()


def build(doc_id: str, content: bytes, content_type: str, partner: EdgePartner, ours: OurKeys) -> Outgoing:
    """The signed and encrypted message carrying ``content`` (an XML business
    document) to ``partner``; the same one again while it is kept (a resend,
    ``resend.py``). Raises ValueError when the document is not XML or the
    partner's options or certificates cannot serve (naming which)."""
    key = Resends.key(doc_id, content, partner, ours)
    kept = _RESENDS.get(key)
    if kept is not None:
        return kept
    out = _build(doc_id, content, partner, ours)
    _RESENDS.put(key, out)
    return out


def _build(doc_id: str, content: bytes, partner: EdgePartner, ours: OurKeys) -> Outgoing:
    message_id = message_id_for(doc_id)
    exchange = PeppolSendingExchange(
        profile=PeppolAS4Profile,
        local_party=our_party(partner.our_id, ours),
        remote_party=their_party(partner),
        identifiers=AS4References(message_id=message_id, conversation_id=message_id),
    )
    try:
        headers, body = exchange.build(content, builder_args(partner, instance_id=message_id))
    except etree.XMLSyntaxError as e:
        raise ValueError(f"document {doc_id} is not XML ({e}); Peppol AS4 carries an XML business "
                         "document in its SBDH") from e
    out_headers = {
        "Content-Type": headers["Content-Type"],
        "MIME-Version": "1.0",
        "Message-ID": f"<{message_id}>",
    }
    return Outgoing(message_id=message_id, headers=out_headers, body=body,
                    digest=references.encode(exchange.signed_references))


def _soap_part(headers: Mapping[str, str], body: bytes) -> bytes:
    """The SOAP envelope of an answer: the body itself, or the
    application/soap+xml part of a multipart/related one."""
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if not content_type.lower().lstrip().startswith("multipart/"):
        return body
    message = BytesParser(policy=policy.default).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n" + body)
    for part in cast(EmailMessage, message).walk():
        if part.get_content_type() == "application/soap+xml":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return payload
    return body


def _error_text(receipt: PeppolAS4Receipt) -> str:
    error = receipt.error
    assert error is not None
    words = [error.error_code or "EBMS:?", error.short_description or ""]
    detail = error.error_detail.value if error.error_detail is not None else None
    description = error.description.value if error.description is not None else None
    text = " ".join(w for w in words if w)
    if detail or description:
        text += f": {detail or description}"
    return text


def read_receipt(status: int, headers: Mapping[str, str], body: bytes, sent: Outgoing,
                 partner: EdgePartner, ours: OurKeys) -> ReceiptResult:
    """ok only for an ebMS3 Receipt signed with the partner's certificate
    (over its eb:Messaging), naming ``sent``'s MessageId, whose
    NonRepudiationInformation repeats exactly the references we signed. A
    verified ebMS3 Error signal about it gives the partner's error code and
    words, with the signal as ``proof`` (the node fails the document); any
    other answer has an empty ``proof`` (the node sends the same message
    again later)."""
    if len(body) > MAX_ANSWER:
        return ReceiptResult(False, f"HTTP {status}: an answer of {len(body)} bytes exceeds the "
                                    f"{MAX_ANSWER}-byte limit for an AS4 signal", b"")
    if not body.strip():
        return ReceiptResult(False, f"HTTP {status} with no ebMS signal", b"")
    try:
        receipt = PeppolAS4Receipt.parse(_soap_part(headers, body), their_certificate(partner))
    except ReceiptVerificationError as e:
        return ReceiptResult(False, f"HTTP {status}: the answer is not a verified ebMS signal ({e})", b"")
    except Exception as e:  # the library boundary: an answer we cannot judge confirms nothing
        # What escapes the as4 package: a BinarySecurityToken that is not base64
        # or DER (binascii.Error, ValueError), or of another type (its own
        # UnsupportedSecurityTokenType), found by tests/edge/test_as4_fuzz.py.
        return ReceiptResult(False, f"HTTP {status}: the answer is not a readable ebMS signal "
                                    f"({type(e).__name__}: {str(e)[:200]})", b"")
    if receipt.error is not None:
        ref = receipt.original_message_id
        if ref not in (None, "", sent.message_id):  # about another message: not an answer to this one
            return ReceiptResult(False, f"an ebMS error about message {ref}, not {sent.message_id}: "
                                        f"{_error_text(receipt)}", b"")
        # A verified error signal: the partner's refusal, kept as the proof (the document fails).
        _RESENDS.forget(sent.message_id)
        return ReceiptResult(False, f"the partner refused the message: {_error_text(receipt)}", body)
    if receipt.original_message_id != sent.message_id:
        return ReceiptResult(False, f"the receipt names message {receipt.original_message_id}, "
                                    f"not {sent.message_id}", b"")
    if receipt.receipt is None:
        return ReceiptResult(False, "the signal is neither an ebMS Receipt nor an Error", b"")
    try:
        wanted = references.decode(sent.digest)
    except ValueError as e:
        return ReceiptResult(False, f"the message's digest is unreadable: {e}", b"")
    got = receipt.non_repudiated_references
    if not got:
        return ReceiptResult(False, "the receipt has no NonRepudiationInformation: it proves nothing "
                                    "about what was received", b"")
    if references.keys(got) != references.keys(wanted):
        missing = sorted(k[0] for k in references.keys(wanted) - references.keys(got))
        other = sorted(k[0] for k in references.keys(got) - references.keys(wanted))
        return ReceiptResult(False, "the receipt's references do not match the message sent "
                                    f"(not acknowledged: {missing or 'none'}; not sent: {other or 'none'})",
                             b"")
    _RESENDS.forget(sent.message_id)
    return ReceiptResult(True, None, body)
