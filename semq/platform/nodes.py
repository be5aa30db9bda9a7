"""The organizations the platform knows: the owner of the ``nodes`` table.

A row is an organization registered (``semq platform register``, an
enrollment, or its first HELLO when the platform registers automatically),
with the units the operator granted it, the units it runs (its HELLO says
so: semq.umxt_protocol.units), when it was last connected, and whether it
is revoked.

Held in memory: who is known (a cache of the rows not revoked, filled on
first use: an organization enrolled by another process while the relay runs
is found in the table then) and who runs several units (read at start, and
again by a clustered instance: another instance may have learnt it from a
HELLO). The router reads both per document, so neither is ever rebound:
the router holds the same set and dict."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from semq.store.pg import declare_key
from semq.umxt_protocol import Endpoint, NodeType, RemoteProtocolError, ResultCode
from semq.umxt_protocol.units import MAX_UNITS

from .views import NodeRow, OrgRow, select_list

__all__ = ["Nodes"]

# (For semq.store.pg.translate_sql: ``register``'s upsert names no key.)
declare_key("nodes", ("node_type", "node_id"))

_UNITS_READ_S: Final = 0.5  # clustered: how often an organization's number of units is read again
_CACHE_MAX: Final = 100_000  # entries of a look-up cache before it is emptied


class Nodes:
    """The ``nodes`` table, on the store's connection and inside the
    caller's transaction (the platform's store thread)."""

    def __init__(self, conn: Any, *, clustered: bool = False) -> None:
        self.conn = conn
        self._clustered = clustered
        self.known: set[Endpoint] = {
            Endpoint(node_type=t, node_id=i)
            for t, i in conn.execute("SELECT node_type, node_id FROM nodes WHERE revoked=0")
        }
        # Organizations that run several units, and how many: their
        # documents are spread over the units by LK0.
        self.units: dict[Endpoint, int] = {}
        # Clustered: when each organization not in ``units`` was last looked
        # up (monotonic s): one of its units may have said hello at another
        # instance since this one read them.
        self._units_read: dict[Endpoint, float] = {}
        self.load_units()

    def load_units(self) -> None:
        """Read the organizations' unit counts again (another instance of a
        clustered platform may have learnt one from a HELLO)."""
        fresh = {Endpoint(node_type=t, node_id=i): int(n) for t, i, n in self.conn.execute(
            "SELECT node_type, node_id, units FROM nodes WHERE units > 1")}
        self.units.clear()
        self.units.update(fresh)

    def is_known(self, ep: Endpoint) -> bool:
        """Registered and not revoked (the cache, else the table)."""
        if ep in self.known:
            return True
        row = self.conn.execute("SELECT 1 FROM nodes WHERE node_type=? AND node_id=? AND revoked=0",
                                (int(ep.node_type), ep.node_id)).fetchone()
        if row:
            self.known.add(ep)
        return bool(row)

    def admit(self, org: Endpoint, ts: int) -> None:
        """``org``, unknown, registered by its HELLO (automatic registration)."""
        self.conn.execute("INSERT OR IGNORE INTO nodes (node_type, node_id, registered_ms) VALUES (?,?,?)",
                          (int(org.node_type), org.node_id, ts))
        self.known.add(org)

    def connected(self, org: Endpoint, ts: int) -> None:
        """``org`` completed a HELLO at ``ts``, or its connection ended then
        (the last time it was seen: what a PRESENCE answer says)."""
        self.conn.execute("UPDATE nodes SET last_seen_ms=? WHERE node_type=? AND node_id=?",
                          (ts, int(org.node_type), org.node_id))

    def last_seen(self, node_ids: Sequence[str]) -> dict[str, int]:
        """The organizations of ``node_ids`` registered and not revoked, and
        when each was last seen connected (0: never)."""
        if not node_ids:
            return {}
        marks = ",".join("?" * len(node_ids))
        return {str(i): int(ls or 0) for i, ls in self.conn.execute(
            f"SELECT node_id, last_seen_ms FROM nodes WHERE node_type=? AND revoked=0 AND node_id IN ({marks})",
            (int(NodeType.ORGANIZATION), *node_ids))}

    def set_units(self, org: Endpoint, units: int) -> bool:
        """``org`` runs ``units`` units (its HELLO says so). Returns whether
        that differs from what the table said (its waiting documents are
        then spread again: semq.platform.copies). Raises
        RemoteProtocolError (INVALID_FIELD) past MAX_UNITS."""
        if units > MAX_UNITS:
            raise RemoteProtocolError(f"units {units} exceeds the limit of {MAX_UNITS}", ResultCode.INVALID_FIELD)
        (known,) = self.conn.execute("SELECT units FROM nodes WHERE node_type=? AND node_id=?",
                                     (int(org.node_type), org.node_id)).fetchone() or (1,)
        if known != units:
            self.conn.execute("UPDATE nodes SET units=? WHERE node_type=? AND node_id=?",
                              (units, int(org.node_type), org.node_id))
        if units > 1:
            self.units[org] = units
        else:
            self.units.pop(org, None)
        return bool(known != units)

    def units_of(self, target: Endpoint) -> int | None:
        """How many units ``target`` runs, when more than one. Clustered,
        an organization not known to run several is looked up again at most
        every _UNITS_READ_S (its first HELLO as a node of several units may
        have reached another instance)."""
        n = self.units.get(target)
        if n is not None or not self._clustered:
            return n
        now = time.monotonic()
        if now - self._units_read.get(target, -_UNITS_READ_S) < _UNITS_READ_S:
            return None
        if len(self._units_read) > _CACHE_MAX:
            self._units_read.clear()
        self._units_read[target] = now
        row = self.conn.execute("SELECT units FROM nodes WHERE node_type=? AND node_id=?",
                                (int(target.node_type), target.node_id)).fetchone()
        if row is None or row[0] <= 1:
            return None
        self.units[target] = int(row[0])
        return self.units[target]

    def register(self, node_ids: Sequence[str], units: int | None, ts: int) -> None:
        """Make organizations known (again, if revoked); ``units``: grant
        each that many units, else an organization new here is granted one
        and a known one keeps its grant."""
        for nid in node_ids:
            ep = Endpoint.org(nid)
            self.conn.execute(
                "INSERT INTO nodes (node_type, node_id, registered_ms, units_granted) VALUES (?,?,?,?)"
                " ON CONFLICT DO UPDATE SET revoked=0"
                + ("" if units is None else ", units_granted=excluded.units_granted"),
                (int(ep.node_type), ep.node_id, ts, units or 1),
            )
            self.known.add(ep)

    def revoke(self, node_id: str) -> int:
        """The organization ``node_id`` revoked (its certificates are the
        CA's to revoke: semq.identity.security.revoke). How many rows."""
        n = int(self.conn.execute("UPDATE nodes SET revoked=1 WHERE node_id=?", (node_id,)).rowcount)
        for ep in [ep for ep in self.known if ep.node_id == node_id]:
            self.known.discard(ep)
        return n

    def granted(self) -> dict[str, int]:
        """The organizations granted more than one unit, and how many."""
        return {i: int(n) for i, n in self.conn.execute(
            "SELECT node_id, units_granted FROM nodes WHERE units_granted > 1 AND revoked=0")}

    def units_granted(self, org: Endpoint) -> int:
        """How many units the operator granted ``org`` (1 unless granted
        more): what its HELLO may claim, and what its connection allowance
        counts (semq.settings.bounds)."""
        row = self.conn.execute("SELECT units_granted FROM nodes WHERE node_type=? AND node_id=?",
                                (int(org.node_type), org.node_id)).fetchone()
        return 1 if row is None else int(row[0])

    def rows(self) -> list[NodeRow]:
        """Every organization, revoked ones too, by id."""
        return [NodeRow(i, ls, int(rv)) for i, ls, rv in self.conn.execute(
            "SELECT node_id, last_seen_ms, revoked FROM nodes ORDER BY node_id")]

    def listing(self, limit: int) -> list[OrgRow]:
        """The organizations (revoked ones too) by id, at most ``limit``,
        with what they were granted and what they run."""
        return [OrgRow(*r) for r in self.conn.execute(
            f"SELECT {select_list(OrgRow, {})} FROM nodes ORDER BY node_id LIMIT ?", (limit,))]
