"""``semq`` as a person types it, run as a real process (``python -m
semq``): options before, between or after the positionals, and the inputs
that can only fail or mislead refused (or warned about) in one line, exit
2, with nothing stored or created."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

A, B = "10008", "56001"


def semq(cwd: Path, *argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SEMQ_DIR", "SEMQ_TOKEN")}
    r = subprocess.run([sys.executable, "-m", "semq", *argv], cwd=cwd, input=stdin, capture_output=True,
                       timeout=60, env=env)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def refused(result: tuple[int, str, str], *fragments: str) -> str:
    """Exit 2, one ``error:`` line on stderr holding ``fragments``, nothing on stdout."""
    rc, out, err = result
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, err)
    assert "Traceback" not in err and out == "", (out, err)
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for org in (A, B):
        rc, _, err = semq(tmp_path, "node", "init", "--dir", org, "--org", org, "--platform", "127.0.0.1:7499",
                          "--no-security")
        assert rc == 0, err
    return tmp_path


def outbox(root: Path) -> int:
    with sqlite3.connect(root / A / "node.sqlite") as c:
        return int(c.execute("SELECT count(*) FROM outbox").fetchone()[0])


# ---------------------------------------------------------------- options anywhere


def test_options_before_between_and_after_the_positionals(root: Path) -> None:
    rc, token, err = semq(root, "user", "add", "--dir", B, "alice")
    assert rc == 0 and token.startswith("semq_"), err
    rc, out, _ = semq(root, "user", "--dir", B, "list")
    assert rc == 0 and out.startswith("alice ")
    (root / "a.xml").write_bytes(b"<a/>")
    (root / "b.xml").write_bytes(b"<b/>")
    rc, out, err = semq(root, "send", "a.xml", "--dir", A, "--to", B, "b.xml", "--type", "ORDER", "--quiet")
    assert rc == 0 and outbox(root) == 2, err
    rc, out, err = semq(root, "queue", "--dir", A, "create", "invoices")  # before the command's name too
    assert rc == 0, err
    rc, out, err = semq(root, "queue", "list", "--dir", A)
    assert rc == 0 and "invoices" in out, (out, err)
    refused(semq(root, "user", "remove", "--dir", B, "alice", "bob"), "unrecognized arguments: bob")
