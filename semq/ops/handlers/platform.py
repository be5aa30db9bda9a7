"""The admin console's commands for a running platform (semq.ops.handlers)."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Any, Final

from semq.node.engine import OperatorAction
from semq.platform.engine import StoredState
from semq.platform.seen import SeenAction
from semq.platform.views import SeenRow, StoredAdminRow, StoredSelection
from semq.tracking.events import now_ms
from semq.umxt_protocol import Kind
from semq.umxt_protocol.units import UNIT_SEP

from ..admin import AdminCommandError, DrainControl, Handler
from ._common import (
    DEFAULT_STUCK_AFTER,
    MAX_SELECT,
    ReloadCallback,
    _common,
    _ids,
    _int,
    _limit,
    _lk0,
    _log,
    _result,
    _seconds,
    _states,
    store_bytes,
)

__all__ = ["platform_busy", "platform_handlers"]

_DATA: Final = int(Kind.DATA)


def platform_busy(daemon: Any) -> int:
    """What a draining platform waits for: bytes queued to connected nodes
    and stored copies delivered but not acked."""
    return sum(int(s.queued) + int(s.in_flight) for s in list(daemon.sessions.values()))


def _kind_name(kind: int) -> str:
    try:
        return Kind(kind).name
    except ValueError:
        return str(kind)


def _stored_state(v: int) -> str:
    try:
        return StoredState(v).name
    except ValueError:
        return str(v)


def _stored_row(r: StoredAdminRow) -> dict[str, Any]:
    """A stored copy as the console answers it."""
    return {
        "id": r.id, "lk1": f"1/1/{r.id}" if r.kind == _DATA else None, "target": r.target_id,
        "kind": _kind_name(r.kind), "origin": r.origin_id,
        "lk0": f"{r.origin_id}/{r.semq_id}/{r.semq_db_id}/{r.record_id}" if r.record_id else None,
        "state": _stored_state(r.state), "priority": r.priority, "expires_ms": r.expires_ms,
        "stored_ms": r.stored_ms, "attempts": r.attempts, "last_sent_ms": r.last_sent_ms,
        "inquiries": r.inquiries, "size": r.size,
    }


def _seen(s: SeenRow | None) -> dict[str, Any] | None:
    """What became of a document, as the console answers it."""
    if s is None:
        return None
    try:
        action = SeenAction(s.action).name.lower()
    except ValueError:
        action = str(s.action)
    return {"action": action, "lk1": s.lk1 or None, "seen_ms": s.seen_ms}


def _kind(args: dict[str, Any], default: str = "data") -> str:
    kind = str(args.get("kind") or default)
    if kind not in ("data", "relayed", "all"):
        raise AdminCommandError(f"kind {kind!r} is not data, relayed or all")
    return kind


def _before(args: dict[str, Any], name: str) -> int | None:
    """``older_than`` seconds as the time a row must be stored before (None: not given)."""
    older = _seconds(args, name)
    return None if older is None else now_ms() - int(older * 1000)


def _selection(args: dict[str, Any]) -> StoredSelection:
    """The rows requeue/resend/purge take: explicit ids, or filters; a
    selection of everything needs ``all: true`` (an operator's typo must
    not purge a store)."""
    sel = StoredSelection(ids=tuple(_ids(args)), states=tuple(_states(args, StoredState)),
                          target=args.get("target") or None, stored_before_ms=_before(args, "older_than"))
    if not (sel.ids or sel.states or sel.target or sel.stored_before_ms is not None or args.get("all")):
        raise AdminCommandError("name record ids, or filters (state, target, older_than), or all=true")
    return sel


def platform_handlers(
    daemon: Any,
    core: Any,
    *,
    reload: ReloadCallback,
    drain: DrainControl,
    metrics: Any = None,
    stuck_after: float = DEFAULT_STUCK_AFTER,
) -> dict[str, Handler]:
    """Admin commands of the running platform. ``daemon`` is a
    semq.platform.daemon.PlatformDaemon (uses ``gate``, ``sessions``
    {Endpoint: Session with queued/in_flight/window/wake_deliver},
    ``stats``, ``port``); ``core`` its PlatformCore."""
    pid_ = core.me.node_id
    handlers = _common("platform", pid_, drain, reload)

    def online_ids() -> set[str]:
        return {ep.node_id for ep in list(daemon.sessions)}

    def _snapshot() -> dict[str, Any]:
        st = core.operator.status()  # (the states held in memory written first)
        counts = core.counts()
        queues = [{"target": q.target_id, "kind": "DATA" if q.is_data else "relayed",
                   "state": _stored_state(q.state), "count": q.rows, "oldest_ms": q.oldest_ms} for q in st.depths]
        nodes = [{"node": n.node_id, "last_seen_ms": n.last_seen_ms, "revoked": bool(n.revoked)} for n in st.nodes]
        return {**counts, "queues": queues, "nodes": nodes, "oldest_unconfirmed_ms": st.oldest_ms}

    async def status(args: dict[str, Any]) -> dict[str, Any]:
        snap = await daemon.gate.run(_snapshot)
        online = []
        for ep, s in list(daemon.sessions.items()):
            online.append({"node": ep.node_id, "queued_bytes": s.queued, "in_flight": s.in_flight,
                           "window": s.window})
        on = {o["node"] for o in online}
        for n in snap["nodes"]:
            n["online"] = n["node"] in on
        port = getattr(daemon, "port", None)
        host = getattr(getattr(daemon, "s", None), "host", None)
        out: dict[str, Any] = {
            # "listen" and "online" (ids) as in status.json: `semq status` reads either
            "role": "platform", "id": pid_, "pid": os.getpid(), "port": port,
            "listen": f"{host}:{port}" if host and port else None, "connections": len(online),
            "online": sorted(on), "sessions": sorted(online, key=lambda o: o["node"]),
            "stats": dict(daemon.stats), "store_calls": daemon.gate.calls, "store_bytes": store_bytes(core.path),
            "drain": drain.status(), **snap,
        }
        if metrics is not None:
            out["commit_batches"] = metrics.batch_summary()
        return out

    async def list_(args: dict[str, Any]) -> dict[str, Any]:
        limit = _limit(args)
        sel = StoredSelection(after=_int(args, "after", 0) or 0, kind=_kind(args),
                              states=tuple(_states(args, StoredState)), target=args.get("target") or None,
                              origin=str(args["origin"]) if args.get("origin") else None,
                              stored_before_ms=_before(args, "older_than"))

        def q() -> list[dict[str, Any]]:
            return [_stored_row(r) for r in core.operator.rows(sel, limit)]

        rows = await daemon.gate.run(q)
        on = online_ids()
        for r in rows:
            r["target_online"] = r["target"] in on
        return {"table": "stored", "count": len(rows), "rows": rows}

    async def show(args: dict[str, Any]) -> dict[str, Any]:
        lk0 = _lk0(str(args["lk0"])) if args.get("lk0") else None
        rid = _int(args, "id", lo=1)
        if rid is None and lk0 is None:
            raise AdminCommandError("show needs an id (LK1 record id) or an lk0")

        def q() -> dict[str, Any]:
            rows, seen = core.operator.show(rid, lk0)
            return {"rows": [_stored_row(r) for r in rows], "seen": _seen(seen)}

        res: dict[str, Any] = await daemon.gate.run(q)
        if not res["rows"] and res["seen"] is None:
            what = f"record {rid}" if rid is not None else f"LK0 {args['lk0']}"
            raise AdminCommandError(f"no stored {what} and no trace of it (acked copies are cleaned up)")
        on = online_ids()
        for r in res["rows"]:
            r["target_online"] = r["target"] in on
        if rid is not None and len(res["rows"]) == 1:
            return {**res["rows"][0], "seen": res["seen"]}
        return res

    async def stuck(args: dict[str, Any]) -> dict[str, Any]:
        older = _seconds(args, "older_than", stuck_after)
        assert older is not None
        limit = _limit(args)

        def q() -> tuple[list[dict[str, Any]], int, int]:
            rows, n_data, n_rel = core.operator.stuck(now_ms() - int(older * 1000), limit)
            return [_stored_row(r) for r in rows], n_data, n_rel

        rows, n_data, n_rel = await daemon.gate.run(q)
        on = online_ids()
        by_place: dict[str, int] = {}
        for r in rows:
            online = r["target"] in on
            if r["kind"] != "DATA":
                place = "relayed_waiting_target_offline" if not online else "relayed_waiting"
            elif r["state"] == StoredState.SS_SENT.name:
                place = "delivered_not_acked"
            else:
                place = "stored_target_offline" if not online else "stored_waiting_delivery"
            r["place"], r["target_online"] = place, online
            r["age_s"] = round((now_ms() - r["stored_ms"]) / 1000, 1)
            by_place[place] = by_place.get(place, 0) + 1
        return {"older_than_s": older, "count": n_data + n_rel, "data": n_data, "relayed": n_rel,
                "by_place_listed": by_place, "rows": rows}

    async def run_apply(args: dict[str, Any], action: OperatorAction) -> dict[str, Any]:
        """Apply ``action`` to the selected stored rows whose state allows it
        (semq.platform.engine.STORED_OPERATOR_TABLE); the others are ``skipped``."""
        verb = action.value
        sel = _selection(args)
        # Relayed acks/inquiries are sent once (their ends ask again): only
        # purge takes them, and only when asked to.
        sel = replace(sel, kind="data" if action is not OperatorAction.PURGE else _kind(args, "all"))
        dry = bool(args.get("dry_run"))

        def work() -> dict[str, Any]:
            ts = now_ms()
            selected, more, applied = core.operator.apply(action, sel, limit=MAX_SELECT, dry=dry)
            rows, ok = [_stored_row(r) for r in selected], [_stored_row(r) for r in applied]
            if not dry and ok and action is OperatorAction.PURGE:
                _log(core, [{"ts": ts, "event": "dropped", "lk0": r["lk0"], "source": r["origin"],
                             "target": r["target"], "lk1": r["lk1"], "code": 0,
                             "detail": "purged by the operator"} for r in ok if r["kind"] == "DATA"])
            credit: dict[str, int] = {}
            for r in ok:
                if r["kind"] == "DATA" and r["state"] == StoredState.SS_SENT.name:
                    credit[r["target"]] = credit.get(r["target"], 0) + 1
            return {**_result(verb, dry, rows, ok, more, 0), "_credit": credit,
                    "_targets": sorted({r["target"] for r in ok})}

        res: dict[str, Any] = await daemon.gate.run(work)
        if not dry:
            # Delivered copies that go again (or are gone) are no longer in
            # the target's window; wake its deliverer.
            for ep, session in list(daemon.sessions.items()):
                n = res["_credit"].get(ep.node_id, 0)
                if n:
                    session.in_flight = max(0, session.in_flight - n)
                if ep.node_id in res["_targets"]:
                    session.pending = True
                    session.wake_deliver.set()
        del res["_credit"], res["_targets"], res["_was_sent"]
        return res

    async def requeue(args: dict[str, Any]) -> dict[str, Any]:
        """Stored copies delivered but not acked back to SS_INIT
        (STORED_OPERATOR_TABLE): delivered again while the target is
        online, else when it connects."""
        return await run_apply(args, OperatorAction.REQUEUE)

    async def resend(args: dict[str, Any]) -> dict[str, Any]:
        """The platform has no failed state: the same as requeue."""
        return await run_apply(args, OperatorAction.RESEND)

    async def purge(args: dict[str, Any]) -> dict[str, Any]:
        """Delete stored rows (logged as ``dropped``). For SaveFwd 3 the
        origin still asks the target and sends the document again: purge it
        at the origin too to drop it for good."""
        return await run_apply(args, OperatorAction.PURGE)

    async def organizations(args: dict[str, Any]) -> dict[str, Any]:
        """The organizations registered here (revoked ones too), each with
        the units granted and run, whether it is online (at this instance,
        or at another live one of a cluster), when it was last seen, the
        documents stored for it and the bytes its own documents take here
        against the quota (``quota_bytes``, 0: none)."""
        limit = _int(args, "limit", 1000, lo=1, hi=10_000)
        assert limit is not None

        def q() -> tuple[Any, dict[str, str]]:
            got = core.operator.organizations(limit)
            return got, (core.presence.online() if core.presence is not None else {})

        (orgs, waiting, used), elsewhere = await daemon.gate.run(q)
        here = online_ids()
        by_org: dict[str, list[str]] = {}  # an organization's routes (its units') with something to say
        for r in set(waiting) | here | set(elsewhere):
            by_org.setdefault(r.partition(UNIT_SEP)[0], []).append(r)
        rows = []
        for o in orgs:
            routes = by_org.get(o.node_id, [])
            stored = [waiting[r] for r in routes if r in waiting]
            rows.append({
                "org": o.node_id, "registered_ms": o.registered_ms, "last_seen_ms": o.last_seen_ms,
                "revoked": bool(o.revoked), "units": o.units, "units_granted": o.units_granted,
                "online": any(r in here or r in elsewhere for r in routes),
                "instances": sorted({"this" if r in here else elsewhere[r] for r in routes
                                     if r in here or r in elsewhere}),
                "stored": sum(n for n, _ in stored), "oldest_stored_ms": min((t for _, t in stored), default=None),
                "stored_bytes": used.get(o.node_id, 0),
            })
        return {"count": len(rows), "more": len(rows) >= limit, "quota_bytes": int(core.quota_bytes),
                "rows": rows}

    async def instances(args: dict[str, Any]) -> dict[str, Any]:
        """The platform's instances: on a PostgreSQL store every instance
        registered on it (alive while its heartbeat is recent), else this
        process alone."""
        if core.pg:
            rows = await daemon.gate.run(core.instances)
            return {"store": "postgresql", "rows": rows}
        port = getattr(daemon, "port", None)
        host = getattr(getattr(daemon, "s", None), "host", None)
        return {"store": "sqlite", "rows": [{
            "id": socket.gethostname(), "address": f"{host}:{port}" if host and port else "", "pid": os.getpid(),
            "heartbeat_ms": None, "alive": True, "holds": len(online_ids()), "this": True}]}

    handlers.update({"status": status, "list": list_, "show": show, "stuck": stuck, "requeue": requeue,
                     "resend": resend, "purge": purge, "organizations": organizations, "instances": instances})
    return handlers

