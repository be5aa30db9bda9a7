"""When an outbox folder's file is whole (semq.node.features.folder_watch):
the rules with a fake clock, the inotify events they are fed, who holds a
file open for writing (/proc), and an outbox folder without inotify (the
settle time) over a fake clock."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.node.api import NodeClient
from semq.node.features.folder_watch import Readiness, open_events, open_for_writing
from semq.node.features.folders import FolderOptions, OutboxFolder
from semq.session.inbox_wait import wait_any

A, B = "10008", "56001"
T0 = 1_800_000_000.0  # the fake time of day
NS = 1_000_000_000


def _sig(size: int, mtime: float) -> tuple[int, int]:
    return size, int(mtime * NS)


def test_a_file_no_event_spoke_of_is_ready_once_unchanged_for_the_settle_time() -> None:
    r = Readiness(settle=5)
    found = {"a.xml": _sig(10, T0)}
    assert r.look(found, wall=T0, mono=100) == []
    assert r.look(found, wall=T0 + 4.9, mono=104.9) == []
    found = {"a.xml": _sig(20, T0 + 4.9)}  # grew: the settle time starts again
    assert r.look(found, wall=T0 + 5, mono=105) == []
    assert r.look(found, wall=T0 + 9.8, mono=109.8) == []
    assert r.look(found, wall=T0 + 9.9, mono=109.9) == ["a.xml"]


def test_a_file_whose_time_is_older_than_the_settle_time_is_ready_at_once() -> None:
    """A backlog left while the watcher was stopped goes at the first look;
    a file dated in the future (another machine's clock) waits the settle
    time by this process's clock."""
    r = Readiness(settle=5)
    found = {"old.xml": _sig(10, T0 - 60), "future.xml": _sig(10, T0 + 3600)}
    assert r.look(found, wall=T0, mono=0) == ["old.xml"]
    assert r.look(found, wall=T0 + 5, mono=5) == ["old.xml", "future.xml"]


def test_a_file_seen_being_written_waits_for_its_close_however_long() -> None:
    r = Readiness(settle=0)
    r.change("INV-901.xml", "created")
    r.change("INV-901.xml", "writing")
    found = {"INV-901.xml": _sig(36, T0)}
    assert r.look(found, wall=T0 + 3600, mono=3600) == []  # an hour's pause: still not taken
    r.change("INV-901.xml", "closed")
    assert r.look(found, wall=T0 + 3600, mono=3600) == ["INV-901.xml"]
    r.change("INV-901.xml", "writing")  # opened and written again before it was taken
    assert r.look(found, wall=T0 + 3600, mono=3600) == []
    r.taken("INV-901.xml")
    assert r.look({}, wall=T0, mono=0) == []


def test_created_files_empty_ones_wait_for_a_write_linked_ones_settle() -> None:
    r = Readiness(settle=5)
    r.change("empty.xml", "created")  # a writer that opened it and has not written yet
    r.change("linked.xml", "created")  # ln: a whole file, no write
    found = {"empty.xml": _sig(0, T0 - 60), "linked.xml": _sig(10, T0 - 60)}
    assert r.look(found, wall=T0, mono=0) == ["linked.xml"]


def test_a_rename_in_is_ready_and_a_rename_away_forgets() -> None:
    r = Readiness(settle=60)
    r.change("x.xml", "closed")
    r.change("x.xml", "gone")
    r.change("y.xml", "closed")
    r.change(".y.xml.swp", "closed")  # dotfiles and .tmp / .part: never
    r.change("z.xml.part", "closed")
    found = {"x.xml": _sig(1, T0), "y.xml": _sig(1, T0)}
    assert r.look(found, wall=T0, mono=0) == ["y.xml"]


def test_lost_events_put_every_file_under_the_settle_rule() -> None:
    r = Readiness(settle=5)
    r.change("w.xml", "writing")
    r.lost_events()  # its close may have been among the lost events
    found = {"w.xml": _sig(10, T0)}
    assert r.look(found, wall=T0, mono=0) == []
    assert r.look(found, wall=T0 + 5, mono=5) == ["w.xml"]


def test_inotify_events_become_changes(tmp_path: Path) -> None:
    events, why = open_events(tmp_path)
    assert events is not None, why
    r = Readiness(settle=3600)
    try:
        f = (tmp_path / "slow.xml").open("wb")
        f.write(b"half")
        f.flush()
        (tmp_path / "aside.tmp").write_bytes(b"whole")
        os.rename(tmp_path / "aside.tmp", tmp_path / "renamed.xml")
        (tmp_path / "sub").mkdir()
        assert events.read(r) > 0
        found = {n: _sig(1, T0) for n in ("slow.xml", "renamed.xml")}
        assert r.look(found, wall=T0, mono=0) == ["renamed.xml"]
        f.write(b" and the rest")
        f.close()
        events.read(r)
        assert sorted(r.look(found, wall=T0, mono=0)) == ["renamed.xml", "slow.xml"]
        os.unlink(tmp_path / "renamed.xml")
        events.read(r)
        assert r.look(found, wall=T0, mono=0) == ["slow.xml"]
    finally:
        events.close()


def test_open_for_writing_sees_a_process_holding_a_file_open_for_writing(tmp_path: Path) -> None:
    (tmp_path / "w.xml").write_bytes(b"x")
    (tmp_path / "r.xml").write_bytes(b"x")
    with (tmp_path / "w.xml").open("ab") as w, (tmp_path / "r.xml").open("rb") as r:
        p = subprocess.Popen(["sleep", "30"], stdout=w, stdin=r)
    try:
        assert open_for_writing(tmp_path, ["w.xml", "r.xml", "other.xml"]) == {"w.xml"}
    finally:
        p.kill()
        p.wait(timeout=10)
    assert open_for_writing(tmp_path, ["w.xml", "r.xml"]) == set()
    assert open_for_writing(tmp_path, []) == set()


# ---------------------------------------------------------------- without inotify


class FakeClock:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 0.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    assert main(["platform", "init", "--dir", str(tmp_path / "P"), "--no-security"]) == 0
    for org in (A, B):
        assert main(["node", "init", "--dir", str(tmp_path / org), "--org", org, "--platform",
                     "127.0.0.1:7499", "--no-security"]) == 0
    (tmp_path / "out").mkdir()
    yield tmp_path


def test_without_inotify_a_file_is_taken_once_unchanged_for_the_settle_time_and_only_once(root: Path) -> None:
    out = root / "out"
    clock = FakeClock()
    with NodeClient(root / A) as node:
        folder = OutboxFolder(node, out, FolderOptions(to=B, data_type="INVOICE"), settle=5, events=False,
                              clock=lambda: clock.wall, monotonic=lambda: clock.mono)
        assert folder.fileno() is None and folder.events_off == "not asked for"
        path = out / "slow.csv"
        path.write_bytes(b"a,b\n")
        os.utime(path, (clock.wall, clock.wall))
        assert folder.scan() == []
        clock.advance(4)
        with path.open("ab") as f:  # written again before the settle time passed
            f.write(b"1,2\n")
        os.utime(path, (clock.wall, clock.wall))
        assert folder.scan() == []  # changed since: the settle time starts again
        clock.advance(4.9)
        assert folder.scan() == []
        clock.advance(0.1)
        [o] = folder.scan()
        clock.advance(60)
        assert folder.scan() == []
    assert o.kind == "sent"
    assert [p.name for p in (out / "sent").iterdir()] == ["slow.csv"]
    assert (out / "sent" / "slow.csv").read_bytes() == b"a,b\n1,2\n"


def test_an_inbox_wait_ends_when_one_of_the_callers_descriptors_is_readable(tmp_path: Path) -> None:
    """``semq watch`` sleeps in one wait: the daemon's answer, the outbox
    folder's events or a signal, whichever comes first."""
    sock_path = tmp_path / "admin.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(1)
    held: list[socket.socket] = []

    def accept() -> None:  # a daemon that takes the wait and never answers
        conn, _ = server.accept()
        held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    r, w = os.pipe()
    timer = threading.Timer(0.2, os.write, (w, b"x"))
    timer.start()
    try:
        start = time.monotonic()
        assert wait_any([(sock_path, {"after_id": 0})], 20, also=[r]) == {}
        assert time.monotonic() - start < 5
    finally:
        timer.cancel()
        os.close(r)
        os.close(w)
        for c in held:
            c.close()
        server.close()


def test_a_folder_deleted_and_made_again_is_watched_again(root: Path) -> None:
    out = root / "out"
    with NodeClient(root / A) as node:
        folder = OutboxFolder(node, out, FolderOptions(to=B, data_type="INVOICE"), settle=3600)
        assert folder.events is not None
        os.rename(out, root / "away")
        with pytest.raises(OSError):
            folder.scan()
        assert folder.events is None
        with pytest.raises(OSError):  # still gone: said at each look
            folder.scan()
        out.mkdir()
        assert folder.scan() == []
        assert folder.events is not None  # watched again: a closed file is taken at once
        with (out / "back.xml").open("wb") as f:
            f.write(b"<back/>")
        [o] = folder.scan()
    assert o.kind == "sent" and (out / "sent" / "back.xml").read_bytes() == b"<back/>"


def test_an_overflowed_event_queue_puts_every_file_under_the_settle_rule(tmp_path: Path) -> None:
    """More events than the kernel queues (fs.inotify.max_queued_events):
    the closes it dropped are unknown, so no file is taken as closed; each
    waits for the settle time (or its next close)."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    events, why = open_events(tmp_path)
    assert events is not None, why
    r = Readiness(settle=3600)
    try:
        for i in range(limit // 2 + 10):  # a create and a close each
            (tmp_path / f"f{i:05d}.xml").write_bytes(b"")
        events.read(r)
        found = {p.name: _sig(0, T0) for p in tmp_path.iterdir()}
        assert r.look(found, wall=T0, mono=0) == []
        with (tmp_path / "f00000.xml").open("wb") as f:  # its next close: taken at once again
            f.write(b"x")
        events.read(r)
        assert r.look(found, wall=T0 + 1, mono=1) == ["f00000.xml"]
        assert len(r.look(found, wall=T0 + 3600, mono=3600)) == len(found)
    finally:
        events.close()
