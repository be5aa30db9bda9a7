"""AS4 at the edge: ebMS3 messages and receipts under the Peppol AS4
profile, built, signed, encrypted and verified with the ``as4`` package
(README, "Stack"), with the checks it leaves to its caller added here:
the partner's certificate pinned, the signed ids bound to this envelope,
sizes bounded, the receipt's references compared with what was sent.

Importing it registers the adapter in ``semq.edge.protocol.PROTOCOLS``."""

from __future__ import annotations

from semq.edge.as4.adapter import As4Protocol
from semq.edge.as4.options import (
           OPTIONS,
           SENDING_OPTIONS,
           check_certificate,
           check_options,
           message_id_for,
)
from semq.edge.protocol import PROTOCOLS

__all__ = ["AS4", "OPTIONS", "SENDING_OPTIONS", "As4Protocol", "check_certificate", "check_options",
           "message_id_for"]

AS4 = As4Protocol()
PROTOCOLS[AS4.name] = AS4
