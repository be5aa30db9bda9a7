"""Dead letters: documents of ours that will not be delivered as they are.

They are the pending-send rows in SS_FAILED (no separate table: the row,
its LK0 and its result code are already there, and moving rows would be
one more thing that can half-happen). The code says why (SPEC result
codes): expired (303) at the origin before it was sent; unknown target
(300) or dropped (301, SaveFwd 1 and the target offline) by the platform;
signature refused / not decryptable (500 / 501) by the receiver; too many
attempts (304, ``sweep``). Receivers and the platform never deliver an
expired copy either, so an expired document is never delivered anywhere.

``requeue`` puts a row back to SS_INIT (code 0, attempts 0): it is sent
again under the **same LK0**, so a receiver that did get it earlier
suppresses the duplicate (SPEC B.4). An expired row needs a new expiry (or
none). ``purge`` deletes. Failed rows are also removed by the node's
housekeeping after 7 days (core.FAILED_RETENTION_MS). This is seed 001's
"cleanup of messages that can never be processed".

Which rows each of these takes and the state it leaves them in is
semq.node.engine.OPERATOR_TABLE's to say (REQUEUE, PURGE_DEAD, and
DEAD_LETTER for ``sweep`` and ``fail_target``); the rows are read and
written by the pending-send table's owner (semq.node.origin.outbox), asked
with the states the table names.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from semq.tracking.events import now_ms
from semq.umxt_protocol import LK0, AppKey, ResultCode

from ..engine import (
    OperatorAction,
    SendState,
    TransitionRefused,
    operator_states,
    operator_step,
)
from ..origin.outbox import OutboxFilter
from ._access import core_of, log_events

if TYPE_CHECKING:
    from ..api import NodeClient
    from ..core import NodeCore

__all__ = ["REASONS", "DeadLetter", "DeadLetterError", "DeadLetters", "RequeueResult", "fail_target",
           "reason", "sweep"]

_FAILED: Final = int(SendState.SS_FAILED)  # a dead letter's state: what ``list`` shows


# Which rows each action takes, and the state it leaves them in, come from
# semq.node.engine.OPERATOR_TABLE; the owner is asked with them.
_DYING: Final = operator_states(OperatorAction.DEAD_LETTER)  # SS_INIT: waiting to be sent
_WAITING: Final = int(SendState.SS_INIT)

#: Result code -> the reason a person reads in ``semq dead``.
REASONS: Final[dict[int, str]] = {
    int(ResultCode.EXPIRED): "expired",
    int(ResultCode.UNKNOWN_TARGET): "unknown target",
    int(ResultCode.TARGET_OFFLINE_DROPPED): "dropped: target offline (SaveFwd 1)",
    int(ResultCode.TOO_MANY_ATTEMPTS): "too many attempts",
    int(ResultCode.BAD_SIGNATURE): "signature refused by the receiver",
    int(ResultCode.DECRYPT_FAILED): "receiver could not decrypt it",
    int(ResultCode.UNKNOWN_CERTIFICATE): "no certificate for the target",
    int(ResultCode.REJECTED_BY_APPLICATION): "rejected by the receiving application",
}


def reason(code: int) -> str:
    """The reason for a result code, in words."""
    if code in REASONS:
        return REASONS[code]
    try:
        return ResultCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"result code {code}"


class DeadLetterRow(NamedTuple):
    """A pending-send row as the dead letters read it (``state_ms`` is when
    it failed)."""

    id: int
    target_id: str
    code: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    priority: int
    attempts: int
    created_ms: int
    state_ms: int
    expires_ms: int | None
    size: int
    state: int


class _Waiting(NamedTuple):
    """A row the dead-letter rules look at."""

    id: int
    target_id: str
    attempts: int


class DeadLetterError(ValueError):
    """A user's mistake (not a dead letter, expired without a new expiry)."""


@dataclass(frozen=True)
class DeadLetter:
    lk0: LK0
    target: str
    code: int
    reason: str
    app_key: AppKey
    save_fwd: int
    priority: int
    attempts: int
    created_ms: int
    failed_ms: int
    expires_ms: int | None
    size: int


@dataclass
class RequeueResult:
    requeued: list[LK0] = field(default_factory=list)
    skipped_expired: list[LK0] = field(default_factory=list)  # --all without a new expiry




class DeadLetters:
    """The dead-letter list of one node (its SS_FAILED pending-send rows).
    A node of several units (semq.umxt_protocol.units) has one per unit's store: listed
    together, and each document requeued or purged in its unit's store
    (one transaction per unit)."""

    def __init__(self, node: NodeClient | NodeCore) -> None:
        self.core = core_of(node)
        cores = getattr(node, "cores", None)
        self._units = [DeadLetters(c) for c in cores] if cores and len(cores) > 1 else None

    def _by_unit(self, refs: Iterable[int | str | LK0]) -> dict[int, builtins.list[int | str | LK0]]:
        """Refs of a node of several units, by the unit whose store has each:
        an LK0's ``semq_id``; a bare record id, the unit that holds it."""
        assert self._units is not None
        out: dict[int, builtins.list[int | str | LK0]] = {}
        for ref in refs:
            r: int | LK0 = (int(ref) if ref.isdigit() else LK0.parse(ref)) if isinstance(ref, str) else ref
            if isinstance(r, LK0):
                unit = r.semq_id
            else:
                unit = next((u.core.unit for u in self._units if u.core.outbox.target_of(r) is not None), 1)
            if not 1 <= unit <= len(self._units):
                raise DeadLetterError(f"{ref} names unit {unit}; this node has units 1..{len(self._units)}")
            out.setdefault(unit, []).append(r)
        return out

    def _letter(self, r: DeadLetterRow) -> DeadLetter:
        return DeadLetter(lk0=self.core.ctx.lk0(r.id), target=r.target_id, code=r.code,
                          reason=reason(r.code),
                          app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
                          save_fwd=r.save_fwd, priority=r.priority, attempts=r.attempts, created_ms=r.created_ms,
                          failed_ms=r.state_ms, expires_ms=r.expires_ms, size=r.size)

    def list(self, *, limit: int = 1000) -> list[DeadLetter]:
        if self._units is not None:
            letters = [d for u in self._units for d in u.list(limit=limit)]
            letters.sort(key=lambda d: (d.failed_ms, d.lk0.semq_id, d.lk0.record_id))
            return letters[:limit]
        rows = self.core.outbox.rows(DeadLetterRow, OutboxFilter(states=(_FAILED,)), limit=limit)
        return [self._letter(r) for r in rows]

    def record_id(self, ref: int | str | LK0) -> int:
        """A record id from an id, ``NODE/1/1/ID`` text or an LK0 of ours."""
        if isinstance(ref, str):
            ref = int(ref) if ref.isdigit() else LK0.parse(ref)
        if isinstance(ref, LK0):
            if ref.endpoint != self.core.me:
                raise DeadLetterError(f"{ref} is not a document of this node ({self.core.me.node_id})")
            return ref.record_id
        return int(ref)

    def _select(self, refs: Iterable[int | str | LK0] | None, action: OperatorAction) -> builtins.list[DeadLetter]:
        """The rows ``action`` takes: every one it applies to (``refs`` None),
        or these, each of which must be one (DeadLetterError otherwise)."""
        outbox = self.core.outbox
        if refs is None:
            return [self._letter(r) for r in outbox.rows(DeadLetterRow, OutboxFilter(states=operator_states(action)))]
        out = []
        for ref in refs:
            rid = self.record_id(ref)
            got = outbox.rows(DeadLetterRow, OutboxFilter(ids=(rid,)))
            lk0 = self.core.ctx.lk0(rid)
            if not got:
                raise DeadLetterError(f"no document {lk0} in the pending-send table (delivered and cleaned"
                                      " up, or purged)")
            r = got[0]
            try:
                operator_step(SendState(r.state), action, record=rid)
            except TransitionRefused as e:
                raise DeadLetterError(f"{lk0} is not a dead letter: it is {e.state}") from None
            except ValueError:  # a state this module does not know (a newer schema)
                raise DeadLetterError(f"{lk0} is not a dead letter: it is in state {r.state}") from None
            out.append(self._letter(r))
        return out

    def requeue(self, refs: Iterable[int | str | LK0] | None = None, *, expires_in: float | None = None,
                no_expiry: bool = False) -> RequeueResult:
        """Send these dead letters again (``refs=None``: all). An expired one
        needs ``expires_in`` (a new expiry from now) or ``no_expiry``:
        asked by id, it raises DeadLetterError; with all, it is skipped and
        reported. All or nothing: one transaction."""
        if expires_in is not None and not (math.isfinite(expires_in) and expires_in > 0):
            raise DeadLetterError(f"expires_in {expires_in!r} is not a positive number of seconds")
        if self._units is not None:
            result = RequeueResult()
            parts = ({u.core.unit: None for u in self._units} if refs is None
                     else self._by_unit(refs))
            for unit, unit_refs in parts.items():
                got = self._units[unit - 1].requeue(unit_refs, expires_in=expires_in, no_expiry=no_expiry)
                result.requeued += got.requeued
                result.skipped_expired += got.skipped_expired
            return result
        result = RequeueResult()
        ts = now_ms()
        with self.core.transaction():
            letters = self._select(refs, OperatorAction.REQUEUE)
            updates: dict[int, int | None] = {}
            events = []
            for d in letters:
                expiry = d.expires_ms
                if expires_in is not None:
                    expiry = ts + int(expires_in * 1000)
                elif no_expiry:
                    expiry = None
                elif expiry is not None and expiry <= ts:
                    if refs is not None:
                        raise DeadLetterError(
                            f"{d.lk0} expired; requeue it with a new expiry (--expires-in SECONDS) or --no-expiry")
                    result.skipped_expired.append(d.lk0)
                    continue
                updates[d.lk0.record_id] = expiry
                result.requeued.append(d.lk0)
                events.append(self._event(d, "resend", ts, detail=f"requeued from the dead letters ({d.reason})"))
            self.core.operator.apply(OperatorAction.REQUEUE, [(rid, _FAILED) for rid in updates], ts,
                                     expires=updates)
            log_events(self.core, events)
        return result

    def purge(self, refs: Iterable[int | str | LK0] | None = None) -> int:
        """Delete these dead letters (``refs=None``: all). Returns how many."""
        if self._units is not None:
            parts = ({u.core.unit: None for u in self._units} if refs is None
                     else self._by_unit(refs))
            return sum(self._units[unit - 1].purge(unit_refs) for unit, unit_refs in parts.items())
        ts = now_ms()
        with self.core.transaction():
            letters = self._select(refs, OperatorAction.PURGE_DEAD)
            self.core.operator.apply(OperatorAction.PURGE_DEAD, [(d.lk0.record_id, _FAILED) for d in letters], ts)
            log_events(self.core, [self._event(d, "cleaned", ts, detail="purged from the dead letters")
                                   for d in letters])
        return len(letters)

    def _event(self, d: DeadLetter, event: str, ts: int, **extra: Any) -> dict[str, Any]:
        return {"ts": ts, "role": "origin", "event": event, "lk0": str(d.lk0), "source": self.core.me.node_id,
                "target": d.target, "attempt": d.attempts, **extra}


def sweep(node: NodeClient | NodeCore, max_attempts: int) -> int:
    """The max-attempts rule: documents waiting to be sent again (SS_INIT)
    after ``max_attempts`` or more send attempts become dead letters with
    TOO_MANY_ATTEMPTS (304). Only SS_INIT rows: a row in flight keeps its
    window credit and its answer. ``max_attempts`` 0 does nothing. Safe
    to call from any process or the daemon's store gate; returns the count."""
    if max_attempts <= 0:
        return 0
    core = core_of(node)
    ts = now_ms()
    code = int(ResultCode.TOO_MANY_ATTEMPTS)
    with core.transaction():
        # (The owner's real states: the daemon's claimed rows are in flight, not SS_INIT.)
        rows = core.outbox.rows(_Waiting, OutboxFilter(states=_DYING, min_attempts=max_attempts))
        core.operator.apply(OperatorAction.DEAD_LETTER, [(rid, _WAITING) for rid, _t, _a in rows], ts, code=code)
        log_events(core, [{"ts": ts, "role": "origin", "event": "dead", "lk0": core.ctx.lk0_text(rid),
                           "source": core.me.node_id, "target": target, "attempt": attempts, "code": code,
                           "detail": f"{attempts} attempts (limit {max_attempts})"}
                          for rid, target, attempts in rows])
    return len(rows)


def fail_target(node: NodeClient | NodeCore, target: str, code: int = int(ResultCode.UNKNOWN_TARGET),
                detail: str = "") -> int:
    """Make every unsent (SS_INIT) document for ``target`` a dead letter with
    ``code``. For the daemon when the platform says the target does not
    exist (with security on such documents cannot even be sealed, so the
    platform's UNKNOWN_TARGET NACK never comes). Returns the count."""
    core = core_of(node)
    ts = now_ms()
    with core.transaction():
        # (The owner's real states: the daemon's claimed rows are in flight, not SS_INIT.)
        rows = core.outbox.rows(_Waiting, OutboxFilter(states=_DYING, target=target))
        core.operator.apply(OperatorAction.DEAD_LETTER, [(rid, _WAITING) for rid, _t, _a in rows], ts, code=code)
        log_events(core, [{"ts": ts, "role": "origin", "event": "dead", "lk0": core.ctx.lk0_text(rid),
                           "source": core.me.node_id, "target": target, "attempt": attempts, "code": code,
                           "detail": detail or reason(code)} for rid, _t, attempts in rows])
    return len(rows)
