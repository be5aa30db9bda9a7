"""The certificate authority's public files, the same in every instance of
a platform on one PostgreSQL store (docs/operations.md, "Several platform
instances"): this module owns the store's ``ca_files`` table. The CA's
private key is never in the store: each instance's directory holds its
copy."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from semq.store.db import StoreError

__all__ = ["count_ca_files", "share_ca"]


def _crl_number(data: bytes) -> int:
    from cryptography import x509

    try:
        crl = x509.load_pem_x509_crl(data)
        return int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except (ValueError, x509.ExtensionNotFound):
        return -1


def _write_public_file(path: Path, data: bytes) -> None:
    """Atomically (a temporary file renamed over it), mode 0644: public."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _same_ca(conn: Any, ca_dir: Path) -> None:
    """The first instance to share records its CA certificate's digest; one
    whose directory holds another CA (a directory made by a second ``semq
    platform init`` instead of copied) is refused: it would mix certificates
    of two authorities into every instance's directory."""
    mine = hashlib.sha256((ca_dir / "ca.pem").read_bytes()).hexdigest()
    conn.execute("INSERT INTO ca_files (name, data) VALUES ('ca.sha256', ?) ON CONFLICT (name) DO NOTHING",
                 (mine.encode(),))
    (theirs,) = conn.execute("SELECT data FROM ca_files WHERE name='ca.sha256'").fetchone()
    if bytes(theirs).decode() != mine:
        raise StoreError(f"the certificate authority in {ca_dir} (sha256 {mine[:16]}...) is not this"
                         f" platform's ({bytes(theirs).decode()[:16]}...): run every instance on a copy of the"
                         " same platform directory")


def share_ca(conn: Any, ca_dir: Path) -> list[str]:
    """The CA's public state, the same in every instance's directory: the
    certificates it issued (``issued/*.pem``: the union of what each
    instance's directory and the store hold) and its revocation list
    (``crl.pem``: the one with the highest CRL number). Runs inside a
    transaction of the caller's; pushes what the store lacks, writes what
    the directory lacks (atomically; the daemon's CA watch then reloads
    it). The CA's private key is never in the store: each instance's
    directory holds its copy. Returns the names written here."""
    ca_dir = Path(ca_dir)
    _same_ca(conn, ca_dir)
    local = {f"issued/{p.name}": p for p in sorted((ca_dir / "issued").glob("*.pem"))}
    stored = {name: bytes(data) for name, data in conn.execute(
        "SELECT name, data FROM ca_files WHERE name LIKE 'issued/%'").fetchall()}
    for name in local.keys() - stored.keys():
        conn.execute("INSERT INTO ca_files (name, data) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                     (name, local[name].read_bytes()))
    wrote = []
    for name in sorted(stored.keys() - local.keys()):
        _write_public_file(ca_dir / name, stored[name])
        wrote.append(name)
    crl_file = ca_dir / "crl.pem"
    mine = crl_file.read_bytes() if crl_file.exists() else b""
    n_mine = _crl_number(mine) if mine else -1
    row = conn.execute("SELECT data, crl_number FROM ca_files WHERE name='crl.pem'").fetchone()
    if row is not None and int(row[1]) > n_mine:
        _write_public_file(crl_file, bytes(row[0]))
        wrote.append("crl.pem")
    elif mine and (row is None or int(row[1]) < n_mine):
        conn.execute("INSERT INTO ca_files (name, data, crl_number) VALUES ('crl.pem', ?, ?)"
                     " ON CONFLICT (name) DO UPDATE SET data=EXCLUDED.data, crl_number=EXCLUDED.crl_number"
                     " WHERE ca_files.crl_number < EXCLUDED.crl_number", (mine, n_mine))
    return wrote


def count_ca_files(conn: Any) -> int:
    """How many of the CA's files the store holds (its digest not counted)."""
    return int(conn.execute("SELECT count(*) FROM ca_files WHERE name <> 'ca.sha256'").fetchone()[0])
