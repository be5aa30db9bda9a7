#!/usr/bin/env python3
"""In-process pipeline: the three real cores (A -> platform -> B and back), no sockets: CPU per document per role.

``scripts/bench pipeline [--docs N] [--security on|off|both] [--synchronous
FULL|NORMAL|OFF] [--profile A|P|B] [--top K]``

The same NodeCore / PlatformCore objects the daemons drive, fed with each
other's output bytes through FrameDecoder (what the wire would carry), in
one thread: A claims batches of 512 (as its sender), the platform handles
them, B handles what the platform relays, and every ack, ACK2, REACK and
REACK2 goes round until A's outbox is empty. Wall and CPU time are summed
per role, so the table says where a document's time goes without the event
loop, TLS or the scheduler — the profile the daemons' figures are built on.

``--profile ROLE`` runs that role's calls under cProfile and prints its top
functions by own time (docs/profiling.md says how to profile the real
processes with py-spy).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._table import print_table

A, B = "10008", "56001"
ROOM = 1 << 40  # an online target's room, as the platform daemon gives its core
BATCH = 512
SEMQ = [sys.executable, "-m", "semq"]


def _cli(root: Path, *args: str) -> None:
    r = subprocess.run([*SEMQ, *args], cwd=root, capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise SystemExit(f"semq {' '.join(args)}: {r.stderr.strip()}")


def setup(root: Path, secure: bool) -> None:
    off = [] if secure else ["--no-security"]
    _cli(root, "platform", "init", "--dir", "P", "--listen", "127.0.0.1:7410", *off)
    for org, d in ((A, "A"), (B, "B")):
        _cli(root, "node", "init", "--dir", d, "--org", org, "--platform", "127.0.0.1:7410", *off,
             *(["--enroll-from", "P"] if secure else []))
    if not secure:
        _cli(root, "platform", "register", "--dir", "P", A, B)


class Role:
    def __init__(self, name: str, profile: bool) -> None:
        self.name = name
        self.wall = 0.0
        self.cpu = 0.0
        self.calls = 0
        self.prof = cProfile.Profile() if profile else None

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        if self.prof is not None:
            self.prof.enable()
        try:
            return fn(*args)
        finally:
            if self.prof is not None:
                self.prof.disable()
            self.wall += time.perf_counter() - w
            self.cpu += time.thread_time() - c
            self.calls += 1


def run_once(root: Path, n: int, secure: bool, synchronous: str, profile: str | None,
             drain: bool = False) -> dict[str, Any]:
    from semq.node.core import NewDocument, NodeCore
    from semq.platform.core import PlatformCore
    from semq.umxt_protocol import AppKey, Endpoint, FrameDecoder, SaveFwd

    setup(root, secure)
    sec: dict[str, Any] = {}
    psec = None
    if secure:
        from semq.identity.security import NodeSecurity, PlatformSecurity

        psec = PlatformSecurity(root / "P")
        sec = {d: NodeSecurity(root / d) for d in ("A", "B")}
    a = NodeCore(root / "A" / "node.sqlite", A, events_dir=root / "A" / "events", synchronous=synchronous,
                 security=sec.get("A"))
    b = NodeCore(root / "B" / "node.sqlite", B, events_dir=root / "B" / "events", synchronous=synchronous,
                 security=sec.get("B"))
    p = PlatformCore(root / "P" / "platform.sqlite", events_dir=root / "P" / "events", synchronous=synchronous)
    ea, eb = Endpoint.org(A), Endpoint.org(B)
    roles = {k: Role(k, profile == k) for k in ("A", "P", "B")}
    body = b"x" * 1024
    for i in range(0, n, 1000):
        a.accept([NewDocument(target=B, app_data=body, app_key=AppKey(domain="trade", data_type="ORDER"),
                              save_fwd=SaveFwd.MUST_DELIVER, ack2=True, encrypt=secure)
                  for _ in range(min(1000, n - i))])

    def frames(data: list[bytes]) -> list[Any]:
        d = FrameDecoder(max_frame_size=64 << 20)
        d.receive_data(b"".join(data))
        return list(d)

    def certs(core: NodeCore, missing: set[Any]) -> None:
        assert psec is not None and core.sec is not None
        for ep in missing:
            core.sec.directory.apply_cert_response(psec.directory.cert_response(ep))
            core.sec.remember(ep.node_id)

    to: dict[str, list[bytes]] = defaultdict(list)  # bytes waiting for "A", "B", "P<-A", "P<-B"
    deferred: list[Any] = []
    b_online = not drain
    if drain:
        # B offline: everything is stored (not timed), then B "connects".
        while True:
            out = a.claim(BATCH)
            if out.missing:
                certs(a, out.missing)
                continue
            if not out.data:
                break
            pout = p.handle(ea, frames(out.data), {ea: ROOM})
            a.handle(frames(pout.sends.get(ea, [])))
        b_online = True
        p.connected(eb)
    t0 = time.perf_counter()
    rounds = 0
    while True:
        rounds += 1
        moved = False
        if drain:
            copies, _n = roles["P"].run(p.claim_stored, eb, BATCH)
            if copies:
                to["B"] += copies
                moved = True
        out = roles["A"].run(a.claim, BATCH)
        if out.missing:
            certs(a, out.missing)
            out = roles["A"].run(a.claim, BATCH)
        if out.data:
            to["P<-A"] += out.data
            moved = True
        for src, ep in (("P<-A", ea), ("P<-B", eb)):
            if to[src]:
                raw, to[src] = frames(to[src]), []
                pout = roles["P"].run(p.handle, ep, raw, {ea: ROOM, eb: ROOM} if b_online else {ea: ROOM})
                to["A"] += pout.sends.get(ea, [])
                to["B"] += pout.sends.get(eb, [])
                moved = True
        for name, core, back in (("B", b, "P<-B"), ("A", a, "P<-A")):
            if to[name] or (name == "B" and deferred):
                raw, to[name] = frames(to[name]), []
                if name == "B":
                    raw, deferred = deferred + raw, []
                nout = roles[name].run(core.handle, raw)
                if nout.missing:
                    certs(core, nout.missing)
                deferred += nout.deferred
                to[back] += nout.data
                moved = True
        if not moved:
            left = a.conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
            if left == 0:
                break
            out = roles["A"].run(a.inquiries)  # nothing moving: only inquiries can help
            to["P<-A"] += out.data
            if not out.data:
                raise SystemExit(f"stuck with {left} documents in A's outbox after {rounds} rounds")
    total = time.perf_counter() - t0
    inbox = b.conn.execute("SELECT count(*) FROM inbox").fetchone()[0]
    if inbox != n:
        raise SystemExit(f"B's inbox holds {inbox} documents, not {n}")
    for c in (a, b, p):
        c.close()
    if profile:
        prof = roles[profile].prof
        assert prof is not None
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(_TOP)
        print(f"--- cProfile of role {profile} (security {'on' if secure else 'off'}), by own time")
        print("\n".join(s.getvalue().splitlines()[:_TOP + 12]))
    return {"n": n, "total": total, "roles": roles}


_TOP = 25


def _daemon_gc() -> str:
    """The cyclic collector as the daemons run it (semq.cli.tune_gc), so the
    figures are what a daemon pays. Returns the table's note about it."""
    import importlib
    import os

    try:
        for mod in ("semq.node.core", "semq.platform.core"):  # start-up's objects, frozen as a daemon's are
            importlib.import_module(mod)
        from semq.cli import tune_gc
    except ImportError:  # an older tree (comparisons by PYTHONPATH) has no tune_gc
        return "cyclic GC: Python's defaults (this semq has no tune_gc)"
    tune_gc()
    if os.environ.get("SEMQ_GC_DEFAULTS") == "1":
        return "cyclic GC: Python's defaults (SEMQ_GC_DEFAULTS=1)"
    return "cyclic GC tuned as in the daemons (semq.cli.tune_gc; SEMQ_GC_DEFAULTS=1 for Python's defaults)"


def main(argv: list[str] | None = None) -> int:
    global _TOP
    ap = argparse.ArgumentParser(prog="scripts/bench pipeline", description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--security", choices=["on", "off", "both"], default="both")
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"])
    ap.add_argument("--profile", choices=["A", "P", "B"])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--drain", action="store_true",
                    help="B offline while A sends (not timed), then the platform delivers the stored copies")
    a = ap.parse_args(argv)
    _TOP = a.top
    gc_note = _daemon_gc()
    modes = {"on": [True], "off": [False], "both": [False, True]}[a.security]
    rows = []
    results = {}
    for secure in modes:
        tmp = Path(tempfile.mkdtemp(prefix="semq-pipeline-"))
        try:
            print(f"running {a.docs:,} documents, security {'on' if secure else 'off'} ...", file=sys.stderr)
            r = run_once(tmp, a.docs, secure, a.synchronous, a.profile, a.drain)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        results[secure] = r
        n = r["n"]
        for name in ("A", "P", "B"):
            ro = r["roles"][name]
            rows.append(["on" if secure else "off", name, f"{ro.wall / n * 1e6:.1f}", f"{ro.cpu / n * 1e6:.1f}",
                         f"{n / ro.wall:,.0f}", ro.calls])
        rows.append(["on" if secure else "off", "all", f"{r['total'] / n * 1e6:.1f}", "", f"{n / r['total']:,.0f}",
                     ""])
    notes = [f"{a.docs:,} documents of 1 KiB, SaveFwd 3, Ack2; synchronous={a.synchronous}; one thread, no sockets;"
             + (" drain: stored while B was offline, then delivered" if a.drain else " online: forwarded"),
             "us/doc: wall (incl. fsync) and CPU time spent in that role's core calls, per document;"
             " docs/s: what that role alone could sustain (1 / its wall time)", gc_note]
    if len(results) == 2:
        notes.append(f"security on / off (all roles): {results[False]['total'] / results[True]['total']:.0%}")
    print_table("SEMQ cores in process" + (" (drain)" if a.drain else ""), ["security", "role", "wall us/doc", "cpu us/doc", "docs/s", "calls"],
                rows, notes)
    return 0
