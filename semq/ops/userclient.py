"""A user's application's side of the node's user socket (the server's
side, and the protocol, are semq.ops.usersock). Synchronous; no trio.

A ``UserClient`` holds one connection and authenticates it once, on its
first line (``whoami`` with the user and token, or with neither: the
operating-system account the process runs as); later requests carry
neither. A connection the node closed (it was idle, or the node
restarted) is made again before the next request; a request that changes
nothing is asked again once when its connection broke under it.

Documents over one block (``USER_BLOCK_BYTES``, 1 MiB) move in blocks both
ways: ``send``/``send_file`` upload them (``upload_begin``, one
``upload_block`` per block, ``upload_send`` with the SHA-256 of the whole;
after a broken connection the upload goes on from what the node staged),
``read``/``save`` read them. Memory: one block, whatever the size.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

from semq.node.api import UNIT_IDS
from semq.session.inbox_wait import MAX_WAIT, DaemonAway, WaitRefused, unix_address, wait_any
from semq.settings.bounds import USER_BLOCK_BYTES

from .admin import MAX_RESPONSE

log = logging.getLogger("semq.ops.userclient")

__all__ = ["LIST_LIMIT", "UserClient", "UserSocketError", "UserSocketUnavailable"]

LIST_LIMIT: Final = 10_000  # documents one inbox request may list
# Commands that change nothing: asked again once on a new connection when
# the old one broke under them (the others may have been done: never twice).
_ASK_AGAIN: Final = frozenset({"whoami", "inbox", "get", "read", "messages", "upload_status"})
_RESUMES: Final = 3  # times an upload goes on after a broken connection


class UserSocketError(Exception):
    """The user socket could not answer, or refused (one line for the user)."""


class UserSocketUnavailable(UserSocketError):
    """No node answers on the user socket (not running, or restarting), or
    the connection broke before the answer came."""


class UserClient:
    """A user's application's side of the user socket::

        with UserClient("/run/semq/56001.sock", "alice", token) as me:
            me.send("10008/bob", b"<order/>", data_type="ORDER", ordered="orders")
            me.send_file("10008/bob", "drawing.dwg", data_type="CAD")  # by blocks, any size
            for doc in me.follow():  # woken by the node as documents arrive
                handle(doc["data"]); me.acknowledge([doc["id"]])
            me.save(doc_id, "drawing.dwg")  # a large document ("large": True) by blocks

    ``token`` None: the user tied to this process's operating-system
    account. Raises UserSocketError with the node's words. One connection,
    used by one request at a time (a lock); ``close()`` (or the ``with``
    block's end) closes it."""

    def __init__(self, path: str | Path, user: str = "", token: str | None = None, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.user = user
        self.token = token or ""
        self.timeout = timeout
        self.units = 1  # the node's units, and its block size: its first answer says
        self.block = USER_BLOCK_BYTES
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._lock = threading.Lock()

    def __enter__(self) -> UserClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next request opens another)."""
        with self._lock:
            self._drop()

    # ------------------------------------------------------------ the connection

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()

    def _alive(self) -> bool:
        """Whether the connection is still open and owes nothing: the node
        closes an idle one (and a restarted node's are gone)."""
        if self._sock is None:
            return False
        # (A poll, not a peeking recv: on a socket with a timeout CPython
        # waits for readability before the recv.) Readable with no request
        # out means closed by the node, or something said unasked (a
        # refusal before it closed): either way this connection is over.
        p = select.poll()
        p.register(self._sock, select.POLLIN | select.POLLPRI)
        return not p.poll(0)

    def _connect(self) -> None:
        """A new connection, authenticated by its first line."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            with unix_address(self.path) as addr:
                s.connect(addr)
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            raise UserSocketUnavailable(f"no node answers on {self.path} (not running, or its user_socket"
                                        " setting names another path)") from None
        except PermissionError:
            s.close()
            raise UserSocketError(f"permission denied on {self.path}: this account may not reach the node's user"
                                  " socket (the permissions of the directory it is in)") from None
        except OSError as e:
            s.close()
            raise UserSocketUnavailable(f"cannot reach the node's user socket {self.path}: {e}") from None
        self._sock = s
        resp = self._exchange("whoami", {"user": self.user, "token": self.token})
        if not resp.get("ok"):
            self._drop()
            raise UserSocketError(str(resp.get("error", "refused")))
        result = resp.get("result") or {}
        self.units = int(result.get("units", 1))
        self.block = min(USER_BLOCK_BYTES, int(result.get("block", USER_BLOCK_BYTES)))

    def _exchange(self, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
        """One request and its answer on the open connection. Raises
        UserSocketUnavailable when the connection broke (it is dropped),
        UserSocketError when no whole answer came in time (dropped too: a
        late answer would be taken for the next request's)."""
        s = self._sock
        assert s is not None
        line = json.dumps({"cmd": cmd, "args": args}, separators=(",", ":")).encode() + b"\n"
        deadline = time.monotonic() + self.timeout
        buf = self._buf
        try:
            s.settimeout(self.timeout)
            s.sendall(line)
            start = 0
            while (nl := buf.find(b"\n", start)) < 0:
                start = len(buf)
                s.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise ConnectionResetError("closed by the node")
                buf += chunk
                if len(buf) > MAX_RESPONSE:
                    raise UserSocketError(f"answer to {cmd!r} exceeds {MAX_RESPONSE} bytes")
        except TimeoutError:
            self._drop()
            raise UserSocketError(f"no answer to {cmd!r} from {self.path} within {self.timeout:g} s") from None
        except UserSocketError:
            self._drop()
            raise
        except OSError as e:
            self._drop()
            raise UserSocketUnavailable(f"the connection to the node's user socket {self.path} broke during"
                                        f" {cmd!r}: {e.strerror or e}") from None
        answer = bytes(buf[:nl])
        del buf[: nl + 1]
        try:
            resp = json.loads(answer)
        except ValueError as e:
            self._drop()
            raise UserSocketError(f"the node's answer is not JSON: {e}") from None
        if not isinstance(resp, dict) or "ok" not in resp:
            self._drop()
            raise UserSocketError("the node's answer has no 'ok' field")
        return resp

    def _call(self, cmd: str, **args: Any) -> Any:
        with self._lock:
            fresh = not self._alive()
            if fresh:
                self._drop()
                self._connect()
            try:
                resp = self._exchange(cmd, args)
            except UserSocketUnavailable:
                if fresh or cmd not in _ASK_AGAIN:
                    raise
                self._connect()  # (the node closed it between our look and the request)
                resp = self._exchange(cmd, args)
        if not resp.get("ok"):
            raise UserSocketError(str(resp.get("error", "refused")))
        return resp.get("result")

    # ------------------------------------------------------------ requests

    def whoami(self) -> str:
        return str(self._call("whoami")["user"])

    def send(self, to: str, data: bytes, **kw: Any) -> str:
        """Accept a document from this user (the keywords of NodeClient.send,
        ``ordered`` too); returns its LK0. Durable when this returns. Over
        one block it is uploaded in blocks (then it may be a large document,
        up to the node's ``max_document_mib``)."""
        if len(data) > self.block:
            return self._upload(to, io.BytesIO(data), len(data), kw)
        return str(self._call("send", to=to, data=base64.b64encode(data).decode(), **kw)["lk0"])

    def send_file(self, to: str, path: str | Path, *, progress: Callable[[int], None] | None = None,
                  **kw: Any) -> str:
        """Accept the content of the file ``path`` from this user, read and
        uploaded block by block (``progress(n)`` after each); returns its
        LK0, durable when this returns. Up to the node's
        ``max_document_mib``: over ``large_from_mib`` it travels as a large
        document. Raises OSError for a file that cannot be read."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= self.block:
                data = f.read()
                lk0 = self.send(to, data, **kw)
                if progress is not None:
                    progress(len(data))
                return lk0
            return self._upload(to, f, size, kw, progress)

    def _upload(self, to: str, f: BinaryIO, size: int, kw: dict[str, Any],
                progress: Callable[[int], None] | None = None) -> str:
        up = self._call("upload_begin", size=size, to=to, **kw)
        uid = up["upload"]
        block = min(self.block, int(up.get("block", self.block)))
        h = hashlib.sha256()
        offset, resumes = 0, 0
        try:
            while offset < size:
                data = f.read(min(block, size - offset))
                if not data:
                    raise UserSocketError(f"the document ended at {offset} of its {size} bytes (did it change while"
                                          " it was sent?)")
                try:
                    self._call("upload_block", upload=uid, offset=offset, data=base64.b64encode(data).decode())
                except UserSocketUnavailable:
                    resumes += 1
                    if resumes > _RESUMES:
                        raise
                    staged = int(self._call("upload_status", upload=uid)["staged"])
                    if staged == offset:  # that block did not land: again
                        f.seek(offset)
                        continue
                    if staged != offset + len(data):
                        raise
                h.update(data)
                offset += len(data)
                if progress is not None:
                    progress(len(data))
            if f.read(1):
                raise UserSocketError(f"the document grew past the {size} bytes it had when its upload began")
            got = self._call("upload_send", upload=uid, sha256=h.hexdigest())
        except BaseException:
            try:
                self._call("upload_abort", upload=uid)
            except UserSocketError:
                pass  # (gone already, or the node away: it removes a stale upload itself)
            raise
        return str(got["lk0"])

    def _decoded(self, item: dict[str, Any]) -> dict[str, Any]:
        if "data" in item:
            item["data"] = base64.b64decode(item["data"])
        return item

    def _whole(self, item: dict[str, Any]) -> dict[str, Any]:
        """``item`` with its ``data`` (read in blocks when the answer did
        not carry it); a large document's stays out (``read``/``save``)."""
        self._decoded(item)
        if "data" not in item and not item.get("large"):
            item["data"] = b"".join(self.read(item["id"]))
        return item

    def inbox(self, *, unread: bool = True, limit: int = 100, after_id: int = 0,
              data: bool = False) -> list[dict[str, Any]]:
        """This user's documents (``data``: with their contents, as bytes;
        a large one's stay out: ``read``/``save`` it)."""
        items = self._call("inbox", all=not unread, limit=limit, after_id=after_id, data=data)
        return [self._whole(i) if data else self._decoded(i) for i in items]

    def get(self, item_id: int) -> dict[str, Any]:
        """This user's document ``item_id`` with its ``data`` (a large one
        without: ``read``/``save`` it)."""
        return self._whole(self._call("get", id=item_id))

    def read(self, item_id: int, *, block: int = USER_BLOCK_BYTES) -> Iterator[bytes]:
        """This user's document ``item_id`` in blocks of ``block`` bytes (at
        most one block of the node's), a large one too (``"large": True``
        in its item, which carries no ``data``): never whole in memory on
        either side."""
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
        node (``wait_inbox``, on a connection of its own), never by a timer;
        while the node does not answer, tried again every second (said
        once in the log)."""
        cursor: list[int] | None = None
        away = False
        last = time.monotonic()
        while True:
            span = MAX_WAIT if timeout is None else min(MAX_WAIT, timeout - (time.monotonic() - last))
            if span <= 0:
                return
            try:
                if cursor is None:  # the node's units say how its ids read
                    self.whoami()
                    units = self.units
                    cursor = ([after_id] if units == 1
                              else [max(0, (after_id - k) // UNIT_IDS) for k in range(1, units + 1)])
                fresh = self._call("inbox", after=cursor, limit=LIST_LIMIT)
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
            # The list without contents (small), then each new one whole.
            fresh = [i["id"] for i in self.inbox(limit=LIST_LIMIT) if i["id"] not in seen]
            for item_id in fresh:
                seen.add(item_id)
                yield self.get(item_id)
            if fresh:
                deadline = time.monotonic() + timeout
            else:
                time.sleep(poll)
