"""The console's partners page and the "why" of its document page: the
admin requests ``partners`` and ``why`` (semq.ops.partners) of every unit,
merged as ``semq partners`` merges them."""

from __future__ import annotations

from typing import Any

from semq.ops.admin import AdminCommandError, AdminError
from semq.ops.partners import merge_partners
from semq.ops.why import why_line

from .backend import ConsoleBackend, parse_lk0

__all__ = ["partners_of", "why_of", "why_text"]


async def partners_of(backend: ConsoleBackend) -> dict[str, Any]:
    """``{"partners": [...], "asked_ms", "connected", "errors": [{"unit", "error"}]}``;
    a platform has none (``"node": False``)."""
    if backend.role != "node":
        return {"node": False, "partners": [], "errors": [], "asked_ms": None, "connected": None}
    answers = await backend.call_all("partners", {})
    got = [a for _k, a in answers if isinstance(a, dict) and "error" not in a]
    errors = [{"unit": k, "error": a["error"]} for k, a in answers if isinstance(a, dict) and "error" in a]
    merged = merge_partners(got) if got else {"partners": [], "asked_ms": None, "connected": None}
    return {"node": True, **merged, "errors": errors}


async def why_of(backend: ConsoleBackend, lk0: str) -> dict[str, Any] | None:
    """Where the document ``lk0`` is and why it waits (semq.ops.why), from
    the unit that holds it; None when nothing waits or no unit has it."""
    if backend.role != "node":
        return None
    org, unit, _db, _rid = parse_lk0(lk0)
    units = [unit] if org == backend.ident and 1 <= unit <= backend.units else list(range(1, backend.units + 1))
    for k in units:
        try:
            got = await backend.call_unit(k, "why", {"lk0": lk0})
        except (AdminError, AdminCommandError, OSError):
            continue
        if got.get("found"):
            w: dict[str, Any] | None = got.get("why")
            return w
    return None


def why_text(w: dict[str, Any] | None) -> str:
    return why_line(w)
