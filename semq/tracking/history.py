"""The delivery history: one compact, indexed row per document and role,
written from the event records a daemon logs after each commit
(docs/events.md), so it never claims more than the store holds.

``semq track`` and the web console answer "did INV-0042 reach 56001, and
when?" from it in milliseconds, long after the store has cleaned the
document's rows. It lives beside the store, in ``history.sqlite`` (one per
unit of a node), and is kept ``history_days`` (default 90).

Writing it stays off the hot path: the daemon starts ``python -m
semq.tracking.history`` beside it, a process of its own at the scheduler's idle
priority (``SCHED_IDLE``: it runs only on CPU time nothing else wants),
that reads what the event log files gained, folds each batch into one
upsert per document (its steps appended to the row as compact JSON) and
commits it with the offset reached in each file. Folding costs ~10 us per
event — about as much CPU as delivering the document — so under full load
the history falls behind and catches up when the load drops; ``semq
track`` says how far behind it is (``HistoryReader.behind``). A crash loses
nothing: the event logs are the source, and each record counts once.

Rows (``HistoryReader``):

- ``lk0``, ``role`` (``origin``, ``receiver``, ``platform``): the key.
- ``source``, ``target``, ``counterpart`` (the other organization: the target
  at the origin and the platform, the source at the receiver).
- the AppKey (``domain``, ``data_type``, ``subtype``, ``key``; absent at the
  platform when it travels sealed), ``size``, ``save_fwd``, ``priority``,
  users and channel.
- ``state``: the last event that moves the document on (``cleaned``,
  ``inquiry`` and repeats do not), ``code``: the last result code,
  ``path``: relay, direct or local, ``resends``, ``first_ms``/``last_ms``,
  ``receipt``: filled by whoever verified the receipt kept in the store
  (``semq.ops.track.receipt_check``); the store keeps receipts a year.
- ``steps``: every event with its time (at most ``MAX_STEPS`` per row).
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = [
    "ACTIVITY_KINDS",
    "HISTORY_FILE",
    "LATENCY_BOUNDS",
    "MAX_STEPS",
    "HistoryIndexer",
    "HistoryReader",
    "history_paths",
]

log = logging.getLogger("semq.tracking.history")

HISTORY_FILE: Final = "history.sqlite"
MAX_STEPS: Final = 200  # steps kept per row: a document sent again for ever cannot grow its row for ever
_DAY_MS: Final = 86_400_000
_PURGE_EVERY_S: Final = 600.0
_PURGE_CHUNK: Final = 20_000

# Events that do not move a document on: its state stays what it was.
_NO_STATE: Final = frozenset({"cleaned", "inquiry", "reack", "reack2", "duplicate", "bad_refusal",
                              "gap_dropped", "node_online", "node_offline"})
# A receiver logs ``received`` for every arrival, a repeat too: it sets the
# state of a new row only.
_WEAK: Final = frozenset({"received"})
# The states most documents end in, at each side: as a search filter they
# select little (semq.tracking.history.HistoryReader.search).
_COMMON_STATES: Final = frozenset({"ack2", "ack2_sent", "inbox", "acked", "forwarded", "delivered"})
# Attributes written once per message and logger (docs/events.md).
_ATTRS: Final = ("domain", "data_type", "subtype", "key", "size", "save_fwd", "priority",
                 "from_user", "to_user", "channel")
_ROW_ATTRS: Final = ("source", "target", *_ATTRS)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS doc (
    id INTEGER PRIMARY KEY,
    lk0 TEXT NOT NULL,
    role TEXT NOT NULL,
    source TEXT, target TEXT,
    domain TEXT, data_type TEXT, subtype TEXT, key TEXT,
    size INTEGER, save_fwd INTEGER, priority INTEGER,
    from_user TEXT, to_user TEXT, channel TEXT,
    path TEXT, state TEXT, state_ms INTEGER, code INTEGER, lk1 TEXT,
    first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,
    resends INTEGER NOT NULL DEFAULT 0,
    nsteps INTEGER NOT NULL DEFAULT 0,
    kept INTEGER NOT NULL DEFAULT 0,
    steps TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS doc_lk0 ON doc(lk0, role);
CREATE INDEX IF NOT EXISTS doc_key ON doc(key, first_ms) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS doc_first ON doc(first_ms);
CREATE INDEX IF NOT EXISTS doc_target ON doc(target, first_ms);
CREATE INDEX IF NOT EXISTS doc_source ON doc(source, first_ms);
CREATE INDEX IF NOT EXISTS doc_state ON doc(state, first_ms);
CREATE TABLE IF NOT EXISTS cursor (file TEXT PRIMARY KEY, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS minute (
    minute INTEGER NOT NULL, kind TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (minute, kind)
) WITHOUT ROWID;
"""

# One upsert per document and batch (parameters by number, bound from a
# tuple: ?1 lk0, ?2 role, ?3..?14 the attributes of _ROW_ATTRS, ?15 path,
# ?16 state, ?17 weak state, ?18 state_ms, ?19 code, ?20 lk1, ?21 first_ms,
# ?22 last_ms, ?23 resends, ?24 nsteps, ?25 kept, ?26 steps). Attributes keep the first value seen;
# the state is that of the latest state event by its time (the records of
# one document may come from two writers: the application's ``queued`` can
# follow the daemon's ``sent`` in the file), a weak one only for a new
# row; steps are appended while the row keeps fewer than MAX_STEPS.
_UPSERT: Final = f"""
INSERT INTO doc (lk0, role, source, target, domain, data_type, subtype, key, size, save_fwd, priority,
                 from_user, to_user, channel, path, state, state_ms, code, lk1, first_ms, last_ms,
                 resends, nsteps, kept, steps)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
        ?12, ?13, ?14, ?15, coalesce(?16, ?17), ?18, ?19, ?20,
        ?21, ?22, ?23, ?24, ?25, ?26)
ON CONFLICT (lk0, role) DO UPDATE SET
    source = coalesce(source, excluded.source), target = coalesce(target, excluded.target),
    domain = coalesce(domain, excluded.domain), data_type = coalesce(data_type, excluded.data_type),
    subtype = coalesce(subtype, excluded.subtype), key = coalesce(key, excluded.key),
    size = coalesce(size, excluded.size), save_fwd = coalesce(save_fwd, excluded.save_fwd),
    priority = coalesce(priority, excluded.priority), from_user = coalesce(from_user, excluded.from_user),
    to_user = coalesce(to_user, excluded.to_user), channel = coalesce(channel, excluded.channel),
    path = coalesce(excluded.path, path),
    state = CASE WHEN ?16 IS NOT NULL AND ?18 >= coalesce(state_ms, 0) THEN ?16
                 ELSE coalesce(state, ?17) END,
    state_ms = CASE WHEN ?16 IS NOT NULL AND ?18 >= coalesce(state_ms, 0) THEN ?18
                    ELSE state_ms END,
    code = coalesce(excluded.code, code),
    lk1 = coalesce(excluded.lk1, lk1),
    first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms),
    resends = resends + excluded.resends,
    steps = CASE WHEN kept + excluded.kept <= {MAX_STEPS} THEN steps || excluded.steps ELSE steps END,
    kept = CASE WHEN kept + excluded.kept <= {MAX_STEPS} THEN kept + excluded.kept ELSE kept END,
    nsteps = nsteps + excluded.nsteps
"""

_COLUMNS: Final = ("lk0", "role", "source", "target", "domain", "data_type", "subtype", "key", "size",
                   "save_fwd", "priority", "from_user", "to_user", "channel", "path", "state", "code",
                   "lk1", "first_ms", "last_ms", "resends", "nsteps", "steps")
_SELECT: Final = "SELECT " + ", ".join(_COLUMNS) + " FROM doc"
_FIRST: Final = _COLUMNS.index("first_ms")


def history_paths(directory: Path) -> list[Path]:
    """The history files of a data directory: its own and each unit's
    (``unit-K/``) that exist."""
    directory = Path(directory)
    out = [directory / HISTORY_FILE] if (directory / HISTORY_FILE).exists() else []
    units = sorted((p for p in directory.glob("unit-*") if p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
    out += [p / HISTORY_FILE for p in units if (p / HISTORY_FILE).exists()]
    return out


def _connect(path: Path) -> sqlite3.Connection:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # owner-only, like the store and the event log
    os.close(fd)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # Derived data: a power cut may lose the last commit, never corrupt it.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(_SCHEMA)
    return conn


class _Doc:
    """What one batch says about one document."""

    __slots__ = (
        "attrs",
        "code",
        "done_ms",
        "first",
        "last",
        "lk1",
        "nsteps",
        "path",
        "queued",
        "resends",
        "state",
        "state_ms",
        "steps",
        "strong",
    )

    def __init__(self, ts: int) -> None:
        self.attrs: dict[str, Any] = {}
        self.first = self.last = ts
        self.state: str | None = None
        self.state_ms = 0
        self.strong = False
        self.queued = False  # its queued event is in this batch (first is the queue time)
        self.done_ms = 0  # the time of its ack2 in this batch
        self.code: int | None = None
        self.path: str | None = None
        self.lk1: str | None = None
        self.resends = 0
        self.nsteps = 0
        self.steps: list[bytes] = []


def fold(records: Iterable[dict[str, Any]], role_default: str = "origin") -> dict[tuple[str, str], _Doc]:
    """One ``_Doc`` per (LK0, role) of a batch of event records."""
    docs: dict[tuple[str, str], _Doc] = {}
    dumps = orjson.dumps
    for r in records:
        lk0 = r.get("lk0")
        if not lk0:
            continue
        ev = r["event"]
        ts = r["ts"]
        k = (lk0, r.get("role", role_default))
        d = docs.get(k)
        if d is None:
            d = docs[k] = _Doc(ts)
            d.attrs["source"] = r.get("source")
            d.attrs["target"] = r.get("target")
        elif ts < d.first:
            d.first = ts
        elif ts > d.last:
            d.last = ts
        if "size" in r or "key" in r:
            for a in _ATTRS:
                v = r.get(a)
                if v is not None and v != "":
                    d.attrs[a] = v
        code = r.get("code")
        if code is not None:
            d.code = code
        path = r.get("path")
        if path:
            d.path = path
        if ev not in _NO_STATE:
            if ev in _WEAK:
                if not d.strong:
                    d.state = ev
            elif not d.strong or ts >= d.state_ms:
                d.state, d.state_ms, d.strong = ev, ts, True
        if ev == "resend" or (ev == "delivered" and (r.get("attempt") or 1) > 1):
            d.resends += 1
        elif ev == "queued":
            d.queued = True
        elif ev == "ack2":
            d.done_ms = ts
        lk1 = r.get("lk1")
        if lk1:
            d.lk1 = lk1
        d.nsteps += 1
        if d.nsteps <= MAX_STEPS:
            d.steps.append(dumps([ts, ev, code, r.get("attempt"), path, r.get("detail"), lk1]))
    return docs


# Per minute, for the dashboards: what each side's events count as.
_ACTIVITY: Final = {
    ("origin", "queued"): "queued", ("origin", "sent"): "sent", ("origin", "ack2"): "confirmed",
    ("origin", "nack"): "failed", ("origin", "expired"): "failed", ("origin", "dead"): "failed",
    ("receiver", "inbox"): "received", ("receiver", "refused"): "failed",
    ("platform", "received"): "received", ("platform", "forwarded"): "sent", ("platform", "delivered"): "sent",
    ("platform", "acked"): "confirmed", ("platform", "dropped"): "failed", ("platform", "refused"): "failed",
}
ACTIVITY_KINDS: Final = ("queued", "sent", "received", "confirmed", "failed")
# Upper bounds (ms) of the end-to-end latency histogram kept per minute
# (queued -> ack2 at the origin); the last is open.
LATENCY_BOUNDS: Final = (5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000,
                         3_600_000, 86_400_000)
_MINUTE: Final = 60_000
_COUNT: Final = """INSERT INTO minute (minute, kind, n) VALUES (?, ?, ?)
ON CONFLICT (minute, kind) DO UPDATE SET n = n + excluded.n"""


def _latency_kind(ms: int) -> str:
    return f"lat{bisect.bisect_left(LATENCY_BOUNDS, ms)}"


_FILE_RE: Final = re.compile(r"events-(\d{4}-\d{2}-\d{2})(-unit\d+)?\.jsonl")
_CHUNK: Final = 8 << 20  # bytes of event log read per transaction


class HistoryIndexer:
    """Owns ``history.sqlite``: ``index_once`` reads what the event log
    files of ``events_dir`` gained (the daemon's, its units' and the
    applications' that write the store directly) and folds it in. The
    offset reached in each file is committed with the rows it produced, so
    after a crash or a restart every record is counted once. ``purge``
    removes rows older than ``days``. ``run_indexer`` calls both, in the
    process the daemon starts."""

    def __init__(self, events_dir: Path, path: Path, days: int, *, interval: float = 0.5) -> None:
        self.events_dir = Path(events_dir)
        self.path = Path(path)
        self.days = days
        self.interval = interval
        self.indexed = 0  # records folded in since start
        self._conn = _connect(self.path)

    def close(self) -> None:
        self._conn.close()

    def _files(self) -> list[tuple[str, Path]]:
        if not self.events_dir.is_dir():
            return []
        oldest = time.strftime("%Y-%m-%d", time.gmtime(time.time() - (self.days + 1) * 86400)) if self.days else ""
        out = []
        for p in self.events_dir.iterdir():
            m = _FILE_RE.fullmatch(p.name)
            if m and m.group(1) >= oldest:
                out.append((p.name, p))
        return sorted(out)

    def index_once(self, stop: threading.Event | None = None) -> int:
        """Fold in what every event log file gained since the last pass
        (until ``stop`` is set, checked between chunks); the number of records."""
        c = self._conn
        done = dict(c.execute("SELECT file, offset FROM cursor").fetchall())
        total = 0
        for name, p in self._files():
            at = done.get(name, 0)
            while True:
                try:
                    size = p.stat().st_size
                except FileNotFoundError:
                    break
                if size < at:
                    log.warning("history: %s shrank (%d < %d bytes); read again from its start", p, size, at)
                    at = 0
                if size == at:
                    break
                with open(p, "rb") as f:
                    f.seek(at)
                    data = f.read(min(size - at, _CHUNK))
                end = data.rfind(b"\n") + 1
                if end == 0:
                    break  # a line still being written
                records = []
                for line in data[:end].splitlines():
                    try:
                        r = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue  # a torn line (a crash mid-write): the log's readers skip it too
                    if isinstance(r, dict) and "ts" in r and "event" in r:
                        records.append(r)
                at += end
                self._write(records, name, at)
                total += len(records)
                if stop is not None and stop.is_set():
                    self.indexed += total
                    return total
        self.indexed += total
        return total

    def _write(self, records: list[dict[str, Any]], file: str, offset: int) -> None:
        rows = []
        docs = fold(records)
        for (lk0, role), d in docs.items():
            a = d.attrs
            strong = d.strong
            rows.append((lk0, role, *[a.get(k) for k in _ROW_ATTRS], d.path, d.state if strong else None,
                         None if strong else d.state, d.state_ms if strong else None, d.code, d.lk1, d.first,
                         d.last, d.resends, d.nsteps, len(d.steps), b",".join(d.steps).decode() + ","))
        counts: dict[tuple[int, str], int] = {}
        for r in records:
            kind = _ACTIVITY.get((r.get("role", "origin"), r["event"]))
            if kind is not None:
                k = (r["ts"] // _MINUTE * _MINUTE, kind)
                counts[k] = counts.get(k, 0) + 1
        c = self._conn
        c.execute("BEGIN")
        try:
            for (lk0, role), d in docs.items():
                if d.done_ms and role == "origin":
                    first = d.first if d.queued else None
                    if first is None:
                        got = c.execute("SELECT first_ms FROM doc WHERE lk0 = ? AND role = ?", (lk0, role)).fetchone()
                        first = min(got[0], d.first) if got else d.first
                    k = (d.done_ms // _MINUTE * _MINUTE, _latency_kind(max(0, d.done_ms - first)))
                    counts[k] = counts.get(k, 0) + 1
            c.executemany(_UPSERT, rows)
            c.executemany(_COUNT, [(m, kind, n) for (m, kind), n in counts.items()])
            c.execute("INSERT INTO cursor (file, offset) VALUES (?, ?)"
                      " ON CONFLICT (file) DO UPDATE SET offset = excluded.offset", (file, offset))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def purge(self, before_ms: int) -> int:
        """Remove rows begun before ``before_ms`` (in chunks), and the
        offsets of event log files that are gone."""
        n = 0
        c = self._conn
        while True:
            cur = c.execute("DELETE FROM doc WHERE id IN (SELECT id FROM doc WHERE first_ms < ? LIMIT ?)",
                            (before_ms, _PURGE_CHUNK))
            n += cur.rowcount
            if cur.rowcount < _PURGE_CHUNK:
                break
        c.execute("DELETE FROM minute WHERE minute < ?", (before_ms,))
        present = {name for name, _ in self._files()}
        gone = [(f,) for (f,) in c.execute("SELECT file FROM cursor").fetchall() if f not in present]
        if gone:
            c.executemany("DELETE FROM cursor WHERE file = ?", gone)
        return n


def _row(r: tuple[Any, ...]) -> dict[str, Any]:
    d = dict(zip(_COLUMNS, r, strict=True))
    d["counterpart"] = d["source"] if d["role"] == "receiver" else d["target"]
    d["receipt"] = None  # the store keeps the receipt: semq.ops.track.receipt_check
    steps = d.pop("steps")
    d["steps"] = sorted((dict(zip(("ts", "event", "code", "attempt", "path", "detail", "lk1"), s, strict=True))
                         for s in orjson.loads("[" + steps[:-1] + "]")), key=lambda s: s["ts"]) if steps else []
    return d


class HistoryReader:
    """Reads the history files of a data directory (``history_paths``),
    read-only: the daemon may be running and writing them."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._conns: dict[Path, sqlite3.Connection] = {}

    def _open(self) -> list[sqlite3.Connection]:
        for p in self.paths:
            if p not in self._conns and p.exists():
                conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, check_same_thread=False)
                conn.execute("PRAGMA query_only=1")
                self._conns[p] = conn
        return list(self._conns.values())

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for c in self._open():
            try:
                out += c.execute(sql, params).fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" not in str(e):  # a file the writer has only just created
                    raise
        return out

    def search(self, *, text: str | None = None, key: str | None = None, lk0: str | None = None,
               counterpart: str | None = None, source: str | None = None, target: str | None = None,
               role: str | None = None, state: str | None = None, since_ms: int | None = None,
               until_ms: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Rows matching every filter given, newest first (by ``first_ms``).
        ``text``: an exact LK0, or an AppKey key equal to it or starting
        with it; ``counterpart``: the other organization of either role."""
        clauses: list[str] = []
        params: list[Any] = []
        if text:
            if text.count("/") == 3 and text.split("/", 1)[0].isdigit():
                clauses.append("lk0 = ?")
                params.append(text)
            else:
                # A range on the key index (LIKE would not use it).
                clauses.append("key >= ? AND key < ?")
                params += [text, text + "\U0010ffff"]
        if key is not None:
            clauses.append("key = ?")
            params.append(key)
        if lk0 is not None:
            clauses.append("lk0 = ?")
            params.append(lk0)
        if counterpart is not None:
            clauses.append("((role = 'receiver' AND source = ?) OR (role != 'receiver' AND target = ?))")
            params += [counterpart, counterpart]
        # A key or an LK0 picks out a few rows: its index leads, and the
        # others only filter (``+col`` keeps SQLite from choosing the index
        # of a state most rows share or of a wide time range instead).
        plus = "+" if (text or key is not None or lk0 is not None) else ""
        # Of an organization and a state, the rarer leads: a state most
        # documents end in (confirmed) filters the organization's rows; a
        # failure or a step on the way picks out its few rows itself.
        org_plus = "+" if plus or (state is not None and state not in _COMMON_STATES) else ""
        for col, v, p in (("source", source, org_plus), ("target", target, org_plus), ("role", role, "+"),
                          ("state", state, "+" if plus or (state in _COMMON_STATES and (source or target))
                           else "")):
            if v is not None:
                clauses.append(f"{p}{col} = ?")
                params.append(v)
        if since_ms is not None:
            clauses.append(f"{plus}first_ms >= ?")
            params.append(since_ms)
        if until_ms is not None:
            clauses.append(f"{plus}first_ms < ?")
            params.append(until_ms)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        limit = max(1, min(int(limit), 10_000))
        rows = self._query(f"{_SELECT}{where} ORDER BY first_ms DESC LIMIT ?", [*params, limit])
        rows.sort(key=lambda r: r[_FIRST], reverse=True)  # across units
        return [_row(r) for r in rows[:limit]]

    def document(self, lk0: str) -> list[dict[str, Any]]:
        """Every row of one LK0 (one per role that saw it), with its steps."""
        order = {"origin": 0, "platform": 1, "receiver": 2}
        rows = [_row(r) for r in self._query(f"{_SELECT} WHERE lk0 = ?", [lk0])]
        rows.sort(key=lambda d: order.get(d["role"], 3))
        return rows

    def _minutes(self, since_ms: int, now_ms: int) -> list[tuple[int, str, int]]:
        return self._query("SELECT minute, kind, n FROM minute WHERE minute >= ? AND minute < ?",
                           [since_ms // _MINUTE * _MINUTE, now_ms])

    def activity(self, since_ms: int, bucket_ms: int, now_ms: int | None = None) -> dict[str, list[int]]:
        """Counts per time bucket (whole minutes) since ``since_ms``:
        ``queued``, ``sent``, ``received`` (into the inbox; at the platform:
        from an origin), ``confirmed`` (ack2; at the platform: acked) and
        ``failed``, by the time of the step; ``start``: each bucket's start."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        bucket_ms = max(_MINUTE, bucket_ms // _MINUTE * _MINUTE)
        since_ms = since_ms // _MINUTE * _MINUTE
        n = max(1, -(-(now - since_ms) // bucket_ms))
        out: dict[str, list[int]] = {"start": [since_ms + i * bucket_ms for i in range(n)]}
        for k in ACTIVITY_KINDS:
            out[k] = [0] * n
        for minute, kind, count in self._minutes(since_ms, now):
            if kind in out:
                out[kind][(minute - since_ms) // bucket_ms] += count
        return out

    def latency(self, since_ms: int, bucket_ms: int, now_ms: int | None = None) -> dict[str, list[Any]]:
        """The end-to-end latency (queued -> ack2 at the origin) of the
        documents confirmed per time bucket: ``count``, ``p50`` and ``p99``
        in ms (the upper bound of the histogram bucket they fall in; None
        for an empty bucket); ``start``: each bucket's start."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        bucket_ms = max(_MINUTE, bucket_ms // _MINUTE * _MINUTE)
        since_ms = since_ms // _MINUTE * _MINUTE
        n = max(1, -(-(now - since_ms) // bucket_ms))
        hist = [[0] * (len(LATENCY_BOUNDS) + 1) for _ in range(n)]
        for minute, kind, count in self._minutes(since_ms, now):
            if kind.startswith("lat") and kind[3:].isdigit() and int(kind[3:]) <= len(LATENCY_BOUNDS):
                hist[(minute - since_ms) // bucket_ms][int(kind[3:])] += count
        bounds = [*LATENCY_BOUNDS, None]

        def pct(h: list[int], q: float) -> int | None:
            total = sum(h)
            if not total:
                return None
            seen = 0
            for i, c in enumerate(h):
                seen += c
                if seen >= q * total:
                    return bounds[i] if bounds[i] is not None else LATENCY_BOUNDS[-1]
            return LATENCY_BOUNDS[-1]

        return {"start": [since_ms + i * bucket_ms for i in range(n)], "count": [sum(h) for h in hist],
                "p50": [pct(h, 0.5) for h in hist], "p99": [pct(h, 0.99) for h in hist]}

    def behind(self, events_dir: Path, days: int = 0) -> int:
        """Bytes of event log the history has not indexed yet (0: it is up
        to date); ``days``: the history's retention (older logs are not
        indexed)."""
        done: dict[str, int] = {}
        for f, off in self._query("SELECT file, offset FROM cursor", []):
            done[f] = max(done.get(f, 0), off)
        oldest = time.strftime("%Y-%m-%d", time.gmtime(time.time() - (days + 1) * 86400)) if days else ""
        total = 0
        if Path(events_dir).is_dir():
            for p in Path(events_dir).iterdir():
                m = _FILE_RE.fullmatch(p.name)
                if m and m.group(1) >= oldest:
                    try:
                        total += max(0, p.stat().st_size - done.get(p.name, 0))
                    except FileNotFoundError:
                        pass
        return total

    def count(self) -> int:
        return sum(n for (n,) in self._query("SELECT count(*) FROM doc", []))


# ---------------------------------------------------------------- the indexer process


def idle_priority() -> str:
    """Run the calling process only on CPU time nothing else wants
    (SCHED_IDLE; nice 19 where that is not available). Says which."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            return "normal"
        return "nice 19"


def run_indexer(events_dir: Path, path: Path, days: int, parent: int, interval: float = 0.5) -> int:
    """Index until ``parent`` is gone or SIGTERM: the process the daemon
    starts (``python -m semq.tracking.history``)."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    idle_priority()
    index = HistoryIndexer(events_dir, path, days, interval=interval)
    next_purge = 0.0
    try:
        while not stop.is_set() and os.getppid() == parent:
            try:
                index.index_once(stop)
                if days and time.monotonic() >= next_purge:
                    next_purge = time.monotonic() + _PURGE_EVERY_S
                    index.purge(int(time.time() * 1000) - days * _DAY_MS)
            except (OSError, sqlite3.Error) as e:
                log.warning("history %s: %s (tried again in 5 s)", path, e)
                stop.wait(5.0)
            stop.wait(interval)
    finally:
        index.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m semq.tracking.history",
                                description="index a daemon's event logs into its delivery history (the daemon"
                                            " starts this itself)")
    p.add_argument("--events", required=True, help="the event log directory")
    p.add_argument("--db", required=True, help="the history file (history.sqlite)")
    p.add_argument("--days", type=int, default=90, help="days a document is kept (0: for ever)")
    p.add_argument("--parent", type=int, required=True, help="stop when this process is gone")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_indexer(Path(a.events), Path(a.db), a.days, a.parent, a.interval)


if __name__ == "__main__":
    import sys

    sys.exit(main())
