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


# ---------------------------------------------------------------- what can only fail or mislead


def test_platform_register_refuses_what_is_not_an_organization_id(tmp_path: Path) -> None:
    assert semq(tmp_path, "platform", "init", "--dir", "P")[0] == 0
    refused(semq(tmp_path, "platform", "register", "--dir", "P", "77000", "abc"),
            'organization "abc" is not an organization id', "a number of 1 to 64 digits")
    refused(semq(tmp_path, "platform", "register", "--dir", "P", "077000"), "organization \"077000\"")
    with sqlite3.connect(tmp_path / "P" / "platform.sqlite") as c:
        assert c.execute("SELECT count(*) FROM nodes").fetchone()[0] == 0  # not even the good one
    assert semq(tmp_path, "platform", "register", "--dir", "P", "77000")[0] == 0
    refused(semq(tmp_path, "platform", "revoke", "--dir", "P", "abc"), 'organization "abc"')


def test_backup_refuses_a_missing_directory_and_a_name_that_is_not_a_backups(root: Path) -> None:
    refused(semq(root, "backup", "--dir", A, "--out", str(root / "nowhere" / "deeper" / "a.tar")),
            f"the directory {root / 'nowhere' / 'deeper'} does not exist; create it first")
    assert not (root / "nowhere").exists()
    for name in ("a.zip", "a", ".tar", "a.tar.bz2"):
        refused(semq(root, "backup", "--dir", A, "--out", name),
                f"--out {name}: a backup is written as FILE.tar, FILE.tar.gz or FILE.tgz")
    refused(semq(root, "backup", "--dir", A, "--out", B), f"--out {B}", "a backup is written as")
    (root / "d.tar").mkdir()
    refused(semq(root, "backup", "--dir", A, "--out", "d.tar"), "--out d.tar is a directory")
    assert sorted(p.name for p in root.iterdir()) == [A, B, "d.tar"]  # nothing written, no temporary left
    for name in ("a.tar", "a.tar.gz", "a.tgz", "a.sqlite"):
        rc, _out, err = semq(root, "backup", "--dir", A, "--out", name)
        assert rc == 0 and (root / name).is_file(), err


def test_send_refuses_what_can_only_fail_in_one_line(root: Path) -> None:
    (root / "a.xml").write_bytes(b"<a/>")
    (root / "out").mkdir()
    (root / "out" / "x.xml").write_bytes(b"<x/>")
    os.mkfifo(root / "pipe")
    send = ("send", "--dir", A, "--to", B, "--type", "ORDER")
    for seconds in ("-5", "0", "nan", "inf"):
        refused(semq(root, *send, "--expires-in", seconds, "a.xml"),
                f"argument --expires-in: '{seconds}' is not a positive number of seconds")
    refused(semq(root, *send, "/dev/null"),
            "/dev/null is a character device, not a regular file; send a regular file, or - to read standard input")
    refused(semq(root, *send, "pipe"), "pipe is a named pipe, not a regular file")  # (not opened: no hang)
    refused(semq(root, *send, "a.xml", "/dev/null"), "/dev/null is a character device")
    refused(semq(root, *send, "--ndjson", "/dev/null"), "/dev/null is a character device")
    refused(semq(root, *send, "out"),
            "out is a directory; to send each regular file in it as one document, add --each-file")
    refused(semq(root, *send, "a.xml", "out"), "out is a directory", "add --each-file")
    refused(semq(root, *send, "missing.xml"), "no such file: missing.xml")
    assert outbox(root) == 0
    rc, out, err = semq(root, *send, "--each-file", "out")
    assert rc == 0 and out.count(f"{A}/1/1/") == 1 and outbox(root) == 1, err


def test_an_empty_file_is_sent_with_a_warning(root: Path) -> None:
    (root / "empty.xml").write_bytes(b"")
    (root / "out").mkdir()
    for name in ("e1", "e2", "full"):
        (root / "out" / name).write_bytes(b"x" if name == "full" else b"")
    send = ("send", "--dir", A, "--to", B, "--type", "ORDER")
    rc, out, err = semq(root, *send, "empty.xml")
    assert rc == 0 and out.startswith(f"{A}/1/1/") and outbox(root) == 1
    assert "warning: empty.xml is empty (0 bytes); it is sent as an empty document\n" in err
    rc, out, err = semq(root, *send, "-", stdin=b"")
    assert rc == 0 and out.startswith(f"{A}/1/1/") and "warning: standard input is empty (0 bytes)" in err
    rc, out, err = semq(root, *send, "--each-file", "out")
    assert rc == 0 and out.count(f"{A}/1/1/") == 3 and outbox(root) == 5
    assert "warning: 2 files are empty (0 bytes) and are sent as empty documents: out/e1, out/e2\n" in err


def test_the_api_refuses_an_expiry_that_has_passed(root: Path) -> None:
    """The same refusal for an application (``NodeClient.send``, and so the
    user socket): nothing stored. 0 (and None) mean no expiry there."""
    from semq.node.api import NodeClient
    from semq.node.limits import DocumentRefused

    with NodeClient(root / A) as node:
        for seconds in (-5, -0.001, float("nan"), float("inf")):
            with pytest.raises(DocumentRefused, match="is not a positive number of seconds"):
                node.send(B, b"x", data_type="ORDER", expires_in=seconds)
        assert outbox(root) == 0
        node.send(B, b"x", data_type="ORDER", expires_in=0)
        node.send(B, b"x", data_type="ORDER", expires_in=60)
    assert outbox(root) == 2
