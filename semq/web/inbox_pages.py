"""The console's pages over the HTTP API (semq.web.api): the node's inbox
(a page of documents with their total, one document, its content
downloaded streamed from ``/api/v1/inbox/{id}/content``, acknowledged
through ``POST /api/v1/inbox/ack``) and sending a file to a partner (the
browser posts the file's bytes to ``POST /api/v1/documents`` itself, so a
large file is streamed to the node's disk as any application's is, with
the same checks as ``semq send``). The session is the node's operator;
reading a content, acknowledging and sending need the role operator and
the session's CSRF token (the API checks both). The small script
(static/inbox.js) sets every value as text."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .api import Caller
from .api.http import _int
from .api.service import ApiError
from .sessions import Session
from .users import Role

__all__ = ["INBOX_PAGE", "inbox_routes"]

INBOX_PAGE = 50  # documents on one page of the console's inbox


def inbox_routes(h: Any) -> list[Route]:
    """The inbox and send pages of the console whose handlers (semq.web.app's
    ``_Handlers``: ``render``, ``page``, ``console.api``) are ``h``."""
    api = h.console.api

    def caller(s: Session) -> Caller:
        return Caller(user=None, name=s.user, operator=s.role == Role.OPERATOR.value)

    async def inbox(request: Request, s: Session) -> Response:
        q = request.query_params
        try:
            after = _int(q, "after", 0, 0, 2**62)
            page = await api.inbox(caller(s), after=after, limit=INBOX_PAGE, everything=q.get("all") == "1")
        except ApiError as e:
            return h.render(request, "error.html", e.status, s, message=str(e))
        return h.render(request, "inbox.html", session=s, page=page, after=after, all=q.get("all") == "1")

    async def document(request: Request, s: Session) -> Response:
        try:
            n = int(request.path_params["id"])
            if not 1 <= n <= 2**62:
                raise ApiError(404, f"document {n} is not in the inbox")
            doc = await api.document(caller(s), n)
        except ApiError as e:
            return h.render(request, "error.html", e.status, s, message=str(e))
        return h.render(request, "inbox_doc.html", session=s, doc=doc)

    async def send(request: Request, s: Session) -> Response:
        if s.role != Role.OPERATOR.value:
            return h.render(request, "error.html", 403, s, message=f"Your role ({s.role}) may look, not send.")
        return h.render(request, "send.html", session=s, max_document=api.max_document)

    return [Route("/inbox", h.page(inbox)), Route("/inbox/{id:int}", h.page(document)),
            Route("/send", h.page(send))]
