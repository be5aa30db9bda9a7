"""Backup while the store is being written (every committed row is in the
snapshot, nothing half-written), restore, and restore's refusals: a store
in use (a real daemon process; a daemon answering on the admin socket), an
existing store without --force, archives that are not ours."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from semq.cli import main as semq_main
from semq.node.core import NewDocument, NodeCore
from semq.ops.admin import serve_admin
from semq.ops.backup import BackupError, RestoreRefused, backup, restore, store_in_use
from semq.ops.cli import main as ops_main
from tests._procs import Proc, free_port


def init_node(d: Path, org: str = "10008") -> None:
    assert semq_main(["node", "init", "--dir", str(d), "--org", org, "--platform", f"127.0.0.1:{free_port()}",
                      "--no-security"]) == 0


def ids(store: Path) -> list[int]:
    with sqlite3.connect(str(store)) as c:
        return [r[0] for r in c.execute("SELECT id FROM outbox ORDER BY id")]


class Writer(threading.Thread):
    """An application writing documents as fast as it can, one transaction
    each; ``committed`` grows only after a commit returned."""

    def __init__(self, store: Path) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.committed: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        core = NodeCore(self.store, "10008", synchronous="OFF")
        try:
            i = 0
            while not self.stop.is_set():
                (lk0,) = core.accept([NewDocument(target="56001", app_data=b"doc %d " % i + b"x" * 200)])
                self.committed.append(lk0.record_id)
                i += 1
        except BaseException as e:  # surfaced by the test
            self.error = e
        finally:
            core.close()


def test_backup_under_load_then_restore(tmp_path: Path) -> None:
    src = tmp_path / "A"
    init_node(src)
    w = Writer(src / "node.sqlite")
    w.start()
    try:
        for _ in range(2000):
            if len(w.committed) >= 300:
                break
            threading.Event().wait(0.005)
        before = list(w.committed)
        info = backup(src, tmp_path / "a.tar.gz")
        after = len(w.committed)
        # keep writing a little longer: the archive must not change
        threading.Event().wait(0.05)
    finally:
        w.stop.set()
        w.join(10)
    assert w.error is None and len(before) >= 300 and after > len(before)
    assert stat.S_IMODE((tmp_path / "a.tar.gz").stat().st_mode) == 0o600
    assert info.role == "node" and info.files[:2] == ["node.sqlite", "semq.toml"] and not info.include_keys

    dst = tmp_path / "B"
    res = restore(tmp_path / "a.tar.gz", dst)
    assert res.role == "node" and sorted(res.files) == ["node.sqlite", "semq.toml"]
    got = ids(dst / "node.sqlite")
    # a consistent snapshot: every row committed before the backup started,
    # no row that was never committed, and nothing in between missing
    assert set(before) <= set(got) <= set(w.committed)
    assert got == list(range(got[0], got[0] + len(got)))
    assert info.tables["outbox"] == len(got)
    with sqlite3.connect(str(dst / "node.sqlite")) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        row = c.execute("SELECT app_data FROM outbox WHERE id=?", (before[-1],)).fetchone()
    assert row[0].startswith(b"doc %d " % (len(before) - 1))
    # the restored directory runs: the CLI reads it
    assert semq_main(["status", "--dir", str(dst), "--json"]) == 0
    assert stat.S_IMODE(dst.stat().st_mode) == 0o700


def test_restore_refuses_a_running_daemon_and_existing_store(tmp_path: Path) -> None:
    src = tmp_path / "A"
    init_node(src)
    assert ops_main(["backup", "--dir", str(src), "--out", str(tmp_path / "a.tar")]) == 0
    p = Proc("node", ["node", "run", "--dir", str(src)], tmp_path / "node.log", "running")
    try:
        why = store_in_use(src)
        # the admin socket answers (when the run command serves it), else SQLite's lock says it
        assert why is not None and ("open in another process" in why or "answers on" in why)
        with pytest.raises(RestoreRefused, match=r"refusing to restore.*stop it first"):
            restore(tmp_path / "a.tar", src, force=True)
        assert ops_main(["restore", str(tmp_path / "a.tar"), "--dir", str(src), "--force"]) == 2
        # a backup is fine while it runs
        assert ops_main(["backup", "--dir", str(src), "--out", str(tmp_path / "b.tar")]) == 0
    finally:
        p.kill()  # SIGKILL: the kernel drops SQLite's locks with the process
    assert store_in_use(src) is None
    with pytest.raises(RestoreRefused, match=r"already holds node\.sqlite, semq\.toml; use --force"):
        restore(tmp_path / "a.tar", src)
    res = restore(tmp_path / "b.tar", src, force=True)
    aside = [r for r in res.replaced if r.startswith("node.sqlite.before-restore-")]
    assert len(aside) == 1 and (src / aside[0]).exists()
    with sqlite3.connect(str(src / aside[0])) as c:  # the replaced store still opens
        assert c.execute("PRAGMA quick_check").fetchone()[0] == "ok"


def test_two_restores_in_one_second_keep_both_replaced_stores(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "A"
    init_node(src)
    backup(src, tmp_path / "a.tar")
    monkeypatch.setattr("semq.ops.backup.time.strftime", lambda fmt, *a: "20261126T000000")
    first = restore(tmp_path / "a.tar", src, force=True)
    second = restore(tmp_path / "a.tar", src, force=True)
    assert "node.sqlite.before-restore-20261126T000000" in first.replaced
    assert "node.sqlite.before-restore-20261126T000000-2" in second.replaced
    for name in ("node.sqlite.before-restore-20261126T000000", "node.sqlite.before-restore-20261126T000000-2"):
        with sqlite3.connect(str(src / name)) as c:  # each replaced store is there and opens
            assert c.execute("PRAGMA quick_check").fetchone()[0] == "ok"


def test_restore_refuses_a_store_another_process_has_open(tmp_path: Path) -> None:
    """An application (or a hung daemon) with the store open: SQLite's own
    WAL-index lock tells, with no cooperation from that process."""
    src = tmp_path / "A"
    init_node(src)
    backup(src, tmp_path / "a.tar")
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM outbox');"
            " print('open', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(src / "node.sqlite")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        why = store_in_use(src)
        assert why is not None and "node.sqlite is open in another process" in why
        with pytest.raises(RestoreRefused, match="open in another process"):
            restore(tmp_path / "a.tar", src, force=True)
    finally:
        holder.communicate("", timeout=10)
    assert store_in_use(src) is None
    restore(tmp_path / "a.tar", src, force=True)


async def test_restore_refuses_when_the_admin_socket_answers(tmp_path: Path) -> None:
    src = tmp_path / "A"
    init_node(src)
    backup(src, tmp_path / "a.tar")

    async def ping(args: dict[str, Any]) -> dict[str, Any]:
        return {"role": "node", "pid": 4242}

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_admin, src / "admin.sock", {"ping": ping})
        why = await trio.to_thread.run_sync(store_in_use, src)
        assert why is not None and "pid 4242" in why
        with pytest.raises(RestoreRefused, match="answers on"):
            await trio.to_thread.run_sync(lambda: restore(tmp_path / "a.tar", src, force=True))
        nursery.cancel_scope.cancel()


def test_sqlite_only_backup_and_bad_archives(tmp_path: Path) -> None:
    src = tmp_path / "A"
    init_node(src)
    core = NodeCore(src / "node.sqlite", "10008")
    (lk0,) = core.accept([NewDocument(target="56001", app_data=b"x")])
    core.close()
    info = backup(src, tmp_path / "store.sqlite")
    assert info.files == ["node.sqlite"]
    with pytest.raises(BackupError, match="has no configuration"):
        restore(tmp_path / "store.sqlite", tmp_path / "empty")
    dst = tmp_path / "B"
    init_node(dst)
    res = restore(tmp_path / "store.sqlite", dst, force=True)
    assert ids(dst / "node.sqlite") == [lk0.record_id] and res.id_floor > lk0.record_id

    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as t:
        data = b"x"
        ti = tarfile.TarInfo("../../etc/passwd")
        ti.size = 1
        t.addfile(ti, io.BytesIO(data))
    with pytest.raises(BackupError, match="unsafe path"):
        restore(evil, tmp_path / "C")
    (tmp_path / "junk.tar").write_bytes(b"not an archive at all" * 10)
    with pytest.raises(BackupError, match="not a semq backup"):
        restore(tmp_path / "junk.tar", tmp_path / "C")

    # a damaged store is refused before anything is replaced
    backup(src, tmp_path / "ok.tar")
    damaged = tmp_path / "damaged.tar"
    with tarfile.open(tmp_path / "ok.tar") as t_in, tarfile.open(damaged, "w") as t_out:
        for m in t_in:
            f = t_in.extractfile(m)
            assert f is not None
            blob = f.read()
            if m.name == "node.sqlite":
                blob = blob[:5000] + bytes([blob[5000] ^ 0xFF]) + blob[5001:]
            m.size = len(blob)
            t_out.addfile(m, io.BytesIO(blob))
    with pytest.raises(BackupError, match="checksum"):
        restore(damaged, dst, force=True)
    assert ids(dst / "node.sqlite") == [lk0.record_id]  # unchanged


def test_keys_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pdir, ndir = tmp_path / "P", tmp_path / "N"
    assert semq_main(["platform", "init", "--dir", str(pdir)]) == 0
    assert semq_main(["node", "init", "--dir", str(ndir), "--org", "10008", "--enroll-from", str(pdir)]) == 0
    capsys.readouterr()
    assert ops_main(["backup", "--dir", str(ndir), "--out", str(tmp_path / "pub.tar")]) == 0
    assert "private keys are not included" in capsys.readouterr().err
    with tarfile.open(tmp_path / "pub.tar") as t:
        names = set(t.getnames())
        manifest = json.loads(t.extractfile("semq-backup.json").read())  # type: ignore[union-attr]
    assert {"node.pem", "ca.pem", "semq.toml", "node.sqlite"} <= names
    assert not any(n.endswith(".key.pem") for n in names) and manifest["role"] == "node"

    assert ops_main(["backup", "--dir", str(ndir), "--out", str(tmp_path / "all.tar"), "--include-keys"]) == 0
    assert "WARNING: the backup holds private keys" in capsys.readouterr().err
    dst = tmp_path / "N2"
    assert ops_main(["restore", str(tmp_path / "all.tar"), "--dir", str(dst)]) == 0
    for k in ("keys/sign.key.pem", "keys/enc.key.pem"):
        assert (dst / k).read_bytes() == (ndir / k).read_bytes()
        assert stat.S_IMODE((dst / k).stat().st_mode) == 0o600
    assert stat.S_IMODE((dst / "keys").stat().st_mode) == 0o700
    capsys.readouterr()
    assert ops_main(["restore", str(tmp_path / "pub.tar"), "--dir", str(tmp_path / "N3")]) == 0
    assert "no private keys" in capsys.readouterr().err

    # the platform: CA key only with --include-keys
    assert ops_main(["backup", "--dir", str(pdir), "--out", str(tmp_path / "p.tar")]) == 0
    with tarfile.open(tmp_path / "p.tar") as t:
        names = set(t.getnames())
    assert {"ca/ca.pem", "ca/crl.pem", "tls/server.pem", "platform.sqlite"} <= names
    assert "ca/ca.key.pem" not in names and "tls/server.key.pem" not in names


def test_compact_gives_an_old_store_this_versions_pages_and_refuses_a_running_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A store made with 4 KiB pages (before 2026-11-26; WAL mode cannot
    change them in place) is rewritten with 16 KiB pages, every row kept,
    the old file kept beside it; refused, untouched, while a daemon runs."""
    from semq.ops.backup import compact

    src = tmp_path / "A"
    with monkeypatch.context() as m:
        m.setattr("semq.store.db.PAGE_SIZE", 4096)  # as the store was made
        init_node(src)
        core = NodeCore(src / "node.sqlite", "10008")
        core.accept([NewDocument(target="56001", app_data=b"doc %d " % i + b"x" * 1000) for i in range(300)])
        core.conn.execute("DELETE FROM outbox WHERE id % 3 = 0")  # free pages to drop
        core.close()
    with sqlite3.connect(str(src / "node.sqlite")) as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 4096
    want = ids(src / "node.sqlite")
    p = Proc("node", ["node", "run", "--dir", str(src)], tmp_path / "node.log", "running")
    try:
        before = (src / "node.sqlite").read_bytes()
        with pytest.raises(RestoreRefused, match=r"refusing to compact .*stop it first"):
            compact(src)
        assert (src / "node.sqlite").read_bytes() == before
        assert not list(src.glob("node.sqlite.before-compact-*"))
    finally:
        p.kill()
    assert ops_main(["compact", "--dir", str(src)]) == 0
    out = capsys.readouterr().out
    assert "page size 4,096 -> 16,384 bytes" in out and "kept as" in out
    with sqlite3.connect(str(src / "node.sqlite")) as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 16384
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert ids(src / "node.sqlite") == want and len(want) == 200
    [kept] = [k for k in src.glob("node.sqlite.before-compact-*") if not k.name.endswith(("-wal", "-shm"))]
    with sqlite3.connect(str(kept)) as c:  # the store as it was still opens
        assert c.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert [r[0] for r in c.execute("SELECT id FROM outbox ORDER BY id")] == want
    # the compacted store runs: the daemon's own start-up check passes
    assert semq_main(["status", "--dir", str(src), "--json"]) == 0
    NodeCore(src / "node.sqlite", "10008").close()
    # twice in one second: the first store kept is never overwritten
    monkeypatch.setattr("semq.ops.backup.time.strftime", lambda fmt, *a: "20261126T000000")
    compact(src)
    compact(src)
    kept_now = sorted(k.name for k in src.glob("node.sqlite.before-compact-20261126T000000*")
                      if not k.name.endswith(("-wal", "-shm")))
    assert kept_now == ["node.sqlite.before-compact-20261126T000000", "node.sqlite.before-compact-20261126T000000-2"]


def test_a_backup_holds_large_documents_contents(tmp_path: Path) -> None:
    """A large document's content lives beside the store (semq.node.large):
    the backup carries it, and the restored node can still send it."""
    import os

    from semq.node.api import NodeClient

    src_dir, dst_dir = tmp_path / "a", tmp_path / "restored"
    init_node(src_dir)
    content = os.urandom(17 << 20)
    (tmp_path / "cad.bin").write_bytes(content)
    with NodeClient(src_dir) as n:
        lk0 = n.send_file("56001", tmp_path / "cad.bin", data_type="CAD")
        assert [m.size for m in n.messages()] == [len(content)]  # (the content's, not the manifest's)
    archive = tmp_path / "b.tar.gz"
    info = backup(src_dir, archive)
    assert [f for f in info.files if f.startswith("large/out/")] != []
    restore(archive, dst_dir)
    core = NodeCore(dst_dir / "node.sqlite", "10008", synchronous="OFF")
    try:
        with core.db.atomic():
            core.conn.execute("UPDATE outbox SET state=1")  # as if sent: a transfer to take up
        (doc,) = core.large_out.pending()
        assert doc.record_id == lk0.record_id and doc.path.read_bytes() == content
        assert doc.path.is_relative_to(dst_dir)
    finally:
        core.close()


# ---------------------------------------------------------------- hostile archives


def _member(name: str, size: int, kind: bytes = b"0") -> bytes:
    """A ustar header of ``name`` declaring ``size`` bytes (GNU base-256 past
    the octal field's 8 GiB), as any tar writer makes it."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.type = min(size, 1), kind
    header = bytearray(ti.tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\x80" + size.to_bytes(11, "big") if size >= 8 << 30 else b"%011o\0" % size
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header[:512])
    return bytes(header[:512])


_MANIFEST = json.dumps({"format": 1, "role": "node", "store": "node.sqlite"}).encode()


def _manifest_member() -> bytes:
    return _member("semq-backup.json", len(_MANIFEST)) + _MANIFEST + bytes(-len(_MANIFEST) % 512)


def _dir_state(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def test_restore_refuses_a_bomb_before_writing_anything(tmp_path: Path) -> None:
    """A bzip2 tar whose 256 MiB member of zeros takes a few hundred bytes:
    refused at the member's header (its declared size over 1024 times the
    archive's), before a byte is written or the member is inflated."""
    import bz2

    from semq.settings.bounds import BACKUP_MAX_MEMBER_RATIO

    raw = tmp_path / "bomb.tar"
    with tarfile.open(raw, "w") as t:
        m = json.dumps({"format": 1, "role": "node", "store": "node.sqlite"}).encode()
        ti = tarfile.TarInfo("semq-backup.json")
        ti.size = len(m)
        t.addfile(ti, io.BytesIO(m))
        ti = tarfile.TarInfo("large/in/10008_1_1_42.doc")
        ti.size = 256 << 20
        with open("/dev/zero", "rb") as zeros:
            t.addfile(ti, zeros)
    bomb = tmp_path / "bomb.tar.bz2"
    with open(raw, "rb") as f_in, bz2.open(bomb, "wb") as f_out:
        while block := f_in.read(1 << 20):
            f_out.write(block)
    raw.unlink()
    size = bomb.stat().st_size
    assert (256 << 20) > BACKUP_MAX_MEMBER_RATIO * size
    dst = tmp_path / "B"
    with pytest.raises(BackupError) as e:
        restore(bomb, dst)
    assert str(e.value) == (f"{bomb}: its members would write {(256 << 20) + len(m)} bytes or more, over"
                            f" {BACKUP_MAX_MEMBER_RATIO} times its {size} bytes"
                            f" ({BACKUP_MAX_MEMBER_RATIO * size}); not restored")
    assert _dir_state(dst) == []


def test_restore_refuses_a_member_declaring_more_than_it_holds(tmp_path: Path) -> None:
    """A gzip archive whose member's header declares 64 GiB (and holds
    nothing): refused at that header, unread, naming the size and the limit."""
    import gzip

    archive = tmp_path / "liar.tar.gz"
    with gzip.open(archive, "wb") as f:
        f.write(_manifest_member() + _member("large/in/10008_1_1_42.doc", 64 << 30) + bytes(1024))
    with pytest.raises(BackupError, match=rf"its members would write {(64 << 30) + len(_MANIFEST)} bytes or more, over 1024"
                                          rf" times its {archive.stat().st_size} bytes"):
        restore(archive, tmp_path / "B")
    assert _dir_state(tmp_path / "B") == []


def test_restore_refuses_an_archive_larger_than_the_free_space(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.ops.backup as backup_mod

    src = tmp_path / "A"
    init_node(src)
    archive = tmp_path / "a.tar.gz"
    info = backup(src, archive)
    monkeypatch.setattr(backup_mod, "_free_bytes", lambda _d: 10_000)
    dst = tmp_path / "B"
    with pytest.raises(BackupError, match=r"its members would write \d+ bytes or more, over the 10000 bytes free"
                                          rf" in {re.escape(str(dst))}; not restored"):
        restore(archive, dst)
    assert _dir_state(dst) == []
    monkeypatch.setattr(backup_mod, "_free_bytes", lambda _d: 1 << 40)
    assert restore(archive, dst).role == info.role  # with the room, the same archive restores


def test_the_walk_checks_each_header_before_reading_past_it(tmp_path: Path) -> None:
    """semq.ops._tarscan: sizes are those tarfile extracts (a pax size, a
    long name), a pax header over the limit is refused unread, sparse and
    global headers refused, a bounded stream stops at its cap."""
    import gzip

    from semq.ops._tarscan import ArchiveError, ArchiveTooLarge, bounded_stream, scan

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, n in [("a" * 150, 1000), ("b", 0), ("c", 513)]:  # (150 characters: a pax header)
            ti = tarfile.TarInfo(name)
            ti.size = n
            t.addfile(ti, io.BytesIO(b"z" * n))
    totals: list[int] = []
    walked = scan(io.BytesIO(buf.getvalue()), max_meta=64 * 1024, check=totals.append)
    assert (walked.members, walked.file_bytes, totals) == (3, 1513, [1000, 1000, 1513])

    def walk(data: bytes) -> None:
        scan(io.BytesIO(data), max_meta=64 * 1024, check=lambda _t: None)

    with pytest.raises(ArchiveError, match=r"a pax header of 1073741824 bytes .* exceeds the 65536-byte limit"):
        walk(_member("x", 1 << 30, b"x"))  # (its data is not there: refused before it is read)
    with pytest.raises(ArchiveError, match="sparse member"):
        walk(_member("s", 10, b"S") + bytes(1024))
    with pytest.raises(ArchiveError, match="global pax header"):
        walk(_member("g", 0, b"g") + bytes(1024))
    with pytest.raises(ArchiveError, match="not a tar header"):
        walk(b"not an archive at all" * 100)
    with pytest.raises(ArchiveError, match="truncated"):
        walk(_member("t", 10_000) + bytes(512))
    with pytest.raises(ArchiveError, match="empty"):
        walk(b"")

    bomb = tmp_path / "zeros.gz"
    bomb.write_bytes(gzip.compress(bytes(64 << 20)))
    read = 0
    with pytest.raises(ArchiveTooLarge, match="past 1048576"), \
            bounded_stream(bomb, 1 << 20, lambda n: f"past {1 << 20}: {n}") as s:
        while chunk := s.read(1 << 16):
            read += len(chunk)
    assert read <= 1 << 20  # stopped at the cap, not inflated to the end
