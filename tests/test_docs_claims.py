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


def test_the_readme_speaks_to_people_and_its_proofs_are_in_docs_claims() -> None:
    """The README names no test: each of its claims and the test that shows
    it are in docs/claims.md (checked above like every other doc); the
    README's links into docs/ lead somewhere, and it stays short."""
    readme = (ROOT / "README.md").read_text("utf-8")
    cited = _REF.findall(readme)
    assert not cited, f"the README names tests (they belong in docs/claims.md): {cited[:3]}"
    assert "(docs/claims.md)" in readme
    assert len([r for r in _references() if r[0] == "claims.md"]) >= 60
    broken = [link for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", readme) if not (ROOT / link).exists()]
    assert not broken, f"the README links to missing files: {broken}"
    assert len(readme.splitlines()) < 300  # a page a newcomer reads at a sitting; the rest lives in docs/
