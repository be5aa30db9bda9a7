"""The HTTP API's one declaration: its endpoints as a table (``ENDPOINTS``),
from which the routes are made (semq.web.api.http) and the OpenAPI 3.1
document is generated (``openapi``), so the two cannot disagree. Pure:
no Starlette, no I/O.

Why a table of our own rather than a library (apispec, spectree, Starlette's
SchemaGenerator): the API is eleven endpoints whose bodies are raw bytes or
small JSON objects; Starlette's generator reads YAML out of docstrings (a
second language, checked by nothing), spectree and apispec bring pydantic
or marshmallow models for what a dozen lines of JSON Schema say here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from semq.settings.bounds import API_BLOCK_S, API_FOLLOW_S, API_IN_FLIGHT_PER_CALLER, API_MAX_JSON

__all__ = ["ENDPOINTS", "PREFIX", "Endpoint", "Param", "openapi"]

PREFIX: Final = "/api/v1"


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query", "path" or "header"
    kind: str  # JSON Schema type: string, integer, number, boolean
    text: str
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    """One endpoint: ``method`` ``path`` (under PREFIX) answered by the
    handler ``name``; ``auth`` False: open to anyone (the description)."""

    method: str
    path: str
    name: str
    summary: str
    params: tuple[Param, ...] = ()
    body: str = ""  # "", "bytes" (the document) or "json" (the schema ``body_schema``)
    body_schema: dict[str, Any] = field(default_factory=dict)
    answer: str = "json"  # "json", "bytes" or "html"
    answer_schema: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    auth: bool = True
    changes: bool = False  # changes state: a console session needs its CSRF token (X-CSRF-Token)
    operator: bool = False  # a console session needs the role operator (a document's content, a change)

    def matches(self, method: str, path: str) -> bool:
        """Whether a request of ``method`` on ``path`` (under PREFIX) is this endpoint's."""
        if method != self.method:
            return False
        mine, theirs = self.path.split("/"), path.split("/")
        return len(mine) == len(theirs) and all(a == b or (a.startswith("{") and b) for a, b in zip(mine, theirs, strict=True))


_ID = Param("id", "path", "integer", "the document's inbox id (``id`` in a listing)", True)
_DOC: Final[dict[str, Any]] = {"type": "object", "properties": {
    "id": {"type": "integer"}, "lk0": {"type": "string"}, "from": {"type": "string"},
    "from_user": {"type": "string"}, "to_user": {"type": "string"}, "channel": {"type": "string"},
    "app_key": {"type": "object", "properties": {k: {"type": "string"} for k in
                                                 ("domain", "data_type", "subtype", "key")}},
    "size": {"type": "integer"}, "large": {"type": "boolean"}, "created_ms": {"type": "integer"},
    "received_ms": {"type": "integer"}, "acknowledged": {"type": "boolean"}, "unit": {"type": "integer"},
    "content_base64": {"type": "string", "description": "only with content=1, and while the page's fit in 1 MiB"}}}
_DOCS: Final[dict[str, Any]] = {"type": "array", "items": {"$ref": "#/components/schemas/Document"}}
_SEND_PARAMS: Final = (
    Param("to", "query", "string", "the target: ORG, ORG/USER, or a colleague's name on this node", True),
    Param("data_type", "query", "string", "AppKey: the document's type (e.g. INVOICE)"),
    Param("domain", "query", "string", "AppKey: its domain"),
    Param("subtype", "query", "string", "AppKey: its subtype"),
    Param("key", "query", "string", "AppKey: the application's key (e.g. INV-901)"),
    Param("priority", "query", "integer", "0..9, higher first"),
    Param("save_fwd", "query", "integer", "how the platform keeps it (SaveFwd)"),
    Param("expires_in", "query", "number", "seconds until it expires undelivered (> 0)"),
    Param("ack2", "query", "boolean", "ask for the target's end-to-end receipt (default true)"),
    Param("encrypt", "query", "boolean", "seal it for the target (default true)"),
    Param("clear_app_key", "query", "boolean", "leave the AppKey readable in the header"),
    Param("ordered", "query", "string", "its ordered channel"),
    Param("sha256", "query", "string", "the body's SHA-256 (hex): checked, the document refused if it differs"),
)

ENDPOINTS: Final[tuple[Endpoint, ...]] = (
    Endpoint("GET", "/whoami", "whoami", "Who the token is: the user, the organization, the limits"),
    Endpoint("POST", "/documents", "send", "Send a document: the request's body is its content",
             _SEND_PARAMS, body="bytes", status=201, changes=True, operator=True, answer_schema={
                 "type": "object", "properties": {"lk0": {"type": "string"}, "size": {"type": "integer"},
                                                  "sha256": {"type": "string"}}}),
    Endpoint("GET", "/inbox", "inbox", "A page of the inbox, oldest first, with the total it is a page of", (
        Param("after", "query", "integer", "list documents with an id above this (the last page's ``next``)"),
        Param("limit", "query", "integer", "documents on the page, 1..1000 (default 100)"),
        Param("all", "query", "boolean", "acknowledged documents too (kept a day)"),
        Param("content", "query", "boolean", "each document's content too (content_base64), while they fit in"
              " 1 MiB together; the others are read with /inbox/{id}/content"),
    ), answer_schema={"type": "object", "properties": {
        "documents": _DOCS, "total": {"type": "integer"}, "next": {"type": ["integer", "null"]}}}),
    Endpoint("GET", "/inbox/follow", "follow",
             f"Long poll: the unacknowledged documents above ``after``, waiting at most {API_FOLLOW_S:g} s for one", (
                 Param("after", "query", "string", "the last answer's ``next`` (a cursor: one row id per unit of"
                       " the node, e.g. 57 or 57,12), or an inbox id to start after (0: from the start)"),
                 Param("timeout", "query", "number", f"seconds to wait, 0..{API_FOLLOW_S:g}"),
                 Param("limit", "query", "integer", "documents at most, 1..1000 (default 100)"),
             ), answer_schema={"type": "object", "properties": {"documents": _DOCS, "next": {"type": "string"}}}),
    Endpoint("GET", "/inbox/{id}", "document", "One document's metadata", (_ID,),
             answer_schema={"$ref": "#/components/schemas/Document"}),
    Endpoint("GET", "/inbox/{id}/content", "content", "One document's content, streamed (large ones too)",
             (_ID,), answer="bytes", operator=True),
    Endpoint("POST", "/inbox/ack", "ack", "Acknowledge documents: processed (kept a day, then purged)",
             body="json", changes=True, operator=True, body_schema={
                 "type": "object", "required": ["ids"],
                 "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}}},
             answer_schema={"type": "object", "properties": {"acknowledged": {"type": "integer"},
                                                             "asked": {"type": "integer"}}}),
    Endpoint("GET", "/track", "track", "Where a document is: its delivery history, as ``semq track`` shows it", (
        Param("lk0", "query", "string", "the document's LK0 (ORG/UNIT/DB/RECORD)", True),),
        answer_schema={"type": "object", "properties": {"lk0": {"type": "string"},
                                                        "rows": {"type": "array", "items": {"type": "object"}}}}),
    Endpoint("GET", "/partners", "partners",
             "Each counterpart: online as the platform last said, backlog both ways, certificate, link",
             answer_schema={"type": "object", "properties": {
                 "partners": {"type": "array", "items": {"type": "object"}}, "asked_ms": {"type": "integer"}}}),
    Endpoint("GET", "/openapi.json", "openapi", "This document", auth=False),
    Endpoint("GET", "/docs", "docs", "This document, as a page to read", answer="html", auth=False),
)

_ERRORS: Final = {
    "400": "the request is wrong (the error names the value)",
    "401": "no token, or not the token of a user of this node",
    "403": "a console session without the role or the CSRF token",
    "404": "not in the caller's inbox (another user's document is not found either)",
    "411": "a document's body needs its Content-Length",
    "413": "the body is larger than its limit (named)",
    "429": "too many requests in flight, follows or failed logins (the limit named)",
    "501": "this node does not serve it",
}


def openapi(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ENDPOINTS``."""
    paths: dict[str, Any] = {}
    error = {"description": "", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for e in ENDPOINTS:
        op: dict[str, Any] = {"operationId": e.name, "summary": e.summary, "parameters": [
            {"name": p.name, "in": p.where, "required": p.required or p.where == "path", "description": p.text,
             "schema": {"type": p.kind}} for p in e.params]}
        if e.body == "bytes":
            op["requestBody"] = {"required": True, "description": "the document's bytes; Content-Length required",
                                 "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                     "format": "binary"}}}}
        elif e.body == "json":
            op["requestBody"] = {"required": True, "description": f"at most {API_MAX_JSON} bytes",
                                 "content": {"application/json": {"schema": e.body_schema}}}
        if e.answer == "bytes":
            ok = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        elif e.answer == "html":
            ok = {"text/html": {"schema": {"type": "string"}}}
        else:
            ok = {"application/json": {"schema": e.answer_schema or {"type": "object"}}}
        op["responses"] = {str(e.status): {"description": "done", "content": ok}}
        if e.auth:
            op["responses"].update({code: {**error, "description": text} for code, text in _ERRORS.items()})
        else:
            op["security"] = []
        paths.setdefault(PREFIX + e.path, {})[e.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "SEMQ node API", "version": version, "description": (
            "Send and receive business documents through a SEMQ node over HTTPS. Authenticate with a user's"
            " token (`semq user add NAME` prints it): `Authorization: Bearer semq_...` (or HTTP Basic with the"
            " user's name and token). A user sees and acknowledges only its own documents. At most"
            f" {API_IN_FLIGHT_PER_CALLER} requests of one user are in flight at once; a document's body"
            f" arrives at a pace of at least 1 MiB per {API_BLOCK_S:g} s.")},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}, "basic": {"type": "http",
                                                                                          "scheme": "basic"}},
            "schemas": {"Document": _DOC, "Error": {"type": "object", "required": ["error", "status"], "properties": {
                "error": {"type": "string"}, "status": {"type": "integer"}, "value": {}, "limit": {}}}},
        },
        "security": [{"token": []}, {"basic": []}],
    }
