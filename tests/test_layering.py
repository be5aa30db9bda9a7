"""The package's layering, checked over every module's imports (the ones
inside functions too): a module imports only from its own layer or the
layers below it. From the bottom up, as the folders say:

    umxt_protocol (the wire, and the units' addressing)
      <-  settings (semq.toml, the declared bounds), identity (crypto, keys, pins)
      <-  store (opening, the gate), session (framed connections, admission,
          the ports between layers), tracking (event log, history)
      <-  engines  <-  cores (node and platform stores, cores, the node's features and API)
      <-  daemons  <-  ops  <-  web  <-  cli, testing

and analytics stands apart: it imports nothing of SEMQ but itself (it reads
the event logs, not the daemons). Imports under ``if TYPE_CHECKING:`` count
too: a daemon knows ops only through semq.session.ports, and ops knows the
web console only as the factory the command hands OpsRuntime.

No import loop either, anywhere: not between two modules of one layer, not
through a package's ``__init__`` (a package that re-exports its submodules
is above them; they import each other, never the package)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "semq"

# Module (or package prefix) -> layer; the longest matching prefix decides.
LAYERS: dict[str, int] = {
    "semq.umxt_protocol": 0,
    "semq.settings": 1, "semq.identity": 1,
    "semq.edge": 1,  # the edge's protocol adapters (AS2, AS4): sans-IO, over settings' bounds
    "semq.edge.store": 4, "semq.edge.keys": 4,  # the edge's tables' owner, beside the node's; its key files
    "semq.edge.daemon": 5,  # the edge's trio halves (sender, listener), beside the node's daemon
    "semq.store": 2, "semq.session": 2, "semq.tracking": 2,
    "semq.node.engine": 3, "semq.platform.engine": 3,
    "semq.node": 4, "semq.platform": 4,
    "semq.node.daemon": 5, "semq.platform.daemon": 5,  # (packages: the trio halves)
    "semq.ops": 6,
    # the web console: calls the ops handlers; OpsRuntime serves it through the
    # factory the command hands it (semq.ops.runtime.ConsoleFactory)
    "semq.web": 7,
    "semq.cli": 8, "semq.testing": 8, "semq.__main__": 8,
}
BASE = "semq"  # the package's __init__: only the version, for anyone
APART = "semq.analytics"

# Loops allowed, each with who removes it and why: none. (A loop among
# these modules only would pass; any other loop fails.)
KNOWN_LOOPS: dict[frozenset[str], str] = {}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int | None:
    if module == BASE:
        return 0
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def _is_module(name: str) -> bool:
    path = ROOT.parent / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, module: str) -> set[str]:
    """What ``module`` imports, at the top, inside functions and under
    TYPE_CHECKING alike. ``from P import name`` imports the submodule
    ``P.name`` when there is one, else ``P``: like ``import P.name``, it
    runs P's ``__init__`` first only as the parent every submodule has,
    which is not counted (a package is above its submodules)."""
    tree = ast.parse(path.read_text("utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.add(sub if _is_module(sub) else source)
    return {m for m in out if m == "semq" or m.startswith("semq.")}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p, _module(p)) for p in sorted(ROOT.rglob("*.py"))}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (a name imported from a module is
    that module)."""
    graph = _graph()

    def resolve(name: str) -> str:
        while name not in graph and "." in name:
            name = name.rpartition(".")[0]
        return name

    return {m: {t for t in map(resolve, imports) if t != m and t in graph} for m, imports in graph.items()}


def _loops(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import loops: the strongly connected components of more than one
    module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle(graph: dict[str, set[str]], loop: frozenset[str]) -> list[str]:
    """One shortest way round ``loop``, from its first module back to it."""
    first = min(loop)
    paths = {first: [first]}
    todo = [first]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & loop):
            if w == first:
                return [*paths[v], first]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"{sorted(loop)} is not a loop")  # pragma: no cover


def test_every_module_has_a_layer() -> None:
    missing = [m for m in _graph() if not m.startswith(APART) and _layer(m) is None]
    assert not missing, missing


def test_no_module_imports_from_a_layer_above_it() -> None:
    wrong = []
    for module, imports in _graph().items():
        if module.startswith(APART):
            continue
        mine = _layer(module)
        assert mine is not None
        for target in imports:
            theirs = APART if target.startswith(APART) else _layer(target)
            if theirs == APART:
                continue  # anyone may use the analytics (the CLI runs reports)
            if theirs is not None and theirs > mine:
                wrong.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_analytics_stands_apart() -> None:
    wrong = [f"{m} imports {t}" for m, imports in _graph().items() if m.startswith(APART)
             for t in imports if not t.startswith(APART)]
    assert not wrong, "\n".join(wrong)


def test_no_import_loop() -> None:
    graph = _module_graph()
    loops = [f"{' -> '.join(_cycle(graph, loop))}  (the loop: {', '.join(sorted(loop))})"
             for loop in _loops(graph) if not any(loop <= known for known in KNOWN_LOOPS)]
    assert not loops, "import loops:\n" + "\n".join(sorted(loops))


def test_the_loop_check_finds_loops() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(map(sorted, _loops(graph))) == [["a", "b", "c"], ["e", "e2"]]
    assert _cycle(graph, frozenset({"a", "b", "c"})) == ["a", "b", "c", "a"]
    assert _loops({"a": {"b"}, "b": set()}) == []


def test_the_platform_and_the_node_import_one_way() -> None:
    """The two packages import one way: the platform uses the node's engine
    (its operator actions: semq.platform.engine), the node knows nothing of
    the platform."""

    def package(m: str) -> str:
        return ".".join(m.split(".")[:2])

    packages: dict[str, set[str]] = {"semq.node": set(), "semq.platform": set()}
    for m, imports in _graph().items():
        if package(m) in packages:
            packages[package(m)] |= {package(t) for t in imports if package(t) in packages} - {package(m)}
    assert _loops(packages) == [], packages


#: The sans-IO layers (STYLE 1): the wire format, the settings and bounds,
#: the engines' tables and the cryptography are pure — no event loop, no
#: socket, no store driver. The cores' store-thread halves run on a worker
#: thread: no event loop there either (tests/node/test_node_imports.py holds
#: the node's to it, this test the platform's).
PURE: tuple[str, ...] = ("semq.umxt_protocol", "semq.settings", "semq.node.engine", "semq.platform.engine",
                         "semq.identity.crypto")
# (ssl is not here: crypto builds the TLS contexts the shells use; building one does no I/O.)
IO: frozenset[str] = frozenset({"trio", "socket", "sqlite3", "peewee", "psycopg", "selectors", "asyncio"})
STORE_THREAD: tuple[str, ...] = ("semq.platform",)
SHELLS: tuple[str, ...] = ("semq.platform.daemon",)  # the platform's trio half


def _io_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_sans_io_layers_import_no_io() -> None:
    wrong = [f"{_module(p)} imports {sorted(_io_imports(p) & IO)}" for p in sorted(ROOT.rglob("*.py"))
             if _under(_module(p), PURE) and _io_imports(p) & IO]
    assert not wrong, "\n".join(wrong)


def test_the_platforms_store_thread_half_imports_no_event_loop() -> None:
    wrong = [_module(p) for p in sorted(ROOT.rglob("*.py"))
             if _under(_module(p), STORE_THREAD) and not _under(_module(p), SHELLS) and "trio" in _io_imports(p)]
    assert not wrong, wrong
