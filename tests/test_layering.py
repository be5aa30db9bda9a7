"""The package's layering, checked over every module's imports (the ones
inside functions too): a module imports only from its own layer or the
layers below it. From the bottom up, as the folders say:

    umxt_protocol (the wire, and the units' addressing)
      <-  settings (semq.toml, the declared bounds), identity (crypto, keys, pins)
      <-  store (opening, the gate), session (framed connections, admission,
          the ports between layers), tracking (event log, history)
      <-  engines  <-  cores (node and platform stores, cores, the node's features and API)
      <-  daemons  <-  ops, web  <-  cli, testing

and analytics stands apart: it imports nothing of SEMQ but itself (it reads
the event logs, not the daemons). Imports under ``if TYPE_CHECKING:`` count
too: a daemon knows ops only through semq.session.ports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "semq"

# Module (or package prefix) -> layer; the longest matching prefix decides.
LAYERS: dict[str, int] = {
    "semq.umxt_protocol": 0,
    "semq.settings": 1, "semq.identity": 1,
    "semq.store": 2, "semq.session": 2, "semq.tracking": 2,
    "semq.node.engine": 3, "semq.platform.engine": 3,
    "semq.node": 4, "semq.platform": 4,
    "semq.node.daemon": 5, "semq.platform.daemon": 5, "semq.node.background": 5,
    "semq.node.direct": 5,
    "semq.node.large_sender": 5,  # the daemon's chunk sender (trio), beside the daemon
    "semq.ops": 6,
    "semq.web": 6,  # the web console: served by OpsRuntime beside the admin socket, calling its handlers
    # an operation over a stopped platform, beside backup/restore (it reuses their in-use check)
    "semq.platform.migrate": 6,
    "semq.cli": 7, "semq.testing": 7, "semq.__main__": 7,
}
BASE = "semq"  # the package's __init__: only the version, for anyone
APART = "semq.analytics"


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


def _imports(path: Path, module: str) -> set[str]:
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
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names]
                out |= {target, *(n for n in names if (ROOT.parent / n.replace(".", "/")).exists()
                                  or (ROOT.parent / (n.replace(".", "/") + ".py")).exists())}
            elif node.module:
                out.add(node.module)
    return {m for m in out if m == "semq" or m.startswith("semq.")}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p, _module(p)) for p in sorted(ROOT.rglob("*.py"))}


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
