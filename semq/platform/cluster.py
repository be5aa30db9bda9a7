"""Several platform instances on one PostgreSQL store (docs/operations.md,
"Several platform instances"): which instance holds which organization's
connection, and how a document for an organization connected to another
instance reaches it.

**One hop through PostgreSQL's notifications, the store behind it**
(measured in docs/benchmarks.md). A frame for a target held by another
instance is handed to that instance in a ``NOTIFY`` on its channel, sent in
the batch's transaction: PostgreSQL delivers it when the transaction
commits, never before, and it is not written to the WAL. The origin gets
ACK_FWD, as for a target connected here; like a frame handed to a
connection, it promises nothing durable. The receiving instance stores a
frame it cannot give to its target now (the target left, its queue is over
its high-water mark: ``PlatformCore.store_handed_over``), but drops a
SaveFwd 1 document (forwarded now or dropped: its origin's inquiry to the
target reports it dropped); one lost on the
way (the receiving instance died) is recovered by the origin's inquiry and
resend. A frame too large
for a notification (``HOP_MAX_FRAME``) is stored instead (ACK_SAVE), and the
holding instance woken by a notification; each instance also sweeps every
``SWEEP_S`` for stored copies of the organizations it holds, so a lost
wake-up delays a stored document, never loses it. Instances never connect
to each other: none needs another's address, and a dead instance is
nobody's problem: its organizations reconnect elsewhere.

Fencing: every connection an instance accepts takes a new epoch from one
sequence and writes it to the organization's ``presence`` row. An instance
claims stored copies for an organization only while the row still holds
its epoch (checked in the claim's transaction), and removes the row only
if it does: an instance that lost a node's connection to another instance
without noticing (a half-open TCP connection, a pause) can neither deliver
to it nor make it look offline."""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

from semq.store.db import StoreError
from semq.store.pg import PgListener
from semq.tracking.events import now_ms
from semq.umxt_protocol import Endpoint, NodeType
from semq.umxt_protocol.units import UNIT_SEP

from .views import InstanceRow

__all__ = ["HOP_MAX_FRAME", "LIVE_MS", "SWEEP_S", "Presence", "WakeListener", "new_instance_id"]

log = logging.getLogger("semq.platform")

SWEEP_S: Final = 1.0  # how often an instance looks for stored copies of the organizations it holds
HEARTBEAT_S: Final = 1.0
LIVE_MS: Final = 5000  # an instance whose heartbeat is older is taken as gone
_CACHE_S: Final = 0.5  # how long a presence look-up is reused by the router
_CHANNEL_PREFIX: Final = "semq_wake_"
# PostgreSQL's limit on a notification's payload is 8,000 bytes; a frame
# travels in base64 (4/3) with a short header: frames up to this hop, larger
# ones go through the store.
_PAYLOAD_MAX: Final = 7900
HOP_MAX_FRAME: Final = 5600


def new_instance_id() -> str:
    """An id for one run of one instance (host, process, a random part)."""
    host = socket.gethostname().split(".")[0][:20]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def channel(instance: str) -> str:
    """The NOTIFY channel an instance listens on (an identifier: quoted)."""
    return '"' + f"{_CHANNEL_PREFIX}{instance}"[:63] + '"'  # (identifiers: at most 63 bytes)


class Presence:
    """The owner of the ``presence`` and ``instances`` tables: one
    instance's view of them, on the core's connection and inside the core's
    transactions (the store thread). In memory: the epochs of the
    organizations this instance holds (the fence its claims check), and for
    ``_CACHE_S`` where others are held."""

    def __init__(self, conn: Any, instance: str) -> None:
        self.conn = conn
        self.instance = instance
        self.epochs: dict[Endpoint, int] = {}  # the organizations this instance holds, by epoch
        self.fenced: set[Endpoint] = set()  # held here, but taken by a newer connection elsewhere
        self._where: dict[Endpoint, tuple[str | None, float]] = {}
        self._last_beat = 0.0

    def register(self, address: str) -> None:
        """This instance is running (at ``address``): in the instances table."""
        ts = now_ms()
        self.conn.execute(
            "INSERT INTO instances (id, address, pid, started_ms, heartbeat_ms) VALUES (?,?,?,?,?)"
            " ON CONFLICT (id) DO UPDATE SET address=EXCLUDED.address, heartbeat_ms=EXCLUDED.heartbeat_ms",
            (self.instance, address, os.getpid(), ts, ts))

    def heartbeat(self) -> None:
        self.conn.execute("UPDATE instances SET heartbeat_ms=? WHERE id=?", (now_ms(), self.instance))
        self._last_beat = time.monotonic()

    def leave(self) -> None:
        """A clean stop: this instance holds nobody now."""
        self.conn.execute("DELETE FROM presence WHERE instance=?", (self.instance,))
        self.conn.execute("DELETE FROM instances WHERE id=?", (self.instance,))
        self.epochs.clear()

    def attach(self, ep: Endpoint) -> int:
        """``ep`` connected here: a new epoch, written to its presence row
        (whichever instance held it before)."""
        (epoch,) = self.conn.execute(
            "INSERT INTO presence (node_type, node_id, instance, epoch, since_ms)"
            " VALUES (?, ?, ?, nextval('presence_epoch'), ?)"
            " ON CONFLICT (node_type, node_id) DO UPDATE SET instance=EXCLUDED.instance,"
            " epoch=EXCLUDED.epoch, since_ms=EXCLUDED.since_ms RETURNING epoch",
            (int(ep.node_type), ep.node_id, self.instance, now_ms())).fetchone()
        self.epochs[ep] = int(epoch)
        self.fenced.discard(ep)
        self._where.pop(ep, None)
        return int(epoch)

    def detach(self, ep: Endpoint) -> None:
        """``ep``'s connection here ended: its row goes, unless a newer
        connection (elsewhere) owns it by now."""
        epoch = self.epochs.pop(ep, None)
        self.fenced.discard(ep)
        if epoch is not None:
            self.conn.execute("DELETE FROM presence WHERE node_type=? AND node_id=? AND epoch=?",
                              (int(ep.node_type), ep.node_id, epoch))

    def forget_stale(self) -> None:
        """Rows naming this instance for connections it no longer has (their
        removal failed while the store was away): removed."""
        mine = set(self.epochs.values())
        stale = [(t, i, e) for t, i, e in self.conn.execute(
            "SELECT node_type, node_id, epoch FROM presence WHERE instance=?", (self.instance,)).fetchall()
            if int(e) not in mine]
        self.conn.executemany("DELETE FROM presence WHERE node_type=? AND node_id=? AND epoch=?", stale)

    def holds(self, ep: Endpoint) -> bool:
        """Whether ``ep``'s presence row still holds this instance's epoch
        (the fence a claim checks in its transaction)."""
        epoch = self.epochs.get(ep)
        if epoch is None:
            return False
        row = self.conn.execute("SELECT 1 FROM presence WHERE node_type=? AND node_id=? AND epoch=?",
                                (int(ep.node_type), ep.node_id, epoch)).fetchone()
        if row is None:
            self.fenced.add(ep)
            self._where.pop(ep, None)  # held elsewhere now: the router must look again
            return False
        return True

    def online_since(self, node_ids: Sequence[str]) -> dict[str, int]:
        """Of the organizations ``node_ids``, those connected to a live
        instance (any of their units), and since when (the earliest)."""
        out: dict[str, int] = {}
        for nid in node_ids:
            row = self.conn.execute(
                "SELECT min(p.since_ms) FROM presence p JOIN instances i ON i.id = p.instance"
                " WHERE p.node_type=? AND (p.node_id=? OR p.node_id LIKE ?) AND i.heartbeat_ms>=?",
                (int(NodeType.ORGANIZATION), nid, f"{nid}{UNIT_SEP}%", now_ms() - LIVE_MS)).fetchone()
            if row and row[0] is not None:
                out[nid] = int(row[0])
        return out

    def elsewhere(self, ep: Endpoint) -> str | None:
        """The live instance (other than this one) holding ``ep``'s
        connection, or None. Reused for ``_CACHE_S``: the router asks per
        document, and a stale answer only chooses between storing (always
        safe) and waking."""
        now = time.monotonic()
        hit = self._where.get(ep)
        if hit is not None and now - hit[1] < _CACHE_S:
            return hit[0]
        row = self.conn.execute(
            "SELECT p.instance FROM presence p JOIN instances i ON i.id = p.instance"
            " WHERE p.node_type=? AND p.node_id=? AND p.instance<>? AND i.heartbeat_ms>=?",
            (int(ep.node_type), ep.node_id, self.instance, now_ms() - LIVE_MS)).fetchone()
        where = row[0] if row else None
        if len(self._where) > 100_000:
            self._where.clear()
        self._where[ep] = (where, now)
        return where

    def wake(self, targets: set[Endpoint]) -> None:
        """Inside the transaction that stored copies for ``targets``: wake
        the instances holding them (delivered when it commits)."""
        by_instance: dict[str, list[str]] = {}
        for t in targets:
            where = self.elsewhere(t)
            if where is not None:
                by_instance.setdefault(where, []).append(f"{int(t.node_type)} {t.node_id}")
        for inst, payloads in by_instance.items():
            self._notify(inst, [f"W {p}" for p in payloads])

    def hand_over(self, hops: dict[str, list[tuple[Endpoint, bytes]]]) -> None:
        """Inside the batch's transaction: frames for targets held by other
        instances, to those instances (delivered at commit)."""
        for inst, items in hops.items():
            self._notify(inst, [f"F {int(t.node_type)} {t.node_id} {base64.b64encode(b).decode()}"
                                for t, b in items])

    def _notify(self, inst: str, lines: list[str]) -> None:
        """``lines`` to ``inst``'s channel, as few notifications as fit."""
        payloads: list[tuple[str, str]] = []
        chunk: list[str] = []
        size = 0
        name = channel(inst).strip('"')
        for line in lines:
            if chunk and size + len(line) + 1 > _PAYLOAD_MAX:
                payloads.append((name, "\n".join(chunk)))
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        if chunk:
            payloads.append((name, "\n".join(chunk)))
        # One statement for many, each payload a parameter of its own (an
        # array of the payloads was dumped by psycopg character by character
        # in Python: 15% of an instance's samples, py-spy).
        for i in range(0, len(payloads), 1000):
            some = payloads[i:i + 1000]
            self.conn.execute("SELECT " + ", ".join(["pg_notify(?, ?)"] * len(some)),
                              [v for pair in some for v in pair])

    def held_here(self) -> tuple[str, tuple[Any, ...]]:
        """A subquery of the organizations whose presence row names this
        instance, ``(node_type, node_id)`` each, and its parameters: for
        another owner's query about them (semq.platform.copies)."""
        return "SELECT node_type, node_id FROM presence WHERE instance=?", (self.instance,)

    def online(self) -> dict[str, str]:
        """The organizations connected to a live instance (each route: an
        organization's unit too), and the instance holding each."""
        return {str(nid): str(inst) for nid, inst in self.conn.execute(
            "SELECT p.node_id, p.instance FROM presence p JOIN instances i ON i.id = p.instance"
            " WHERE i.heartbeat_ms>=?", (now_ms() - LIVE_MS,)).fetchall()}

    def instances(self) -> list[InstanceRow]:
        """The instances on the store, by address, with how many
        organizations each holds."""
        return [InstanceRow(i, addr, int(pid), int(hb), int(n)) for i, addr, pid, hb, n in self.conn.execute(
            "SELECT i.id, i.address, i.pid, i.heartbeat_ms, count(p.node_id) FROM instances i"
            " LEFT JOIN presence p ON p.instance = i.id GROUP BY i.id, i.address, i.pid, i.heartbeat_ms"
            " ORDER BY i.address").fetchall()]


def _parse(line: str) -> tuple[Endpoint, bytes | None] | None:
    """One line of a notification: ``W type id`` (a wake-up) or ``F type id
    base64`` (a frame handed over); None for anything else."""
    parts = line.split(" ", 3)
    try:
        if parts[0] == "W" and len(parts) == 3:
            return Endpoint(node_type=NodeType(int(parts[1])), node_id=parts[2]), None
        if parts[0] == "F" and len(parts) == 4:
            frame = base64.b64decode(parts[3], validate=True)
            return Endpoint(node_type=NodeType(int(parts[1])), node_id=parts[2]), frame
    except (ValueError, TypeError):  # (binascii.Error is a ValueError; so is a bad endpoint)
        pass
    return None


class WakeListener:
    """The instance's own connection that LISTENs on its channel
    (semq.store.pg.PgListener); ``wait`` blocks (on a worker thread) until
    notifications arrive or ``timeout`` passes, and returns the
    organizations to wake. A lost connection is opened again on the next
    call (the sweep covers the gap)."""

    def __init__(self, url: str, instance: str) -> None:
        self.url = url
        self.instance = instance
        self._listener = PgListener(url, channel(instance))

    def wait(self, timeout: float) -> list[tuple[Endpoint, bytes | None]]:
        try:
            payloads = self._listener.wait(timeout)
        except StoreError as e:
            log.warning("cluster wake-ups: %s; the sweep covers the gap", " ".join(str(e).split()))
            time.sleep(min(timeout, 1.0))
            return []
        out: list[tuple[Endpoint, bytes | None]] = []
        for payload in payloads:
            for line in payload.splitlines():
                got = _parse(line)
                if got is None:
                    # Anything else on the channel (whoever may NOTIFY
                    # in the database) is skipped, never fatal.
                    log.warning("cluster wake-ups: a malformed notification skipped: %.80r", line)
                else:
                    out.append(got)
        return out

    def close(self) -> None:
        self._listener.close()
