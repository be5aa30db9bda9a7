"""rows_by_id: the rows of a set of ids, by one range scan when the ids are
dense (acks name rows claimed together) and by IN lists when they are not;
the same rows either way, and the plan it promises."""

from __future__ import annotations

import random
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from semq.store.db import SendOrder, delete_by_id, rows_by_id


def _table() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, grp INTEGER, v TEXT)")
    c.executemany("INSERT INTO t VALUES (?,?,?)", [(i, i % 3, f"v{i}") for i in range(1, 3001) if i % 7])
    return c


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(min_value=-5, max_value=3100), max_size=1200),
       grp=st.none() | st.integers(min_value=0, max_value=2))
def test_same_rows_as_a_plain_lookup(ids: list[int], grp: int | None) -> None:
    c = _table()
    where, params = ("grp=?", (grp,)) if grp is not None else ("", ())
    got = rows_by_id(c, "SELECT id, grp, v FROM t", ids, where=where, params=params)
    want = {(i, i % 3, f"v{i}") for i in set(ids) if 1 <= i <= 3000 and i % 7 and (grp is None or i % 3 == grp)}
    assert sorted(got) == sorted(want)  # each row once, even for an id asked twice


def test_dense_ids_read_one_range_sparse_ids_in_lists() -> None:
    c = _table()
    seen: list[str] = []
    c.set_trace_callback(seen.append)
    assert len(rows_by_id(c, "SELECT id FROM t", list(range(100, 1124)))) == 1024 - 146
    assert seen == ["SELECT id FROM t WHERE id BETWEEN 100 AND 1123"]
    seen.clear()
    sparse = list(range(1, 3001, 5))  # 600 ids over 3,000
    assert len(rows_by_id(c, "SELECT id FROM t", sparse)) == len([i for i in sparse if i % 7])
    assert len(seen) == 2 and all(" IN (" in s for s in seen)  # 500 + 100
    seen.clear()
    assert rows_by_id(c, "SELECT id FROM t", []) == [] and seen == []


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(min_value=-5, max_value=3100), max_size=1200) | st.builds(
    lambda lo, n: list(range(lo, lo + n)), st.integers(min_value=-5, max_value=3000), st.integers(0, 400)))
def test_delete_by_id_deletes_exactly_the_ids(ids: list[int]) -> None:
    """One range DELETE when the ids are exactly lo..hi, a statement per id
    otherwise: the same rows go either way, and no other row."""
    c = _table()
    before = {r[0] for r in c.execute("SELECT id FROM t")}
    delete_by_id(c, "t", ids)
    assert {r[0] for r in c.execute("SELECT id FROM t")} == before - set(ids)


def test_delete_by_id_uses_one_range_for_a_dense_run() -> None:
    c = _table()
    seen: list[str] = []
    c.set_trace_callback(seen.append)
    delete_by_id(c, "t", list(range(10, 20)))
    assert seen == ["DELETE FROM t WHERE id BETWEEN 10 AND 19"]
    seen.clear()
    delete_by_id(c, "t", [30, 32])  # a gap: not a range, rows between must stay
    assert len(seen) == 2 and c.execute("SELECT count(*) FROM t WHERE id=31").fetchone()[0] == 1


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 1500), seed=st.integers(0, 2**32), prios=st.integers(1, 4),
       held_every=st.integers(1, 5), held_run=st.integers(0, 700), limit=st.integers(1, 300),
       claims=st.integers(1, 4))
def test_send_order_claims_the_next_rows_that_are_not_held(
        n: int, seed: int, prios: int, held_every: int, held_run: int, limit: int, claims: int) -> None:
    """SendOrder.ids gives exactly the first ``limit`` SS_INIT rows in send
    order (priority first, then id) that are not held, however many held
    rows come first (it reads on in growing chunks), claim after claim."""
    rnd = random.Random(seed)
    rows = [(i, rnd.choice((0, 0, 0, 1, 5)), rnd.randrange(prios)) for i in range(1, n + 1)]
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, state INTEGER, priority INTEGER)")
    c.executemany("INSERT INTO q VALUES (?,?,?)", rows)
    init = sorted((-p, i) for i, s, p in rows if s == 0)
    # Held: a long run at the front of the send order, then every n-th row.
    held = {i for k, (_, i) in enumerate(init) if k < held_run or k % held_every == 0}
    order = SendOrder("q")
    for _ in range(claims):
        want = [i for _, i in init if i not in held][:limit]
        ids, levels = order.ids(c, "state=0", (), limit, held)
        assert ids == want
        held |= set(ids)  # claimed: held sent from now on
        order.advance(levels, held, set())
