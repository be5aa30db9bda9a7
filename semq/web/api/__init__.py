"""The node's HTTP API for applications (an ERP, a remote service): send,
the inbox (list, read, content, acknowledge, follow), track and partners,
as JSON over the web console's HTTPS listener at ``/api/v1``, for the same
users and tokens as the user socket (semq.ops.usersock). See docs/api.md.

- semq.web.api.spec: the one table of endpoints, and the OpenAPI document made from it;
- semq.web.api.service: what each endpoint does, without HTTP;
- semq.web.api.http: the ASGI shell (who, limits, bodies, streaming, JSON errors).
"""

from .http import CSRF_HEADER, ApiApp, Slots
from .service import ApiError, ApiService, Caller
from .spec import ENDPOINTS, PREFIX, openapi

__all__ = ["CSRF_HEADER", "ENDPOINTS", "PREFIX", "ApiApp", "ApiError", "ApiService", "Caller", "Slots", "openapi"]
