#!/usr/bin/env python3
"""Where each platform design saturates: a model of N organizations over the measured costs.

``python scripts/scaling_model.py [--orgs 100000] [--docs-per-org 100] [--online 0.7] [--peak 3]``

Arithmetic over the per-connection and per-document costs measured on this
project's 2-vCPU machine (docs/scaling.md says where each comes from: the
``scripts/bench load nodes`` and ``scripts/bench pgstore`` runs). No random
numbers, no I/O: the same arguments print the same table, in well under a
second. Three designs:

* **sqlite**: one ``semq platform run`` with its SQLite store. One process,
  so one core (the GIL): connections, pings and documents share it.
* **pg**: ``k`` instances on one PostgreSQL store. Connections and relay
  CPU spread over the instances; a document whose two ends are held by
  different instances is handed over one hop in a PostgreSQL notification
  (semq/platform/cluster.py): not stored, but it costs both instances and
  the server more than a forward within one instance, and its share grows
  with ``k``. Only documents to offline targets are stored.
* **sharded**: ``S`` PostgreSQL stores (``semq_db_id`` 1..S), each with its
  instances, organizations spread over them by a directory. A document
  between organizations of different stores is written to the target's
  store; only the origin's ``seen`` row stays home. This design is on
  paper: SEMQ runs one store today.

For each design and a range of organization counts it prints the resources
the traffic needs and the first limit reached. The budget per resource is
``--headroom`` (default 70 %) of it: a design "saturates" past that.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Final

DAY_S: Final = 86_400
KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB


@dataclass(frozen=True)
class Costs:
    """Measured on the project's 2-vCPU machine (docs/scaling.md, "Measured")."""

    conn_rss_kib: float = 54.0  # platform RSS per connected organization (load nodes --nodes 5000, 3 passes)
    conn_idle_cpu_s: float = 26e-6  # platform CPU s per s per connected node, a PING every 10 s (13 % / 5,000)
    connect_cpu_s: float = 2.6e-3  # platform CPU per TLS 1.3 handshake + HELLO/WELCOME (13.2 s / 5,000)
    relay_cpu_s: float = 40e-6  # platform CPU per document, security on, online pair, 5,000 idle nodes beside
    store_extra_cpu_s: float = 34e-6  # the core's CPU to store, claim and ack a copy over forwarding it (pgstore)
    pg_cpu_online_s: float = 10.5e-6  # PostgreSQL server CPU per forwarded document (its `seen` row)
    pg_cpu_stored_s: float = 80e-6  # ... per stored, delivered and acked document (71 + 9)
    # A document handed over between two instances (and its ACK2 back):
    # pgplatform, two instances with every document crossing against one
    # (docs/benchmarks.md): PostgreSQL 20-23 against 5-9 us, the instances
    # 44 (24 + 20) against 13-19 us per document.
    pg_cpu_handover_s: float = 14e-6
    handover_extra_cpu_s: float = 30e-6
    wal_online_b: float = 320.0  # WAL bytes per forwarded document
    wal_stored_b: float = 1_986.0  # WAL bytes per stored, delivered and acked document (1,861 + 125)
    stored_row_b: float = 1_490.0  # stored row + TOAST + indexes while a copy waits (1 KiB document)
    seen_row_b: float = 143.0  # `seen` row + indexes per document, kept 30 days
    seen_days: float = 30.0
    sqlite_stored_per_s: float = 14_827.0  # one SQLite platform storing, security on (load backlog)


@dataclass(frozen=True)
class Machine:
    """What one instance / one PostgreSQL server is given (assumptions, not measurements)."""

    instance_cores: float = 1.0  # a Python process uses one core
    instance_mem_gib: float = 4.0
    instance_fds: int = 65_536  # LimitNOFILE= in the unit
    pg_cores: float = 16.0
    pg_wal_mib_s: float = 200.0  # sustained WAL write bandwidth of the server's disk
    pg_disk_gib: float = 2048.0  # the database's disk, for `seen` (kept 30 days) and waiting copies
    pg_connections: int = 100  # PostgreSQL's max_connections (its default), 3 kept for the operator
    pg_conns_per_instance: int = 2  # the core's connection and the LISTEN connection (semq.platform.cluster)
    headroom: float = 0.7


@dataclass(frozen=True)
class Traffic:
    orgs: int
    docs_per_org_day: float
    online: float  # share of documents whose target is connected when they are sent
    peak: float  # peak-hour rate / average rate

    @property
    def peak_docs_s(self) -> float:
        return self.orgs * self.docs_per_org_day / DAY_S * self.peak

    @property
    def docs_day(self) -> float:
        return self.orgs * self.docs_per_org_day


@dataclass(frozen=True)
class Verdict:
    design: str
    size: str  # instances / stores needed
    cpu: str
    pg: str
    limit: str  # the first limit, or "fits"
    fits: bool


def instance_load(t: Traffic, c: Costs, orgs: int, docs_s: float, stored_s: float) -> float:
    """Cores one instance needs for ``orgs`` connections and ``docs_s`` documents (of them ``stored_s`` stored)."""
    return orgs * c.conn_idle_cpu_s + docs_s * c.relay_cpu_s + stored_s * c.store_extra_cpu_s


def sqlite_design(t: Traffic, c: Costs, m: Machine) -> Verdict:
    stored_s = t.peak_docs_s * (1 - t.online)
    cores = instance_load(t, c, t.orgs, t.peak_docs_s, stored_s)
    mem = t.orgs * c.conn_rss_kib * KIB / GIB
    limits = []
    if t.orgs + 64 > m.instance_fds:
        limits.append(f"open files: {t.orgs:,} connections > {m.instance_fds:,}")
    if cores > m.instance_cores * m.headroom:
        limits.append(f"CPU: needs {cores:.2f} of one core (idle {t.orgs * c.conn_idle_cpu_s:.2f})")
    if mem > m.instance_mem_gib * m.headroom:
        limits.append(f"memory: {mem:.1f} GiB of connections")
    if stored_s > c.sqlite_stored_per_s * m.headroom:
        limits.append(f"SQLite store: {stored_s:,.0f} stored/s")
    return Verdict("one SQLite platform", "1 process", f"{cores:.2f} core", "-",
                   "; ".join(limits) or "fits", not limits)


def stored_share(t: Traffic, instances: int) -> float:
    """Documents that go through the store: those for an offline target,
    however many instances there are (one handed over between instances is
    not stored)."""
    return 1 - t.online


def crossing_share(t: Traffic, instances: int) -> float:
    """Documents handed over between instances: the online ones whose target
    is held by another instance ((k-1)/k of them, organizations spread evenly)."""
    return t.online * (instances - 1) / instances


def pg_needs(t: Traffic, c: Costs, docs_s: float, share: float, crossing: float = 0.0) -> tuple[float, float]:
    """(PostgreSQL cores, WAL MiB/s) for ``docs_s`` documents, ``share`` of
    them stored and ``crossing`` handed over between instances (notifications: no WAL)."""
    cores = docs_s * (share * c.pg_cpu_stored_s + (1 - share) * c.pg_cpu_online_s + crossing * c.pg_cpu_handover_s)
    wal = docs_s * (share * c.wal_stored_b + (1 - share) * c.wal_online_b) / MIB
    return cores, wal


def instances_for(t: Traffic, c: Costs, m: Machine, orgs: int, docs_s: float) -> int:
    """Instances (one core each, kept under the headroom) for ``orgs`` and ``docs_s``."""
    k = 1
    while k < 10_000:
        share = stored_share(t, k)
        per = (instance_load(t, c, math.ceil(orgs / k), docs_s / k, docs_s * share / k)
               + docs_s * crossing_share(t, k) / k * c.handover_extra_cpu_s)
        mem = math.ceil(orgs / k) * c.conn_rss_kib * KIB / GIB
        if per <= m.instance_cores * m.headroom and mem <= m.instance_mem_gib * m.headroom:
            return k
        k += 1
    return k


def disk_gib(c: Costs, docs_day: float, online: float) -> float:
    """`seen` rows kept ``seen_days`` and a day's stored copies waiting (the
    worst an offline day costs), for ``docs_day`` documents a day."""
    return docs_day * (c.seen_days * c.seen_row_b + (1 - online) * c.stored_row_b) / GIB


def pg_design(t: Traffic, c: Costs, m: Machine) -> Verdict:
    k = instances_for(t, c, m, t.orgs, t.peak_docs_s)
    share = stored_share(t, k)
    crossing = crossing_share(t, k)
    cores, wal = pg_needs(t, c, t.peak_docs_s, share, crossing)
    limits = []
    disk = disk_gib(c, t.docs_day, t.online)
    if disk > m.pg_disk_gib * m.headroom:
        limits.append(f"disk: {disk:,.0f} of {m.pg_disk_gib:,.0f} GiB (`seen`, waiting copies)")
    if k * m.pg_conns_per_instance > m.pg_connections - 3:
        limits.append(f"PostgreSQL connections: {k} instances x {m.pg_conns_per_instance} > {m.pg_connections - 3}")
    if cores > m.pg_cores * m.headroom:
        limits.append(f"PostgreSQL CPU: {cores:.1f} of {m.pg_cores:g} cores")
    if wal > m.pg_wal_mib_s * m.headroom:
        limits.append(f"WAL: {wal:.0f} of {m.pg_wal_mib_s:g} MiB/s")
    return Verdict(f"one PostgreSQL, {k} instance(s)", f"{k} inst.", f"{k} x 1 core",
                   f"{cores:.1f} cores, {wal:.0f} MiB/s WAL, {disk:,.0f} GiB, {share:.0%} stored,"
                   f" {crossing:.0%} handed over",
                   "; ".join(limits) or "fits",
                   not limits)


def sharded_design(t: Traffic, c: Costs, m: Machine) -> Verdict:
    for s in range(1, 1_000):
        orgs = math.ceil(t.orgs / s)
        # Each store receives the documents for its organizations (as targets)
        # and writes the `seen` row of those its organizations send.
        docs_s = t.peak_docs_s / s
        k = instances_for(t, c, m, orgs, docs_s)
        # Documents between stores are always stored (in the target's store):
        # (s-1)/s of the online ones when organizations are spread evenly;
        # within a store, those between its instances are handed over.
        local = 1 / s
        share = (1 - t.online) + t.online * (1 - local)
        crossing = t.online * local * (k - 1) / k
        cores, wal = pg_needs(t, c, docs_s, share, crossing)
        cores += docs_s * (1 - local) * c.pg_cpu_online_s  # the origin's `seen` row in its own store
        wal += docs_s * (1 - local) * c.wal_online_b / MIB
        disk = disk_gib(c, t.docs_day / s, t.online)
        if (cores <= m.pg_cores * m.headroom and wal <= m.pg_wal_mib_s * m.headroom
                and disk <= m.pg_disk_gib * m.headroom
                and k * m.pg_conns_per_instance <= m.pg_connections - 3):
            return Verdict(f"sharded: {s} store(s) x {k} instance(s)", f"{s} x {k}",
                           f"{s * k} x 1 core", f"{cores:.1f} cores, {wal:.0f} MiB/s, {disk:,.0f} GiB per store",
                           "fits", True)
    return Verdict("sharded", "-", "-", "-", "over 1,000 stores", False)


def volumes(t: Traffic, c: Costs) -> list[str]:
    per_m = 1e6
    share = 1 - t.online
    wal_day = per_m * (share * c.wal_stored_b + (1 - share) * c.wal_online_b)
    return [
        f"per 1,000,000 documents a day ({t.online:.0%} forwarded online, {share:.0%} stored):"
        f" WAL {wal_day / GIB:.2f} GiB/day (online {per_m * (1 - share) * c.wal_online_b / GIB:.2f},"
        f" stored {per_m * share * c.wal_stored_b / GIB:.2f}); `seen` kept {c.seen_days:g} days:"
        f" {per_m * c.seen_days * c.seen_row_b / GIB:.1f} GiB; stored copies: {c.stored_row_b:,.0f} B each while"
        f" they wait ({per_m * share * c.stored_row_b / GIB:.2f} GiB if a day's worth waits)",
        f"this traffic: {t.docs_day:,.0f} documents/day, {t.peak_docs_s:,.0f}/s at the peak hour;"
        f" WAL {t.docs_day / per_m * wal_day / GIB:.1f} GiB/day, `seen` {t.docs_day * c.seen_days * c.seen_row_b / GIB:.0f} GiB",
    ]


def ceilings(c: Costs, m: Machine) -> list[str]:
    """What one instance and one PostgreSQL store carry, whatever the traffic."""
    h = m.headroom
    by_cpu = m.instance_cores * h / c.conn_idle_cpu_s
    by_mem = m.instance_mem_gib * h * GIB / (c.conn_rss_kib * KIB)
    docs = m.instance_cores * h / c.relay_cpu_s
    stored = m.instance_cores * h / (c.relay_cpu_s + c.store_extra_cpu_s)
    pg_cpu = m.pg_cores * h / c.pg_cpu_stored_s
    pg_wal = m.pg_wal_mib_s * h * MIB / c.wal_stored_b
    instances = (m.pg_connections - 3) // m.pg_conns_per_instance
    return [
        f"one instance, idle connections: {by_cpu:,.0f} by CPU (their pings), {by_mem:,.0f} by memory,"
        f" {m.instance_fds - 64:,} by open files; readmitting them after a restart: {by_cpu * c.connect_cpu_s:,.0f} s"
        " of one core (one TLS handshake each)",
        f"one instance, documents: {docs:,.0f}/s forwarded or {stored:,.0f}/s through the store (relay CPU)",
        f"one PostgreSQL store, documents through it: {pg_cpu:,.0f}/s by server CPU, {pg_wal:,.0f}/s by WAL;"
        f" {instances} instances by max_connections={m.pg_connections}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/scaling_model.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--orgs", type=int, default=100_000, help="organizations (default 100,000)")
    p.add_argument("--docs-per-org", type=float, default=100.0, help="documents each sends a day (default 100)")
    p.add_argument("--online", type=float, default=0.7, help="share whose target is connected (default 0.7)")
    p.add_argument("--peak", type=float, default=3.0, help="peak-hour rate / daily average (default 3)")
    p.add_argument("--pg-cores", type=float, default=Machine.pg_cores)
    p.add_argument("--wal-mib-s", type=float, default=Machine.pg_wal_mib_s)
    p.add_argument("--pg-disk-gib", type=float, default=Machine.pg_disk_gib)
    p.add_argument("--headroom", type=float, default=Machine.headroom)
    a = p.parse_args(argv)
    if a.orgs < 1 or not 0 <= a.online <= 1 or a.peak < 1 or a.docs_per_org < 0 or not 0 < a.headroom <= 1:
        print("error: --orgs >= 1, 0 <= --online <= 1, --peak >= 1, --docs-per-org >= 0, 0 < --headroom <= 1",
              file=sys.stderr)
        return 2
    c = Costs()
    m = Machine(pg_cores=a.pg_cores, pg_wal_mib_s=a.wal_mib_s, pg_disk_gib=a.pg_disk_gib, headroom=a.headroom)
    print(f"{a.docs_per_org:g} documents per organization a day, {a.online:.0%} to a connected target,"
          f" peak hour {a.peak:g}x the average; budgets {a.headroom:.0%} of: 1 core and"
          f" {m.instance_mem_gib:g} GiB per instance, {m.pg_cores:g} cores, {m.pg_wal_mib_s:g} MiB/s WAL and"
          f" {m.pg_disk_gib:,.0f} GiB per PostgreSQL server")
    print("\nceilings, at those budgets:")
    for line in ceilings(c, m):
        print(f"  {line}")
    sizes = sorted({1_000, 5_000, 10_000, 25_000, 50_000, 100_000, a.orgs})
    for n in sizes:
        t = Traffic(n, a.docs_per_org, a.online, a.peak)
        print(f"\n{n:,} organizations: {t.peak_docs_s:,.0f} documents/s at the peak")
        for v in (sqlite_design(t, c, m), pg_design(t, c, m), sharded_design(t, c, m)):
            print(f"  {v.design:<38} {v.cpu:<15} {v.pg:<52} {'ok: ' if v.fits else 'SATURATED: '}{v.limit}")
    t = Traffic(a.orgs, a.docs_per_org, a.online, a.peak)
    print()
    for line in volumes(t, c):
        print(line)
    # Where each design stops, at this traffic per organization.
    print("\nlargest network each design carries at this traffic:")
    for name, fn in (("one SQLite platform", sqlite_design), ("one PostgreSQL, N instances", pg_design)):
        lo, hi = 1, 10_000_000
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fn(Traffic(mid, a.docs_per_org, a.online, a.peak), c, m).fits:
                lo = mid
            else:
                hi = mid - 1
        v = fn(Traffic(lo + 1, a.docs_per_org, a.online, a.peak), c, m)
        print(f"  {name:<28} {lo:>10,} organizations; then {v.limit}")
    v = sharded_design(Traffic(a.orgs, a.docs_per_org, a.online, a.peak), c, m)
    print(f"  {'sharded by semq_db_id':<28} {a.orgs:>10,} organizations need {v.design.split(': ')[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
