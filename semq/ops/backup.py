"""Backup and restore of a node's or the platform's data directory.

What a backup holds (a tar archive, gzip-compressed when the name ends in
``.gz``/``.tgz``; docs/operations.md):

- ``semq-backup.json`` — the manifest: format, role, id, time, the store's
  schema version, sha256 and row counts per table;
- the store (``node.sqlite`` / ``platform.sqlite``): a consistent snapshot
  taken with SQLite's online backup API over a separate connection, in one
  step, so it is exactly the store as of one committed transaction while the
  daemon goes on writing (WAL: readers never block the writer); a node of
  several units (semq.umxt_protocol.units) has one store per unit (``unit-K/node.sqlite``)
  and the backup holds every one, each snapshot so taken (the units share
  no state: each answers for its own records), and the manifest lists them
  all with their checksums — restore puts back all of them or none;
- ``semq.toml`` and the public certificates (``node.pem``, ``ca.pem``,
  ``certs/``; ``ca/ca.pem``, ``ca/crl.pem``, ``ca/issued/``, ``tls/server.pem``);
- the private keys (``keys/*.key.pem``; ``ca/ca.key.pem``,
  ``tls/server.key.pem``) **only with include_keys**. Without them a
  restored node re-enrolls (new keys, 'semq platform enroll', import); the
  platform's CA key cannot be replaced without re-enrolling every node, so
  keep a copy of it offline. The archive is written 0600 either way: the
  store itself holds documents (a node's outbox and inbox in plaintext).

- large documents' contents (``large/out/*.doc``, ours being sent, and
  ``large/in/*.doc``, being received or delivered; semq.node.large), each
  unit's beside its store: the rows name them. A file that goes while the
  backup runs (its document was confirmed) is left out. A platform's
  ``chunks/*.chunks`` (the chunks it keeps for absent receivers,
  semq.platform.chunks) likewise.

Not included: the delivery event logs (``events/``, append-only: copy
them with rsync), ``status.json``, the admin socket, older ``.bak-v*``.

A backup named ``*.sqlite`` is the store snapshot alone.

``restore`` refuses to touch a store that is in use: a daemon answering on
the admin socket, or any process holding the store open (SQLite's own lock
on the WAL index, which the kernel drops when a process dies, so a killed
daemon never blocks a restore and a hung one is still seen). It refuses to
replace an existing store without ``force``; with it, the replaced files are
kept next to the new ones as ``<name>.before-restore-<time>``.

The archive's format, the store snapshots and the checked reading of an
archive are semq.ops._archive's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from semq import __version__
from semq.identity.crypto import ensure_private_directory
from semq.store.inuse import store_in_use as store_open
from semq.store.inuse import wal_index_lock

from ._archive import (
    BACKUP_FORMAT,
    KEY_DIRS,
    MANIFEST_NAME,
    PUBLIC_DIRS,
    STORE_NAMES,
    UNIT_STORE,
    BackupError,
    file_sha256,
    read_archive,
    snapshot_store,
    table_counts,
    write_archive,
)
from ._paths import admin_socket_path

__all__ = [
    "BACKUP_FORMAT",
    "BACKUP_SUFFIXES",
    "MANIFEST_NAME",
    "BackupError",
    "BackupInfo",
    "BackupRefused",
    "CompactInfo",
    "RestoreInfo",
    "RestoreRefused",
    "backup",
    "check_backup_out",
    "compact",
    "restore",
    "snapshot_store",
    "store_in_use",
]



BACKUP_SUFFIXES: Final = (".tar", ".tar.gz", ".tgz", ".sqlite")


class BackupRefused(BackupError):
    """backup will not write where asked (a name that is not a backup's,
    a directory that does not exist): the user's call (exit status 2)."""


def check_backup_out(out: Path) -> None:
    """``--out``: a name of BACKUP_SUFFIXES in a directory that exists (a
    backup never creates directories: a mistyped path is refused, not
    made); BackupRefused naming the value, else nothing."""
    if not out.name.endswith(BACKUP_SUFFIXES) or out.name in BACKUP_SUFFIXES:
        raise BackupRefused(f"--out {out}: a backup is written as FILE.tar, FILE.tar.gz or FILE.tgz (a tar"
                            " archive) or FILE.sqlite (the store alone), not as another kind of file")
    if out.is_dir():
        raise BackupRefused(f"--out {out} is a directory; name the file, e.g. {out / 'backup.tar.gz'}")
    if not out.parent.is_dir():
        raise BackupRefused(f"--out {out}: the directory {out.parent} does not exist; create it first")


class RestoreRefused(BackupError):
    """restore will not do it as asked (store in use, or exists without
    force, or of the other role): the user's call (exit status 2)."""


@dataclass
class BackupInfo:
    path: Path
    role: str
    store: str
    tables: dict[str, int]
    files: list[str]
    include_keys: bool
    bytes: int


@dataclass
class RestoreInfo:
    directory: Path
    role: str
    files: list[str]
    replaced: list[str] = field(default_factory=list)  # moved aside as *.before-restore-<time>
    warnings: list[str] = field(default_factory=list)
    id_floor: int = 0  # node: record ids of the restored store continue above this (a new incarnation)


@dataclass
class CompactInfo:
    store: Path
    role: str
    page_size: tuple[int, int]  # before, after
    bytes: tuple[int, int]  # the store with its WAL, before; the rewritten store, after
    kept: Path  # the store as it was (with its -wal/-shm), beside it


# ---------------------------------------------------------------- helpers


def _wanted_files(directory: Path, include_keys: bool) -> list[str]:
    """Config and certificates (and keys) of a data directory, relative."""
    out = []
    if (directory / "semq.toml").is_file():
        out.append("semq.toml")
    for sub in sorted({*PUBLIC_DIRS, *(KEY_DIRS if include_keys else ())}):
        d = directory / sub if sub else directory
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.pem")):
            if not p.is_file():
                continue
            rel = p.relative_to(directory).as_posix()
            if p.name.endswith(".key.pem") and not include_keys:
                continue
            out.append(rel)
    return sorted(set(out))


def _large_files(directory: Path, units: int, role: str = "node") -> list[str]:
    """Large documents' content files of a node's units (semq.node.large),
    or the chunks a platform keeps (semq.platform.chunks), relative."""
    if role == "platform":
        return [p.relative_to(directory).as_posix() for p in sorted((directory / "chunks").glob("*.chunks"))]
    out = []
    for k in range(1, units + 1):
        base = directory if k == 1 else directory / f"unit-{k}"
        for sub in ("large/out", "large/in"):
            out += [p.relative_to(directory).as_posix() for p in sorted((base / sub).glob("*.doc"))]
    return out


# ---------------------------------------------------------------- backup


def _refuse_pg(cfg: Any, what: str) -> None:
    """These commands work on SQLite stores; PostgreSQL has its own tools."""
    if getattr(cfg, "store", ""):
        from semq.store.pg import redact

        raise BackupError(f"the platform's store is the PostgreSQL database {redact(cfg.store)}: {what} it with"
                          " PostgreSQL's own tools (pg_dump, pg_basebackup, VACUUM FULL); the CA and"
                          " configuration in this directory are plain files")


def backup(directory: Path, out: Path, *, include_keys: bool = False) -> BackupInfo:
    """Back up the data directory ``directory`` (node or platform, running
    or not) to ``out``. Written to a temporary file and renamed, mode 0600.
    Raises BackupRefused for an ``out`` that is not a backup's name in a
    directory that exists (check_backup_out), BackupError (nothing
    written) or ConfigError."""
    from semq.settings.config import load_config

    directory, out = Path(directory).resolve(), Path(out)
    check_backup_out(out)
    cfg = load_config(directory)
    _refuse_pg(cfg, "back up")
    store_name = STORE_NAMES[cfg.role]
    units = cfg.units if cfg.role == "node" else 1
    if units > 1 and out.name.endswith(".sqlite"):
        raise BackupError(f"a node of {units} units has {units} stores: back up to a .tar or .tar.gz, not {out.name}")
    with tempfile.TemporaryDirectory(prefix=".semq-backup-", dir=out.parent) as tmpd:
        snap = Path(tmpd) / store_name
        info = snapshot_store(cfg.store_path, snap)
        if info["role"] != cfg.role:
            raise BackupError(f"{cfg.store_path} holds a {info['role']} store but the config says {cfg.role}")
        # The other units' stores (semq.umxt_protocol.units), each a snapshot of its own.
        unit_snaps: list[tuple[str, Path, dict[str, Any]]] = []
        for k in range(2, units + 1):
            rel = f"unit-{k}/{store_name}"
            usnap = Path(tmpd) / f"unit-{k}.sqlite"
            unit_snaps.append((rel, usnap, snapshot_store(cfg.for_unit(k).store_path, usnap)))
        tmp_out = Path(tmpd) / "out"
        if out.name.endswith(".sqlite"):
            shutil.copyfile(snap, tmp_out)
            files = [store_name]
        else:
            files = _wanted_files(directory, include_keys) + _large_files(directory, units, cfg.role)
            manifest = {
                "format": BACKUP_FORMAT, "software": f"semq {__version__}", "role": cfg.role,
                "id": cfg.org if cfg.role == "node" else cfg.platform_id, "created_ms": int(time.time() * 1000),
                "source": str(directory), "store": store_name, "schema_version": info["schema_version"],
                "sha256": info["sha256"], "tables": info["tables"], "include_keys": include_keys,
                "files": [store_name, *[rel for rel, _, _ in unit_snaps], *files],
                "stores": {rel: {"sha256": i["sha256"], "schema_version": i["schema_version"], "tables": i["tables"]}
                           for rel, i in [(store_name, info), *[(rel, i) for rel, _, i in unit_snaps]]},
            }
            gone = write_archive(tmp_out, out.name.endswith((".gz", ".tgz")), manifest,
                                 [(store_name, snap), *[(rel, u) for rel, u, _ in unit_snaps],
                                  *[(r, directory / r) for r in files]])
            files = [f for f in files if f not in gone]
            files = [store_name, *[rel for rel, _, _ in unit_snaps], *files]
        os.chmod(tmp_out, 0o600)
        os.replace(tmp_out, out)
    return BackupInfo(path=out, role=cfg.role, store=store_name, tables=info["tables"], files=files,
                      include_keys=include_keys and any(f.endswith(".key.pem") for f in files),
                      bytes=out.stat().st_size)


# ---------------------------------------------------------------- in use?


def store_in_use(directory: Path) -> str | None:
    """Why the store in ``directory`` must not be replaced now, or None: a
    daemon answering on the admin socket; then what the store tells
    (semq.store.inuse: a process holding it open, a fresh status.json of a
    live process)."""
    from .admin import AdminError, AdminUnavailable, admin_request

    directory = Path(directory)
    sock = admin_socket_path(directory)
    if sock.exists():
        try:
            resp = admin_request(sock, "ping", timeout=2.0)
            r = resp.get("result") or {}
            return f"a {r.get('role', 'semq')} daemon (pid {r.get('pid', '?')}) answers on {sock}"
        except AdminUnavailable:
            pass  # a stale socket file
        except AdminError as e:
            return f"something listens on {sock} ({e})"
    return store_open(directory)


# ---------------------------------------------------------------- restore


def _move_store(store: Path, to: Path) -> None:
    """Rename a store with its -wal and -shm (so it still opens as it was)."""
    os.replace(store, to)
    for sfx in ("-wal", "-shm"):
        side = Path(f"{store}{sfx}")
        if side.exists():
            os.replace(side, Path(f"{to}{sfx}"))


def _aside(path: Path, label: str, stamp: str) -> Path:
    """A free name beside ``path`` to keep it under: ``<name>.<label>-<stamp>``,
    numbered ``-2``, ``-3``... when one is there already (two in one
    second), so nothing kept earlier is overwritten."""
    aside = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
    return aside


def _store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store, Path(f"{store}-wal")) if p.exists())


def compact(directory: Path) -> CompactInfo:
    """Rewrite the store of ``directory`` (its daemon stopped): a copy taken
    with the online backup API, rewritten by VACUUM with this software's page
    size (semq.store.db.PAGE_SIZE: a store made before 2026-11-26 has 4 KiB pages,
    and WAL mode cannot change them in place) and its free pages dropped,
    checked, then put in the store's place. The store as it was is kept
    beside it as ``<name>.before-compact-<time>`` (with its -wal/-shm, so it
    still opens). Refuses (RestoreRefused, nothing changed) while the store
    is in use; raises BackupError for a store that cannot be read or
    rewritten (nothing changed either)."""
    from semq.settings.config import load_config
    from semq.store.db import PAGE_SIZE

    directory = Path(directory).resolve()
    cfg = load_config(directory)
    _refuse_pg(cfg, "compact")
    store = cfg.store_path
    if not store.is_file():
        raise BackupError(f"no {cfg.role} store at {store}")
    why = store_in_use(directory)
    if why:
        raise RestoreRefused(f"refusing to compact {store}: {why}; stop it first"
                             " ('semq admin drain --wait' or 'systemctl stop ...')")
    before = _store_bytes(store)
    with tempfile.TemporaryDirectory(prefix=".compact-", dir=directory) as tmpd:
        tmp = Path(tmpd) / store.name
        with wal_index_lock(store) as free:
            if not free:
                raise RestoreRefused(f"refusing to compact {store}: another process just opened it")
            snap = snapshot_store(store, tmp)
            if snap["role"] != cfg.role:
                raise BackupError(f"{store} holds a {snap['role']} store but the config says {cfg.role}")
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                old_page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                for q in (f"PRAGMA page_size={PAGE_SIZE}", "VACUUM", "PRAGMA journal_mode=WAL"):
                    conn.execute(q).fetchall()
                new_page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                tables = table_counts(conn)
            except sqlite3.Error as e:
                raise BackupError(f"rewriting a copy of {store} failed: {e} (the store is unchanged)") from e
            finally:
                conn.close()
            if check != "ok" or tables != snap["tables"]:
                raise BackupError(f"the rewritten copy of {store} fails its check ({check}; rows {tables} against"
                                  f" {snap['tables']}); the store is unchanged")
            for sfx in ("-wal", "-shm"):  # the copy's WAL is empty and closed
                Path(f"{tmp}{sfx}").unlink(missing_ok=True)
            kept = _aside(store, "before-compact", time.strftime("%Y%m%dT%H%M%S"))
            _move_store(store, kept)  # the old WAL belongs to the old file, never to the new one
            os.chmod(tmp, 0o600)
            os.replace(tmp, store)
    return CompactInfo(store=store, role=cfg.role, page_size=(old_page, new_page),
                       bytes=(before, store.stat().st_size), kept=kept)


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _new_incarnation(store: Path, archive: Path) -> int:
    """Begin a new incarnation of the staged node store ``store`` (before it
    is put in place): its record ids continue at the restore time, above
    every id the store may have sent after the backup was taken — receivers
    remember those LK0s and would suppress a reused one as a duplicate
    (semq.node.store.begin_incarnation). Returns the floor."""
    from semq.node.store import begin_incarnation

    conn = sqlite3.connect(str(store), isolation_level=None)
    try:
        floor = begin_incarnation(conn, "restore")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error as e:
        raise BackupError(f"{archive}: the restored store cannot be written: {e}") from e
    finally:
        conn.close()
    for sfx in ("-wal", "-shm"):
        Path(f"{store}{sfx}").unlink(missing_ok=True)
    return floor


def restore(archive: Path, directory: Path, *, force: bool = False) -> RestoreInfo:
    """Restore the backup ``archive`` into the data directory ``directory``.

    Refuses (BackupError, nothing changed) when the store there is in use
    (see store_in_use; ``force`` does not override that), when the
    directory already holds a store or configuration and ``force`` is not
    given, when the archive is not a semq backup or its store does not match
    its checksum or fails SQLite's check. With ``force``, replaced files are
    kept as ``<name>.before-restore-<time>`` (a store with its -wal/-shm, so
    it still opens). A node store begins a new incarnation: its record ids
    continue above the restore time (``RestoreInfo.id_floor``), never below
    one its organization may have used since the backup."""
    archive, directory = Path(archive), Path(directory).resolve()
    if not archive.is_file():
        raise BackupError(f"no backup at {archive}")
    for d in [directory, *sorted(directory.glob("unit-*/"))] if directory.exists() else []:
        why = store_in_use(d)  # (every unit of a node: its own socket, store and status)
        if why:
            raise RestoreRefused(f"refusing to restore into {directory}: {why}; stop it first"
                                 " ('semq admin stop' or 'systemctl stop ...')")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix=".restore-", dir=directory) as tmpd:
        stage = Path(tmpd)
        manifest, files = read_archive(archive, stage, _free_bytes(stage))
        role = manifest["role"]
        stores = _staged_stores(archive, stage, manifest, files)
        info = RestoreInfo(directory=directory, role=role, files=sorted(files))
        if "semq.toml" not in files and not (directory / "semq.toml").exists():
            raise BackupError(f"{archive} holds only a store and {directory} has no configuration;"
                              f" run 'semq {role} init --dir {directory}' first, or restore a full backup")
        existing = [rel for rel in files if (directory / rel).exists()]
        other_store = [n for r, n in STORE_NAMES.items() if r != role and (directory / n).exists()]
        if other_store:
            raise RestoreRefused(f"{directory} holds a {other_store[0]}; refusing to restore a {role} there")
        if existing and not force:
            shown = ", ".join(existing[:4]) + (" ..." if len(existing) > 4 else "")
            raise RestoreRefused(f"{directory} already holds {shown}; use --force to replace"
                              " (the replaced files are kept as *.before-restore-<time>)")
        if role == "node":
            info.id_floor = max(_new_incarnation(stage / rel, archive) for rel in stores)
        info.replaced = _put_in_place(stage, directory, files, stores, existing)
    os.chmod(directory, 0o700)
    info.warnings = _key_warnings(role, directory, files)
    return info


def _staged_stores(archive: Path, stage: Path, manifest: dict[str, Any], files: list[str]) -> dict[str, str]:
    """Every store of the staged set (a node of several units has one per
    unit) -> its checksum in the manifest ("" when it gives none): each one
    the manifest lists is there, each one there is listed, and each matches
    its checksum and passes SQLite's check. Raises BackupError."""
    stores: dict[str, str] = {manifest["store"]: manifest.get("sha256") or ""}
    listed = manifest.get("stores")
    if isinstance(listed, dict):
        for rel, meta in listed.items():
            if rel not in files:
                raise BackupError(f"{archive}: the manifest lists the store {rel}, which it does not contain")
            stores[rel] = str((meta or {}).get("sha256") or "")
    for rel in files:
        if UNIT_STORE.fullmatch(rel) and rel not in stores:
            raise BackupError(f"{archive}: it contains the store {rel}, which the manifest does not list")
    for rel, digest in stores.items():
        if digest and file_sha256(stage / rel) != digest:
            raise BackupError(f"{archive}: the store {rel} does not match the manifest's checksum (damaged)")
        conn = sqlite3.connect(f"file:{stage / rel}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.Error as e:
            raise BackupError(f"{archive}: the store {rel} cannot be read: {e}") from e
        finally:
            conn.close()
        if check != "ok":
            raise BackupError(f"{archive}: the store {rel} fails its check: {check}")
    return stores


def _put_in_place(stage: Path, directory: Path, files: list[str], stores: dict[str, str],
                  existing: list[str]) -> list[str]:
    """Move the staged ``files`` into ``directory``, each one there before
    kept aside as ``<name>.before-restore-<time>``, while holding every
    store's WAL-index lock (RestoreRefused when a process opened one since
    it was checked). Returns what was kept aside, relative."""
    replaced = []
    stamp = time.strftime("%Y%m%dT%H%M%S")
    with contextlib.ExitStack() as locks:
        for rel in stores:
            target_store = directory / rel
            if not locks.enter_context(wal_index_lock(target_store)):  # opened since the check above
                raise RestoreRefused(f"refusing to restore: {target_store} was just opened by another process")
        for rel in existing:
            dst = directory / rel
            aside = _aside(dst, "before-restore", stamp)
            if rel in stores:
                _move_store(dst, aside)  # its WAL belongs to it, never to the restored file
            else:
                os.replace(dst, aside)
            replaced.append(aside.relative_to(directory).as_posix())
        for rel in stores:  # a stale WAL would be replayed onto the restored store
            for sfx in ("-wal", "-shm"):
                Path(f"{directory / rel}{sfx}").unlink(missing_ok=True)
        for rel in sorted(files):
            dst = directory / rel
            if dst.parent != directory:  # (every level 0700: large/, large/in/, chunks/...)
                ensure_private_directory(dst.parent)
                os.chmod(dst.parent, 0o700)
            os.chmod(stage / rel, 0o600)
            os.replace(stage / rel, dst)
    return replaced


def _key_warnings(role: str, directory: Path, files: list[str]) -> list[str]:
    """What the restored directory lacks or holds of private keys, said to
    the user."""
    warnings = []
    keys_in = any(f.endswith(".key.pem") for f in files)
    if role == "node" and not keys_in and not (directory / "keys" / "sign.key.pem").exists():
        with suppress(Exception):
            from semq.settings.config import load_config

            if load_config(directory).security:
                warnings.append("the backup holds no private keys and there are none here: create new"
                                " ones and re-enroll ('semq node init' in a new directory, 'semq platform"
                                " enroll', 'semq node import'), or copy keys/ from your key backup")
    if role == "platform" and not keys_in and not (directory / "ca" / "ca.key.pem").exists():
        warnings.append("the backup holds no CA key and there is none here: restore ca/ca.key.pem from"
                        " your offline key backup before 'semq platform run'")
    if keys_in:
        warnings.append("private keys were restored (owner-only, 0600)")
    return warnings
