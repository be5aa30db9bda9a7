"""What the platform's table owners show the operator: the rows the
console, the status and the gauges read (semq.ops.handlers.platform,
semq.ops.metrics), and the selection the console asks for rows by.

Values only: each owner builds its SELECT list from these rows' fields
and its WHERE clause from a selection (semq.platform.copies, nodes, seen,
cluster); the rows an owner works with on the hot path stay next to its
SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["InstanceRow", "NodeRow", "OrgRow", "SeenRow", "StoredAdminRow", "StoredDepth", "StoredSelection",
           "StoredStatus", "StoredTotals", "select_list"]


def select_list(row: type[tuple[Any, ...]], exprs: dict[str, str]) -> str:
    """The SELECT list of a named row: its fields, each a column of the same
    name or, for those in ``exprs``, that expression named by the field."""
    return ", ".join(f"{exprs[f]} AS {f}" if f in exprs else f for f in row._fields)  # type: ignore[attr-defined]


class StoredAdminRow(NamedTuple):
    """A stored row as the console shows it: no frame, its size.
    ``origin_id`` .. ``record_id`` are the LK0 of a DATA copy (zero for a
    relayed ack or inquiry)."""

    id: int
    target_id: str
    kind: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    state: int
    priority: int
    expires_ms: int | None
    stored_ms: int
    attempts: int
    last_sent_ms: int | None
    inquiries: int
    size: int

    @property
    def lk0_key(self) -> tuple[str, int, int, int]:
        return (self.origin_id, self.semq_id, self.semq_db_id, self.record_id)


class StoredDepth(NamedTuple):
    """Stored rows per target, kind (DATA or relayed) and state."""

    target_id: str
    is_data: int
    state: int
    rows: int  # count(*) (``count`` is a tuple's method)
    oldest_ms: int


class StoredTotals(NamedTuple):
    """What the status counts: DATA copies per target (how many, the
    oldest), relayed frames waiting, kept chunks and their bytes."""

    per_target: dict[str, tuple[int, int]]
    relayed: int
    chunks: int
    chunk_bytes: int


@dataclass(frozen=True, kw_only=True)
class StoredSelection:
    """Which stored rows the console means; every field given narrows it."""

    ids: tuple[int, ...] = ()
    after: int | None = None  # ids above this one
    kind: str = "all"  # "data" (documents), "relayed" (acks, inquiries, chunks) or "all"
    states: tuple[int, ...] = ()
    target: str | None = None
    origin: str | None = None
    document: tuple[str, int, int, int] | None = None  # the copies of one LK0 (origin id, semq, db, record)
    stored_before_ms: int | None = None


class NodeRow(NamedTuple):
    """An organization as the console lists it."""

    node_id: str
    last_seen_ms: int | None
    revoked: int  # 1: revoked (``semq platform revoke``)


class OrgRow(NamedTuple):
    """An organization as the console's Organizations page lists it."""

    node_id: str
    registered_ms: int
    last_seen_ms: int | None
    revoked: int  # 1: revoked (``semq platform revoke``)
    units: int  # the units its HELLO said it runs
    units_granted: int  # the units the operator granted it


class SeenRow(NamedTuple):
    """What the console shows of a document's ``seen`` row."""

    action: int  # semq.platform.seen.SeenAction
    lk1: int  # the stored copy's id (STORED), else 0
    seen_ms: int


class InstanceRow(NamedTuple):
    """An instance on a PostgreSQL store, as the status lists it."""

    id: str
    address: str
    pid: int
    heartbeat_ms: int
    holds: int  # organizations whose presence row names it


class StoredStatus(NamedTuple):
    """What ``semq admin status`` shows of the store."""

    depths: list[StoredDepth]
    nodes: list[NodeRow]
    oldest_ms: int | None  # the oldest stored document's time (None: none)
