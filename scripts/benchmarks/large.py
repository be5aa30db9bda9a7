#!/usr/bin/env python3
"""Large documents: MB/s, CPU and peak RSS of every process at 10 MiB, 100 MiB and 1 GiB, beside the disk and loopback rates.

One run, security on (mutual TLS 1.3, documents sealed and signed, as
deployed): a platform, node A (organization 10008, the origin) and node B
(56001, the receiver), real ``semq ... run`` processes on 127.0.0.1 with
their data directories in one fresh directory (``--keep DIR``: there, kept).

- **Baselines**, measured first in the same run: the disk's sequential
  write rate in the filesystem of the data directories (``--baseline-mib``,
  default the largest size, in 8 MiB ``os.write`` blocks, then ``fsync``,
  which is counted; the file is deleted), the loopback TCP rate (the same
  amount over a plain 127.0.0.1 socket from this process to another, in
  1 MiB sends; the receiver answers one byte when it has everything) and the
  same over TLS 1.3 (a self-signed P-256 certificate made with
  ``cryptography``, as SEMQ's links are TLS; ``--no-tls`` leaves it out).
- **Warm-up**: one 1 KiB document A -> B delivered (the certificates are
  exchanged) before anything is timed.
- **Fairness, baseline**: 1 KiB documents at ``--small-rate``/s for
  ``--small-seconds`` s (``NodeClient(A).send`` from a thread), no large
  transfer; latency = B's inbox ``received_ms`` - the document's
  ``created_ms`` (when A accepted it; both in B's inbox row, one clock).
- **Each size** (``--sizes`` in MiB, ascending): a fresh file of random
  bytes (``--content mixed``: half random, half one repeated byte, per MiB),
  written and fsynced before the clock starts. The clock runs from the start
  of ``python -m semq send --dir A --to 56001 FILE`` (the real CLI, a child
  process) to B's inbox row appearing (B's store polled read-only every
  20 ms). send s = until the command returned (the copy into A's data
  directory, fsynced, for a large document); transfer = from then to the
  inbox row. CPU = utime + stime of each daemon from /proc/PID/stat over
  that interval, and of the ``semq send`` child from ``os.wait4``. Peak
  RSS: each daemon's VmHWM is reset (``5`` into /proc/PID/clear_refs) before
  the size and read once A has its ACK2; the child's is its ru_maxrss. The
  delivered content's SHA-256 is checked against the source's afterwards
  (not timed). Files over ``large_from_mib`` (4 MiB by default) travel as a
  large document in 1 MiB chunks; smaller ones as one frame.
- **Fairness, during the largest**: the same stream of 1 KiB documents from
  just after the largest ``semq send`` returns until its document is in B's
  inbox; how many of them arrived before it, and their latency.

Aims (reported, never a failure): every process under 150 MiB peak RSS and
flat across sizes (constant memory); the largest size's end-to-end MB/s at
least 50% of the disk's write rate. MB = 10^6 bytes.

Usage: scripts/bench large [--sizes 10,100,1024 | --quick] [--content random|mixed]
                           [--small-rate N] [--small-seconds S] [--baseline-mib N] [--no-tls]
                           [--timeout S] [--keep DIR] [--json] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

if __package__:
    from . import e2e
    from ._proc import cpu_seconds, parent_pid
    from ._table import machine_facts, print_table
else:  # run as a file: python scripts/benchmarks/large.py
    import e2e  # type: ignore[no-redef]
    from _proc import cpu_seconds, parent_pid  # type: ignore[no-redef]
    from _table import machine_facts, print_table  # type: ignore[no-redef]

BenchError = e2e.BenchError

MIB: Final = 1 << 20
MB: Final = 1_000_000
A, B = e2e.A, e2e.B
DAEMONS: Final = ("P", "A", "B")
PROCS: Final = (*DAEMONS, "send")
DEFAULT_SIZES: Final = (10, 100, 1024)
QUICK_SIZES: Final = (10, 100)
DEFAULT_TIMEOUT: Final = 120.0  # s, each wait; delivery gets 1 s more per MiB
PER_MIB_S: Final = 1.0
POLL_S: Final = 0.02  # B's store is asked this often for the inbox row
DISK_BLOCK: Final = 8 * MIB
NET_BLOCK: Final = MIB
SMALL_BYTES: Final = 1024
DEFAULT_SMALL_RATE: Final = 20.0
DEFAULT_SMALL_SECONDS: Final = 5.0
LARGE_TYPE: Final = "BLOB"
SMALL_TYPE: Final = "ORDER"

# Aims (docs/design-large-documents.md): reported, never a failure.
AIM_RSS_MIB: Final = 150.0
AIM_DISK_SHARE: Final = 0.50
# Peak RSS "flat": at the largest size at most this much above its lowest
# at a smaller chunked size (two windows of chunks in flight: 2 x 8 MiB).
FLAT_MIB: Final = 16.0


def _log(msg: str) -> None:
    print(f"[large] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- /proc


def vm_kib(pid: int, field: str) -> int | None:
    """A ``Vm*`` line of /proc/PID/status (VmHWM, VmRSS), KiB; None once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current RSS (Linux >= 4.0)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def helpers(daemons: dict[str, int]) -> dict[str, int]:
    """The daemons' child processes (the delivery history's indexers,
    ``python -m semq.tracking.history``), as "NAME/child-PID"."""
    out: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = parent_pid(int(entry))
            for name, pid in daemons.items():
                if parent == pid:
                    out[f"{name}/child-{entry}"] = int(entry)
    return out


def filesystem_of(path: Path) -> str:
    """The mount point and type of the filesystem holding ``path``."""
    best = ("", "?")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "?"
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
            best = (mnt, parts[2])
    return f"{best[1]} at {best[0]}" if best[0] else "?"


# ---------------------------------------------------------------- files


def write_source(path: Path, mib: int, content: str) -> str:
    """A fresh file of ``mib`` MiB, fsynced; its SHA-256 (hex). ``random``:
    incompressible; ``mixed``: each MiB half random, half one repeated byte."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(mib):
            block = (os.urandom(MIB) if content == "random"
                     else os.urandom(MIB // 2) + bytes([i % 251]) * (MIB // 2))
            h.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(MIB):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- baselines


def disk_write(directory: Path, mib: int) -> dict[str, Any]:
    """Sequential write of ``mib`` MiB in 8 MiB blocks, then fsync: MB/s with
    the fsync. The file is deleted."""
    path = directory / "disk-baseline.bin"
    block = memoryview(os.urandom(DISK_BLOCK))
    total = mib * MIB
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        left = total
        while left:
            view = block[:min(left, DISK_BLOCK)]
            left -= len(view)
            while view:
                view = view[os.write(fd, view):]
        written = time.perf_counter()
        os.fsync(fd)
        t1 = time.perf_counter()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"mib": mib, "seconds": t1 - t0, "fsync_s": t1 - written, "mb_s": total / (t1 - t0) / MB}


# The loopback receiver, another process (as the daemons are): listen on
# 127.0.0.1, print the port, take one connection (TLS 1.3 when a certificate
# is given), receive TOTAL bytes, answer one byte, print what it got.
_RECEIVER: Final = r"""
import socket, ssl, sys
total, timeout, cert, key = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
srv.settimeout(timeout)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(timeout)
if cert:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    conn = ctx.wrap_socket(conn, server_side=True)
view = memoryview(bytearray(1 << 20))
got = 0
while got < total:
    n = conn.recv_into(view)
    if not n:
        break
    got += n
conn.sendall(b"k")
print(got, flush=True)
conn.close()
"""


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A P-256 key and a self-signed certificate for 127.0.0.1 (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "semq-bench-loopback")])
    now = _dt.datetime.now(_dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "loopback-cert.pem", directory / "loopback-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return cert_file, key_file


def loopback(mib: int, timeout: float, tls: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """``mib`` MiB from this process to another over 127.0.0.1 in 1 MiB
    sends (TLS 1.3 with ``tls``: certificate and key files); timed from the
    first send (after the handshake) to the receiver's one-byte answer."""
    total = mib * MIB
    cert, key = (str(tls[0]), str(tls[1])) if tls else ("", "")
    p = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(total), str(timeout), cert, key],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        line = p.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            raise BenchError(f"the loopback receiver did not say its port within {timeout:g} s ({line!r})")
        block = os.urandom(NET_BLOCK)
        with socket.create_connection(("127.0.0.1", int(line)), timeout=timeout) as raw:
            raw.settimeout(timeout)
            s: socket.socket = raw
            if tls:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
                ctx.load_verify_locations(cert)
                s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            t0 = time.perf_counter()
            left = total
            while left:
                n = min(left, NET_BLOCK)
                s.sendall(block[:n] if n < NET_BLOCK else block)
                left -= n
            if s.recv(1) != b"k":
                raise BenchError("the loopback receiver closed before it had every byte")
            secs = time.perf_counter() - t0
            suite = s.cipher() if isinstance(s, ssl.SSLSocket) else None
            cipher = suite[0] if suite else ""
            with contextlib.suppress(OSError):
                s.close()
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"the loopback receiver did not end within {timeout:g} s") from None
        if p.returncode or int((out.strip().splitlines() or ["0"])[-1]) != total:
            raise BenchError(f"the loopback receiver exited {p.returncode}: {err.strip()[-500:]}")
    finally:
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=10)
    return {"mib": mib, "seconds": secs, "mb_s": total / secs / MB, "cipher": cipher}


def baselines(scratch: Path, mib: int, tls: bool, timeout: float) -> dict[str, Any]:
    _log(f"baseline: disk sequential write, {mib} MiB in {DISK_BLOCK // MIB} MiB blocks + fsync")
    out: dict[str, Any] = {"disk_write": disk_write(scratch, mib)}
    _log(f"baseline: loopback TCP, {mib} MiB in 1 MiB sends")
    out["loopback_tcp"] = loopback(mib, timeout)
    out["loopback_tls"] = None
    if tls:
        _log(f"baseline: loopback TLS 1.3, {mib} MiB in 1 MiB sends")
        out["loopback_tls"] = loopback(mib, timeout, self_signed(scratch))
    return out


# ---------------------------------------------------------------- B's inbox


class Inbox:
    """B's store, read-only, one connection (each query is a new read
    transaction: it sees what B committed)."""

    def __init__(self, path: Path) -> None:
        self.c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)

    def row(self, key: str) -> tuple[Any, ...] | None:
        """(id, size, path, created_ms, received_ms, record_id) of the document of AppKey ``key``."""
        r = self.c.execute("SELECT id, size, path, created_ms, received_ms, record_id FROM inbox"
                           " WHERE key=? AND data_type=?", (key, LARGE_TYPE)).fetchone()
        return tuple(r) if r is not None else None

    def app_data(self, row_id: int) -> bytes:
        r = self.c.execute("SELECT app_data FROM inbox WHERE id=?", (row_id,)).fetchone()
        return bytes(r[0]) if r is not None else b""

    def small(self, prefix: str) -> dict[str, tuple[int, int]]:
        """{key: (created_ms, received_ms)} of the small documents whose key starts with ``prefix``."""
        rows = self.c.execute("SELECT key, created_ms, received_ms FROM inbox WHERE data_type=? AND"
                              " substr(key, 1, ?)=?", (SMALL_TYPE, len(prefix), prefix)).fetchall()
        return {k: (int(c), int(r)) for k, c, r in rows}

    def close(self) -> None:
        self.c.close()


# ---------------------------------------------------------------- small documents


class SmallStream:
    """1 KiB documents A -> B at ``rate``/s from a thread (``NodeClient(A).send``,
    one transaction each), keys ``PREFIX-00000``..., until ``stop``."""

    def __init__(self, node_dir: Path, rate: float, prefix: str) -> None:
        self.node_dir = node_dir
        self.rate = rate
        self.prefix = prefix
        self.sent: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"small-{prefix}", daemon=True)
        self.started = 0.0
        self.stopped = 0.0

    def start(self) -> SmallStream:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        from semq.node.api import NodeClient

        try:
            with NodeClient(self.node_dir) as node:
                i = 0
                while not self._stop.is_set():
                    if self._stop.wait(max(0.0, self.started + i / self.rate - time.monotonic())):
                        break
                    key = f"{self.prefix}-{i:05d}"
                    head = f"<order id='{key}'>".encode()
                    node.send(B, head + b"x" * (SMALL_BYTES - len(head)), data_type=SMALL_TYPE, key=key)
                    self.sent.append(key)
                    i += 1
        except BaseException as e:  # reported by check / stop
            self.error = e

    def check(self) -> None:
        if self.error is not None:
            raise BenchError(f"the stream of small documents failed: {type(self.error).__name__}: {self.error}")

    def stop(self) -> None:
        """Stop and wait for the thread (at most 30 s: one send in progress)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self.stopped = time.monotonic()
        if self._thread.is_alive():
            raise BenchError("the stream of small documents did not stop within 30 s (a send hangs)")
        self.check()


def small_figures(inbox: Inbox, prefix: str, sent: Sequence[str], seconds: float, timeout: float,
                  c: e2e.Cluster, large_received_ms: int | None = None) -> dict[str, Any]:
    """Wait until every document ``sent`` (keys starting with ``prefix``)
    is in B's inbox; their latencies (received_ms - created_ms) and, with
    ``large_received_ms``, how many arrived before the large document."""
    want = set(sent)

    def arrived() -> list[dict[str, tuple[int, int]]] | None:
        c.alive()
        got = inbox.small(prefix)
        return [got] if want <= set(got) else None  # (in a list: true when none was sent)

    got = e2e._wait(arrived, timeout, f"the {len(want)} small documents '{prefix}-*' in B's inbox", 0.1)[0]
    lat = sorted(float(r - cr) for k, (cr, r) in got.items() if k in want)
    out: dict[str, Any] = {
        "sent": len(want), "delivered": len(lat), "seconds": seconds,
        "p50_ms": e2e.percentile(lat, 50) if lat else None, "p99_ms": e2e.percentile(lat, 99) if lat else None,
        "max_ms": max(lat) if lat else None, "mean_ms": statistics.fmean(lat) if lat else None,
    }
    if large_received_ms is not None:
        out["before_large"] = sum(1 for k, (_, r) in got.items() if k in want and r <= large_received_ms)
    return out


def stream_figures(inbox: Inbox, stream: SmallStream, timeout: float, c: e2e.Cluster,
                   large_received_ms: int | None = None) -> dict[str, Any]:
    return small_figures(inbox, stream.prefix, stream.sent, stream.stopped - stream.started, timeout, c,
                         large_received_ms)


# ---------------------------------------------------------------- one size


def _events_of(directory: Path, event: str, lk0: str) -> dict[str, Any] | None:
    for f in sorted(directory.glob("events-*.jsonl")):
        with f.open(encoding="utf-8") as fh:
            for line in fh:
                if f'"event":"{event}"' in line and lk0 in line:
                    e = json.loads(line)
                    if e.get("event") == event and e.get("lk0") == lk0:
                        return dict(e)
    return None


def measure_size(c: e2e.Cluster, inbox: Inbox, mib: int, a: argparse.Namespace, large_from_mib: int,
                 fairness: bool) -> dict[str, Any]:
    """One document of ``mib`` MiB, A -> B, timed (module docstring)."""
    root = c.root
    src = root / "src" / f"doc-{mib}MiB.bin"
    src.parent.mkdir(exist_ok=True)
    _log(f"{mib} MiB: writing a fresh file of {a.content} bytes")
    sha = write_source(src, mib, a.content)
    size = mib * MIB
    key = f"LARGE-{mib}MiB-{int(time.time() * 1000)}"
    pids = {n: c.procs[n].pid for n in DAEMONS}
    kids = helpers(pids)
    reset = all(reset_peak(pid) for pid in pids.values())
    for pid in kids.values():
        reset_peak(pid)
    rss_before = {n: (vm_kib(pid, "VmRSS") or 0) / 1024 for n, pid in pids.items()}
    cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
    kids_cpu0 = {n: cpu_seconds(pid) for n, pid in kids.items()}
    cmd = [*e2e.SEMQ, "send", "--dir", str(root / "A"), "--to", B, "--type", LARGE_TYPE, "--key", key, "-q",
           str(src)]
    waited: dict[str, Any] = {}

    def wait_child(pid: int) -> None:
        _, status, ru = os.wait4(pid, 0)
        waited.update(at=time.monotonic(), status=status, ru=ru)

    stream: SmallStream | None = None
    row: tuple[Any, ...] | None = None
    delivered = 0.0
    name = f"send-{mib}MiB"
    _log(f"{mib} MiB: semq send, then waiting for B's inbox row")
    with (root / f"{name}.out").open("wb") as fout, (root / f"{name}.err").open("wb") as ferr:
        t0 = time.monotonic()
        wall0 = time.time()
        child = subprocess.Popen(cmd, cwd=root, env=c.env, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL)
    # Its exit and rusage: os.wait4 in a thread (Popen's own wait is not used).
    waiter = threading.Thread(target=wait_child, args=(child.pid,), daemon=True)
    waiter.start()
    try:
        deadline = t0 + a.timeout + PER_MIB_S * mib
        while True:
            if "at" in waited and child.returncode is None:
                child.returncode = os.waitstatus_to_exitcode(waited["status"])
                if child.returncode:
                    err = (root / f"{name}.err").read_text(errors="replace").strip()
                    raise BenchError(f"semq send of {mib} MiB exited {child.returncode}: {err[-1500:]}")
                if fairness and a.small_rate > 0:
                    stream = SmallStream(root / "A", a.small_rate, f"SMALL-during-{mib}MiB").start()
            if row is None:
                row = inbox.row(key)
                if row is not None:
                    delivered = time.monotonic()
                    if stream is not None:
                        stream.stop()  # "until the large one is delivered"
            if row is not None and child.returncode is not None:
                break
            if time.monotonic() > deadline:
                what = ("the command to return" if child.returncode is None
                        else "its row in B's inbox (semq send returned)")
                raise BenchError(f"timed out after {deadline - t0:.0f} s waiting for the {mib} MiB document:"
                                 f" {what}")
            c.alive()
            if stream is not None:
                stream.check()
            time.sleep(POLL_S)
        cpu1 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        kids_cpu1 = {n: cpu_seconds(pid) for n, pid in kids.items()}
    finally:
        if stream is not None and not stream.stopped:
            with contextlib.suppress(BenchError):
                stream.stop()
        if child.returncode is None and "at" not in waited:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        waiter.join(10)
        if child.returncode is None and "at" in waited:
            child.returncode = os.waitstatus_to_exitcode(waited["status"])
    assert row is not None
    lk0 = (root / f"{name}.out").read_text().strip().splitlines()[-1]
    send_end = float(waited["at"])
    ru = waited["ru"]
    total = delivered - t0
    send_s = send_end - t0
    transfer = delivered - send_end
    row_id, got_size, got_path, _created, received_ms, record_id = row
    chunked = got_path is not None

    # The rest of its life: A has its ACK2 (its outbox row cleaned) and, for
    # a large document, said large_sent; then the peaks of this size.
    e2e._wait(lambda: c.count("A", f"SELECT count(*) FROM outbox WHERE id={int(record_id)}") == 0, a.timeout,
              f"A's ACK2 of the {mib} MiB document (its outbox row cleaned)")
    sent_ev = None
    if chunked:
        sent_ev = e2e._wait(lambda: _events_of(root / "A" / "events", "large_sent", lk0), a.timeout,
                            f"A's large_sent event for {lk0}")
    rss = {n: (vm_kib(pid, "VmHWM") or 0) / 1024 for n, pid in pids.items()}
    rss["send"] = ru.ru_maxrss / 1024
    kids_fig = {n: {"cpu_s": (kids_cpu1[n] or 0.0) - (kids_cpu0[n] or 0.0),
                    "rss_peak_mib": (vm_kib(pid, "VmHWM") or 0) / 1024} for n, pid in kids.items()}
    cpu = {n: (cpu1[n] or 0.0) - (cpu0[n] or 0.0) for n in DAEMONS}
    cpu["send"] = ru.ru_utime + ru.ru_stime
    b_started = _events_of(root / "B" / "events", "large_started", lk0) if chunked else None
    b_done = _events_of(root / "B" / "events", "large_complete", lk0) if chunked else None

    # Not timed: the content delivered is the content sent.
    if chunked:
        where = Path(got_path)
        if not where.is_absolute():
            where = root / "B" / where  # (relative to B's store directory)
        got_sha = sha256_file(where)
        on_disk = where.stat().st_size
    else:
        data = inbox.app_data(row_id)
        got_sha, on_disk = hashlib.sha256(data).hexdigest(), len(data)
    intact = got_sha == sha and on_disk == size and (got_size in (None, size))
    if not intact:
        raise BenchError(f"the {mib} MiB document arrived altered: SHA-256 {got_sha} of {on_disk} bytes"
                         f" (inbox size {got_size}) where {sha} of {size} bytes was sent")
    src.unlink()
    left_out = sorted(p.name for p in (root / "A" / "large" / "out").glob("*"))
    res: dict[str, Any] = {
        "mib": mib, "bytes": size, "path": "chunked" if chunked else "one frame", "lk0": lk0,
        "large_from_mib": large_from_mib, "chunks": sent_ev.get("chunks") if sent_ev else None,
        "resent": sent_ev.get("resent") if sent_ev else None,
        # (A one-frame document can be in B's inbox before the command has
        # ended: its Python exits after the commit. No transfer time then.)
        "send_s": send_s, "transfer_s": transfer if transfer > 0 else None, "total_s": total,
        "delivered_before_send_returned": transfer <= 0,
        "e2e_mb_s": size / total / MB, "send_mb_s": size / send_s / MB,
        "transfer_mb_s": size / transfer / MB if transfer > 0 else None,
        "received_after_start_ms": received_ms - wall0 * 1000,
        "b_started_to_complete_s": ((b_done["ts"] - b_started["ts"]) / 1000 if b_started and b_done else None),
        "sha256": sha, "intact": intact, "inbox_path": got_path,
        "cpu_s": cpu, "cpu_ms_per_mib": {n: v * 1000 / mib for n, v in cpu.items()},
        "rss_peak_mib": rss, "rss_before_mib": rss_before, "peak_reset": reset,
        "a_large_out_files": left_out, "helpers": kids_fig,
    }
    res["cpu_s"]["total"] = sum(cpu.values())
    res["cpu_ms_per_mib"]["total"] = res["cpu_s"]["total"] * 1000 / mib
    if stream is not None:
        res["small_during"] = stream_figures(inbox, stream, a.timeout, c, received_ms)
    _log(f"{mib} MiB: {res['e2e_mb_s']:.1f} MB/s end to end ({res['path']}), SHA-256 checked")
    return res


# ---------------------------------------------------------------- the run


def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    from semq.settings.config import load_config

    sizes: list[int] = a.sizes
    largest = sizes[-1]
    base_mib = a.baseline_mib or largest
    # Each size delivered at B and (until A's hourly housekeeping) copied at
    # A; the largest's source; the disk baseline.
    need = (2 * sum(sizes) + largest + base_mib) * MIB + 512 * MIB
    free = shutil.disk_usage(root).free
    if free < need:
        raise BenchError(f"{root} has {free / MIB:,.0f} MiB free; this run needs about {need / MIB:,.0f} MiB"
                         " (every size at A and at B, the largest's source, the disk baseline)")
    out: dict[str, Any] = {"version": e2e.code_version(), "machine": machine_facts(), "sizes_mib": sizes,
                           "content": a.content, "data_dir": str(root), "filesystem": filesystem_of(root),
                           "small_rate": a.small_rate, "small_seconds": a.small_seconds}
    scratch = root / "scratch"
    scratch.mkdir()
    out["baseline"] = baselines(scratch, base_mib, a.tls, a.timeout)
    shutil.rmtree(scratch, ignore_errors=True)

    _log("starting the platform, B and A (security on)")
    c = e2e.Cluster(root, "FULL", a.timeout, secure=True)
    inbox: Inbox | None = None
    try:
        c.start_platform()
        c.start("B")
        c.start("A")
        e2e._wait(lambda: c.online(A) and c.online(B), a.timeout, "A and B online at the platform")
        large_from = load_config(root / "A").large_from_mib
        out["large_from_mib"] = large_from
        inbox = Inbox(root / "B" / "node.sqlite")
        # Warm-up: A and B exchange their certificates.
        from semq.node.api import NodeClient

        with NodeClient(root / "A") as node:
            node.send(B, b"warm-up", data_type=SMALL_TYPE, key="SMALL-warmup-00000")
        small_figures(inbox, "SMALL-warmup", ["SMALL-warmup-00000"], 0.0, a.timeout, c)
        if a.small_rate > 0:
            _log(f"fairness baseline: 1 KiB documents at {a.small_rate:g}/s for {a.small_seconds:g} s")
            s = SmallStream(root / "A", a.small_rate, "SMALL-baseline").start()
            try:
                deadline = time.monotonic() + a.small_seconds
                while time.monotonic() < deadline:
                    c.alive()
                    s.check()
                    time.sleep(0.1)
            finally:
                s.stop()
            out["small_baseline"] = stream_figures(inbox, s, a.timeout, c)
        out["sizes"] = []
        for mib in sizes:
            out["sizes"].append(measure_size(c, inbox, mib, a, large_from, fairness=mib == largest))
        out["platform_store_mib"] = sum(
            p.stat().st_size for p in (root / "P").glob("platform.sqlite*")) / MIB
        out["platform_stored_rows"] = c.count("P", "SELECT count(*) FROM stored")
    finally:
        if inbox is not None:
            inbox.close()
        c.stop_all()
    out["verdicts"] = verdicts(out)
    return out


def verdicts(out: dict[str, Any]) -> dict[str, Any]:
    sizes = out["sizes"]
    peaks = {n: [s["rss_peak_mib"][n] for s in sizes] for n in PROCS}
    worst = max((v, n, s["mib"]) for n in PROCS for v, s in zip(peaks[n], sizes, strict=True))
    chunked = [s for s in sizes if s["path"] == "chunked"]
    compared = chunked if len(chunked) >= 2 else sizes
    growth: dict[str, float | None] = {}
    for n in PROCS:
        if len(compared) < 2:
            growth[n] = None
            continue
        growth[n] = compared[-1]["rss_peak_mib"][n] - min(s["rss_peak_mib"][n] for s in compared[:-1])
    known = [g for g in growth.values() if g is not None]
    last = sizes[-1]
    base = out["baseline"]
    disk = base["disk_write"]["mb_s"]
    tcp = base["loopback_tcp"]["mb_s"]
    tls = base["loopback_tls"]["mb_s"] if base["loopback_tls"] else None
    return {
        "rss_under_aim": worst[0] < AIM_RSS_MIB, "rss_worst": {"mib": worst[0], "process": worst[1],
                                                               "size_mib": worst[2]},
        "rss_growth_mib": growth, "rss_compared_sizes": [s["mib"] for s in compared],
        "rss_flat": all(g <= FLAT_MIB for g in known) if known else None,
        "largest_mib": last["mib"], "largest_e2e_mb_s": last["e2e_mb_s"],
        "of_disk": last["e2e_mb_s"] / disk, "disk_aim_met": last["e2e_mb_s"] / disk >= AIM_DISK_SHARE,
        "of_loopback_tcp": last["e2e_mb_s"] / tcp, "of_loopback_tls": last["e2e_mb_s"] / tls if tls else None,
        "transfer_of_disk": (last["transfer_mb_s"] / disk) if last["transfer_mb_s"] else None,
    }


# ---------------------------------------------------------------- report


def _f(v: float | None, fmt: str = ",.1f") -> str:
    return "-" if v is None else format(v, fmt)


def _size(mib: int) -> str:
    return f"{mib // 1024} GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib} MiB"


def _met(ok: bool | None) -> str:
    return "not judged" if ok is None else "met" if ok else "NOT met"


def report(out: dict[str, Any]) -> None:
    v = out["verdicts"]
    base = out["baseline"]
    disk, tcp = base["disk_write"]["mb_s"], base["loopback_tcp"]["mb_s"]
    tls = base["loopback_tls"]
    print("SEMQ large documents: semq send FILE at A -> platform -> B's inbox, security on, real processes on"
          " 127.0.0.1")
    print(f"{out['machine']}; {out['version']}")
    print(f"data directories in {out['data_dir']} ({out['filesystem']}); content {out['content']};"
          f" one frame up to large_from_mib = {out['large_from_mib']} MiB, chunks of 1 MiB above; MB = 10^6 bytes")
    print()
    rows = [["disk: sequential write, 8 MiB os.write blocks + fsync", _size(base["disk_write"]["mib"]),
             _f(base["disk_write"]["seconds"], ".2f"), _f(disk)],
            ["loopback TCP 127.0.0.1, 1 MiB sends, process to process", _size(base["loopback_tcp"]["mib"]),
             _f(base["loopback_tcp"]["seconds"], ".2f"), _f(tcp)]]
    if tls:
        rows.append([f"loopback TLS 1.3 ({tls['cipher']}), 1 MiB sends", _size(tls["mib"]),
                     _f(tls["seconds"], ".2f"), _f(tls["mb_s"])])
    print_table("Baselines, this machine in this run", ["what", "size", "seconds", "MB/s"], rows,
                [f"disk: of which fsync {base['disk_write']['fsync_s']:.2f} s (the file is in the data"
                 " directories' filesystem, deleted after)."], facts=False)
    print()
    rows = []
    for s in out["sizes"]:
        rows.append([_size(s["mib"]), s["path"], _f(s["chunks"], ",d") if s["chunks"] is not None else "-",
                     _f(s["resent"], ",d") if s["resent"] is not None else "-",
                     _f(s["send_s"], ".2f"), _f(s["transfer_s"], ".2f"), _f(s["total_s"], ".2f"),
                     _f(s["send_mb_s"]), _f(s["transfer_mb_s"]), _f(s["e2e_mb_s"]),
                     f"{s['e2e_mb_s'] / disk:.0%}", f"{s['e2e_mb_s'] / tcp:.1%}",
                     "ok" if s["intact"] else "DIFFERS"])
    print_table("Throughput: from the start of semq send to B's inbox row (MB/s = 10^6 bytes/s)",
                ["size", "path", "chunks", "resent", "send s", "transfer s", "total s", "send MB/s",
                 "transfer MB/s", "end-to-end MB/s", "of disk", "of loopback", "SHA-256"], rows,
                ["send = the semq send command (python start, the copy into A's data directory, fsynced, for a"
                 " chunked one); transfer = from its return to B's inbox row (polled every 20 ms); total = from"
                 " its start to the row ('-' transfer: the row came before the command had ended).",
                 "chunks / resent: from A's large_sent event; of disk / of loopback = end-to-end MB/s / the"
                 " baseline's MB/s. The source file was just written (in the page cache) when sent."],
                facts=False)
    print()
    rows = []
    for s in out["sizes"]:
        cs, cm = s["cpu_s"], s["cpu_ms_per_mib"]
        rows.append([_size(s["mib"]), *(_f(cs[n], ".2f") for n in (*PROCS, "total")),
                     *(_f(cm[n], ",.1f") for n in (*PROCS, "total"))])
    print_table("CPU: utime + stime per process from the start of semq send to B's inbox row",
                ["size", "P s", "A s", "B s", "send s", "total s", "P ms/MiB", "A ms/MiB", "B ms/MiB",
                 "send ms/MiB", "total ms/MiB"], rows,
                ["P, A, B = the daemons (/proc/PID/stat); send = the semq send child (os.wait4), its Python"
                 " start-up included."
                 + (" During the largest size A also sent the small documents of the fairness stream."
                    if out["small_rate"] > 0 else "")], facts=False)
    print()
    rows = [[_size(s["mib"]), s["path"], *(_f(s["rss_peak_mib"][n]) for n in PROCS),
             *(_f(s["rss_before_mib"][n]) for n in DAEMONS)] for s in out["sizes"]]
    rows.append(["growth", "", *(("-" if v["rss_growth_mib"][n] is None else f"{v['rss_growth_mib'][n]:+.1f}")
                                 for n in PROCS), "", "", ""])
    w = v["rss_worst"]
    reset = all(s["peak_reset"] for s in out["sizes"])
    print_table("Peak RSS per process, MiB", ["size", "path", "platform", "A (origin)", "B (receiver)",
                                                "semq send", "P before", "A before", "B before"], rows,
                ["daemons: VmHWM, reset before each size (5 into /proc/PID/clear_refs), read once A had its ACK2"
                 + ("" if reset else " (the reset FAILED: peaks since the start)") + "; semq send: ru_maxrss."
                 " before = each daemon's RSS (VmRSS) when the size started: the peak cannot be lower (memory"
                 " an earlier size took and the allocator kept counts in it).",
                 f"growth = the peak at the largest size - the lowest at a smaller one of sizes"
                 f" {', '.join(_size(x) for x in v['rss_compared_sizes'])} (chunked sizes when there are two);"
                 f" flat = at most {FLAT_MIB:.0f} MiB.",
                 f"aim: every process under {AIM_RSS_MIB:.0f} MiB: {_met(v['rss_under_aim'])} (highest"
                 f" {w['mib']:.1f} MiB, {w['process']} at {_size(w['size_mib'])}).",
                 f"aim: constant memory (flat across sizes): {_met(v['rss_flat'])}"
                 + ("" if v["rss_flat"] is None else " ("
                    + ", ".join(f"{n} {g:+.1f} MiB" for n, g in v["rss_growth_mib"].items() if g is not None)
                    + ").")], facts=False)
    print()
    if out["small_rate"] > 0:
        rows = []
        sb = out.get("small_baseline")
        if sb:
            rows.append(["no large transfer", _f(sb["seconds"], ".1f"), sb["sent"], sb["delivered"], "-",
                         _f(sb["p50_ms"], ".0f"), _f(sb["p99_ms"], ".0f"), _f(sb["max_ms"], ".0f")])
        last = out["sizes"][-1]
        sd = last.get("small_during")
        if sd:
            rows.append([f"during the {_size(last['mib'])} transfer", _f(sd["seconds"], ".1f"), sd["sent"],
                         sd["delivered"], sd["before_large"], _f(sd["p50_ms"], ".0f"), _f(sd["p99_ms"], ".0f"),
                         _f(sd["max_ms"], ".0f")])
        print_table(f"Fairness: 1 KiB documents at {out['small_rate']:g}/s, latency = accepted at A (created_ms)"
                    " -> committed to B's inbox (received_ms), ms",
                    ["phase", "seconds", "sent", "delivered", "before the large one", "p50 ms", "p99 ms",
                     "max ms"], rows,
                    ["during: the stream starts when the largest semq send returns and stops when its document"
                     " is in B's inbox; 'before the large one' = small documents in B's inbox before it"
                     " (received_ms)."], facts=False)
        print()
    tls_part = (f", {v['of_loopback_tls']:.1%} of loopback TLS ({tls['mb_s']:,.1f} MB/s)"
                if v["of_loopback_tls"] is not None and tls else "")
    print(f"aim: {_size(v['largest_mib'])} end to end >= {AIM_DISK_SHARE:.0%} of the disk's write rate:"
          f" {v['largest_e2e_mb_s']:,.1f} MB/s = {v['of_disk']:.0%} of {disk:,.1f} MB/s,"
          f" {_met(v['disk_aim_met'])}; {v['of_loopback_tcp']:.1%} of loopback TCP ({tcp:,.1f} MB/s){tls_part}."
          + (f" The transfer alone: {v['transfer_of_disk']:.0%} of the disk's rate."
             if v["transfer_of_disk"] is not None else ""))
    left = [f"{len(s['a_large_out_files'])} after {_size(s['mib'])}" for s in out["sizes"]
            if s["path"] == "chunked"]
    if any(s["a_large_out_files"] for s in out["sizes"]):
        print(f"note: files in A's large/out once A had the ACK2 (copies of confirmed documents): {', '.join(left)}.")
    kids = [(n, k) for s in out["sizes"] for n, k in s["helpers"].items()]
    if kids:
        print(f"note: not in the tables, the daemons' {len({n for n, _ in kids})} child processes (the delivery"
              f" history's indexers): CPU at most {max(k['cpu_s'] for _, k in kids):.2f} s per size, peak RSS at"
              f" most {max(k['rss_peak_mib'] for _, k in kids):.1f} MiB.")
    if out.get("platform_stored_rows"):
        print(f"note: the platform holds {out['platform_stored_rows']} stored frame(s) after the run"
              f" (its store: {out['platform_store_mib']:.1f} MiB).")


# ---------------------------------------------------------------- main


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: MiB as whole numbers separated by commas") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one size, each >= 1 MiB")
    return sizes


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # every `finally` stops its processes


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when everything was measured and every document arrived
    intact, 1 when something failed (a timeout, a process that exited, an
    altered document), 2 on a usage error, 130 on Ctrl-C or SIGTERM."""
    p = argparse.ArgumentParser(prog="scripts/bench large",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", type=_sizes, default=None, metavar="MIB,...",
                   help="document sizes in MiB (default 10,100,1024)")
    p.add_argument("--quick", action="store_true", help="sizes 10,100")
    p.add_argument("--content", choices=["random", "mixed"], default="random",
                   help="random: incompressible (default); mixed: each MiB half random, half one repeated byte")
    p.add_argument("--small-rate", type=float, default=DEFAULT_SMALL_RATE, metavar="N",
                   help="1 KiB documents per second of the fairness stream (default %(default)g; 0: no fairness)")
    p.add_argument("--small-seconds", type=float, default=DEFAULT_SMALL_SECONDS, metavar="S",
                   help="length of the fairness baseline, no large transfer (default %(default)g)")
    p.add_argument("--baseline-mib", type=int, default=None, metavar="N",
                   help="MiB written to disk and sent over loopback for the baselines (default the largest size)")
    p.add_argument("--no-tls", dest="tls", action="store_false", help="no TLS loopback baseline")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help="limit of each wait (default %(default)g); the delivery of a document gets"
                        f" {PER_MIB_S:g} s more per MiB")
    p.add_argument("--keep", metavar="DIR", help="run in DIR (new or empty) and keep it")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the tables")
    p.add_argument("--json-out", metavar="FILE", help="also write the figures as JSON to FILE")
    try:
        a = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.sizes and a.quick:
        print("error: --sizes or --quick, not both", file=sys.stderr)
        return 2
    a.sizes = a.sizes or list(QUICK_SIZES if a.quick else DEFAULT_SIZES)
    if a.small_rate < 0 or a.small_seconds <= 0 or a.timeout <= 0 or (a.baseline_mib is not None
                                                                        and a.baseline_mib < 1):
        print("error: --small-rate >= 0, --small-seconds > 0, --timeout > 0, --baseline-mib >= 1", file=sys.stderr)
        return 2
    if a.keep:
        root = Path(a.keep).resolve()
        if root.exists() and any(root.iterdir()):
            print(f"error: --keep {a.keep}: not empty (a run needs a new or empty directory)", file=sys.stderr)
            return 2
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="semq-bench-large-")).resolve()
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        out = run(a, root)
    except (BenchError, OSError, sqlite3.Error, subprocess.SubprocessError, ssl.SSLError) as e:
        print(f"error: {type(e).__name__}: {e}" if not isinstance(e, BenchError) else f"error: {e}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
        if a.keep:
            _log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
