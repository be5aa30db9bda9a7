"""What an AS4 receipt must match, as text: the signed references.

A Peppol AS4 non-repudiation receipt (ebbp ``NonRepudiationInformation``)
repeats the ``ds:Reference`` elements of the message's signature: the
eb:Messaging header, the SOAP Body and each attachment, each with its
digest. ``Outgoing.digest`` and ``Inbound.digest`` hold them as one JSON
text (sorted, so equal sets give equal text): the sender compares the
receipt's references with the ones it signed, the receiver builds its
receipt from the ones it verified."""

from __future__ import annotations

import json
from collections.abc import Iterable

from as4.models.dsig.reference import ComparableReferenceFields, DigestMethod, DigestValue
from as4.models.dsig.reference import Reference as DsigReference
from as4.models.dsig.transforms import Transform, Transforms

__all__ = ["decode", "encode", "keys", "to_references"]

_MAX_TEXT = 64 * 1024  # a digest text is a few hundred bytes; refuse anything absurd


def keys(references: Iterable[ComparableReferenceFields]) -> set[tuple[str, tuple[str, ...], str, str]]:
    """Each reference as a comparable value: URI, transforms, digest method, digest."""
    return {(r.uri, tuple(r.transform_algorithms), r.digest_algorithm, r.digest_value) for r in references}


def encode(references: Iterable[ComparableReferenceFields]) -> str:
    rows = sorted(keys(references))
    return json.dumps([[uri, list(transforms), alg, value] for uri, transforms, alg, value in rows],
                      separators=(",", ":"))


def decode(text: str) -> list[ComparableReferenceFields]:
    """The references of an ``encode``d text; ValueError if it is not one."""
    if len(text) > _MAX_TEXT:
        raise ValueError(f"AS4 digest text of {len(text)} characters exceeds {_MAX_TEXT}")
    try:
        rows = json.loads(text)
        return [ComparableReferenceFields(uri=uri, transform_algorithms=list(transforms),
                                          digest_algorithm=alg, digest_value=value)
                for uri, transforms, alg, value in rows]
    except (ValueError, TypeError) as e:
        raise ValueError(f"not an AS4 digest text: {e}") from e


def to_references(fields: Iterable[ComparableReferenceFields]) -> list[DsigReference]:
    """``ds:Reference`` models to repeat in a receipt."""
    return [DsigReference(
        transforms=Transforms(transforms=[Transform(algorithm=a) for a in f.transform_algorithms]),
        digest_method=DigestMethod(algorithm=f.digest_algorithm),
        digest_value=DigestValue(text=f.digest_value),
        uri=f.uri,
    ) for f in fields]
