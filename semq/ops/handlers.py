"""The admin console's commands for a running node or platform.

``node_handlers(daemon, core, ...)`` / ``platform_handlers(daemon, core,
...)`` return ``{command: handler}`` for semq.ops.admin.serve_admin. Every
store access runs through ``daemon.gate`` (the daemon's one store thread;
STYLE 6), in one transaction per command, and delivery events are appended
to the core's event log after the commit (docs/events.md), so the
analytics and the metrics see operator actions too.

Commands (``args`` in parentheses; every command answers JSON):

- ``ping`` — role, id, pid.
- ``status`` — connections, online nodes, queue depth per target and
  state, oldest unconfirmed, daemon counters, commit batches (with metrics).
- ``list`` (state, target, older_than, after, limit; node: table
  outbox|inbound; platform: kind data|relayed|all) — rows without contents.
- ``show`` (id or lk0) — one row, without contents.
- ``stuck`` (older_than, limit) — no end-to-end confirmation for longer
  than older_than seconds (default 1 h, the analytics report's
  ``--stuck-after``), with where each one is stuck.
- ``requeue`` / ``resend`` / ``purge`` (ids | filters state, target,
  older_than; all; dry_run) — see each handler.
- ``drain`` / ``stop`` — semq.ops.admin.DrainControl.
- ``reload`` — the callback the daemon passes (certificates, configuration).
- ``wait_inbox`` (after_id, timeout, user; node only) — answered as soon as
  the inbox holds an unacknowledged row above after_id, or at the timeout
  (semq.ops.waiters, semq.session.inbox_wait).

Documents' contents and keys are never returned: rows carry sizes only.
Which rows requeue / resend / purge take, and the state they leave them in,
is decided by semq.node.engine.OPERATOR_TABLE (a node's pending-send rows)
and STORED_OPERATOR_TABLE (the platform's stored copies); rows in any other
state are reported ``skipped``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import IntEnum
from functools import partial
from pathlib import Path
from typing import Any, Final, NamedTuple

from semq.identity.security import WAITING_CODES, waiting_reason
from semq.node.engine import (
    OPERATOR,
    STORED_OPERATOR,
    AckStatus,
    ActionTable,
    OperatorAction,
    SendState,
    TransitionRefused,
)
from semq.node.writebehind import InboundAdminRow, OutboxAdminRow, columns
from semq.platform.engine import StoredState
from semq.tracking.events import now_ms

from .admin import AdminCommandError, AfterReply, DrainControl, Handler, until_hangup
from .display import MAX_LIMIT  # rows in one list/stuck answer (the CLI checks --limit against it)

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_STUCK_AFTER",
    "MAX_LIMIT",
    "MAX_SELECT",
    "ReloadCallback",
    "node_busy",
    "node_handlers",
    "platform_busy",
    "platform_handlers",
    "store_bytes",
]

DEFAULT_LIMIT: Final = 100
MAX_SELECT: Final = 100_000  # rows one requeue/resend/purge touches (one transaction); run it again for more
DEFAULT_STUCK_AFTER: Final = 3600.0  # s, as `semq report latency --stuck-after` (1h)

#: What ``reload`` calls: sync or async, returns what changed (or None).
ReloadCallback = Callable[[], Any]

_DATA_KIND: Final = 1  # umxt Kind.DATA in the platform's stored.kind
#: Not yet confirmed end to end (SPEC A.5: what the inquiries are about):
#: what ``stuck`` counts, as the metrics' "oldest unconfirmed".
_OPEN: Final = tuple(int(s) for s in (SendState.SS_INIT, SendState.SS_SENT, SendState.SS_ACK_FWD, SendState.SS_ACK))

#: Where a pending-send row is, by state (the analytics report's "place");
#: an SS_INIT row that carries a certificate code is waiting for one.
_WAITING_PLACE: Final = "waiting_for_certificate"
_SS_INIT: Final = int(SendState.SS_INIT)
_NODE_PLACE: Final = {
    SendState.SS_INIT: "at_origin_not_sent",
    SendState.SS_SENT: "sent_platform_ack_missing",
    SendState.SS_ACK_FWD: "forwarded_not_confirmed",
    SendState.SS_ACK: "stored_at_platform",
}


# ---------------------------------------------------------------- argument checks


def _int(args: dict[str, Any], name: str, default: int | None = None, *, lo: int = 0,
         hi: int | None = None) -> int | None:
    v = args.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise AdminCommandError(f"{name} must be an integer, not {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise AdminCommandError(f"{name} must be an integer, not {v!r}") from None
    if n < lo or (hi is not None and n > hi):
        raise AdminCommandError(f"{name} {n} is outside {lo}..{hi if hi is not None else 'inf'}")
    return n


def _seconds(args: dict[str, Any], name: str, default: float | None = None) -> float | None:
    v = args.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool):
        raise AdminCommandError(f"{name} must be a number of seconds, not {v!r}")
    try:
        s = float(v)
    except (TypeError, ValueError):
        raise AdminCommandError(f"{name} must be a number of seconds, not {v!r}") from None
    if s < 0 or s != s:
        raise AdminCommandError(f"{name} must be >= 0 seconds, not {v!r}")
    return s


def _ids(args: dict[str, Any]) -> list[int]:
    raw = args.get("ids", [])
    if raw is None:
        return []
    if isinstance(raw, int | str):
        raw = [raw]
    if not isinstance(raw, list):
        raise AdminCommandError(f"ids must be a list of record ids, not {raw!r}")
    out = []
    for v in raw:
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise AdminCommandError(f"record id {v!r} is not an integer") from None
        if n <= 0:
            raise AdminCommandError(f"record id {n} must be positive")
        out.append(n)
    if len(out) > MAX_SELECT:
        raise AdminCommandError(f"{len(out)} ids exceed the {MAX_SELECT}-row limit of one command")
    return out


def _states(args: dict[str, Any], enum: type[SendState] | type[StoredState]) -> list[int]:
    raw = args.get("state")
    if raw is None or raw == "" or raw == []:
        return []
    items = raw if isinstance(raw, list) else str(raw).split(",")
    out = []
    for item in items:
        text = str(item).strip().upper()
        if text.isdigit() and int(text) in {int(m) for m in enum}:
            out.append(int(text))
            continue
        name = text if text.startswith("SS_") else f"SS_{text}"
        if name not in enum.__members__:
            raise AdminCommandError(f"state {item!r} is not one of {', '.join(enum.__members__)}")
        out.append(int(enum.__members__[name]))
    return out


def _limit(args: dict[str, Any]) -> int:
    n = _int(args, "limit", DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT)
    assert n is not None
    return n


def _lk0(text: str) -> tuple[str, int, int, int]:
    parts = str(text).split("/")
    if len(parts) != 4 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise AdminCommandError(f"LK0 {text!r} is not NODE/SEMQ_ID/DB_ID/RECORD_ID")
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


def _where(clauses: list[str], params: list[Any], *, state_col: str, states: Sequence[int],
           target: str | None, time_col: str, older_than: float | None) -> None:
    if states:
        clauses.append(f"{state_col} IN ({','.join('?' * len(states))})")
        params.extend(states)
    if target:
        clauses.append("target_id=?")
        params.append(target)
    if older_than is not None:
        clauses.append(f"{time_col} < ?")
        params.append(now_ms() - int(older_than * 1000))


def _selection(args: dict[str, Any], enum: type[SendState] | type[StoredState], *, state_col: str,
               time_col: str) -> tuple[list[str], list[Any], bool]:
    """WHERE clauses for requeue/resend/purge: explicit ids, or filters; a
    selection of everything needs ``all: true`` (an operator's typo must
    not purge a store)."""
    ids = _ids(args)
    states = _states(args, enum)
    target = args.get("target") or None
    older = _seconds(args, "older_than")
    clauses: list[str] = []
    params: list[Any] = []
    if ids:
        clauses.append(f"id IN ({','.join('?' * len(ids))})")
        params.extend(ids)
    _where(clauses, params, state_col=state_col, states=states, target=target, time_col=time_col,
           older_than=older)
    if not clauses and not args.get("all"):
        raise AdminCommandError("name record ids, or filters (state, target, older_than), or all=true")
    return clauses, params, bool(ids)



def _applicable(rows: list[dict[str, Any]], table: ActionTable[Any, Any], states: type[IntEnum],
                action: OperatorAction) -> tuple[list[dict[str, Any]], bool, list[dict[str, Any]]]:
    """The rows selected (at most MAX_SELECT), whether there were more, and
    those whose state ``action`` applies to (the table says; the others are
    reported skipped, a state this version does not know too)."""
    more = len(rows) > MAX_SELECT
    rows = rows[:MAX_SELECT]
    ok = []
    for r in rows:
        try:
            table.step(states[r["state"]], action, r["id"])
        except (KeyError, TransitionRefused):
            continue
        ok.append(r)
    return rows, more, ok

def _sql_where(clauses: Iterable[str]) -> str:
    c = list(clauses)
    return (" WHERE " + " AND ".join(c)) if c else ""


def store_bytes(path: Path | str) -> int:
    """Bytes of a store on disk: the database, its WAL and WAL index (0 for
    a PostgreSQL store: the server's to tell)."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except OSError:
            pass
    return total


async def _call_reload(reload: ReloadCallback) -> Any:
    res = reload()
    if inspect.isawaitable(res):
        res = await res
    return res


def _common(role: str, ident: str, drain: DrainControl, reload: ReloadCallback) -> dict[str, Handler]:
    started = time.time()

    async def ping(args: dict[str, Any]) -> dict[str, Any]:
        return {"role": role, "id": ident, "pid": os.getpid(), "uptime_s": round(time.time() - started, 3)}

    async def drain_(args: dict[str, Any]) -> dict[str, Any]:
        drain.request(str(args.get("reason") or "drain requested over the admin console"))
        return drain.status()

    async def stop(args: dict[str, Any]) -> AfterReply:
        reason = str(args.get("reason") or "stop requested over the admin console")
        st = {**drain.status(), "stopping": True}
        # Stop only after the answer is written (the client waits for it).
        return AfterReply(st, lambda: drain.stop(reason))

    async def reload_(args: dict[str, Any]) -> dict[str, Any]:
        res = await _call_reload(reload)
        return {"reloaded": True, **(res if isinstance(res, dict) else {"detail": res} if res else {})}

    return {"ping": ping, "drain": drain_, "stop": stop, "reload": reload_}


def _result(verb: str, dry: bool, rows: list[dict[str, Any]], ok: list[dict[str, Any]], more: bool,
            was_sent: int) -> dict[str, Any]:
    """The answer of requeue/resend/purge: ``matched`` rows selected,
    ``changed`` rows changed (0 on a dry run, ``would`` then), ``skipped``
    rows whose state does not allow it, ``more`` if the selection went past
    MAX_SELECT (run it again)."""
    okids = {r["id"] for r in ok}
    return {
        "action": verb, "dry_run": dry, "matched": len(rows), "changed": 0 if dry else len(ok),
        "would": len(ok), "ids": sorted(okids)[:1000],
        "skipped": [{"id": r["id"], "state": r["state"]} for r in rows if r["id"] not in okids][:100],
        "more": more, "_was_sent": was_sent,
    }


def _log(core: Any, records: list[dict[str, Any]]) -> None:
    """Append to the core's event log (after the commit; on the store thread)."""
    if records and getattr(core, "log", None) is not None:
        core.log.write(records)


# ---------------------------------------------------------------- node


def node_busy(daemon: Any) -> int:
    """What a draining node waits for: DATA sent but not acked by the platform."""
    return int(daemon.in_flight)


def _select(row: type[tuple[Any, ...]], exprs: dict[str, str]) -> str:
    """The SELECT list of a named row whose fields are not all columns of
    the same name: ``exprs`` gives those fields' expressions (an aggregate,
    a computed value), each named by its field."""
    fields = row._fields  # type: ignore[attr-defined]
    unknown = set(exprs) - set(fields)
    if unknown:
        raise ValueError(f"{row.__name__} has no field {sorted(unknown)}")
    return ", ".join(f"{exprs[f]} AS {f}" if f in exprs else f for f in fields)


# The node's rows as the console reads them, by name (semq.node.writebehind):
# the SELECT lists are made from the rows' fields.
_NODE_COLS: Final = columns(OutboxAdminRow)
_INBOUND_COLS: Final = columns(InboundAdminRow)


class _OutboxDepth(NamedTuple):
    """``status``: pending-send rows per target and state."""

    target_id: str
    state: int
    rows: int  # count(*) (``count`` is a tuple's method)
    oldest_ms: int


_OUTBOX_DEPTH_COLS: Final = _select(_OutboxDepth, {"rows": "count(*)", "oldest_ms": "min(created_ms)"})


def _send_state(v: int) -> str:
    try:
        return SendState(v).name
    except ValueError:  # a state this module does not know (a newer schema)
        return str(v)


def _ack_status(v: int) -> str:
    # Any value but AS_INIT reads as confirmed, as the receiver treats it.
    return AckStatus.AS_INIT.name if v == AckStatus.AS_INIT else AckStatus.AS_ACK.name


def _node_row(r: OutboxAdminRow, store: str) -> dict[str, Any]:
    """A pending-send row as the console answers it (JSON keys of docs/operations.md);
    ``store``: NODE/SEMQ_ID/DB_ID of its store."""
    return {
        "id": r.id, "lk0": f"{store}/{r.id}", "target": r.target_id, "state": _send_state(r.state),
        "save_fwd": r.save_fwd, "ack2": bool(r.ack2), "reliable": bool(r.reliable), "priority": r.priority,
        "app_key": {"domain": r.domain, "data_type": r.data_type, "subtype": r.subtype, "key": r.key},
        "created_ms": r.created_ms, "expires_ms": r.expires_ms, "attempts": r.attempts, "inquiries": r.inquiries,
        "sent_ms": r.sent_ms, "state_ms": r.state_ms, "last_inquiry_ms": r.last_inquiry_ms, "code": r.code,
        "encrypt": bool(r.encrypt), "size": r.size,
    }


def _inbound_row(r: InboundAdminRow) -> dict[str, Any]:
    """A pending-ack row as the console answers it."""
    return {
        "id": r.id, "lk0": f"{r.origin_id}/{r.semq_id}/{r.semq_db_id}/{r.record_id}", "origin": r.origin_id,
        "lk1_record_id": r.lk1_record_id or None, "platform": r.platform_id, "p_ack": _ack_status(r.p_ack),
        "s_ack": _ack_status(r.s_ack), "received_ms": r.received_ms, "last_inquiry_ms": r.last_inquiry_ms,
        "inquiries": r.inquiries,
    }


def _outbox_rows(rows: Iterable[Sequence[Any]]) -> Iterator[OutboxAdminRow]:
    return map(OutboxAdminRow._make, rows)


def _inbound_rows(rows: Iterable[Sequence[Any]]) -> Iterator[InboundAdminRow]:
    return map(InboundAdminRow._make, rows)


def _node_event(core: Any, row: dict[str, Any], event: str, ts: int, detail: str) -> dict[str, Any]:
    k = row["app_key"]
    return {
        "ts": ts, "role": "origin", "event": event, "lk0": row["lk0"], "source": core.me.node_id,
        "target": row["target"], "domain": k["domain"], "data_type": k["data_type"], "subtype": k["subtype"],
        "key": k["key"], "save_fwd": row["save_fwd"], "ack2": row["ack2"], "reliable": row["reliable"],
        "priority": row["priority"], "size": row["size"], "attempt": row["attempts"],
        "created_ms": row["created_ms"], "detail": detail,
    }


def _channel_wait(w: Any) -> dict[str, Any]:
    """A semq.node.channels.ChannelWait as the console shows it."""
    return {"origin": w.origin, "channel": w.channel, "held": w.held, "waits_for": w.lk0, "since_ms": w.since_ms,
            "text": w.describe()}


def node_handlers(
    daemon: Any,
    core: Any,
    *,
    reload: ReloadCallback,
    drain: DrainControl,
    metrics: Any = None,
    stuck_after: float = DEFAULT_STUCK_AFTER,
    waiters: Any = None,
) -> dict[str, Handler]:
    """Admin commands of a running node. ``daemon`` is a
    semq.node.daemon.NodeDaemon (uses ``gate``, ``connected``, ``address``, ``links``,
    ``s.addresses``, ``sessions``, ``in_flight``, ``stats``, ``wake()``); ``core`` its
    NodeCore (``conn``/``db`` on the store thread only, ``me``, ``path``,
    ``log``); ``metrics`` an optional semq.ops.metrics.Metrics; ``waiters``
    a semq.ops.waiters.InboxWaiters (then ``wait_inbox`` is served)."""
    org = core.me.node_id
    store = f"{org}/{core.unit}/1"  # this unit's store, as its LK0s name it (semq.umxt_protocol.units)
    handlers = _common("node", org, drain, reload)

    def _snapshot() -> dict[str, Any]:
        core.write_held_now()
        c = core.conn
        counts = core.counts()
        queues = [
            {"target": q.target_id, "state": _send_state(q.state), "count": q.rows, "oldest_ms": q.oldest_ms}
            for q in map(_OutboxDepth._make, c.execute(
                f"SELECT {_OUTBOX_DEPTH_COLS} FROM outbox GROUP BY target_id, state ORDER BY target_id, state"))
        ]
        return {**counts, "queues": queues}

    async def status(args: dict[str, Any]) -> dict[str, Any]:
        snap = await daemon.gate.run(_snapshot)
        out: dict[str, Any] = {
            "role": "node", "org": org, "pid": os.getpid(), "connected": bool(daemon.connected),
            "platform": str(daemon.address) if daemon.address else None,
            "platforms": [str(a) for a in daemon.s.addresses],
            "sessions": daemon.sessions, "in_flight": daemon.in_flight, "stats": dict(daemon.stats),
            "direct": daemon.links.snapshot(),
            "store_calls": daemon.gate.calls, "store_bytes": store_bytes(core.path), "drain": drain.status(),
            **snap,
        }
        if metrics is not None:
            out["commit_batches"] = metrics.batch_summary()
        if waiters is not None:  # clients waiting for documents (wait_inbox)
            out["waits"] = dataclasses.asdict(waiters.statistics())
        return out

    async def list_(args: dict[str, Any]) -> dict[str, Any]:
        table = str(args.get("table") or "outbox")
        limit = _limit(args)
        after = _int(args, "after", 0) or 0
        older = _seconds(args, "older_than")
        if table == "inbound":
            def q_in() -> list[dict[str, Any]]:
                core.write_held_now()
                clauses: list[str] = ["id > ?"]
                params: list[Any] = [after]
                if older is not None:
                    clauses.append("received_ms < ?")
                    params.append(now_ms() - int(older * 1000))
                if args.get("origin"):
                    clauses.append("origin_id=?")
                    params.append(str(args["origin"]))
                return [_inbound_row(r) for r in _inbound_rows(core.conn.execute(
                    f"SELECT {_INBOUND_COLS} FROM inbound{_sql_where(clauses)} ORDER BY id LIMIT ?",
                    (*params, limit)))]
            rows = await daemon.gate.run(q_in)
            return {"table": "inbound", "count": len(rows), "rows": rows}
        if table != "outbox":
            raise AdminCommandError(f"table {table!r} is not outbox or inbound")
        states = _states(args, SendState)
        target = args.get("target") or None

        def q() -> list[dict[str, Any]]:
            core.write_held_now()
            clauses: list[str] = ["id > ?"]
            params: list[Any] = [after]
            _where(clauses, params, state_col="state", states=states, target=target, time_col="created_ms",
                   older_than=older)
            return [_node_row(r, store) for r in _outbox_rows(core.conn.execute(
                f"SELECT {_NODE_COLS} FROM outbox{_sql_where(clauses)} ORDER BY id LIMIT ?", (*params, limit)))]

        rows = await daemon.gate.run(q)
        return {"table": "outbox", "count": len(rows), "rows": rows}

    async def show(args: dict[str, Any]) -> dict[str, Any]:
        rid = args.get("id")
        if rid is None and args.get("lk0"):
            node, unit, _d, rid = _lk0(str(args["lk0"]))
            if node != org:
                raise AdminCommandError(f"LK0 {args['lk0']} names a record of {node}, not of this node ({org})")
            if unit != core.unit:
                raise AdminCommandError(f"LK0 {args['lk0']} names a record of unit {unit}, not of this one"
                                        f" ({core.unit})")
        rid = _int({"id": rid}, "id", lo=1)
        if rid is None:
            raise AdminCommandError("show needs an id or an lk0")
        table = str(args.get("table") or "outbox")

        def q() -> dict[str, Any] | None:
            core.write_held_now()
            if table == "inbound":
                got = core.conn.execute(f"SELECT {_INBOUND_COLS} FROM inbound WHERE id=?", (rid,)).fetchone()
                return None if got is None else _inbound_row(InboundAdminRow._make(got))
            got = core.conn.execute(f"SELECT {_NODE_COLS} FROM outbox WHERE id=?", (rid,)).fetchone()
            if got is None:
                return None
            row = _node_row(OutboxAdminRow._make(got), store)
            try:
                rc = core.conn.execute("SELECT verified, received_ms FROM receipts WHERE record_id=?",
                                       (rid,)).fetchone()
            except Exception:  # schema v1: no receipts table
                rc = None
            if rc is None:
                row["receipt"] = None
            else:
                verified, received_ms = rc
                row["receipt"] = {"verified": bool(verified), "received_ms": received_ms}
            return row

        row = await daemon.gate.run(q)
        if row is None:
            raise AdminCommandError(f"no {table} record {rid} (confirmed records are cleaned up)")
        return row

    async def stuck(args: dict[str, Any]) -> dict[str, Any]:
        older = _seconds(args, "older_than", stuck_after)
        assert older is not None
        limit = _limit(args)

        def q() -> dict[str, Any]:
            core.write_held_now()
            cutoff = now_ms() - int(older * 1000)
            c = core.conn
            by_place: dict[str, int] = {}
            for s, code, n in c.execute(
                f"SELECT state, code, count(*) FROM outbox WHERE reliable=1 AND state IN ({','.join('?' * len(_OPEN))})"
                " AND created_ms < ? GROUP BY state, code", (*_OPEN, cutoff)):
                place = _WAITING_PLACE if s == _SS_INIT and code in WAITING_CODES else _NODE_PLACE[SendState(s)]
                by_place[place] = by_place.get(place, 0) + n
            rows = []
            for r in _outbox_rows(c.execute(
                f"SELECT {_NODE_COLS} FROM outbox WHERE reliable=1 AND state IN ({','.join('?' * len(_OPEN))})"
                " AND created_ms < ? ORDER BY created_ms, id LIMIT ?", (*_OPEN, cutoff, limit))):
                row = _node_row(r, store)
                row["place"] = _NODE_PLACE[SendState(r.state)]
                if r.state == _SS_INIT and r.code in WAITING_CODES:
                    # A known organization without a usable certificate:
                    # the document waits for one (semq.identity.security).
                    row["place"] = _WAITING_PLACE
                    row["reason"] = waiting_reason(r.target_id, r.code)
                row["age_s"] = round((now_ms() - r.created_ms) / 1000, 1)
                rows.append(row)
            # Received here, but a confirmation of our ACK/ACK2 is missing.
            n_in = c.execute("SELECT count(*) FROM inbound WHERE received_ms < ?", (cutoff,)).fetchone()[0]
            if n_in:
                by_place["received_confirmation_missing"] = n_in
            for a in _inbound_rows(c.execute(f"SELECT {_INBOUND_COLS} FROM inbound WHERE received_ms < ? ORDER BY"
                                             " received_ms LIMIT ?", (cutoff, max(0, limit - len(rows))))):
                row = _inbound_row(a)
                row["place"] = "received_confirmation_missing"
                row["age_s"] = round((now_ms() - a.received_ms) / 1000, 1)
                rows.append(row)
            # Ordered channels that hold documents back (received, acknowledged,
            # not yet handed over), whatever their age: each waits for the
            # document its earliest held one follows.
            channels = [_channel_wait(w) for w in core.waiting_channels()]
            return {"older_than_s": older, "count": sum(by_place.values()), "by_place": by_place,
                    "rows": rows, "channels": channels}

        res: dict[str, Any] = await daemon.gate.run(q)
        res["connected"] = bool(daemon.connected)
        return res

    async def run_apply(args: dict[str, Any], action: OperatorAction) -> dict[str, Any]:
        """Apply ``action`` to the selected rows whose state allows it
        (semq.node.engine.OPERATOR_TABLE decides which and to what); the
        others are reported ``skipped``."""
        verb = action.value
        clauses, params, _explicit = _selection(args, SendState, state_col="state", time_col="created_ms")
        dry = bool(args.get("dry_run"))

        def work() -> dict[str, Any]:
            ts = now_ms()
            with core.db.atomic("IMMEDIATE"):
                core.write_held()  # the states the operator selects by are on disk
                rows = [_node_row(r, store) for r in _outbox_rows(core.conn.execute(
                    f"SELECT {_NODE_COLS} FROM outbox{_sql_where(clauses)} ORDER BY id LIMIT ?",
                    (*params, MAX_SELECT + 1)))]
                rows, more, ok = _applicable(rows, OPERATOR, SendState, action)
                if not dry:
                    # The state read above is the one the table was asked about.
                    core.operator.apply(action, [(r["id"], int(SendState[r["state"]])) for r in ok], ts)
            if not dry and ok:
                if action is OperatorAction.PURGE:
                    # A live row given up is a failure ("dead"); a failed row
                    # (a dead letter already) is only cleaned up (semq.node.dead).
                    recs = [_node_event(core, r, "cleaned" if r["state"] == SendState.SS_FAILED.name else "dead", ts,
                                        "purged by the operator") for r in ok]
                else:
                    recs = [_node_event(core, r, "resend", ts, f"{verb} by the operator") for r in ok]
                _log(core, recs)
            return _result(verb, dry, rows, ok, more, sum(1 for r in ok if r["state"] == SendState.SS_SENT.name))

        res = await daemon.gate.run(work)
        was_sent = res.pop("_was_sent")
        if not dry:
            # SS_SENT rows are no longer in flight: give the window back, and
            # wake the sender for what is SS_INIT now.
            if was_sent:
                daemon.in_flight = max(0, daemon.in_flight - was_sent)
            wake = getattr(daemon, "wake", None)
            if wake is not None:
                wake()
        return res

    async def requeue(args: dict[str, Any]) -> dict[str, Any]:
        """Failed rows (NACKed, expired, refused) sent again with their
        attempts and code reset (OperatorAction.REQUEUE: SS_FAILED -> SS_INIT)."""
        return await run_apply(args, OperatorAction.REQUEUE)

    async def resend(args: dict[str, Any]) -> dict[str, Any]:
        """Rows handed on but not confirmed end to end sent again now
        (OperatorAction.RESEND: SS_SENT, SS_ACK_FWD, SS_ACK -> SS_INIT;
        receivers suppress duplicates, SPEC B.4)."""
        return await run_apply(args, OperatorAction.RESEND)

    async def purge(args: dict[str, Any]) -> dict[str, Any]:
        """Delete pending-send rows in any state (OperatorAction.PURGE;
        logged as ``dead``, SS_FAILED rows, dead letters already, as
        ``cleaned``). A document already handed on may still arrive; an
        unsent one never."""
        return await run_apply(args, OperatorAction.PURGE)

    handlers.update({"status": status, "list": list_, "show": show, "stuck": stuck, "requeue": requeue,
                     "resend": resend, "purge": purge})
    if waiters is not None:
        handlers["wait_inbox"] = _wait_inbox(daemon, core, waiters)
    return handlers


def _wait_inbox(daemon: Any, core: Any, waiters: Any) -> Handler:
    from semq.node.api import inbox_top

    from .waiters import wait_timeout

    @until_hangup
    async def wait_inbox(args: dict[str, Any]) -> dict[str, Any]:
        """Until this unit's inbox holds an unacknowledged row above
        ``after_id`` (``user``: one of that user's), at most ``timeout`` s:
        ``{"ready": bool, "top": highest such row}``. Checked in the store
        now and after each commit that adds documents, never on a timer."""
        after = _int(args, "after_id", 0)
        assert after is not None
        user = args.get("user") or None
        if user is not None and not isinstance(user, str):
            raise AdminCommandError(f"user {user!r} is not a user name")
        timeout = wait_timeout(args.get("timeout"))

        async def check() -> tuple[bool, int]:
            top = int(await daemon.gate.run(partial(inbox_top, core.conn, user)))
            return top > after, top

        return dict(await waiters.wait(check, timeout=timeout, pool="admin"))

    return wait_inbox


# ---------------------------------------------------------------- platform


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
        (semq.node.engine.STORED_OPERATOR_TABLE); the others are ``skipped``."""
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

