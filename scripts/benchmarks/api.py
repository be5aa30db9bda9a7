"""The node's HTTP API beside its user socket: send and inbox-read rates, and CPU per document, in one run.

Real ``semq`` processes on 127.0.0.1 in a fresh temporary directory,
security on: a platform P and nodes A and B, each serving the web console
and its HTTP API (``--web 127.0.0.1:0``), a user ``alice`` on A and ``bob``
on B (``semq user add``: their tokens).

Phases, each with ``--clients`` client threads in this process, every
client with one connection kept open (a UserClient on the Unix socket; an
httpx.Client with keep-alive over HTTPS, HTTP/1.1, TLS to the console's
certificate):

``send``   alice sends ``--count`` documents of ``--size`` bytes to ``B/bob``
           over the user socket, then as many over the API (``POST
           /api/v1/documents``, the body raw). B is not running yet, so
           nothing but A's acceptance is measured; each answer means durable.
``read``   B starts and receives all of them (and ``--count`` more alice sent
           over the socket, untimed); bob reads ``--count`` over the user
           socket (pages of 100 with their contents inline, each page
           acknowledged), as many over the API the same way (``GET
           /api/v1/inbox?content=1`` pages of 100, ``POST /api/v1/inbox/ack``
           per page), and as many over the API one request per content
           (``GET /api/v1/inbox`` pages of 100, ``GET .../content`` per
           document, an acknowledgement per page).

Per phase and way: documents/s (documents / the phase's wall time), the
node's CPU per document (user + system of the node process, /proc) and
the clients' (this process's, ``os.times``), in ms.

``hostile`` (after the sends; ``--hostile N``, default 200, 0: none): N
           connections at once at A's API, each a POST streaming junk for
           10 s, half from 127.0.0.2 with wrong tokens declaring 1 GiB, half
           with mallory's (a user of A with bad intent) declaring 5 TiB,
           while alice sends 200
           documents over the API: A's RSS and descriptors before and at
           their peak, the answers the attackers got, alice's time.

Run: ``scripts/bench api [--count N] [--size BYTES] [--clients C] [--hostile N] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

if __package__:
    from ._proc import cpu_seconds
    from ._table import print_table
    from .load import B, BenchError, Cluster, _log, wait_for
else:  # run as a file
    from _proc import cpu_seconds  # type: ignore[no-redef]
    from _table import print_table  # type: ignore[no-redef]
    from load import B, BenchError, Cluster, _log, wait_for  # type: ignore[no-redef]

PAGE: Final = 100


class WebCluster(Cluster):
    """load.Cluster whose nodes serve the web console and the API."""

    def start(self, name: str) -> float:
        if name == "P":
            return super().start(name)
        import subprocess

        log = self.root / f"{name}.log"
        t0 = time.monotonic()
        with log.open("ab") as f:
            p = subprocess.Popen([*_semq(), "node", "run", "--dir", name, "--web", "127.0.0.1:0"], cwd=self.root,
                                 env=self.env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        wait_for(lambda: _status(self.root / name).get("web") or p.poll() is not None, self.start_timeout,
                 f"{name}'s web console")
        if p.poll() is not None:
            raise BenchError(f"{name} exited {p.returncode}: {self.tail(name)}")
        return time.monotonic() - t0

    def url(self, name: str) -> str:
        return "https://" + str(_status(self.root / name)["web"])

    def token(self, node: str, user: str) -> str:
        import subprocess

        r = subprocess.run([*_semq(), "user", "add", user, "--dir", node], cwd=self.root, env=self.env,
                           capture_output=True, timeout=60)
        if r.returncode:
            raise BenchError(f"semq user add {user}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout.decode().split()[-1]


def _semq() -> list[str]:
    import sys

    return [sys.executable, "-m", "semq"]


def _status(d: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((d / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def _split(items: list[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` contiguous runs, as even as they come."""
    out, start = [], 0
    for i in range(parts):
        n = len(items) // parts + (1 if i < len(items) % parts else 0)
        out.append(items[start:start + n])
        start += n
    return out


def _parallel(clients: int, count: int, work: Callable[[int, int], None]) -> None:
    """``work(client, n)`` on ``clients`` threads, ``count`` documents shared out."""
    share = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i, share[i])
        except BaseException as e:  # (reported after the join)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"a client failed: {errors[0]!r}") from errors[0]


def _measure(c: WebCluster, node: str, count: int, clients: int, work: Callable[[int, int], None]) -> dict[str, float]:
    pid = c.pid(node)
    assert pid is not None
    cpu0, own0, t0 = cpu_seconds(pid) or 0.0, os.times(), time.monotonic()
    _parallel(clients, count, work)
    wall = time.monotonic() - t0
    own1, cpu1 = os.times(), cpu_seconds(pid) or 0.0
    client = (own1.user - own0.user) + (own1.system - own0.system)
    return {"rate": count / wall, "node_ms": (cpu1 - cpu0) / count * 1000, "client_ms": client / count * 1000,
            "wall": wall}


def _hostile(c: WebCluster, a: argparse.Namespace, ctx: Any, token: str, mallory: str, body: bytes) -> list[str]:
    """``--hostile N`` connections to A's API at once, each a POST that
    streams junk for 10 s: half from 127.0.0.2 with wrong tokens declaring
    1 GiB, half with the token of mallory (a user of A with bad intent)
    declaring 5 TiB (over ``max_document_mib``). Meanwhile alice, from 127.0.0.1, sends 200
    documents over the API. Returns the lines to print: A's RSS and
    descriptors before and at their peak, what the attackers pushed, how
    long alice's documents took."""
    import socket

    import httpx

    from semq.testing.hostile import process_usage

    pid = c.pid("A")
    assert pid is not None
    host, port = c.url("A").removeprefix("https://").rsplit(":", 1)
    before = process_usage(pid)
    peak = [before.rss, before.fds]
    stop = threading.Event()
    pushed, cut, answers = [0], [0], {}
    lock = threading.Lock()

    def sample() -> None:
        while not stop.wait(0.2):
            try:
                u = process_usage(pid)
            except OSError:
                return
            peak[0], peak[1] = max(peak[0], u.rss), max(peak[1], u.fds)

    def one(i: int) -> None:
        good = i % 2 == 1
        head = (f"POST /api/v1/documents?to={B} HTTP/1.1\r\nhost: {host}\r\n"
                f"authorization: Bearer {mallory if good else f'semq_wrong{i}'}\r\n"
                f"content-length: {(5 << 40) if good else (1 << 30)}\r\n\r\n").encode()
        n, status = 0, "?"
        try:
            with socket.create_connection((host, int(port)), timeout=15,
                                          source_address=("127.0.0.1" if good else "127.0.0.2", 0)) as raw, \
                    ctx.wrap_socket(raw, server_hostname=host) as s:
                s.sendall(head)
                junk = b"x" * 65536
                end = time.monotonic() + 10
                s.settimeout(0.5)
                while time.monotonic() < end:
                    try:
                        n += s.send(junk)
                    except TimeoutError:
                        continue
                s.settimeout(2)
                status = s.recv(64).decode("latin-1").split(" ")[1] if n >= 0 else "?"
        except (OSError, IndexError):
            with lock:
                cut[0] += 1
        with lock:
            pushed[0] += n
            answers[status] = answers.get(status, 0) + 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    attackers = [threading.Thread(target=one, args=(i,)) for i in range(a.hostile)]
    t0 = time.monotonic()
    for t in attackers:
        t.start()
    with httpx.Client(base_url=c.url("A"), verify=ctx, headers={"authorization": f"Bearer {token}"},
                      timeout=60) as h:
        for _ in range(200):
            r = h.post("/api/v1/documents", params={"to": f"{B}/bob"}, content=body)
            if r.status_code != 201:
                raise BenchError(f"API send during the flood: {r.status_code} {r.text}")
    docs_s = time.monotonic() - t0
    for t in attackers:
        t.join(30)
    stop.set()
    sampler.join(5)
    mib = 1 << 20
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))
    return [f"hostile: {a.hostile} connections at once, each streaming junk for 10 s ({a.hostile // 2} from"
            f" 127.0.0.2 with wrong tokens declaring 1 GiB, {a.hostile - a.hostile // 2} with mallory's token"
            " declaring 5 TiB)",
            f"  A: RSS {before.rss / mib:,.0f} -> peak {peak[0] / mib:,.0f} MiB, descriptors {before.fds} -> {peak[1]};"
            f" the attackers pushed {pushed[0] / mib:,.1f} MiB into their sockets; answers {shown}"
            f" ({cut[0]} cut without one)",
            f"  alice's 200 documents over the API meanwhile, from 127.0.0.1: all 201 in {docs_s:.1f} s"]


def run(a: argparse.Namespace, tmp: Path) -> tuple[list[list[str]], list[str]]:
    import ssl

    import httpx

    from semq.ops.userclient import UserClient

    c = WebCluster(tmp, secure=True)
    rows: list[list[str]] = []
    try:
        alice, bob, mallory = c.token("A", "alice"), c.token("B", "bob"), c.token("A", "mallory")
        c.start("P")
        c.start("A")
        body = os.urandom(a.size)
        a_ctx = ssl.create_default_context(cafile=str(tmp / "A" / "console" / "console.pem"))

        def sock_send(i: int, n: int) -> None:
            with UserClient(tmp / "A" / "user.sock", "alice", alice) as u:
                for _ in range(n):
                    u.send(f"{B}/bob", body, data_type="BENCH")

        def api_send(i: int, n: int) -> None:
            with httpx.Client(base_url=c.url("A"), verify=a_ctx, headers={"authorization": f"Bearer {alice}"},
                              timeout=60) as h:
                for _ in range(n):
                    r = h.post("/api/v1/documents", params={"to": f"{B}/bob", "data_type": "BENCH"}, content=body)
                    if r.status_code != 201:
                        raise BenchError(f"API send: {r.status_code} {r.text}")

        hostile_lines: list[str] = []
        _log(f"send: {a.count} documents of {a.size} bytes over the user socket ({a.clients} clients)")
        s_sock = _measure(c, "A", a.count, a.clients, sock_send)
        _log(f"send: {a.count} documents over the HTTP API")
        s_api = _measure(c, "A", a.count, a.clients, api_send)
        if a.hostile:
            _log(f"hostile: {a.hostile} connections at A's API")
            hostile_lines = _hostile(c, a, a_ctx, alice, mallory, body)
        _log(f"send: {a.count} more over the user socket (not timed: for the third way of reading)")
        _parallel(a.clients, a.count, sock_send)
        c.start("B")
        b_ctx = ssl.create_default_context(cafile=str(tmp / "B" / "console" / "console.pem"))
        with httpx.Client(base_url=c.url("B"), verify=b_ctx, headers={"authorization": f"Bearer {bob}"}) as h:
            wait_for(lambda: h.get("/api/v1/inbox", params={"limit": 1}).json()["total"] >= 3 * a.count, 600,
                     f"B to receive {3 * a.count} documents")
            # Bob's documents in id order (not timed): the user socket's
            # phase reads the first half, the API's the second; each client
            # a contiguous range of its phase's half.
            ids: list[int] = []
            while len(ids) < 3 * a.count:
                ids += [d["id"] for d in h.get("/api/v1/inbox", params={"after": ids[-1] if ids else 0,
                                                                         "limit": 1000}).json()["documents"]]
        ranges = {way: _split(ids[k * a.count:(k + 1) * a.count], a.clients) for k, way in enumerate(("sock", "api", "pages"))}

        def sock_read(i: int, n: int) -> None:
            mine = ranges["sock"][i]
            with UserClient(tmp / "B" / "user.sock", "bob", bob) as u:
                after, left = mine[0] - 1, len(mine)
                while left > 0:
                    items = u.inbox(limit=min(PAGE, left), after_id=after, data=True)
                    if not items or any(len(d["data"]) != a.size for d in items):
                        raise BenchError("the user socket's inbox ran dry or gave a short content")
                    u.acknowledge([d["id"] for d in items])
                    after, left = items[-1]["id"], left - len(items)

        def api_pages(i: int, n: int) -> None:
            mine = ranges["pages"][i]
            with httpx.Client(base_url=c.url("B"), verify=b_ctx, headers={"authorization": f"Bearer {bob}"},
                              timeout=60) as h:
                after, left = mine[0] - 1, len(mine)
                while left > 0:
                    docs = h.get("/api/v1/inbox", params={"after": after, "limit": min(PAGE, left),
                                                          "content": 1}).json()["documents"]
                    if not docs or any(len(d.get("content_base64", "")) != (a.size + 2) // 3 * 4 for d in docs):
                        raise BenchError("the API's inbox ran dry or a page came without a content")
                    h.post("/api/v1/inbox/ack", json={"ids": [d["id"] for d in docs]})
                    after, left = docs[-1]["id"], left - len(docs)

        def api_read(i: int, n: int) -> None:
            mine = ranges["api"][i]
            with httpx.Client(base_url=c.url("B"), verify=b_ctx, headers={"authorization": f"Bearer {bob}"},
                              timeout=60) as h:
                after, left = mine[0] - 1, len(mine)
                while left > 0:
                    page = h.get("/api/v1/inbox", params={"after": after, "limit": min(PAGE, left)}).json()
                    docs = page["documents"]
                    if not docs:
                        raise BenchError("the API's inbox ran dry")
                    for d in docs:
                        if len(h.get(f"/api/v1/inbox/{d['id']}/content").content) != a.size:
                            raise BenchError(f"document {d['id']}: short content")
                    h.post("/api/v1/inbox/ack", json={"ids": [d["id"] for d in docs]})
                    after, left = docs[-1]["id"], left - len(docs)

        _log(f"read: {a.count} documents over the user socket")
        r_sock = _measure(c, "B", a.count, a.clients, sock_read)
        _log(f"read: {a.count} documents over the HTTP API")
        r_api = _measure(c, "B", a.count, a.clients, api_read)
        _log(f"read: {a.count} documents over the HTTP API, pages with their contents")
        r_pages = _measure(c, "B", a.count, a.clients, api_pages)
        for phase, way, m in (("send", "user socket", s_sock), ("send", "HTTP API", s_api),
                              ("read + ack", "user socket", r_sock),
                              ("read + ack", "HTTP API, pages with contents", r_pages),
                              ("read + ack", "HTTP API, a request per content", r_api)):
            rows.append([phase, way, f"{m['rate']:,.0f}", f"{m['node_ms']:.2f}", f"{m['client_ms']:.2f}",
                         f"{m['wall']:.1f}"])
    finally:
        c.stop_all()
    return rows, hostile_lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench api", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--count", type=int, default=2000, help="documents per phase and way (default 2000)")
    p.add_argument("--size", type=int, default=1024, help="bytes per document (default 1024)")
    p.add_argument("--clients", type=int, default=4, help="client threads, each one connection (default 4)")
    p.add_argument("--hostile", type=int, default=200,
                   help="hostile connections in the flood phase after the sends (0: none; default 200)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, stores)")
    a = p.parse_args(argv)
    if a.count < a.clients or a.clients < 1 or not 1 <= a.size <= 1 << 20:
        p.error(f"--count {a.count} must be >= --clients {a.clients} >= 1, --size 1..1048576")
    tmp = Path(tempfile.mkdtemp(prefix="semq-bench-api-"))
    try:
        rows, hostile_lines = run(a, tmp)
    except BenchError as e:
        print(f"error: {e}")
        return 1
    finally:
        if a.keep:
            _log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_table(f"HTTP API beside the user socket: {a.count} documents of {a.size} bytes per phase and way,"
                f" {a.clients} clients", ["phase", "way", "docs/s", "node CPU ms/doc", "client CPU ms/doc", "wall s"],
                rows, notes=["node CPU: the node process's user + system time (/proc); client CPU: this process's"
                             " (the client threads), both per document.",
                             "send: A alone (B not yet running): durable acceptance only, one document per request."
                             " read: bob's pages of 100, each acknowledged.",
                             "2 vCPUs shared with other work: figures move by +-20-30 %.", *hostile_lines])
    return 0
