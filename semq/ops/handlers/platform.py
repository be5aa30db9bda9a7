"""The admin console's commands for a running platform (semq.ops.handlers)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple

from semq.node.engine import OperatorAction
from semq.platform.engine import STORED_OPERATOR, StoredState
from semq.tracking.events import now_ms

from ..admin import AdminCommandError, DrainControl, Handler
from ._common import (
    _DATA_KIND,
    DEFAULT_STUCK_AFTER,
    MAX_SELECT,
    ReloadCallback,
    _applicable,
    _common,
    _int,
    _limit,
    _lk0,
    _log,
    _result,
    _seconds,
    _select,
    _selection,
    _sql_where,
    _states,
    _where,
    store_bytes,
)

__all__ = ["platform_busy", "platform_handlers"]


def platform_busy(daemon: Any) -> int:
    """What a draining platform waits for: bytes queued to connected nodes
    and stored copies delivered but not acked."""
    return sum(int(s.queued) + int(s.in_flight) for s in list(daemon.sessions.values()))


class StoredAdminRow(NamedTuple):
    """A platform's stored copy (``stored``: its pending-send table) as the
    console shows it: no frame, its size. ``origin_id`` .. ``record_id`` are
    the LK0 of a DATA copy (zero for a relayed ack or inquiry)."""

    id: int
    target_id: str
    kind: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    state: int
    priority: int
    expires_ms: int | None
    stored_ms: int
    attempts: int
    last_sent_ms: int | None
    inquiries: int
    size: int

    @property
    def lk0_key(self) -> tuple[str, int, int, int]:
        return (self.origin_id, self.semq_id, self.semq_db_id, self.record_id)


# The SELECT list from the fields; a stored copy's size is its frame's (a kept chunk's is in its file).
_STORED_COLS: Final = _select(StoredAdminRow, {"size": "coalesce(ref_length, length(frame))"})


class _StoredDepth(NamedTuple):
    """``status``: stored copies per target, kind (DATA or relayed) and state."""

    target_id: str
    is_data: int
    state: int
    rows: int  # count(*) (``count`` is a tuple's method)
    oldest_ms: int


_STORED_DEPTH_COLS: Final = _select(_StoredDepth, {"is_data": "kind=1", "rows": "count(*)",
                                                   "oldest_ms": "min(stored_ms)"})


def _kind_name(kind: int) -> str:
    from semq.umxt_protocol import Kind

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
        "id": r.id, "lk1": f"1/1/{r.id}" if r.kind == _DATA_KIND else None, "target": r.target_id,
        "kind": _kind_name(r.kind), "origin": r.origin_id,
        "lk0": f"{r.origin_id}/{r.semq_id}/{r.semq_db_id}/{r.record_id}" if r.record_id else None,
        "state": _stored_state(r.state), "priority": r.priority, "expires_ms": r.expires_ms,
        "stored_ms": r.stored_ms, "attempts": r.attempts, "last_sent_ms": r.last_sent_ms,
        "inquiries": r.inquiries, "size": r.size,
    }


def _stored_rows(rows: Iterable[Sequence[Any]]) -> Iterator[StoredAdminRow]:
    return map(StoredAdminRow._make, rows)


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
        core.write_held_now()
        c = core.conn
        counts = core.counts()
        queues = [
            {"target": q.target_id, "kind": "DATA" if q.is_data else "relayed", "state": _stored_state(q.state),
             "count": q.rows, "oldest_ms": q.oldest_ms}
            for q in map(_StoredDepth._make, c.execute(
                f"SELECT {_STORED_DEPTH_COLS} FROM stored"
                " GROUP BY target_id, kind=1, state ORDER BY target_id, kind=1 DESC, state"))
        ]
        nodes = [{"node": i, "last_seen_ms": ls, "revoked": bool(rv)}
                 for i, ls, rv in c.execute("SELECT node_id, last_seen_ms, revoked FROM nodes ORDER BY node_id")]
        oldest = c.execute("SELECT min(stored_ms) FROM stored WHERE kind=1").fetchone()[0]
        return {**counts, "queues": queues, "nodes": nodes, "oldest_unconfirmed_ms": oldest}

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

    def _kind_clause(args: dict[str, Any], clauses: list[str]) -> None:
        kind = str(args.get("kind") or "data")
        if kind == "data":
            clauses.append("kind=1")
        elif kind == "relayed":
            clauses.append("kind!=1")
        elif kind != "all":
            raise AdminCommandError(f"kind {kind!r} is not data, relayed or all")

    async def list_(args: dict[str, Any]) -> dict[str, Any]:
        limit = _limit(args)
        after = _int(args, "after", 0) or 0
        clauses: list[str] = ["id > ?"]
        params: list[Any] = [after]
        _kind_clause(args, clauses)
        _where(clauses, params, state_col="state", states=_states(args, StoredState),
               target=args.get("target") or None, time_col="stored_ms", older_than=_seconds(args, "older_than"))
        if args.get("origin"):
            clauses.append("origin_id=?")
            params.append(str(args["origin"]))

        def q() -> list[dict[str, Any]]:
            core.write_held_now()
            return [_stored_row(r) for r in _stored_rows(core.conn.execute(
                f"SELECT {_STORED_COLS} FROM stored{_sql_where(clauses)} ORDER BY id LIMIT ?", (*params, limit)))]

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
            core.write_held_now()
            c = core.conn
            if rid is not None:
                rows = list(_stored_rows(c.execute(f"SELECT {_STORED_COLS} FROM stored WHERE id=?", (rid,))))
            else:
                assert lk0 is not None
                rows = list(_stored_rows(c.execute(
                    f"SELECT {_STORED_COLS} FROM stored WHERE origin_id=? AND semq_id=? AND"
                    " semq_db_id=? AND record_id=? AND kind=1 ORDER BY id", lk0)))
            seen = None
            key = lk0 if lk0 is not None else (rows[0].lk0_key if rows else None)
            if key is not None:
                s = c.execute("SELECT action, lk1, seen_ms FROM seen WHERE origin_id=? AND semq_id=? AND"
                              " semq_db_id=? AND record_id=?", key).fetchone()
                if s is not None:
                    action, lk1, seen_ms = s
                    seen = {"action": {1: "forwarded", 2: "stored", 3: "dropped"}.get(action, str(action)),
                            "lk1": lk1 or None, "seen_ms": seen_ms}
            return {"rows": [_stored_row(r) for r in rows], "seen": seen}

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
            core.write_held_now()
            cutoff = now_ms() - int(older * 1000)
            c = core.conn
            rows = [_stored_row(r) for r in _stored_rows(c.execute(
                f"SELECT {_STORED_COLS} FROM stored WHERE stored_ms < ? ORDER BY stored_ms, id LIMIT ?",
                (cutoff, limit)))]
            n_data = c.execute("SELECT count(*) FROM stored WHERE kind=1 AND stored_ms < ?", (cutoff,)).fetchone()[0]
            n_rel = c.execute("SELECT count(*) FROM stored WHERE kind!=1 AND stored_ms < ?", (cutoff,)).fetchone()[0]
            return rows, n_data, n_rel

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
        clauses, params, _explicit = _selection(args, StoredState, state_col="state", time_col="stored_ms")
        if action is not OperatorAction.PURGE:
            clauses.append(f"kind={_DATA_KIND}")  # relayed acks/inquiries are sent once; their ends ask again
        elif args.get("kind"):
            _kind_clause(args, clauses)
        dry = bool(args.get("dry_run"))

        def work() -> dict[str, Any]:
            ts = now_ms()
            with core.db.atomic("IMMEDIATE"):
                core.write_held()  # the states the operator selects by are on disk
                rows = [_stored_row(r) for r in _stored_rows(core.conn.execute(
                    f"SELECT {_STORED_COLS} FROM stored{_sql_where(clauses)} ORDER BY id LIMIT ?",
                    (*params, MAX_SELECT + 1)))]
                rows, more, ok = _applicable(rows, STORED_OPERATOR, StoredState, action)
                if not dry:
                    core.operator_apply(action, [(r["id"], int(StoredState[r["state"]])) for r in ok])
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

    handlers.update({"status": status, "list": list_, "show": show, "stuck": stuck, "requeue": requeue,
                     "resend": resend, "purge": purge})
    return handlers

