"""Each of the platform's tables has one owner (docs/architecture.md, "The
platform's tables and their owners"): only its module names the table in
SQL. The schema's module (semq/platform/store.py: the migrations, the store
copied whole) may name them all. Everyone else asks the owner — the
facade, the roles, the console's handlers, the gauges, the command.

What the scan reads: every string constant of every module of the package
(the literal parts of f-strings too), docstrings left out, for a table's
name after ``FROM``, ``INTO``, ``UPDATE``, ``JOIN``, ``TABLE``,
``ANALYZE`` or ``COPY`` (the SQL is written with upper-case keywords)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "semq"

OWNERS: dict[str, str] = {
    "stored": "semq/platform/copies.py",
    "seen": "semq/platform/seen.py",
    "nodes": "semq/platform/nodes.py",
    "presence": "semq/platform/cluster.py",
    "instances": "semq/platform/cluster.py",
    "peers": "semq/platform/peers.py",
    "ca_files": "semq/platform/cafiles.py",
}
SCHEMA = "semq/platform/store.py"
NAMES = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|ANALYZE|COPY)\s+(" + "|".join(OWNERS) + r")\b")

# The modules that ask the owners and hold no store connection of their own
# (the platform's part of a module shared with the node: its functions).
ASKERS: dict[str, tuple[str, ...]] = {
    "semq/ops/handlers/platform.py": (),
    "semq/ops/metrics.py": ("platform_snapshot",),
}
# What holding the store means: its connection, its database, its writes.
HOLDING = frozenset({"conn", "db", "write_held", "write_held_now"})


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant but the docstrings."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip]


def _named(source: str) -> list[tuple[int, str, str]]:
    """(line, table, text) of each owned table named in SQL, by line."""
    return sorted((line, m.group(1), text) for line, text in _strings(source) for m in NAMES.finditer(text))


def test_only_a_tables_owner_names_it_in_sql() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == SCHEMA:
            continue
        for line, table, text in _named(path.read_text("utf-8")):
            if OWNERS[table] != rel:
                wrong.append(f"{rel}:{line}: names {table} (its owner is {OWNERS[table]}): {text.strip()[:90]}")
    assert not wrong, "ask the table's owner:\n" + "\n".join(wrong)


def test_every_owner_names_its_table() -> None:
    """The map above is true: each owner does hold its table's SQL."""
    for table, owner in OWNERS.items():
        assert table in {t for _line, t, _text in _named((ROOT / owner).read_text("utf-8"))}, (table, owner)


def test_the_scan_finds_what_it_looks_for() -> None:
    source = '''
"""A docstring may say UPDATE stored SET state=1."""
X = "SELECT id FROM stored WHERE kind=?"
Y = f"INSERT INTO seen VALUES ({n})"
Z = "DELETE FROM peers WHERE node_id=?" + "x"
W = ("LOCK TABLE " "nodes, stored")
def f():
    """Nor here: SELECT 1 FROM nodes."""
    return "the rows from stored copies", "SELECT 1 FROM storedx", "FROM stored_sent"
'''
    assert [(t, line) for line, t, _text in _named(source)] == [
        ("stored", 3), ("seen", 4), ("peers", 5), ("nodes", 6)]


def _holding(path: Path, functions: tuple[str, ...]) -> list[str]:
    """Where the module (or only its ``functions``) reaches for the store itself."""
    tree = ast.parse(path.read_text("utf-8"))
    roots: list[ast.AST] = [tree] if not functions else [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in functions]
    assert roots, (path, functions)
    return [f"{path.relative_to(ROOT).as_posix()}:{n.lineno}: .{n.attr}" for root in roots
            for n in ast.walk(root) if isinstance(n, ast.Attribute) and n.attr in HOLDING]


def test_the_console_and_the_gauges_hold_no_connection_and_write_nothing_first() -> None:
    """The console's handlers and the platform's gauges ask the owners
    (through the core's ``operator``, ``copies``, ``nodes``), whose answers
    merge what they hold in memory: none of them holds the store's
    connection or writes the held states before it reads."""
    wrong = [w for rel, functions in ASKERS.items() for w in _holding(ROOT / rel, functions)]
    assert not wrong, "\n".join(wrong)


def test_the_owners_never_ask_which_store_they_are_on() -> None:
    """What differs between SQLite and PostgreSQL is the store layer's
    (semq.store.pg.translate_sql, the Dialect): no owner or role switches
    on it. (The facade decides what a store offers — chunk files or rows,
    several instances — and the schema's module opens it.)"""
    switches = re.compile(r"\b(?:is_pg_url|PgDatabase|PgConn|self\.pg|core\.pg)\b")
    allowed = {"semq/platform/core.py", SCHEMA, "semq/platform/migrate.py", "semq/platform/daemon.py"}
    wrong = []
    for path in sorted((PACKAGE / "platform").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        wrong += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
                  if switches.search(line.split("#", 1)[0])]
    assert not wrong, "\n".join(wrong)


def test_the_platforms_modules_are_small_rooms() -> None:
    """No module of semq/platform over 700 lines, no class over 500 (STYLE:
    h11 is small rooms). The daemon, the session readers' room, is not
    measured here."""
    big = []
    for path in sorted((PACKAGE / "platform").glob("*.py")):
        if path.name == "daemon.py":
            continue
        text = path.read_text("utf-8")
        lines = text.count("\n")
        if lines > 700:
            big.append(f"{path.name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None \
                    and node.end_lineno - node.lineno + 1 > 500:
                big.append(f"{path.name}: class {node.name} of {node.end_lineno - node.lineno + 1} lines")
    assert not big, big
