"""Deterministic synthetic delivery logs for tests and benchmarks.

:func:`generate` simulates N messages among K organizations through one
platform, following the flow of SPEC.md ("The flow: A sends order S0001 to B"),
and writes what each party would log (docs/events.md) to per-party daily files
laid out like real data directories::

    OUT/org-ORG01/events/events-2026-11-01.jsonl
    OUT/platform-P1/events/events-2026-11-01.jsonl

What it covers, so reports meet every case on generated data: all three
SaveFwd modes; organizations going offline and coming back (the platform logs
``node_offline``/``node_online``) and one that never comes back; lost frames on
each hop with inquiries and resends; duplicate arrivals the receiver suppresses;
messages stuck at the origin, stored at the platform, and delivered but never
confirmed; best-effort messages; messages that ask no ACK2; and a clock offset
per organization (the platform's clock is the true time). With
``SynthConfig.direct`` some documents go over a direct node-to-node link
instead of the platform (faster: one hop, no platform); then every send,
arrival and ACK2 carries its ``path`` (docs/events.md). Without it (the
default) the logs are those of nodes from before direct links: no ``path``.

The same seed gives byte-identical files. Lines are not sorted by time within
a file (they are written message by message): a reader must not assume order,
and the reports do not.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

__all__ = ["SynthConfig", "SynthStats", "generate"]

DAY_MS: Final = 86_400_000
INQUIRY_INTERVAL_MS: Final = 15_000  # SPEC: inquiry interval, default 15 s
STUCK_AFTER_MS: Final = 3_600_000  # the report's default threshold, for the truth counts
_FLUSH_LINES: Final = 20_000

# (domain, data_type, subtype, weight): what organizations exchange (SPEC intro).
_APP_KEYS: Final = (
    ("trade", "ORDER", "PO", 30),
    ("trade", "INVOICE", "INV", 20),
    ("trade", "RECEIPT", "RCPT", 10),
    ("logistics", "SHIPMENT", "ASN", 15),
    ("logistics", "DELIVERY", "POD", 10),
    ("finance", "PAYMENT", "PAY", 10),
    ("finance", "STATEMENT", "STM", 5),
)


@dataclass(frozen=True, kw_only=True)
class SynthConfig:
    """What to generate. Probabilities are per message (``loss`` per hop)."""

    messages: int = 10_000
    orgs: int = 8
    seed: int = 1
    start_ms: int = 1_793_491_200_000  # 2026-11-01T00:00:00Z
    duration_ms: int = DAY_MS  # messages are queued evenly over this span
    max_skew_ms: int = 90_000  # organization clocks are off by up to this much
    loss: float = 0.005  # a DATA frame lost on one hop (then inquiry + resend)
    duplicate: float = 0.003  # the receiver gets a second copy and suppresses it
    stuck_origin: float = 0.001  # the platform never gets it (origin keeps asking)
    unconfirmed: float = 0.002  # the ACK2 never reaches the origin
    best_effort: float = 0.03  # Reliable=0
    no_ack2: float = 0.1  # Ack2=0
    dead_orgs: int = 1  # organizations that go offline half-way and never return
    mean_online_ms: int = 6 * 3_600_000  # mean time between disconnects
    cleaned: bool = True  # log `cleaned` events (real daemons do)
    platform: str = "P1"
    # Share of documents sent over a direct link (when the target is online at
    # the send). 0: none, no `path` field at all, and draws nothing from the
    # random stream, so a seed gives the same logs as before direct links.
    direct: float = 0.0

    def __post_init__(self) -> None:
        if self.messages < 0 or self.orgs < 2:
            raise ValueError(f"need messages >= 0 and orgs >= 2, got {self.messages}, {self.orgs}")
        if not 0.0 <= self.direct <= 1.0:
            raise ValueError(f"direct is a share of the documents, 0..1, got {self.direct}")


@dataclass(kw_only=True)
class SynthStats:
    """What was generated, with the ground truth the reports should find."""

    messages: int = 0
    events: int = 0
    files: int = 0
    log_end_ms: int = 0
    skew_ms: dict[str, int] = field(default_factory=dict)  # logger -> clock minus true time
    outcomes: Counter[str] = field(default_factory=Counter)
    stuck: Counter[str] = field(default_factory=Counter)  # place -> messages older than 1 h
    # path -> messages: direct when their DATA went over a direct link before
    # the end of the log, else relay (the report's rule, docs/events.md).
    paths: Counter[str] = field(default_factory=Counter)


class _Writer:
    """Buffers lines per (party directory, UTC date) and appends them in chunks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.buffers: dict[tuple[str, int], list[str]] = {}
        self.pending = 0
        self.events = 0
        self.files: set[tuple[str, int]] = set()
        self._dates: dict[int, str] = {}

    def add(self, party_dir: str, ts: int, line: str) -> None:
        key = (party_dir, ts // DAY_MS)
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = []
        buf.append(line)
        self.pending += 1
        self.events += 1
        if self.pending >= _FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        for (party_dir, day), lines in self.buffers.items():
            if not lines:
                continue
            name = self._dates.get(day)
            if name is None:
                d = datetime.fromtimestamp(day * DAY_MS / 1000, tz=UTC).date()
                name = self._dates[day] = f"events-{d.isoformat()}.jsonl"
            folder = self.root / party_dir / "events"
            if (party_dir, day) not in self.files:
                folder.mkdir(parents=True, exist_ok=True)
                self.files.add((party_dir, day))
            with open(folder / name, "a", encoding="utf-8") as f:
                f.write("".join(lines))
            lines.clear()
        self.pending = 0


class _Schedule:
    """When one organization is offline: sorted, disjoint [start, end) periods (true time)."""

    def __init__(self, starts: list[float], ends: list[float]) -> None:
        self.starts = starts
        self.ends = ends

    def online_at(self, t: float) -> float:
        """The first time >= t at which the organization is online (inf: never again)."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and t < self.ends[i]:
            return self.ends[i]
        return t


def _schedule(rng: random.Random, begin: float, end: float, mean_online: float,
              dies_at: float | None) -> _Schedule:
    starts: list[float] = []
    ends: list[float] = []
    t = begin + rng.expovariate(1 / mean_online)
    while t < end:
        if dies_at is not None and t >= dies_at:
            break
        r = rng.random()
        # Mostly short reconnects, some outages of an hour or two, a few long ones.
        if r < 0.7:
            length = rng.uniform(60_000, 15 * 60_000)
        elif r < 0.95:
            length = rng.uniform(20 * 60_000, 2 * 3_600_000)
        else:
            length = rng.uniform(2 * 3_600_000, 6 * 3_600_000)
        starts.append(t)
        ends.append(t + length)
        t += length + rng.expovariate(1 / mean_online)
    if dies_at is not None:
        starts.append(max(dies_at, ends[-1] if ends else dies_at))
        ends.append(math.inf)
    return _Schedule(starts, ends)


def generate(out_dir: str | Path, config: SynthConfig | None = None) -> SynthStats:
    """Write synthetic logs for `config` under `out_dir` (created; must hold no logs yet).

    Also writes ``OUT/synth.json`` with the config and the returned stats.
    Raises ``FileExistsError`` when `out_dir` already holds files, because
    appending to old logs would mix two runs.
    """
    cfg = config or SynthConfig()
    root = Path(out_dir)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: synthetic logs go to a new directory")
    root.mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, root)
    run.connections()
    for n in range(cfg.messages):
        run.message(n)
    writer, stats = run.writer, run.stats
    writer.flush()
    stats.events = writer.events
    stats.files = len(writer.files)
    manifest = {"config": asdict(cfg), "stats": _stats_json(stats)}
    (root / "synth.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return stats


class _Run:
    """One run of :func:`generate`: the organizations, their clocks and
    offline periods, then the messages one by one, each following the flow
    its draws choose (over a direct link, stuck at the origin, best effort,
    forwarded, stored at the platform). Every random number comes from one
    generator in a fixed order: the same seed writes the same bytes."""

    def __init__(self, cfg: SynthConfig, root: Path) -> None:
        self.cfg = cfg
        rng = self.rng = random.Random(cfg.seed)
        self.writer = _Writer(root)
        self.stats = stats = SynthStats()
        self.begin = begin = float(cfg.start_ms)
        self.log_end = log_end = begin + cfg.duration_ms
        stats.log_end_ms = int(log_end)
        self.orgs = orgs = [f"ORG{i + 1:02d}" for i in range(cfg.orgs)]
        self.platform_logger = f"platform:{cfg.platform}"
        self.platform_dir = f"platform-{cfg.platform}"
        skew: dict[str, int] = {self.platform_logger: 0}
        for i, org in enumerate(orgs):
            # Every third organization keeps good time; the others drift within the bound.
            off = 0 if i % 3 == 0 else int(rng.uniform(-cfg.max_skew_ms, cfg.max_skew_ms))
            skew[f"org:{org}"] = off
        self.skew = skew
        stats.skew_ms = dict(skew)
        dead = set(orgs[-cfg.dead_orgs:]) if cfg.dead_orgs else set()
        self.schedules = {
            org: _schedule(
                rng, begin, log_end, cfg.mean_online_ms,
                begin + cfg.duration_ms * rng.uniform(0.4, 0.7) if org in dead else None,
            )
            for org in orgs
        }
        self.weights = [1 / (i + 1) ** 0.7 for i in range(cfg.orgs)]
        self.key_weights = [w for *_, w in _APP_KEYS]
        self.records: Counter[str] = Counter()
        self.lk1_counter = 0
        # The `path` of sends, arrivals and ACK2s (none unless direct links are simulated).
        self.relay = ',"path":"relay"' if cfg.direct else ""
        self.direct = ',"path":"direct"'
        self.step = cfg.duration_ms / max(cfg.messages, 1)

    def emit(self, logger: str, party_dir: str, t: float, role: str, event: str, body: str) -> None:
        if t > self.log_end:
            return  # not happened yet when the logs were collected
        ts = int(t) + self.skew[logger]
        self.writer.add(
            party_dir, ts,
            f'{{"v":1,"ts":{ts},"logger":"{logger}","role":"{role}","event":"{event}"{body}}}\n',
        )

    def net(self) -> float:
        return 3 + self.rng.expovariate(1 / 12)  # one hop through loopback-ish WAN: mean 15 ms

    def connections(self) -> None:
        """The connection history at the platform (node events carry `node`, no lk0)."""
        for org in self.orgs:
            self.emit(self.platform_logger, self.platform_dir, self.begin - 1000, "platform", "node_online",
                      f',"node":"{org}"')
            sch = self.schedules[org]
            for s, e in zip(sch.starts, sch.ends, strict=True):
                self.emit(self.platform_logger, self.platform_dir, s, "platform", "node_offline",
                          f',"node":"{org}"')
                if e != math.inf:
                    self.emit(self.platform_logger, self.platform_dir, e, "platform", "node_online",
                              f',"node":"{org}"')

    def message(self, n: int) -> None:
        """Message ``n``: drawn, queued, sent the way its draws say; its
        ground truth counted."""
        cfg, rng, orgs = self.cfg, self.rng, self.orgs
        t_q = self.begin + n * self.step + rng.uniform(0, self.step)
        src = rng.choices(orgs, self.weights)[0]
        dst = src
        while dst == src:
            dst = rng.choices(orgs, self.weights)[0]
        domain, data_type, subtype, _ = rng.choices(_APP_KEYS, self.key_weights)[0]
        r = rng.random()
        save_fwd = 1 if r < 0.15 else 2 if r < 0.5 else 3
        reliable = rng.random() >= cfg.best_effort
        ack2 = reliable and rng.random() >= cfg.no_ack2
        self.records[src] += 1
        rec = self.records[src]
        lk0 = f"{src}/1/1/{rec}"
        created = int(t_q) + self.skew[f"org:{src}"]
        body = (
            f',"lk0":"{lk0}","source":"{src}","target":"{dst}","domain":"{domain}",'
            f'"data_type":"{data_type}","subtype":"{subtype}","key":"S{n:07d}",'
            f'"save_fwd":{save_fwd},"ack2":{"true" if ack2 else "false"},'
            f'"reliable":{"true" if reliable else "false"},"priority":{rng.randrange(10)},'
            f'"size":{rng.randrange(200, 8000)},"created_ms":{created}'
        )
        m = _Message(self, src=src, dst=dst, body=body, t_q=t_q, save_fwd=save_fwd, reliable=reliable, ack2=ack2)
        self.stats.messages += 1
        m.origin(t_q, "queued")
        # The origin sends once it is connected to the platform.
        t_s = self.schedules[src].online_at(t_q) + rng.uniform(1, 20)
        # A direct link needs the target online when the origin sends. With
        # cfg.direct 0 no number is drawn (the seed's logs stay as they were).
        if cfg.direct and rng.random() < cfg.direct and self.schedules[dst].online_at(t_s) == t_s:
            self.stats.paths["direct" if t_s <= self.log_end else "relay"] += 1
            self._direct(m, t_s)
        else:
            self.stats.paths["relay"] += 1
            if reliable and rng.random() < cfg.stuck_origin:
                self._stuck_at_origin(m, t_s)
            else:
                self._via_platform(m, t_s)
        _truth(self.stats, m, self.log_end)

    def _direct(self, m: _Message, t_s: float) -> None:
        """Over a direct link: one hop each way, no platform."""
        m.origin(t_s, "sent", ',"attempt":1' + self.direct)
        m.t_rx = t_s + self.net()
        m.recv(m.t_rx, "received", self.direct)
        m.t_in = m.t_rx + self.rng.uniform(1, 10)
        m.recv(m.t_in, "inbox")
        if m.reliable:
            m.t_a2 = self._confirm(m, m.t_rx + self.net(), self.direct, 1)
        elif self.cfg.cleaned:
            m.origin(t_s + 1, "cleaned")

    def _stuck_at_origin(self, m: _Message, t_s: float) -> None:
        """The platform never gets it: the origin asks and resends, in vain."""
        m.origin(t_s, "sent", ',"attempt":1' + self.relay)
        for k in (2, 3):
            t_s += INQUIRY_INTERVAL_MS
            m.origin(t_s, "inquiry", ',"detail":"platform"')
            m.origin(t_s + 1, "resend")
            m.origin(t_s + 2, "sent", f',"attempt":{k}' + self.relay)

    def _via_platform(self, m: _Message, t_s: float) -> None:
        """Through the platform: sent until the platform receives it, then
        forwarded to the target online, stored for it, or dropped."""
        cfg, rng = self.cfg, self.rng
        attempt = 1
        while True:
            m.origin(t_s, "sent", f',"attempt":{attempt}' + self.relay)
            if m.reliable and rng.random() < cfg.loss:
                # Lost before the platform: still SS_SENT after the interval, the
                # platform says "not received", back to SS_INIT, resend (SPEC 5).
                t_s += INQUIRY_INTERVAL_MS
                m.origin(t_s, "inquiry", ',"detail":"platform"')
                m.origin(t_s + 1, "resend")
                t_s += 2
                attempt += 1
                continue
            break
        m.t_pr = t_s + self.net()
        m.plat(m.t_pr, "received", f',"attempt":{attempt}')
        target_online = self.schedules[m.dst].online_at(m.t_pr) == m.t_pr
        if not m.reliable:
            self._best_effort(m, t_s, target_online)
            return
        if target_online:
            t_ack: float | None = self._forwarded(m, attempt)
        elif m.save_fwd == 1:
            m.plat(m.t_pr + 0.5, "dropped", ',"code":404')
            m.origin(m.t_pr + 0.5 + self.net(), "nack", ',"code":404')
            m.failed = True
            return
        else:
            t_ack = self._stored(m)
        if t_ack is not None:
            # Through the platform: two hops each way.
            m.t_a2 = self._confirm(m, t_ack, self.relay, 2)

    def _best_effort(self, m: _Message, t_s: float, target_online: bool) -> None:
        """Best effort: never stored, never acked, never retried (SPEC)."""
        if self.cfg.cleaned:
            m.origin(t_s + 1, "cleaned")
        if target_online:
            m.t_f = m.t_pr + self.rng.uniform(0.2, 3)
            m.plat(m.t_f, "forwarded")
            m.t_rx = m.t_f + self.net()
            m.recv(m.t_rx, "received", self.relay)
            m.recv(m.t_rx + self.rng.uniform(1, 10), "inbox")
        else:
            m.plat(m.t_pr + 0.5, "dropped", ',"code":404')

    def _forwarded(self, m: _Message, attempt: int) -> float:
        """Forwarded to the target online; returns when the ACK_FWD reached the origin."""
        cfg, rng, net, relay = self.cfg, self.rng, self.net, self.relay
        m.t_f = m.t_pr + rng.uniform(0.2, 3)
        m.plat(m.t_f, "forwarded")
        t_ack = m.t_f + net()
        m.origin(t_ack, "ack_fwd")
        if rng.random() < cfg.loss:
            # Lost between platform and target: A asks B after the interval,
            # B says "not received", A resends (SPEC flow, origin step 5).
            t_i = t_ack + INQUIRY_INTERVAL_MS
            m.origin(t_i, "inquiry", ',"detail":"target"')
            m.origin(t_i + 1, "resend")
            attempt += 1
            t_s2 = t_i + 2
            m.origin(t_s2, "sent", f',"attempt":{attempt}' + relay)
            t_p2 = t_s2 + net()
            m.plat(t_p2, "received", f',"attempt":{attempt}')
            t_f2 = t_p2 + rng.uniform(0.2, 3)
            m.plat(t_f2, "forwarded")
            t_ack = t_f2 + net()
            m.origin(t_ack, "ack_fwd")
            m.t_rx = t_f2 + net()
        else:
            m.t_rx = m.t_f + net()
        m.recv(m.t_rx, "received", relay)
        m.t_in = m.t_rx + rng.uniform(1, 10)
        m.recv(m.t_in, "inbox")
        if rng.random() < cfg.duplicate:
            # B's answer to an inquiry is lost, A resends, B suppresses the copy.
            t_i = t_ack + INQUIRY_INTERVAL_MS
            m.origin(t_i, "inquiry", ',"detail":"target"')
            m.origin(t_i + 1, "resend")
            m.origin(t_i + 2, "sent", f',"attempt":{attempt + 1}' + relay)
            t_p2 = t_i + 2 + net()
            m.plat(t_p2, "received", f',"attempt":{attempt + 1}')
            m.plat(t_p2 + 1, "forwarded")
            m.origin(t_p2 + 1 + net(), "ack_fwd")
            m.recv(t_p2 + 1 + net(), "duplicate")
        return t_ack

    def _stored(self, m: _Message) -> float | None:
        """Stored at the platform for the target offline, delivered when it
        is back; returns when the ACK_SAVE reached the origin (None: the
        target never comes back)."""
        cfg, rng, net = self.cfg, self.rng, self.net
        self.lk1_counter += 1
        lk1 = f',"lk1":"1/1/{self.lk1_counter}"'
        m.t_st = m.t_pr + rng.uniform(0.5, 5)
        m.plat(m.t_st, "stored", lk1)
        t_ack = m.t_st + net()
        m.origin(t_ack, "ack_save")
        t_on = self.schedules[m.dst].online_at(m.t_st)
        if t_on == math.inf:
            return None
        # Stored copies drain after the target's hello, oldest first.
        t_d = t_on + rng.uniform(20, 3000)
        m.plat(t_d, "delivered", lk1 + ',"attempt":1')
        if rng.random() < cfg.loss:
            # The copy is lost: the platform asks B, B says no, it delivers again.
            m.plat(t_d + INQUIRY_INTERVAL_MS, "inquiry", lk1)
            t_d += INQUIRY_INTERVAL_MS + 1
            m.plat(t_d, "delivered", lk1 + ',"attempt":2')
        m.t_rx = t_d + net()
        m.recv(m.t_rx, "received", lk1 + self.relay)
        m.t_in = m.t_rx + rng.uniform(1, 10)
        m.recv(m.t_in, "inbox", lk1)
        t_pa = m.t_in + net()
        m.plat(t_pa, "acked", lk1)
        if rng.random() < cfg.duplicate:
            # B's ACK was late: the platform redelivers, B suppresses the copy.
            m.plat(t_pa + 0.5, "delivered", lk1 + ',"attempt":2')
            m.recv(t_pa + 0.5 + net(), "duplicate", lk1)
        if cfg.cleaned:
            m.plat(t_pa + 1, "cleaned", lk1)
        return t_ack

    def _confirm(self, m: _Message, t_ack: float, path: str, hops: int) -> float:
        """The end of a reliable message's way, `hops` hops each way between
        the organizations; returns when the ACK2 reached the origin (inf: never)."""
        cfg, rng = self.cfg, self.rng
        if not m.ack2:
            if cfg.cleaned:
                m.origin(t_ack + 1, "cleaned")  # SS_ACK and no ACK2 asked
                m.recv(m.t_in + 1, "cleaned")
            return math.inf
        t_a2s = m.t_in + rng.uniform(0.5, 2)
        m.recv(t_a2s, "ack2_sent")
        if rng.random() < cfg.unconfirmed:
            return math.inf
        t_a2 = t_a2s
        for _ in range(hops):
            t_a2 += self.net()
        m.origin(t_a2, "ack2", path)
        t_re = t_a2
        for _ in range(hops):
            t_re += self.net()
        m.recv(t_re, "reack2")
        if cfg.cleaned:
            m.origin(t_a2 + rng.uniform(1, 50), "cleaned")
            m.recv(t_re + 1, "cleaned")
        return t_a2


@dataclass
class _Message:
    """One message of a run: what it is, what each party logs of it, and
    the first time each step happened (true time; inf: never), the ground
    truth :func:`_truth` classifies."""

    run: _Run
    src: str
    dst: str
    body: str  # its fields, as every line about it carries them
    t_q: float  # queued
    save_fwd: int
    reliable: bool
    ack2: bool
    t_pr: float = math.inf  # received by the platform
    t_f: float = math.inf  # forwarded
    t_st: float = math.inf  # stored
    t_rx: float = math.inf  # received by the target
    t_in: float = math.inf  # in the target's inbox
    t_a2: float = math.inf  # its ACK2 at the origin
    failed: bool = False

    def origin(self, t: float, event: str, extra: str = "") -> None:
        self.run.emit(f"org:{self.src}", f"org-{self.src}", t, "origin", event, self.body + extra)

    def plat(self, t: float, event: str, extra: str = "") -> None:
        self.run.emit(self.run.platform_logger, self.run.platform_dir, t, "platform", event, self.body + extra)

    def recv(self, t: float, event: str, extra: str = "") -> None:
        self.run.emit(f"org:{self.dst}", f"org-{self.dst}", t, "receiver", event, self.body + extra)


def _truth(stats: SynthStats, m: _Message, log_end: float) -> None:
    """Classify one message as of the end of the log, the way the report should."""
    if not m.reliable:
        stats.outcomes["best_effort"] += 1
        return
    if m.failed:
        stats.outcomes["failed"] += 1
        return
    if m.t_a2 <= log_end or (not m.ack2 and m.t_rx <= log_end):
        stats.outcomes["confirmed" if m.ack2 else "delivered"] += 1
        return
    if m.t_rx <= log_end:
        place = "delivered_unconfirmed"
    elif m.t_st <= log_end:
        place = "stored_at_platform"
    elif m.t_f <= log_end:
        place = "forwarded_not_received"
    else:
        place = "at_origin"
    if log_end - m.t_q > STUCK_AFTER_MS:
        stats.outcomes["stuck"] += 1
        stats.stuck[place] += 1
    else:
        stats.outcomes["in_flight"] += 1


def _stats_json(stats: SynthStats) -> dict[str, object]:
    out = asdict(stats)
    out["outcomes"] = dict(stats.outcomes)
    out["stuck"] = dict(stats.stuck)
    out["paths"] = dict(stats.paths)
    return out
