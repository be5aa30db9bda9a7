"""Every table of the node's store has one owner (docs/architecture.md,
"The node: who owns which table"): one module holds its SQL. This fails
when any other module of the package names an owned table in SQL — in a
string constant (an f-string's literal parts too), as ``FROM``, ``INTO``,
``UPDATE``, ``JOIN`` or ``TABLE`` followed by its name. The schema's owner,
semq/node/store.py (tables, indexes, migrations), names them all.

Readers ask the owners (``NodeCore.outbox``, ``.inbox``, ...): a read-only
query API, whose SELECT lists they may give as a named row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "semq"

#: table -> the one module that names it in SQL.
OWNERS: dict[str, str] = {
    # the origin: the pending-send state machine, its channels' numbering, its proofs
    "outbox": "semq/node/origin/outbox.py",
    "channel_out": "semq/node/origin/channels.py",
    "receipts": "semq/node/origin/receipts.py",
    "receipt_batches": "semq/node/origin/receipts.py",
    "refusals": "semq/node/origin/receipts.py",
    # the receiver: the pending-ack state machine, a document received once and consumed, ordered channels
    "inbound": "semq/node/receiver/pending_ack.py",
    "inbox": "semq/node/receiver/inbox.py",
    "dedup": "semq/node/receiver/inbox.py",
    "receive_tries": "semq/node/receiver/inbox.py",
    "channel_in": "semq/node/receiver/channels.py",
    "channel_held": "semq/node/receiver/channels.py",
    # large documents, each way
    "large_in": "semq/node/large/incoming.py",
    "large_out": "semq/node/large/outgoing.py",
    # consulted by both roles and the API
    "users": "semq/node/users.py",
    # the features' own
    "watch_files": "semq/node/features/folders.py",
    "tx_half": "semq/node/features/txn.py",
    "rpc_requests": "semq/node/features/rpc.py",
    "rpc_answers": "semq/node/features/rpc.py",
    "queues": "semq/node/features/queues.py",
    "queue_items": "semq/node/features/queues.py",
    # the edge (AS2, AS4): partners, our documents to them, theirs to us
    "edge_partners": "semq/edge/store.py",
    "edge_out": "semq/edge/store.py",
    "edge_in": "semq/edge/store.py",
}
SCHEMA = "semq/node/store.py"
SQL_NAMING = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+(" + "|".join(OWNERS) + r")\b")


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module, with its line (an f-string's
    literal parts are constants of their own)."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text("utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _namings(path: Path) -> list[tuple[int, str, str]]:
    return [(line, m.group(1), m.group(0)) for line, text in _strings(path) for m in SQL_NAMING.finditer(text)]


def test_no_module_but_its_owner_names_a_node_table_in_sql() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == SCHEMA:
            continue
        wrong += [f"{rel}:{line}: {text!r} (the owner of {table} is {OWNERS[table]}: ask it)"
                  for line, table, text in _namings(path) if OWNERS[table] != rel]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("table", sorted(OWNERS))
def test_every_owner_owns_its_table(table: str) -> None:
    """The map stays true: each owner does name its table."""
    assert any(t == table for _, t, _ in _namings(ROOT / OWNERS[table])), f"{OWNERS[table]} never names {table}"


def test_the_schema_has_every_owned_table_and_no_other(tmp_path: Path) -> None:
    """Every table of a fresh node store is owned, or shared by the store
    layer (``meta``: versions, incarnations, the salt key) and SQLite."""
    from semq.node.core import NodeCore

    core = NodeCore(tmp_path / "node.sqlite", "50001", create=True)
    try:
        tables = {n for (n,) in core.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        core.close()
    assert tables - {"meta", "sqlite_sequence"} == set(OWNERS)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('a = "SELECT 1 FROM outbox WHERE id=?"\n'
                   'b = f"UPDATE inbound SET p_ack={x} WHERE id=?"\n'
                   'c = ("INSERT OR IGNORE INTO dedup (a) VALUES (?)"\n'
                   '     " ON CONFLICT")\n'
                   'd = "SELECT o.id FROM large_out l JOIN outbox o ON o.id = l.id"\n'
                   'ok = "the outbox, the inbox_rpc_reply index, FROM inboxes, user"\n')
    assert sorted(t for _, t, _ in _namings(bad)) == ["dedup", "inbound", "large_out", "outbox", "outbox"]
