"""Store rows are read by name, never by position.

A row of a wide SELECT read as ``r[12]`` silently reads the wrong column
when a column is added, moved or renamed; a named row (a ``NamedTuple``
whose fields name the columns, its SELECT list made from them by
``semq.node.rows.columns``) fails loudly instead ("no such column").
A table's owner keeps the named rows its state machine reads, next to its
SQL; a reader of an owner's query API brings its own (the owner builds the
SELECT list from it); a feature's or a query's own (an aggregate, another
store's table) next to its SQL.

The scan below finds positional reads of row variables in the package's
source. What it flags: ``NAME[k]`` for a row-like name with an index other
than 0 or a slice (``r[3]``, ``row[-1]``, ``h[:11]``), a row of a list of
rows read by position (``rows[0][3:7]``), and the same straight off a
cursor (``fetchone()[2]``). What it lets through: index 0, the one column of
a one-column SELECT (``row[0]``, ``fetchone()[0]``; a one-to-three-column
SELECT may as well be unpacked, ``(n,) = ...``, ``for rid, state in ...``),
and every non-row subscript (``argv[1]``, ``parts[0]``, ``data[:4]``).
Modules with rows of their own rule are not scanned here: the platform,
the protocol, analytics and crypto.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "semq"
EXCLUDED = ("semq/platform/", "semq/umxt_protocol/", "semq/analytics/", "semq/identity/crypto/")

# The names rows are bound to in this code base (a row, a held row, a hit,
# a candidate...).
_ROW = r"(?:r|row|rw|rec|rc|h|d|x|s|got|cand|prev|hit|one|res|result)"
_INDEX = r"(?:-?[1-9][0-9]*|-?[0-9]*:-?[0-9]*(?::-?[0-9]*)?)"  # not 0: a non-zero index or a slice
POSITIONAL = re.compile(
    rf"(?<![\w.]){_ROW}\[{_INDEX}\]"  # r[12], row[-1], h[:11]
    rf"|(?<![\w.])(?:rows|hits|got)\[-?[0-9]+\]\["  # rows[0][3:7]
    rf"|\bfetchone\(\)\[{_INDEX}\]"  # cursor.fetchone()[2]
    rf"|\bfetchall\(\)\[-?[0-9]+\]\["  # cursor.fetchall()[0][3]
)

#: (file, text on the line, why it is not a store row read by position).
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("semq/node/store.py", 'PRAGMA table_info(',
     "SQLite's own PRAGMA table_info rows (cid, name, type, ...): r[1] is a column's name in a migration"),
)


def _scanned() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if not p.relative_to(ROOT).as_posix().startswith(EXCLUDED)]


def _code(line: str) -> str:
    """The line without its comment (a ``#`` outside a string is rare
    enough in this code base not to need a tokenizer)."""
    return line.split("  #", 1)[0]


def _allowed(rel: str, line: str) -> bool:
    return any(rel == f and text in line for f, text, _why in ALLOWED)


@pytest.mark.parametrize("text", [
    "r[12]", "row[3]", "h[:11]", "r[-1]", "r[:-1]", "x[1]", "d[2:5]", "rows[0][3:7]", "rc[1]", "cand[1]",
    "conn.execute(q).fetchone()[2]", "c.execute(q).fetchall()[0][3]", "f(r[1], r[2])", "{r[1] for r in rows}",
])
def test_the_scan_flags_positional_reads_of_rows(text: str) -> None:
    assert POSITIONAL.search(text), text


@pytest.mark.parametrize("text", [
    "sys.argv[1:]", "argv[1]", "parts[0]", "parts[1:]", "data[:4]", "row[0]", "r[0]", "fetchone()[0]",
    "r.id", 'r["id"]', "e.args[0]", "names[3:]", "self.r[2]", "hdr[4:8]", "words[0]", "first[1:]",
    "args.ids[1]", "x.rows[0][1]", "buf.split(b'\\n', 1)[0]",
])
def test_the_scan_lets_other_subscripts_through(text: str) -> None:
    assert not POSITIONAL.search(text), text


def test_no_store_row_is_read_by_position() -> None:
    found = []
    for p in _scanned():
        rel = p.relative_to(ROOT).as_posix()
        for n, line in enumerate(p.read_text("utf-8").splitlines(), 1):
            m = POSITIONAL.search(_code(line))
            if m and not _allowed(rel, line):
                found.append(f"{rel}:{n}: {m.group(0)}  ({line.strip()})")
    assert not found, ("rows read by position (read them by name: a NamedTuple whose fields name the columns,"
                       " SELECT list from semq.node.rows.columns):\n" + "\n".join(found))


def test_every_allowance_is_still_needed() -> None:
    stale = []
    for f, text, why in ALLOWED:
        p = ROOT / f
        lines = p.read_text("utf-8").splitlines() if p.exists() else []
        if not any(text in line and POSITIONAL.search(_code(line)) for line in lines):
            stale.append(f"{f}: {text!r} ({why})")
    assert not stale, "allowances that match nothing any more (remove them):\n" + "\n".join(stale)


def test_the_named_rows_select_lists_match_the_node_store(tmp_path: Path) -> None:
    """Each named row's SELECT list compiles against a fresh node store:
    a renamed or dropped column is an error here, not a shifted value."""
    from semq.node.api.items import InboxRow, MessageRow
    from semq.node.core import NodeCore
    from semq.node.features import queues
    from semq.node.features.dead import DeadLetterRow
    from semq.node.features.receiving import TryRow
    from semq.node.features.rpc import RpcRequestRow
    from semq.node.features.txn import HalfMessageRow
    from semq.node.origin.outbox import ClaimRow, PendingSendRow
    from semq.node.receiver.pending_ack import PendingAckRow
    from semq.node.rows import columns
    from semq.ops.handlers.node import InboundAdminRow, OutboxAdminRow

    core = NodeCore(tmp_path / "node.sqlite", "50001", create=True)
    try:
        c = core.conn
        for row, table in ((InboxRow, "inbox"), (DeadLetterRow, "outbox"), (OutboxAdminRow, "outbox"),
                           (MessageRow, "outbox"), (ClaimRow, "outbox"), (PendingSendRow, "outbox"),
                           (InboundAdminRow, "inbound"), (PendingAckRow, "inbound"), (TryRow, "receive_tries"),
                           (HalfMessageRow, "tx_half"), (RpcRequestRow, "rpc_requests"),
                           (queues.QueueItemRow, "queue_items")):
            cur = c.execute(f"SELECT {columns(row)} FROM {table} LIMIT 0")
            assert len(cur.description) == len(row._fields), row.__name__
        cur = c.execute(f"SELECT {queues._STATS_COLS} FROM queues q LEFT JOIN queue_items i ON i.queue = q.name"
                        " GROUP BY q.name", (0, 0))
        assert tuple(d[0] for d in cur.description) == queues._QueueCounts._fields
    finally:
        core.close()
