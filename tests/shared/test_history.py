"""The delivery history (semq.tracking.history): folded from event records into one
row per document and role, searchable by key, LK0, counterpart, state and
time, across a node's units, with its retention and its bounds."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.tracking.events import EventLog
from semq.tracking.history import (
    HISTORY_FILE,
    MAX_STEPS,
    HistoryIndexer,
    HistoryReader,
    history_paths,
)

A, B = "10008", "56001"
T0 = (int(time.time()) // 60 * 60 - 3600) * 1000  # recent: older rows than the retention are removed


def _ev(ts: int, event: str, rid: int, **kw: Any) -> dict[str, Any]:
    return {"ts": T0 + ts, "role": kw.pop("role", "origin"), "event": event, "lk0": f"{A}/1/1/{rid}",
            "source": A, "target": B, **kw}


def _sent_and_confirmed(rid: int, key: str, at: int = 0) -> list[dict[str, Any]]:
    return [
        _ev(at, "queued", rid, key=key, data_type="INVOICE", domain="", subtype="", size=1024, save_fwd=3,
            priority=0),
        _ev(at + 5, "sent", rid, attempt=1, path="relay"),
        _ev(at + 20, "ack_fwd", rid, attempt=1),
        _ev(at + 300, "ack2", rid, attempt=1, path="relay"),
        _ev(at + 300, "cleaned", rid, attempt=1),
    ]


class _Log:
    """A daemon's event log and the history indexed from it."""

    def __init__(self, directory: Path, unit: int = 1) -> None:
        self.log = EventLog(directory / "events", f"org:{A}", "origin", unit=unit)
        self.index = HistoryIndexer(directory / "events", directory / HISTORY_FILE, 90)

    def put(self, records: list[dict[str, Any]]) -> None:
        self.log.write(records)

    def flush(self) -> bool:
        self.index.index_once()
        return True

    def purge(self, before_ms: int) -> int:
        return self.index.purge(before_ms)

    def close(self) -> None:
        self.log.close()
        self.index.close()


@pytest.fixture
def writer(tmp_path: Path) -> Any:
    w = _Log(tmp_path)
    yield w
    w.close()


def _reader(tmp_path: Path) -> HistoryReader:
    return HistoryReader(history_paths(tmp_path))


def test_a_document_is_one_row_with_every_step(writer: Any, tmp_path: Path) -> None:
    recs = _sent_and_confirmed(42, "INV-0042")
    # Written in two batches, as the daemon's commits come.
    writer.put(recs[:2])
    writer.put(recs[2:])
    assert writer.flush()
    r = _reader(tmp_path)
    [row] = r.search(text="INV-0042")
    assert (row["lk0"], row["role"], row["counterpart"], row["key"], row["size"], row["path"], row["state"],
            row["resends"]) == (f"{A}/1/1/42", "origin", B, "INV-0042", 1024, "relay", "ack2", 0)
    assert [s["event"] for s in row["steps"]] == ["queued", "sent", "ack_fwd", "ack2", "cleaned"]
    assert row["first_ms"] == T0 and row["last_ms"] == T0 + 300
    assert r.document(f"{A}/1/1/42") == [row]
    assert os.stat(tmp_path / HISTORY_FILE).st_mode & 0o077 == 0


def test_repeats_and_bookkeeping_do_not_move_a_state(writer: Any, tmp_path: Path) -> None:
    rcv = dict(role="receiver")
    writer.put([_ev(0, "received", 7, key="K", size=3, **rcv), _ev(1, "inbox", 7, **rcv),
                _ev(2, "ack2_sent", 7, **rcv)])
    writer.put([_ev(50, "received", 7, **rcv), _ev(50, "duplicate", 7, **rcv), _ev(60, "reack2", 7, **rcv),
                _ev(70, "cleaned", 7, **rcv)])
    # An origin resent twice: counted.
    writer.put([_ev(0, "queued", 8, key="L"), _ev(1, "sent", 8, attempt=1), _ev(900, "resend", 8),
                _ev(901, "sent", 8, attempt=2), _ev(1800, "resend", 8), _ev(1801, "sent", 8, attempt=3)])
    assert writer.flush()
    r = _reader(tmp_path)
    [rec] = r.search(lk0=f"{A}/1/1/7")
    assert (rec["role"], rec["state"], rec["counterpart"]) == ("receiver", "ack2_sent", A)
    [out] = r.search(key="L")
    assert (out["state"], out["resends"]) == ("sent", 2)


def test_a_row_keeps_at_most_max_steps(writer: Any, tmp_path: Path) -> None:
    # One batch over the bound, then batches one step at a time.
    writer.put([_ev(i, "inquiry", 9, detail="platform") for i in range(MAX_STEPS + 50)])
    assert writer.flush()
    for i in range(20):
        writer.put([_ev(1000 + i, "inquiry", 9, detail="target")])
    assert writer.flush()
    [row] = _reader(tmp_path).search(lk0=f"{A}/1/1/9")
    assert len(row["steps"]) == MAX_STEPS and row["nsteps"] == MAX_STEPS + 70
    assert row["steps"][0]["ts"] == T0 and row["last_ms"] == T0 + 1019


def test_search_filters_and_orders_newest_first(writer: Any, tmp_path: Path) -> None:
    recs = []
    for i in range(30):
        recs += _sent_and_confirmed(i + 1, f"INV-{i:04d}", at=i * 1000)
    recs.append(_ev(40_000, "queued", 99, key="PO-1", target="77001"))
    recs.append(_ev(40_001, "nack", 99, code=301, detail="target offline", target="77001"))
    writer.put(recs)
    assert writer.flush()
    r = _reader(tmp_path)
    assert [d["key"] for d in r.search(text="INV-002", limit=5)] == [f"INV-{i:04d}" for i in range(29, 19, -1)][:5]
    assert len(r.search(text="INV-")) == 30
    assert [d["lk0"] for d in r.search(text=f"{A}/1/1/99")] == [f"{A}/1/1/99"]
    [nacked] = r.search(state="nack")
    assert (nacked["key"], nacked["code"], nacked["counterpart"]) == ("PO-1", 301, "77001")
    assert [d["key"] for d in r.search(counterpart="77001")] == ["PO-1"]
    assert len(r.search(target=B)) == 30
    assert [d["key"] for d in r.search(since_ms=T0 + 28_500)] == ["PO-1", "INV-0029"]
    assert [d["key"] for d in r.search(until_ms=T0 + 1000)] == ["INV-0000"]
    assert r.search(text="nothing-like-it") == []
    assert r.count() == 31
    # Per minute, for the dashboards: counts by step, and the latency queued -> ack2.
    act = r.activity(T0, 60_000, now_ms=T0 + 120_000)
    assert act["start"] == [T0, T0 + 60_000]
    assert sum(act["queued"]) == 31 and sum(act["sent"]) == 30 and sum(act["confirmed"]) == 30
    assert sum(act["failed"]) == 1 and sum(act["received"]) == 0
    lat = r.latency(T0, 60_000, now_ms=T0 + 120_000)
    assert sum(lat["count"]) == 30 and lat["p50"][0] == 500 and lat["p99"][0] == 500  # 300 ms: the 200..500 bucket


def test_a_state_and_a_counterpart_together(writer: Any, tmp_path: Path) -> None:
    recs = []
    for i in range(300):
        recs += _sent_and_confirmed(i + 1, f"K{i}", at=i)
    recs.append(_ev(400, "queued", 999, key="BAD"))
    recs.append(_ev(401, "nack", 999, code=302))
    writer.put(recs)
    writer.flush()
    r = _reader(tmp_path)
    assert [d["key"] for d in r.search(target=B, state="nack")] == ["BAD"]
    assert len(r.search(target=B, state="ack2", limit=1000)) == 300


def test_retention_removes_old_rows(writer: Any, tmp_path: Path) -> None:
    writer.put(_sent_and_confirmed(1, "OLD") + _sent_and_confirmed(2, "NEW", at=10_000))
    assert writer.flush()
    assert writer.purge(T0 + 5_000) == 1
    assert [d["key"] for d in _reader(tmp_path).search()] == ["NEW"]


def test_the_units_of_a_node_and_its_applications_are_indexed_as_one(tmp_path: Path) -> None:
    # Unit 2 writes its own file; an application (NodeClient) writes unit 1's.
    u1, u2, app = (EventLog(tmp_path / "events", f"org:{A}", "origin", unit=u) for u in (1, 2, 1))
    index = HistoryIndexer(tmp_path / "events", tmp_path / HISTORY_FILE, 90)
    try:
        recs = _sent_and_confirmed(1, "U1")
        app.write(recs[:1])
        u1.write(recs[1:])
        u2.write([{**e, "lk0": f"{A}/2/1/1"} for e in _sent_and_confirmed(1, "U2", at=5)])
        assert index.index_once() == 10
        assert index.index_once() == 0  # each record once
    finally:
        for x in (u1, u2, app, index):
            x.close()
    assert history_paths(tmp_path) == [tmp_path / HISTORY_FILE]
    got = _reader(tmp_path).search()
    assert [(d["key"], d["state"], len(d["steps"])) for d in got] == [("U2", "ack2", 5), ("U1", "ack2", 5)]


def test_a_restarted_indexer_goes_on_where_it_stopped_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events", f"org:{A}", "origin")
    recs = _sent_and_confirmed(5, "R")
    log.write(recs[:3])
    first = HistoryIndexer(tmp_path / "events", tmp_path / HISTORY_FILE, 90)
    assert first.index_once() == 3
    first.close()
    [f] = (tmp_path / "events").iterdir()
    with open(f, "ab") as out:
        out.write(b'{"ts": 1, "event": "se')  # a line still being written: not read yet
    second = HistoryIndexer(tmp_path / "events", tmp_path / HISTORY_FILE, 90)
    assert second.index_once() == 0
    with open(f, "ab") as out:
        out.write(b"\n")  # ... torn for good (a crash mid-write): skipped
    log.write(recs[3:])
    assert second.index_once() == 2
    second.close()
    log.close()
    [row] = _reader(tmp_path).search()
    assert [s["event"] for s in row["steps"]] == ["queued", "sent", "ack_fwd", "ack2", "cleaned"]


def test_the_state_follows_the_time_of_the_events_not_their_order_in_the_files(writer: Any, tmp_path: Path) -> None:
    # The daemon logged sent and ack2 before the application got to log its
    # queued (written after its own commit): the document stays confirmed.
    recs = _sent_and_confirmed(6, "LATE")
    writer.put(recs[1:])
    writer.flush()
    writer.put(recs[:1])
    writer.flush()
    [row] = _reader(tmp_path).search()
    assert (row["state"], row["key"], row["first_ms"]) == ("ack2", "LATE", T0)
    assert [s["event"] for s in row["steps"]] == ["queued", "sent", "ack_fwd", "ack2", "cleaned"]


def test_a_reader_does_not_write_and_waits_for_a_file_not_there_yet(tmp_path: Path) -> None:
    r = HistoryReader([tmp_path / HISTORY_FILE])
    assert r.search() == []
    w = _Log(tmp_path)
    try:
        w.put(_sent_and_confirmed(1, "LATER"))
        assert w.flush()
    finally:
        w.close()
    assert [d["key"] for d in r.search()] == ["LATER"]
    conn = next(iter(r._conns.values()))
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM doc")


def _track(tmp_path: Path, capsys: Any, *args: str) -> tuple[int, str, str]:
    rc = semq_main(["track", "--dir", str(tmp_path), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_semq_track_shows_a_timeline_a_table_json_and_clear_errors(writer: Any, tmp_path: Path, capsys: Any) -> None:
    writer.put(_sent_and_confirmed(42, "INV-0042") + _sent_and_confirmed(43, "INV-\x1b[2J0043", at=10))
    assert writer.flush()
    rc, out, _ = _track(tmp_path, capsys, f"{A}/1/1/42")
    assert rc == 0
    assert f"{A}/1/1/42  out to {B}  key INVOICE / INV-0042  1.0 KiB" in out
    for words in ("accepted (queued)", "sent (sent)", "forwarded by the platform (ack_fwd)",
                  "confirmed by the receiver (ack2)", "cleaned up (cleaned)"):  # plain words, the code beside
        assert f"  {words}" in out
    assert "path relay" in out
    rc, out, _ = _track(tmp_path, capsys, "--to", B)
    assert rc == 0 and out.splitlines()[0].split() == ["FIRST", "SEEN", "DIR", "LK0", "WITH", "KEY", "SIZE", "PATH",
                                                      "STATE", "TOOK", "RESENDS", "CODE"]
    assert len(out.splitlines()) == 3
    # Control characters from another organization are shown escaped.
    assert "INV-\\x1b[2J0043" in out and "\x1b" not in out
    rc, out, _ = _track(tmp_path, capsys, "INV-0042", "--json")
    assert rc == 0 and '"state": "ack2"' in out and '"steps"' in out
    rc, _, err = _track(tmp_path, capsys, "--state", "nack")
    assert rc == 1 and "no document in the history matches" in err
    rc, _, err = _track(tmp_path, capsys, "--limit", "-5")
    assert rc == 2 and "--limit -5 is outside 1..10000" in err
    with pytest.raises(SystemExit):
        semq_main(["track", "--dir", str(tmp_path), "--since", "yesterday-ish"])
    assert "is neither a time ago" in capsys.readouterr().err
    rc, _, err = _track(tmp_path / "elsewhere", capsys)
    assert rc == 1 and "no delivery history" in err
