"""Direct links between nodes (semq.node.daemon.direct), as real processes on
127.0.0.1: documents go straight from origin to target over mutual TLS
when the target listens, through the platform otherwise, and exactly once
either way. Faults on a link come from semq.testing.faultproxy, put
between the nodes with ``--announce``."""

from __future__ import annotations

import json
import re
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.identity.security import NodeSecurity
from semq.testing.faultproxy import Direction, FaultPlan, RefuseMode
from semq.umxt_protocol import (
    LK0,
    Data,
    Endpoint,
    Error,
    FrameDecoder,
    Hello,
    Kind,
    RawFrame,
    ResultCode,
    encode_frame,
)
from semq.umxt_protocol import Frame as UFrame
from tests._chaos import events
from tests._procs import Cluster, ThreadedFaultProxy, free_port, read_status, set_config, wait_until
from tests.e2e.test_e2e_flow import send

pytestmark = pytest.mark.e2e

A, B, C = "10008", "56001", "77000"
LISTEN = ("--listen", "127.0.0.1:0")
RETRY = 1.0  # s: direct_retry of the diallers here (default 10)
CUT_AT = 8_000  # bytes from B to A before the link is cut: its WELCOME, pongs, ~200 ACK2s


# ---------------------------------------------------------------- reading the nodes


def _direct(org_dir: Path) -> dict[str, Any]:
    """The "direct" object of a node's status.json (rewritten every second)."""
    return dict(read_status(org_dir).get("direct") or {})


def _wait_direct(org_dir: Path, pred: Callable[[dict[str, Any]], Any], timeout: float, what: str) -> None:
    """Until ``pred`` holds for the node's "direct" status; the last one
    read is in the error."""
    last: dict[str, Any] = {}

    def check() -> Any:
        nonlocal last
        last = _direct(org_dir)
        return last and pred(last)

    try:
        wait_until(check, timeout, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {last}") from None


def _up(d: dict[str, Any], direction: str) -> list[dict[str, Any]]:
    """The links up in a "direct" status, "out" (dialled) or "in"."""
    return [x for x in d.get("links", []) if x["direction"] == direction and x["state"] == "up"]


def _idle(d: dict[str, Any]) -> bool:
    """A link dialled and up, with no document awaiting its answer (every
    answer gave the link its window credit back)."""
    links = _up(d, "out")
    return bool(links) and all(x["in_flight"] == 0 for x in links)


def _why(d: dict[str, Any], target: str) -> str:
    """Why ``target`` has no link now (the "waiting" entry), or ""."""
    return str((d.get("waiting") or {}).get(target, {}).get("why", ""))


def _paths(c: Cluster, org: str) -> dict[str, str]:
    """Per document ``org`` received (``ORIGIN/RECORD``): the path of its
    first copy, "direct" or "relay" (its received event)."""
    out: dict[str, str] = {}
    for e in events(c.root / org):
        if e.get("event") == "received" and e.get("role") == "receiver":
            origin, _, _, rid = e["lk0"].split("/")
            out.setdefault(f"{origin}/{rid}", e["path"])
    return out


def _announced(c: Cluster, org: str) -> bool:
    return c.count("P", "SELECT count(*) FROM peers WHERE node_id=?", org) == 1


def _empty(c: Cluster, *orgs: str) -> bool:
    """Nothing left to send or to acknowledge at ``orgs``."""
    return all(c.count(o, "SELECT count(*) FROM outbox") == 0 and c.count(o, "SELECT count(*) FROM inbound") == 0
               for o in orgs)


def _with_proxy(c: Cluster, org: str, plan: FaultPlan | None = None) -> tuple[ThreadedFaultProxy, tuple[str, ...]]:
    """A fault proxy in front of ``org``'s listener-to-be, and the options
    that make ``org`` listen behind it and announce the proxy."""
    port = free_port()
    proxy = ThreadedFaultProxy(port, plan)
    return proxy, ("--listen", f"127.0.0.1:{port}", "--announce", f"127.0.0.1:{proxy.port}")


# ---------------------------------------------------------------- 1. the direct path


def test_direct_link_carries_documents_and_outlives_the_platform(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(B, *LISTEN)
    cluster.start_node(A)
    wait_until(lambda: _announced(cluster, B), 10, "B's addresses at the platform")
    # The first documents go through the platform (A has no certificate of
    # B before them); they make A dial B, and the later ones go direct.
    sent = send(cluster, A, B, 20, key_prefix="W")
    _wait_direct(cluster.root / A, lambda d: _up(d, "out"), 15, "A's direct link to B")
    sent |= send(cluster, A, B, 50, key_prefix="D")
    wait_until(lambda: len(cluster.inbox(B)) == 70, 20, "70 documents at B")
    assert cluster.inbox(B) == sent
    paths = _paths(cluster, B)
    assert sum(1 for k in sent if paths.get(k) == "direct") >= 50, paths
    # (status.json is rewritten every second)
    wait_until(lambda: read_status(cluster.root / A).get("sent_direct", 0) >= 50, 5, "A's sent_direct")
    _wait_direct(cluster.root / B, lambda d: _up(d, "in"), 5, "B's inbound link in its status")
    wait_until(lambda: _empty(cluster, A, B), 20, "A's and B's tables empty")
    # The platform dies; the link does not need it.
    cluster.kill("P", signal.SIGKILL)
    later = send(cluster, A, B, 100, key_prefix="K")
    wait_until(lambda: len(cluster.inbox(B)) == 170, 20, "100 more documents at B without the platform")
    assert cluster.inbox(B) == sent | later  # (inbox() fails on a document twice)
    paths = _paths(cluster, B)
    assert all(paths[k] == "direct" for k in later), {k: paths.get(k) for k in later}
    wait_until(lambda: _empty(cluster, A, B), 20, "A's outbox empty")
    _wait_direct(cluster.root / A, _idle, 5, "A's link up with nothing in flight")


# ---------------------------------------------------------------- 2. fallback and back


def test_an_unreachable_listener_falls_back_to_the_platform_then_the_link_comes_back(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    set_config(cluster.root / A, direct_retry=RETRY)
    proxy, options = _with_proxy(cluster, B)
    try:
        # A black hole where B says it listens: connections accepted, never answered.
        proxy.call(proxy.proxy.refuse_for, 3600, mode=RefuseMode.HOLD)
        cluster.start_platform()
        cluster.start_node(B, *options)
        cluster.start_node(A)
        wait_until(lambda: _announced(cluster, B), 10, "B's addresses at the platform")
        t0 = time.monotonic()
        relayed = send(cluster, A, B, 30, key_prefix="R")
        wait_until(lambda: len(cluster.inbox(B)) == 30, 20, "30 documents through the platform")
        assert cluster.inbox(B) == relayed
        paths = _paths(cluster, B)
        assert all(paths[k] == "relay" for k in relayed), paths
        # A tried, the proxy swallowed it, and A says why it is waiting.
        _wait_direct(cluster.root / A, lambda d: "no answer in time" in _why(d, B) and not _up(d, "out"), 10,
                     "A's status saying why B has no link")
        assert proxy.call(proxy.proxy.statistics).refusals >= 1
        wait_until(lambda: _empty(cluster, A, B), 20, "A's and B's tables empty")
        blocked_s = time.monotonic() - t0
        # The way opens: A's next try (direct_retry, doubling) makes the link.
        proxy.call(proxy.proxy.refuse_for, 0)
        _wait_direct(cluster.root / A, lambda d: [x["address"] for x in _up(d, "out")] == [f"127.0.0.1:{proxy.port}"],
                     15 + blocked_s, "A's direct link to B, to the address B announced")
        later = send(cluster, A, B, 30, key_prefix="L")
        wait_until(lambda: len(cluster.inbox(B)) == 60, 20, "30 more documents at B")
        assert cluster.inbox(B) == relayed | later
        paths = _paths(cluster, B)
        assert all(paths[k] == "direct" for k in later), {k: paths.get(k) for k in later}
        wait_until(lambda: _empty(cluster, A, B), 20, "A's and B's tables empty")
    finally:
        cluster.stop_all()
        proxy.close()


# ---------------------------------------------------------------- 3. a link cut mid-stream


def test_a_link_cut_mid_stream_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    """The link is cut when B has sent back ``CUT_AT`` bytes (its WELCOME,
    pongs, the ACK2s of the first documents of a stream of 600): A has
    documents in flight, some of which B already has but whose ACK2 was
    lost. They go again, through the platform and then the link again, and
    B suppresses the copies it has."""
    for o in (A, B):
        cluster.add_org(o)
    set_config(cluster.root / A, direct_retry=RETRY)
    proxy, options = _with_proxy(cluster, B, FaultPlan(cut_probability=1.0, cut_directions=(Direction.DOWN,),
                                                        cut_offset=(CUT_AT, CUT_AT), cut_reset=True))
    stats = proxy.proxy.statistics
    try:
        cluster.start_platform()
        cluster.start_node(B, *options)
        cluster.start_node(A)
        wait_until(lambda: _announced(cluster, B), 10, "B's addresses at the platform")
        sent = send(cluster, A, B, 5, key_prefix="W")
        _wait_direct(cluster.root / A, lambda d: _up(d, "out"), 15, "A's direct link to B")
        wait_until(lambda: len(cluster.inbox(B)) == 5, 15, "the first documents at B")
        n, per = 600, 20

        def stream() -> None:  # A's application hands over 20 documents every 10 ms
            for i in range(n // per):
                # Half the stream is an ordered channel: in order across the
                # cut, the resends and the two paths.
                sent.update(send(cluster, A, B, per, size=1024, key_prefix=f"S{i:02d}-",
                                 **({"ordered": "stream"} if i % 2 else {})))
                time.sleep(0.01)

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        try:
            wait_until(lambda: proxy.call(stats).cuts == 1, 20, "the cut")
            proxy.call(proxy.proxy.set_pass_through, True)  # (the next connections are not cut)
            at_cut = len(cluster.inbox(B))
        finally:
            t.join(60)
        assert not t.is_alive()
        assert 5 < at_cut < n + 5, at_cut  # mid-stream
        wait_until(lambda: len(cluster.inbox(B)) == n + 5, 30, f"all {n + 5} documents at B")
        assert cluster.inbox(B) == sent  # (inbox() fails on a document twice)
        ordered = [r for (r,) in cluster.q(B, "SELECT record_id FROM inbox WHERE channel='stream' ORDER BY id")]
        assert len(ordered) == n // 2 and ordered == sorted(ordered)
        wait_until(lambda: _empty(cluster, A, B), 30, "A's outbox and B's pending acks empty")
        # The documents in flight went again, some of them twice to B.
        log = (cluster.root / f"{A}.log").read_text()
        assert re.search(rf"direct link to {B} down \(the link broke: [^)]+\); [1-9][0-9]* document\(s\) in flight"
                         " go again", log), log
        assert "Exceptions from" not in log  # (the reason names the error, not its group)
        duplicates = sum(1 for e in events(cluster.root / B) if e.get("event") == "duplicate")
        assert duplicates > 0
        # The link came back (a second connection), with nothing left in flight.
        wait_until(lambda: proxy.call(stats).connections >= 2, 10, "A dialling B again")
        _wait_direct(cluster.root / A, lambda d: _idle(d) and d["sent_again"] > 0, 5,
                     "A's link back, nothing in flight, documents counted as sent again")
        print(f"cut with {at_cut} documents at B; {duplicates} copies suppressed")
    finally:
        cluster.stop_all()
        proxy.close()


# ---------------------------------------------------------------- 4. who may speak on a link


class _RawLink:
    """A TLS client speaking UMX-T bytes to a node's listener, as a
    dishonest node would."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock = ctx.wrap_socket(raw, server_hostname=None)  # (handshakes here)
        self.dec = FrameDecoder()

    def send(self, frame: UFrame) -> None:
        self.sock.sendall(encode_frame(frame))

    def read(self, until: Any, timeout: float = 5) -> tuple[list[RawFrame], bool]:
        """Frames until ``until(frames)`` holds or the node closes the
        connection (then True); bounded by ``timeout``."""
        frames: list[RawFrame] = []
        deadline = time.monotonic() + timeout
        while not until(frames):
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no answer within {timeout}s; frames so far: {frames}") from None
            except (ssl.SSLError, OSError):
                return frames, True
            if not data:
                return frames, True
            self.dec.receive_data(data)
            frames += self.dec.frames()
        return frames, False

    def close(self) -> None:
        self.sock.close()


def _hello(source: str, target: str) -> UFrame:
    return UFrame(kind=Kind.HELLO, source=Endpoint.org(source), target=Endpoint.org(target),
                  body=Hello(window=16, software="test-impostor"))


def _error(frames: list[RawFrame]) -> ResultCode | None:
    for f in frames:
        if f.kind is Kind.ERROR:
            body = f.frame().body
            assert isinstance(body, Error)
            return body.code
    return None


def test_a_listener_refuses_impostors(cluster: Cluster) -> None:
    for o in (A, B, C):
        cluster.add_org(o)  # C: enrolled (a certificate of the same CA), never run
    cluster.start_platform()
    cluster.start_node(B, *LISTEN)
    bdir = cluster.root / B
    listening = wait_until(lambda: _direct(bdir).get("listening"), 10, "B's listening address")
    port = int(listening.rpartition(":")[2])
    ctx = NodeSecurity(cluster.root / C).direct_contexts()[1]
    never = lambda frames: False  # noqa: E731 (read until closed)

    # C's certificate, a HELLO claiming to be A: AUTH_FAILED, closed.
    link = _RawLink(port, ctx)
    try:
        link.send(_hello(A, B))
        frames, closed = link.read(never)
    finally:
        link.close()
    assert _error(frames) is ResultCode.AUTH_FAILED and closed, frames
    assert not any(f.kind is Kind.WELCOME for f in frames)
    wait_until(lambda: _direct(bdir).get("refused_in") == 1, 5, "B counting the refusal")

    # C as itself: welcome; then a DATA frame whose source is A: SOURCE_MISMATCH, closed.
    link = _RawLink(port, ctx)
    try:
        link.send(_hello(C, B))
        frames, closed = link.read(lambda fs: any(f.kind is Kind.WELCOME for f in fs))
        assert not closed and frames[0].kind is Kind.WELCOME, frames
        link.send(UFrame(kind=Kind.DATA, source=Endpoint.org(A), target=Endpoint.org(B),
                         body=Data(lk0=LK0(endpoint=Endpoint.org(A), record_id=1), app_data=b"forged",
                                   created_ms=int(time.time() * 1000))))
        frames, closed = link.read(never)
    finally:
        link.close()
    assert _error(frames) is ResultCode.SOURCE_MISMATCH and closed, frames

    # No certificate at all: refused at the TLS handshake (TLS 1.3: the
    # client hears it when it first reads).
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    bare.verify_mode = ssl.CERT_NONE
    try:
        link = _RawLink(port, bare)
    except (ssl.SSLError, OSError):
        frames, closed = [], True
    else:
        try:
            link.send(_hello(C, B))
            frames, closed = link.read(never)
        finally:
            link.close()
    assert frames == [] and closed, frames
    wait_until(lambda: _direct(bdir).get("refused_in") == 2, 5, "B counting the handshake refusal")

    assert cluster.inbox(B) == {}  # nothing delivered
    assert _direct(bdir).get("links_in") == 1  # (C's own, the one SOURCE_MISMATCH closed)
    log = (cluster.root / f"{B}.log").read_text()
    assert f"the TLS certificate names organization {C}, not" in log
    assert "claims source" in log and "refused at the TLS handshake" in log


# ---------------------------------------------------------------- 5. policies


def test_policies_never_and_direct_from_send_through_the_platform(cluster: Cluster) -> None:
    """B accepts direct links from C only; C's policy is never: A is
    refused at the look-up, C does not ask, and both get through."""
    for o in (A, B, C):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(B, *LISTEN, "--direct-from", C)
    cluster.start_node(A)
    cluster.start_node(C, "--direct", "never")
    wait_until(lambda: _announced(cluster, B), 10, "B's addresses at the platform")
    from_a = send(cluster, A, B, 20, key_prefix="A")
    from_c = send(cluster, C, B, 20, key_prefix="C")
    wait_until(lambda: len(cluster.inbox(B)) == 40, 20, "40 documents at B")
    assert cluster.inbox(B) == from_a | from_c
    _wait_direct(cluster.root / A, lambda d: "does not accept direct links from us" in _why(d, B), 10,
                 "A's status saying why B has no link")
    later = send(cluster, A, B, 10, key_prefix="L") | send(cluster, C, B, 10, key_prefix="M")
    wait_until(lambda: len(cluster.inbox(B)) == 60, 20, "20 more documents at B")
    assert cluster.inbox(B) == from_a | from_c | later
    paths = _paths(cluster, B)
    assert set(paths.values()) == {"relay"}, paths
    wait_until(lambda: _empty(cluster, A, B, C), 20, "every table empty")
    for org, policy in ((A, "prefer"), (C, "never")):
        d = _direct(cluster.root / org)
        assert d["policy"] == policy and _up(d, "out") == [] and d["links_out"] == 0, d
        assert read_status(cluster.root / org).get("sent_direct", 0) == 0
    assert _direct(cluster.root / C)["waiting"] == {}  # never: not even tried
    assert _direct(cluster.root / B)["links_in"] == 0


def test_policy_only_waits_for_a_direct_link(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    for o in (A, B):
        cluster.add_org(o)
    set_config(cluster.root / A, direct_retry=RETRY)
    cluster.start_platform()
    cluster.start_node(B)  # not listening
    cluster.start_node(A, "--direct", "only")
    sent = send(cluster, A, B, 15)
    _wait_direct(cluster.root / A, lambda d: "does not listen for direct links" in _why(d, B), 10,
                 "A's status saying why B has no link")
    time.sleep(1)  # (a platform path would have delivered them by now)
    assert cluster.q(A, "SELECT DISTINCT state FROM outbox") == [(0,)]  # SS_INIT: waiting
    assert cluster.count(A, "SELECT count(*) FROM outbox") == 15
    assert cluster.inbox(B) == {} and cluster.count("P", "SELECT count(*) FROM stored") == 0
    capsys.readouterr()
    assert semq_main(["status", "--dir", str(cluster.root / A), "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)["daemon"]["direct"]
    assert direct["policy"] == "only" and "does not listen" in direct["waiting"][B]["why"], direct
    # B listens from now on: A's next try finds it, and they go direct.
    cluster.kill(B, signal.SIGTERM)
    cluster.start_node(B, *LISTEN)
    wait_until(lambda: len(cluster.inbox(B)) == 15, 20, "the waiting documents at B")
    assert cluster.inbox(B) == sent
    assert set(_paths(cluster, B).values()) == {"direct"}
    wait_until(lambda: _empty(cluster, A, B), 20, "A's and B's tables empty")
    assert cluster.count("P", "SELECT count(*) FROM stored") == 0
    # Their ACK2s came through the platform (B had to ask it for A's
    # certificate first): the link got its window back all the same.
    _wait_direct(cluster.root / A, _idle, 5, "A's link up with nothing in flight")


# ---------------------------------------------------------------- 6. offline target


def test_savefwd2_to_an_offline_listener_is_stored_at_the_platform(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    set_config(cluster.root / A, direct_retry=RETRY)
    cluster.start_platform()
    cluster.start_node(B, *LISTEN)
    wait_until(lambda: _announced(cluster, B), 10, "B's addresses at the platform")
    cluster.kill(B, signal.SIGTERM)
    assert _announced(cluster, B)  # (it outlives B at the platform: A will dial a closed port)
    cluster.start_node(A)
    sent = send(cluster, A, B, 25, save_fwd=2)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE target_id=?", B) == 25, 20,
               "25 stored at the platform")
    wait_until(lambda: cluster.q(A, "SELECT DISTINCT state FROM outbox") == [(3,)], 20, "A at SS_ACK")
    _wait_direct(cluster.root / A, lambda d: "failed" in _why(d, B), 10, "A's failed dial to B in its status")
    cluster.start_node(B, *LISTEN)
    wait_until(lambda: len(cluster.inbox(B)) == 25, 20, "the stored documents at B")
    assert cluster.inbox(B) == sent
    assert set(_paths(cluster, B).values()) == {"relay"}
    wait_until(lambda: cluster.settled([A, B]), 20, "every table empty, nothing stored")
