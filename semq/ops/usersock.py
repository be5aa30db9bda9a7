"""The node's user socket: where a user's application sends and reads its
own documents (SPEC "Users"; semq.node.users).

The node's data directory is its operator's (mode 0700): whoever opens the
store sees every document. A user's application does not; it talks to the
running node on this Unix socket (mode 0666, at ``user_socket`` — put it
where users can reach it) and proves who it is with every request, by

- its token (``semq user add`` printed it; only its digest is stored), or
- its operating-system account, when the user is tied to one
  (``semq user add NAME --os-user ACCOUNT``): the kernel says which uid
  connected (SO_PEERCRED), the client cannot.

It is then answered for that user only: it sends as that user, lists,
reads (a large document in blocks: ``read``) and acknowledges the
documents for that user, and a document of
another user is "not in the inbox", like one that does not exist. It may
also wait for its next document (``wait_inbox``, semq.inbox_wait): answered
when a commit puts one of its documents into the inbox of any unit.

Protocol: the admin console's (semq.ops.admin: one JSON object per line),
with ``user`` and ``token`` in ``args``; documents travel base64-encoded.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import pwd
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio

from semq.config import Config
from semq.inbox_wait import (
    ADMIN_SOCKET_NAME,
    MAX_WAIT,
    DaemonAway,
    WaitRefused,
    await_any,
    wait_any,
)
from semq.node.api import UNIT_IDS, InboxItem, NodeClient, inbox_top
from semq.node.limits import MAX_DOCUMENT_SIZE, DocumentRefused
from semq.node.users import UserError, authenticate, user_for_os_account

from .admin import (
    AdminCommandError,
    AdminError,
    AdminUnavailable,
    Handler,
    admin_request,
    until_hangup,
)
from .waiters import wait_timeout

log = logging.getLogger("semq.ops.usersock")

__all__ = ["MAX_USER_REQUEST", "UserClient", "UserSocketError", "UserSocketUnavailable", "user_handlers",
           "user_socket_path"]

# A request carries a document base64-encoded (4/3 of its size) and its fields.
MAX_USER_REQUEST: Final = MAX_DOCUMENT_SIZE * 4 // 3 + 64 * 1024
_LIST_LIMIT: Final = 10_000  # documents one inbox request may list
# A large document is read in blocks of at most this many bytes per request
# (``read``): never whole in the node's memory, nor in the answer.
READ_BLOCK: Final = 1 << 20
MAX_READ_BLOCK: Final = 4 << 20


class UserSocketError(Exception):
    """The user socket could not answer, or refused (one line for the user)."""


class UserSocketUnavailable(UserSocketError):
    """No node answers on the user socket (not running, or restarting)."""


def user_socket_path(cfg: Config) -> Path | None:
    """Where the node's user socket is (None: it has none)."""
    if not cfg.user_socket:
        return None
    p = Path(cfg.user_socket)
    return p if p.is_absolute() else cfg.directory / p


def _item(i: InboxItem, data: bool) -> dict[str, Any]:
    out = {"id": i.id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id, "from_user": i.from_user,
           "to_user": i.to_user, "channel": i.channel, "gap": i.gap,
           "app_key": {"domain": i.app_key.domain, "data_type": i.app_key.data_type,
                       "subtype": i.app_key.subtype, "key": i.app_key.key},
           "size": i.size, "created_ms": i.created_ms, "received_ms": i.received_ms,
           "consumed": i.consumed_ms is not None, "unit": i.unit}
    if i.path is not None:
        out["large"] = True  # its content is read in blocks (``read``), not carried here
    elif data:
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


def user_handlers(cfg: Config, waiters: Any = None) -> dict[str, Handler]:
    """The user socket's commands, each answered for the user its request
    proves it is: whoami, send, inbox, get, ack, messages, and wait_inbox
    when ``waiters`` (semq.ops.waiters.InboxWaiters, this unit's) is given.
    The store is reached through a NodeClient of its own, on one worker
    thread."""
    limiter = trio.CapacityLimiter(1)
    holder: list[NodeClient] = []

    def client() -> NodeClient:
        if not holder:
            holder.append(NodeClient(cfg.directory, config=cfg))
        return holder[0]

    def who(args: dict[str, Any]) -> str:
        user, token = args.get("user") or "", args.get("token") or ""
        if not isinstance(user, str) or not isinstance(token, str):
            raise AdminCommandError("user and token are strings")
        conn = client().core.conn
        if token:
            if not user:
                raise AdminCommandError("a token needs its user name (user)")
            try:
                return authenticate(conn, user, token)
            except UserError as e:
                raise AdminCommandError(str(e)) from None
        uid = args.get("peer_uid")
        account = ""
        if isinstance(uid, int):
            try:
                account = pwd.getpwuid(uid).pw_name
            except KeyError:
                account = ""
        name = user_for_os_account(conn, account)
        if name is None or (user and user != name):
            raise AdminCommandError(f"no token, and the account {account or uid!r} is not tied to"
                                    f" {'user ' + user if user else 'a user'} of this node")
        return name

    async def run(fn: Any) -> Any:
        return await trio.to_thread.run_sync(fn, limiter=limiter)

    def _limit(args: dict[str, Any]) -> int:
        limit = args.get("limit", 100)
        if not isinstance(limit, int) or not 1 <= limit <= _LIST_LIMIT:
            raise AdminCommandError(f"limit {limit!r} is outside 1..{_LIST_LIMIT}")
        return limit

    async def whoami(args: dict[str, Any]) -> dict[str, Any]:
        return {"user": await run(partial(who, args)), "org": cfg.org, "units": cfg.units}

    async def send(args: dict[str, Any]) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            user = who(args)
            try:
                data = base64.b64decode(args.get("data", ""), validate=True)
            except (binascii.Error, TypeError) as e:
                raise AdminCommandError(f"data is not base64: {e}") from None
            to = args.get("to")
            if not isinstance(to, str) or not to:
                raise AdminCommandError("send needs to (ORG, ORG/USER or a colleague's name)")
            kw = {k: args[k] for k in ("data_type", "domain", "subtype", "key", "save_fwd", "ack2", "priority",
                                       "expires_in", "encrypt", "clear_app_key", "ordered") if k in args}
            try:
                lk0 = client().send(to, data, user=user, **kw)
            except DocumentRefused as e:
                raise AdminCommandError(str(e)) from None
            except TypeError as e:
                raise AdminCommandError(f"send: {e}") from None
            return {"lk0": str(lk0), "size": len(data)}
        return dict(await run(go))

    async def inbox(args: dict[str, Any]) -> list[dict[str, Any]]:
        def go() -> list[dict[str, Any]]:
            user = who(args)
            after = args.get("after_id", 0)
            if not isinstance(after, int) or after < 0:
                raise AdminCommandError(f"after_id {after!r} is not a non-negative integer")
            node = client()
            cursor = _cursor(args, len(node.cores))
            if cursor is not None:  # a follower's position: unacknowledged documents above it
                items = node.inbox_after(cursor, user=user, limit=_limit(args))
            else:
                items = node.inbox(unread=not args.get("all"), limit=_limit(args), after_id=after, user=user)
            return [_item(i, bool(args.get("data"))) for i in items]
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
        most MAX_READ_BLOCK) from ``offset``; for a large one, read from its
        file, never whole."""
        def go() -> dict[str, Any]:
            user = who(args)
            item_id, offset, length = args.get("id"), args.get("offset", 0), args.get("length", READ_BLOCK)
            if not isinstance(item_id, int):
                raise AdminCommandError(f"id {item_id!r} is not an inbox document id")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise AdminCommandError(f"offset {offset!r} is not a non-negative integer")
            if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= MAX_READ_BLOCK:
                raise AdminCommandError(f"length {length!r} is outside 1..{MAX_READ_BLOCK}")
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
                after = args.get("after_id", 0)
                if not isinstance(after, int) or isinstance(after, bool) or after < 0:
                    raise AdminCommandError(f"after_id {after!r} is not a non-negative integer")
                cursor = node.cursor(after)
            return user, cursor

        user, cursor = await run(start)
        timeout = wait_timeout(args.get("timeout"))

        async def check() -> tuple[bool, list[int]]:
            tops = await run(lambda: [inbox_top(core.conn, user) for core in client().cores])
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

    return {"whoami": whoami, "send": send, "inbox": inbox, "get": get, "read": read, "ack": ack,
            "messages": messages, "wait_inbox": wait_inbox}


class UserClient:
    """A user's application's side of the user socket::

        with UserClient("/run/semq/56001.sock", "alice", token) as me:
            me.send("10008/bob", b"<order/>", data_type="ORDER", ordered="orders")
            for doc in me.follow():  # woken by the node as documents arrive
                handle(doc["data"]); me.acknowledge([doc["id"]])
            me.save(doc_id, "drawing.dwg")  # a large document ("large": True) by blocks

    ``token`` None: the user tied to this process's operating-system
    account. Raises UserSocketError with the node's words."""

    def __init__(self, path: str | Path, user: str = "", token: str | None = None, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.user = user
        self.token = token or ""
        self.timeout = timeout

    def __enter__(self) -> UserClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _call(self, cmd: str, **args: Any) -> Any:
        try:
            resp = admin_request(self.path, cmd, {"user": self.user, "token": self.token, **args}, self.timeout,
                                 max_response=MAX_USER_REQUEST)
        except AdminUnavailable:
            raise UserSocketUnavailable(f"no node answers on {self.path} (not running, or its user_socket"
                                        " setting names another path)") from None
        except AdminError as e:
            raise UserSocketError(f"the node's user socket {self.path}: {e}") from None
        if not resp.get("ok"):
            raise UserSocketError(str(resp.get("error", "refused")))
        return resp.get("result")

    def whoami(self) -> str:
        return str(self._call("whoami")["user"])

    def send(self, to: str, data: bytes, **kw: Any) -> str:
        """Accept a document from this user (the keywords of NodeClient.send,
        ``ordered`` too); returns its LK0. Durable when this returns."""
        return str(self._call("send", to=to, data=base64.b64encode(data).decode(), **kw)["lk0"])

    @staticmethod
    def _decoded(item: dict[str, Any]) -> dict[str, Any]:
        if "data" in item:
            item["data"] = base64.b64decode(item["data"])
        return item

    def inbox(self, *, unread: bool = True, limit: int = 100, after_id: int = 0,
              data: bool = False) -> list[dict[str, Any]]:
        """This user's documents (``data``: with their contents, as bytes)."""
        return [self._decoded(i) for i in self._call("inbox", all=not unread, limit=limit, after_id=after_id,
                                                     data=data)]

    def get(self, item_id: int) -> dict[str, Any]:
        return self._decoded(self._call("get", id=item_id))

    def read(self, item_id: int, *, block: int = READ_BLOCK) -> Iterator[bytes]:
        """This user's document ``item_id`` in blocks of ``block`` bytes, a
        large one too (``"large": True`` in its item, which carries no
        ``data``): never whole in memory on either side."""
        offset = 0
        while True:
            got = self._call("read", id=item_id, offset=offset, length=block)
            data = base64.b64decode(got["data"])
            if data:
                yield data
            offset += len(data)
            if got["eof"] or not data:
                return

    def save(self, item_id: int, dest: str | Path) -> int:
        """Write this user's document ``item_id`` to ``dest`` by blocks (a
        temporary file beside it, renamed when whole); the bytes written."""
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.part")
        n = 0
        try:
            with open(tmp, "wb") as f:
                for block in self.read(item_id):
                    f.write(block)
                    n += len(block)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return n

    def acknowledge(self, ids: list[int]) -> int:
        return int(self._call("ack", ids=ids)["acknowledged"])

    def messages(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._call("messages", limit=limit))

    def follow(self, after_id: int = 0, *, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield this user's unacknowledged documents above ``after_id``
        (with contents), then each new one as it arrives, once, until
        ``timeout`` seconds pass without one (None: for ever). Woken by the
        node (``wait_inbox``), never by a timer; while the node does not
        answer, tried again every second (said once in the log)."""
        cursor: list[int] | None = None
        away = False
        last = time.monotonic()
        while True:
            span = MAX_WAIT if timeout is None else min(MAX_WAIT, timeout - (time.monotonic() - last))
            if span <= 0:
                return
            try:
                if cursor is None:  # the node's units say how its ids read
                    units = int(self._call("whoami").get("units", 1))
                    cursor = ([after_id] if units == 1
                              else [max(0, (after_id - k) // UNIT_IDS) for k in range(1, units + 1)])
                fresh = self._call("inbox", after=cursor, limit=_LIST_LIMIT)
                for i in fresh:
                    row = i["id"] if len(cursor) == 1 else i["id"] // UNIT_IDS
                    cursor[i["unit"] - 1] = max(cursor[i["unit"] - 1], row)
                    yield self.get(i["id"])
                if fresh:
                    last = time.monotonic()
                    continue
                wait_any([(self.path, {"user": self.user, "token": self.token, "after": cursor})], span)
            except (UserSocketUnavailable, DaemonAway) as e:
                if not away:
                    log.warning("%s: trying again every second", e)
                    away = True
                time.sleep(min(1.0, span))
                continue
            except WaitRefused as e:
                raise UserSocketError(str(e)) from None
            away = False

    def receive(self, *, timeout: float = 10.0, poll: float = 0.2) -> Iterator[dict[str, Any]]:
        """Yield this user's unread documents (with contents) as they
        arrive, each once, until ``timeout`` passes with nothing new. They
        stay unread until acknowledged."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # The list without contents (small), then each new one whole: an
            # answer stays within one document's size.
            fresh = [i["id"] for i in self.inbox(limit=_LIST_LIMIT) if i["id"] not in seen]
            for item_id in fresh:
                seen.add(item_id)
                yield self.get(item_id)
            if fresh:
                deadline = time.monotonic() + timeout
            else:
                time.sleep(poll)
