"""Every test the documentation names as the proof of a claim exists: a
claim whose test was renamed or removed must not keep pointing at it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_REF = re.compile(r"tests/((?:\w+/)?test_\w+\.py)::(test_\w+)")


def _references() -> list[tuple[str, str, str]]:
    refs = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in _REF.finditer(doc.read_text("utf-8")):
            refs.append((doc.name, m.group(1), m.group(2)))
    return refs


def test_the_docs_name_tests() -> None:
    assert len(_references()) >= 10  # docs/security.md's threat table at least


def test_every_named_test_exists() -> None:
    missing = []
    for doc, file, name in _references():
        path = ROOT / "tests" / file
        if not path.exists() or not re.search(rf"^(async )?def {name}\(", path.read_text("utf-8"), re.M):
            missing.append(f"{doc}: tests/{file}::{name}")
    assert not missing, "the docs name tests that do not exist:\n" + "\n".join(missing)
