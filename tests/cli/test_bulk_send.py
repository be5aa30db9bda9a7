"""``semq send`` with many documents (several files, a directory, NDJSON)
and ``semq watch``'s command line, in process (semq.cli.main)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.cli.bulk import format_size
from semq.node.limits import MAX_DOCUMENT_SIZE

A, B, C = "10008", "56001", "77000"
SUMMARY = re.compile(r"accepted (\d+) documents? \(([0-9.]+ (?:bytes|KiB|MiB|GiB))\) for (.+) in (\d+(?:\.\d\d)?) s:"
                     r" stored in this node, which sends them \('semq messages' shows how far each got\)")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith("error: ") and "Traceback" not in err, lines[0]
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


def rows(root: Path) -> list[tuple[int, str, str, str, int, bytes]]:
    with sqlite3.connect(root / A / "node.sqlite") as c:
        return c.execute("SELECT id, target_id, data_type, key, priority, app_data FROM outbox ORDER BY id").fetchall()


def lk0s(out: str) -> list[int]:
    lines = out.splitlines()
    assert all(re.fullmatch(rf"{A}/1/1/[1-9][0-9]*", line) for line in lines), out
    return [int(line.rsplit("/", 1)[1]) for line in lines]


@pytest.fixture
def root(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    for org in (A, B):
        assert run(capsys, "node", "init", "--dir", org, "--org", org, "--platform", "127.0.0.1:7499",
                   "--no-security")[0] == 0
    yield tmp_path


def stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


# ---------------------------------------------------------------- files and directories


def test_several_files_one_lk0_each_in_order_and_a_summary(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(5):
        (root / f"f{i}.xml").write_bytes(f"<doc n='{i}'/>".encode())
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--key-from-name", "--batch", "2",
                       "f3.xml", "f1.xml", "f4.xml", "f0.xml", "f2.xml")
    assert rc == 0
    ids = lk0s(out)
    got = rows(root)
    assert [r[0] for r in got] == ids  # input order
    assert [(r[3], r[5]) for r in got] == [(f"f{i}", f"<doc n='{i}'/>".encode()) for i in (3, 1, 4, 0, 2)]
    warning, summary = err.splitlines()
    assert warning.startswith(f"warning: organization {B} is not known")
    m = SUMMARY.fullmatch(summary)
    assert m and m.group(1) == "5" and m.group(2) == "60 bytes" and m.group(3) == B, summary


def test_a_directory_sends_its_regular_files_in_name_order(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = root / "out"
    d.mkdir()
    for name in ("b.csv", "a.csv", "c.csv"):
        (d / name).write_bytes(name.encode())
    (d / "sub").mkdir()
    (d / "sub" / "deeper.csv").write_bytes(b"not taken")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "CSV", "-q", "out")
    assert (rc, out) == (2, "") and rows(root) == []  # a directory only with --each-file
    one_error(err, "out is a directory; to send each regular file in it as one document, add --each-file")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "CSV", "-q", "out", "--each-file")
    assert rc == 0 and len(lk0s(out)) == 3
    assert [r[5] for r in rows(root)] == [b"a.csv", b"b.csv", b"c.csv"]
    assert "accepted" not in err  # -q: no summary


def test_one_file_too_large_refuses_them_all_before_anything_is_sent(root: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (root / "ok.xml").write_bytes(b"<ok/>")
    with (root / "huge.bin").open("wb") as f:
        f.truncate(MAX_DOCUMENT_SIZE + 1)
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "X", "ok.xml", "huge.bin", "ok.xml")
    assert rc == 2 and out == ""
    one_error(err, "huge.bin: document of", f"exceeds the {MAX_DOCUMENT_SIZE}-byte limit")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "X", "ok.xml", "missing.xml")
    assert rc == 2 and out == ""
    one_error(err, "no such file: missing.xml")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "X", "ok.xml", "-")
    assert rc == 2
    one_error(err, "- (standard input) is one document alone")
    assert rows(root) == []


def test_type_is_required_except_with_ndjson(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "a").write_bytes(b"a")
    for files in (["a"], ["a", "a"]):
        rc, out, err = run(capsys, "send", "--dir", A, "--to", B, *files)
        assert rc == 2 and out == ""
        one_error(err, "--type is required")


def test_one_file_still_sends_as_before(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "INV-9.xml").write_bytes(b"<i/>")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "INVOICE", "--key-from-name", "INV-9.xml")
    assert rc == 0 and len(lk0s(out)) == 1
    assert "accepted 4 bytes for 56001 (SaveFwd=3, Ack2=1)" in err
    assert [r[3] for r in rows(root)] == ["INV-9"]


# ---------------------------------------------------------------- NDJSON


def test_ndjson_lines_with_text_base64_and_files_and_their_overrides(root: Path, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "scan.pdf").write_bytes(b"%PDF-1.7")
    lines = [
        {"data": "<order n='1'/>", "key": "S1"},
        {"data_b64": base64.b64encode(b"\x00\x01binary").decode(), "type": "BLOB", "priority": 5},
        {"file": "scan.pdf", "type": "SCAN", "to": C},
        {"data": "two orgs"},
    ]
    stdin(monkeypatch, "".join(json.dumps(x) + "\n" for x in lines).encode() + b"\n")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "ORDER", "--key-from-name", "--ndjson", "-")
    assert rc == 0, err
    ids = lk0s(out)
    got = rows(root)
    assert [r[0] for r in got] == ids
    assert [r[1:] for r in got] == [
        (B, "ORDER", "S1", 0, b"<order n='1'/>"),
        (B, "BLOB", "", 5, b"\x00\x01binary"),
        (C, "SCAN", "scan", 0, b"%PDF-1.7"),
        (B, "ORDER", "", 0, b"two orgs"),
    ]
    assert f"warning: organization {C} is not known" in err
    m = SUMMARY.fullmatch(err.splitlines()[-1])
    assert m and m.group(1) == "4" and m.group(3) == f"{B}, {C}", err


def test_a_bad_line_stops_with_earlier_batches_accepted_and_nothing_of_its_batch(
        root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    good = [json.dumps({"data": f"d{i}"}) for i in range(5)]
    good[3] = json.dumps({"data": "x", "key": "K" * 300})
    stdin(monkeypatch, ("\n".join(good) + "\n").encode())
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--ndjson", "--batch", "2", "-")
    assert rc == 2
    one_error(err, "line 4: AppKey key of 300 bytes exceeds the 255-byte limit")
    assert len(lk0s(out)) == 2  # the first batch (lines 1-2) is accepted and durable ...
    assert [r[5] for r in rows(root)] == [b"d0", b"d1"]  # ... nothing of lines 3-4's


@pytest.mark.parametrize("line, fragment", [
    (b"not json", "line 2: not a JSON object"),
    (b"[1, 2]", "line 2: not a JSON object but list"),
    (b'{"data": "x", "colour": "red"}', 'line 2: unknown field "colour"; allowed: data, data_b64, file'),
    (b'{"data": "x", "data_b64": "eA=="}', "line 2: needs exactly one of data, data_b64, file (has data, data_b64)"),
    (b'{"key": "x"}', "line 2: needs exactly one of data, data_b64, file (has none)"),
    (b'{"data_b64": "***"}', "line 2: data_b64 is not base64"),
    (b'{"file": "nowhere.xml"}', "line 2: no such file: nowhere.xml"),
    (b'{"data": 7}', "line 2: data is int, not a string"),
    (b'{"data": "x", "priority": 10}', "line 2: priority 10 is outside 0..9"),
    (b'{"data": "x", "to": "ACME"}', 'line 2: --to "ACME" is not an organization id'),
    (b'{"data": "x", "to": "10008"}', "line 2: --to 10008 is this node's own organization"),
])
def test_bad_ndjson_lines_are_named_with_their_fault(root: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, line: bytes,
                                                     fragment: str) -> None:
    stdin(monkeypatch, b'{"data": "first"}\n' + line + b"\n")
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--ndjson", "-")
    assert rc == 2 and out == ""
    one_error(err, fragment)
    assert rows(root) == []


def test_ndjson_from_a_file_and_a_thousand_lines_in_batches(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "docs.ndjson").write_text("".join(json.dumps({"data": f"n{i}", "key": f"K{i}"}) + "\n"
                                              for i in range(2500)))
    start = time.monotonic()
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--ndjson", "docs.ndjson")
    assert rc == 0 and time.monotonic() - start < 30
    assert len(lk0s(out)) == 2500
    got = rows(root)
    assert [r[3] for r in got] == [f"K{i}" for i in range(2500)]
    m = SUMMARY.fullmatch(err.splitlines()[-1])
    assert m and m.group(1) == "2500"


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1024, 3_565_158, 5 << 30)] == \
        ["0 bytes", "1023 bytes", "1.0 KiB", "3.4 MiB", "5.0 GiB"]


def test_send_help_documents_every_option_and_gives_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from semq.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("send", "watch"):
        cmd = sub.choices[name]  # type: ignore[attr-defined]
        missing = [a.option_strings or a.dest for a in cmd._actions if not a.help]
        assert missing == [], f"{name}: options without help: {missing}"
        assert cmd.epilog and "examples:" in cmd.epilog and f"semq {name} " in cmd.epilog


# ---------------------------------------------------------------- semq watch, its command line


@pytest.mark.parametrize("argv, fragment", [
    (["watch"], "nothing to watch"),
    (["watch", "--outbox", "out"], "--outbox needs --to ORG"),
    (["watch", "--outbox", "nowhere", "--to", B], "--outbox nowhere: no such directory"),
    (["watch", "--outbox", "out", "--inbox", "out", "--to", B], "are the same directory"),
    (["watch", "--outbox", "out", "--to", "ACME"], '--to "ACME" is not an organization id'),
    (["watch", "--outbox", "out", "--to", B, "--key", "k", "--key-from-name"], "give one"),
    (["watch", "--outbox", "out", "--to", B, "--priority", "11"], "--priority 11 is outside 0..9"),
    (["watch", "--inbox", "out", "--inbox-ext", "a/b"], "extension 'a/b'"),
    (["watch", "--outbox", "out", "--to", B, "--settle", "-1"], "--settle -1 is outside 0..86400 seconds"),
    (["watch", "--outbox", "out", "--to", B, "--settle", "nan"], "--settle nan is outside 0..86400 seconds"),
])
def test_watch_refuses_mistakes_with_one_line(root: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                              fragment: str) -> None:
    (root / "out").mkdir()
    rc, out, err = run(capsys, *argv, "--dir", A)
    assert rc == 2 and out == ""
    one_error(err, fragment)


def test_watch_sends_a_folder_and_stops_on_sigterm_with_exit_0(root: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = root / "out"
    out.mkdir()
    for i in range(3):
        (out / f"INV-{i}.xml").write_bytes(f"<i n='{i}'/>".encode())
    (out / "note.txt.part").write_bytes(b"still copying")

    def stop_when_sent() -> None:  # bounded: SIGTERM after at most 20 s whatever happened
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(list((out / "sent").glob("*.xml"))) < 3:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=stop_when_sent, daemon=True)
    t.start()
    rc, stdout, err = run(capsys, "watch", "--dir", A, "--outbox", "out", "--to", B, "--type", "INVOICE",
                          "--key-from-name", "--interval", "0.2")
    t.join(timeout=25)
    assert rc == 0 and "Traceback" not in err
    assert err.splitlines()[-1] == "stopped (SIGTERM)"
    lines = stdout.splitlines()
    assert sorted(line.split(" -> ")[0] for line in lines) == [f"sent: INV-{i}.xml" for i in range(3)]
    assert sorted(r[3] for r in rows(root)) == ["INV-0", "INV-1", "INV-2"]
    assert (out / "note.txt.part").exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was put back


def test_a_second_watcher_on_one_folder_is_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    (root / "out").mkdir()
    with open(root / "out" / ".semq-watch.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        rc, _, err = run(capsys, "watch", "--dir", A, "--outbox", "out", "--to", B)
    assert rc == 2
    one_error(err, "is watched by another process already")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_progress_bar_on_a_terminal_only(root: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("semq.cli.bulk.PROGRESS_DELAY", 0)  # (a real run shows it after half a second)
    d = root / "out"
    d.mkdir()
    for i in range(6):
        (d / f"{i}.txt").write_bytes(b"x" * 1000)
    rc, out, err = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--batch", "2", "--each-file", "out")
    assert rc == 0 and "%|" not in err and len(lk0s(out)) == 6  # not a terminal: no bar
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    rc, out, _ = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--batch", "2", "--each-file", "out")
    assert rc == 0 and len(lk0s(out)) == 6  # stdout: only the LK0s
    shown = term.getvalue()
    assert "%|" in shown and "/5.86k [" in shown and SUMMARY.search(shown), shown
    # the total and the time left ([elapsed<left]), and the documents beside the bytes
    assert re.search(r"/5\.86k \[\d\d:\d\d<\d\d:\d\d", shown) and "4 of 6 documents" in shown, shown
    (root / "docs.ndjson").write_bytes(b"".join(json.dumps({"data": str(i)}).encode() + b"\n\n" for i in range(7)))
    term.seek(0)
    term.truncate()
    rc, out, _ = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--batch", "2", "--ndjson", "docs.ndjson")
    assert rc == 0 and len(lk0s(out)) == 7  # an NDJSON file: its documents counted first (blank lines not)
    assert re.search(r"\b4/7 \[\d\d:\d\d<\d\d:\d\d", term.getvalue()), term.getvalue()
    stdin(monkeypatch, b"".join(json.dumps({"data": str(i)}).encode() + b"\n" for i in range(5)))
    term.seek(0)
    term.truncate()
    rc, out, _ = run(capsys, "send", "--dir", A, "--to", B, "--type", "T", "--batch", "2", "--ndjson", "-")
    assert rc == 0 and len(lk0s(out)) == 5 and "4 documents [" in term.getvalue(), term.getvalue()
