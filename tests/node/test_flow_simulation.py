"""Property test of the whole SEMQ flow on the real sans-IO cores (real
SQLite stores, no trio): a simulated network that loses, reorders and
duplicates frames while nodes go offline. After a lossless quiet period
every SaveFwd 2|3 document is in its target's inbox exactly once, every
SaveFwd 3 origin row is confirmed and cleaned up, and nothing is delivered
twice (SPEC "The flow", B.4)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semq.node.core import NewDocument, NodeCore
from semq.platform.core import PlatformCore
from semq.umxt_protocol import AppKey, Endpoint, FrameDecoder, SaveFwd

ORGS = ("10008", "56001", "77000")


class World:
    def __init__(self, d: Path, rng: random.Random) -> None:
        self.rng = rng
        self.p = PlatformCore(d / "p.sqlite", create=True, synchronous="OFF", inquiry_interval=0)
        self.p.register(ORGS)
        self.nodes = {o: NodeCore(d / f"{o}.sqlite", o, create=True, synchronous="OFF", inquiry_interval=0)
                      for o in ORGS}
        self.online: set[str] = set()
        self.net: list[tuple[str, str, bytes]] = []  # (direction: "up"/"down", org, bytes)
        self.sent: dict[str, tuple[str, bytes, int]] = {}

    def room(self) -> dict[Endpoint, int]:
        """Who is online, as the platform daemon tells its core (a snapshot)."""
        return {Endpoint.org(org): 1 << 40 for org in self.online}

    def connect(self, org: str) -> None:
        if org in self.online:
            return
        self.online.add(org)
        self.p.connected(Endpoint.org(org))
        self.nodes[org].reconnected()

    def disconnect(self, org: str) -> None:
        self.online.discard(org)
        self.p.disconnected(Endpoint.org(org))
        self.net = [m for m in self.net if m[1] != org]  # in-flight bytes die with the connection

    def _frames(self, data: bytes) -> list:  # type: ignore[type-arg]
        dec = FrameDecoder()
        dec.receive_data(data)
        return list(dec)

    def step(self, lossy: bool) -> bool:
        """Deliver (or lose / duplicate) one in-flight chunk. False if idle."""
        if not self.net:
            return False
        i = self.rng.randrange(len(self.net)) if lossy else 0
        direction, org, data = self.net.pop(i)
        if lossy and self.rng.random() < 0.15:
            return True  # lost
        if lossy and self.rng.random() < 0.05:
            self.net.append((direction, org, data))  # duplicated
        if org not in self.online:
            return True
        frames = self._frames(data)
        if direction == "up":
            out = self.p.handle(Endpoint.org(org), frames, self.room())
            assert not out.errors, out.errors
            for target, chunks in out.sends.items():
                for c in chunks:
                    self.net.append(("down", target.node_id, c))
        else:
            out2 = self.nodes[org].handle(frames)
            assert not out2.errors, out2.errors
            for c in out2.data:
                self.net.append(("up", org, c))
        return True

    def tick(self, org: str) -> None:
        """The periodic work of a connected node and of the platform for it."""
        n = self.nodes[org]
        for c in n.claim(8).data + n.inquiries().data:
            self.net.append(("up", org, c))
        frames, _ = self.p.claim_stored(Endpoint.org(org), 8)
        for c in frames:
            self.net.append(("down", org, c))
        for target, chunks in self.p.inquiries(self.room()).items():
            for c in chunks:
                self.net.append(("down", target.node_id, c))

    def inbox(self, org: str) -> list[tuple[str, bytes]]:
        rows = self.nodes[org].conn.execute("SELECT origin_id, record_id, app_data FROM inbox").fetchall()
        return [(f"{o}/{r}", d) for o, r, d in rows]


ops = st.lists(
    st.tuples(st.sampled_from(["send", "step", "step", "step", "tick", "up", "down"]),
              st.sampled_from(ORGS), st.sampled_from(ORGS), st.sampled_from([2, 3]), st.booleans()),
    min_size=10, max_size=120,
)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=ops, seed=st.integers(0, 2**16))
def test_random_losses_never_lose_or_duplicate(ops: list[tuple[str, str, str, int, bool]], seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        w = World(Path(tmp), random.Random(seed))
        docs: dict[str, tuple[str, bytes, int]] = {}
        for op, a, b, save_fwd, ack2 in ops:
            if op == "send" and a != b:
                body = f"doc {len(docs)} {a}->{b}".encode()
                [lk0] = w.nodes[a].accept([NewDocument(target=b, app_data=body, save_fwd=SaveFwd(save_fwd),
                                                       ack2=ack2, app_key=AppKey(key=str(len(docs))))])
                docs[f"{a}/{lk0.record_id}"] = (b, body, save_fwd)
            elif op == "step":
                w.step(lossy=True)
            elif op == "tick" and a in w.online:
                w.tick(a)
            elif op == "up":
                w.connect(a)
            elif op == "down":
                w.disconnect(a)
            # No duplicate ever reaches an application, even mid-chaos.
            for org in ORGS:
                seen = [k for k, _ in w.inbox(org)]
                assert len(seen) == len(set(seen))
        # Quiet period: everyone online, no loss, work until nothing moves.
        for org in ORGS:
            w.connect(org)
        for _ in range(60):
            for org in ORGS:
                w.tick(org)
            while w.step(lossy=False):
                pass
        for key, (target, body, save_fwd) in docs.items():
            got = [d for k, d in w.inbox(target) if k == key]
            assert got == [body], f"{key} (SaveFwd {save_fwd}) reached {target} {len(got)} times"
        for org in ORGS:
            n = w.nodes[org]
            left = n.conn.execute("SELECT id, state, save_fwd, ack2 FROM outbox").fetchall()
            assert left == [], f"{org} still holds pending-send rows {left}"
            assert n.conn.execute("SELECT count(*) FROM inbound").fetchone()[0] == 0
        assert w.p.conn.execute("SELECT count(*) FROM stored").fetchone()[0] == 0
        for n in w.nodes.values():
            n.close()
        w.p.close()
