"""Transactional messages (seed 002, RocketMQ's "half messages").

A producer whose document must go out **if and only if** its own local
transaction commits (an order is sent only when the order row is saved):

1. ``send`` stores a *half message* in ``tx_half`` (state HALF). It is never
   sent: the node daemon only sends rows of the pending-send table.
2. The producer runs its local transaction, then ``commit`` or ``rollback``.
   ``commit`` inserts the document into the pending-send table through
   ``NodeCore.accept`` (same validation, same row as ``semq send``) **inside
   the same SQLite transaction** that marks the half message COMMITTED.
3. No answer in time (the producer crashed between its local commit and
   ours)? The node asks back: a check-back command (``capabilities.toml``)
   or a Python callable answers commit / rollback / unknown. First after
   ``first_check`` (6 s), then every ``check_interval`` (60 s), at most
   ``max_checks`` (15) times; then the message is NEEDS_ATTENTION and waits
   for a person (``semq tx list`` shows it; commit / rollback still work).

Guarantees (every decision is one BEGIN IMMEDIATE transaction that first
reads the state; SQLite serializes them across processes):

- never delivered before commit: nothing outside the outbox is ever sent,
  and the outbox row exists only in the transaction that commits;
- never both delivered and rolled back: COMMITTED and ROLLED_BACK are
  final and exclude each other; a crash anywhere leaves either the
  committed pair (outbox row + COMMITTED) or neither (still HALF);
- commit and rollback are idempotent (a retry after a lost answer is safe).

The check-back runs outside any transaction (it may take seconds); its
answer is applied with the same commit / rollback, so a person deciding at
the same moment wins or loses cleanly, never both.

The half message's states and what moves them are semq.node.engine's
TxState and TX_TABLE (re-exported here); the SQL is built from the table.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, TypeVar

from semq.tracking.events import now_ms
from semq.umxt_protocol import LK0, AppKey, Data, Endpoint, Frame, Kind, ProtocolError, SaveFwd

from ..core import NewDocument, NodeCore
from ..engine import TransitionRefused, TxAction, TxState, sql_in, tx_result, tx_states, tx_step
from ..limits import check_document_size
from ..rows import columns
from ._access import core_of, node_dir, write_tx
from .capabilities import CAPABILITIES_NAME, TxSettings, load_capabilities

if TYPE_CHECKING:
    from ..api import NodeClient

__all__ = [
    "CheckReport",
    "Checkback",
    "Decision",
    "HalfMessage",
    "StoreRunner",
    "Transactions",
    "TxChecker",
    "TxError",
    "TxState",
    "run_command_checkback",
]

log = logging.getLogger("semq.tx")

DECIDED_RETENTION_MS: Final = 7 * 24 * 3600 * 1000  # committed / rolled back rows kept for a week
CHECK_BATCH: Final = 100  # half messages asked per round


# TxState (the half message's states) and what moves them (TX_TABLE) live in
# semq.node.engine with the node's other state tables; the SQL here is built
# from the table: the states an action takes rows from, the state it leaves.
_HALF: Final = int(TxState.HALF)  # undecided: what the check-backs ask about


def _from(action: TxAction) -> str:
    return f"IN ({sql_in(tx_states(action))})"


def _to(action: TxAction) -> int:
    nxt = tx_result(action)
    assert nxt is not None, f"{action.value} deletes rows"
    return int(nxt)


class HalfMessageRow(NamedTuple):
    """A half message (``tx_half``, seed 002) as the transactions read it."""

    id: int
    state: int
    target_id: str
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    expires_ms: int | None
    encrypt: int
    app_data: bytes
    created_ms: int
    state_ms: int
    checks: int
    next_check_ms: int | None
    outbox_id: int | None  # the pending-send row once committed
    decided_by: str
    note: str


class Decision(Enum):
    """What a check-back answers."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # ask again later


class TxError(ValueError):
    """A transaction that does not exist or is in a state that forbids the
    request (committing a rolled-back one). A user's mistake: CLI exit 2."""


@dataclass(frozen=True)
class HalfMessage:
    id: int
    state: TxState
    target: str
    app_key: AppKey
    save_fwd: int
    ack2: bool
    reliable: bool
    priority: int
    expires_ms: int | None
    encrypt: bool
    app_data: bytes
    created_ms: int
    state_ms: int
    checks: int
    next_check_ms: int | None
    lk0: LK0 | None  # once committed
    decided_by: str
    note: str


#: A Python check-back: gets the half message, answers Decision, "commit",
#: "rollback", True (commit), False (rollback) or None (unknown).
Checkback = Callable[[HalfMessage], "Decision | str | bool | None"]

T = TypeVar("T")

_COLS: Final = columns(HalfMessageRow)


class Transactions:
    """Half messages of one node. Works with or without the node daemon
    running; ``commit`` makes the document durable in the pending-send
    table, the daemon sends it. One caller at a time per instance."""

    def __init__(self, node: NodeClient | NodeCore, *, settings: TxSettings | None = None,
                 security: bool | None = None) -> None:
        self.core = core_of(node)
        self.directory = node_dir(node)
        if security is None:
            cfg = getattr(node, "config", None)
            security = bool(cfg.security) if cfg is not None else self.core.sec is not None
        self.security = security
        self._settings = settings

    @property
    def settings(self) -> TxSettings:
        return self._settings or load_capabilities(self.directory).tx

    # ------------------------------------------------------------ producer

    def send(
        self, to: str, data: bytes, *, data_type: str = "", domain: str = "", subtype: str = "",
        key: str = "", save_fwd: int = 3, ack2: bool = True, priority: int = 0,
        expires_in: float | None = None, reliable: bool = True, encrypt: bool = True,
    ) -> HalfMessage:
        """Store a half message (not sent). Fields are checked now exactly as
        ``NodeClient.send`` checks them (LocalProtocolError); ``expires_in``
        counts from now, not from the commit. Durable when this returns."""
        ts = now_ms()
        if expires_in is not None and not (math.isfinite(expires_in) and expires_in > 0):
            raise TxError(f"expires_in {expires_in!r} is not a positive number of seconds")
        doc = NewDocument(
            target=to, app_data=bytes(data),
            app_key=AppKey(domain=domain, data_type=data_type, subtype=subtype, key=key),
            save_fwd=SaveFwd(save_fwd if reliable else 1), ack2=bool(ack2) and reliable, reliable=reliable,
            priority=priority, expires_ms=ts + int(expires_in * 1000) if expires_in else None,
            encrypt=self.security and bool(encrypt),
        )
        self._validate(doc, ts)
        first = ts + int(self.settings.first_check * 1000)
        with write_tx(self.core) as conn:
            cur = conn.execute(
                "INSERT INTO tx_half (state, target_id, save_fwd, ack2, reliable, priority, domain, data_type,"
                " subtype, key, expires_ms, encrypt, app_data, created_ms, state_ms, next_check_ms)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (_HALF, doc.target, int(doc.save_fwd), int(doc.ack2), int(doc.reliable), doc.priority,
                 doc.app_key.domain, doc.app_key.data_type, doc.app_key.subtype, doc.app_key.key,
                 doc.expires_ms, int(doc.encrypt), doc.app_data, ts, ts, first),
            )
            tx_id = int(cur.lastrowid or 0)
        return self.get(tx_id)

    def _validate(self, doc: NewDocument, ts: int) -> None:
        # The checks NodeCore.accept makes (it makes them again at commit).
        check_document_size(len(doc.app_data))
        target = Endpoint.org(doc.target)
        lk0 = self.core.ctx.lk0(1)
        Data(lk0=lk0, app_data=doc.app_data, app_key=doc.app_key, created_ms=ts, expires_ms=doc.expires_ms)
        Frame(kind=Kind.DATA, source=self.core.me, target=target, reliable=doc.reliable, save_fwd=doc.save_fwd,
              ack2=doc.ack2, priority=doc.priority, body=Data(lk0=lk0))

    def commit(self, tx_id: int, *, by: str = "api") -> LK0:
        """Move the half message into the pending-send table, in one
        transaction with marking it COMMITTED; returns its LK0. Committing a
        committed one returns the same LK0. Raises TxError (unknown id,
        rolled back), LocalProtocolError, StoreError."""
        with write_tx(self.core) as conn:
            m = self._get(conn, tx_id)
            if m.state is tx_result(TxAction.COMMIT):  # idempotent: the same LK0 again
                assert m.lk0 is not None
                return m.lk0
            try:
                tx_step(m.state, TxAction.COMMIT, tx_id=tx_id)
            except TransitionRefused as e:
                if m.state is TxState.ROLLED_BACK:
                    raise TxError(f"transaction {tx_id} was rolled back ({m.decided_by}"
                                  f"{': ' + m.note if m.note else ''}); it cannot be committed") from None
                raise TxError(str(e)) from None
            [lk0] = self.core.accept([NewDocument(
                target=m.target, app_data=m.app_data, app_key=m.app_key, save_fwd=SaveFwd(m.save_fwd),
                ack2=m.ack2, reliable=m.reliable, priority=m.priority, expires_ms=m.expires_ms,
                encrypt=m.encrypt,
            )])
            _crash_point("after-accept")
            conn.execute(
                f"UPDATE tx_half SET state={_to(TxAction.COMMIT)}, outbox_id=?, state_ms=?, next_check_ms=NULL,"
                f" decided_by=? WHERE id=? AND state {_from(TxAction.COMMIT)}",
                (lk0.record_id, now_ms(), by, tx_id),
            )
        return lk0

    def rollback(self, tx_id: int, *, by: str = "api", note: str = "") -> HalfMessage:
        """Mark the half message ROLLED_BACK: it is never sent. Rolling back a
        rolled-back one is a no-op. Raises TxError (unknown id, committed)."""
        with write_tx(self.core) as conn:
            m = self._get(conn, tx_id)
            if m.state is not tx_result(TxAction.ROLLBACK):  # else idempotent: nothing to do
                try:
                    tx_step(m.state, TxAction.ROLLBACK, tx_id=tx_id)
                except TransitionRefused as e:
                    if m.state is TxState.COMMITTED:
                        raise TxError(f"transaction {tx_id} was committed as {m.lk0} ({m.decided_by});"
                                      " it cannot be rolled back") from None
                    raise TxError(str(e)) from None
                conn.execute(
                    f"UPDATE tx_half SET state={_to(TxAction.ROLLBACK)}, state_ms=?, next_check_ms=NULL,"
                    f" decided_by=?, note=? WHERE id=? AND state {_from(TxAction.ROLLBACK)}",
                    (now_ms(), by, note or m.note, tx_id),
                )
        return self.get(tx_id)

    def run(self, to: str, data: bytes, local: Callable[[HalfMessage], T], **options: Any) -> T:
        """The whole pattern in one call: store the half message, run
        ``local`` (the application's own transaction), commit if it returns,
        roll back if it raises (and re-raise). If this process dies in
        between, the check-back decides."""
        half = self.send(to, data, **options)
        try:
            result = local(half)
        except BaseException:
            self.rollback(half.id, note="the local transaction raised")
            raise
        self.commit(half.id)
        return result

    # ------------------------------------------------------------ reading

    def get(self, tx_id: int) -> HalfMessage:
        """Raises TxError if there is no such transaction."""
        return self._get(self.core.conn, tx_id)

    def _get(self, conn: Any, tx_id: int) -> HalfMessage:
        row = conn.execute(f"SELECT {_COLS} FROM tx_half WHERE id=?", (int(tx_id),)).fetchone()
        if row is None:
            raise TxError(f"no transaction {tx_id} (see 'semq tx list --all')")
        return self._msg(HalfMessageRow._make(row))

    def _msg(self, r: HalfMessageRow) -> HalfMessage:
        return HalfMessage(
            id=r.id, state=TxState(r.state), target=r.target_id,
            app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
            save_fwd=r.save_fwd, ack2=bool(r.ack2), reliable=bool(r.reliable), priority=r.priority,
            expires_ms=r.expires_ms, encrypt=bool(r.encrypt), app_data=r.app_data, created_ms=r.created_ms,
            state_ms=r.state_ms, checks=r.checks, next_check_ms=r.next_check_ms,
            lk0=self.core.ctx.lk0(r.outbox_id) if r.outbox_id else None,
            decided_by=r.decided_by, note=r.note,
        )

    def list(self, *, states: Iterable[TxState] | None = (TxState.HALF, TxState.NEEDS_ATTENTION),
             limit: int = 1000) -> list[HalfMessage]:
        """Half messages by id; default the undecided ones. ``states=None``: all."""
        args: tuple[int, ...]
        if states is None:
            q, args = f"SELECT {_COLS} FROM tx_half ORDER BY id LIMIT ?", (limit,)
        else:
            st = [int(s) for s in states]
            q = f"SELECT {_COLS} FROM tx_half WHERE state IN ({','.join('?' * len(st))}) ORDER BY id LIMIT ?"
            args = (*st, limit)
        return [self._msg(r) for r in map(HalfMessageRow._make, self.core.conn.execute(q, args))]

    def purge(self, older_than_ms: int = DECIDED_RETENTION_MS) -> int:
        """Delete committed / rolled-back rows decided more than
        ``older_than_ms`` ago (the document itself lives on in the outbox)."""
        with write_tx(self.core) as conn:
            return int(conn.execute(f"DELETE FROM tx_half WHERE state {_from(TxAction.PURGE)} AND state_ms < ?",
                                    (now_ms() - older_than_ms,)).rowcount)


# ---------------------------------------------------------------- check-back


@dataclass
class CheckReport:
    """What one round of check-backs did (ids of half messages)."""

    asked: int = 0
    committed: list[tuple[int, LK0]] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    flagged: list[int] = field(default_factory=list)  # now NEEDS_ATTENTION
    skipped: list[int] = field(default_factory=list)  # decided by someone else meanwhile
    errors: list[tuple[int, str]] = field(default_factory=list)

    def merge(self, other: CheckReport) -> None:
        self.asked += other.asked
        for name in ("committed", "rolled_back", "unknown", "flagged", "skipped", "errors"):
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> str:
        return (f"asked {self.asked}: committed {len(self.committed)}, rolled back {len(self.rolled_back)},"
                f" unknown {len(self.unknown)}, flagged for a person {len(self.flagged)}"
                + (f", decided meanwhile {len(self.skipped)}" if self.skipped else "")
                + (f", errors {len(self.errors)}" if self.errors else ""))


def _decision(answer: Decision | str | bool | None) -> Decision:
    if isinstance(answer, Decision):
        return answer
    if answer is True:
        return Decision.COMMIT
    if answer is False:
        return Decision.ROLLBACK
    if isinstance(answer, str) and answer.strip().lower() in ("commit", "rollback"):
        return Decision(answer.strip().lower())
    return Decision.UNKNOWN


def run_command_checkback(command: str, msg: HalfMessage, *, timeout: float, directory: Path) -> tuple[Decision, str]:
    """Run the check-back command (``sh -c``, in the node directory) for one
    half message. It learns which one from the environment: SEMQ_TX_ID,
    SEMQ_TX_TO, SEMQ_TX_DOMAIN, SEMQ_TX_TYPE, SEMQ_TX_SUBTYPE, SEMQ_TX_KEY,
    SEMQ_TX_CHECK (1 = first check-back), SEMQ_TX_CREATED_MS, SEMQ_DIR.
    Exit 0 and first word ``commit`` / ``rollback`` on stdout decide;
    anything else (other words, non-zero exit, timeout) is unknown. Values
    are never put into the command line (no shell injection)."""
    env = {
        **os.environ, "SEMQ_TX_ID": str(msg.id), "SEMQ_TX_TO": msg.target,
        "SEMQ_TX_DOMAIN": msg.app_key.domain, "SEMQ_TX_TYPE": msg.app_key.data_type,
        "SEMQ_TX_SUBTYPE": msg.app_key.subtype, "SEMQ_TX_KEY": msg.app_key.key,
        "SEMQ_TX_CHECK": str(msg.checks), "SEMQ_TX_CREATED_MS": str(msg.created_ms), "SEMQ_DIR": str(directory),
    }
    try:
        # Own process group: a timed-out command's children are stopped too.
        p = subprocess.Popen(command, shell=True, env=env, cwd=directory, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return Decision.UNKNOWN, f"check-back could not start: {e}"
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        return Decision.UNKNOWN, f"check-back did not answer within {timeout:g} s"
    words = out.decode("utf-8", "replace").split()
    word = words[0].lower().rstrip(":,.;!") if words else ""  # "rollback: not found" is a rollback
    if p.returncode == 0 and word in ("commit", "rollback"):
        return Decision(word), f"check-back {msg.checks} answered {word}"
    if p.returncode != 0:
        first = (err.decode("utf-8", "replace").strip().splitlines() or [""])[0][:200]
        return Decision.UNKNOWN, f"check-back {msg.checks} exited {p.returncode}" + (f": {first}" if first else "")
    return Decision.UNKNOWN, f"check-back {msg.checks} answered {word or 'nothing'!r}"


class TxChecker:
    """The check-back scheduler: pure rules over the store, no I/O of its
    own besides asking. ``run_due`` is what a daemon task, ``semq tx check``
    or a cron job calls. Settings come from ``capabilities.toml`` (re-read
    when it changes) unless given; a Python ``checkback`` replaces the
    configured command. Without either, each due check counts as unknown,
    so an undecided message reaches NEEDS_ATTENTION on the same schedule."""

    def __init__(self, node: NodeClient | NodeCore, *, settings: TxSettings | None = None,
                 checkback: Checkback | None = None, batch: int = CHECK_BATCH) -> None:
        self.txs = Transactions(node)
        self.directory = self.txs.directory
        self._fixed = settings
        self._loaded: tuple[float, TxSettings] | None = None
        self.checkback = checkback
        self.batch = batch

    @property
    def settings(self) -> TxSettings:
        if self._fixed is not None:
            return self._fixed
        path = self.directory / CAPABILITIES_NAME
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            mtime = -1.0
        if self._loaded is None or self._loaded[0] != mtime:
            self._loaded = (mtime, load_capabilities(self.directory).tx)
        return self._loaded[1]

    def run_due(self, now_ms: int | None = None) -> CheckReport:
        """Ask about every half message whose check-back is due at
        ``now_ms`` (default: now) and apply the answers."""
        report = CheckReport()
        for msg in self.claim_due(now_ms):
            report.merge(self.check_one(msg))
        return report

    def claim_due(self, now_ms_: int | None = None) -> list[HalfMessage]:
        """Take the due HALF messages: count the check and schedule the next
        one now, before asking (a checker that dies while asking does not
        make the next one ask at once; two checkers never ask about the
        same message in the same round)."""
        ts = now_ms() if now_ms_ is None else now_ms_
        core = self.txs.core
        # Idle rounds only read (no write lock taken every second).
        if core.conn.execute(f"SELECT 1 FROM tx_half WHERE state={_HALF} AND next_check_ms <= ? LIMIT 1",
                             (ts,)).fetchone() is None:
            return []
        interval = int(self.settings.check_interval * 1000)
        with write_tx(core) as conn:
            ids = [i for (i,) in conn.execute(
                f"SELECT id FROM tx_half WHERE state={_HALF} AND next_check_ms <= ? ORDER BY next_check_ms, id"
                " LIMIT ?",
                (ts, self.batch))]
            conn.executemany(f"UPDATE tx_half SET checks=checks+1, next_check_ms=? WHERE id=? AND state={_HALF}",
                             [(ts + interval, i) for i in ids])
            return [self.txs._get(conn, i) for i in ids]

    def ask(self, msg: HalfMessage) -> tuple[Decision, str]:
        if self.checkback is not None:
            try:
                answer = self.checkback(msg)
            except Exception as e:  # the application's code: its failure is an "unknown"
                return Decision.UNKNOWN, f"check-back {msg.checks} raised {type(e).__name__}: {e}"[:300]
            d = _decision(answer)
            return d, f"check-back {msg.checks} answered {d.value}"
        s = self.settings
        if not s.checkback:
            return Decision.UNKNOWN, f"no check-back configured ({CAPABILITIES_NAME} [tx] checkback)"
        return run_command_checkback(s.checkback, msg, timeout=s.checkback_timeout, directory=self.directory)

    def check_one(self, msg: HalfMessage) -> CheckReport:
        """Ask about one claimed message and apply the answer."""
        decision, note = self.ask(msg)
        return self.apply(msg, decision, note)

    def apply(self, msg: HalfMessage, decision: Decision, note: str) -> CheckReport:
        """Apply a check-back's answer (store work only)."""
        report = CheckReport(asked=1)
        try:
            if decision is Decision.COMMIT:
                report.committed.append((msg.id, self.txs.commit(msg.id, by="checkback")))
            elif decision is Decision.ROLLBACK:
                self.txs.rollback(msg.id, by="checkback", note=note)
                report.rolled_back.append(msg.id)
            else:
                self._unknown(msg, note, report)
        except TxError:
            report.skipped.append(msg.id)  # a person or the producer decided meanwhile
        except ProtocolError as e:
            # accept() refused it now (cannot happen for a message validated
            # at send, unless the software changed): retrying cannot help.
            self._flag(msg.id, f"commit refused: {e}")
            report.flagged.append(msg.id)
            report.errors.append((msg.id, str(e)))
        if report.committed or report.rolled_back:
            log.info("transaction %d: %s", msg.id, note)
        return report

    def _unknown(self, msg: HalfMessage, note: str, report: CheckReport) -> None:
        limit = self.settings.max_checks
        if msg.checks >= limit:
            if self._flag(msg.id, f"{note}; {msg.checks} check-backs without an answer: decide with"
                                  f" 'semq tx commit {msg.id}' or 'semq tx rollback {msg.id}'"):
                report.flagged.append(msg.id)
                log.warning("transaction %d needs a person: %s", msg.id, note)
            else:
                report.skipped.append(msg.id)
            return
        with write_tx(self.txs.core) as conn:
            n = conn.execute(f"UPDATE tx_half SET note=? WHERE id=? AND state={_HALF}", (note, msg.id)).rowcount
        (report.unknown if n else report.skipped).append(msg.id)

    def _flag(self, tx_id: int, note: str) -> bool:
        with write_tx(self.txs.core) as conn:
            return bool(conn.execute(
                f"UPDATE tx_half SET state={_to(TxAction.FLAG)}, state_ms=?, next_check_ms=NULL, note=?"
                f" WHERE id=? AND state {_from(TxAction.FLAG)}",
                (now_ms(), note, tx_id)).rowcount)


# ---------------------------------------------------------------- the daemon's task


class StoreRunner(Protocol):
    """Runs store work one call at a time (semq.store.gate.StoreGate: the node
    daemon's gate)."""

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


def open_node(node: NodeClient | NodeCore | str | os.PathLike[str]) -> NodeClient | NodeCore:
    """A directory opens a NodeClient of its own; a NodeClient / NodeCore
    is used as it is."""
    if isinstance(node, str | os.PathLike):
        from ..api import NodeClient

        return NodeClient(Path(node))
    return node


_crash_hooks: dict[str, Callable[[], None]] = {}


def _crash_point(name: str) -> None:
    """Tests simulate a crash here (tests/node/test_transactions.py kills the process)."""
    hook = _crash_hooks.get(name)
    if hook is not None:
        hook()

