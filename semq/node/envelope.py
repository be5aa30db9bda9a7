"""A document's envelope: who it is from and to inside the two
organizations (users, SPEC "Users"), and its place in an ordered channel
(SPEC "Ordered channels"). Pure: no I/O.

A DATA frame with FLAG_ENVELOPE carries it at the start of its AppData::

    u8 version (1)
    u8 len + from_user   the sending user ("" = the organization itself)
    u8 len + to_user     the receiving user ("" = the organization itself)
    u8 len + channel     the ordered channel ("" = unordered)
    u64 prev             ordered: the record id of the channel's document
                         before this one at its origin (0 = the first)
    u64 skipped          a gap notice: the record id of the channel's
                         document that failed at its origin (0 otherwise)

With security the envelope is inside the signed and sealed document, so the
relay neither reads nor changes who a document is for or its place in a
channel, and the AAD binds the flag: a relay cannot strip it.

**Ordered channels** are chains: each document names the one before it in
its (origin, target, channel). The receiver hands a document to the
application only when the one it names was handed over (or announced
failed); until then it is *held*, durably, in the receiver's store
(acknowledged: it is there). A document that fails at its origin (refused,
dropped, expired, purged) is replaced by a **gap notice**: a document of its
own, in the failed one's place in the chain, that the application receives
as ``semq.channel / GAP`` naming the failed LK0 — then the channel moves on.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "GAP_DOMAIN",
    "GAP_TYPE",
    "MAX_CHANNEL",
    "MAX_ENVELOPE",
    "MAX_USER",
    "NO_ENVELOPE",
    "Envelope",
    "EnvelopeError",
    "check_channel",
    "check_user",
    "encode_envelope",
    "parse_address",
    "split_envelope",
]

MAX_USER: Final = 64  # characters of a user name
MAX_CHANNEL: Final = 128  # characters of a channel name
_USER_RE: Final = re.compile(r"[a-z][a-z0-9._-]*")
_CHANNEL_RE: Final = re.compile(r"[A-Za-z0-9._:@-]+")
_VERSION: Final = 1
_IDS: Final = struct.Struct(">QQ")
MAX_ENVELOPE: Final = 1 + 3 + 2 * MAX_USER + MAX_CHANNEL + _IDS.size  # bytes an envelope may take
_MAX_ID: Final = 2**64 - 1
GAP_DOMAIN: Final = "semq.channel"  # a gap notice's AppKey domain ...
GAP_TYPE: Final = "GAP"  # ... and data type; subtype = the channel, key = the failed LK0


class EnvelopeError(ValueError):
    """An envelope, user name, channel name or address that is not valid
    (one line naming the value and the rule)."""


def check_user(name: str) -> str:
    """``name`` if it is a valid user name: 1..64 of [a-z0-9._-], starting
    with a letter (an organization id is digits: ``--to alice`` cannot be
    read as one). Raises EnvelopeError otherwise."""
    if not isinstance(name, str) or not name or len(name) > MAX_USER or not _USER_RE.fullmatch(name):
        raise EnvelopeError(f"user name {name!r} is not 1..{MAX_USER} characters of a-z 0-9 . _ - "
                            f"starting with a letter")
    return name


def check_channel(name: str) -> str:
    """``name`` if it is a valid channel name: 1..128 of [A-Za-z0-9._:@-]."""
    if not isinstance(name, str) or not name or len(name) > MAX_CHANNEL or not _CHANNEL_RE.fullmatch(name):
        raise EnvelopeError(f"channel name {name!r} is not 1..{MAX_CHANNEL} characters of A-Z a-z 0-9 . _ : @ -")
    return name


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """Validated on construction (EnvelopeError)."""

    from_user: str = ""
    to_user: str = ""
    channel: str = ""
    prev: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        if self.from_user:
            check_user(self.from_user)
        if self.to_user:
            check_user(self.to_user)
        if self.channel:
            check_channel(self.channel)
        for name in ("prev", "skipped"):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v <= _MAX_ID:
                raise EnvelopeError(f"envelope {name} {v!r} is outside 0..2**64-1")
        if (self.prev or self.skipped) and not self.channel:
            raise EnvelopeError("an envelope names a place in a channel but no channel")

    @property
    def empty(self) -> bool:
        return not (self.from_user or self.to_user or self.channel)


NO_ENVELOPE: Final = Envelope()


def encode_envelope(env: Envelope) -> bytes:
    """The bytes that start AppData (FLAG_ENVELOPE)."""
    f, t, c = env.from_user.encode(), env.to_user.encode(), env.channel.encode()
    return b"".join((bytes((_VERSION, len(f))), f, bytes((len(t),)), t, bytes((len(c),)), c,
                     _IDS.pack(env.prev, env.skipped)))


def split_envelope(body: bytes) -> tuple[Envelope, bytes]:
    """The envelope and the document of an AppData made by
    ``encode_envelope`` + document. Raises EnvelopeError for bytes that
    are not one (with security they verified: the origin wrote them)."""
    try:
        if body[0] != _VERSION:
            raise EnvelopeError(f"envelope version {body[0]} is not {_VERSION}")
        pos = 1
        parts = []
        for _ in range(3):
            n = body[pos]
            text = body[pos + 1 : pos + 1 + n]
            if len(text) != n:
                raise EnvelopeError("the envelope runs past the document")
            parts.append(text.decode("ascii"))
            pos += 1 + n
        prev, skipped = _IDS.unpack_from(body, pos)
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise EnvelopeError(f"the document's envelope is malformed: {e}") from None
    env = Envelope(from_user=parts[0], to_user=parts[1], channel=parts[2], prev=prev, skipped=skipped)
    return env, body[pos + _IDS.size :]


def parse_address(text: str, me: str) -> tuple[str, str]:
    """``(organization, user)`` of a ``--to`` address: ``ORG`` (the
    organization), ``ORG/USER`` (a user of it), or ``USER`` (a colleague:
    a user of this node, organization ``me``). Organization ids are digits
    and user names start with a letter, so the forms never overlap. Raises
    EnvelopeError for a user name after '/' that is not valid; the
    organization id is checked by the caller."""
    if "/" in text:
        org, _, user = text.partition("/")
        return org, check_user(user)
    if len(text) <= MAX_USER and _USER_RE.fullmatch(text):
        return me, text
    return text, ""  # an organization id, or neither: the caller's check of the id says so
