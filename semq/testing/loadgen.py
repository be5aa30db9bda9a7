"""Simulated organization nodes for load tests (scripts/bench load).

One process holds many real connections to a running platform. Each
simulated node does on the wire what ``semq node run`` does
(semq/node/daemon.py): TCP, mutual TLS 1.3 with its own certificate issued by
the platform CA, HELLO / WELCOME, a PING every ``ping_interval`` (the platform
closes a silent session after its idle timeout), PONG to any PING, ACK for a
stored copy (one that carries LK1). It has no store: documents are 1 KiB
DATA frames (SaveFwd 3, no Ack2, not sealed; the relay never reads a body)
sent to other simulated nodes; received ones are counted by LK0, so a
document delivered twice is seen.

Two parts:

* ``issue_identities``: keys and certificates for many organizations by
  library calls on the platform's CA (what ``semq node init --enroll-from``
  does per organization, without 2 processes per node), registered in the
  platform's store. A running relay picks them up too (it reloads the CA's
  files and looks an unknown organization up in its store), but issuing them
  before ``semq platform run`` keeps that work out of the measurement.
* ``python -m semq.testing.loadgen --ids DIR --platform HOST:PORT``: connects
  every identity (``--concurrency`` handshakes at a time), sends
  ``--docs-per-node`` documents each once all are connected, then holds the
  connections (pings; one document per node every ``--trickle`` s if set)
  until stdin reaches end of file or says ``stop`` (or ``--hold`` s pass);
  then waits for documents in flight, closes everything and exits. Progress
  and results are JSON lines on stdout (``{"phase": ...}``); exit 0 when
  every node connected and every document arrived exactly once.

``proc_info(pid)`` reads RSS, peak RSS, open descriptors and CPU time of a
process from /proc, for the benchmarks and tests that watch the platform.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import resource
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import trio

from semq.session.transport import ConnectionClosed, FrameStream, parse_hostport
from semq.umxt_protocol import (
    Ack,
    AckBatch,
    AckFlag,
    Endpoint,
    Error,
    Frame,
    Hello,
    Kind,
    Ping,
    Pong,
    RemoteProtocolError,
    encode_data,
    encode_frame,
)

__all__ = [
    "LoadConfig",
    "LoadGenError",
    "LoadGenProcess",
    "LoadGenerator",
    "ProcInfo",
    "SimIdentity",
    "issue_identities",
    "load_identities",
    "main",
    "proc_info",
]

INDEX: Final = "index.json"
DOC_SIZE: Final = 1024
FIRST_ORG: Final = 900_000


# ---------------------------------------------------------------- /proc


@dataclass(frozen=True)
class ProcInfo:
    """One look at a live process (Linux /proc)."""

    rss_mib: float  # VmRSS
    hwm_mib: float  # VmHWM: peak resident set since the process started
    fds: int  # entries of /proc/PID/fd
    cpu_s: float  # user + system CPU time
    threads: int


_TICK: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_info(pid: int) -> ProcInfo | None:
    """RSS, peak RSS, open descriptors and CPU seconds of ``pid``; None when
    it is gone (or this is not Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    vals: dict[str, int] = {}
    for line in status.splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "Threads"):
            vals[k] = int(v.split()[0])
    # Fields after the command name (which may hold spaces): state is 3rd.
    rest = stat[stat.rindex(")") + 2:].split()
    cpu = (int(rest[11]) + int(rest[12])) / _TICK  # utime, stime (fields 14, 15)
    return ProcInfo(vals.get("VmRSS", 0) / 1024, vals.get("VmHWM", 0) / 1024, fds, cpu, vals.get("Threads", 0))


# ---------------------------------------------------------------- identities


@dataclass(frozen=True)
class SimIdentity:
    org: str
    cert: str | None = None  # PEM files (None with security off)
    key: str | None = None


def issue_identities(platform_dir: Path, count: int, out: Path, *, first: int = FIRST_ORG,
                     security: bool = True) -> list[SimIdentity]:
    """``count`` organizations ``first``, ``first+1``, ...: with security an
    Ed25519 + X25519 key pair, a certificate request and a certificate issued
    by the platform CA in ``platform_dir`` (the CA's record written once);
    all registered in the platform store. Writes ``out/index.json`` (see
    load_identities)."""
    from semq.platform.core import PlatformCore
    from semq.settings.config import load_config

    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    orgs = [str(first + i) for i in range(count)]
    ids: list[SimIdentity] = []
    if security:
        from semq.identity.crypto import (
            CertificateAuthority,
            NodeKeys,
            make_csr,
            save_certificate,
            save_private_key,
        )

        ca_dir = platform_dir / "ca"
        ca = CertificateAuthority.load(ca_dir)
        for org in orgs:
            keys = NodeKeys.generate()
            cert = ca.issue_node_certificate(make_csr(keys, org), org=org)
            cert_path, key_path = out / f"{org}.pem", out / f"{org}.key.pem"
            save_private_key(key_path, keys.signing_key)  # the TLS client key (0600)
            save_certificate(cert_path, cert)
            ids.append(SimIdentity(org, str(cert_path), str(key_path)))
        ca.save(ca_dir)
        ca_file: str | None = str(ca_dir / "ca.pem")
    else:
        ids = [SimIdentity(org) for org in orgs]
        ca_file = None
    cfg = load_config(platform_dir)
    core = PlatformCore(cfg.platform_store, cfg.platform_id)
    try:
        core.register(orgs)
    finally:
        core.close()
    (out / INDEX).write_text(json.dumps({"ca": ca_file, "nodes": [asdict(i) for i in ids]}))
    return ids


def load_identities(directory: Path) -> tuple[list[SimIdentity], str | None]:
    """(identities, CA certificate file or None) written by issue_identities."""
    data = json.loads((directory / INDEX).read_text())
    return [SimIdentity(**n) for n in data["nodes"]], data["ca"]


# ---------------------------------------------------------------- the load


@dataclass
class LoadConfig:
    host: str = "127.0.0.1"
    port: int = 7410
    concurrency: int = 64  # connections being set up at once
    connect_timeout: float = 30.0  # one attempt: TCP + TLS + HELLO/WELCOME
    connect_attempts: int = 3
    connect_deadline: float = 300.0  # every node connected within this, or the run fails
    docs_per_node: int = 3  # sent by each node once every node is connected
    doc_size: int = DOC_SIZE
    ping_interval: float = 10.0
    trickle: float = 0.0  # while holding: one document per node every this many s (0: none)
    hold: float = 600.0  # at most this long connected after the exchange
    settle_timeout: float = 60.0  # documents in flight: wait this long for them
    status_interval: float = 5.0  # a "status" line this often (0: none)


@dataclass
class SimNode:
    ident: SimIdentity
    ep: Endpoint
    ctx: ssl.SSLContext | None
    fs: FrameStream | None = None
    platform: Endpoint = field(default_factory=Endpoint.platform)
    next_rid: int = 1
    received: set[tuple[str, int]] = field(default_factory=set)


class LoadGenerator:
    def __init__(self, cfg: LoadConfig, identities: Sequence[SimIdentity], ca_file: str | None) -> None:
        from semq.identity.crypto import client_ssl_context

        self.cfg = cfg
        self.nodes = []
        for ident in identities:
            ctx = None
            if ca_file is not None and ident.cert and ident.key:
                ctx = client_ssl_context(cert_file=ident.cert, key_file=ident.key, ca_file=ca_file)
            self.nodes.append(SimNode(ident, Endpoint.org(ident.org), ctx))
        self.payload = b"x" * cfg.doc_size
        self.connected = 0
        self.ever_connected = 0
        self.latencies: list[float] = []
        self.failures: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.all_up = trio.Event()
        self.stop = trio.Event()
        self.trickle_start = trio.Event()
        self.trickling = False
        self.t0 = 0.0

    # ---------------------------------------------------------- output

    def emit(self, phase: str, **extra: Any) -> None:
        rec = {"phase": phase, "t": round(trio.current_time() - self.t0, 3), "connected": self.connected,
               **{k: self.stats[k] for k in ("sent", "acked", "received", "duplicates", "pings", "pongs",
                                              "platform_pings", "stored_copies", "nacks", "reconnects")},
               **extra}
        print(json.dumps(rec), flush=True)

    # ---------------------------------------------------------- one node

    async def _connect(self, node: SimNode, limiter: trio.CapacityLimiter) -> FrameStream:
        cfg = self.cfg
        last: Exception | None = None
        for attempt in range(cfg.connect_attempts):
            if attempt:
                await trio.sleep(0.5 * attempt * (0.5 + random.random()))
            async with limiter:
                t = trio.current_time()
                try:
                    with trio.fail_after(cfg.connect_timeout):
                        stream: trio.abc.Stream = await trio.open_tcp_stream(cfg.host, cfg.port)
                        if node.ctx is not None:
                            tls = trio.SSLStream(stream, node.ctx, server_hostname=cfg.host)
                            await tls.do_handshake()
                            stream = tls
                        fs = FrameStream(stream)
                        await fs.send(encode_frame(Frame(kind=Kind.HELLO, source=node.ep, target=node.platform,
                                                         body=Hello(window=1024, software="semq-loadgen"))))
                        first = await fs.receive_batch()
                except (OSError, trio.BrokenResourceError, trio.TooSlowError, ConnectionClosed,
                        RemoteProtocolError) as e:
                    last = e
                    self.failures[type(e).__name__] += 1
                    continue
                if first[0].kind is not Kind.WELCOME:
                    body = first[0].frame().body
                    last = ConnectionError(f"{first[0].kind.name}: {getattr(body, 'message', body)}")
                    self.failures[first[0].kind.name] += 1
                    await fs.aclose()
                    continue
                node.platform = first[0].source
                self.latencies.append(trio.current_time() - t)
                return fs
        raise ConnectionError(f"{node.ident.org}: {last}")

    async def _session(self, node: SimNode, limiter: trio.CapacityLimiter) -> None:
        """Connect, then read and ping until told to stop; reconnects (and
        counts it) if the platform closes the session."""
        while not self.stop.is_set():
            try:
                fs = await self._connect(node, limiter)
            except ConnectionError as e:
                self.errors[f"connect failed: {e}"] += 1
                return
            node.fs = fs
            self.connected += 1
            self.ever_connected += 1
            if self.ever_connected == len(self.nodes):
                self.all_up.set()
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(self._reader, node, fs, n.cancel_scope)
                    n.start_soon(self._pinger, node, fs)
                    if self.cfg.trickle:
                        n.start_soon(self._trickler, node)
                    n.start_soon(self._until_stop, n.cancel_scope)
            except* (ConnectionClosed, RemoteProtocolError) as eg:
                lost = eg.exceptions[0]
                self.errors[f"session lost: {type(lost).__name__}: {str(lost)[:80]}"] += 1
            finally:
                node.fs = None
                self.connected -= 1
                await fs.aclose()
            if not self.stop.is_set():
                self.stats["reconnects"] += 1

    async def _until_stop(self, scope: trio.CancelScope) -> None:
        await self.stop.wait()
        scope.cancel()

    async def _reader(self, node: SimNode, fs: FrameStream, scope: trio.CancelScope) -> None:
        try:
            while True:
                for raw in await fs.receive_batch():
                    kind = raw.kind
                    if kind is Kind.DATA:
                        lk0, lk1, _, _ = raw.data_prefix()
                        key = (lk0.endpoint.node_id, lk0.record_id)
                        if key in node.received:
                            self.stats["duplicates"] += 1
                        else:
                            node.received.add(key)
                            self.stats["received"] += 1
                        if lk1 is not None:  # a stored copy: the platform wants our ACK
                            self.stats["stored_copies"] += 1
                            await fs.send(encode_frame(Frame(
                                kind=Kind.ACK, source=node.ep, target=node.platform,
                                body=Ack(dest_ref_id=lk1.record_id, ack_flag=AckFlag.PLATFORM))))
                    elif kind is Kind.ACK_BATCH:
                        body = raw.frame().body
                        assert isinstance(body, AckBatch)
                        if body.ack_kind in (Kind.ACK_FWD, Kind.ACK_SAVE):
                            self.stats["acked"] += len(body.entries)
                    elif kind in (Kind.ACK_FWD, Kind.ACK_SAVE):
                        self.stats["acked"] += 1
                    elif kind is Kind.NACK:
                        self.stats["nacks"] += 1
                    elif kind is Kind.PONG:
                        self.stats["pongs"] += 1
                    elif kind is Kind.PING:
                        ping = raw.frame().body
                        assert isinstance(ping, Ping)
                        self.stats["platform_pings"] += 1
                        await fs.send(encode_frame(Frame(kind=Kind.PONG, source=node.ep, target=raw.source,
                                                         body=Pong(nonce=ping.nonce, time_ms=_now_ms()))))
                    elif kind is Kind.ERROR:
                        err = raw.frame().body
                        assert isinstance(err, Error)
                        self.errors[f"platform ERROR {err.code.name}"] += 1
                    elif kind is Kind.BYE:
                        raise ConnectionClosed("platform said BYE")
        finally:
            scope.cancel()

    async def _pinger(self, node: SimNode, fs: FrameStream) -> None:
        interval = self.cfg.ping_interval
        nonce = 0
        await trio.sleep(random.random() * interval)  # spread the nodes' pings over the interval
        while True:
            nonce += 1
            self.stats["pings"] += 1
            await fs.send(encode_frame(Frame(kind=Kind.PING, source=node.ep, target=node.platform,
                                             body=Ping(nonce=nonce, time_ms=_now_ms()))))
            await trio.sleep(interval)

    async def _trickler(self, node: SimNode) -> None:
        """While holding: one document to a random other node every ``trickle`` s."""
        await self.trickle_start.wait()
        await trio.sleep(random.random() * self.cfg.trickle)
        while self.trickling:
            await self.send_docs(node, [self._random_target(node)])
            await trio.sleep(self.cfg.trickle)

    def _random_target(self, node: SimNode) -> SimNode:
        while True:
            t = random.choice(self.nodes)
            if t is not node or len(self.nodes) == 1:
                return t

    async def send_docs(self, node: SimNode, targets: Sequence[SimNode]) -> None:
        fs = node.fs
        if fs is None:
            return
        frames = []
        now = _now_ms()
        for t in targets:
            rid = node.next_rid
            node.next_rid += 1
            frames.append(encode_data(source=node.ep, target=t.ep, record_id=rid, created_ms=now,
                                      app_key=("load", "DOC", "SIM", f"{node.ident.org}-{rid}"),
                                      save_fwd=3, app_data=self.payload))
        self.stats["sent"] += len(frames)
        try:
            await fs.send(b"".join(frames))
        except ConnectionClosed:
            self.errors["send on a closed session"] += 1

    # ---------------------------------------------------------- the run

    async def _settled(self, timeout: float) -> bool:
        """Every document sent was received and acknowledged by the platform."""
        with trio.move_on_after(timeout):
            while not (self.stats["received"] + self.stats["duplicates"] >= self.stats["sent"]
                       and self.stats["acked"] >= self.stats["sent"]):
                await trio.sleep(0.05)
            return True
        return False

    async def _status(self) -> None:
        if not self.cfg.status_interval:
            return
        while True:
            await trio.sleep(self.cfg.status_interval)
            self.emit("status")

    async def _control(self) -> None:
        """stdin: ``stop`` or end of file ends the hold."""
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buf = b""
        try:
            while b"stop" not in buf:
                chunk = await stdin.receive_some(1024)
                if not chunk:
                    break
                buf = (buf + chunk)[-64:]
        finally:
            await stdin.aclose()

    async def run(self, *, control: bool = True) -> dict[str, Any]:
        cfg = self.cfg
        self.t0 = trio.current_time()
        limiter = trio.CapacityLimiter(cfg.concurrency)
        result: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._status)
            t_start = time.time()
            async with trio.open_nursery() as sessions:
                for node in self.nodes:
                    sessions.start_soon(self._session, node, limiter)
                with trio.move_on_after(cfg.connect_deadline):
                    while not self.all_up.is_set() and self.errors.total() == 0:
                        await trio.sleep(0.05)
                connect_s = trio.current_time() - self.t0
                lat = sorted(self.latencies)
                self.emit("connected", seconds=round(connect_s, 3), wall_start=t_start, nodes=len(self.nodes),
                          all=self.all_up.is_set(), failures=dict(self.failures), errors=dict(self.errors),
                          latency_p50=_pct(lat, 50), latency_p99=_pct(lat, 99), latency_max=_pct(lat, 100))
                result.update(connect_s=connect_s, all_connected=self.all_up.is_set())
                if self.all_up.is_set() and cfg.docs_per_node:
                    t = trio.current_time()
                    n = len(self.nodes)
                    for i, node in enumerate(self.nodes):
                        k = min(cfg.docs_per_node, max(1, n - 1))
                        await self.send_docs(node, [self.nodes[(i + 1 + j) % n] for j in range(k)])
                    ok = await self._settled(cfg.settle_timeout)
                    result["exchange_s"] = trio.current_time() - t
                    self.emit("exchanged", ok=ok, seconds=round(result["exchange_s"], 3))
                if self.all_up.is_set():
                    self.trickling = cfg.trickle > 0
                    self.trickle_start.set()
                    self.emit("holding")
                    with trio.move_on_after(cfg.hold):
                        if control:
                            await self._control()
                        else:
                            await trio.sleep_forever()
                    self.trickling = False
                    result["settled"] = await self._settled(cfg.settle_timeout)
                self.stop.set()
            nursery.cancel_scope.cancel()
        result.update(stats=dict(self.stats), failures=dict(self.failures), errors=dict(self.errors),
                      nodes=len(self.nodes), ever_connected=self.ever_connected)
        result["ok"] = bool(
            result["all_connected"] and self.stats["duplicates"] == 0
            and self.stats["received"] == self.stats["sent"] and self.stats["acked"] == self.stats["sent"]
            and not self.errors and not self.stats["reconnects"])
        self.emit("done", ok=result["ok"], errors=dict(self.errors), failures=dict(self.failures))
        return result


class LoadGenError(Exception):
    """The load generator child did not reach a phase: exited or timed out."""


class LoadGenProcess:
    """``python -m semq.testing.loadgen`` as a child process (tests and
    ``scripts/bench load``): its JSON lines on a queue, ``wait`` for a phase
    with a bound, ``stop`` (asks it to finish) and ``kill``."""

    def __init__(self, ids: Path, port: int, err_log: Path, args: Sequence[str], *,
                 cwd: Path | None = None, env: dict[str, str] | None = None,
                 on_status: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.err_log = err_log
        self._err = err_log.open("ab")
        self.on_status = on_status
        self.last: dict[str, Any] = {}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "semq.testing.loadgen", "--ids", str(ids), "--platform",
             f"127.0.0.1:{port}", *args],
            cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.p.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes] | None) -> None:
        assert out is not None
        for line in out:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue
        self._lines.put(None)

    def wait(self, phase: str, timeout: float) -> dict[str, Any]:
        """The first record of ``phase``; LoadGenError if the child exits
        first or none comes within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                rec = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if rec is None:
                err = self.err_log.read_text(errors="replace")[-1500:]
                raise LoadGenError(f"load generator exited {self.p.wait()} before '{phase}': {err}")
            self.last = rec
            if rec.get("phase") == "status" and self.on_status is not None:
                self.on_status(rec)
            if rec.get("phase") == phase:
                return rec
        raise LoadGenError(f"load generator: no '{phase}' within {timeout:.0f} s (last: {self.last})")

    def stop(self) -> None:
        if self.p.stdin is not None and not self.p.stdin.closed:
            try:
                self.p.stdin.write(b"stop\n")
                self.p.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)
        self._err.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return round(values[k], 4)


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (one descriptor per node);
    returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return int(soft)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m semq.testing.loadgen",
                                description="Many simulated SEMQ nodes connected to one platform.")
    p.add_argument("--ids", required=True, type=Path, help="directory written by issue_identities")
    p.add_argument("--platform", required=True, help="HOST:PORT of the platform")
    p.add_argument("--count", type=int, default=0, help="use only the first N identities (default all)")
    p.add_argument("--concurrency", type=int, default=LoadConfig.concurrency)
    p.add_argument("--docs-per-node", type=int, default=LoadConfig.docs_per_node)
    p.add_argument("--ping-interval", type=float, default=LoadConfig.ping_interval)
    p.add_argument("--trickle", type=float, default=0.0, help="s between documents per node while holding")
    p.add_argument("--hold", type=float, default=LoadConfig.hold, help="longest hold, s (stdin EOF/stop ends it)")
    p.add_argument("--connect-deadline", type=float, default=LoadConfig.connect_deadline)
    p.add_argument("--status-interval", type=float, default=LoadConfig.status_interval)
    p.add_argument("--no-control", action="store_true", help="ignore stdin: hold for --hold s")
    a = p.parse_args(argv)
    host, port = parse_hostport(a.platform)
    ids, ca = load_identities(a.ids)
    if a.count:
        ids = ids[:a.count]
    limit = raise_fd_limit()
    if limit < len(ids) + 64:
        print(json.dumps({"phase": "error", "error": f"open-file limit {limit} < {len(ids)} nodes"}), flush=True)
        return 2
    cfg = LoadConfig(host=host, port=port, concurrency=a.concurrency, docs_per_node=a.docs_per_node,
                     ping_interval=a.ping_interval, trickle=a.trickle, hold=a.hold,
                     connect_deadline=a.connect_deadline, status_interval=a.status_interval)
    gen = LoadGenerator(cfg, ids, ca)
    result = trio.run(lambda: gen.run(control=not a.no_control))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
