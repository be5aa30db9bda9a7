"""An AS4 partner's options (Peppol AS4 profile), checked once, and the
keys and parties the ``as4`` package builds and verifies with.

A partner's ``options`` are text (semq edge partners store them so):

==================  ===========================================================
``party_id``        the partner's access point id (its ``PartyInfo/From`` on
                    the messages it sends, ``To`` on ours; in Peppol the CN of
                    its certificate); default: the partner's id
``sender``          our participant (C1), e.g. ``0088:5790000435975``: the
                    SBDH sender and the ``originalSender`` property
``recipient``       the partner's participant (C4): the SBDH receiver and
                    ``finalRecipient``
``document_type``   the document type identifier (busdox-docid-qns), e.g.
                    ``urn:oasis:...:Invoice-2::Invoice##urn:cen.eu:en16931:2017#...::2.1``;
                    the ``Action`` is ``busdox-docid-qns::`` followed by it
``process``         the process identifier: ``CollaborationInfo/Service``
                    (type ``cenbii-procid-ubl``)
``country``         the sender's country (C1), the SBDH ``COUNTRY_C1`` scope
``participants``    inbound only: the participants we accept as
                    ``finalRecipient``, comma-separated; default: any
``max_bytes``       inbound only: the largest document accepted, after
                    decompression; default and ceiling ``MAX_DOCUMENT``
==================  ===========================================================

Sending needs ``sender``, ``recipient``, ``document_type``, ``process`` and
``country``; receiving needs none of them."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Final

from as4 import AS4LocalPrivateKey
from as4.core.common import AS4ExternalParty, AS4InternalParty
from as4.peppol import (
    BusdoxDocidQnsDocumentIdentifier,
    PeppolAS4MessageBuilderArgs,
    create_peppol_external_party,
    create_peppol_internal_party,
)
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey

from semq.edge.protocol import EdgePartner, OurKeys
from semq.settings.bounds import EDGE_MAX_BODY, EDGE_MAX_INFLATED

__all__ = [
    "MAX_DOCUMENT",
    "MAX_MESSAGE",
    "OPTIONS",
    "SENDING_OPTIONS",
    "accepted_participants",
    "builder_args",
    "check_certificate",
    "check_options",
    "document_limit",
    "message_id_for",
    "missing_for_sending",
    "our_party",
    "their_certificate",
    "their_party",
    "their_party_id",
]

#: The largest POST body read_inbound opens (the whole MIME message, encrypted):
#: the edge listener's bound, checked again here for any other caller.
MAX_MESSAGE: Final = EDGE_MAX_BODY
#: The largest document after decompression (a gzip bomb stops here).
MAX_DOCUMENT: Final = EDGE_MAX_INFLATED

OPTIONS: Final = ("party_id", "sender", "recipient", "document_type", "process", "country",
                  "participants", "max_bytes")
SENDING_OPTIONS: Final = ("sender", "recipient", "document_type", "process", "country")

# An ebMS MessageId is an RFC 2822 msg-id without its brackets (ebMS3 core 5.2.2.1):
# dot-atom text on both sides of one "@". A document's id becomes its left side.
_ATEXT = re.compile(r"[^A-Za-z0-9!#$%&'*+\-/=?^_`{|}~.]")


def check_options(options: Mapping[str, str]) -> list[str]:
    """What is wrong with a partner's options, one line each (empty: fine).
    Names the option and the rule, as ``semq`` errors do."""
    problems = [f"unknown AS4 option {key!r} (known: {', '.join(OPTIONS)})" for key in options if key not in OPTIONS]
    if "document_type" in options:
        try:
            BusdoxDocidQnsDocumentIdentifier.from_identifier_value(options["document_type"])
        except ValueError:
            problems.append(f"AS4 option document_type {options['document_type']!r} is not a busdox-docid-qns "
                            "identifier (ROOT_NS::ROOT##CUSTOMIZATION::VERSION)")
    if "max_bytes" in options:
        value = options["max_bytes"]
        if not value.isdigit() or not 0 < int(value) <= MAX_DOCUMENT:
            problems.append(f"AS4 option max_bytes {value!r} is not a whole number from 1 to {MAX_DOCUMENT}")
    if "country" in options and not re.fullmatch(r"[A-Z]{2}", options["country"]):
        problems.append(f"AS4 option country {options['country']!r} is not a two-letter country code (ISO 3166-1)")
    return problems


def check_certificate(pem: bytes) -> str | None:
    """Why a partner's certificate cannot serve AS4, or None."""
    try:
        key = _certificate(pem).public_key()
    except ValueError:
        return "not a PEM certificate"
    if not isinstance(key, RSAPublicKey):
        return "its key is not RSA (the Peppol AS4 profile signs and encrypts with RSA)"
    return None


def missing_for_sending(options: Mapping[str, str]) -> list[str]:
    return [key for key in SENDING_OPTIONS if not options.get(key)]


def document_limit(partner: EdgePartner) -> int:
    value = partner.options.get("max_bytes", "")
    return min(int(value), MAX_DOCUMENT) if value.isdigit() and int(value) > 0 else MAX_DOCUMENT


def accepted_participants(partner: EdgePartner) -> frozenset[str] | None:
    raw = partner.options.get("participants", "")
    names = frozenset(p.strip() for p in raw.split(",") if p.strip())
    return names or None


def message_id_for(doc_id: str) -> str:
    """The ebMS MessageId of a document: a function of its id only, so a resend
    carries the same one (the partner's duplicate detection relies on it)."""
    return f"{_ATEXT.sub('.', doc_id).strip('.') or 'document'}@semq"


def their_party_id(partner: EdgePartner) -> str:
    return partner.options.get("party_id") or partner.id


@functools.lru_cache(maxsize=64)
def _certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


@functools.lru_cache(maxsize=4)
def _private_key(pem: bytes) -> object:
    # Loading checks the RSA key's consistency (tens of milliseconds for
    # 2048 bits): once per key, not once per message.
    return serialization.load_pem_private_key(pem, password=None)


def their_certificate(partner: EdgePartner) -> x509.Certificate:
    cert = _certificate(partner.their_cert_pem)
    if not isinstance(cert.public_key(), RSAPublicKey):
        raise ValueError(f"partner {partner.id}'s certificate has no RSA key (the Peppol AS4 profile signs and "
                         "encrypts with RSA)")
    return cert


def their_party(partner: EdgePartner) -> AS4ExternalParty:
    return create_peppol_external_party(their_party_id(partner), their_certificate(partner))


def our_party(our_id: str, ours: OurKeys) -> AS4InternalParty:
    cert = _certificate(ours.cert_pem)
    key = _private_key(ours.key_pem)
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the node's edge key is not an RSA key (the Peppol AS4 profile signs and decrypts with RSA)")
    return create_peppol_internal_party(our_id, cert, AS4LocalPrivateKey(key))


def builder_args(partner: EdgePartner, instance_id: str) -> PeppolAS4MessageBuilderArgs:
    """The SBDH and CollaborationInfo of a message to ``partner``; raises
    ValueError naming the options sending needs."""
    options = partner.options
    if missing := missing_for_sending(options):
        raise ValueError(f"AS4 partner {partner.id} lacks the option(s) {', '.join(missing)} needed to send")
    return PeppolAS4MessageBuilderArgs(
        sender=options["sender"],
        recipient=options["recipient"],
        document_type_identifier=BusdoxDocidQnsDocumentIdentifier.from_identifier_value(options["document_type"]),
        document_identification_instance_identifier=instance_id,
        process_identifier=options["process"],
        c1_country_id=options["country"],
    )
