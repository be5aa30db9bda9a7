"""Run one benchmark: ``scripts/bench NAME [args...]``.

NAME is a module of scripts/benchmarks/ (any file not starting with ``_``)
whose ``main(argv: list[str]) -> int`` gets the remaining arguments. With no
NAME: list the benchmarks, then run ``protocol`` (quick, no services needed).
``scripts/bench --list`` only lists them.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH_DIR = HERE / "benchmarks"
DEFAULT = "protocol"


def available() -> dict[str, str]:
    """{name: first docstring line}, read with ast so listing imports nothing
    (some benchmarks pull in heavy or optional libraries)."""
    found = {}
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        except SyntaxError as e:
            doc = f"(cannot be read: {e})"
        found[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return found


def print_list(names: dict[str, str]) -> None:
    print("benchmarks (scripts/bench NAME [args...]):")
    width = max((len(n) for n in names), default=0)
    for name, doc in names.items():
        print(f"  {name.ljust(width)}  {doc}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    names = available()
    if args and args[0] in ("-h", "--help", "--list", "list"):
        print(__doc__.strip().splitlines()[0] if __doc__ else "")
        print_list(names)
        return 0
    if not args:
        print_list(names)
        print()
        name, rest = DEFAULT, []
    else:
        name, rest = args[0], args[1:]
    if name not in names:
        print(f"error: unknown benchmark {name!r}; available: {', '.join(names) or 'none'}",
              file=sys.stderr)
        return 2
    # The benchmarks live in the package scripts/benchmarks (not installed).
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    module = importlib.import_module(f"benchmarks.{name}")
    run = getattr(module, "main", None)
    if not callable(run):
        print(f"error: scripts/benchmarks/{name}.py has no main(argv)", file=sys.stderr)
        return 2
    try:
        code = run(rest)
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
