"""The interface of an edge protocol adapter (AS2, AS4), sans-IO.

An adapter turns a document into the bytes and headers of one HTTP POST
(``build``), judges the partner's synchronous answer (``read_receipt``),
opens a partner's POST (``read_inbound``: verify, decrypt, or refuse with
the protocol's own error) and answers it (``receipt_for``). The node does
everything else: the store, resending with the same message id, exactly
once delivery, the receipt kept as proof.

Adapters register themselves in ``PROTOCOLS`` when their module is
imported; ``load_protocols`` imports the ones SEMQ ships."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "PROTOCOLS",
    "EdgePartner",
    "EdgeProtocol",
    "EdgeRefusal",
    "Inbound",
    "OurKeys",
    "Outgoing",
    "ReceiptResult",
    "load_protocols",
    "protocol_of",
]


@dataclass(frozen=True)
class EdgePartner:
    """A partner that speaks AS2 or AS4: its id (as the protocol names it,
    e.g. an AS2-From / AS2-To name), where we POST, its certificate (we
    verify its signatures with it and encrypt to it), our id towards it,
    and the protocol's options (algorithms, MDN / receipt options, AS4 and
    Peppol identifiers), as text."""

    id: str
    protocol: str  # "as2" | "as4"
    url: str
    their_cert_pem: bytes
    our_id: str
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OurKeys:
    """The node's edge identity: the certificate partners know us by, and
    its private key (signing, decryption)."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Outgoing:
    """One message to POST. ``message_id`` is stable per document (a
    resend reuses it); ``digest`` is what the receipt must match (AS2: the
    MIC as ``"base64, sha-256"``; AS4: the digest(s) signed)."""

    message_id: str
    headers: Mapping[str, str]
    body: bytes
    digest: str


@dataclass(frozen=True)
class ReceiptResult:
    """The partner's answer, judged: ``ok`` only for a verified positive
    receipt whose digest matches what was sent; ``reason`` otherwise (the
    partner's words for a negative one); ``proof`` is the whole receipt as
    received, kept.

    What the node does with it (semq.edge.daemon.sender):

    - ``ok``: confirmed, ``proof`` kept;
    - not ``ok`` with a ``proof``: a **verified** refusal (a negative MDN,
      an ebMS error signed by the partner): the document fails, ``reason``
      shown;
    - not ``ok`` and ``proof == b""``: no receipt at all (an HTTP error, an
      answer that does not verify or parse): sent again later with the same
      message id, ``reason`` kept."""

    ok: bool
    reason: str | None
    proof: bytes


@dataclass(frozen=True)
class Inbound:
    """A partner's message, verified and opened."""

    partner_id: str
    message_id: str
    content: bytes
    content_type: str
    filename: str | None
    digest: str


class EdgeRefusal(Exception):
    """A message refused, with the protocol's own error answer (an HTTP
    status, its headers, its body: an AS2 error MDN, an ebMS error), which
    the listener sends as is; nothing is stored. ``reason``: one line for
    the log."""

    def __init__(self, reason: str, status: int, headers: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.headers: Mapping[str, str] = dict(headers or {})
        self.body = body


class EdgeProtocol(Protocol):
    """What every adapter implements."""

    name: str

    def build(self, doc_id: str, content: bytes, content_type: str, partner: EdgePartner, ours: OurKeys) -> Outgoing:
        """The message for one document; ``message_id`` is a function of
        ``doc_id`` (resends reuse it)."""
        ...

    def read_receipt(self, status: int, headers: Mapping[str, str], body: bytes, sent: Outgoing,
                     partner: EdgePartner, ours: OurKeys) -> ReceiptResult:
        """Judge the partner's synchronous answer to ``sent``."""
        ...

    def read_inbound(self, headers: Mapping[str, str], body: bytes,
                     partners: Callable[[str], EdgePartner | None], ours: OurKeys) -> Inbound:
        """Verify and open a partner's message; raises ``EdgeRefusal``."""
        ...

    def receipt_for(self, inbound: Inbound, headers: Mapping[str, str], partner: EdgePartner,
                    ours: OurKeys) -> tuple[int, dict[str, str], bytes]:
        """The positive receipt for a message received (status, headers, body)."""
        ...

    def claims(self, headers: Mapping[str, str]) -> bool:
        """Does this inbound request speak this protocol?"""
        ...


#: name -> adapter; filled by the adapters' modules when imported.
PROTOCOLS: dict[str, EdgeProtocol] = {}

#: the adapters SEMQ ships: imported by ``load_protocols`` (a missing one is skipped).
_SHIPPED = ("semq.edge.as2", "semq.edge.as4")


def load_protocols() -> dict[str, EdgeProtocol]:
    """Import the shipped adapters (each registers itself) and return the registry."""
    for name in _SHIPPED:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return PROTOCOLS


def protocol_of(headers: Mapping[str, str]) -> EdgeProtocol | None:
    """The adapter that claims an inbound request, if any."""
    for proto in load_protocols().values():
        if proto.claims(headers):
            return proto
    return None
