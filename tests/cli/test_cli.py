"""The ``semq`` command, in process: ``semq.cli.main(argv) -> int`` with
captured output (STYLE 9: errors are one line on stderr, no traceback).

No daemon runs here. Where a test needs documents to have travelled, the
node and platform cores (the sans-IO-backed stores the daemons drive) hand
the frames to each other directly: A's pending-send rows go to the platform,
which stores them for the offline B and answers ACK_SAVE; later the stored
copies go to B. Everything else goes through ``main``.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.node.core import NodeCore
from semq.platform.core import PlatformCore
from semq.umxt_protocol import Endpoint, FrameDecoder, RawFrame

A, B = "10008", "56001"
UNKNOWN_B = f"warning: organization {B} is not known to this node yet; the platform decides whether it exists\n"
ORDER = b"<order id='S0001'><line sku='X-1' qty='3'/></order>\n"


def lk0_line(out: str) -> str:
    """The LK0 ``semq send`` printed, alone on its line: ``10008/1/1/<id>``
    (a store's record ids start at its creation time: docs/exactly-once.md)."""
    assert re.fullmatch(rf"{A}/1/1/[1-9][0-9]*\n", out), out
    return out.strip()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str, *fragments: str) -> str:
    """The error contract: exactly one line, ``error: ...``, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def root(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """P, A and B initialised through the CLI; B registered; nothing running.
    The working directory is ``tmp_path`` and SEMQ_DIR is unset."""
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "platform", "init", "--dir", "P")[0] == 0
    for org in (A, B):
        assert run(capsys, "node", "init", "--dir", org, "--org", org, "--platform", "127.0.0.1:7499")[0] == 0
    assert run(capsys, "platform", "register", "--dir", "P", A, B)[0] == 0
    yield tmp_path


def _frames(chunks: list[bytes]) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(b"".join(chunks))
    return list(dec)


def relay_to_offline_target(root: Path) -> int:
    """A's SS_INIT rows -> the platform, B offline: stored, ACK_SAVE back to A.
    Returns how many DATA frames A sent."""
    a = NodeCore(root / A / "node.sqlite", A)
    p = PlatformCore(root / "P" / "platform.sqlite")
    try:
        sent = a.claim(100).data
        out = p.handle(Endpoint.org(A), _frames(sent), {})  # nobody online
        assert not out.errors, out.errors
        a.handle(_frames(out.sends[Endpoint.org(A)]))
        return len(sent)
    finally:
        a.close()
        p.close()


def deliver_stored(root: Path) -> int:
    """The platform's stored copies for B -> B (as when B connects)."""
    p = PlatformCore(root / "P" / "platform.sqlite")
    b = NodeCore(root / B / "node.sqlite", B)
    try:
        frames, n = p.claim_stored(Endpoint.org(B), 100)
        out = b.handle(_frames(frames))
        assert not out.errors, out.errors
        return n
    finally:
        p.close()
        b.close()


# ---------------------------------------------------------------- init


def test_init_both_roles_writes_config_and_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "platform", "init", "--dir", str(tmp_path / "P"), "--listen", "127.0.0.1:7411")
    assert rc == 0 and "initialised" in out and "127.0.0.1:7411" in out
    assert (tmp_path / "P" / "semq.toml").is_file() and (tmp_path / "P" / "platform.sqlite").is_file()
    rc, out, _ = run(capsys, "node", "init", "--dir", str(tmp_path / "A"), "--org", A,
                     "--platform", "127.0.0.1:7411")
    assert rc == 0 and f"node {A} initialised" in out
    assert (tmp_path / "A" / "node.sqlite").is_file()
    assert 'org = "10008"' in (tmp_path / "A" / "semq.toml").read_text()
    # The data directory holds keys later: owner only.
    assert (tmp_path / "A").stat().st_mode & 0o077 == 0


def test_semq_dir_selects_the_directory(root: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMQ_DIR", str(root / A))
    rc, out, _ = run(capsys, "status")
    assert rc == 0 and out.startswith(f"node {A} ({root / A})")
    # --dir wins over SEMQ_DIR.
    rc, out, _ = run(capsys, "status", "--dir", str(root / "P"))
    assert rc == 0 and out.startswith("platform platform")


# ---------------------------------------------------------------- send


def test_send_without_a_daemon_is_accepted_and_waits_in_ss_init(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "order.xml").write_bytes(ORDER)
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--domain", "trade",
                       "--subtype", "PO", "--key", "S0001", "order.xml")
    assert rc == 0
    lk0 = lk0_line(out)  # the LK0, alone on stdout (scripts can read it)
    assert f"accepted {len(ORDER)} bytes for {B}" in err
    rc, out, _ = run(capsys, "messages", "--dir", A)
    assert rc == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["LK0", "TO", "STATE"]
    assert row.split()[:2] == [lk0, B]  # the state in words, its code in parentheses
    assert row.split(maxsplit=2)[2].startswith("waiting to be sent (SS_INIT)  3    1     0")
    assert header.index("TO") == row.index(f" {B} ") + 1  # the columns line up with a full-size LK0 (which may hold B's digits)
    assert row.endswith("trade/ORDER/PO/S0001")


def test_send_options_reach_the_row(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "r.txt").write_bytes(b"receipt")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "RECEIPT", "--save-fwd", "1",
                       "--no-ack2", "--priority", "7", "-q", "r.txt")
    # B is registered at the platform, but A has never exchanged anything with it: -q keeps the warning.
    assert rc == 0 and lk0_line(out) and err == UNKNOWN_B
    rc, out, _ = run(capsys, "messages", "--dir", A, "--json")
    [row] = json.loads(out)
    assert (row["save_fwd"], row["ack2"], row["state"], row["app_key"]) == (1, False, "SS_INIT", "/RECEIPT//")


def test_send_from_stdin(root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"INV-7 total 12.50\n")))
    rc, out, _ = run(capsys, "send", "--dir", A, "--to", B, "--type", "INVOICE", "-q", "-")
    assert rc == 0 and lk0_line(out)
    relay_to_offline_target(root)
    deliver_stored(root)
    rc, out, _ = run(capsys, "inbox", "--dir", B, "show", "1")
    assert rc == 0 and out.endswith("\n\nINV-7 total 12.50\n")


# ---------------------------------------------------------------- status, inbox, messages


def test_status_follows_a_document_through_the_stores(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "order.xml").write_bytes(ORDER)
    run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--key", "S0001", "order.xml")
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert rc == 0
    assert "daemon: not running" in out and "pending-send: 1 waiting to be sent (SS_INIT)" in out
    rc, out, _ = run(capsys, "status", "--dir", "P")
    assert rc == 0 and "daemon: not running" in out and "stored for: nothing" in out
    assert "known nodes: 10008, 56001" in out

    assert relay_to_offline_target(root) == 1
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert "pending-send: 1 stored at the platform (SS_ACK)" in out  # ACK_SAVE: the platform owns delivery, A awaits ACK2
    rc, out, _ = run(capsys, "status", "--dir", "P")
    assert "stored for: 56001=1 (oldest " in out
    rc, out, _ = run(capsys, "platform", "status", "--dir", "P", "--json")
    data = json.loads(out)
    assert rc == 0 and data["stored"]["56001"]["stored"] == 1 and data["daemon"] is None

    assert deliver_stored(root) == 1
    rc, out, _ = run(capsys, "status", "--dir", B, "--json")
    data = json.loads(out)
    assert (data["role"], data["org"], data["inbox_unread"], data["inbox_total"], data["dedup"]) == (
        "node", B, 1, 1, 1)
    assert data["pending_ack"] == 1  # REACK and REACK2 outstanding (no daemon answered them)
    # The platform keeps its copy until B's ACK reaches it (no daemon carried it).
    rc, out, _ = run(capsys, "status", "--dir", "P", "--json")
    assert json.loads(out)["stored"]["56001"]["stored"] == 1


def test_status_shows_a_live_daemon_from_its_status_file(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = {"pid": os.getpid(), "time_ms": int(time.time() * 1000), "role": "node", "connected": True}
    (root / A / "status.json").write_text(json.dumps(status))
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert rc == 0 and "daemon: running, connected to 127.0.0.1:7499" in out
    # A status file older than a few seconds is a daemon that died.
    (root / A / "status.json").write_text(json.dumps({**status, "time_ms": status["time_ms"] - 60_000}))
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert "daemon: not running" in out


def test_status_shows_the_platform_address_connected_now(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node with several platform addresses says which one it is connected
    to (the daemon writes it), or every one it is trying."""
    status = {"pid": os.getpid(), "time_ms": int(time.time() * 1000), "role": "node", "connected": True,
              "platform": "127.0.0.1:7412", "platforms": ["127.0.0.1:7411", "127.0.0.1:7412"]}
    (root / A / "status.json").write_text(json.dumps(status))
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert rc == 0 and "daemon: running, connected to 127.0.0.1:7412" in out
    rc, out, _ = run(capsys, "status", "--dir", A, "--json")
    assert json.loads(out)["daemon"]["platform"] == "127.0.0.1:7412"
    (root / A / "status.json").write_text(json.dumps({**status, "connected": False, "platform": None}))
    rc, out, _ = run(capsys, "status", "--dir", A)
    assert "daemon: running, NOT connected to 127.0.0.1:7411,127.0.0.1:7412" in out


def test_inbox_list_show_save_ack(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "order.xml").write_bytes(ORDER)
    lk0 = lk0_line(run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--domain", "trade",
                       "--subtype", "PO", "--key", "S0001", "-q", "order.xml")[1])
    relay_to_offline_target(root)
    deliver_stored(root)

    rc, out, err = run(capsys, "inbox", "--dir", B)
    assert rc == 0 and err == "1 document(s)\n"
    header, row = out.splitlines()
    assert header.split() == ["ID", "FROM", "LK0", "APPKEY", "SIZE", "RECEIVED"]
    assert row.split()[:5] == ["1", A, lk0, "trade/ORDER/PO/S0001", str(len(ORDER))]
    assert header.index("APPKEY") == row.index("trade/")
    # A time, and how long ago; never milliseconds since the epoch.
    assert re.search(r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\)$", row), row

    rc, out, _ = run(capsys, "inbox", "--dir", B, "--json")
    [item] = json.loads(out)
    assert item == {"id": 1, "lk0": lk0, "from": A, "app_key": "trade/ORDER/PO/S0001",
                    "from_user": "", "to_user": "", "channel": "", "gap": False,
                    "size": len(ORDER), "received_ms": item["received_ms"], "consumed": False}

    rc, out, _ = run(capsys, "inbox", "--dir", B, "show", "1")
    head, _, body = out.partition("\n\n")
    assert rc == 0 and body == ORDER.decode()
    assert f"lk0: {lk0}\n" in head and "app_key: trade/ORDER/PO/S0001" in head and "save_fwd: 3" in head
    assert re.search(r"\nreceived: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\)\n", head), head
    assert not re.search(r"\d{13}", head.replace(lk0, "")), head  # no raw ms
    rc, out2, _ = run(capsys, "inbox", "--dir", B, "show", lk0)  # by its LK0 as well
    assert rc == 0 and out2.partition("received:")[0] == out.partition("received:")[0]
    assert out2.partition("\n\n")[2] == body

    rc, out, _ = run(capsys, "inbox", "--dir", B, "save", "1", "copy.xml")
    assert rc == 0 and (root / "copy.xml").read_bytes() == ORDER

    rc, out, _ = run(capsys, "inbox", "--dir", B, "ack", "1")
    assert rc == 0 and out == "acknowledged 1\n"
    rc, out, err = run(capsys, "inbox", "--dir", B, "ack", "1")
    assert rc == 0 and out == "" and err.startswith("document 1 was acknowledged already, ")
    rc, out, err = run(capsys, "inbox", "--dir", B, "ack", "999")
    assert rc == 1 and out == ""
    one_error(err, "document 999 is not in the inbox")
    rc, out, err = run(capsys, "inbox", "--dir", B)
    assert out.splitlines()[1:] == [] and err == "0 document(s)\n"
    rc, out, _ = run(capsys, "inbox", "--dir", B, "--all", "--json")
    assert [i["consumed"] for i in json.loads(out)] == [True]


def test_messages_json_and_empty(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "messages", "--dir", A, "--json")
    assert rc == 0 and json.loads(out) == []
    sent = []
    for i in range(3):
        (root / f"d{i}").write_bytes(b"x" * (i + 1))
        sent.append(lk0_line(run(capsys, "send", "--dir", A, "--to", B, "--type", "INVOICE", "--key", f"I{i}",
                                 "-q", f"d{i}")[1]))
    rc, out, _ = run(capsys, "messages", "--dir", A, "--json", "--limit", "2")
    rows = json.loads(out)
    assert [r["lk0"] for r in rows] == sent[:2]
    assert {r["state"] for r in rows} == {"SS_INIT"} and all(r["target"] == B for r in rows)
    rc, out, err = run(capsys, "messages", "--dir", A)
    assert len(out.splitlines()) == 4 and err.startswith("3 message(s)")


# ---------------------------------------------------------------- errors: one line, exit 2


def test_no_config_and_no_semq_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc").write_bytes(b"x")
    for argv in (["status"], ["inbox"], ["messages"], ["send", "--to", B, "--type", "X", "doc"]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and out == ""
        one_error(err, "no configuration at", str(tmp_path / "semq-data" / "semq.toml"), "SEMQ_DIR")
    assert not (tmp_path / "semq-data").exists()


def test_missing_file(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "no-such.xml")
    assert rc == 2 and out == ""
    one_error(err, "no such file: no-such.xml")
    rc, out, _ = run(capsys, "messages", "--dir", A, "--json")
    assert json.loads(out) == []


@pytest.mark.parametrize("argv, fragment", [
    (["node", "init", "--dir", "X", "--org", "a b"], '--org "a b" is not an organization id; allowed: an'
                                                      " organization id: a number of 1 to 64 digits"),
    (["node", "init", "--dir", "X", "--org", ""], '--org "" is not an organization id'),
    (["node", "init", "--dir", "X", "--org", "1" * 65], f'--org "{"1" * 65}" is not an organization id'),
    (["node", "init", "--dir", "X", "--org", "ACME"], '--org "ACME" is not an organization id'),
    (["send", "--dir", A, "--to", "bad id!", "--type", "ORDER", "semq.toml"],
     '--to "bad id!" is not an organization id; allowed: an organization id'),
    (["platform", "register", "--dir", "P", "77000", "no way"], 'organization "no way" is not an organization id'),
    (["platform", "register", "--dir", "P", "ok1"], 'organization "ok1" is not an organization id'),
])
def test_invalid_org_id(root: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    if argv[0] == "send":
        argv = [*argv[:-1], str(root / A / "semq.toml")]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    one_error(err, fragment)
    assert not (root / "X").exists()  # nothing half-created


def test_invalid_document_fields(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(root / A / "semq.toml")
    rc, _, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--priority", "99", f)
    assert rc == 2
    one_error(err, "priority 99 is outside 0..9")
    rc, _, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "T" * 300, f)
    assert rc == 2
    one_error(err, "300 bytes exceeds the 255-byte limit")


def test_init_twice_refuses_to_overwrite(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (root / A / "semq.toml").read_bytes()
    rc, out, err = run(capsys, "node", "init", "--dir", A, "--org", "99999")
    assert rc == 2 and out == ""
    one_error(err, "already holds a configuration; refusing to overwrite it")
    rc, _, err = run(capsys, "platform", "init", "--dir", A)
    assert rc == 2
    one_error(err, "already holds a configuration")
    assert (root / A / "semq.toml").read_bytes() == before


@pytest.mark.parametrize("argv", [
    ["send", "--to", B, "--type", "ORDER", "P/semq.toml"],
    ["inbox"],
    ["messages"],
    ["node", "run"],
])
def test_node_command_on_a_platform_dir(root: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    rc, out, err = run(capsys, *argv, "--dir", "P")
    assert rc == 2 and out == ""
    one_error(err, f"{root / 'P'} holds a platform, not a node")


def test_platform_command_on_a_node_dir(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "platform", "register", "--dir", A, "77000")
    assert rc == 2
    one_error(err, "holds a node, not a platform")


def test_corrupt_store_is_refused_and_left_untouched(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = root / A / "node.sqlite"
    for side in (store.with_name("node.sqlite-wal"), store.with_name("node.sqlite-shm")):
        side.unlink(missing_ok=True)
    garbage = b"this is not a database\x00\xff" * 40
    store.write_bytes(garbage)
    (root / "doc").write_bytes(b"x")
    for argv in (["status"], ["inbox"], ["messages"], ["send", "--to", B, "--type", "X", "doc"]):
        rc, out, err = run(capsys, *argv, "--dir", A)
        # A store problem is a runtime failure (exit 1 in semq.cli's contract),
        # not a usage mistake; the message names the file and refuses to touch it.
        assert rc == 1 and out == ""
        one_error(err, f"node store {store} is not an SQLite database", "refusing to touch it")
    assert store.read_bytes() == garbage
    assert not store.with_name("node.sqlite-wal").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["platform", "init", "--dir", "P2", "--listen", "nonsense:abc"], "port 'abc' is not a number"),
    (["platform", "init", "--dir", "P2", "--listen", ":7410"], "has no host"),
    (["platform", "run", "--dir", "P", "--listen", "127.0.0.1:99999"], "port 99999 is outside 0..65535"),
    (["node", "init", "--dir", "N2", "--org", "1", "--platform", "h:x"], "port 'x' is not a number"),
    (["node", "run", "--dir", A, "--platform", "127.0.0.1:-1"], "port -1 is outside 1..65535"),
])
def test_bad_address(root: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    one_error(err, fragment)
    assert not (root / "P2").exists() and not (root / "N2").exists()


def test_inbox_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inbox", "--dir", B, "show")
    assert rc == 2
    one_error(err, "inbox show needs a document id")
    rc, _, err = run(capsys, "inbox", "--dir", B, "show", "5")
    assert rc == 1
    one_error(err, "document 5 is not in the inbox")
    rc, _, err = run(capsys, "inbox", "--dir", B, "show", f"{A}/1/1/12345")
    assert rc == 1
    one_error(err, f"document {A}/1/1/12345 is not in the inbox")
    rc, _, err = run(capsys, "inbox", "--dir", B, "show", "S0001")
    assert rc == 2
    one_error(err, "'S0001' is neither an inbox document id nor an LK0")
    for bad in ("-5", "0", "10001"):
        rc, _, err = run(capsys, "inbox", "--dir", B, "--limit", bad)
        assert rc == 2
        one_error(err, f"--limit {bad} is outside 1..10000")
    rc, _, err = run(capsys, "inbox", "--dir", B, "--ack")
    assert rc == 2
    one_error(err, "--ack goes with --follow")


def test_inbox_escapes_control_characters_of_another_organizations_appkey(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "order.xml").write_bytes(ORDER)
    evil = "S1\x1b[2J\r\x07"
    lk0 = lk0_line(run(capsys, "send", "--dir", A, "--to", B, "--type", "ORD\nER", "--key", evil, "-q",
                       "order.xml")[1])
    relay_to_offline_target(root)
    deliver_stored(root)
    for argv in (("inbox", "--dir", B), ("inbox", "--dir", B, "show", "1")):
        rc, out, _ = run(capsys, *argv)
        assert rc == 0
        head = out.partition("\n\n")[0] if "show" in argv else out
        assert "\x1b" not in head and "\r" not in head and "\x07" not in head
        assert "ORD\\nER" in head and "S1\\x1b[2J\\r\\x07" in head
    rc, out, _ = run(capsys, "inbox", "--dir", B, "--json")  # JSON keeps the value, escaped by JSON itself
    assert json.loads(out)[0]["app_key"] == f"/ORD\nER//{evil}" and "\x1b" not in out
    assert lk0 in out


def test_inbox_show_writes_only_text_to_a_terminal_unless_raw(
        root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, content that is not UTF-8 text, or holds control
    characters other than newline, carriage return and tab, is refused with
    one line (the document, its size, --raw, semq inbox save) and exit 1;
    --raw writes it; a pipe gets the bytes as they came."""
    docs = {"text": "Zürich order\r\n\tline 2\n".encode(), "binary": b"PK\x03\x04\x00\x00\xff\xfe",
            "escape": b"hello \x1b]0;owned\x07\x1b[2J world\n", "c1": "a \x9b31m b".encode()}
    for name, data in docs.items():
        (root / name).write_bytes(data)
        rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--key", name, "-q", name)
        assert rc == 0, err
    relay_to_offline_target(root)
    deliver_stored(root)
    ids = {name: str(i) for i, name in enumerate(docs, 1)}
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)

    rc, out, err = run(capsys, "inbox", "--dir", B, "show", ids["text"])
    assert rc == 0 and err == "" and out.partition("\n\n")[2] == docs["text"].decode(), (out, err)
    for name in ("binary", "escape", "c1"):
        rc, out, err = run(capsys, "inbox", "--dir", B, "show", ids[name])
        assert rc == 1, name
        head, _, body = out.partition("\n\n")
        assert f"app_key: /ORDER//{name}\n" in head and body == "", (name, body)  # the fields, not the content
        one_error(err, f"document {ids[name]} ({len(docs[name])} bytes) is not text", "--raw",
                  f"semq inbox save {ids[name]} FILE")
    rc, out, err = run(capsys, "inbox", "--dir", B, "show", ids["escape"], "--raw")
    assert rc == 0 and err == "" and out.partition("\n\n")[2] == docs["escape"].decode()

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # a pipe or a file: the bytes as they came
    rc, out, err = run(capsys, "inbox", "--dir", B, "show", ids["escape"])
    assert rc == 0 and err == "" and out.partition("\n\n")[2] == docs["escape"].decode()


def test_text_check_takes_a_character_split_across_blocks() -> None:
    from semq.cli.content import TextCheck, write_content

    data = "é\n€\t".encode()
    for cut in range(len(data) + 1):
        check = TextCheck()
        assert check.feed(data[:cut]) and check.feed(data[cut:]) and check.end(), cut
    check = TextCheck()
    assert check.feed(b"abc\xc3") and not check.end()  # a character cut off at the end is not text
    out = io.BytesIO()
    assert not write_content([b"text first\n", b"then \x00 binary", b"never"], out, text_only=True)
    assert out.getvalue() == b"text first\n"  # a large document stops at its first block that is not text
    out = io.BytesIO()
    assert write_content([b"\x00", b"\xff"], out, text_only=False) and out.getvalue() == b"\x00\xff"


def test_every_inbox_and_receive_option_has_help_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    from semq.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("inbox", "receive"):
        p = sub.choices[name]  # type: ignore[attr-defined]
        assert p.epilog and "examples:" in p.epilog and f"semq {name} " in p.epilog
        for action in p._actions:
            assert action.help, f"semq {name} {action.option_strings or action.dest} has no help"


def test_receive_usage_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "receive", "--dir", B)
    assert rc == 2
    one_error(err, "semq receive needs --exec CMD")
    rc, _, err = run(capsys, "receive", "--dir", B, "--exec", "true", "--max-tries", "0")
    assert rc == 2
    one_error(err, "--max-tries 0 is below 1")
    rc, _, err = run(capsys, "receive", "--dir", B, "--exec", "true", "--backoff", "-1")
    assert rc == 2
    one_error(err, "--backoff -1 is outside")
    rc, out, err = run(capsys, "receive", "--dir", B, "--parked")
    assert rc == 0 and out.split() == ["ID", "LK0", "APPKEY", "TRIES", "LAST", "PARKED", "STDERR"]
    rc, _, err = run(capsys, "receive", "--dir", B, "--retry", "7")
    assert rc == 1
    one_error(err, "document 7 is not in the inbox")


def test_listen_address_in_use(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, _out, err = run(capsys, "platform", "run", "--dir", "P", "--listen", f"127.0.0.1:{port}")
    assert rc in (1, 2)
    one_error(err, "in use")


def test_tune_gc_freezes_start_up_and_raises_the_young_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from semq.cli import GC_THRESHOLDS, tune_gc

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        monkeypatch.setenv("SEMQ_GC_DEFAULTS", "1")
        tune_gc()
        assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
        monkeypatch.delenv("SEMQ_GC_DEFAULTS")
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > frozen + 1000  # the modules and classes of start-up
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


# ---------------------------------------------------------------- direct links


def test_node_init_writes_the_direct_link_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "platform", "init", "--dir", "P")[0] == 0
    rc, out, _ = run(capsys, "node", "init", "--dir", "N", "--org", A, "--enroll-from", "P", "--listen",
                     "127.0.0.1:0", "--announce", "192.0.2.1:7500", "--direct", "only", "--direct-from", f"{B},56002")
    assert rc == 0 and "direct links on 127.0.0.1:0" in out
    from semq.settings.config import load_config

    cfg = load_config(tmp_path / "N")
    assert (cfg.direct_listen, cfg.direct_announce, cfg.direct, cfg.direct_from) == (
        "127.0.0.1:0", "192.0.2.1:7500", "only", f"{B},56002")


@pytest.mark.parametrize(("extra", "fragments"), [
    (["--listen", "127.0.0.1:70000"], ["--listen", "70000", "0..65535"]),
    (["--direct-from", "10008,abc"], ["--direct-from", "'abc'", "organization id"]),
    (["--announce", "host:0"], ["--announce", "host:0"]),
    (["--listen", "127.0.0.1:0", "--no-security"], ["--listen needs security"]),
])
def test_node_init_refuses_bad_direct_link_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    extra: list[str], fragments: list[str]) -> None:
    rc, out, err = run(capsys, "node", "init", "--dir", str(tmp_path / "N"), "--org", A, *extra)
    assert rc == 2 and out == ""
    one_error(err, *fragments)
    assert not (tmp_path / "N" / "semq.toml").exists()


def test_node_run_refuses_listening_without_security(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file = root / A / "semq.toml"
    cfg_file.write_text(cfg_file.read_text().replace("security = true", "security = false"))
    rc, out, err = run(capsys, "node", "run", "--dir", A, "--listen", "127.0.0.1:0")
    assert rc == 2 and out == ""
    one_error(err, "needs security")
