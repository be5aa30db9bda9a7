"""Folders (semq.node.features.folders), in process: an outbox folder's scans, the
(name, digest) record that survives a crash between the commit and the
move, failed files with their reasons, and the inbox folder's sanitized
names and atomic writes. No daemon: documents reach B's inbox through the
node and platform cores, as in tests/cli/test_cli.py."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.node.api import InboxItem, NodeClient
from semq.node.core import NodeCore
from semq.node.features import folders
from semq.node.features.folders import (
    INBOX_KEY_MAX,
    FolderOptions,
    InboxFolder,
    OutboxFolder,
    inbox_file_name,
    safe_name_part,
    write_durably,
)
from semq.node.limits import MAX_DOCUMENT_SIZE
from semq.platform.core import PlatformCore
from semq.umxt_protocol import LK0, AppKey, Endpoint, FrameDecoder, RawFrame

A, B = "10008", "56001"


class Crash(BaseException):
    """What a SIGKILL leaves: the process stops where it is (no cleanup)."""


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Platform P and nodes A and B (no security: the cores relay in process)."""
    assert main(["platform", "init", "--dir", str(tmp_path / "P"), "--no-security"]) == 0
    for org in (A, B):
        assert main(["node", "init", "--dir", str(tmp_path / org), "--org", org, "--platform",
                     "127.0.0.1:7499", "--no-security"]) == 0
    assert main(["platform", "register", "--dir", str(tmp_path / "P"), A, B]) == 0
    (tmp_path / "out").mkdir()
    (tmp_path / "in").mkdir()
    yield tmp_path


def _outbox(root: Path, node: NodeClient, *, settle: float = 0.0, **kw: object) -> OutboxFolder:
    """The folder ``out`` with inotify; ``settle`` 0: a file no event spoke
    of (dropped before the folder was watched) is ready at the first scan."""
    return OutboxFolder(node, root / "out", FolderOptions(to=B, data_type="INVOICE", **kw),  # type: ignore[arg-type]
                        settle=settle)


def _drop(folder: Path, name: str, data: bytes) -> None:
    """As a writer should: written under a .tmp name, then renamed in."""
    (folder / f"{name}.tmp").write_bytes(data)
    os.replace(folder / f"{name}.tmp", folder / name)


def _outbox_rows(root: Path) -> list[tuple[int, str, bytes]]:
    with sqlite3.connect(root / A / "node.sqlite") as c:
        return c.execute("SELECT id, key, app_data FROM outbox ORDER BY id").fetchall()


def _watch_rows(root: Path) -> list[tuple[bytes, bytes, str, int | None]]:
    with sqlite3.connect(root / A / "node.sqlite") as c:
        return c.execute("SELECT name, sha256, lk0, moved_ms FROM watch_files ORDER BY id").fetchall()


def test_a_scan_sends_complete_files_once_unchanged_and_moves_them_to_sent(root: Path) -> None:
    out = root / "out"
    _drop(out, "INV-1.xml", b"<invoice n='1'/>")
    _drop(out, "INV-2.xml", b"<invoice n='2'/>")
    (out / ".hidden").write_bytes(b"not mine")
    (out / "INV-3.xml.tmp").write_bytes(b"being written")
    (out / "INV-4.part").write_bytes(b"being copied")
    (out / "sub").mkdir()
    with NodeClient(root / A) as node:
        folder = _outbox(root, node, key_from_name=True)
        done = folder.scan()
        assert folder.scan() == []
    assert [(o.kind, o.name) for o in done] == [("sent", "INV-1.xml"), ("sent", "INV-2.xml")]
    rows = _outbox_rows(root)
    assert [(key, data) for _, key, data in rows] == [("INV-1", b"<invoice n='1'/>"), ("INV-2", b"<invoice n='2'/>")]
    assert [o.detail for o in done] == [f"{A}/1/1/{rid}" for rid, _, _ in rows]
    assert done[0].line() == f"sent: INV-1.xml -> {A}/1/1/{rows[0][0]}"
    assert sorted(p.name for p in (out / "sent").iterdir()) == ["INV-1.xml", "INV-2.xml"]
    assert sorted(p.name for p in out.iterdir()) == [".hidden", "INV-3.xml.tmp", "INV-4.part", "failed", "sent", "sub"]
    watch = _watch_rows(root)
    assert [(name, lk0) for name, _, lk0, _ in watch] == [(b"INV-1.xml", done[0].detail), (b"INV-2.xml", done[1].detail)]
    assert all(moved is not None for *_, moved in watch)


def test_a_file_still_being_written_waits_for_its_writer_to_close_it(root: Path) -> None:
    """However long the writer pauses (here with no settle time at all),
    the file is not taken before its writer closes it."""
    out = root / "out"
    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        assert folder.events is not None, folder.events_off
        with (out / "big.csv").open("wb") as f:
            f.write(b"a,b\n")
            f.flush()
            assert folder.scan() == []  # written, not closed
            time.sleep(0.05)
            assert folder.scan() == []
            f.write(b"1,2\n")
        [o] = folder.scan()  # closed: taken whole
        # Closed by one writer while another process still holds it open for
        # writing (seen in /proc): it waits for that one's close too.
        with (out / "more.csv").open("ab") as f:
            f.write(b"x\ny\n")
            f.flush()
            holder = subprocess.Popen(["sleep", "30"], stdout=f)
        try:
            assert folder.scan() == []
        finally:
            holder.kill()
            holder.wait(timeout=10)
        [o2] = folder.scan()
    assert (o.kind, o2.kind) == ("sent", "sent")
    assert [data for *_, data in _outbox_rows(root)] == [b"a,b\n1,2\n", b"x\ny\n"]


def test_a_crash_between_the_commit_and_the_move_sends_nothing_twice(root: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = root / "out"
    for i in range(3):
        _drop(out, f"O{i}.xml", f"<order n='{i}'/>".encode())

    def crash(*_: object) -> None:
        raise Crash

    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        with monkeypatch.context() as m:
            m.setattr(OutboxFolder, "_move_sent", crash)
            with pytest.raises(Crash):
                folder.scan()
    before = _outbox_rows(root)
    assert len(before) == 3  # committed with their rows ...
    assert sorted(p.name for p in out.glob("O*.xml")) == ["O0.xml", "O1.xml", "O2.xml"]  # ... files not moved
    assert [moved for *_, moved in _watch_rows(root)] == [None, None, None]

    with NodeClient(root / A) as node:  # the watcher started again: its first scan moves them
        folder = _outbox(root, node)
        done = folder.scan()
        assert folder.scan() == []
    assert [o.kind for o in done] == ["recovered"] * 3
    assert [o.detail for o in done] == [f"{A}/1/1/{rid}" for rid, _, _ in before]
    assert "accepted before a restart; not sent again" in done[0].line()
    assert _outbox_rows(root) == before  # not one document more
    assert sorted(p.name for p in (out / "sent").iterdir()) == ["O0.xml", "O1.xml", "O2.xml"]
    assert all(moved is not None for *_, moved in _watch_rows(root))


def test_a_crash_between_the_move_and_its_record_leaves_no_stale_claim(root: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is in sent/ but its row still says "not moved": the next
    scan sees the file gone and marks the row; the same name and content
    dropped again later is a new file, sent again."""
    out = root / "out"
    _drop(out, "R.xml", b"<r/>")
    calls = []

    def crash_on_second(self: OutboxFolder, rows: object) -> None:
        calls.append(1)
        if len(calls) == 1:  # (the first is the scan's look for rows whose file left)
            return real(self, rows)
        raise Crash

    real = OutboxFolder._mark_moved
    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        with monkeypatch.context() as m:
            m.setattr(OutboxFolder, "_mark_moved", crash_on_second)
            with pytest.raises(Crash):
                folder.scan()
    assert (out / "sent" / "R.xml").exists() and [moved for *_, moved in _watch_rows(root)] == [None]
    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        assert folder.scan() == []
        assert _watch_rows(root)[0][3] is not None  # its file left the folder: marked moved
        _drop(out, "R.xml", b"<r/>")
        [o] = folder.scan()
    assert o.kind == "sent" and len(_outbox_rows(root)) == 2
    assert sorted(p.name for p in (out / "sent").iterdir()) == ["R.1.xml", "R.xml"]  # a name clash: a suffix


def test_files_that_cannot_be_sent_go_to_failed_with_one_line_naming_the_value_and_the_limit(root: Path) -> None:
    out = root / "out"
    with (out / "huge.bin").open("wb") as f:
        f.truncate(MAX_DOCUMENT_SIZE + 1)  # sparse: no disk used
    bad = os.fsdecode(b"caf\xe9.xml")  # not UTF-8: no valid AppKey key
    (out / bad).write_bytes(b"<x/>")
    _drop(out, "ok.xml", b"<ok/>")
    with NodeClient(root / A) as node:
        folder = _outbox(root, node, key_from_name=True)
        done = {o.name: o for o in folder.scan()}
    assert done["ok.xml"].kind == "sent"
    assert done["huge.bin"].kind == "failed"
    reason = (out / "failed" / "huge.bin.reason.txt").read_text()
    assert reason == f"document of {MAX_DOCUMENT_SIZE + 1} bytes exceeds the {MAX_DOCUMENT_SIZE}-byte limit for one document\n"
    assert done["huge.bin"].line() == f"failed: huge.bin: {reason.strip()}"
    assert done[bad].kind == "failed" and "is not valid UTF-8" in done[bad].detail
    assert (out / "failed" / bad).exists()
    assert "is not valid UTF-8" in (out / "failed" / f"{bad}.reason.txt").read_text()
    assert done[bad].line().startswith("failed: caf\\xe9.xml: ")  # one printable line
    assert [key for _, key, _ in _outbox_rows(root)] == ["ok"]


def test_a_refused_document_fails_alone_and_the_rest_of_its_batch_goes(root: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = root / "out"
    for name in ("a.xml", "b.xml", "c.xml"):
        _drop(out, name, name.encode())
    real = FolderOptions.document

    def refuse_b(self: FolderOptions, name: str, data: bytes) -> dict[str, object]:
        doc = real(self, name, data)
        if name == "b.xml":
            doc["priority"] = 42  # refused by the node's checks at accept time
        return doc

    monkeypatch.setattr(FolderOptions, "document", refuse_b)
    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        done = {o.name: o for o in folder.scan()}
    assert (done["a.xml"].kind, done["b.xml"].kind, done["c.xml"].kind) == ("sent", "failed", "sent")
    assert "priority 42 is outside 0..9" in done["b.xml"].detail
    assert len(_outbox_rows(root)) == 2


def test_safe_name_part_defuses_hostile_keys() -> None:
    assert safe_name_part("../../etc/passwd") == "____etc_passwd"
    assert "/" not in safe_name_part("a/b/../c") and ".." not in safe_name_part("a/b/../c")
    assert safe_name_part("evil\x00name\nx\ty\x7f") == "evil_name_x_y_"
    assert safe_name_part("...hidden") == "_hidden"
    assert safe_name_part(".profile") == "profile"
    assert safe_name_part("Zürich Ω") == "Z_rich__"
    assert len(safe_name_part("K" * 1000)) == INBOX_KEY_MAX
    assert safe_name_part("INV-0042_v1.2") == "INV-0042_v1.2"
    # No name starts with '-': a program given the file must not read it as an option.
    assert safe_name_part("-rf") == "_rf"
    assert safe_name_part("--help") == "_-help"
    assert safe_name_part(".-x") == "_x" and safe_name_part("-") == "_"


def _item(key: str, record: int = 42) -> InboxItem:
    return InboxItem(id=1, lk0=LK0(endpoint=Endpoint.org(A), record_id=record), app_key=AppKey(key=key),
                     save_fwd=3, priority=0, created_ms=0, received_ms=0, encrypted=False, app_data=b"",
                     consumed_ms=None)


def test_inbox_file_names_are_deterministic_by_lk0_and_safe() -> None:
    assert inbox_file_name(_item("INV-0042")) == f"INV-0042__{A}-1-1-42.bin"
    assert inbox_file_name(_item("")) == f"{A}-1-1-42.bin"
    assert inbox_file_name(_item("x"), "xml") == f"x__{A}-1-1-42.xml"
    for hostile in ("../../etc/passwd", "a\x00b", "line\nbreak", "/abs", "..", "." * 50):
        name = inbox_file_name(_item(hostile))
        assert "/" not in name and not name.startswith(".") and ".." not in name
        assert all(c.isprintable() for c in name), name
        assert name.endswith(f"{A}-1-1-42.bin")
    assert inbox_file_name(_item("../../etc/passwd")) == inbox_file_name(_item("../../etc/passwd"))


def test_write_durably_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    p = write_durably(tmp_path, "a.bin", b"first")
    assert p == tmp_path / "a.bin" and p.read_bytes() == b"first"
    write_durably(tmp_path, "a.bin", b"second")
    assert [c.name for c in tmp_path.iterdir()] == ["a.bin"] and p.read_bytes() == b"second"


# ---------------------------------------------------------------- the inbox folder


def _frames(chunks: list[bytes]) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(b"".join(chunks))
    return list(dec)


def _deliver(root: Path) -> None:
    """A's pending documents -> the platform (B offline: stored) -> B's inbox."""
    a = NodeCore(root / A / "node.sqlite", A)
    p = PlatformCore(root / "P" / "platform.sqlite")
    b = NodeCore(root / B / "node.sqlite", B)
    try:
        out = p.handle(Endpoint.org(A), _frames(a.claim(100).data), {})
        assert not out.errors, out.errors
        frames, _ = p.claim_stored(Endpoint.org(B), 100)
        assert not b.handle(_frames(frames)).errors
    finally:
        a.close()
        p.close()
        b.close()


def test_the_inbox_folder_writes_each_document_once_then_acknowledges_it(root: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ["INV-1", "../../etc/passwd", "nul\x00and\nnewline", ""]
    with NodeClient(root / A) as node:
        lk0s = node.send_many([dict(to=B, data=f"doc {i}".encode(), key=k) for i, k in enumerate(keys)])
    _deliver(root)
    inbox = root / "in"

    def crash(*_: object) -> None:
        raise Crash

    with NodeClient(root / B) as node:
        with monkeypatch.context() as m:  # a crash after the renames, before the acknowledgement
            m.setattr(NodeClient, "acknowledge", crash)
            with pytest.raises(Crash):
                InboxFolder(node, inbox).drain()
        first = sorted(p.name for p in inbox.iterdir())
        assert len(first) == 4 and len(node.inbox(unread=True)) == 4  # written, not acknowledged
        done = InboxFolder(node, inbox).drain()  # started again: the same names, written again
        assert sorted(p.name for p in inbox.iterdir()) == first
        assert node.inbox(unread=True) == []
        assert InboxFolder(node, inbox).drain() == []
    assert [o.kind for o in done] == ["received"] * 4
    assert done[0].line() == f"received: {inbox / done[0].name}"
    by_lk0 = {str(lk0).replace("/", "-"): f"doc {i}".encode() for i, lk0 in enumerate(lk0s)}
    for name in first:
        assert not name.startswith(".") and (inbox / name).resolve().parent == inbox.resolve()
        lk0 = name.rsplit("__", 1)[-1].removesuffix(".bin")
        assert (inbox / name).read_bytes() == by_lk0.pop(lk0)
    assert by_lk0 == {}
    assert f"INV-1__{str(lk0s[0]).replace('/', '-')}.bin" in first
    assert not list((root / "etc").glob("*")) and not (root / "etc").exists()


def test_a_key_that_looks_like_an_option_never_starts_an_inbox_file_name(root: Path) -> None:
    """Documents keyed ``-rf`` and ``--help`` are written as ``_rf__...``
    and ``_-help__...``: a command given the folder's files by a glob
    (``cat *.bin``) reads them as files, not as its options; ``semq watch``
    prints absolute paths."""
    import subprocess

    keys = ["-rf", "--help", "-n"]
    with NodeClient(root / A) as node:
        node.send_many([dict(to=B, data=f"doc {k}\n".encode(), key=k) for k in keys])
    _deliver(root)
    inbox = root / "in"
    with NodeClient(root / B) as node:
        done = InboxFolder(node, inbox).drain()
    names = sorted(p.name for p in inbox.iterdir())
    assert len(names) == 3 and not any(n.startswith("-") for n in names), names
    assert {n.split("__")[0] for n in names} == {"_rf", "_-help", "_n"}
    for o in done:
        path = o.line().removeprefix("received: ")
        assert Path(path).is_absolute() and Path(path).parent == inbox.resolve()
    r = subprocess.run(["sh", "-c", "cat *.bin"], cwd=inbox, capture_output=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.decode().splitlines()) == sorted(f"doc {k}" for k in keys)


def test_an_inbox_extension_must_be_letters_or_digits(root: Path) -> None:
    with NodeClient(root / B) as node, pytest.raises(ValueError, match=re.escape("extension '../x'")):
        InboxFolder(node, root / "in", ext="../x")
    assert folders.SENT_DIR == "sent"


def test_an_unreadable_file_goes_to_failed_with_the_reason(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = root / "out"
    _drop(out, "locked.xml", b"<x/>")
    _drop(out, "fine.xml", b"<y/>")
    real = folders._read_regular

    def read_regular(path: Path) -> tuple[bytes, tuple[int, int]] | None:
        if path.name == "locked.xml":  # (the tests run as root: a mode would not stop the read)
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(folders, "_read_regular", read_regular)
    with NodeClient(root / A) as node:
        folder = _outbox(root, node)
        done = {o.name: o for o in folder.scan()}
    assert done["locked.xml"].line() == "failed: locked.xml: cannot read it: Permission denied"
    assert (out / "failed" / "locked.xml.reason.txt").read_text() == "cannot read it: Permission denied\n"
    assert done["fine.xml"].kind == "sent"


def test_the_inbox_folder_leaves_the_documents_of_users_to_their_applications(root: Path) -> None:
    with NodeClient(root / B) as node:
        node.add_user("alice")
    with NodeClient(root / A) as node:
        node.send_many([dict(to=B, data=b"for the organization", key="ORG"),
                        dict(to=f"{B}/alice", data=b"for alice", key="ALICE")])
    _deliver(root)
    with NodeClient(root / B) as node:
        done = InboxFolder(node, root / "in").drain()
        assert [o.name.split("__")[0] for o in done] == ["ORG"]
        [left] = node.inbox(unread=True)
        assert left.to_user == "alice" and left.app_data == b"for alice"
        assert InboxFolder(node, root / "in").drain() == []


def test_a_store_from_before_folders_gets_the_watch_table_at_open(tmp_path: Path) -> None:
    from semq.node.store import MIGRATIONS, _v12_watch
    from semq.store.db import open_store

    path = tmp_path / "node.sqlite"
    before = MIGRATIONS[:MIGRATIONS.index(_v12_watch)]
    open_store(path, before, create=True).close()
    core = NodeCore(path, A)
    try:
        (version,) = core.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version == str(len(MIGRATIONS))
        assert core.conn.execute("SELECT count(*) FROM watch_files").fetchone() == (0,)
        plan = core.conn.execute("EXPLAIN QUERY PLAN SELECT id FROM watch_files WHERE folder=? AND moved_ms IS NULL",
                                 (b"/x",)).fetchall()
        assert "watch_files_pending" in str(plan)
    finally:
        core.close()
    assert (tmp_path / f"node.sqlite.bak-v{len(before)}").exists()


def test_a_fifo_or_a_link_in_the_outbox_is_never_read(root: Path) -> None:
    """A name swapped for a FIFO would block a reader for ever; a link
    would send what it points to. Neither is taken, nor read."""
    out = root / "out"
    os.mkfifo(out / "pipe.xml")
    (root / "secret").write_bytes(b"not for the partner")
    os.symlink(root / "secret", out / "link.xml")
    _drop(out, "real.xml", b"<real/>")
    assert folders._read_regular(out / "pipe.xml") is None  # (as if swapped in after the look)
    assert folders._read_regular(out / "link.xml") is None
    with NodeClient(root / A) as node:
        done = _outbox(root, node).scan()
    assert [(o.kind, o.name) for o in done] == [("sent", "real.xml")]
    assert [data for *_, data in _outbox_rows(root)] == [b"<real/>"]


def test_an_inbox_wait_woken_by_the_outbox_still_sees_a_document_that_arrived(root: Path) -> None:
    """``semq watch`` waits for the daemon's word and the outbox's events
    together. Woken by the outbox before the daemon's answer was read (a
    writer of many files wakes it all the time), the inbox folder asks the
    store: a document that arrived is not left waiting behind the outbox."""
    inbox = root / "in"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(root / B / "admin.sock"))  # a daemon that takes waits and never answers
    server.listen(4)
    r, w = os.pipe()
    try:
        with NodeClient(root / B) as node:
            folder = InboxFolder(node, inbox)
            assert folder.drain() == []
            os.write(w, b"x")  # the outbox's events, readable before any answer
            assert folder.wait(20, also=[r]) is False  # nothing arrived
            with NodeClient(root / A) as a:
                a.send(B, b"<arrived/>", key="ARR")
            _deliver(root)
            start = time.monotonic()
            assert folder.wait(20, also=[r]) is True
            assert time.monotonic() - start < 5
            [o] = folder.drain()
            assert o.name.startswith("ARR__") and folder.waiting() is False
    finally:
        os.close(r)
        os.close(w)
        server.close()
