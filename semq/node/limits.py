"""What a node refuses when a document is handed over, and why: a document
that can never fit one UMX-T frame (the daemon would resend it for ever,
each try cutting the connection for every other document), and a target
that is not an organization id or is the node itself.

``max_document_size`` is the one place the document limit is computed: the
frame limit less every byte a DATA frame adds around the application's
document on its way (docs/protocol.md, "Frame" and "DATA"; docs/security.md,
"Session key blob" and "Signed container"). It counts the worst case of
everything the node does not know when it accepts a document, so one limit
holds whatever the document's AppKey, target, security settings and the
batch it is signed in, and a document accepted is one that can be sent:

- the 18-byte header and the CRC32 trailer;
- the three endpoint ids, up to 64 bytes each (a relayed frame's transport
  source is the platform, whose id may be 64 characters);
- the 40-byte DATA prefix (LK0, LK1, times), the AppKey (four 1-byte lengths
  and up to 255 bytes each), the 2-byte session-key and 4-byte AppData length
  prefixes;
- with security on: the session-key blob sealed to up to 16 recipient keys
  (22 + 96 x 16 = 1,558 bytes), the AES-GCM tag (16), and the signed
  container around the document (101-byte head, the batch position and a
  Merkle path of up to 16 hashes for a batch of up to 65,536 documents, the
  4-byte body length: 626 bytes).

``tests/node/test_document_limits.py`` builds a real frame at exactly the limit
and one byte over, and checks the crypto overheads against real sealed and
signed documents.
"""

from __future__ import annotations

import json
from typing import Final

from semq.identity.crypto import (
    BLOB_HEADER_SIZE,
    KEY_ID_SIZE,
    MAX_RECIPIENT_KEYS,
    MAX_SIGN_BATCH,
    WRAP_SIZE,
)
from semq.settings.config import ORG_ID_ALLOWED, org_id_problem
from semq.umxt_protocol import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    MAX_APPKEY_FIELD,
    MAX_NODE_ID,
    LocalProtocolError,
    ResultCode,
)

__all__ = [
    "DEFAULT_MAX_DOCUMENT",
    "DEFAULT_MAX_DOCUMENT_MIB",
    "MAX_DOCUMENT_SIZE",
    "BadTarget",
    "DocumentRefused",
    "DocumentTooLarge",
    "LargeDocumentTooLarge",
    "check_document_size",
    "check_target",
    "max_document_size",
]

CRC_SIZE: Final = 4  # the frame's CRC32 trailer
DATA_PREFIX_SIZE: Final = 40  # LK0, LK1, created_ms, expires_ms (docs/protocol.md, DATA)
APPKEY_PARTS: Final = 4  # domain, data_type, subtype, key: u8 length + UTF-8 each
SESSION_KEY_LEN: Final = 2  # u16 length prefix of SessionKey
APP_DATA_LEN: Final = 4  # u32 length prefix of AppData
# Security (docs/security.md). The sealed AppData is the signed container
# encrypted with AES-256-GCM: its tag is the only growth.
GCM_TAG: Final = 16
SESSION_KEY_BLOB_MAX: Final = BLOB_HEADER_SIZE + MAX_RECIPIENT_KEYS * WRAP_SIZE  # 1,558
SIGNATURE_SIZE: Final = 64  # Ed25519
SALT_SIZE: Final = 16
CONTAINER_HEAD: Final = 4 + 1 + KEY_ID_SIZE + SALT_SIZE + SIGNATURE_SIZE  # magic, mode, signer, salt, signature
BATCH_POSITION: Final = 4 + 4 + 1  # batch size, leaf index, path length (mode 2)
MERKLE_PATH_MAX: Final = (MAX_SIGN_BATCH - 1).bit_length() * 32  # 16 SHA-256 hashes
BODY_LEN: Final = 4  # u32 length of the document inside the container
CONTAINER_MAX: Final = CONTAINER_HEAD + BATCH_POSITION + MERKLE_PATH_MAX + BODY_LEN  # 626


def max_document_size(*, max_frame: int = DEFAULT_MAX_FRAME, node_id: int = MAX_NODE_ID,
                      app_key: int = APPKEY_PARTS * MAX_APPKEY_FIELD, security: bool = True) -> int:
    """The largest document (bytes of AppData as the application hands it
    over) whose DATA frame is at most ``max_frame`` bytes, with endpoint ids
    of ``node_id`` bytes, AppKey parts of ``app_key`` bytes in all and, with
    ``security``, sealed to the most recipient keys and signed in the largest
    batch. The defaults are the worst case: ``MAX_DOCUMENT_SIZE``."""
    frame = HEADER_SIZE + 3 * node_id + CRC_SIZE
    body = DATA_PREFIX_SIZE + APPKEY_PARTS + app_key + SESSION_KEY_LEN + APP_DATA_LEN
    sealed = SESSION_KEY_BLOB_MAX + GCM_TAG + CONTAINER_MAX if security else 0
    return max_frame - frame - body - sealed


# 67,105,380 bytes: 3,484 under the 64 MiB frame limit.
MAX_DOCUMENT_SIZE: Final = max_document_size()


class DocumentRefused(LocalProtocolError):
    """A document the node will not accept: nothing of the call was stored."""


class DocumentTooLarge(DocumentRefused):
    """Larger than one frame can carry (``MAX_DOCUMENT_SIZE``)."""

    def __init__(self, size: int, limit: int = MAX_DOCUMENT_SIZE) -> None:
        super().__init__(f"document of {size} bytes exceeds the {limit}-byte limit for one document",
                         ResultCode.FRAME_TOO_LARGE)
        self.size = size
        self.limit = limit


DEFAULT_MAX_DOCUMENT_MIB: Final = 4096
DEFAULT_MAX_DOCUMENT: Final = DEFAULT_MAX_DOCUMENT_MIB << 20  # bytes: the default of max_document_mib


class LargeDocumentTooLarge(DocumentRefused):
    """A file over the node's limit for one document (``max_document_mib``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"document of {size} bytes ({size / 2**20:.1f} MiB) exceeds this node's limit of"
                         f" {limit} bytes ({limit >> 20} MiB, max_document_mib)", ResultCode.TOO_LARGE)
        self.size = size
        self.limit = limit


class BadTarget(DocumentRefused):
    """A target that is not an organization id, or the node itself."""


def check_document_size(size: int) -> None:
    """Raise DocumentTooLarge if a document of ``size`` bytes cannot be sent."""
    if size > MAX_DOCUMENT_SIZE:
        raise DocumentTooLarge(size, MAX_DOCUMENT_SIZE)


def check_target(target: str, me: str, what: str = "target") -> None:
    """Raise BadTarget if ``target`` is not an organization id (numbers, as
    10008) or is ``me``; ``what`` names it in the message (``--to``)."""
    why = org_id_problem(target)
    if why is not None:
        shown = json.dumps(target, ensure_ascii=False) if isinstance(target, str) else repr(target)
        raise BadTarget(f"{what} {shown} {why}; allowed: {ORG_ID_ALLOWED}", ResultCode.INVALID_FIELD)
    if target == me:
        raise BadTarget(f"{what} {target} is this node's own organization; a node sends to other"
                        " organizations", ResultCode.INVALID_FIELD)
