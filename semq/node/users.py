"""Users inside an organization (SPEC "Users"): who they are and how their
applications prove it.

A user has a name (``alice``: a-z 0-9 . _ -, starting with a letter) and a
token; only the token's SHA-256 is stored, in every unit's store (the
``users`` table), so a copy of the store does not give the token away. A
user may also be tied to an operating-system account (``os_user``): an
application running as that account is that user on the node's user
socket without a token (the kernel says who connected: SO_PEERCRED).

The node's operator — whoever can open the node's data directory — sees
every user's documents (``NodeClient``). A user's application reaches the
node through the user socket (semq.ops.usersock), which answers for that
user only.

``Users`` is the one owner of the ``users`` table; both roles consult it
(the receiver: whom a document may be addressed to), and the functions
below (a user added to every unit's store, a token checked) work through it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .batch import NodeContext
from .envelope import EnvelopeError, check_user

__all__ = ["TOKEN_BYTES", "User", "UserError", "Users", "add_user", "authenticate", "list_users", "remove_user",
           "user_for_os_account", "user_for_token"]

TOKEN_BYTES: Final = 32  # random bytes of a token (printed as 43 URL-safe characters)
_PREFIX: Final = "semq_"  # tokens start with it: easy to find in a leaked file


class UserError(ValueError):
    """A user that does not exist, exists already, or a wrong token (one line)."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    os_user: str
    created_ms: int


class Users:
    """A store's users (each statement is one write: no transaction of its own)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def names(self) -> frozenset[str]:
        return frozenset(r[0] for r in self.ctx.conn.execute("SELECT name FROM users"))

    def exists(self, name: str) -> bool:
        return self.ctx.conn.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone() is not None

    def add(self, name: str, token_sha256: str, os_user: str, created_ms: int) -> None:
        self.ctx.conn.execute("INSERT INTO users (name, token_sha256, os_user, created_ms) VALUES (?,?,?,?)",
                              (name, token_sha256, os_user, created_ms))

    def remove(self, name: str) -> bool:
        return bool(self.ctx.conn.execute("DELETE FROM users WHERE name=?", (name,)).rowcount)

    def all(self) -> list[User]:
        return [User(name, os_user, int(created)) for name, os_user, created in
                self.ctx.conn.execute("SELECT name, os_user, created_ms FROM users ORDER BY name")]

    def token_sha256(self, name: str) -> str | None:
        row = self.ctx.conn.execute("SELECT token_sha256 FROM users WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def of_token_sha256(self, digest: str) -> list[str]:
        """The users whose token has this digest (one, or none; two only if
        an operator gave two users the same token)."""
        return [str(r[0]) for r in self.ctx.conn.execute("SELECT name FROM users WHERE token_sha256=? LIMIT 2",
                                                         (digest,))]

    def of_os_account(self, account: str) -> str | None:
        row = self.ctx.conn.execute("SELECT name FROM users WHERE os_user=? ORDER BY name LIMIT 1",
                                    (account,)).fetchone()
        return None if row is None else str(row[0])


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_user(stores: Sequence[Users], name: str, *, os_user: str = "", token: str | None = None) -> str:
    """Add ``name`` to every store in ``stores`` (a node's units) and return
    its token (only its digest is kept: show it once). Raises UserError
    when the name is taken or not valid."""
    try:
        check_user(name)
    except EnvelopeError as e:
        raise UserError(str(e)) from None
    token = token or _PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    ts = int(time.time() * 1000)
    if any(s.exists(name) for s in stores):
        raise UserError(f"user {name} exists already")
    for s in stores:
        s.add(name, _digest(token), os_user, ts)
    return token


def remove_user(stores: Sequence[Users], name: str) -> None:
    """Remove ``name`` from every store (its documents stay: the operator
    still sees them). Raises UserError when there is no such user."""
    found = False
    for s in stores:
        found = s.remove(name) or found
    if not found:
        raise UserError(f"{name} is not a user of this node")


def list_users(store: Users) -> list[User]:
    return store.all()


def authenticate(store: Users, name: str, token: str) -> str:
    """``name`` if ``token`` is its token. Raises UserError with the same
    words for an unknown user and a wrong token (nothing to learn by trying)."""
    known = store.token_sha256(name)
    expected = known if known is not None else _digest(secrets.token_hex(16))  # the same work either way
    if not hmac.compare_digest(expected, _digest(token)) or known is None:
        raise UserError(f"user {name} and this token do not match")
    return name


def user_for_token(store: Users, token: str) -> str:
    """The user whose token ``token`` is (a bearer token names no user: the
    token alone says who). Raises UserError, the same words whatever is
    wrong (nothing to learn by trying); a token two users share names
    neither."""
    found = store.of_token_sha256(_digest(token)) if token else []
    if len(found) != 1:
        raise UserError("this token is not the token of a user of this node")
    return found[0]


def user_for_os_account(store: Users, account: str) -> str | None:
    """The user tied to operating-system account ``account``, if any."""
    if not account:
        return None
    return store.of_os_account(account)
