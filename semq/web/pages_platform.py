"""The platform console's Organizations and Instances pages: what the
platform's owners answer through the admin commands ``organizations`` and
``instances`` (semq.ops.handlers.platform), never the store itself.

Organizations: each one registered, its units (granted, run), online or
not (at which instance of a cluster), last seen, the documents stored for
it and the bytes its own documents take here against the quota.
Instances: on a PostgreSQL store every instance registered on it, alive
while its heartbeat is recent; on SQLite the one process there is.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .backend import now_ms
from .pages_outbox import ConsoleHost, age_text
from .sessions import Session

__all__ = ["platform_routes", "size_text"]

ORG_LIMIT: Final = 2000  # organizations on one page


def size_text(n: Any) -> str:
    """Bytes as ``512 B``, ``3.2 KiB``, ``1.5 MiB``, ``2.0 GiB``."""
    try:
        v = float(n or 0)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"


class PlatformPages:
    def __init__(self, h: ConsoleHost) -> None:
        self.h = h
        self.backend = h.backend

    def _not_here(self, request: Request, s: Session, what: str) -> Response | None:
        if self.backend.role == "platform":
            return None
        return self.h.render(request, "error.html", 404, s, message=f"{what} is a platform's page.")

    async def organizations(self, request: Request, s: Session) -> Response:
        if (r := self._not_here(request, s, "Organizations")) is not None:
            return r
        res = await self.backend.call_unit(1, "organizations", {"limit": ORG_LIMIT})
        quota = int(res.get("quota_bytes") or 0)
        rows = res.get("rows") or []
        for o in rows:
            o["quota_pct"] = round(100 * o["stored_bytes"] / quota, 1) if quota else None
        online = sum(1 for o in rows if o["online"])
        return self.h.render(request, "organizations.html", session=s, rows=rows, quota=quota, more=res.get("more"),
                             online=online, now=now_ms(), limit=ORG_LIMIT)

    async def instances(self, request: Request, s: Session) -> Response:
        if (r := self._not_here(request, s, "Instances")) is not None:
            return r
        res = await self.backend.call_unit(1, "instances", {})
        return self.h.render(request, "instances.html", session=s, rows=res.get("rows") or [],
                             store=res.get("store"), now=now_ms())


def platform_routes(h: ConsoleHost) -> list[Route]:
    h.env.filters["size"] = size_text
    h.env.filters["age"] = age_text
    pages = PlatformPages(h)
    return [Route("/orgs", h.page(pages.organizations)), Route("/instances", h.page(pages.instances))]
