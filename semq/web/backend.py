"""What the web console reads and does, without HTTP: the daemon's admin
handlers (semq.ops.handlers, called in-process for its own unit, over the
admin socket of unit K for the others, as ``semq admin`` addresses them),
the delivery history (semq.tracking.history, every unit's), receipts (as
``semq messages --receipt``) and certificates.

Everything blocking (SQLite reads, scrypt, the admin sockets of other units)
runs in a worker thread; the handlers run on the daemon's trio thread as
the admin socket runs them.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from semq.ops.admin import (
    AdminCommandError,
    AdminError,
    AfterReply,
    Handler,
    admin_call,
    admin_socket_path,
)

__all__ = ["ACTIONS", "ActionError", "ConsoleBackend", "Selection", "parse_lk0", "parse_selection"]

log = logging.getLogger("semq.web")

T = TypeVar("T")

#: The operator actions of the console: the admin console's commands of the same name.
ACTIONS: Final = ("resend", "requeue", "purge", "drain")
RATE_BUCKET_MS: Final = 60_000  # the dashboard's rates are per minute
RATE_SPAN_MS: Final = 3600_000  # over the last hour
MAX_LK0S: Final = 1000  # LK0s in one action
_OPEN_STATES: Final = ("SS_INIT", "SS_SENT", "SS_ACK_FWD", "SS_ACK")


class ActionError(ValueError):
    """The operator's selection is wrong (shown on the page, 400)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def parse_lk0(text: str) -> tuple[str, int, int, int]:
    parts = text.strip().split("/")
    if len(parts) != 4 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise ActionError(f"LK0 {text.strip()!r} is not NODE/SEMQ_ID/DB_ID/RECORD_ID")
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The rows an action is about: LK0s, or the admin console's filters."""

    lk0s: tuple[str, ...] = ()
    state: str = ""
    target: str = ""
    older_than: float | None = None  # s
    select_all: bool = False

    def as_args(self) -> dict[str, Any]:
        """For the audit log and the confirmation form: the LK0s, then the filters."""
        out: dict[str, Any] = {"lk0": list(self.lk0s)} if self.lk0s else {}
        return out | self.filters()

    def filters(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.state:
            out["state"] = self.state
        if self.target:
            out["target"] = self.target
        if self.older_than is not None:
            out["older_than"] = self.older_than
        if self.select_all:
            out["all"] = True
        return out


def parse_selection(form: dict[str, str]) -> Selection:
    """A Selection from a form's fields ``lk0`` (LK0s separated by spaces,
    commas or lines), ``state``, ``target``, ``older_than`` (s), ``all``.
    Raises ActionError on a bad value, or when nothing is selected."""
    raw = form.get("lk0", "").replace(",", " ").split()
    if len(raw) > MAX_LK0S:
        raise ActionError(f"{len(raw)} LK0s exceed the {MAX_LK0S} of one action")
    for t in raw:
        parse_lk0(t)
    older: float | None = None
    if form.get("older_than", "").strip():
        try:
            older = float(form["older_than"])
        except ValueError:
            raise ActionError(f"older than {form['older_than']!r} is not a number of seconds") from None
        if not older >= 0:
            raise ActionError("older than must be >= 0 seconds")
    sel = Selection(lk0s=tuple(raw), state=form.get("state", "").strip(), target=form.get("target", "").strip(),
                    older_than=older, select_all=form.get("all") in ("1", "on", "true"))
    if not sel.lk0s and not sel.filters():
        raise ActionError("select documents: LK0s, or filters (state, target, older than), or all")
    return sel


def _cert_rows(paths: Sequence[tuple[str, Path]]) -> list[dict[str, Any]]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    out = []
    now = dt.datetime.now(dt.UTC)
    for what, p in paths:
        try:
            certs = x509.load_pem_x509_certificates(p.read_bytes())
        except (OSError, ValueError):
            continue
        for c in certs:
            after = c.not_valid_after_utc
            out.append({"what": what, "file": p.name, "subject": c.subject.rfc4514_string(),
                        "serial": f"{c.serial_number:x}", "not_after_ms": int(after.timestamp() * 1000),
                        "days_left": round((after - now).total_seconds() / 86400, 1),
                        "fingerprint": c.fingerprint(hashes.SHA256()).hex()})
    return out


@dataclass
class ConsoleBackend:
    """The console's view of one daemon. ``handlers``: its admin handlers
    (semq.ops.handlers); ``unit_dirs``: every unit's directory, unit 1 first
    (one entry for a platform or a node of one unit); ``unit``: the unit
    this process is (its handlers are called in-process)."""

    role: str  # "node" or "platform"
    ident: str  # the organization, or the platform's id
    directory: Path
    handlers: dict[str, Handler]
    unit_dirs: list[Path]
    unit: int = 1
    config: Any = None  # a node's semq.settings.config.Config (receipts)
    extra_certs: list[tuple[str, Path]] = field(default_factory=list)
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))

    @property
    def units(self) -> int:
        return len(self.unit_dirs)

    async def thread(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self.limiter)

    # ------------------------------------------------------------ admin handlers

    async def call_unit(self, unit: int, cmd: str, args: dict[str, Any]) -> Any:
        """``cmd`` on unit ``unit``: in-process for this one, else over its
        admin socket (AdminError when that unit does not answer)."""
        if unit == self.unit:
            res = await self.handlers[cmd](dict(args))
            if isinstance(res, AfterReply):  # (stop: not offered by the console)
                res.action()
                res = res.result
            return res
        if not 1 <= unit <= self.units:
            raise ActionError(f"unit {unit} is not one of this node's units 1..{self.units}")
        path = admin_socket_path(self.unit_dirs[unit - 1])
        return await self.thread(lambda: admin_call(path, cmd, args, timeout=30.0))

    async def call_all(self, cmd: str, args: dict[str, Any]) -> list[tuple[int, Any]]:
        """``cmd`` on every unit: (unit, answer), an answer an
        ``{"error": ...}`` when that unit did not answer."""
        out: list[tuple[int, Any]] = []
        for k in range(1, self.units + 1):
            try:
                out.append((k, await self.call_unit(k, cmd, args)))
            except (AdminError, AdminCommandError, OSError) as e:
                out.append((k, {"error": str(e)}))
        return out

    # ------------------------------------------------------------ history

    def history_paths(self) -> list[Path]:
        try:
            from semq.tracking.history import history_paths
        except ImportError:  # (a build without the delivery history)
            return []
        return list(history_paths(self.directory))

    async def history(self, fn: Callable[[Any], T], empty: T) -> T:
        """``fn(reader)`` on a HistoryReader over every unit's history, in a
        thread (a reader per call: SQLite connections stay in their thread)."""

        def run() -> T:
            try:
                from semq.tracking.history import HistoryReader
            except ImportError:
                return empty
            paths = self.history_paths()
            if not paths:
                return empty
            reader = HistoryReader(paths)
            try:
                return fn(reader)
            finally:
                reader.close()

        return await self.thread(run)

    async def search(self, **filters: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self.history(lambda r: r.search(**filters), [])
        return rows

    async def document(self, lk0: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self.history(lambda r: r.document(lk0), [])
        return rows

    async def receipt(self, lk0: str) -> dict[str, Any] | None:
        """The verified receipt of one of this node's documents (as
        ``semq messages --receipt``), None when there is none to show."""
        if self.role != "node" or self.config is None:
            return None
        org, unit, _db, rid = parse_lk0(lk0)
        if org != self.ident or not 1 <= unit <= self.units:
            return None
        cfg = self.config

        def q() -> dict[str, Any] | None:
            from semq.node.api import NodeClient

            with NodeClient(cfg.directory, config=cfg.for_unit(1)) as client:
                try:
                    info: dict[str, Any] = client.receipt(rid, unit)
                except KeyError:
                    return None
                return info

        return await self.thread(q)

    # ------------------------------------------------------------ dashboard

    def _certificate_files(self) -> list[tuple[str, Path]]:
        d = self.directory
        if self.role == "node":
            files = [("own", d / "node.pem"), ("CA", d / "ca.pem")]
            files += [(f"counterpart {p.stem}", p) for p in sorted((d / "certs").glob("*.pem"))]
        else:
            files = [("own (TLS)", d / "tls" / "server.pem"), ("CA", d / "ca" / "ca.pem")]
            files += [("issued", p) for p in sorted((d / "ca" / "issued").glob("*.pem"))[:500]]
        return files + self.extra_certs

    async def dashboard(self) -> dict[str, Any]:
        now = now_ms()
        since = now - RATE_SPAN_MS

        def hist(r: Any) -> dict[str, Any]:
            return {"rates": r.activity(since, RATE_BUCKET_MS, now), "latency": r.latency(since, RATE_BUCKET_MS, now)}

        h: dict[str, Any] = await self.history(hist, {"rates": {}, "latency": {}})
        lat = h["latency"]
        status = await self.call_all("status", {})
        stuck = await self.call_all("stuck", {"limit": 50})
        certs = await self.thread(lambda: _cert_rows(self._certificate_files()))
        return {
            "now_ms": now, "role": self.role, "id": self.ident, "units": self.units,
            "rates": h["rates"],
            # Per minute: documents confirmed, and the p50 / p99 of their
            # queued -> confirmed time (the upper bound of its histogram bucket).
            "latency": {"ts": lat.get("start", []), "count": lat.get("count", []), "p50": lat.get("p50", []),
                        "p99": lat.get("p99", [])},
            "backlog": self._backlog(status), "nodes": self._nodes(status),
            "stuck": self._stuck(stuck), "certificates": certs,
            "draining": any(isinstance(s, dict) and (s.get("drain") or {}).get("requested") for _, s in status),
            "errors": [{"unit": k, "error": s["error"]} for k, s in status if "error" in s],
        }

    def _backlog(self, status: list[tuple[int, Any]]) -> list[dict[str, Any]]:
        by: dict[str, dict[str, Any]] = {}
        for _k, s in status:
            for q in (s.get("queues") or []) if isinstance(s, dict) else []:
                if self.role == "platform" and q.get("kind") != "DATA":
                    continue
                row = by.setdefault(q["target"], {"target": q["target"], "open": 0, "failed": 0, "oldest_ms": None})
                if self.role == "node" and q["state"] not in _OPEN_STATES:
                    row["failed"] += q["count"]
                    continue
                row["open"] += q["count"]
                if q.get("oldest_ms") is not None:
                    row["oldest_ms"] = min(x for x in (row["oldest_ms"], q["oldest_ms"]) if x is not None)
        if self.role == "platform":
            online = {n for _k, s in status if isinstance(s, dict) for n in s.get("online") or []}
            for row in by.values():
                row["online"] = row["target"] in online
        return sorted(by.values(), key=lambda r: (-r["open"], r["target"]))

    def _nodes(self, status: list[tuple[int, Any]]) -> list[dict[str, Any]]:
        if self.role != "platform":
            return []
        out = []
        for _k, s in status:
            for n in (s.get("nodes") or []) if isinstance(s, dict) else []:
                out.append({"node": n["node"], "online": bool(n.get("online")), "last_seen_ms": n.get("last_seen_ms"),
                            "revoked": bool(n.get("revoked"))})
        return out

    def _stuck(self, answers: list[tuple[int, Any]]) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        count = 0
        for k, a in answers:
            if not isinstance(a, dict) or "error" in a:
                continue
            count += int(a.get("count") or 0)
            for r in a.get("rows") or []:
                rows.append({**r, "unit": k})
        rows.sort(key=lambda r: r.get("created_ms") or r.get("stored_ms") or 0)
        return {"count": count, "rows": rows[:100]}

    # ------------------------------------------------------------ actions

    async def _platform_ids(self, lk0s: Sequence[str]) -> list[int]:
        ids: list[int] = []
        for text in lk0s:
            try:
                res = await self.call_unit(1, "show", {"lk0": text})
            except AdminCommandError:
                continue  # nothing stored for it (any more)
            rows = res.get("rows") if "rows" in res else [res]
            ids += [int(r["id"]) for r in rows if r.get("kind") == "DATA" and r.get("id")]
        return ids

    async def act(self, action: str, sel: Selection, *, dry_run: bool, user: str) -> dict[str, Any]:
        """Run ``action`` (one of ACTIONS) on the selection, or only say what
        it would do (``dry_run``). Answers the handlers' result, summed over
        the units: matched, would, changed, skipped, and per unit. A
        confirmed drain answers ``later``: the coroutine function that
        drains this unit, to run once the answer is sent."""
        if action not in ACTIONS:
            raise ActionError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
        if action == "drain":
            reason = f"drain requested by {user} on the web console"
            if dry_run:
                st = await self.call_all("status", {})
                return {"action": "drain", "dry_run": True, "units": [
                    {"unit": k, "draining": bool((s.get("drain") or {}).get("requested")) if "error" not in s
                     else None, "error": s.get("error")} for k, s in st]}
            # The other units first; this one after the answer is sent
            # (``later``: a drain with nothing in flight stops this process
            # at once, which would cut the answer off).
            units: list[dict[str, Any]] = []
            for k in range(1, self.units + 1):
                if k == self.unit:
                    units.append({"unit": k, "requested": True})
                    continue
                try:
                    units.append({"unit": k, **await self.call_unit(k, "drain", {"reason": reason})})
                except (AdminError, AdminCommandError, OSError) as e:
                    units.append({"unit": k, "error": str(e)})
            own = self.handlers["drain"]

            async def later() -> None:
                await own({"reason": reason})

            return {"action": "drain", "dry_run": False, "units": units, "later": later}
        base: dict[str, Any] = {"dry_run": dry_run}
        calls: list[tuple[int, dict[str, Any]]] = []
        if sel.lk0s:
            if self.role == "node":
                per: dict[int, list[int]] = {}
                for text in sel.lk0s:
                    org, unit, _db, rid = parse_lk0(text)
                    if org != self.ident:
                        raise ActionError(f"LK0 {text} is a document of {org}: only this node's own"
                                          f" ({self.ident}) can be acted on here")
                    if not 1 <= unit <= self.units:
                        raise ActionError(f"LK0 {text} names unit {unit}; this node has {self.units}")
                    per.setdefault(unit, []).append(rid)
                calls = [(k, {**base, "ids": ids}) for k, ids in sorted(per.items())]
            else:
                ids = await self._platform_ids(sel.lk0s)
                if not ids:
                    return {"action": action, "dry_run": dry_run, "matched": 0, "would": 0, "changed": 0,
                            "skipped": [], "units": [], "note": "nothing stored for these documents"}
                calls = [(1, {**base, "ids": ids})]
        else:
            calls = [(k, {**base, **sel.filters()}) for k in range(1, self.units + 1)]
        out: dict[str, Any] = {"action": action, "dry_run": dry_run, "matched": 0, "would": 0, "changed": 0,
                               "skipped": [], "more": False, "units": []}
        for k, args in calls:
            try:
                a = await self.call_unit(k, action, args)
            except (AdminError, OSError) as e:
                out["units"].append({"unit": k, "error": str(e)})
                continue
            for n in ("matched", "would", "changed"):
                out[n] += int(a.get(n) or 0)
            out["skipped"] += [{**s, "unit": k} for s in a.get("skipped") or []]
            out["more"] = out["more"] or bool(a.get("more"))
            out["units"].append({"unit": k, "matched": a.get("matched"), "would": a.get("would"),
                                 "changed": a.get("changed"), "ids": (a.get("ids") or [])[:100]})
        if sel.lk0s and not out["would"]:
            notes = [n for n in [await self._done_note(t) for t in sel.lk0s[:20]] if n]
            if notes:
                out["note"] = " ".join(notes)
        return out

    async def _done_note(self, lk0: str) -> str:
        """Why an action finds nothing of ``lk0``: confirmed already (the
        delivery history says by whom and when), with how to send a new copy."""
        for r in await self.document(lk0):
            if r.get("role") == "origin" and r.get("state") == "ack2":
                return (f"{lk0} is already confirmed by {r.get('target')}: it has arrived, so nothing is resent"
                        f" or purged; to send a new copy, send the file again (semq send --to {r.get('target')}"
                        " ... FILE).")
            if r.get("role") == "platform" and r.get("state") == "acked":
                return f"{lk0} was taken and acknowledged by {r.get('target')}: nothing is stored for it here."
        return ""
