"""What the HTTP API does for a caller, without HTTP: send, the inbox
(list, one document, its content in blocks, acknowledge, wait for the
next), track, partners — over the node's stores as the user socket reaches
them (semq.ops.usersock: a NodeClient of its own, one worker thread at a
time), with the same checks as ``semq send`` (NodeClient.send,
``check_file``, ``send_file``) and the same isolation: a caller that is a
user of the node (``Caller.user``) sees and acknowledges only that user's
documents, and another user's is "not in the inbox", like one that does
not exist. A console session is the node's operator (``user`` None), as
``semq inbox`` run by the operator is.

Large documents never pass through memory whole: a body over one block is
staged block after block (semq.ops.uploads, in ``api-uploads/`` of the data
directory) and handed to the large-document path; content is read in
blocks from its file.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from semq.node.api import InboxItem, NodeClient
from semq.node.users import UserError
from semq.ops.admin import AdminCommandError, Handler
from semq.ops.uploads import Staged, UploadRefused, Uploads
from semq.session.inbox_wait import ADMIN_SOCKET_NAME, MAX_WAIT, DaemonAway, WaitRefused, await_any
from semq.settings.bounds import USER_BLOCK_BYTES
from semq.umxt_protocol import LocalProtocolError

__all__ = ["API_UPLOADS_DIR", "PAGE_LIMIT", "SEND_OPTIONS", "ApiError", "ApiService", "Caller", "item_json",
           "parse_cursor"]

log = logging.getLogger("semq.web.api")

T = TypeVar("T")

API_UPLOADS_DIR: Final = "api-uploads"  # in the node's data directory: bodies over one block, staged
PAGE_LIMIT: Final = 1000  # documents one inbox page lists at most

#: The send options a request may give (NodeClient.send's keywords a user
#: may set), each parsed from its query-string text.
SEND_OPTIONS: Final[dict[str, type]] = {
    "data_type": str, "domain": str, "subtype": str, "key": str, "priority": int, "save_fwd": int,
    "expires_in": float, "ack2": bool, "encrypt": bool, "clear_app_key": bool, "ordered": str,
}


class ApiError(Exception):
    """A request the API refuses: ``status`` (HTTP) and one line naming the
    value and the limit. ``limit`` / ``value``: for the JSON error."""

    def __init__(self, status: int, message: str, *, value: Any = None, limit: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.value = value
        self.limit = limit

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": str(self), "status": self.status}
        if self.value is not None:
            out["value"] = self.value
        if self.limit is not None:
            out["limit"] = self.limit
        return out


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who a request is answered for: ``user`` of this node (by its token),
    or the node's operator (``user`` None: a console session, ``name`` its
    account, ``operator`` its role)."""

    user: str | None
    name: str
    operator: bool = True

    @property
    def key(self) -> str:
        """Whose share of the limits this request takes."""
        return self.user if self.user is not None else f"console:{self.name}"  # (a user's name has no colon)


def item_json(i: InboxItem) -> dict[str, Any]:
    """One inbox document's metadata (never its content)."""
    return {"id": i.id, "lk0": str(i.lk0), "from": i.lk0.endpoint.node_id, "from_user": i.from_user,
            "to_user": i.to_user, "channel": i.channel,
            "app_key": {"domain": i.app_key.domain, "data_type": i.app_key.data_type,
                        "subtype": i.app_key.subtype, "key": i.app_key.key},
            "size": i.size, "large": i.path is not None, "created_ms": i.created_ms,
            "received_ms": i.received_ms, "acknowledged": i.consumed_ms is not None, "unit": i.unit}


def parse_options(query: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """A send's target (``to``) and options from the query string. Raises
    ApiError 400 naming the value."""
    to = query.get("to", "").strip()
    if not to:
        raise ApiError(400, "send needs to= (ORG, ORG/USER or a colleague's name)", value=to)
    kw: dict[str, Any] = {}
    for k, kind in SEND_OPTIONS.items():
        if k not in query:
            continue
        text = query[k]
        try:
            if kind is bool:
                if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError
                kw[k] = text.lower() in ("1", "true", "yes")
            elif kind is int:
                kw[k] = int(text)
            elif kind is float:
                kw[k] = float(text)
            else:
                kw[k] = text
        except ValueError:
            raise ApiError(400, f"{k} {text!r} is not {kind.__name__}", value=text) from None
    exp = kw.get("expires_in")
    if exp is not None and not 0 < exp < 10 * 365 * 86400:
        raise ApiError(400, f"expires_in {exp:g} s is outside (0, 10 years]: a document that expires at once"
                       " could only fail", value=exp)
    return to, kw


def parse_cursor(text: str, units: int, from_id: Callable[[int], tuple[int, ...]]) -> tuple[int, ...]:
    """A follow's ``after``: an inbox id (``from_id`` makes it a cursor) or
    a cursor, one row id per unit. Raises ApiError 400 naming it."""
    parts = text.split(",") if text else ["0"]
    if not all(p.isdigit() and len(p) <= 19 for p in parts):
        raise ApiError(400, f"after {text[:60]!r} is not an inbox id or a cursor of {units} row ids", value=text[:60])
    if len(parts) == 1 and (units == 1 or "," not in text):
        return tuple(from_id(int(parts[0])))
    if len(parts) != units:
        raise ApiError(400, f"after {text[:60]!r} has {len(parts)} row ids; this node has {units} units",
                       value=text[:60], limit=units)
    return tuple(int(p) for p in parts)


class ApiService:
    """The node's side of the API, for one node (unit 1 of its units).
    ``cfg``: its semq.settings.config.Config; ``handlers``: the admin
    handlers of this unit (``partners``, when this build has it);
    ``waiters``: its semq.ops.waiters.InboxWaiters (a follow waits in their
    ``api`` pool), or None (then a follow answers what there is at once)."""

    def __init__(self, cfg: Any, *, handlers: dict[str, Handler] | None = None, waiters: Any = None) -> None:
        self.cfg = cfg
        self.handlers = handlers or {}
        self.waiters = waiters
        self.limiter = trio.CapacityLimiter(1)  # the store's thread (SQLite: one writer)
        self.files = trio.CapacityLimiter(2)  # staged uploads and content reads, beside the store's thread
        self.uploads = Uploads(Path(cfg.directory) / API_UPLOADS_DIR)
        self._client: NodeClient | None = None

    @property
    def max_document(self) -> int:
        return int(self.cfg.max_document_mib) << 20

    def client(self) -> NodeClient:
        if self._client is None:
            self._client = NodeClient(self.cfg.directory, config=self.cfg)
        return self._client

    async def start(self) -> None:
        """Empty the staging directory (uploads do not survive a restart)."""
        left = await trio.to_thread.run_sync(self.uploads.reset)
        if left:
            log.info("removed %d API upload(s) a previous run left unfinished", left)

    async def sweep_forever(self, every: float = 60.0) -> None:
        while True:
            await trio.sleep(every)
            await trio.to_thread.run_sync(self.uploads.sweep)

    async def store(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self.limiter)

    # ------------------------------------------------------------ who

    def _user_of(self, token: str, name: str | None) -> str:
        node = self.client()
        try:
            return node.authenticate(name, token) if name else node.user_for_token(token)
        except UserError as e:
            raise ApiError(401, str(e)) from None

    async def authenticate(self, token: str, name: str | None = None) -> Caller:
        """The user of a bearer token (``name`` given: that user's token,
        as HTTP Basic sends it). ApiError 401 otherwise."""
        user = await self.store(lambda: self._user_of(token, name))
        return Caller(user=user, name=user)

    def _check(self, caller: Caller) -> str | None:
        """Whose documents a caller's store work is about (None: every
        document, the operator's). The token was proved at the request's
        start (``authenticate``, once per request): a user removed, or given
        a new token, is refused from the next request on."""
        return caller.user

    # ------------------------------------------------------------ send

    async def send_bytes(self, caller: Caller, to: str, options: dict[str, Any], data: bytes) -> dict[str, Any]:
        """Accept a document of at most one block; durable when answered."""
        def go() -> dict[str, Any]:
            user = self._check(caller)
            try:
                lk0 = self.client().send(to, data, user=user, **options)
            except (LocalProtocolError, ValueError) as e:
                raise ApiError(400, str(e)) from None
            return {"lk0": str(lk0), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return await self.store(go)

    async def check_send(self, caller: Caller, to: str, options: dict[str, Any], size: int) -> None:
        """What ``send_file`` would refuse of ``size`` bytes, before a byte is staged."""
        def go() -> None:
            self._check(caller)
            if size > self.max_document:
                raise ApiError(413, f"document of {size} bytes exceeds this node's max_document_mib of"
                               f" {self.cfg.max_document_mib} MiB", value=size, limit=self.max_document)
            try:
                self.client().check_file(to, size, **options)
            except (LocalProtocolError, ValueError) as e:
                raise ApiError(400, str(e)) from None
        await self.store(go)

    async def _files(self, fn: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(fn, limiter=self.files)
        except UploadRefused as e:
            raise ApiError(400, str(e)) from None

    async def stage_begin(self, caller: Caller, to: str, options: dict[str, Any], size: int) -> str:
        return await self._files(lambda: self.uploads.begin(caller.key, size, max_size=self.max_document,
                                                            options={"to": to, **options}))

    async def stage_block(self, caller: Caller, upload: str, offset: int, data: bytes) -> int:
        return await self._files(lambda: self.uploads.block(caller.key, upload, offset, data))

    async def stage_abort(self, caller: Caller, upload: str) -> None:
        try:
            await self._files(lambda: self.uploads.abort(caller.key, upload))
        except ApiError:
            pass  # (gone already)

    async def stage_send(self, caller: Caller, upload: str, sha256: str | None) -> dict[str, Any]:
        """Accept the whole staged body (its SHA-256 checked against
        ``sha256``, hex); durable when answered."""
        whole: Staged = await self._files(lambda: self.uploads.finish(caller.key, upload, sha256))
        opts = dict(whole.options)
        to = opts.pop("to")

        def go() -> dict[str, Any]:
            try:
                user = self._check(caller)
                lk0 = self.client().send_file(to, whole.path, move=True, sha256=whole.sha256, user=user, **opts)
            except (LocalProtocolError, ValueError) as e:
                raise ApiError(400, str(e)) from None
            finally:
                whole.path.unlink(missing_ok=True)  # (taken in, or refused: either way not kept)
            return {"lk0": str(lk0), "size": whole.size, "sha256": whole.sha256.hex()}
        return await self.store(go)

    # ------------------------------------------------------------ the inbox

    async def inbox(self, caller: Caller, *, after: int, limit: int, everything: bool,
                    contents: bool = False) -> dict[str, Any]:
        """A page of the caller's inbox above ``after`` (id order), with the
        total of documents it is a page of and the ``next`` page's ``after``.
        ``contents``: each document's content too (``content_base64``) while
        they fit in one block together, as the user socket's inbox gives
        them; the others (and every large one) are read with ``content``."""
        def go() -> dict[str, Any]:
            user = self._check(caller)
            node = self.client()
            items = node.inbox(unread=not everything, limit=limit, after_id=after, user=user)
            total = node.inbox_count(unread=not everything, user=user)
            docs, room = [], USER_BLOCK_BYTES if contents else 0
            for i in items:
                d = item_json(i)
                if i.path is None and len(i.app_data) <= room:
                    room -= len(i.app_data)
                    d["content_base64"] = base64.b64encode(i.app_data).decode()
                docs.append(d)
            return {"documents": docs, "total": total, "next": items[-1].id if len(items) == limit else None}
        return await self.store(go)

    def _item(self, caller: Caller, item_id: int) -> InboxItem:
        user = self._check(caller)
        try:
            return self.client().get(item_id, user=user)
        except KeyError:
            who = f"of user {user}" if user else "of this node"
            raise ApiError(404, f"document {item_id} is not in the inbox {who}", value=item_id) from None

    async def document(self, caller: Caller, item_id: int) -> dict[str, Any]:
        return item_json(await self.store(lambda: self._item(caller, item_id)))

    async def content(self, caller: Caller, item_id: int) -> tuple[InboxItem, Callable[[int], bytes]]:
        """The document and a reader of its content: ``read(offset)`` gives
        the next block from ``offset`` (b"" at the end), from memory or from
        its file, never the whole of a large one."""
        item = await self.store(lambda: self._item(caller, item_id))

        def read(offset: int) -> bytes:
            if item.path is None:
                return item.app_data[offset:offset + USER_BLOCK_BYTES]
            try:
                with open(item.path, "rb") as f:
                    f.seek(offset)
                    return f.read(USER_BLOCK_BYTES)
            except OSError as e:
                raise ApiError(410, f"document {item_id} cannot be read: {e.strerror or e}") from None

        return item, read

    async def read_block(self, read: Callable[[int], bytes], offset: int) -> bytes:
        return await trio.to_thread.run_sync(lambda: read(offset), limiter=self.files)

    async def acknowledge(self, caller: Caller, ids: list[int]) -> dict[str, Any]:
        """Acknowledge the caller's documents among ``ids`` (another's are
        left as they are: not counted)."""
        def go() -> dict[str, Any]:
            user = self._check(caller)
            return {"acknowledged": self.client().acknowledge(ids, user=user), "asked": len(ids)}
        return await self.store(go)

    async def follow(self, caller: Caller, *, after: str, timeout: float, limit: int) -> dict[str, Any]:
        """The caller's unacknowledged documents past ``after``, waiting at
        most ``timeout`` s for one (woken by the daemon's commits, never on
        a timer): ``{"documents": [...], "next": the cursor of the next
        follow}``. ``after``: an inbox id (from there on), or a cursor a
        follow answered — per unit of the node, the last row it gave
        (``"57"``; ``"57,12"`` on a node of two units): units fill at their
        own pace, so one id could not say where each one is."""
        def fetch() -> tuple[tuple[int, ...], list[InboxItem], tuple[int, ...]]:
            user = self._check(caller)
            node = self.client()
            cur = parse_cursor(after, len(node.cores), node.cursor)
            items = node.inbox_after(cur, user=user, limit=limit)[:limit]
            end = cur
            for i in items:
                end = node.advance(end, i)
            return cur, items, end

        cur, items, end = await self.store(fetch)
        if not items and timeout > 0 and self.waiters is not None:
            await self._wait(caller, cur, min(timeout, MAX_WAIT))
            cur, items, end = await self.store(fetch)
        return {"documents": [item_json(i) for i in items], "next": ",".join(map(str, end))}

    async def _wait(self, caller: Caller, cursor: tuple[int, ...], timeout: float) -> None:
        async def check() -> tuple[bool, list[int]]:
            tops = await self.store(lambda: self.client().inbox_tops(caller.user))
            return any(t > a for t, a in zip(tops, cursor, strict=True)), tops

        try:
            if len(cursor) == 1:
                await self.waiters.wait(check, timeout=timeout, pool="api", who=caller.key)
                return
            # Units 2..N commit into their own stores: their daemons tell us
            # through their admin sockets (as the user socket's waits do).
            others = [(self.cfg.for_unit(k).unit_dir / ADMIN_SOCKET_NAME,
                       {"after_id": cursor[k - 1], **({"user": caller.user} if caller.user else {})})
                      for k in range(2, len(cursor) + 1)]
            async with trio.open_nursery() as nursery:
                async def local() -> None:
                    await self.waiters.wait(check, timeout=timeout, pool="api", who=caller.key)
                    nursery.cancel_scope.cancel()

                async def remote() -> None:
                    with trio.move_on_after(timeout):
                        try:
                            await await_any(others, timeout)
                        except (DaemonAway, WaitRefused):
                            await trio.sleep_forever()  # (the local wait still ends it)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(local)
                nursery.start_soon(remote)
        except AdminCommandError as e:  # the waits' pool is full (WaitLimitReached)
            raise ApiError(429, str(e)) from None

    # ------------------------------------------------------------ track, partners

    async def track(self, caller: Caller, lk0: str, history: Callable[[str], Any]) -> list[dict[str, Any]]:
        """The delivery history's rows of ``lk0`` the caller may see: a
        user's own documents (sent by or to that user); the operator's, all."""
        rows: list[dict[str, Any]] = await history(lk0)
        if caller.user is None:
            return rows
        return [r for r in rows if (r.get("role") == "origin" and r.get("from_user") == caller.user)
                or (r.get("role") == "receiver" and r.get("to_user") == caller.user)]

    async def partners(self, caller: Caller) -> dict[str, Any]:
        """The admin-level ``partners`` answer (each counterpart: online,
        backlogs, certificate, link). ApiError 501 when this node's build
        has no such handler."""
        handler = self.handlers.get("partners")
        if handler is None:
            raise ApiError(501, "this node does not serve partners (its admin console has no 'partners' command)")
        try:
            return dict(await handler({}))
        except AdminCommandError as e:
            raise ApiError(400, str(e)) from None

    def whoami(self, caller: Caller) -> dict[str, Any]:
        return {"user": caller.user, "console_user": None if caller.user is not None else caller.name,
                "org": self.cfg.org, "units": self.cfg.units, "block": USER_BLOCK_BYTES,
                "max_document": self.max_document, "pid": os.getpid()}
