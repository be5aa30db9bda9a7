"""``semq platform migrate --to URL``: a stopped platform's SQLite store
moved into PostgreSQL (a real server: the ``pg_url`` fixture) in one
transaction, checked, then named in semq.toml; the SQLite file kept as it
was. Stored copies keep their ids (LK1s nodes hold), and the next copy's
id is above every id the SQLite store ever gave. Refusals are one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from semq.platform.core import PlatformCore
from semq.platform.engine import StoredState
from semq.platform.store import open_pg_store
from semq.settings.config import load_config
from semq.umxt_protocol import Endpoint
from tests._frames import decoded, raws
from tests.cli.test_cli import one_error, run
from tests.platform.test_platform_store import _acks, _data, _saved

A, B, C = "10008", "56001", "56002"
a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
OFFLINE: dict[Endpoint, int] = {}
ONLINE = 1 << 30
TABLES = {
    "stored": "SELECT * FROM stored ORDER BY id",
    "seen": "SELECT * FROM seen ORDER BY origin_type, origin_id, semq_id, semq_db_id, record_id",
    "nodes": "SELECT * FROM nodes ORDER BY node_type, node_id",
}


def _files(d: Path) -> dict[str, str]:
    """The platform store's files with their sha256 (the -wal/-shm too, when there)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("platform.sqlite*"))}


def _rows_sqlite(path: Path, table: str) -> list[tuple[object, ...]]:
    import sqlite3

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [tuple(r) for r in conn.execute(TABLES[table])]
    finally:
        conn.close()


def _rows_pg(url: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                for r in conn.execute(TABLES[table])]


def _platform(capsys: pytest.CaptureFixture[str], d: Path, *init: str) -> None:
    """A stopped platform with stored copies in every state a stop leaves:
    B's 1-6 (1-3 delivered, SS_SENT), C's 7-12 (delivered; 10-12 acked and
    gone, so 12 is the highest id the store gave but not in the table)."""
    assert run(capsys, "platform", "init", "--dir", str(d), *init)[0] == 0
    core = PlatformCore(d / "platform.sqlite")
    try:
        core.register([A, B, C])
        core.handle(a, raws(*(_data(a, b, r) for r in range(1, 7))), OFFLINE)
        core.handle(a, raws(*(_data(a, c, r) for r in range(7, 13))), OFFLINE)
        assert core.claim_stored(b, 3)[1] == 3
        assert core.claim_stored(c, 10)[1] == 6
        core.handle(c, _acks(c, [10, 11, 12]), {c: ONLINE})
        core.write_held_now()
    finally:
        core.close()
    assert [r[0] for r in _rows_sqlite(d / "platform.sqlite", "stored")] == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_a_stopped_platform_moves_to_postgresql_with_its_ids(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "platform"
    _platform(capsys, d)
    before = _files(d)
    expected = {t: _rows_sqlite(d / "platform.sqlite", t) for t in TABLES}
    sent = [r[0] for r in expected["stored"] if r[9] == StoredState.SS_SENT]
    assert sent == [1, 2, 3, 7, 8, 9]

    rc, out, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 0, err
    assert "stored: 9/9 rows (100%)" in err and "seen: 12/12 rows (100%)" in err  # progress on stderr
    assert "rows nodes 3, seen 12, stored 9" in out and "next stored copy id 13" in out
    assert "CA files in the store: 2" in out
    assert "kept unchanged" in out and "delete it once the platform runs well on PostgreSQL" in out

    # the rows, exactly; the SQLite files as they were; the configuration names the database
    for t in TABLES:
        assert _rows_pg(pg_url, t) == expected[t], t
    assert _files(d) == before
    assert load_config(d).store == pg_url
    with psycopg.connect(pg_url) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM ca_files")}
    # the CA's files, and its certificate's digest (the instances check theirs against it)
    assert names == {"ca.sha256", "crl.pem", *(f"issued/{p.name}" for p in (d / "ca" / "issued").glob("*.pem"))}

    # the platform on PostgreSQL delivers B's copies (the ones delivered
    # before the move again, as to any reconnecting target) under their LK1s ...
    core = PlatformCore(load_config(d).platform_store)
    try:
        assert core.connected(b)
        frames, n = core.claim_stored(b, 10)
        assert n == 6
        lk1s = [f.frame().body.lk1.record_id for f in decoded(frames)]  # type: ignore[union-attr]
        assert lk1s == [1, 2, 3, 4, 5, 6]
        # ... acks them by those ids, and gives a new copy an id never used
        core.handle(b, _acks(b, lk1s), {b: ONLINE})
        out_new = core.handle(a, raws(_data(a, c, 99)), OFFLINE)
        assert [lk1 for _, lk1 in _saved(out_new.sends[a])] == [13]
        assert [r[0] for r in _rows_pg(pg_url, "stored")] == [7, 8, 9, 13]
    finally:
        core.close()


def test_an_empty_store_made_by_init_is_a_target(tmp_path: Path, pg_url: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "platform", "init", "--dir", str(tmp_path / "made"), "--no-security",
               "--store", pg_url)[0] == 0
    d = tmp_path / "platform"
    _platform(capsys, d, "--no-security")
    rc, out, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 0, err
    assert "CA files" not in out
    assert len(_rows_pg(pg_url, "stored")) == 9


def test_a_target_with_rows_or_a_directory_on_postgresql_is_refused(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _platform(capsys, one, "--no-security")
    _platform(capsys, two, "--no-security")
    assert run(capsys, "platform", "migrate", "--dir", str(one), "--to", pg_url)[0] == 0
    config = (two / "semq.toml").read_bytes()
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(two), "--to", pg_url)
    assert rc == 2
    one_error(err, "already holds a platform store with rows (stored 9, seen 12, nodes 3)")
    assert (two / "semq.toml").read_bytes() == config
    assert len(_rows_pg(pg_url, "stored")) == 9
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(one), "--to", pg_url)
    assert rc == 2
    one_error(err, "already keeps its store in PostgreSQL")


def test_a_running_platform_is_refused(tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "platform"
    _platform(capsys, d, "--no-security")
    config = (d / "semq.toml").read_bytes()
    # a process holding the store open, as a running platform does
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]);"
         " c.execute('SELECT count(*) FROM nodes').fetchone(); print('open', flush=True); time.sleep(60)",
         str(d / "platform.sqlite")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
        assert rc == 2
        one_error(err, "refusing to migrate", "is open in another process", "stop the platform first")
    finally:
        holder.kill()
        holder.wait()
    # a daemon's fresh status.json (a live process other than this one)
    (d / "status.json").write_text(json.dumps({"pid": os.getppid(), "time_ms": int(time.time() * 1000)}))
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 2
    one_error(err, "refusing to migrate", "reported its status")
    assert (d / "semq.toml").read_bytes() == config
    with psycopg.connect(pg_url) as conn:  # the target was not even opened
        assert conn.execute("SELECT to_regclass('stored')").fetchone() == (None,)


def test_a_bad_or_unreachable_url_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "platform"
    _platform(capsys, d, "--no-security")
    before, config = _files(d), (d / "semq.toml").read_bytes()
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", "mysql://db/semq")
    assert rc == 2
    one_error(err, '--to "mysql://db/semq" is not a postgresql:// URL')
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to",
                     "postgresql://nobody:secret@127.0.0.1:9/none")
    assert rc == 1
    line = one_error(err, "postgresql://nobody:***@127.0.0.1:9/none cannot be reached")
    assert "secret" not in line
    assert _files(d) == before and (d / "semq.toml").read_bytes() == config


def test_a_copy_that_differs_is_rolled_back_and_names_the_table(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "platform"
    _platform(capsys, d, "--no-security")
    before, config = _files(d), (d / "semq.toml").read_bytes()
    open_pg_store(pg_url, create=True).close()
    with psycopg.connect(pg_url) as conn:  # the target loses one row of seen on the way in
        conn.execute("CREATE FUNCTION lose() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$ BEGIN IF NEW.record_id = 5 THEN RETURN NULL; END IF; RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER lose BEFORE INSERT ON seen FOR EACH ROW EXECUTE FUNCTION lose()")
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 1
    progress = [line for line in err.splitlines() if line.endswith("%)")]
    assert progress and progress[0].startswith("nodes: 3/3 rows")
    one_error("\n".join(line for line in err.splitlines() if line not in progress), "table seen differs after the copy (SQLite: rows 12; PostgreSQL: rows 11); rolled back")
    assert all(_rows_pg(pg_url, t) == [] for t in TABLES)
    assert _files(d) == before and (d / "semq.toml").read_bytes() == config


def test_kept_chunks_move_into_rows_every_instance_can_read(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The SQLite platform keeps an absent receiver's chunks in files
    (semq.platform.chunks); in PostgreSQL, which several instances share,
    they become rows with their frames. A file that is missing stops the
    move with its name, nothing written."""
    from semq.umxt_protocol import LK0, Chunk, Frame, Kind

    d = tmp_path / "platform"
    _platform(capsys, d, "--no-security")
    doc = LK0(endpoint=a, record_id=77)
    chunks = [Frame(kind=Kind.CHUNK, source=a, target=b, body=Chunk(lk0=doc, index=i, flags=0,
                                                                     payload=bytes([i]) * 3000)) for i in range(3)]
    core = PlatformCore(d / "platform.sqlite")
    try:
        core.handle(a, raws(*chunks), OFFLINE)
    finally:
        core.close()
    (kept,) = list((d / "chunks").glob("*.chunks"))
    saved = kept.read_bytes()

    kept.unlink()
    before, config = _files(d), (d / "semq.toml").read_bytes()
    rc, _, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 1
    one_error("\n".join(line for line in err.splitlines() if not line.endswith("%)")),
              f"the kept chunk in {kept} at offset 0 is missing or damaged; rolled back, nothing changed")
    assert all(_rows_pg(pg_url, t) == [] for t in TABLES)
    assert _files(d) == before and (d / "semq.toml").read_bytes() == config

    kept.write_bytes(saved)
    rc, out, err = run(capsys, "platform", "migrate", "--dir", str(d), "--to", pg_url)
    assert rc == 0, err
    assert "stored 12" in out
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT length(frame), ref FROM stored WHERE kind={int(Kind.CHUNK)} ORDER BY id").fetchall()
    assert [r[1] for r in rows] == [None] * 3 and sum(r[0] for r in rows) == len(saved)
    core = PlatformCore(load_config(d).platform_store)
    try:
        assert core.connected(b)
        got = [f for f in decoded(core.claim_stored(b, 20)[0]) if f.kind is Kind.CHUNK]
        assert [f.frame().body.index for f in got] == [0, 1, 2]  # type: ignore[union-attr]
    finally:
        core.close()
