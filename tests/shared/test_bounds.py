"""The declared bounds (semq.settings.bounds) are the ones in force: docs/security.md
holds the table as the code prints it, a bound with a semq.toml key is that
key's default, and every named bound is used by the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

import semq.settings.bounds as bounds
from semq.settings.config import SETTINGS, Config

ROOT = Path(__file__).resolve().parents[2]


def test_docs_hold_the_table_the_code_declares() -> None:
    doc = (ROOT / "docs" / "security.md").read_text()
    m = re.search(r"<!-- bounds -->\n(.*?)<!-- /bounds -->", doc, re.S)
    assert m, "docs/security.md has no <!-- bounds --> table"
    assert m.group(1).strip() == bounds.bounds_table().strip(), (
        "docs/security.md's bounds table differs from semq.settings.bounds.bounds_table(); paste its output")


def test_a_bound_with_a_setting_is_that_settings_default() -> None:
    defaults = {f: getattr(Config, f, None) for f in SETTINGS}
    for b in bounds.BOUNDS:
        if b.setting is None:
            continue
        assert b.setting in SETTINGS, f"{b.surface}: {b.what} names {b.setting}, which is no semq.toml key"
        if b.value:  # (0: a bound whose setting is not a number, as direct_from)
            default = defaults[b.setting]
            want = b.value >> 20 if b.unit == "bytes" and b.setting.endswith("_mib") else b.value
            assert default == want, f"{b.setting} defaults to {default}, the table says {want}"


def test_every_named_bound_is_used_by_the_code() -> None:
    sources = "\n".join(p.read_text() for p in (ROOT / "semq").rglob("*.py") if p.name != "bounds.py")
    unused = [name for name in bounds.__all__ if name.isupper() and name != "BOUNDS"
              and not re.search(rf"\b{name}\b", sources)]
    assert not unused, f"declared but used nowhere: {unused}"
