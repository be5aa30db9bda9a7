"""The web console's ASGI application (Starlette): pages rendered on the
server with Jinja2 (autoescape on: every value from a counterpart, an
AppKey above all, is shown as text), one small static script that polls
``/api/dashboard`` for the charts (no inline script: the CSP forbids it).

Access: every page and JSON endpoint needs a session (pages redirect to
/login, JSON answers 401); every POST needs the session's CSRF token; the
actions (resend, requeue, purge, drain) need the role ``operator``, checked
here on the server (a viewer's forged POST gets 403). Every action attempt
is written to the audit log before its answer, allowed or refused.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote

import jinja2
import trio
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from semq.settings.bounds import CONSOLE_FORM_S, CONSOLE_MAX_FORM

from .audit import AuditLog
from .backend import ACTIONS, ActionError, ConsoleBackend, Selection, parse_lk0, parse_selection
from .pages_outbox import outbox_routes
from .pages_platform import platform_routes
from .partners import partners_of, why_of
from .sessions import FAIL_DELAY, LoginBusy, LoginSlots, LoginThrottle, Session, Sessions, same
from .users import MAX_PASSWORD, Role, UserStore

__all__ = ["COOKIE", "CSP", "Console", "make_app"]

log = logging.getLogger("semq.web")

HERE: Final = Path(__file__).resolve().parent
COOKIE: Final = "semq_session"
LOGIN_COOKIE: Final = "semq_login"  # the login form's CSRF token (double submit: no session yet)
CSP: Final = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
              " connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS: Final = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"strict-transport-security", b"max-age=31536000"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
SEARCH_LIMIT: Final = 200
ROLES: Final = ("origin", "receiver", "platform")


class SecurityHeaders:
    """Adds the security headers to every response (and no-store to all but
    the static files)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += SECURITY_HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_)


def _ms_text(ms: Any) -> str:
    if not ms:
        return ""
    try:
        return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ms)


def _parse_time(text: str) -> int | None:
    """A form's date-time (UTC, ``YYYY-MM-DDTHH:MM[:SS]`` or a date) as ms."""
    text = text.strip()
    if not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ActionError(f"time {text!r} is not YYYY-MM-DDTHH:MM (UTC)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


@dataclass
class Console:
    """Everything the application needs: the backend, the accounts, the
    audit log, the sessions."""

    backend: ConsoleBackend
    users: UserStore
    audit: AuditLog
    sessions: Sessions = field(default_factory=Sessions)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    logins: LoginSlots = field(default_factory=LoginSlots)
    fail_delay: float = FAIL_DELAY
    tls_note: str = ""
    api: Any = None  # a node's semq.web.api.ApiService: the HTTP API at /api/v1 (and the inbox and send pages)


Page = Callable[[Request, Session], Awaitable[Response]]  # a page's handler, given the request's session


class _Handlers:
    """The console's request handlers, over one Console: rendering, the
    session and form of a request, login and logout, the pages and the
    actions (``routes``)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.backend = console.backend
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
        env.filters["ts"] = _ms_text
        env.filters["tojson_attr"] = lambda v: json.dumps(v)
        env.filters["done"] = lambda a: {"resend": "resent", "requeue": "requeued", "purge": "purged",
                                         "drain": "drained"}.get(a, a)
        self.env = env

    def render(self, request: Request, name: str, status: int = 200, session: Session | None = None,
               **ctx: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(
            session=session, role=self.backend.role, ident=self.backend.ident, units=self.backend.units,
            operator=bool(session and session.role == Role.OPERATOR.value), path=request.url.path, **ctx)
        return HTMLResponse(html, status_code=status)

    def session_of(self, request: Request) -> Session | None:
        s = self.console.sessions.get(request.cookies.get(COOKIE))
        if s is not None and self.console.users.get(s.user) is None:  # the account was removed
            self.console.sessions.end_user(s.user)
            return None
        return s

    async def form_of(self, request: Request) -> dict[str, str]:
        """The POSTed form; ActionError when it is larger than
        CONSOLE_MAX_FORM or its body takes longer than CONSOLE_FORM_S."""
        body = bytearray()
        with trio.move_on_after(CONSOLE_FORM_S) as scope:
            async for chunk in request.stream():
                body += chunk
                if len(body) > CONSOLE_MAX_FORM:
                    raise ActionError(f"the form is larger than the {CONSOLE_MAX_FORM}-byte limit")
        if scope.cancelled_caught:
            raise ActionError(f"the form took longer than {CONSOLE_FORM_S:g} s to arrive ({len(body)} bytes)")
        try:
            parsed = parse_qs(bytes(body).decode("utf-8"), keep_blank_values=True, max_num_fields=200)
        except (UnicodeDecodeError, ValueError) as e:
            raise ActionError(f"unreadable form: {e}") from None
        return {k: v[-1] if k != "lk0" else " ".join(v) for k, v in parsed.items()}

    def page(self, fn: Page) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            s = self.session_of(request)
            if s is None:
                return RedirectResponse(f"/login?next={quote(str(request.url.path))}", status_code=303)
            try:
                return await fn(request, s)
            except ActionError as e:
                return self.render(request, "error.html", 400, s, message=str(e))

        return run

    def api(self, fn: Page) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            s = self.session_of(request)
            if s is None:
                return JSONResponse({"error": "not logged in"}, status_code=401)
            return await fn(request, s)

        return run

    # ------------------------------------------------------------ login

    async def login_get(self, request: Request) -> Response:
        token = secrets.token_urlsafe(32)
        resp = self.render(request, "login.html", csrf=token, next=request.query_params.get("next", "/"), error="")
        resp.set_cookie(LOGIN_COOKIE, token, httponly=True, secure=True, samesite="strict", max_age=3600)
        return resp

    async def login_post(self, request: Request) -> Response:
        try:
            form = await self.form_of(request)
        except ActionError as e:
            return plain_error(400, str(e))
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        nxt = form.get("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"

        def again(msg: str, status: int) -> Response:
            token = secrets.token_urlsafe(32)
            resp = self.render(request, "login.html", status, csrf=token, next=nxt, error=msg)
            resp.set_cookie(LOGIN_COOKIE, token, httponly=True, secure=True, samesite="strict", max_age=3600)
            return resp

        if not cookie or not same(form.get("csrf", ""), cookie):
            return again("The login form expired: try again.", 403)
        name = form.get("user", "").strip()[:64]
        password = form.get("password", "")[:MAX_PASSWORD]
        ip = request.client.host if request.client else "?"
        keys = (f"user:{name}", f"ip:{ip}")

        def refused(wait: float) -> Response:
            log.warning("web console: login of %r from %s refused: locked for %.0f s more", name, ip, wait)
            return again(f"Too many failed logins: try again in {int(wait) + 1} s.", 429)

        if wait := self.console.throttle.locked(*keys):  # (answered at once, without waiting for a slot)
            return refused(wait)
        try:
            async with self.console.logins.hold(*keys):
                # Asked again: the logins this one waited for may have locked it.
                if wait := self.console.throttle.locked(*keys):
                    return refused(wait)
                attempt = self.console.throttle.begin(*keys)  # counted before the check, forgiven on success
                account = await self.backend.thread(lambda: self.console.users.verify(name, password))
                if account is None:
                    self.console.throttle.failed(attempt)
                    log.warning("web console: failed login of %r from %s", name, ip)
                    await trio.sleep(self.console.fail_delay)  # (in the slot: one guess per second and key)
                    return again("Wrong user name or password.", 401)
                self.console.throttle.succeeded(attempt)
        except LoginBusy as e:
            log.warning("web console: login of %r from %s refused: %s", name, ip, e)
            return again("Another login of this name or from this address is being checked: try again.", 429)
        s = self.console.sessions.create(account.name, account.role.value)
        log.info("web console: %s (%s) logged in from %s", account.name, account.role.value, ip)
        resp = RedirectResponse(nxt, status_code=303)
        resp.set_cookie(COOKIE, s.token, httponly=True, secure=True, samesite="strict",
                        max_age=int(self.console.sessions.max_age))
        resp.delete_cookie(LOGIN_COOKIE)
        return resp

    async def logout(self, request: Request) -> Response:
        s = self.session_of(request)
        try:
            form = await self.form_of(request)
        except ActionError:
            form = {}
        if s is not None and same(form.get("csrf", ""), s.csrf):
            self.console.sessions.end(s.token)
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(COOKIE)
        return resp

    # ------------------------------------------------------------ pages

    async def dashboard(self, request: Request, s: Session) -> Response:
        return self.render(request, "dashboard.html", session=s)

    async def dashboard_json(self, request: Request, s: Session) -> Response:
        return JSONResponse(await self.backend.dashboard())

    async def search(self, request: Request, s: Session) -> Response:
        q = request.query_params
        form = {k: q.get(k, "") for k in ("text", "counterpart", "role", "state", "since", "until")}
        rows: list[dict[str, Any]] = []
        searched = any(form.values()) or "go" in q
        if searched:
            role = form["role"] if form["role"] in ROLES else None
            rows = await self.backend.search(
                text=form["text"].strip() or None, counterpart=form["counterpart"].strip() or None, role=role,
                state=form["state"].strip() or None, since_ms=_parse_time(form["since"]),
                until_ms=_parse_time(form["until"]), limit=SEARCH_LIMIT)
        return self.render(request, "search.html", session=s, form=form, rows=rows, searched=searched,
                      roles=ROLES, limit=SEARCH_LIMIT, history=bool(self.backend.history_paths()))

    async def document(self, request: Request, s: Session) -> Response:
        lk0 = request.query_params.get("lk0", "").strip()
        parse_lk0(lk0)
        rows = await self.backend.document(lk0)
        receipt = None
        if any(r.get("role") == "origin" for r in rows) or not rows:
            receipt = await self.backend.receipt(lk0)
        why = await why_of(self.backend, lk0)  # where it is and why it waits (semq.ops.why)
        return self.render(request, "document.html", session=s, lk0=lk0, rows=rows, receipt=receipt,
                      actions=[a for a in ACTIONS if a != "drain"], why=why)

    async def partners(self, request: Request, s: Session) -> Response:
        return self.render(request, "partners.html", session=s, **await partners_of(self.backend))

    async def audit_page(self, request: Request, s: Session) -> Response:
        entries = await self.backend.thread(lambda: self.console.audit.tail(500))
        return self.render(request, "audit.html", session=s, entries=entries)

    async def actions_page(self, request: Request, s: Session) -> Response:
        if s.role != Role.OPERATOR.value:
            return self.render(request, "error.html", 403, s, message=f"Your role ({s.role}) may look, not act.")
        return self.render(request, "actions.html", session=s, actions=ACTIONS)

    # ------------------------------------------------------------ actions

    async def audit(self, s: Session, action: str, args: dict[str, Any], refused: str | None, result: Any) -> None:
        entry = {"user": s.user, "role": s.role, "action": action, "args": args, "refused": refused,
                 "result": result}
        await self.backend.thread(lambda: self.console.audit.append(**entry))

    async def action(self, request: Request) -> Response:
        """POST /action/{name}: without ``confirm`` a dry run shown on a
        confirmation page; with it, the action. Both are audited."""
        name = request.path_params["name"]
        s = self.session_of(request)
        if s is None:
            return RedirectResponse("/login", status_code=303)
        try:
            form = await self.form_of(request)
        except ActionError as e:
            await self.audit(s, name, {}, f"bad form: {e}", None)
            return self.render(request, "error.html", 400, s, message=str(e))
        confirm = form.get("confirm") == "1"
        args: dict[str, Any] = {k: v for k, v in form.items() if k not in ("csrf",)}
        if s.role != Role.OPERATOR.value:
            await self.audit(s, name, args, f"role {s.role} may not act", None)
            return self.render(request, "error.html", 403, s, message=f"Your role ({s.role}) may look, not act.")
        if not same(form.get("csrf", ""), s.csrf):
            await self.audit(s, name, args, "missing or wrong CSRF token", None)
            return self.render(request, "error.html", 403, s, message="The form expired (CSRF token): reload the page.")
        if name not in ACTIONS:
            await self.audit(s, name, args, "unknown action", None)
            return self.render(request, "error.html", 404, s, message=f"No action {name!r}.")
        try:
            sel = Selection() if name == "drain" else parse_selection(form)
            args = {**sel.as_args(), "confirm": confirm}
            result = await self.backend.act(name, sel, dry_run=not confirm, user=s.user)
        except (ActionError, ValueError) as e:
            await self.audit(s, name, args, None, {"error": str(e)})
            return self.render(request, "error.html", 400, s, message=str(e))
        later = result.pop("later", None)
        await self.audit(s, name, args, None, result)
        if not confirm:
            return self.render(request, "confirm.html", session=s, action=name, sel=sel, result=result)
        resp = self.render(request, "done.html", session=s, action=name, sel=sel, result=result)
        if later is not None:  # (drain: this daemon may stop at once; answer first)
            resp.background = BackgroundTask(later)
        return resp

    def routes(self) -> list[Route | Mount]:
        return [
            Route("/login", self.login_get, methods=["GET"]),
            Route("/login", self.login_post, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/", self.page(self.dashboard)),
            Route("/api/dashboard", self.api(self.dashboard_json)),
            Route("/search", self.page(self.search)),
            Route("/doc", self.page(self.document)),
            Route("/partners", self.page(self.partners)),
            Route("/actions", self.page(self.actions_page)),
            Route("/action/{name}", self.action, methods=["POST"]),
            Route("/audit", self.page(self.audit_page)),
            *outbox_routes(self), *platform_routes(self),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
            *self.api_routes(),
        ]

    def api_routes(self) -> list[Route | Mount]:
        """The HTTP API (semq.web.api) and the console's pages over it
        (semq.web.inbox_pages), on a node that serves it."""
        if self.console.api is None:
            return []
        from semq import __version__

        from .api import PREFIX, ApiApp
        from .inbox_pages import inbox_routes

        def session_of(request: Request) -> tuple[str, str, str] | None:
            s = self.session_of(request)
            return None if s is None else (s.user, s.role, s.csrf)

        app = ApiApp(self.console.api, session_of=session_of, history=self.backend.document, version=__version__)
        return [Mount(PREFIX, app=app), *inbox_routes(self)]


def make_app(console: Console) -> ASGIApp:
    """The console's ASGI application: its routes behind the security headers."""
    return SecurityHeaders(Starlette(routes=_Handlers(console).routes()))


def plain_error(status: int, text: str) -> Response:
    return Response(text + "\n", status_code=status, media_type="text/plain")

