"""The tables of what a person or a node feature does to a row (semq.node.engine:
OPERATOR_TABLE, TX_TABLE; semq.platform.engine: STORED_OPERATOR_TABLE), over every (state, action)
pair; and the rule that the modules applying them name states only through
the IntEnums (STYLE: "a state changes only through an engine table; SQL
names states through the IntEnums")."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from semq.node.engine import (
    OPERATOR_TABLE,
    TX_TABLE,
    OperatorAction,
    SendState,
    TransitionRefused,
    TxAction,
    TxState,
    operator_result,
    operator_states,
    operator_step,
    sql_in,
    tx_result,
    tx_states,
    tx_step,
)
from semq.platform.engine import (
    STORED_OPERATOR_TABLE,
    StoredState,
    stored_operator_states,
    stored_operator_step,
)

S, P, T, OA, TA = SendState, StoredState, TxState, OperatorAction, TxAction

# What each action applied to before the tables existed (the SQL of
# semq/ops/handlers.py, semq/node/features/dead.py and semq/node/features/txn.py), written out
# by hand once more: the tables must not drift from it unnoticed.
NODE_EXPECTED: dict[OperatorAction, tuple[set[SendState], SendState | None]] = {
    OA.REQUEUE: ({S.SS_FAILED}, S.SS_INIT),
    OA.RESEND: ({S.SS_SENT, S.SS_ACK_FWD, S.SS_ACK}, S.SS_INIT),
    OA.PURGE: (set(SendState), None),
    OA.DEAD_LETTER: ({S.SS_INIT}, S.SS_FAILED),
    OA.PURGE_DEAD: ({S.SS_FAILED}, None),
}
STORED_EXPECTED: dict[OperatorAction, tuple[set[StoredState], StoredState | None]] = {
    OA.REQUEUE: ({P.SS_SENT, P.SS_ACK}, P.SS_INIT),
    OA.RESEND: ({P.SS_SENT, P.SS_ACK}, P.SS_INIT),
    OA.PURGE: (set(StoredState), None),
    OA.DEAD_LETTER: (set(), None),
    OA.PURGE_DEAD: (set(), None),
}
TX_EXPECTED: dict[TxAction, tuple[set[TxState], TxState | None]] = {
    TA.COMMIT: ({T.HALF, T.NEEDS_ATTENTION}, T.COMMITTED),
    TA.ROLLBACK: ({T.HALF, T.NEEDS_ATTENTION}, T.ROLLED_BACK),
    TA.FLAG: ({T.HALF}, T.NEEDS_ATTENTION),
    TA.PURGE: ({T.COMMITTED, T.ROLLED_BACK}, None),
}


@pytest.mark.parametrize(("state", "action"), list(itertools.product(SendState, OperatorAction)))
def test_operator_every_pair(state: SendState, action: OperatorAction) -> None:
    froms, to = NODE_EXPECTED[action]
    assert ((state, action) in OPERATOR_TABLE) == (state in froms)
    if state in froms:
        assert operator_step(state, action, record=42) is OPERATOR_TABLE[(state, action)] is to
    else:
        with pytest.raises(TransitionRefused) as e:
            operator_step(state, action, record=42)
        assert str(e.value) == f"{action.value} of record 42 which is in state {state.name}"
        assert (e.value.action, e.value.ident, e.value.state) == (action.value, 42, state.name)


@pytest.mark.parametrize(("state", "action"), list(itertools.product(StoredState, OperatorAction)))
def test_stored_operator_every_pair(state: StoredState, action: OperatorAction) -> None:
    froms, to = STORED_EXPECTED[action]
    assert ((state, action) in STORED_OPERATOR_TABLE) == (state in froms)
    if state in froms:
        assert stored_operator_step(state, action, record=7) is to
    else:
        with pytest.raises(TransitionRefused, match=f"^{action.value} of stored copy 7 which is in state {state.name}$"):
            stored_operator_step(state, action, record=7)


@pytest.mark.parametrize(("state", "action"), list(itertools.product(TxState, TxAction)))
def test_tx_every_pair(state: TxState, action: TxAction) -> None:
    froms, to = TX_EXPECTED[action]
    assert ((state, action) in TX_TABLE) == (state in froms)
    if state in froms:
        assert tx_step(state, action, tx_id=3) is to
    else:
        with pytest.raises(TransitionRefused, match=f"^{action.value} of transaction 3 which is in state {state.name}$"):
            tx_step(state, action, tx_id=3)


def test_the_tables_hold_nothing_else() -> None:
    assert set(OPERATOR_TABLE) <= set(itertools.product(SendState, OperatorAction))
    assert set(STORED_OPERATOR_TABLE) <= set(itertools.product(StoredState, OperatorAction))
    assert set(TX_TABLE) <= set(itertools.product(TxState, TxAction))
    # The keys are the enums' own members (a bare int would be another key).
    assert all(type(s) is SendState for s, _a in OPERATOR_TABLE)
    assert all(type(s) is StoredState for s, _a in STORED_OPERATOR_TABLE)


@pytest.mark.parametrize("action", list(OperatorAction))
def test_states_and_result_of_each_action(action: OperatorAction) -> None:
    froms, to = NODE_EXPECTED[action]
    assert operator_states(action) == tuple(sorted(froms))
    assert operator_result(action) is to
    assert set(stored_operator_states(action)) == STORED_EXPECTED[action][0]


@pytest.mark.parametrize("action", list(TxAction))
def test_tx_states_and_result(action: TxAction) -> None:
    froms, to = TX_EXPECTED[action]
    assert tx_states(action) == tuple(sorted(froms)) and tx_result(action) is to


def test_an_unknown_row_and_the_sql_text() -> None:
    with pytest.raises(TransitionRefused, match=r"^requeue of a record which is in state SS_ACK2$"):
        operator_step(S.SS_ACK2, OA.REQUEUE)
    with pytest.raises(TransitionRefused, match=r"^commit of transaction 9 which is in state ROLLED_BACK$"):
        tx_step(T.ROLLED_BACK, TA.COMMIT, tx_id=9)
    # The text partial indexes are matched against (semq/node/store.py).
    assert sql_in(operator_states(OA.RESEND)) == "1,2,3"
    assert sql_in(tx_states(TA.COMMIT)) == "0,3"


# ---------------------------------------------------------------- the source rule

ROOT = Path(__file__).resolve().parents[2] / "semq"
SCANNED = sorted([*ROOT.glob("ops/*.py"), *(ROOT / "node" / "features" / n for n in ("dead.py", "txn.py", "queues.py", "rpc.py"))])
STATE_COLS = r"(?:state|p_ack|s_ack|p_ack_status|s_ack_status)"
# A state column compared with, or set to, a bare number: state=0, p_ack != 1,
# state IN (1, 2), state BETWEEN 1 AND 3, state<>9.
BARE = re.compile(rf"\b{STATE_COLS}\s*(?:=|==|!=|<>|<=|>=|<|>|\s+IN\s*\(|\s+NOT\s+IN\s*\(|\s+BETWEEN\s)\s*\d",
                  re.IGNORECASE)
INSERT = re.compile(r"INSERT\s+(?:OR\s+\w+\s+)?INTO\s+\w+\s*\(([^)]*)\)\s*VALUES\s*\(([^)]*)\)", re.IGNORECASE)


def _sql_texts(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (adjacent literals joined, as Python
    joins them; an f-string's literal parts with each placeholder as ``{}``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                           for v in node.values)
            out.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def bare_state_numbers(path: Path) -> list[str]:
    found = []
    for line, text in _sql_texts(path):
        found += [f"{path.name}:{line}: {m.group(0)!r}" for m in BARE.finditer(text)]
        for m in INSERT.finditer(text):
            cols = [c.strip().lower() for c in m.group(1).split(",")]
            vals = [v.strip() for v in m.group(2).split(",")]
            for c, v in zip(cols, vals, strict=False):
                if re.fullmatch(STATE_COLS, c, re.IGNORECASE) and v.isdigit():
                    found.append(f"{path.name}:{line}: INSERT writes {c}={v}")
    return sorted(set(found))  # an f-string's parts are literals of their own too


def test_the_scanner_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('q = "UPDATE outbox SET state=0 WHERE id=?"\n'
                   'r = ("SELECT 1 FROM outbox WHERE reliable=1 AND state IN (0,1)"\n'
                   '     " AND p_ack = 1")\n'
                   'b = f"SELECT 1 FROM outbox WHERE state BETWEEN 1 AND {x}"\n'
                   'i = ("INSERT INTO tx_half (state, target_id)"\n'
                   '     " VALUES (0,?)")\n'
                   'ok = f"UPDATE outbox SET state={x}, state_ms=0 WHERE state IN ({y})"\n')
    assert len(bare_state_numbers(bad)) == 5


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(ROOT)))
def test_sql_names_states_through_the_enums(path: Path) -> None:
    assert not bare_state_numbers(path), bare_state_numbers(path)
