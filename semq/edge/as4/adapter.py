"""The AS4 adapter (ebMS3, Peppol AS4 profile) as the node's edge uses it:
``EdgeProtocol`` over ``outbound`` and ``inbound``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from semq.edge.as4 import inbound, outbound
from semq.edge.protocol import EdgePartner, Inbound, OurKeys, Outgoing, ReceiptResult

__all__ = ["As4Protocol"]


class As4Protocol:
    """AS4 at the edge. Sans-IO: the node POSTs ``build``'s bytes and hands
    the answer to ``read_receipt``; its listener hands a claimed POST to
    ``read_inbound`` and, after the inbox commit, answers ``receipt_for``."""

    name = "as4"

    def build(self, doc_id: str, content: bytes, content_type: str, partner: EdgePartner,
              ours: OurKeys) -> Outgoing:
        return outbound.build(doc_id, content, content_type, partner, ours)

    def read_receipt(self, status: int, headers: Mapping[str, str], body: bytes, sent: Outgoing,
                     partner: EdgePartner, ours: OurKeys) -> ReceiptResult:
        return outbound.read_receipt(status, headers, body, sent, partner, ours)

    def read_inbound(self, headers: Mapping[str, str], body: bytes,
                     partners: Callable[[str], EdgePartner | None], ours: OurKeys) -> Inbound:
        return inbound.read_inbound(headers, body, partners, ours)

    def receipt_for(self, inbound_message: Inbound, headers: Mapping[str, str], partner: EdgePartner,
                    ours: OurKeys) -> tuple[int, dict[str, str], bytes]:
        return inbound.receipt_for(inbound_message, headers, partner, ours)

    def claims(self, headers: Mapping[str, str]) -> bool:
        """An AS4 POST is SOAP 1.2 with attachments: multipart/related whose
        root is application/soap+xml (or a bare SOAP envelope), and carries no
        AS2 header (RFC 4130 puts AS2-Version and AS2-From on every message)."""
        lower = {k.lower(): v for k, v in headers.items()}
        if "as2-version" in lower or "as2-from" in lower:
            return False
        content_type = lower.get("content-type", "").lower()
        main = content_type.split(";", 1)[0].strip()
        if main == "application/soap+xml":
            return True
        return main == "multipart/related" and "application/soap+xml" in content_type
