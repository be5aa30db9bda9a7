"""What the API hands applications (``InboxItem``, ``OutboxRow``), the
rows it asks the owners for by name (semq.node.rows), and the node's
numbering of a multi-unit inbox."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple

from semq.umxt_protocol import LK0, AppKey

from ..engine import SendState
from ..envelope import GAP_DOMAIN, GAP_TYPE

__all__ = ["UNIT_IDS", "Cursor", "InboxItem", "InboxRow", "MessageRow", "OutboxRow"]

# A node of several units (semq.umxt_protocol.units) numbers its inbox as one: the id of
# unit K's row R is R * UNIT_IDS + K (row 17 of unit 2: 1702). A node of one
# unit shows its rows' own ids.
UNIT_IDS: Final = 100


class InboxRow(NamedTuple):
    """An inbox row as an application reads it (``NodeClient.inbox``)."""

    id: int
    origin_type: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    priority: int
    created_ms: int
    received_ms: int
    encrypt: int
    app_data: bytes
    consumed_ms: int | None
    from_user: str
    to_user: str
    channel: str
    path: str | None  # a large document's file (semq.node.large); its app_data is empty
    large_size: int | None  # ... and its size (the column ``size``)


class MessageRow(NamedTuple):
    """A pending-send row as ``NodeClient.messages`` lists it (who refused
    it, a target's signed refusal, comes from the receipts' owner)."""

    id: int
    target_id: str
    state: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    ack2: int
    priority: int
    created_ms: int
    attempts: int
    inquiries: int
    code: int
    size: int
    from_user: str
    to_user: str
    channel: str
    large: int  # a large document: ``size`` is its manifest's; its content's is in large_out


#: Where a follower is: per unit (1..N), the last row id it was given.
Cursor = tuple[int, ...]


@dataclass(frozen=True)
class InboxItem:
    id: int  # this node's id of the document (see UNIT_IDS)
    lk0: LK0
    app_key: AppKey
    save_fwd: int
    priority: int
    created_ms: int
    received_ms: int
    encrypted: bool
    app_data: bytes
    consumed_ms: int | None
    unit: int = 1  # the unit that received it (semq.umxt_protocol.units)
    from_user: str = ""  # the sending organization's user ("": the organization)
    to_user: str = ""  # the user of this node it is for ("": the organization)
    channel: str = ""  # its ordered channel ("": unordered)
    # A large document (semq.node.large) is not read into memory: ``path``
    # is its file in the data directory (read it, copy it; it goes a day
    # after it is acknowledged) and ``app_data`` is empty.
    path: Path | None = None
    large_size: int = 0

    @property
    def size(self) -> int:
        """Bytes of the document."""
        return len(self.app_data) if self.path is None else self.large_size

    def open(self) -> BinaryIO:
        """The document as a binary file object (a large one is not read whole)."""
        return io.BytesIO(self.app_data) if self.path is None else open(self.path, "rb")

    def content(self) -> bytes:
        """The whole document in memory (for a large one: read from its file)."""
        return self.app_data if self.path is None else self.path.read_bytes()

    def save(self, dest: Path) -> None:
        """Write the document to ``dest`` (a large one copied by blocks)."""
        if self.path is None:
            dest.write_bytes(self.app_data)
        else:
            shutil.copyfile(self.path, dest)

    @property
    def gap(self) -> bool:
        """A gap notice: the document of ``channel`` named by the AppKey's
        key failed at its origin, and the channel moved on without it."""
        return self.app_key.domain == GAP_DOMAIN and self.app_key.data_type == GAP_TYPE


@dataclass(frozen=True)
class OutboxRow:
    lk0: LK0
    target: str
    state: SendState
    app_key: AppKey
    save_fwd: int
    ack2: bool
    priority: int
    created_ms: int
    attempts: int
    inquiries: int
    code: int
    size: int
    # Why a failed row failed, in words: the result code's name, and for a
    # target's signed refusal, who refused it (verified when it came).
    note: str = ""
    from_user: str = ""
    to_user: str = ""
    channel: str = ""
