"""What the node's and the platform's admin commands share: argument
checks, row selection, results (semq.ops.handlers)."""


from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, Final

from semq.node.engine import (
    ActionTable,
    OperatorAction,
    SendState,
    TransitionRefused,
)
from semq.platform.engine import StoredState
from semq.tracking.events import now_ms

from ..admin import AdminCommandError, AfterReply, DrainControl, Handler
from ..display import MAX_LIMIT  # rows in one list/stuck answer (the CLI checks --limit against it)

__all__ = ["DEFAULT_LIMIT", "DEFAULT_STUCK_AFTER", "MAX_LIMIT", "MAX_SELECT", "ReloadCallback", "store_bytes"]

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


# ---------------------------------------------------------------- rows by name


def _select(row: type[tuple[Any, ...]], exprs: dict[str, str]) -> str:
    """The SELECT list of a named row whose fields are not all columns of
    the same name: ``exprs`` gives those fields' expressions (an aggregate,
    a computed value), each named by its field."""
    fields = row._fields  # type: ignore[attr-defined]
    unknown = set(exprs) - set(fields)
    if unknown:
        raise ValueError(f"{row.__name__} has no field {sorted(unknown)}")
    return ", ".join(f"{exprs[f]} AS {f}" if f in exprs else f for f in fields)
