"""The node's user socket: where a user's application sends and reads its
own documents (SPEC "Users"; semq.node.users). The client's side is
semq.ops.userclient (``UserClient``, re-exported here).

The node's data directory is its operator's (mode 0700): whoever opens the
store sees every document. A user's application does not; it talks to the
running node on this Unix socket and proves who it is on the connection's
**first line**, by

- its token (``semq user add`` printed it; only its digest is stored), or
- its operating-system account, when the user is tied to one
  (``semq user add NAME --os-user ACCOUNT``): the kernel says which uid
  connected (SO_PEERCRED), the client cannot.

The connection is then that user's: it sends as that user, lists, reads (a
document over one block in blocks: ``read``) and acknowledges the documents
for that user, and a document of another user is "not in the inbox", like
one that does not exist. It may also wait for its next document
(``wait_inbox``, semq.session.inbox_wait). Later requests need not repeat the
token. One that names a ``user`` names the connection's (another is
refused: a connection never changes hands), and one that carries a
``token`` carries a good one for that user (checked again); every request
checks that the first line's proof still holds (a user removed, or added
again with a new token, is refused on the connections it had).

Protocol: the admin console's (semq.ops.admin: one JSON object per line);
the first line is any request (``whoami`` is the usual one) whose args
prove the user::

    -> {"cmd": "whoami", "args": {"user": "alice", "token": "semq_..."}}
    <- {"ok": true, "result": {"user": "alice", "org": "56001", "units": 1, "block": 1048576, ...}}
    -> {"cmd": "inbox", "args": {"limit": 10}}

Documents travel base64-encoded, at most ``USER_BLOCK_BYTES`` (1 MiB) of a
document per request or answer. A larger document is sent in blocks::

    -> {"cmd": "upload_begin", "args": {"size": 5242880, "to": "10008", "data_type": "CAD"}}
    <- {"ok": true, "result": {"upload": "9f0c...", "block": 1048576}}
    -> {"cmd": "upload_block", "args": {"upload": "9f0c...", "offset": 0, "data": "<base64>"}}
    ...
    -> {"cmd": "upload_send", "args": {"upload": "9f0c...", "sha256": "<hex>"}}
    <- {"ok": true, "result": {"lk0": "56001/1/1/57", "size": 5242880, "sha256": "..."}}

staged privately in the data directory and handed to the large-document
path (semq.ops.uploads), and read in blocks (``read``); an answer carries a
document's ``data`` only when it is at most one block.

Bounds (semq.settings.bounds, "user socket"): nothing is read before the first
line but that line, at most ``USER_AUTH_BYTES`` (4 KiB), whole within
``USER_AUTH_S`` (5 s), and an account holds at most
``USER_AUTH_PER_ACCOUNT`` connections that have not authenticated; after
it a request is at most ``USER_MAX_REQUEST`` (2 MiB); the socket serves
``user_socket_max_connections`` (64) connections, one user at most
``USER_MAX_CONNECTIONS_PER_USER`` (8). One more gets one error line naming
the value and the limit, and is closed.

**Who may connect.** The socket is mode 0666: any local account may
connect, as any local account may reach a database server's socket. That
is safe because nothing is granted by connecting: every connection
authenticates on its first short line before the node buffers more, a
silent or chattering connection costs 4 KiB for 5 s and one account can
hold only a few, and a token (or the kernel's word on the account) is
needed for anything else. Who can even reach the socket is the operator's
to say with the directory it lives in, the usual Unix way: by default it is
``user.sock`` inside the 0700 data directory (the operator's account only);
``user_socket = "/run/semq/56001.sock"`` in a directory of mode 0750 and
group ``semq-apps`` admits that group's accounts and no others. A mode or
group setting of the socket itself would say the same thing a second way.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio

from semq.node.api import InboxItem, NodeClient
from semq.node.limits import DocumentRefused
from semq.node.users import UserError
from semq.session.inbox_wait import ADMIN_SOCKET_NAME, DaemonAway, WaitRefused, await_any
from semq.settings.bounds import (
    USER_AUTH_BYTES,
    USER_AUTH_PER_ACCOUNT,
    USER_AUTH_S,
    USER_BLOCK_BYTES,
    USER_IDLE_S,
    USER_MAX_CONNECTIONS,
    USER_MAX_CONNECTIONS_PER_USER,
    USER_MAX_REQUEST,
)
from semq.settings.config import Config

from .admin import AdminCommandError, Handler, Limits, serve_admin, until_hangup
from .uploads import UPLOADS_DIR, UploadRefused, Uploads
from .userclient import LIST_LIMIT, UserClient, UserSocketError, UserSocketUnavailable
from .waiters import wait_timeout

log = logging.getLogger("semq.ops.usersock")

__all__ = ["UserClient", "UserGate", "UserSession", "UserSocketError", "UserSocketUnavailable",
           "serve_user_socket", "user_handlers", "user_socket_path"]

# The send options a user's request may give (NodeClient.send's keywords, a
# user's own: no best effort, no transactions), with their JSON types.
_OPTIONS: Final[dict[str, tuple[type, ...]]] = {
    "data_type": (str,), "domain": (str,), "subtype": (str,), "key": (str,), "save_fwd": (int,),
    "ack2": (bool,), "priority": (int,), "expires_in": (int, float, type(None)), "encrypt": (bool,),
    "clear_app_key": (bool,), "ordered": (str, type(None)),
}
_SWEEP_S: Final = 60.0  # s between looks for stale uploads


def user_socket_path(cfg: Config) -> Path | None:
    """Where the node's user socket is (None: it has none)."""
    if not cfg.user_socket:
        return None
    p = Path(cfg.user_socket)
    return p if p.is_absolute() else cfg.directory / p


# ---------------------------------------------------------------- who a connection is


class _Store:
    """The node's stores as the user socket reaches them: one NodeClient of
    its own, on one worker thread at a time (SQLite has one writer)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.limiter = trio.CapacityLimiter(1)
        self._client: NodeClient | None = None

    def client(self) -> NodeClient:
        if self._client is None:
            self._client = NodeClient(self.cfg.directory, config=self.cfg)
        return self._client

    async def run(self, fn: Callable[[], Any]) -> Any:
        return await trio.to_thread.run_sync(fn, limiter=self.limiter)


def _account(uid: Any) -> str:
    if not isinstance(uid, int):
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def _strings(args: dict[str, Any]) -> tuple[str, str]:
    user, token = args.get("user") or "", args.get("token") or ""
    if not isinstance(user, str) or not isinstance(token, str):
        raise AdminCommandError("user and token are strings")
    return user, token


@dataclass(eq=False)
class UserSession:
    """What a connection's first line proved: ``user``, by its token or by
    the operating-system ``account`` the kernel named. ``check`` (in the
    store's thread) is run for every request; ``close`` gives back the
    user's connection."""

    user: str
    account: str = ""  # proved by the account (SO_PEERCRED); else by the token
    _token: str = field(default="", repr=False)
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def check(self, client: NodeClient, args: dict[str, Any]) -> str:
        """The user a request on this connection is answered for. Raises
        AdminCommandError when the request names another user or a token
        that is not this user's, or the first line's proof no longer holds."""
        user, token = _strings(args)
        if user and user != self.user:
            raise AdminCommandError(f"this connection is {self.user}'s (its first line); a request as {user}"
                                    " needs a connection of its own")
        if token:
            try:
                client.authenticate(self.user, token)
            except UserError as e:
                raise AdminCommandError(str(e)) from None
        if self.account:
            if client.user_for_os_account(self.account) != self.user:
                raise AdminCommandError(f"the account {self.account} is no longer tied to user {self.user}:"
                                        " connect again")
        else:
            try:
                client.authenticate(self.user, self._token)
            except UserError:
                raise AdminCommandError(f"user {self.user} was removed or given a new token since this connection"
                                        " authenticated: connect again") from None
        return self.user

    def close(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def _prove(client: NodeClient, args: dict[str, Any], peer_uid: int | None) -> UserSession:
    """Who a first line proves its connection is: its user and token, else
    the account the kernel named. Raises AdminCommandError (a wrong token
    and an unknown user get the same words)."""
    user, token = _strings(args)
    if token:
        if not user:
            raise AdminCommandError("a token needs its user name (user)")
        try:
            return UserSession(client.authenticate(user, token), _token=token)
        except UserError as e:
            raise AdminCommandError(str(e)) from None
    account = _account(peer_uid)
    name = client.user_for_os_account(account)
    if name is None or (user and user != name):
        raise AdminCommandError(f"no token, and the account {account or peer_uid!r} is not tied to"
                                f" {'user ' + user if user else 'a user'} of this node")
    return UserSession(name, account=account)


class UserGate:
    """The user socket's admission (semq.ops.admin.Gate): the first line,
    at most ``first_bytes`` within ``first_s``, must authenticate; at most
    ``per_account`` connections of one account wait for theirs, at most
    ``per_user`` connections are one user's. Counts live on the trio
    thread."""

    def __init__(self, store: _Store, *, first_bytes: int = USER_AUTH_BYTES, first_s: float = USER_AUTH_S,
                 per_account: int = USER_AUTH_PER_ACCOUNT, per_user: int = USER_MAX_CONNECTIONS_PER_USER) -> None:
        self.store = store
        self.first_bytes = first_bytes
        self.first_s = first_s
        self.per_account = per_account
        self.per_user = per_user
        self._waiting: dict[int | None, int] = {}
        self._users: dict[str, int] = {}

    def statistics(self) -> dict[str, Any]:
        return {"authenticating": sum(self._waiting.values()), "users": dict(self._users)}

    def arrive(self, peer_uid: int | None) -> str | None:
        n = self._waiting.get(peer_uid, 0)
        if n >= self.per_account:
            return (f"uid {peer_uid} has {n} connections that have not authenticated yet, the limit of"
                    f" {self.per_account} per account")
        self._waiting[peer_uid] = n + 1
        return None

    def depart(self, peer_uid: int | None) -> None:
        n = self._waiting[peer_uid] - 1
        if n:
            self._waiting[peer_uid] = n
        else:
            del self._waiting[peer_uid]

    async def admit(self, cmd: str, args: dict[str, Any], peer_uid: int | None) -> UserSession:
        session: UserSession = await self.store.run(lambda: _prove(self.store.client(), args, peer_uid))
        user = session.user
        n = self._users.get(user, 0)
        if n >= self.per_user:
            raise AdminCommandError(f"user {user} has {n} connections open, the limit of {self.per_user} per user;"
                                    " close one")
        self._users[user] = n + 1

        def release() -> None:
            left = self._users[user] - 1
            if left:
                self._users[user] = left
            else:
                del self._users[user]

        session._release = release
        return session


# ---------------------------------------------------------------- the commands


def _item(i: InboxItem, data: bool) -> dict[str, Any]:
    out = {"id": i.id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id, "from_user": i.from_user,
           "to_user": i.to_user, "channel": i.channel, "gap": i.gap,
           "app_key": {"domain": i.app_key.domain, "data_type": i.app_key.data_type,
                       "subtype": i.app_key.subtype, "key": i.app_key.key},
           "size": i.size, "created_ms": i.created_ms, "received_ms": i.received_ms,
           "consumed": i.consumed_ms is not None, "unit": i.unit}
    if i.path is not None:
        out["large"] = True  # its content is read in blocks (``read``), not carried here
    elif data and len(i.app_data) <= USER_BLOCK_BYTES:  # (a larger one: read in blocks too)
        out["data"] = base64.b64encode(i.app_data).decode()
    return out


def _cursor(args: dict[str, Any], units: int) -> tuple[int, ...] | None:
    """A request's ``after``: per unit, the last row id its follower has
    (None when absent)."""
    after = args.get("after")
    if after is None:
        return None
    if (not isinstance(after, list) or len(after) != units
            or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in after)):
        raise AdminCommandError(f"after {after!r} is not a list of {units} row ids (one per unit)")
    return tuple(after)


def _count(args: dict[str, Any], name: str, default: int | None = None) -> int:
    value = args.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AdminCommandError(f"{name} {value!r} is not a non-negative integer")
    return value


def _options(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A send's target and options, each of its JSON type."""
    to = args.get("to")
    if not isinstance(to, str) or not to:
        raise AdminCommandError("send needs to (ORG, ORG/USER or a colleague's name)")
    kw = {}
    for k, types in _OPTIONS.items():
        if k in args:
            v = args[k]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise AdminCommandError(f"{k} {v!r} is not {' or '.join(t.__name__ for t in types)}")
            kw[k] = v
    return to, kw


def _block(args: dict[str, Any]) -> bytes:
    """A request's ``data``: base64 of at most one block."""
    raw = args.get("data", "")
    if not isinstance(raw, str):
        raise AdminCommandError("data is a base64 string")
    if len(raw) > (USER_BLOCK_BYTES + 2) // 3 * 4:
        raise AdminCommandError(f"data of {len(raw)} base64 characters exceeds one block of {USER_BLOCK_BYTES}"
                                " bytes; a larger document is sent in blocks (upload_begin, upload_block,"
                                " upload_send)")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AdminCommandError(f"data is not base64: {e}") from None
    if len(data) > USER_BLOCK_BYTES:  # (the characters' count allows up to two bytes more)
        raise AdminCommandError(f"data of {len(data)} bytes exceeds one block of {USER_BLOCK_BYTES} bytes; a"
                                " larger document is sent in blocks (upload_begin, upload_block, upload_send)")
    return data


def user_handlers(cfg: Config, waiters: Any = None, *, store: _Store | None = None,
                  uploads: Uploads | None = None) -> dict[str, Handler]:
    """The user socket's commands, each answered for the user of the
    connection (``args["session"]``, a UserSession its first line proved;
    none: refused): whoami, send, inbox, get, read, ack, messages, the
    uploads' (when ``uploads`` is given) and wait_inbox (when ``waiters``,
    semq.ops.waiters.InboxWaiters of this unit, is)."""
    store = store or _Store(cfg)
    client, run = store.client, store.run
    files = trio.CapacityLimiter(1)  # staged uploads' file work: beside the store's thread, not in it

    def who(args: dict[str, Any]) -> str:
        session = args.get("session")
        if not isinstance(session, UserSession):
            raise AdminCommandError("this connection has not authenticated")
        return session.check(client(), args)

    def _limit(args: dict[str, Any]) -> int:
        limit = args.get("limit", 100)
        if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT:
            raise AdminCommandError(f"limit {limit!r} is outside 1..{LIST_LIMIT}")
        return limit

    async def whoami(args: dict[str, Any]) -> dict[str, Any]:
        return {"user": await run(partial(who, args)), "org": cfg.org, "units": cfg.units,
                "block": USER_BLOCK_BYTES, "max_request": USER_MAX_REQUEST,
                "max_document": cfg.max_document_mib << 20}

    async def send(args: dict[str, Any]) -> dict[str, Any]:
        to, kw = _options(args)

        def go() -> dict[str, Any]:
            user = who(args)
            data = _block(args)
            try:
                lk0 = client().send(to, data, user=user, **kw)
            except DocumentRefused as e:
                raise AdminCommandError(str(e)) from None
            return {"lk0": str(lk0), "size": len(data)}
        return dict(await run(go))

    async def inbox(args: dict[str, Any]) -> list[dict[str, Any]]:
        def go() -> list[dict[str, Any]]:
            user = who(args)
            after = _count(args, "after_id", 0)
            node = client()
            cursor = _cursor(args, len(node.cores))
            if cursor is not None:  # a follower's position: unacknowledged documents above it
                items = node.inbox_after(cursor, user=user, limit=_limit(args))
            else:
                items = node.inbox(unread=not args.get("all"), limit=_limit(args), after_id=after, user=user)
            # Contents while they fit in one block together; the rest by ``get``/``read``.
            out, room = [], USER_BLOCK_BYTES if args.get("data") else 0
            for i in items:
                fits = i.path is None and len(i.app_data) <= room
                room -= len(i.app_data) if fits else 0
                out.append(_item(i, fits))
            return out
        return list(await run(go))

    async def get(args: dict[str, Any]) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            user = who(args)
            item_id = args.get("id")
            if not isinstance(item_id, int):
                raise AdminCommandError(f"id {item_id!r} is not an inbox document id")
            try:
                return _item(client().get(item_id, user=user), True)
            except KeyError:
                raise AdminCommandError(f"{item_id} is not in the inbox of {user}") from None
        return dict(await run(go))

    async def read(args: dict[str, Any]) -> dict[str, Any]:
        """A block of one of this user's documents: ``length`` bytes (at
        most one block) from ``offset``; a large one read from its file,
        never whole."""
        def go() -> dict[str, Any]:
            user = who(args)
            item_id = args.get("id")
            offset, length = _count(args, "offset", 0), args.get("length", USER_BLOCK_BYTES)
            if not isinstance(item_id, int):
                raise AdminCommandError(f"id {item_id!r} is not an inbox document id")
            if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= USER_BLOCK_BYTES:
                raise AdminCommandError(f"length {length!r} is outside 1..{USER_BLOCK_BYTES}")
            try:
                item = client().get(item_id, user=user)
            except KeyError:
                raise AdminCommandError(f"{item_id} is not in the inbox of {user}") from None
            if item.path is None:
                block, size = item.app_data[offset:offset + length], len(item.app_data)
            else:
                try:
                    with item.open() as f:
                        size = os.fstat(f.fileno()).st_size
                        f.seek(offset)
                        block = f.read(length)
                except OSError as e:
                    raise AdminCommandError(f"document {item_id} cannot be read: {e.strerror or e}") from None
            return {"data": base64.b64encode(block).decode(), "offset": offset, "size": size,
                    "eof": offset + len(block) >= size}
        return dict(await run(go))

    async def ack(args: dict[str, Any]) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            user = who(args)
            ids = args.get("ids")
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise AdminCommandError("ids is a list of inbox document ids")
            return {"acknowledged": client().acknowledge(ids, user=user)}
        return dict(await run(go))

    async def messages(args: dict[str, Any]) -> list[dict[str, Any]]:
        def go() -> list[dict[str, Any]]:
            user = who(args)
            return [{"lk0": str(r.lk0), "to": r.target + (f"/{r.to_user}" if r.to_user else ""),
                     "state": r.state.name, "channel": r.channel, "code": r.code, "note": r.note,
                     "created_ms": r.created_ms} for r in client().messages(limit=_limit(args), user=user)]
        return list(await run(go))

    @until_hangup
    async def wait_inbox(args: dict[str, Any]) -> dict[str, Any]:
        """Until one of this user's unacknowledged documents is above
        ``after`` (per unit) or ``after_id``, at most ``timeout`` s."""
        if waiters is None:
            raise AdminCommandError("this node serves no waits on its user socket")

        def start() -> tuple[str, tuple[int, ...]]:
            user, node = who(args), client()
            cursor = _cursor(args, len(node.cores))
            if cursor is None:
                cursor = node.cursor(_count(args, "after_id", 0))
            return user, cursor

        user, cursor = await run(start)
        timeout = wait_timeout(args.get("timeout"))

        async def check() -> tuple[bool, list[int]]:
            tops = await run(lambda: client().inbox_tops(user))
            return any(t > a for t, a in zip(tops, cursor, strict=True)), tops

        if cfg.units == 1:
            return dict(await waiters.wait(check, timeout=timeout, pool="user", who=user))
        # Units 2..N commit into their own stores: their daemons tell this
        # one through their admin sockets, and the wait here checks again.
        others = [(cfg.for_unit(k).unit_dir / ADMIN_SOCKET_NAME, {"after_id": cursor[k - 1], "user": user})
                  for k in range(2, cfg.units + 1)]
        answer: dict[str, Any] = {}

        async def watch_others() -> None:
            while True:
                try:
                    got = await await_any(others, timeout)
                except (DaemonAway, WaitRefused):
                    await trio.sleep(1.0)  # a unit restarting, or its waits all taken: ask again
                    continue
                if any(r.get("ready") for r in got.values()):
                    waiters.arrived()
                    return

        async with trio.open_nursery() as nursery:
            async def local() -> None:
                answer.update(await waiters.wait(check, timeout=timeout, pool="user", who=user))
                nursery.cancel_scope.cancel()

            nursery.start_soon(local)
            nursery.start_soon(watch_others)
        return answer

    handlers: dict[str, Handler] = {"whoami": whoami, "send": send, "inbox": inbox, "get": get, "read": read,
                                    "ack": ack, "messages": messages, "wait_inbox": wait_inbox}
    if uploads is None:
        return handlers
    staging = uploads

    async def on_files(fn: Callable[[], Any]) -> Any:
        try:
            return await trio.to_thread.run_sync(fn, limiter=files)
        except UploadRefused as e:
            raise AdminCommandError(str(e)) from None

    async def upload_begin(args: dict[str, Any]) -> dict[str, Any]:
        """A document of ``size`` bytes for ``to`` (send's options), sent
        in blocks: its upload id and the block size."""
        size = _count(args, "size")
        to, kw = _options(args)

        def check() -> str:
            user = who(args)
            try:
                client().check_file(to, size, **kw)  # what send_file would refuse, before a byte is staged
            except DocumentRefused as e:
                raise AdminCommandError(str(e)) from None
            return user

        user = await run(check)
        uid = await on_files(lambda: staging.begin(user, size, max_size=cfg.max_document_mib << 20,
                                                   options={"to": to, **kw}))
        return {"upload": uid, "block": USER_BLOCK_BYTES}

    async def upload_block(args: dict[str, Any]) -> dict[str, Any]:
        """``data`` (one block) at ``offset``, which is what is staged so far."""
        user = await run(partial(who, args))
        staged = await on_files(lambda: staging.block(user, args.get("upload"), args.get("offset"), _block(args)))
        return {"staged": staged}

    async def upload_status(args: dict[str, Any]) -> dict[str, Any]:
        user = await run(partial(who, args))
        return dict(await on_files(lambda: staging.status(user, args.get("upload"))))

    async def upload_abort(args: dict[str, Any]) -> dict[str, Any]:
        user = await run(partial(who, args))
        return {"removed": await on_files(lambda: staging.abort(user, args.get("upload")))}

    async def upload_send(args: dict[str, Any]) -> dict[str, Any]:
        """Accept the whole upload as this user's document (``sha256``, hex:
        the client's digest, checked); durable when answered."""
        user = await run(partial(who, args))
        whole = await on_files(lambda: staging.finish(user, args.get("upload"), args.get("sha256")))
        opts = dict(whole.options)
        to = opts.pop("to")

        def go() -> dict[str, Any]:
            try:
                lk0 = client().send_file(to, whole.path, move=True, sha256=whole.sha256, user=user, **opts)
            except DocumentRefused as e:
                raise AdminCommandError(str(e)) from None
            finally:
                whole.path.unlink(missing_ok=True)  # (taken in, or refused: either way not kept)
            return {"lk0": str(lk0), "size": whole.size, "sha256": whole.sha256.hex()}
        return dict(await run(go))

    handlers.update({"upload_begin": upload_begin, "upload_block": upload_block, "upload_status": upload_status,
                     "upload_abort": upload_abort, "upload_send": upload_send})
    return handlers


# ---------------------------------------------------------------- the server


async def serve_user_socket(path: Path, cfg: Config, waiters: Any = None, *,
                            max_connections: int | None = None, uploads: Uploads | None = None,
                            task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the node's user socket on ``path`` (mode 0666; see the module's
    words on who may connect) until cancelled: ``max_connections`` at once
    (default: ``user_socket_max_connections``), each admitted by its
    authenticating first line (UserGate). Staged uploads live in
    ``uploads/`` of the data directory (or ``uploads``'), emptied at start
    and swept for stale ones every minute. ``task_status`` gets the path."""
    store = _Store(cfg)
    uploads = uploads or Uploads(cfg.directory / UPLOADS_DIR)
    left = await trio.to_thread.run_sync(uploads.reset)
    if left:
        log.info("removed %d upload(s) a previous run left unfinished", left)
    handlers = user_handlers(cfg, waiters, store=store, uploads=uploads)
    limits = Limits(max_request=USER_MAX_REQUEST, idle_s=USER_IDLE_S,
                    max_clients=int(max_connections or cfg.user_socket_max_connections or USER_MAX_CONNECTIONS))
    async with trio.open_nursery() as nursery:
        got = await nursery.start(partial(serve_admin, path, handlers, mode=0o666, limits=limits, credentials=True,
                                          gate=UserGate(store), what="the user socket"))

        async def sweep() -> None:
            while True:
                await trio.sleep(_SWEEP_S)
                await trio.to_thread.run_sync(uploads.sweep)

        nursery.start_soon(sweep)
        task_status.started(got)
