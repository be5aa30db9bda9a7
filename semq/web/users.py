"""The web console's operator accounts: ``<data dir>/console/users.json``.

The file (0600, in a 0700 directory) maps each name to its role and an
scrypt hash of its password; a password is never stored, logged or shown.
Verification runs scrypt even for an unknown name, so the time a login takes
does not tell whether the account exists, and the hash compare is the
constant-time one of ``cryptography`` (``Scrypt.verify``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from semq.identity.crypto import ensure_private_directory, write_private_file

__all__ = [
    "CONSOLE_DIR",
    "MAX_PASSWORD",
    "MIN_PASSWORD",
    "USERS_FILE",
    "Account",
    "Role",
    "UserError",
    "UserStore",
    "console_dir",
]

CONSOLE_DIR: Final = "console"  # in the data directory: accounts, audit log, the console's certificate
USERS_FILE: Final = "users.json"
MIN_PASSWORD: Final = 10  # characters
MAX_PASSWORD: Final = 1024  # characters (scrypt hashes any length; a login form's field is bounded)
# scrypt cost: n=2**15, r=8 takes ~50-100 ms and 32 MiB per login on one core
# (the interactive-login parameters of RFC 7914 section 2, as cryptography
# recommends); stored per account so they can be raised later.
SCRYPT_N: Final = 2**15
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_HASH_LEN: Final = 32
_NAME: Final = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")


def console_dir(directory: Path) -> Path:
    """Where a data directory keeps the console's files."""
    return Path(directory) / CONSOLE_DIR


class UserError(ValueError):
    """An operator's mistake about an account (a ValueError: the CLI exits 2)."""


class Role(StrEnum):
    VIEWER = "viewer"  # reads every page; no action
    OPERATOR = "operator"  # also resend, requeue, purge, drain


@dataclass(frozen=True, kw_only=True, slots=True)
class Account:
    name: str
    role: Role
    created_ms: int


def _kdf(salt: bytes, n: int, r: int, p: int) -> Scrypt:
    return Scrypt(salt=salt, length=_HASH_LEN, n=n, r=r, p=p)


def _hash(password: str, salt: bytes, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> bytes:
    return _kdf(salt, n, r, p).derive(password.encode("utf-8"))


# Verified against when the name is unknown (same cost, never matches).
_DUMMY: Final[dict[str, Any]] = {"salt": "00" * 16, "n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P, "hash": "00" * _HASH_LEN}


class UserStore:
    """The accounts of one data directory. Each call reads the file again,
    so a ``semq console user`` change applies to a running console at the
    next login (sessions already open keep the role they logged in with
    until they expire; a removed account's sessions end at its next request)."""

    def __init__(self, directory: Path) -> None:
        self.path = console_dir(directory) / USERS_FILE

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {self.path}: {e}") from e
        users = data.get("users") if isinstance(data, dict) else None
        if not isinstance(users, dict):
            raise UserError(f"{self.path} has no \"users\" object")
        return users

    def _save(self, users: dict[str, Any]) -> None:
        ensure_private_directory(self.path.parent)
        write_private_file(self.path, json.dumps({"users": users}, indent=1, sort_keys=True).encode())

    def list(self) -> list[Account]:
        out = []
        for name, u in sorted(self._load().items()):
            try:
                out.append(Account(name=name, role=Role(str(u.get("role"))), created_ms=int(u.get("created_ms", 0))))
            except ValueError:
                continue  # an entry this version does not understand is no account
        return out

    def get(self, name: str) -> Account | None:
        return next((a for a in self.list() if a.name == name), None)

    def add(self, name: str, role: str, password: str) -> Account:
        """Create or replace ``name`` (a new password, a new role). Raises
        UserError on a bad name, role or a too short password."""
        if not _NAME.match(name):
            raise UserError(f"user name {name!r}: a-z 0-9 . _ -, starting with a letter, at most 64 characters")
        try:
            r = Role(role)
        except ValueError:
            raise UserError(f"role {role!r} is not viewer or operator") from None
        if len(password) < MIN_PASSWORD:
            raise UserError(f"the password has {len(password)} characters; at least {MIN_PASSWORD} are needed")
        if len(password) > MAX_PASSWORD:
            raise UserError(f"the password has {len(password)} characters; at most {MAX_PASSWORD}")
        users = self._load()
        salt = secrets.token_bytes(16)
        now = int(time.time() * 1000)
        users[name] = {"role": r.value, "created_ms": now,
                       "scrypt": {"salt": salt.hex(), "n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P,
                                  "hash": _hash(password, salt).hex()}}
        self._save(users)
        return Account(name=name, role=r, created_ms=now)

    def remove(self, name: str) -> None:
        users = self._load()
        if name not in users:
            raise UserError(f"no console user {name!r}")
        del users[name]
        self._save(users)

    def verify(self, name: str, password: str) -> Account | None:
        """The account when ``password`` is ``name``'s, else None. Takes one
        scrypt either way (blocking: run it in a thread)."""
        try:
            users = self._load()
        except UserError:
            users = {}
        u = users.get(name) if isinstance(name, str) else None
        h = u.get("scrypt") if isinstance(u, dict) else None
        known = isinstance(h, dict)
        rec: dict[str, Any] = h if isinstance(h, dict) else _DUMMY
        try:
            kdf = _kdf(bytes.fromhex(rec["salt"]), int(rec["n"]), int(rec["r"]), int(rec["p"]))
            kdf.verify(password.encode("utf-8")[:MAX_PASSWORD * 4], bytes.fromhex(rec["hash"]))
        except (InvalidKey, ValueError, KeyError, TypeError):
            return None
        if not known or not isinstance(u, dict):
            return None
        try:
            return Account(name=name, role=Role(str(u.get("role"))), created_ms=int(u.get("created_ms", 0)))
        except ValueError:
            return None

    def mode(self) -> int | None:
        """The file's permission bits (None when there is no file)."""
        try:
            return os.stat(self.path).st_mode & 0o777
        except FileNotFoundError:
            return None
