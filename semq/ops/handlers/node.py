"""The admin console's commands for a running node (semq.ops.handlers)."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Any, NamedTuple

from semq.identity.security import WAITING_CODES, waiting_reason
from semq.node.engine import AckStatus, OperatorAction, SendState
from semq.node.origin.outbox import OutboxFilter
from semq.tracking.events import now_ms

from ..admin import AdminCommandError, DrainControl, Handler, until_hangup
from ..partners import daemon_view, partner_handlers, presence_of
from ..why import Doc, why
from ._common import (
    _NODE_PLACE,
    _OPEN,
    _SS_INIT,
    _WAITING_PLACE,
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

__all__ = ["node_busy", "node_handlers"]


def node_busy(daemon: Any) -> int:
    """What a draining node waits for: DATA sent but not acked by the platform."""
    return int(daemon.in_flight)


class OutboxAdminRow(NamedTuple):
    """A pending-send row as the admin console shows it (no contents)."""

    id: int
    target_type: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    domain: str
    data_type: str
    subtype: str
    key: str
    created_ms: int
    expires_ms: int | None
    attempts: int
    inquiries: int
    sent_ms: int | None
    state_ms: int | None
    last_inquiry_ms: int | None
    code: int
    encrypt: int
    size: int

class InboundAdminRow(NamedTuple):
    """A pending-ack row (seed tb_0030) as the admin console shows it."""

    id: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    lk1_record_id: int
    platform_id: str
    p_ack: int
    s_ack: int
    received_ms: int
    last_inquiry_ms: int
    inquiries: int


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


def _filter(args: dict[str, Any], *, after: int = 0, selecting: bool = False) -> OutboxFilter:
    """The pending-send rows a command names: its ``ids``, ``state``,
    ``target`` and ``older_than`` filters (with ``selecting``: requeue,
    resend and purge, which name ids or filters, or ``all: true`` — an
    operator's typo must not purge a store)."""
    ids = _ids(args)  # (list: those rows only)
    states = _states(args, SendState)
    target = args.get("target") or None
    older = _seconds(args, "older_than")
    if selecting and not (ids or states or target or older is not None) and not args.get("all"):
        raise AdminCommandError("name record ids, or filters (state, target, older_than), or all=true")
    return OutboxFilter(after_id=after, ids=ids, states=states, target=str(target) if target else None,
                        created_before=None if older is None else now_ms() - int(older * 1000))


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
    """A semq.node.receiver.channels.ChannelWait as the console shows it."""
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
    NodeCore (its tables' owners asked on the store thread only, ``me``, ``path``,
    ``log``); ``metrics`` an optional semq.ops.metrics.Metrics; ``waiters``
    a semq.ops.waiters.InboxWaiters (then ``wait_inbox`` is served)."""
    org = core.me.node_id
    store = f"{org}/{core.unit}/1"  # this unit's store, as its LK0s name it (semq.umxt_protocol.units)
    handlers = _common("node", org, drain, reload)

    def _snapshot() -> dict[str, Any]:
        counts = core.counts()
        queues = [{"target": target, "state": _send_state(state), "count": n, "oldest_ms": oldest}
                  for target, state, n, oldest in core.outbox.depth()]
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
                return [_inbound_row(r) for r in core.pending_acks.rows(
                    InboundAdminRow, after_id=after, limit=limit,
                    received_before=None if older is None else now_ms() - int(older * 1000),
                    origin=str(args["origin"]) if args.get("origin") else None)]
            rows = await daemon.gate.run(q_in)
            return {"table": "inbound", "count": len(rows), "rows": rows}
        if table != "outbox":
            raise AdminCommandError(f"table {table!r} is not outbox or inbound")
        where = _filter(args, after=after)

        def q() -> list[dict[str, Any]]:
            return [_node_row(r, store) for r in core.outbox.rows(OutboxAdminRow, where, limit=limit)]

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
            if table == "inbound":
                got = core.pending_acks.rows(InboundAdminRow, after_id=rid - 1, limit=1)
                return _inbound_row(got[0]) if got and got[0].id == rid else None
            found = core.outbox.rows(OutboxAdminRow, OutboxFilter(ids=(rid,)))
            if not found:
                return None
            row = _node_row(found[0], store)
            receipt = core.receipts.verified(rid)
            if receipt is None:
                row["receipt"] = None
            else:
                verified, received_ms = receipt
                row["receipt"] = {"verified": verified, "received_ms": received_ms}
            return row

        row = await daemon.gate.run(q)
        if row is None:
            raise AdminCommandError(f"no {table} record {rid} (confirmed records are cleaned up)")
        if table != "inbound":
            # Where it is and why it waits (semq.ops.why), with what the
            # platform says of its target now when that is what it waits for.
            if row["state"] in ("SS_ACK", "SS_ACK_FWD") and hasattr(daemon, "presence"):
                await daemon.presence.ask([row["target"]], daemon.ask_presence, timeout=1.0)
            row["why"] = why(Doc.of_row(row), presence_of(daemon, row["target"]), daemon_view(daemon))
        return row

    async def stuck(args: dict[str, Any]) -> dict[str, Any]:
        older = _seconds(args, "older_than", stuck_after)
        assert older is not None
        limit = _limit(args)

        def q() -> dict[str, Any]:
            cutoff = now_ms() - int(older * 1000)
            stuck = OutboxFilter(reliable=True, states=_OPEN, created_before=cutoff)
            by_place: dict[str, int] = {}
            for s, code, n in core.outbox.open_counts(stuck):
                place = _WAITING_PLACE if s == _SS_INIT and code in WAITING_CODES else _NODE_PLACE[SendState(s)]
                by_place[place] = by_place.get(place, 0) + n
            rows = []
            for r in core.outbox.rows(OutboxAdminRow, stuck, limit=limit, order="created"):
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
            n_in = core.pending_acks.count(received_before=cutoff)
            n_in_all = core.pending_acks.count()
            if n_in:
                by_place["received_confirmation_missing"] = n_in
            for a in core.pending_acks.rows(InboundAdminRow, received_before=cutoff, limit=max(0, limit - len(rows)),
                                            order="received"):
                row = _inbound_row(a)
                row["place"] = "received_confirmation_missing"
                row["age_s"] = round((now_ms() - a.received_ms) / 1000, 1)
                rows.append(row)
            # Ordered channels that hold documents back (received, acknowledged,
            # not yet handed over), whatever their age: each waits for the
            # document its earliest held one follows.
            channels = [_channel_wait(w) for w in core.waiting_channels()]
            # What the age filter hides: documents not confirmed yet, younger
            # than older_than (``semq admin stuck`` says so, and how to see them).
            younger = (core.outbox.count(OutboxFilter(reliable=True, states=_OPEN))
                       - core.outbox.count(stuck) + n_in_all - n_in)
            return {"older_than_s": older, "count": sum(by_place.values()), "by_place": by_place,
                    "rows": rows, "channels": channels, "younger": max(0, younger)}

        res: dict[str, Any] = await daemon.gate.run(q)
        res["connected"] = bool(daemon.connected)
        return res

    async def run_apply(args: dict[str, Any], action: OperatorAction) -> dict[str, Any]:
        """Apply ``action`` to the selected rows whose state allows it
        (semq.node.engine.OPERATOR_TABLE decides which and to what); the
        others are reported ``skipped``."""
        verb = action.value
        where = _filter(args, selecting=True)
        dry = bool(args.get("dry_run"))

        def work() -> dict[str, Any]:
            ts = now_ms()
            # The pending-send table's owner reads the rows' real states and
            # OPERATOR_TABLE says which it applies to, in one transaction.
            found, more, applied = core.operate(action, where, OutboxAdminRow, limit=MAX_SELECT, dry_run=dry)
            rows = [_node_row(r, store) for r in found]
            ok = [r for r in rows if r["id"] in set(applied)]
            if not dry and ok:
                if action is OperatorAction.PURGE:
                    # A live row given up is a failure ("dead"); a failed row
                    # (a dead letter already) is only cleaned up (semq.node.features.dead).
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
                     "resend": resend, "purge": purge, **partner_handlers(daemon, core)})
    if waiters is not None:
        handlers["wait_inbox"] = _wait_inbox(daemon, core, waiters)
    return handlers


def _wait_inbox(daemon: Any, core: Any, waiters: Any) -> Handler:
    from ..waiters import wait_timeout

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
            top = int(await daemon.gate.run(partial(core.inbox.top, user)))
            return top > after, top

        return dict(await waiters.wait(check, timeout=timeout, pool="admin"))

    return wait_inbox


# ---------------------------------------------------------------- platform


