"""semq/node/ is grouped by role, and its imports point one way, in the
order of docs/architecture.md ("semq/node/, by role": engine ← store ←
users, large ← origin, receiver ← inquiries ← core ← api ← features ← the
trio shell): no module imports one of a later group, and no two modules —
nor two packages — import each other, directly or round a loop. The store
thread's half (everything below the trio shell) never imports trio.

The same parse of every module's imports as tests/test_layering.py (the
ones inside functions and under ``if TYPE_CHECKING:`` count too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.test_layering import ROOT, _graph, _loops

NODE = "semq.node"

#: The groups of semq/node/ in the order of their imports (docs/architecture.md):
#: a module imports only from its own group or an earlier one.
ORDER: dict[str, int] = {
    "semq.node": 0, "semq.node.engine": 0, "semq.node.envelope": 0, "semq.node.limits": 0,  # what a document is
    "semq.node.store": 1, "semq.node.rows": 1, "semq.node.batch": 1,  # the schema, rows by name, a batch
    "semq.node.users": 2, "semq.node.large": 2,  # owners both roles consult
    "semq.node.origin": 3, "semq.node.receiver": 3,  # the roles and their tables' owners
    "semq.node.inquiries": 4, "semq.node.housekeeping": 4,  # over both roles
    "semq.node.core": 5,  # the facade
    "semq.node.api": 6,  # NodeClient
    "semq.node.features": 7,  # txn, rpc, dead letters, queues, folders, ...
    # the trio shell
    "semq.node.daemon": 8,
}
#: The trio shell: the only modules of semq/node/ that import trio (the
#: daemon package, whole, and the features' trio tasks). The API imports it
#: only inside its trio methods (``afollow``, ``await_``), which an
#: application calls from trio.
TRIO_PACKAGE = "semq.node.daemon"
TRIO = {"semq.node.features.tasks", "semq.node.daemon.node", "semq.node.daemon.direct"}
TRIO_WHEN_CALLED = {"semq.node.api.following"}
#: Loops still being taken apart elsewhere, each with who and why (remove
#: the entry when it is gone: test_every_allowed_loop_is_still_there).
ALLOWED_LOOPS: dict[frozenset[str], str] = {}


@cache
def _node_graph() -> dict[str, set[str]]:
    """semq.node's modules and the modules of semq.node each imports (a
    name imported from a module counts as that module)."""
    graph = {m: ts for m, ts in _graph().items() if m == NODE or m.startswith(NODE + ".")}
    mods = set(graph)

    def module(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rpartition(".")[0]
        return name

    return {m: {module(t) for t in ts if t == NODE or t.startswith(NODE + ".")} - {m} for m, ts in graph.items()}


def _unit(module: str) -> str:
    """A module's package under semq.node (its group), or the module itself."""
    parts = module.split(".")
    if len(parts) >= 3 and (ROOT.parent / Path(*parts[:3])).is_dir():
        return ".".join(parts[:3])
    return module


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, ts in graph.items():
        out.setdefault(_unit(m), set()).update(_unit(t) for t in ts if _unit(t) != _unit(m))
    return out


def test_every_module_of_semq_node_has_its_place_in_the_order() -> None:
    missing = sorted(m for m in _node_graph() if _unit(m) not in ORDER)
    assert not missing, f"give these a group in ORDER (and docs/architecture.md): {missing}"


def test_no_import_points_up_the_order() -> None:
    wrong = [f"{m} (group {ORDER[_unit(m)]}) imports {t} (group {ORDER[_unit(t)]})"
             for m, ts in _node_graph().items() for t in ts if ORDER[_unit(t)] > ORDER[_unit(m)]]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_modules_import_each_other() -> None:
    loops = [sorted(c) for c in _loops(_node_graph()) if c not in ALLOWED_LOOPS]
    assert not loops, f"import loops between modules of semq.node: {loops}"


def test_no_packages_import_each_other() -> None:
    loops = [sorted(c) for c in _loops(_packages(_node_graph())) if c not in ALLOWED_LOOPS]
    assert not loops, f"import loops between packages of semq.node: {loops}"


def test_every_allowed_loop_is_still_there() -> None:
    found = set(_loops(_node_graph()))
    stale = [sorted(c) for c in ALLOWED_LOOPS if c not in found]
    assert not stale, f"these loops are gone: remove them from ALLOWED_LOOPS: {stale}"


def _imports_trio(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "trio" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trio" and not node.level:
            return True
    return False


def _path(module: str) -> Path:
    base = ROOT.parent / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _in_shell(module: str) -> bool:
    return module in TRIO or module == TRIO_PACKAGE or module.startswith(TRIO_PACKAGE + ".")


def test_the_store_threads_half_never_imports_trio() -> None:
    """Nothing of semq/node/ below the trio shell imports trio, not even
    inside a function (rpc and txn pass their trio tasks to
    semq.node.features.tasks; the chunk sender is semq.node.daemon.large_sender)."""
    wrong = sorted(m for m in _node_graph() if not _in_shell(m) and m not in TRIO_WHEN_CALLED
                   and _imports_trio(_path(m)))
    assert not wrong, wrong
    assert all(_imports_trio(_path(m)) for m in TRIO | TRIO_WHEN_CALLED)  # (the lists stay true)


def test_importing_the_core_the_api_and_the_features_loads_no_trio() -> None:
    """In a fresh interpreter: every module of the store thread's half,
    the API and the features' synchronous modules imported, trio is not."""
    mods = sorted(m for m in _node_graph() if not _in_shell(m))
    code = (f"import importlib, sys\nfor m in {mods!r}:\n    importlib.import_module(m)\n"
            "print('trio' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent)
    assert got.stdout.strip() == "False", got.stdout + got.stderr
