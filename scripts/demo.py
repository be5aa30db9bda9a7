#!/usr/bin/env python3
"""The SEMQ demo: the real thing, locally, in a temporary directory.

A platform relay P and two organizations, 10008 (A) and 56001 (B), run as real
``semq`` processes on 127.0.0.1 (a free port). B is offline at first. A sends
the SEMQ example order S0001 (trade/ORDER/PO/S0001) and a few invoices and
receipts with different SaveFwd modes; the SaveFwd=1 one is dropped by the
platform (B is offline) and A is told. B comes up, the stored documents
arrive, B answers with an order response that travels the online path, the
tables clean up, and a delivery summary is computed from the JSON-lines event
logs (docs/events.md).

Every wait is bounded; the daemons are stopped with SIGTERM (killed if they do
not exit); the directory is removed unless ``--keep``. Exit 0 when everything
arrived exactly once and every table is clean; 1 with a message naming what
did not happen otherwise.

Usage: scripts/demo [--keep] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

A, B = "10008", "56001"
SEMQ = [sys.executable, "-m", "semq"]



@dataclass(frozen=True)
class Doc:
    file: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    ack2: bool
    content: bytes

    def options(self) -> list[str]:
        return ["--type", self.data_type, "--domain", "trade", "--subtype", self.subtype, "--key", self.key,
                "--save-fwd", str(self.save_fwd), "--ack2" if self.ack2 else "--no-ack2"]


# What A sends while B is offline.
DOCUMENTS = [
    # The SEMQ example: must be delivered (SaveFwd 3), confirmed end to end.
    Doc("order-S0001.xml", "ORDER", "PO", "S0001", 3, True,
        b'<order id="S0001" buyer="10008" seller="56001">\n'
        b'  <line sku="BOLT-M8" qty="500" price="0.12"/>\n'
        b'  <line sku="NUT-M8" qty="500" price="0.05"/>\n'
        b"</order>\n"),
    # Stored by the platform while B is offline; Ack2 still asked.
    Doc("invoice-INV-0042.xml", "INVOICE", "COMMERCIAL", "INV-0042", 2, True,
        b'<invoice id="INV-0042" order="S0000" total="310.00" currency="EUR"/>\n'),
    # Stored, no Ack2: A is done with it once the platform has stored it.
    Doc("receipt-RCT-0007.xml", "RECEIPT", "GOODS", "RCT-0007", 2, False,
        b'<receipt id="RCT-0007" order="S0000" received="2026-11-20"/>\n'),
    # SaveFwd 1: only if B is online now. It is not: dropped, and A is told.
    Doc("price-PRC-0001.xml", "PRICE", "UPDATE", "PRC-0001", 1, False,
        b'<price sku="BOLT-M8" price="0.11" valid-from="2026-12-01"/>\n'),
]
STORED = sum(d.save_fwd >= 2 for d in DOCUMENTS)
# What B answers once it is online: travels the online path (ACK_FWD).
REPLY = Doc("ordrsp-S0001.xml", "ORDRSP", "PO", "S0001", 3, True,
            b'<order-response order="S0001" status="accepted" ship-date="2026-11-25"/>\n')


class DemoError(Exception):
    """Something did not happen in time: the message says what."""


# ---------------------------------------------------------------- output


def say(step: str) -> None:
    print(f"\n==> {step}", flush=True)


def show(text: str) -> None:
    for line in text.rstrip("\n").splitlines():
        print(f"    {line}")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    raise DemoError(f"timed out after {timeout:g} s waiting for {what} (last seen: {last!r})")


class Demo:
    def __init__(self, root: Path, timeout: float) -> None:
        self.root = root
        self.timeout = timeout
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {k: v for k, v in os.environ.items() if k != "SEMQ_DIR"}
        self.env["PYTHONUNBUFFERED"] = "1"

    # -- the CLI, as a user runs it (cwd = the demo directory)

    def semq(self, *args: str, echo: bool = True, stderr: bool = False) -> str:
        """Run the CLI; show the command and its stdout (and stderr if asked)."""
        if echo:
            print(f"    $ semq {shlex.join(args)}", flush=True)
        r = subprocess.run([*SEMQ, *args], cwd=self.root, env=self.env, capture_output=True, timeout=30)
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        if r.returncode != 0:
            raise DemoError(f"'semq {shlex.join(args)}' exited {r.returncode}: {err.strip() or out.strip()}")
        if echo:
            show(out + (err if stderr else ""))
        return out

    def security(self) -> bool:
        """Does this semq run the daemons with certificates (``node init
        --enroll-from``)? Then the demo uses it, as a real deployment would."""
        return "--enroll-from" in self.semq("node", "init", "--help", echo=False)

    def start(self, name: str, *args: str, ready: str) -> None:
        print(f"    $ semq {shlex.join(args)} &", flush=True)
        log = self.root / f"{name}.log"
        with log.open("ab") as f:
            p = subprocess.Popen([*SEMQ, *args], cwd=self.root, env=self.env, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        wait_until(lambda: ready in log.read_text(errors="replace") or p.poll() is not None,
                   self.timeout, f"{name} to start")
        if p.poll() is not None:
            raise DemoError(f"{name} exited with {p.returncode} at start:\n{self.log_tail(name)}")
        show(f"[pid {p.pid}] {ready}... (log: {log.name})")

    def stop(self, name: str) -> int:
        """SIGTERM, wait up to 10 s, then SIGKILL. Returns the exit code."""
        p = self.procs.pop(name)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                return p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
                return -9
        return p.returncode

    def stop_all(self) -> None:
        for name in list(self.procs):
            try:
                self.stop(name)
            except Exception as e:  # never leave a process behind because of another's failure
                print(f"    (could not stop {name}: {e})", file=sys.stderr)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.root / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise DemoError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")

    # -- read-only looks into the stores (polling; the CLI shows them to the user)

    def q(self, who: str, sql: str) -> list[tuple[Any, ...]]:
        self.check_alive()
        name = "platform.sqlite" if who == "P" else "node.sqlite"
        c = sqlite3.connect(f"file:{self.root / who / name}?mode=ro", uri=True, timeout=5)
        try:
            return c.execute(sql).fetchall()
        finally:
            c.close()

    def wait(self, pred: Callable[[], Any], what: str) -> Any:
        return wait_until(pred, self.timeout, what)

    def online(self) -> list[str]:
        """Organizations connected to the relay (from ``semq status --json``)."""
        self.check_alive()
        live = json.loads(self.semq("status", "--dir", "P", "--json", echo=False))["daemon"]
        return list(live.get("online", [])) if live else []


# ---------------------------------------------------------------- the event logs


def read_events(*dirs: Path) -> list[dict[str, Any]]:
    events = []
    for d in dirs:
        for f in sorted(d.glob("events-*.jsonl")):
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    events.append(json.loads(line))
    return events


def delivery_summary(events: list[dict[str, Any]]) -> tuple[list[list[str]], int]:
    """Per document (LK0): the path it took and the milliseconds after A (or
    B) queued it at which it reached each step. All processes share this
    machine's clock, so cross-process legs need no skew correction here
    (``semq report latency`` estimates it for real deployments).
    Returns (rows, documents that reached the receiver's inbox)."""
    docs: dict[str, dict[str, Any]] = {}
    for e in events:
        lk0 = e.get("lk0")
        if not lk0:
            continue
        d = docs.setdefault(lk0, {"first": {}})
        key = (e["role"], e["event"])
        d["first"].setdefault(key, e["ts"])  # first occurrence of each event
        for k in ("domain", "data_type", "subtype", "key", "save_fwd", "ack2", "source", "target", "code"):
            if k in e and k not in d:
                d[k] = e[k]
    rows = []
    arrived = 0
    for lk0, d in sorted(docs.items(), key=lambda kv: kv[1]["first"].get(("origin", "queued"), 0)):
        t = d["first"]
        t0 = t.get(("origin", "queued"))
        if t0 is None:
            continue

        def at(*keys: tuple[str, str], t=t, t0=t0) -> str:
            for k in keys:
                if k in t:
                    return f"{t[k] - t0:,}"
            return "-"

        if ("platform", "stored") in t:
            path = "stored"
        elif ("platform", "forwarded") in t:
            path = "forwarded"
        elif ("origin", "nack") in t or ("platform", "dropped") in t:
            path = f"dropped ({d.get('code', '?')})"
        else:
            path = "?"
        if ("receiver", "inbox") in t:
            arrived += 1
        rows.append([
            lk0, f"{d['source']}->{d['target']}", f"{d.get('data_type')}/{d.get('key')}",
            str(d.get("save_fwd", "?")), "yes" if d.get("ack2") else "no", path,
            at(("origin", "sent")),
            at(("origin", "ack_save"), ("origin", "ack_fwd"), ("origin", "nack")),
            at(("platform", "delivered"), ("platform", "forwarded")),
            at(("receiver", "inbox")),
            at(("origin", "ack2")),
        ])
    return rows, arrived


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.rjust(w) if c[:1].isdigit() or c == "-" else c.ljust(w)
                        for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- the story


def run(demo: Demo, keep: bool) -> None:
    root = demo.root
    secure = demo.security()
    if secure:
        say(f"1. A platform with its certificate authority, and two organizations enrolled with it, in {root}")
    else:
        say(f"1. A platform and two organizations in {root} (relay on 127.0.0.1:{demo.port})")
    demo.semq("platform", "init", "--dir", "P", "--listen", f"127.0.0.1:{demo.port}")
    for org, d in ((A, "A"), (B, "B")):
        # --enroll-from: the platform's directory is on this machine, so the
        # certificate request is signed at once (otherwise: platform enroll
        # + node import, docs/cli.md).
        demo.semq("node", "init", "--dir", d, "--org", org, "--platform", f"127.0.0.1:{demo.port}",
                  *(["--enroll-from", "P"] if secure else []))
    if not secure:
        demo.semq("platform", "register", "--dir", "P", A, B)

    say("2. The relay and organization 10008 (A) start" + (" (mutual TLS 1.3)" if secure else "")
        + "; 56001 (B) stays offline for now")
    demo.start("platform", "platform", "run", "--dir", "P", "--inquiry-interval", "1", ready="listening on")
    demo.start("A", "node", "run", "--dir", "A", "--inquiry-interval", "1", ready="running")
    demo.wait(lambda: A in demo.online(), "A to connect to the platform")

    say("3. A sends the order S0001, an invoice, a receipt and a price update (SaveFwd 3, 2, 2, 1)")
    lk0s = []
    for i, doc in enumerate(DOCUMENTS):
        (root / doc.file).write_bytes(doc.content)
        # The first one without -q: what send says on stderr.
        lk0s.append(demo.semq("send", "--dir", "A", "--to", B, *doc.options(), *(["-q"] if i else []), doc.file,
                              stderr=not i).strip())

    say("4. P stores the SaveFwd 2|3 documents for B (ACK_SAVE to A) and drops the SaveFwd=1 one, telling A (NACK 301)")
    demo.wait(lambda: demo.q("P", "SELECT count(*) FROM stored WHERE kind=1")[0][0] == STORED,
              f"{STORED} documents stored at the platform")
    demo.wait(lambda: demo.q("A", "SELECT count(*) FROM outbox WHERE state=9")[0][0] == 1,
              "A to learn that the SaveFwd=1 price update was dropped")
    demo.wait(lambda: demo.q("A", "SELECT count(*) FROM outbox WHERE state IN (0, 1)")[0][0] == 0,
              "every document of A acknowledged by the platform")
    time.sleep(1.1)  # let the daemons' status files (written every second) catch up
    demo.semq("status", "--dir", "A")
    demo.semq("messages", "--dir", "A")
    show("(SS_ACK: stored by P, waiting for B's end-to-end ACK2; the receipt asked no ACK2 and is done;")
    show(" SS_FAILED 301: target offline and SaveFwd=1, so P discarded it and told A)")
    demo.semq("status", "--dir", "P")
    show("(relayed acks/inquiries waiting: A's questions to B about its documents, held for B like")
    show(" any SaveFwd 3 message until B connects)")
    if secure:
        # The relay stores what it cannot read: the order's text is nowhere in its files.
        files = [f for f in (root / "P").iterdir() if f.name.startswith("platform.sqlite")]
        leaked = [f.name for f in files if b"BOLT-M8" in f.read_bytes()]
        if leaked:
            raise DemoError(f"the order's plaintext is readable in the platform's {', '.join(leaked)}")
        show(f"P holds the order sealed: 'BOLT-M8' (from its text) is in none of {', '.join(f.name for f in files)}")

    say("5. B comes online: P delivers the stored documents (with LK1), B acks P and sends ACK2 to A")
    demo.start("B", "node", "run", "--dir", "B", "--inquiry-interval", "1", ready="running")
    demo.wait(lambda: demo.q("B", "SELECT count(*) FROM inbox")[0][0] >= STORED, f"{STORED} documents in B's inbox")
    demo.semq("inbox", "--dir", "B")
    demo.semq("inbox", "--dir", "B", "show", "1")

    say("6. B confirms the order to A while both are online: forwarded at once (ACK_FWD), no copy stored")
    (root / REPLY.file).write_bytes(REPLY.content)
    demo.semq("send", "--dir", "B", "--to", A, *REPLY.options(), "-q", REPLY.file)
    demo.wait(lambda: demo.q("A", "SELECT count(*) FROM inbox")[0][0] == 1, "B's order response in A's inbox")
    demo.semq("inbox", "--dir", "A")

    say("7. Everything confirmed end to end: pending-send, pending-ack and stored tables clean up")
    demo.wait(lambda: demo.q("A", "SELECT count(*) FROM outbox WHERE state != 9")[0][0] == 0
              and demo.q("B", "SELECT count(*) FROM outbox")[0][0] == 0
              and demo.q("A", "SELECT count(*) FROM inbound")[0][0] == 0
              and demo.q("B", "SELECT count(*) FROM inbound")[0][0] == 0
              and demo.q("P", "SELECT count(*) FROM stored")[0][0] == 0, "cleanup on A, B and P")
    time.sleep(1.1)
    for d in ("A", "B", "P"):
        demo.semq("status", "--dir", d)
    show("(A keeps the failed row for 7 days so its user can see it; dedup rows stay 30 days: docs/exactly-once.md)")
    if secure:
        show("A keeps B's signed delivery receipt for the order:")
        demo.semq("messages", "--dir", "A", "--receipt", lk0s[0])

    # Exactly once: every document B's inbox holds is distinct and byte-identical.
    got = demo.q("B", "SELECT key, app_data, count(*) FROM inbox GROUP BY origin_id, record_id")
    want = {d.key: d.content for d in DOCUMENTS if d.save_fwd >= 2}
    if len(got) != STORED or any(n != 1 for *_, n in got) or {k: bytes(v) for k, v, _ in got} != want:
        raise DemoError(f"B's inbox does not hold the {STORED} documents exactly once: {[(k, n) for k, _, n in got]}")

    say("8. The daemons stop on SIGTERM (exit 0) and the delivery summary is read from the event logs")
    for name in ("B", "A", "platform"):
        rc = demo.stop(name)
        show(f"{name}: exit {rc}")
        if rc != 0:
            raise DemoError(f"{name} exited {rc} after SIGTERM (expected 0):\n{demo.log_tail(name)}")
    logs = [root / d / "events" for d in ("A", "P", "B")]
    rows, arrived = delivery_summary(read_events(*logs))
    show("milliseconds after the document was queued at its origin (one machine, one clock):")
    show(table(["LK0", "from->to", "document", "SF", "Ack2", "path", "sent", "P acked", "delivered",
                "inbox", "ACK2"], rows))
    show("(the stored documents waited for B to come online; the forwarded one shows the online path)")
    if arrived != STORED + 1:
        raise DemoError(f"the event logs show {arrived} documents in an inbox, expected {STORED + 1}")

    say("9. Next: the Spark delivery-latency report over the same logs (docs/analytics.md)")
    cmd = ["semq", "report", "latency", "--logs", *map(str, logs), "--format", "text"]
    show("$ " + shlex.join(cmd))
    if not keep:
        show("(this directory is removed now; run scripts/demo --keep to keep the logs for it)")

    print(f"\ndemo OK: {STORED + 1} documents delivered exactly once, 1 dropped as asked (SaveFwd=1, "
          "target offline) and reported to the sender; every table clean.", flush=True)


def _interrupted(signum: int, frame: object) -> None:
    # SIGTERM (a test's timeout, a supervisor) must still stop the daemons
    # and remove the directory: unwind like Ctrl-C.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--keep", action="store_true", help="keep the demo directory (stores, logs, event logs)")
    p.add_argument("--timeout", type=float, default=20.0, help="limit of each wait, seconds (default 20)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="semq-demo-"))
    demo = Demo(root, args.timeout)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        run(demo, args.keep)
    except DemoError as e:
        print(f"\ndemo FAILED: {e}", file=sys.stderr)
        for name in list(demo.procs):
            print(f"--- last lines of {name}.log:\n{demo.log_tail(name)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo interrupted", file=sys.stderr)
        return 130
    finally:
        demo.stop_all()
        if args.keep:
            print(f"(kept {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"(took {time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
