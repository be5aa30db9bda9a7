"""The HTTP API's shell: an ASGI application mounted at ``/api/v1`` on the
web console's HTTPS listener (semq.web.server). Routes come from the one
table (semq.web.api.spec); the work is semq.web.api.service's.

Every request, in this order (so a stranger costs one header's parse):

1. the address's wrong-token count: over ``API_AUTH_FAILURES`` a minute,
   429 unchecked;
2. who: ``Authorization: Bearer <token>`` (the user whose token it is) or
   ``Basic`` (user and token), else the console's session cookie (the
   node's operator; a state-changing call also needs the session's CSRF
   token in ``X-CSRF-Token`` and the role operator); none of these: 401;
3. a slot: at most ``API_MAX_IN_FLIGHT`` requests in flight, at most
   ``API_IN_FLIGHT_PER_CALLER`` of one caller, held until the answer's
   last byte (a streamed content, a follow): 429;
4. the handler; a body is read only now, bounded by its Content-Length
   (413 over its limit, 411 without one) and by time (``API_BLOCK_S`` per
   MiB: 408).

Every refusal is JSON: ``{"error": "...", "status": N, "value": ..., "limit": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from semq.settings.bounds import (
    API_AUTH_FAILURES,
    API_BLOCK_S,
    API_DRAIN_BYTES,
    API_FOLLOW_S,
    API_IN_FLIGHT_PER_CALLER,
    API_MAX_IN_FLIGHT,
    API_MAX_JSON,
    USER_BLOCK_BYTES,
)

from .service import PAGE_LIMIT, ApiError, ApiService, Caller, parse_options
from .spec import ENDPOINTS, PREFIX, Endpoint, openapi

__all__ = ["CSRF_HEADER", "ApiApp", "Slots"]

log = logging.getLogger("semq.web.api")

CSRF_HEADER: Final = "x-csrf-token"
_FAIL_WINDOW: Final = 60.0  # s: API_AUTH_FAILURES counts in it, and an address stays refused for it
_MAX_ACK: Final = 1000  # ids in one acknowledgement
_MAX_ID: Final = 2**62  # an inbox id is at most this (SQLite's integers are 64-bit)

#: A console session for a request: (account, role, CSRF token), or None.
SessionOf = Callable[[Request], tuple[str, str, str] | None]
History = Callable[[str], Awaitable[list[dict[str, Any]]]]


class Slots:
    """Requests in flight: at most ``total``, at most ``each`` per caller;
    wrong tokens per address (``failed``/``refused``). On the trio thread."""

    def __init__(self, *, total: int = API_MAX_IN_FLIGHT, each: int = API_IN_FLIGHT_PER_CALLER,
                 failures: int = API_AUTH_FAILURES, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.each, self.failures, self.clock = total, each, failures, clock
        self.busy = 0
        self.by: dict[str, int] = {}
        self._failed: dict[str, deque[float]] = {}
        self._checking: dict[str, int] = {}  # tokens of an address being checked now
        self._right: dict[bytes, float] = {}  # digests of tokens that were right, and when

    def take(self, key: str) -> None:
        if self.busy >= self.total:
            raise ApiError(429, f"{self.busy} API requests are in flight, the limit of {self.total}: try again",
                           value=self.busy, limit=self.total)
        mine = self.by.get(key, 0)
        if mine >= self.each:
            raise ApiError(429, f"{mine} requests of {key} are in flight, the limit of {self.each} per user:"
                           " wait for one to finish", value=mine, limit=self.each)
        self.busy += 1
        self.by[key] = mine + 1

    def give(self, key: str) -> None:
        self.busy -= 1
        left = self.by[key] - 1
        if left:
            self.by[key] = left
        else:
            del self.by[key]

    def _recent(self, address: str) -> deque[float]:
        q = self._failed.get(address)
        if q is None:
            return deque()
        now = self.clock()
        while q and now - q[0] > _FAIL_WINDOW:
            q.popleft()
        if not q:
            del self._failed[address]
        return q

    def refused(self, address: str) -> None:
        """429 when ``address`` has ``failures`` wrong tokens in the last
        minute, counting the tokens of its being checked now: counted
        before the check (as the console's logins are), parallel guesses
        cannot all pass this look before the first one has failed."""
        n = len(self._recent(address)) + self._checking.get(address, 0)
        if n >= self.failures:
            raise ApiError(429, f"{n} requests with a wrong token (or still being checked) came from {address} in"
                           f" the last minute, the limit of {self.failures}: wait a minute", value=n,
                           limit=self.failures)

    def known(self, digest: bytes) -> bool:
        """Whether this token (its digest) was right within the last minute."""
        t = self._right.get(digest)
        return t is not None and self.clock() - t <= _FAIL_WINDOW

    def right(self, digest: bytes) -> None:
        if len(self._right) > 10_000:
            self._right.pop(next(iter(self._right)))
        self._right.pop(digest, None)
        self._right[digest] = self.clock()

    def checking(self, address: str, delta: int) -> None:
        n = self._checking.get(address, 0) + delta
        if n:
            self._checking[address] = n
        else:
            self._checking.pop(address, None)

    def failed(self, address: str) -> None:
        if len(self._failed) > 10_000:  # (many addresses: forget the oldest entries rather than grow)
            self._failed.pop(next(iter(self._failed)))
        self._failed.setdefault(address, deque()).append(self.clock())


def _int(q: Any, name: str, default: int, lo: int, hi: int) -> int:
    text = q.get(name)
    if text is None or text == "":
        return default
    try:
        v = int(text)
    except ValueError:
        raise ApiError(400, f"{name} {text!r} is not an integer", value=text) from None
    if not lo <= v <= hi:
        raise ApiError(400, f"{name} {v} is outside {lo}..{hi}", value=v, limit=hi)
    return v


def _flag(q: Any, name: str) -> bool:
    return str(q.get(name, "")).lower() in ("1", "true", "yes")


def error_response(e: ApiError, *, close: bool = True) -> JSONResponse:
    """A refusal as JSON. ``close``: it closes the connection (a body the
    request still has on its way is then not read to be thrown away)."""
    headers = {"connection": "close"} if close else {}
    if e.status == 401:
        headers["www-authenticate"] = 'Bearer realm="semq"'
    return JSONResponse(e.as_json(), status_code=e.status, headers=headers)


class ApiApp:
    """The API as an ASGI application (mounted at PREFIX). ``session_of``:
    the console's session of a request (semq.web.app), ``history``: the
    delivery history's rows of an LK0 (semq.web.backend), ``version``: the
    product's, for the OpenAPI document."""

    def __init__(self, service: ApiService, *, session_of: SessionOf, history: History, version: str,
                 slots: Slots | None = None) -> None:
        self.service = service
        self.session_of = session_of
        self.history = history
        self.version = version
        self.slots = slots or Slots()
        self._openapi = json.dumps(openapi(version)).encode()  # (made once: the table does not change)
        self.open = {e.path for e in ENDPOINTS if not e.auth}
        handlers: dict[str, Callable[[Request, Caller], Awaitable[Response]]] = {
            "whoami": self.whoami, "send": self.send, "inbox": self.inbox, "follow": self.follow,
            "document": self.document, "content": self.content, "ack": self.ack, "track": self.track,
            "partners": self.partners}
        routes = []
        for e in ENDPOINTS:
            if e.auth:
                routes.append(Route(e.path, self._endpoint(e, handlers[e.name]), methods=[e.method]))
        routes += [Route("/openapi.json", self.openapi_json, methods=["GET"]),
                   Route("/docs", self.docs, methods=["GET"])]
        self.router = Router(routes)

    # ------------------------------------------------------------ admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        rel = path[len(scope.get("root_path", "")):] if path.startswith(scope.get("root_path", "")) else path
        if rel in self.open:
            await self.router(scope, receive, send)
            return
        request = Request(scope, receive)
        address = request.client.host if request.client else "?"
        try:
            self.slots.refused(address)
            caller = await self._caller(request, address)
            self.slots.take(caller.key)
        except ApiError as e:
            await error_response(e)(scope, receive, send)
            return
        try:
            scope["semq.caller"] = caller
            await self.router(scope, receive, send)
        finally:
            self.slots.give(caller.key)

    async def _caller(self, request: Request, address: str) -> Caller:
        auth = request.headers.get("authorization", "")
        scheme, _, cred = auth.partition(" ")
        if auth:
            if len(auth) > 1024:
                raise ApiError(401, f"an Authorization header of {len(auth)} characters; a token has 47",
                               value=len(auth), limit=1024)
            name: str | None = None
            if scheme.lower() == "bearer":
                token = cred.strip()
            elif scheme.lower() == "basic":
                try:
                    name, _, token = base64.b64decode(cred.strip(), validate=True).decode().partition(":")
                except (binascii.Error, ValueError):
                    raise ApiError(401, "the Basic credentials are not base64 of USER:TOKEN") from None
            else:
                raise ApiError(401, f"Authorization scheme {scheme[:20]!r} is not Bearer or Basic")
            # A token not seen right lately counts as a guess while it is
            # checked (Slots.refused); one that was right within the minute
            # does not, so an application's parallel requests never lock
            # its own address. Either way the store says yes or no.
            digest = hashlib.sha256(f"{name}:{token}".encode()).digest()
            unsure = not self.slots.known(digest)
            if unsure:
                self.slots.checking(address, +1)
            try:
                caller = await self.service.authenticate(token, name or None)
            except ApiError:
                self.slots.failed(address)
                log.warning("API: a wrong token from %s", address)
                raise
            finally:
                if unsure:
                    self.slots.checking(address, -1)
            self.slots.right(digest)
            return caller
        s = self.session_of(request)
        if s is None:
            raise ApiError(401, "no token: send Authorization: Bearer <the user's token> (semq user add NAME"
                           " prints it)")
        account, role, csrf = s
        caller = Caller(user=None, name=account, operator=role == "operator")
        ep = self._endpoint_of(request)
        if ep is not None and ep.operator and not caller.operator:
            raise ApiError(403, f"the console account {account} has the role {role}: it may look, not act or"
                           " read contents")
        if ep is not None and ep.changes:
            got = request.headers.get(CSRF_HEADER, "")
            if not got or not hmac.compare_digest(got.encode(), csrf.encode()):
                raise ApiError(403, "a console session's change needs its CSRF token in X-CSRF-Token")
        return caller

    def _endpoint_of(self, request: Request) -> Endpoint | None:
        path = request.url.path
        rel = path[len(PREFIX):] if path.startswith(PREFIX + "/") else path
        return next((e for e in ENDPOINTS if e.matches(request.method, rel)), None)

    def _endpoint(self, e: Endpoint, fn: Callable[[Request, Caller], Awaitable[Response]]
                  ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            caller: Caller = request.scope["semq.caller"]
            try:
                return await fn(request, caller)
            except ApiError as err:
                if err.status >= 500 or err.status == 408:
                    log.warning("API %s %s (%s): %s", e.method, e.path, caller.key, err)
                return error_response(err, close=not await _drained(request))

        return run

    # ------------------------------------------------------------ open

    async def openapi_json(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    async def docs(self, request: Request) -> Response:
        rows = []
        for e in ENDPOINTS:
            params = "".join(f"<li><code>{html.escape(p.name)}</code> ({p.where}{', required' if p.required else ''}):"
                             f" {html.escape(p.text)}</li>" for p in e.params)
            rows.append(f"<section><h2><code>{e.method} {PREFIX}{html.escape(e.path)}</code></h2>"
                        f"<p>{html.escape(e.summary)}</p>{'<ul>' + params + '</ul>' if params else ''}</section>")
        page = ("<!doctype html><html lang=en><head><meta charset=utf-8><title>SEMQ node API</title>"
                "<link rel=stylesheet href=/static/console.css></head><body><main><h1>SEMQ node API</h1>"
                f"<p>The machine-readable description: <a href='{PREFIX}/openapi.json'>{PREFIX}/openapi.json</a>"
                " (OpenAPI 3.1). Authenticate with <code>Authorization: Bearer semq_...</code>.</p>"
                + "".join(rows) + "</main></body></html>")
        return HTMLResponse(page)

    # ------------------------------------------------------------ endpoints

    async def whoami(self, request: Request, caller: Caller) -> Response:
        return JSONResponse(self.service.whoami(caller))

    async def _body_blocks(self, request: Request, length: int) -> AsyncIterator[bytes]:
        """The body in blocks of one MiB (the last shorter), each within
        API_BLOCK_S; ApiError 408 when one is late, 400 when the body is
        not ``length`` bytes."""
        stream = request.stream().__aiter__()
        buf = bytearray()
        got = 0
        done = False
        while not done:
            with trio.move_on_after(API_BLOCK_S) as scope:
                while len(buf) < USER_BLOCK_BYTES:
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        done = True
                        break
                    got += len(chunk)
                    if got > length:
                        raise ApiError(400, f"the body is longer than its Content-Length of {length} bytes",
                                       value=got, limit=length)
                    buf += chunk
            if scope.cancelled_caught:
                raise ApiError(408, f"the body's next MiB took longer than {API_BLOCK_S:g} s ({got} of {length}"
                               " bytes arrived)", value=got, limit=length)
            while len(buf) >= USER_BLOCK_BYTES or (done and buf):
                yield bytes(buf[:USER_BLOCK_BYTES])
                del buf[:USER_BLOCK_BYTES]
        if got != length:
            raise ApiError(400, f"the body ended after {got} of its Content-Length of {length} bytes", value=got,
                           limit=length)

    def _length(self, request: Request, limit: int) -> int:
        text = request.headers.get("content-length")
        if text is None:
            raise ApiError(411, "a document's body needs its Content-Length (a chunked body is not taken)",
                           limit=limit)
        try:
            n = int(text)
        except ValueError:
            raise ApiError(400, f"Content-Length {text[:30]!r} is not a number of bytes") from None
        if n > limit or n < 0:
            raise ApiError(413, f"a body of {n} bytes exceeds the limit of {limit} bytes", value=n, limit=limit)
        return n

    async def send(self, request: Request, caller: Caller) -> Response:
        """POST /documents?to=...: the body is the document. Up to one
        block: sent from memory; larger: staged on disk block by block,
        then handed to the large-document path. Durable when answered 201."""
        to, options = parse_options(request.query_params)
        sha = request.query_params.get("sha256") or None
        length = self._length(request, self.service.max_document)
        if length <= USER_BLOCK_BYTES:  # (send checks it all, in the same call)
            data = b"".join([b async for b in self._body_blocks(request, length)])
            if sha is not None and sha.lower() != hashlib.sha256(data).hexdigest():
                raise ApiError(400, f"the body's SHA-256 is {hashlib.sha256(data).hexdigest()}, not {sha}: not sent",
                               value=sha)
            return JSONResponse(await self.service.send_bytes(caller, to, options, data), status_code=201)
        await self.service.check_send(caller, to, options, length)  # before a byte is staged
        upload = await self.service.stage_begin(caller, to, options, length)
        try:
            offset = 0
            async for block in self._body_blocks(request, length):
                offset = await self.service.stage_block(caller, upload, offset, block)
            done = await self.service.stage_send(caller, upload, sha)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.service.stage_abort(caller, upload)
            raise
        return JSONResponse(done, status_code=201)

    async def inbox(self, request: Request, caller: Caller) -> Response:
        q = request.query_params
        page = await self.service.inbox(caller, after=_int(q, "after", 0, 0, _MAX_ID),
                                        limit=_int(q, "limit", 100, 1, PAGE_LIMIT), everything=_flag(q, "all"),
                                        contents=_flag(q, "content"))
        return JSONResponse(page)

    async def follow(self, request: Request, caller: Caller) -> Response:
        q = request.query_params
        timeout_text = q.get("timeout", "")
        try:
            timeout = float(timeout_text) if timeout_text else API_FOLLOW_S
        except ValueError:
            raise ApiError(400, f"timeout {timeout_text!r} is not a number of seconds", value=timeout_text) from None
        if not 0 <= timeout <= API_FOLLOW_S:
            raise ApiError(400, f"timeout {timeout:g} s is outside 0..{API_FOLLOW_S:g}", value=timeout,
                           limit=API_FOLLOW_S)
        got = await self.service.follow(caller, after=q.get("after", "0").strip(), timeout=timeout,
                                        limit=_int(q, "limit", 100, 1, PAGE_LIMIT))
        return JSONResponse(got)

    def _id(self, request: Request) -> int:
        text = request.path_params["id"]
        try:
            n = int(text)
        except ValueError:
            raise ApiError(400, f"document id {text[:40]!r} is not an integer", value=text[:40]) from None
        if not 1 <= n <= _MAX_ID:
            raise ApiError(404, f"document {n} is not in the inbox: ids are 1..{_MAX_ID}", value=n, limit=_MAX_ID)
        return n

    async def document(self, request: Request, caller: Caller) -> Response:
        return JSONResponse(await self.service.document(caller, self._id(request)))

    async def content(self, request: Request, caller: Caller) -> Response:
        """The content streamed in blocks; a large document from its file,
        never read whole."""
        item, read = await self.service.content(caller, self._id(request))
        service = self.service
        headers = {"content-disposition": f'attachment; filename="semq-{item.id}.bin"', "x-semq-lk0": str(item.lk0)}
        if item.path is None:  # (in memory already: one answer)
            return Response(item.app_data, media_type="application/octet-stream", headers=headers)

        async def blocks() -> AsyncIterator[bytes]:
            offset = 0
            while offset < item.size:
                block = await service.read_block(read, offset)
                if not block:
                    return
                offset += len(block)
                yield block

        return StreamingResponse(blocks(), media_type="application/octet-stream",
                                 headers={**headers, "content-length": str(item.size)})

    async def ack(self, request: Request, caller: Caller) -> Response:
        length = self._length(request, API_MAX_JSON)
        body = b"".join([b async for b in self._body_blocks(request, length)])
        try:
            ids = json.loads(body or b"null").get("ids")
        except (ValueError, AttributeError):
            raise ApiError(400, 'the body is not JSON like {"ids": [1, 2]}') from None
        if (not isinstance(ids, list)
                or not all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= _MAX_ID for i in ids)):
            raise ApiError(400, f"ids is a list of inbox document ids (integers 1..{_MAX_ID})")
        if len(ids) > _MAX_ACK:
            raise ApiError(413, f"{len(ids)} ids exceed the {_MAX_ACK} of one acknowledgement", value=len(ids),
                           limit=_MAX_ACK)
        return JSONResponse(await self.service.acknowledge(caller, ids))

    async def track(self, request: Request, caller: Caller) -> Response:
        lk0 = request.query_params.get("lk0", "").strip()
        parts = lk0.split("/")
        if len(parts) != 4 or not parts[0] or not all(p.isdigit() for p in parts[1:]) or len(lk0) > 200:
            raise ApiError(400, f"lk0 {lk0[:60]!r} is not ORG/UNIT/DB/RECORD", value=lk0[:60])
        rows = await self.service.track(caller, lk0, self.history)
        if not rows:
            raise ApiError(404, f"no document {lk0} of yours in the delivery history (it is indexed a moment"
                           " after each step)", value=lk0)
        return _json({"lk0": lk0, "rows": rows})

    async def partners(self, request: Request, caller: Caller) -> Response:
        return _json(await self.service.partners(caller))


async def _drained(request: Request) -> bool:
    """Read and drop what is left of a user's refused body, when it is at
    most API_DRAIN_BYTES and comes in time, so its client reads the answer
    (a browser still sending a file it was refused for sees a reset
    connection otherwise); False: the connection is to be closed."""
    if getattr(request, "_stream_consumed", True) or request.method in ("GET", "HEAD"):
        return True
    text = request.headers.get("content-length", "")
    if not text.isdigit() or int(text) > API_DRAIN_BYTES:
        return False
    with trio.move_on_after(API_BLOCK_S * max(1, int(text) / USER_BLOCK_BYTES)):
        try:
            async for _ in request.stream():
                pass
            return True
        except (ClientDisconnect, RuntimeError):
            return False
    return False


def _json(value: Any) -> Response:
    """JSON of rows that may hold values JSON has no type for (shown as text)."""
    return Response(json.dumps(value, default=str), media_type="application/json")
