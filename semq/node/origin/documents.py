"""What an application hands over (``NewDocument``, SPEC A.1), and the
DATA header flags a document is sent with (``document_flags``: its AAD
binds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from semq.umxt_protocol import (
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_ENVELOPE,
    FLAG_KEY_SEALED,
    FLAG_LARGE,
    FLAG_ORDERED,
    FLAG_RELIABLE,
    AppKey,
    SaveFwd,
)

__all__ = ["NewDocument", "document_flags"]

_NO_KEY: Final = AppKey()


@dataclass(frozen=True, kw_only=True)
class NewDocument:
    """What an application hands over (SPEC A.1)."""

    target: str
    app_data: bytes
    app_key: AppKey = _NO_KEY
    save_fwd: SaveFwd = SaveFwd.MUST_DELIVER
    ack2: bool = True
    reliable: bool = True
    priority: int = 0
    expires_ms: int | None = None
    encrypt: bool = False
    session_key: bytes = b""
    created_ms: int | None = None
    # The AppKey travels sealed inside the document (the relay routes
    # without it) unless the application asks for it in clear; without
    # encryption it is in clear anyway.
    clear_app_key: bool = False
    # Users inside the two organizations ("": the organization itself) and
    # the ordered channel ("": unordered); semq.node.envelope.
    from_user: str = ""
    to_user: str = ""
    channel: str = ""
    # A gap notice: the record id of the failed ordered document whose place
    # it takes (and that document's ``prev``); made by semq.node.receiver.channels.
    skipped: int = 0
    gap_prev: int = 0
    # A large document (semq.node.large): ``app_data`` is its manifest and
    # this the path of its content, relative to the store's directory.
    large_path: str = ""


def document_flags(reliable: bool, ack2: bool, encrypt: bool, key_sealed: bool, envelope: bool = False,
                   ordered: bool = False, large: bool = False) -> int:
    """The DATA header flags a document is sent with (its AAD binds them)."""
    return ((FLAG_RELIABLE if reliable else 0) | (FLAG_ACK2 if ack2 else 0)
            | (FLAG_ENCRYPT if encrypt else 0) | (FLAG_KEY_SEALED if key_sealed else 0)
            | (FLAG_ENVELOPE if envelope else 0) | (FLAG_ORDERED if ordered else 0)
            | (FLAG_LARGE if large else 0))
