#!/usr/bin/env python3
"""What a document costs the PostgreSQL platform store: row bytes, WAL bytes and server CPU.

``scripts/bench pgstore [--docs 20000] [--batch 100] [--size 1024]``

A throwaway PostgreSQL server (semq.testing.pgserver, fsync and
synchronous_commit on, never the machine's own server) and one
``PlatformCore(url, create=True)`` driven directly, as the daemon's store
thread drives it (a batch of frames per ``handle``, one transaction each).
Three phases over ``--docs`` documents of ``--size`` bytes (SaveFwd 3):

* **online**: the target is online, so each document is forwarded and
  remembered in ``seen`` (the inquiry answer), never stored;
* **store**: the target is offline, each document becomes a row of
  ``stored`` (and a ``seen`` row), acknowledged ACK_SAVE after the commit;
* **deliver + ack**: the target connects, its copies are claimed in
  batches and its ACKs delete them.

For each phase: WAL bytes per document (``pg_current_wal_lsn()`` before and
after, ``pg_wal_lsn_diff``), commits, the server backend's CPU per document
(/proc of ``pg_backend_pid()``), this process's CPU per document, and the
rate. After the store phase: ``pg_total_relation_size`` of ``stored`` and
``seen`` (table, TOAST and indexes) per document. The figures feed
docs/scaling.md and scripts/scaling_model.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

if __package__:
    from ._table import print_table
else:  # run as a file: python scripts/benchmarks/pgstore.py
    from _table import print_table  # type: ignore[no-redef]

A, B = "10008", "56001"
_TICK: Final = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat[stat.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / _TICK


def _one(cur: Any) -> Any:
    """The first column of the one row a statement returns."""
    row = cur.fetchone()
    assert row is not None
    return row[0]


class Probe:
    """WAL position, commits and backend CPU, read on a second connection
    (so the probe's own statements do not count against the store's)."""

    def __init__(self, url: str, backend_pid: int) -> None:
        import psycopg

        self.c = psycopg.connect(url, autocommit=True)
        self.pid = backend_pid

    def read(self) -> dict[str, Any]:
        lsn = _one(self.c.execute("SELECT pg_current_wal_lsn()"))
        # The next transaction id to be assigned: the write transactions in between (pg_stat_database's
        # counters are flushed lazily, about once a second).
        commits = _one(self.c.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
        return {"lsn": lsn, "commits": commits, "pg_cpu": _cpu_s(self.pid),
                "cpu": time.process_time(), "t": time.monotonic()}

    def delta(self, a: dict[str, Any], b: dict[str, Any], n: int) -> dict[str, float]:
        wal = _one(self.c.execute("SELECT pg_wal_lsn_diff(%s, %s)", (b["lsn"], a["lsn"])))
        secs = b["t"] - a["t"]
        return {"docs": n, "wal_per_doc": float(wal) / n, "commits": int(b["commits"]) - int(a["commits"]),
                "pg_cpu_us": (b["pg_cpu"] - a["pg_cpu"]) / n * 1e6, "py_cpu_us": (b["cpu"] - a["cpu"]) / n * 1e6,
                "seconds": secs, "rate": n / secs if secs > 0 else float("inf")}

    def size(self, table: str) -> int:
        return int(_one(self.c.execute("SELECT pg_total_relation_size(%s)", (table,))))

    def close(self) -> None:
        self.c.close()


def run(docs: int, batch: int, size: int) -> dict[str, Any]:
    from semq.platform.core import PlatformCore
    from semq.testing.pgserver import pg_database, throwaway_pg
    from semq.umxt_protocol import (
        AckBatch,
        AckEntry,
        AckFlag,
        Endpoint,
        Frame,
        FrameDecoder,
        Kind,
        encode_data,
        encode_frame,
    )

    a, b = Endpoint.org(A), Endpoint.org(B)
    payload = b"x" * size
    now = int(time.time() * 1000)

    def frames(data: list[bytes]) -> list[Any]:
        dec = FrameDecoder()
        dec.receive_data(b"".join(data))
        return list(dec)

    def batches(first: int) -> list[list[Any]]:
        out = []
        for i in range(first, first + docs, batch):
            out.append(frames([encode_data(source=a, target=b, record_id=r, created_ms=now, save_fwd=3,
                                           app_key=("trade", "ORDER", "PO", f"K{r}"), app_data=payload)
                               for r in range(i, min(i + batch, first + docs))]))
        return out

    with throwaway_pg() as server, pg_database(server) as url:
        core = PlatformCore(url, create=True)
        core.register([A, B])
        backend = int(core.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        probe = Probe(url, backend)
        frame_bytes = len(batches(1)[0][0].raw)
        result: dict[str, Any] = {"docs": docs, "batch": batch, "size": size, "frame_bytes": frame_bytes,
                                  "server": _one(probe.c.execute("SHOW server_version"))}
        try:
            # online: forwarded, a `seen` row each
            work = batches(1)
            room = {b: 1 << 60}
            p0 = probe.read()
            for fr in work:
                core.handle(a, fr, room)
            result["online"] = probe.delta(p0, probe.read(), docs)
            seen_online = probe.size("seen")
            # store: the target offline
            core.disconnected(b)
            work = batches(docs + 1)
            s0 = {t: probe.size(t) for t in ("stored", "seen")}
            p0 = probe.read()
            for fr in work:
                core.handle(a, fr, {})
            result["store"] = probe.delta(p0, probe.read(), docs)
            rows = int(core.conn.execute("SELECT count(*) FROM stored").fetchone()[0])
            if rows != docs:
                raise RuntimeError(f"{rows} stored rows after storing {docs} documents")
            result["stored_bytes_per_doc"] = (probe.size("stored") - s0["stored"]) / docs
            result["seen_bytes_per_doc"] = (probe.size("seen") - s0["seen"]) / docs
            result["seen_bytes_per_doc_online"] = seen_online / docs
            # deliver + ack: claim in batches, ACK each batch
            core.connected(b)
            p0 = probe.read()
            delivered = 0
            while True:
                out, n = core.claim_stored(b, batch)
                if not n:
                    break
                lk1s = [int(f.data_prefix()[1].record_id) for f in frames(out)]
                entries = tuple(AckEntry(1, 1, 0, 1, 1, i, int(AckFlag.PLATFORM), 0) for i in lk1s)
                core.handle(b, frames([encode_frame(Frame(kind=Kind.ACK_BATCH, source=b, target=core.me,
                                                          body=AckBatch(ack_kind=Kind.ACK, entries=entries)))]),
                            {})
                delivered += n
            result["deliver"] = probe.delta(p0, probe.read(), docs)
            left = int(core.conn.execute("SELECT count(*) FROM stored").fetchone()[0])
            if delivered != docs or left:
                raise RuntimeError(f"delivered {delivered} of {docs}; {left} stored rows left after the acks")
        finally:
            probe.close()
            core.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench pgstore", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--docs", type=int, default=20_000, help="documents per phase (default 20,000)")
    p.add_argument("--batch", type=int, default=100, help="frames per transaction (default 100)")
    p.add_argument("--size", type=int, default=1024, help="application bytes per document (default 1024)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    if a.docs < 1 or a.batch < 1 or a.size < 0:
        print("error: --docs and --batch must be >= 1, --size >= 0", file=sys.stderr)
        return 2
    try:
        r = run(a.docs, a.batch, a.size)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    rows = []
    for phase, label in (("online", "online: forwarded, `seen` row"), ("store", "store: target offline"),
                         ("deliver", "deliver + ack: claimed, acked, deleted")):
        d = r[phase]
        rows.append([label, f"{d['wal_per_doc']:,.0f} B", f"{d['pg_cpu_us']:.0f} µs", f"{d['py_cpu_us']:.0f} µs",
                     f"{d['commits'] / d['docs']:.3f}", f"{d['rate']:,.0f}/s"])
    print_table(f"SEMQ platform store on PostgreSQL {r['server']}: cost per document",
                ["phase", "WAL/doc", "server CPU/doc", "core CPU/doc", "transactions/doc", "rate"], rows, [
                    f"{r['docs']:,} documents per phase, {r['size']} B application data ({r['frame_bytes']} B frame,"
                    f" not sealed), {r['batch']} per transaction; fsync and synchronous_commit on.",
                    f"stored row (table + TOAST + indexes): {r['stored_bytes_per_doc']:,.0f} B per document while"
                    f" stored; `seen` (kept 30 days): {r['seen_bytes_per_doc']:,.0f} B per stored document,"
                    f" {r['seen_bytes_per_doc_online']:,.0f} B per forwarded one.",
                    "store-and-forward = store + deliver + ack; WAL includes full-page images after a checkpoint.",
                ])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
