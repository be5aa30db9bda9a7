"""Small rooms (STYLE, "h11 is small rooms"): no module of semq/ over 700
lines and no class over 500, so that a newcomer can read any one of them
at a sitting. There is no exception: generated code and data tables would
be listed here, each with why, and there are none."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "semq"
MAX_FILE = 700
MAX_CLASS = 500
EXCEPTIONS: dict[str, str] = {}  # path relative to semq/ -> why it may be larger


def test_no_module_is_over_700_lines() -> None:
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(ROOT.rglob("*.py"))
           if (n := len(p.read_text("utf-8").splitlines())) > MAX_FILE
           and str(p.relative_to(ROOT)) not in EXCEPTIONS]
    assert not big, "\n".join(big)


def test_no_class_is_over_500_lines() -> None:
    big = []
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and (n := (node.end_lineno or 0) - node.lineno + 1) > MAX_CLASS:
                big.append(f"{p.relative_to(ROOT)}: class {node.name}, {n} lines")
    assert not big, "\n".join(big)
