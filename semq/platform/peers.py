"""The platform as a directory of direct links: where organizations listen
for node-to-node connections, and who may learn it.

A node that listens announces its addresses over its platform connection
(PEER_ANNOUNCE) with a lifetime and renews it; the platform records them in
the ``peers`` table of its store (shared by every instance of a platform on
PostgreSQL), with the fingerprint of the certificate that connection
presented. An origin asks (PEER_LOOKUP) and is answered (PEER_INFO) only if
the target allows it: the target's allow-list, empty meaning every
organization the platform admits. Like Syncthing's global discovery, the
directory only says where to try: what makes a direct link trustworthy is
the mutual TLS between the two nodes, checked against the CA and the
certificates each already holds of the other (semq.node.daemon.direct).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from semq.store.pg import declare_key
from semq.umxt_protocol import Endpoint, NodeType, PeerAnnounce, PeerInfo, ResultCode

__all__ = ["Peers", "observed_addresses"]

_SEP: Final = "\n"  # between addresses and ids in a row (neither may hold one: printable text)


# (For semq.store.pg.translate_sql: ``announce`` replaces a row without naming its key.)
declare_key("peers", ("node_id",), ("addresses", "allowed", "fingerprint", "expires_ms", "announced_ms"))


def observed_addresses(body: PeerAnnounce, observed_host: str | None) -> list[str]:
    """The addresses to record: the announced ones and, with ``observe``,
    the host the platform saw the connection come from, with each port
    announced (a node behind NAT or with a wildcard listen learns nothing
    itself). Unique, announced first, at most 8."""
    out = list(dict.fromkeys(body.addresses))
    if body.observe and observed_host:
        host = f"[{observed_host}]" if ":" in observed_host else observed_host
        for a in body.addresses:
            port = a.rpartition(":")[2]
            if port.isdigit():
                cand = f"{host}:{port}"
                if cand not in out:
                    out.append(cand)
    return out[:8]


class Peers:
    """The owner of the ``peers`` table: the announcements, on the store's
    connection and inside the caller's transaction (the platform's store
    thread). Holds nothing in memory: every answer is the table's."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def announce(self, ep: Endpoint, addresses: Sequence[str], allowed: Sequence[str], fingerprint: str,
                 expires_ms: int, ts: int) -> None:
        """Record (or replace) where ``ep`` listens until ``expires_ms``."""
        self.conn.execute(
            "INSERT OR REPLACE INTO peers (node_id, addresses, allowed, fingerprint, expires_ms, announced_ms)"
            " VALUES (?,?,?,?,?,?)",
            (ep.node_id, _SEP.join(addresses), _SEP.join(allowed), fingerprint, expires_ms, ts))

    def withdraw(self, ep: Endpoint) -> None:
        self.conn.execute("DELETE FROM peers WHERE node_id=?", (ep.node_id,))

    def lookup(self, asker: Endpoint, about: Endpoint, ts: int, known: bool) -> PeerInfo:
        """The answer to ``asker``'s PEER_LOOKUP about ``about``: its addresses
        if it announced some that have not expired and allows ``asker``;
        otherwise why not (nothing about the addresses of an organization that
        does not allow the asker, not even whether it listens)."""
        if about.node_type is not NodeType.ORGANIZATION or not known:
            return PeerInfo(endpoint=about, code=ResultCode.UNKNOWN_TARGET)
        row = self.conn.execute("SELECT addresses, allowed, fingerprint, expires_ms FROM peers WHERE node_id=?",
                                (about.node_id,)).fetchone()
        if row is not None:
            allowed = [a for a in row[1].split(_SEP) if a]
            if allowed and asker.node_id not in allowed:
                return PeerInfo(endpoint=about, code=ResultCode.DIRECT_NOT_ALLOWED)
        if row is None or int(row[3]) <= ts or not row[0]:
            return PeerInfo(endpoint=about, code=ResultCode.NO_DIRECT_ADDRESS)
        return PeerInfo(endpoint=about, expires_ms=int(row[3]), fingerprint=row[2],
                        addresses=tuple(a for a in row[0].split(_SEP) if a)[:8])

    def listing(self, ts: int) -> list[dict[str, Any]]:
        """Every announcement, for the platform's status."""
        return [{"node": n, "addresses": [a for a in addrs.split(_SEP) if a],
                 "allowed": [a for a in allowed.split(_SEP) if a], "expires_ms": int(exp), "live": int(exp) > ts}
                for n, addrs, allowed, exp in self.conn.execute(
                    "SELECT node_id, addresses, allowed, expires_ms FROM peers ORDER BY node_id")]

    def expire(self, before_ms: int) -> int:
        """Announcements that expired before ``before_ms``, removed (until
        then the status shows them expired: a listener that went away).
        How many."""
        return int(self.conn.execute("DELETE FROM peers WHERE expires_ms < ?", (before_ms,)).rowcount)
