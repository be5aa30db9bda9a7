#!/usr/bin/env python3
"""Peer brokers benchmark: mosquitto and NATS JetStream on this machine .

What SEMQ is compared with, measured the way SEMQ is measured: 1 KiB messages,
durable settings, Python clients, everything on 127.0.0.1.

- mosquitto (MQTT QoS 1, persistent session = clean_session False, paho-mqtt);
- NATS JetStream (nats-server -js, file storage, durable pull consumer with
  explicit acks, nats-py).

Per peer three figures:

- online: subscriber connected, publisher sends N with a window of W
  unacknowledged publishes; msgs/s = N / (first publish -> last of N received);
  p50/p99 publish->receive latency over all N (at that full load).
- store: subscriber offline (its persistent session / durable consumer exists);
  publish N, each acked by the broker: msgs/s = N / (first publish -> last ack).
- drain: the subscriber reconnects and receives (and acks) all N:
  msgs/s = N / (connect -> last received).

CPU per message (online, store, drain): user + system CPU of the broker (from
/proc) and of the publisher and subscriber (their own clocks, from connected
to done), divided by N; each run also keeps it per process
(``{phase}_cpu_parts``: broker, publisher, subscriber).

Publisher and subscriber run as separate processes (each its own GIL, like a
SEMQ node A and node B); timestamps are CLOCK_MONOTONIC, which is system-wide on
Linux, so publish->receive latency can be taken across the two processes.

Brokers come from Debian packages (``apt-get install -y mosquitto
nats-server``, with ``apt-get update`` first if that fails) and the client
libraries from PyPI into the running interpreter's environment
(``sys.executable -m pip install``) when missing: they are bench-only
dependencies, deliberately not in pyproject.toml. Each broker is started on a
free port of 127.0.0.1 with its own temporary data directory and stopped by PID
at the end, also on error and Ctrl-C.

Run: ``.venv/bin/python scripts/benchmarks/peers.py [--count N] [--repeat R]``
(or ``scripts/bench peers ...``). ``measure_peers(count, repeat)`` returns the
rows for a combined SEMQ table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import pwd
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

if __package__:
    from ._proc import cpu_seconds
else:  # run as a file (the workers: python peers.py --worker ...)
    from _proc import cpu_seconds  # type: ignore[no-redef]

__all__ = ["PEERS", "ack_promise", "main", "measure_peers", "render_table"]

MESSAGE_SIZE: Final = 1024  # bytes per message, as in every SEMQ figure
DEFAULT_COUNT: Final = 20_000
DEFAULT_WINDOW: Final = 256  # unacknowledged publishes in flight (and broker inflight limits)
DEFAULT_PHASE_TIMEOUT: Final = 40.0  # seconds per phase; a stuck broker cannot hang the bench
TOTAL_BUDGET: Final = 170.0  # seconds for all measurements (installs excluded): "< 3 minutes"
START_TIMEOUT: Final = 15.0  # seconds for a broker to accept connections
STOP_GRACE: Final = 5.0  # seconds between SIGTERM and SIGKILL
PEERS: Final = ("mosquitto", "nats")

# What each peer's acknowledgement really promises (MEASUREMENTS.md, kill -9 test).
_ACK_PROMISE: Final = {
    "mosquitto": (
        "mosquitto: PUBACK = held in broker memory; persistence is a snapshot every "
        "autosave_interval (1800 s default) and at clean shutdown, so kill -9 loses "
        "everything acked since the last snapshot (measured: 5000 of 5000 lost)."
    ),
    "nats": (
        "NATS JetStream: PubAck = written to the stream file in the page cache, not "
        "fsynced (sync_interval 2 min default): kill -9 of the server lost 0 of 5000, "
        "but a power loss or kernel crash can lose up to the last 2 min of acked messages."
    ),
}

_PEER_LABEL: Final = {
    "mosquitto": "mosquitto {version} (QoS 1, persistent session)",
    "nats": "NATS JetStream {version} (file storage, durable pull, explicit ack)",
}

_PY_DEPS: Final = {"paho.mqtt": "paho-mqtt>=2,<3", "nats": "nats-py>=2.6,<3"}


# What this process installed on demand, for the table's footer.
_INSTALLED: list[str] = []


def ack_promise(peer: str) -> str:
    """One line on what ``peer``'s acknowledgement guarantees."""
    return _ACK_PROMISE[peer]


def _log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def _now_ns() -> int:
    # CLOCK_MONOTONIC is one clock for every process on Linux, so the publisher
    # process can stamp and the subscriber process can subtract.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# --- installation ------------------------------------------------------------


def _find_binary(name: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/usr/bin:/sbin"
    return shutil.which(name, path=path)


def _apt_install(packages: Sequence[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    _log(f"installing Debian packages: {' '.join(packages)}")
    _INSTALLED.append(f"apt-get install {' '.join(packages)}")
    # Install output goes to stderr so stdout stays the table.
    if subprocess.run([*prefix, *cmd], env=env, stdout=sys.stderr, check=False).returncode == 0:
        return
    _log("apt-get install failed; running apt-get update and trying again")
    subprocess.run([*prefix, "apt-get", "update"], env=env, stdout=sys.stderr, check=False)
    subprocess.run([*prefix, *cmd], env=env, stdout=sys.stderr, check=True)


def ensure_brokers(peers: Sequence[str]) -> dict[str, str]:
    """Path of each broker binary, installing the Debian package when missing."""
    wanted = {"mosquitto": ("mosquitto", "mosquitto"), "nats": ("nats-server", "nats-server")}
    missing = [wanted[p][1] for p in peers if _find_binary(wanted[p][0]) is None]
    if missing:
        _apt_install(missing)
    found: dict[str, str] = {}
    for p in peers:
        path = _find_binary(wanted[p][0])
        if path is None:
            raise RuntimeError(f"{wanted[p][0]} not found after installing {wanted[p][1]}")
        found[p] = path
    return found


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package ("paho") is missing
        return False


def ensure_clients(peers: Sequence[str]) -> None:
    """Install paho-mqtt / nats-py into this interpreter's environment when missing."""
    modules = {"mosquitto": "paho.mqtt", "nats": "nats"}
    need = [_PY_DEPS[modules[p]] for p in peers if not _importable(modules[p])]
    if need:
        _log(
            f"installing {' '.join(need)} into {sys.prefix} with "
            f"'{sys.executable} -m pip install' (bench-only, not in pyproject.toml)"
        )
        _INSTALLED.append(f"{sys.executable} -m pip install {' '.join(need)}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", *need],
            stdout=sys.stderr,
            check=True,
        )
        importlib.invalidate_caches()


def _broker_version(peer: str, binary: str) -> str:
    try:
        if peer == "mosquitto":
            out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=5).stdout
            # "mosquitto version 2.0.11"
            for word in out.split():
                if word[:1].isdigit():
                    return word
        else:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=5
            ).stdout
            return out.strip().rsplit("v", 1)[-1]  # "nats-server: v2.9.10"
    except (OSError, subprocess.SubprocessError):
        pass
    return "?"


# --- brokers -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A broker process we started; ``stop()`` ends it by PID."""

    # A plain class, not a dataclass: the bench dispatcher may load this file
    # with importlib without registering it in sys.modules, which dataclasses
    # need to resolve string annotations.
    def __init__(
        self, peer: str, proc: subprocess.Popen[bytes], port: int, data_dir: Path, log_path: Path
    ) -> None:
        self.peer = peer
        self.proc = proc
        self.port = port
        self.data_dir = data_dir
        self.log_path = log_path

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE; always waits for the PID."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _wait_listening(broker: Broker) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:  # bounded by START_TIMEOUT
        if broker.proc.poll() is not None:
            raise RuntimeError(
                f"{broker.peer} exited with {broker.proc.returncode} at start:\n{broker.log_tail()}"
            )
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", broker.port), 0.5),
        ):
            return
        time.sleep(0.02)
    raise RuntimeError(
        f"{broker.peer} did not listen on 127.0.0.1:{broker.port} within {START_TIMEOUT} s"
    )


@contextlib.contextmanager
def running_broker(peer: str, binary: str, window: int, keep: bool = False) -> Iterator[Broker]:
    """Start ``peer`` on a free 127.0.0.1 port with a fresh data directory;
    stop it by PID and remove the directory on the way out, whatever happens."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"semq-peers-{peer}-"))
    log_path = data_dir / "broker.log"
    port = _free_port()
    conf = data_dir / "broker.conf"
    if peer == "mosquitto":
        user = pwd.getpwuid(os.geteuid()).pw_name
        conf.write_text(
            f"listener {port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {data_dir}/\n"
            # The default, stated: a snapshot every 30 min (and on clean shutdown).
            "autosave_interval 1800\n"
            # Default 1000 per client: the store phase would silently drop the rest.
            "max_queued_messages 0\n"
            "max_queued_bytes 0\n"
            # Broker -> subscriber window, the same W the publishers use.
            f"max_inflight_messages {window}\n"
            # As root mosquitto would switch to user 'mosquitto', which cannot
            # write our temp directory: stay the user that runs the bench.
            f"user {user}\n"
            "log_type error\n"
            "log_type warning\n"
        )
        cmd = [binary, "-c", str(conf)]
    elif peer == "nats":
        conf.write_text(
            f'listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: "{data_dir / "js"}"\n}}\n'
        )
        cmd = [binary, "-c", str(conf)]
    else:
        raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    broker = Broker(peer=peer, proc=proc, port=port, data_dir=data_dir, log_path=log_path)
    try:
        _wait_listening(broker)
        yield broker
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


# --- worker processes ----------------------------------------------------------


class Worker:
    """A publisher or subscriber in its own process (this file with --worker).
    It prints ``READY`` when connected, then one JSON line with its result."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # ends at EOF
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=max(timeout, 0.01))
        except queue.Empty:
            raise TimeoutError(
                f"worker {' '.join(self.args[:2])} silent for {timeout:.0f} s"
            ) from None
        if line is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(
                f"worker {' '.join(self.args[:2])} ended early: {err.strip()[-600:]}"
            )
        return line

    def wait_ready(self, timeout: float) -> None:
        line = self.wait_line(timeout)
        if line != "READY":
            raise RuntimeError(f"worker said {line!r} instead of READY")

    def result(self, timeout: float) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.wait_line(timeout))
        self.proc.wait(5)
        if "error" in data:
            raise RuntimeError(f"worker {' '.join(self.args[:2])}: {data['error']}")
        return data

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def _workers() -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(*args: object) -> Worker:
        w = Worker([str(a) for a in args])
        started.append(w)
        return w

    try:
        yield start
    finally:
        for w in started:  # every worker process ends with the phase
            w.kill()


def _payload(seq: int) -> bytes:
    # 8-byte send time + 8-byte sequence + padding = exactly MESSAGE_SIZE bytes.
    return _now_ns().to_bytes(8, "big") + seq.to_bytes(8, "big") + bytes(MESSAGE_SIZE - 16)


class _Receipts:
    """Counts distinct sequence numbers (QoS 1 / JetStream may redeliver) and
    records publish->receive latency of first arrivals."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seen = bytearray(count)
        self.unique = 0
        self.duplicates = 0
        self.latencies: list[int] = []
        self.first_ns = 0
        self.last_ns = 0

    def add(self, payload: bytes, now: int) -> bool:
        """Record one message; True once all ``count`` have arrived."""
        seq = int.from_bytes(payload[8:16], "big")
        if seq >= self.count or self.seen[seq]:
            self.duplicates += 1
            return self.unique >= self.count
        self.seen[seq] = 1
        self.unique += 1
        self.latencies.append(now - int.from_bytes(payload[:8], "big"))
        if not self.first_ns:
            self.first_ns = now
        self.last_ns = now
        return self.unique >= self.count

    def summary(self, start_ns: int) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6 if lat else None

        return {
            "received": self.unique,
            "duplicates": self.duplicates,
            "start_ns": start_ns,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
        }


def _sleep_until_ns(when_ns: int) -> None:
    wait = (when_ns - _now_ns()) / 1e9
    if wait > 0:
        time.sleep(wait)


_READY_CPU: list[float] = []  # this worker's CPU time when it said READY


def _ready() -> None:
    _READY_CPU.append(time.process_time())
    print("READY", flush=True)


# mosquitto (paho-mqtt; its network loop runs in a thread) ----------------------


def _mqtt_client(client_id: str, clean: bool, window: int) -> Any:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean,
        protocol=mqtt.MQTTv311,
    )
    client.max_inflight_messages_set(window)
    client.max_queued_messages_set(0)
    return client


def _mqtt_sub(
    port: int, count: int, window: int, topic: str, client_id: str, mode: str, timeout: float
) -> dict[str, Any]:
    """mode: 'online' (subscribe, READY, receive), 'prepare' (create the
    persistent session and leave), 'drain' (READY, reconnect, receive)."""
    receipts = _Receipts(count)
    subscribed = threading.Event()
    done = threading.Event()
    client = _mqtt_client(client_id, clean=False, window=window)

    def on_connect(c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        c.subscribe(topic, qos=1)

    def on_subscribe(*_a: Any) -> None:
        subscribed.set()

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        if receipts.add(msg.payload, _now_ns()):
            done.set()

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    if mode == "drain":
        _ready()
    start = _now_ns()
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        if not subscribed.wait(timeout):
            return {"error": "no SUBACK"}
        if mode == "prepare":
            client.disconnect()
            return {"prepared": True}
        if mode == "online":
            _ready()
        done.wait(timeout)
        return receipts.summary(start)
    finally:
        client.disconnect()
        client.loop_stop()


def _mqtt_pub(
    port: int, count: int, window: int, topic: str, timeout: float, rate: float
) -> dict[str, Any]:
    acked = 0
    last_ack = 0
    all_acked = threading.Event()
    slots = threading.Semaphore(window)  # W publishes without PUBACK at most
    connected = threading.Event()
    client = _mqtt_client("semq-bench-pub", clean=True, window=window)

    def on_connect(*_a: Any) -> None:
        connected.set()

    def on_publish(*_a: Any) -> None:
        nonlocal acked, last_ack
        acked += 1
        last_ack = _now_ns()
        slots.release()
        if acked >= count:
            all_acked.set()

    client.on_connect = on_connect
    client.on_publish = on_publish
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        if not connected.wait(timeout):
            return {"error": "no CONNACK"}
        _ready()
        deadline = time.monotonic() + timeout
        start = _now_ns()
        for seq in range(count):  # bounded by count and the deadline
            if rate > 0:  # paced run: message seq leaves at start + seq / rate
                _sleep_until_ns(start + int(seq * 1e9 / rate))
            if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return {"error": f"timeout after {seq} publishes"}
            client.publish(topic, _payload(seq), qos=1)
        all_acked.wait(max(0.0, deadline - time.monotonic()))
        return {"acked": acked, "start_ns": start, "last_ack_ns": last_ack}
    finally:
        client.disconnect()
        client.loop_stop()


# NATS JetStream (nats-py, asyncio) ---------------------------------------------

_STREAM: Final = "SEMQBENCH"


async def _nats_connect(port: int) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=5, allow_reconnect=False)


async def _nats_sub(
    port: int, count: int, window: int, subject: str, durable: str, mode: str, timeout: float
) -> dict[str, Any]:
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js import api

    receipts = _Receipts(count)
    if mode == "drain":
        _ready()
    start = _now_ns()
    nc = await _nats_connect(port)
    try:
        js = nc.jetstream()
        if mode in ("online", "prepare"):
            await js.add_stream(
                api.StreamConfig(name=_STREAM, subjects=["bench.>"], storage=api.StorageType.FILE)
            )
            await js.add_consumer(
                _STREAM,
                api.ConsumerConfig(
                    durable_name=durable,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    filter_subject=subject,
                    max_ack_pending=max(1000, 4 * window),
                ),
            )
        if mode == "prepare":
            return {"prepared": True}
        psub = await js.pull_subscribe(subject, durable=durable, stream=_STREAM)
        if mode == "online":
            _ready()
        deadline = time.monotonic() + timeout
        complete = False
        while not complete and time.monotonic() < deadline:  # bounded by the deadline
            try:
                msgs = await psub.fetch(window, timeout=1.0)
            except NatsTimeout:
                continue
            for msg in msgs:
                complete = receipts.add(msg.data, _now_ns()) or complete
                await msg.ack()  # explicit ack (fire and forget, as the client does)
        await nc.flush()
        return receipts.summary(start)
    finally:
        await nc.close()


async def _nats_pub(
    port: int, count: int, window: int, subject: str, timeout: float, rate: float
) -> dict[str, Any]:
    import asyncio

    nc = await _nats_connect(port)
    try:
        # publish_async keeps at most `window` PubAcks outstanding (its semaphore).
        js = nc.jetstream(publish_async_max_pending=window)
        _ready()
        acked = 0
        last_ack = 0

        def on_ack(fut: asyncio.Future[Any]) -> None:
            nonlocal acked, last_ack
            if not fut.cancelled() and fut.exception() is None:
                acked += 1
                last_ack = _now_ns()

        start = _now_ns()

        async def publish_all() -> None:
            for seq in range(count):
                if rate > 0:  # paced run: message seq leaves at start + seq / rate
                    wait = (start + seq * 1e9 / rate - _now_ns()) / 1e9
                    if wait > 0:
                        await asyncio.sleep(wait)
                fut = await js.publish_async(subject, _payload(seq))
                fut.add_done_callback(on_ack)
            await js.publish_async_completed()

        try:
            await asyncio.wait_for(publish_all(), timeout)
        except TimeoutError:
            return {"error": f"timeout with {acked} of {count} acked"}
        return {"acked": acked, "start_ns": start, "last_ack_ns": last_ack}
    finally:
        await nc.close()


def _worker_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="peers.py --worker")
    p.add_argument("role", choices=["mqtt-sub", "mqtt-pub", "nats-sub", "nats-pub"])
    p.add_argument("mode", choices=["online", "prepare", "drain", "publish"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--window", type=int, required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--name", default="")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument(
        "--rate", type=float, default=0.0, help="msgs/s; 0 = as fast as the window allows"
    )
    a = p.parse_args(argv)
    try:
        if a.role == "mqtt-sub":
            out = _mqtt_sub(a.port, a.count, a.window, a.topic, a.name, a.mode, a.timeout)
        elif a.role == "mqtt-pub":
            out = _mqtt_pub(a.port, a.count, a.window, a.topic, a.timeout, a.rate)
        else:
            import asyncio

            if a.role == "nats-sub":
                coro = _nats_sub(a.port, a.count, a.window, a.topic, a.name, a.mode, a.timeout)
            else:
                coro = _nats_pub(a.port, a.count, a.window, a.topic, a.timeout, a.rate)
            out = asyncio.run(coro)
    except Exception as exc:  # reported to the parent as one JSON line
        out = {"error": f"{type(exc).__name__}: {exc}"}
    # CPU of all its threads from READY (connected) to the end: the work measured.
    out["cpu_s"] = time.process_time() - (_READY_CPU[0] if _READY_CPU else 0.0)
    print(json.dumps(out), flush=True)
    return 0


# --- one peer, one repeat -----------------------------------------------------


def _rate(count: int, start_ns: int, end_ns: int) -> float | None:
    return count / ((end_ns - start_ns) / 1e9) if end_ns > start_ns else None


def _measure_once(
    peer: str, binary: str, count: int, window: int, phase_timeout: float, deadline: float
) -> dict[str, Any]:
    """Start a fresh broker, run online (full, then half load), store and
    drain, stop the broker."""
    kind = "mqtt" if peer == "mosquitto" else "nats"
    sep = "/" if kind == "mqtt" else "."
    out: dict[str, Any] = {}

    def budget() -> float:
        left = deadline - time.monotonic()
        if left <= 1:
            raise TimeoutError("the total time budget is used up")
        return min(phase_timeout, left)

    with running_broker(peer, binary, window) as broker, _workers() as start:

        def worker(role: str, mode: str, topic: str, n: int, t: float, *extra: object) -> Worker:
            return start(
                f"{kind}-{role}", mode, "--port", broker.port, "--count", n,
                "--window", window, "--topic", f"bench{sep}{topic}",
                "--name", f"semq-bench-{topic}", "--timeout", t, *extra,
            )  # fmt: skip

        def broker_cpu() -> float:
            got = cpu_seconds(broker.proc.pid)
            if got is None:
                raise RuntimeError(f"{peer} exited: {broker.log_tail()}")
            return got

        def cpu_parts(n: int, broker_s: float, **workers: dict[str, Any]) -> dict[str, float]:
            """CPU us per message of each process: "broker", and the workers
            by role ("publisher", "subscriber")."""
            return {"broker": broker_s * 1e6 / n, **{k: w["cpu_s"] * 1e6 / n for k, w in workers.items()}}

        def online(topic: str, n: int, rate: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
            # Subscriber connected first, then the publisher sends n with window W.
            t = budget()
            b0 = broker_cpu()
            sub = worker("sub", "online", topic, n, t)
            sub.wait_ready(t)
            pub = worker("pub", "publish", topic, n, t, "--rate", rate)
            pub.wait_ready(t)
            p, s = pub.result(t + 5), sub.result(t + 5)
            if s["received"] < n:
                raise RuntimeError(f"{topic}: received {s['received']} of {n} within {t:.0f} s")
            return p, s, cpu_parts(n, broker_cpu() - b0, publisher=p, subscriber=s)

        p, s, out["online_cpu_parts"] = online("online", count, 0.0)
        out["online_cpu_us"] = sum(out["online_cpu_parts"].values())
        out["online_msgs_s"] = _rate(count, p["start_ns"], s["last_ns"])
        out["p50_ms"], out["p99_ms"] = s["p50_ms"], s["p99_ms"]
        out["online_duplicates"] = s["duplicates"]
        # The same at half the rate just measured: latency when not saturated
        # (the targets ask SEMQ for p99 at half load, so the peers get it too).
        half_n = max(1, count // 2)
        if out["online_msgs_s"]:
            half_rate = out["online_msgs_s"] / 2
            p, s, _ = online("half", half_n, half_rate)
            out["half_rate_msgs_s"] = half_rate
            out["half_p50_ms"], out["half_p99_ms"] = s["p50_ms"], s["p99_ms"]
        # store: create the persistent session / durable consumer, leave, publish N.
        t = budget()
        worker("sub", "prepare", "store", count, t).result(t)
        b0 = broker_cpu()
        pub = worker("pub", "publish", "store", count, t)
        pub.wait_ready(t)
        p = pub.result(t + 5)
        if p["acked"] < count:
            raise RuntimeError(f"store: {p['acked']} of {count} acked within {t:.0f} s")
        out["store_msgs_s"] = _rate(count, p["start_ns"], p["last_ack_ns"])
        out["store_cpu_parts"] = cpu_parts(count, broker_cpu() - b0, publisher=p)
        out["store_cpu_us"] = sum(out["store_cpu_parts"].values())
        # drain: the subscriber comes back and takes everything.
        t = budget()
        b0 = broker_cpu()
        sub = worker("sub", "drain", "store", count, t)
        sub.wait_ready(t)
        s = sub.result(t + 5)
        if s["received"] < count:
            raise RuntimeError(f"drain: received {s['received']} of {count} within {t:.0f} s")
        out["drain_msgs_s"] = _rate(count, s["start_ns"], s["last_ns"])
        out["drain_cpu_parts"] = cpu_parts(count, broker_cpu() - b0, subscriber=s)
        out["drain_cpu_us"] = sum(out["drain_cpu_parts"].values())
        out["drain_duplicates"] = s["duplicates"]
    return out


_FIGURES: Final = (
    "online_msgs_s",
    "p50_ms",
    "p99_ms",
    "half_rate_msgs_s",
    "half_p50_ms",
    "half_p99_ms",
    "store_msgs_s",
    "drain_msgs_s",
    "online_cpu_us",
    "store_cpu_us",
    "drain_cpu_us",
)


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if v is not None]
    return statistics.median(nums) if nums else None


def measure_peers(
    count: int = DEFAULT_COUNT,
    repeat: int = 1,
    *,
    peers: Sequence[str] = PEERS,
    window: int = DEFAULT_WINDOW,
    phase_timeout: float = DEFAULT_PHASE_TIMEOUT,
    budget: float = TOTAL_BUDGET,
) -> list[dict[str, Any]]:
    """Measure each peer ``repeat`` times (fresh broker each time) and return
    one row per peer with medians: ``peer``, ``label``, ``version``,
    ``online_msgs_s``, ``p50_ms``, ``p99_ms`` (full load), ``half_rate_msgs_s``,
    ``half_p50_ms``, ``half_p99_ms`` (paced at half the online rate, N/2
    messages), ``store_msgs_s``, ``drain_msgs_s``, ``ack_promise``, ``runs``, ``errors`` (figures are None
    where a phase failed). Installs what is missing first (not counted in
    ``budget``). Every broker and worker process it starts is stopped before it
    returns or raises."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    if count < 1 or repeat < 1:
        raise ValueError(f"count {count} and repeat {repeat} must be >= 1")
    binaries = ensure_brokers(peers)
    ensure_clients(peers)
    deadline = time.monotonic() + budget
    rows: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
    errors: dict[str, list[str]] = {p: [] for p in peers}
    # Interleave the peers per repeat so a noisy neighbour hits both alike.
    for r in range(repeat):
        for peer in peers:
            _log(f"{peer}: run {r + 1} of {repeat}, {count} messages")
            try:
                runs[peer].append(
                    _measure_once(peer, binaries[peer], count, window, phase_timeout, deadline)
                )
            except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as exc:
                _log(f"{peer}: run {r + 1} failed: {exc}")
                errors[peer].append(str(exc))
    for peer in peers:
        version = _broker_version(peer, binaries[peer])
        row: dict[str, Any] = {
            "peer": peer,
            "version": version,
            "label": _PEER_LABEL[peer].format(version=version),
        }
        for key in _FIGURES:
            row[key] = _median([run.get(key) for run in runs[peer]])
        row["runs"] = runs[peer]
        row["errors"] = errors[peer]
        row["ack_promise"] = ack_promise(peer)
        rows.append(row)
    return rows


# --- output ------------------------------------------------------------------


def machine_facts() -> dict[str, str]:
    return {
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(),
        "paho-mqtt": _dist_version("paho-mqtt"),
        "nats-py": _dist_version("nats-py"),
    }


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def render_table(rows: list[dict[str, Any]], *, count: int, repeat: int, window: int) -> str:
    f = machine_facts()
    lines = [
        f"Peer brokers: 1 KiB messages, N={count}, window {window}, median of {repeat}",
        f"machine: nproc {f['nproc']}, Python {f['python']}, {f['date']}, Linux {f['kernel']}; "
        f"clients paho-mqtt {f['paho-mqtt']}, nats-py {f['nats-py']}",
        "",
        "| peer | online msgs/s | p50 ms | p99 ms | store msgs/s | drain msgs/s "
        "| p50 / p99 ms at half load | CPU us/msg online / store / drain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {_fmt(row['online_msgs_s'])} | {_fmt(row['p50_ms'], 1)} "
            f"| {_fmt(row['p99_ms'], 1)} | {_fmt(row['store_msgs_s'])} | {_fmt(row['drain_msgs_s'])} "
            f"| {_fmt(row['half_p50_ms'], 1)} / {_fmt(row['half_p99_ms'], 1)} "
            f"| {_fmt(row['online_cpu_us'])} / {_fmt(row['store_cpu_us'])} / {_fmt(row['drain_cpu_us'])} |"
        )
    lines.append("")
    lines.append("CPU us/msg = user + system CPU time of the broker, the publisher and the subscriber processes"
                 " (from /proc and each client's own clock, from connected to done) / messages.")
    lines.append("What an ack promises:")
    lines.extend(f"- {row['ack_promise']}" for row in rows)
    lines.extend(f"installed on demand: {what}" for what in _INSTALLED)
    for row in rows:
        for err in row["errors"]:
            lines.append(f"! {row['peer']}: {err}")
    return "\n".join(lines)


def _on_sigterm(_signum: int, _frame: object) -> None:
    # Turn SIGTERM into an exception so every `finally` stops its broker.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``peers [--count N] [--repeat R] [--peers mosquitto,nats] [--window W]
    [--phase-timeout S] [--json]``. Exit 0 when every figure was measured, 1
    when some failed, 2 on a usage error, 130 on Ctrl-C."""
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        return _worker_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="bench peers", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument(
        "--count", type=int, default=DEFAULT_COUNT, help="messages per phase (default %(default)s)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, choices=[1, 2, 3], help="runs; medians are shown"
    )
    p.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated subset of mosquitto,nats"
    )
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="unacked publishes in flight")
    p.add_argument("--phase-timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    bad = [x for x in peers if x not in PEERS]
    if bad or not peers:
        print(f"error: unknown peer(s) {bad}; choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2
    if args.count < 1 or args.window < 1:
        print("error: --count and --window must be >= 1", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        rows = measure_peers(
            args.count,
            args.repeat,
            peers=peers,
            window=args.window,
            phase_timeout=args.phase_timeout,
        )
    except KeyboardInterrupt:
        print("interrupted: brokers stopped", file=sys.stderr)
        return 130
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render_table(rows, count=args.count, repeat=args.repeat, window=args.window))
    return 1 if any(row["errors"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
