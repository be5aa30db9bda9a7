"""SEMQ units: one organization's node as several processes (SPEC "SEMQ units").

A node may run as N units (``semq_id`` 1..N), each a process with its own
store (``semq_db_id`` 1). The platform sees one organization with N
connections and keeps each unit's connection, and what waits for it, under a
*route*: the organization's endpoint for unit 1, and ``ORG:K`` for unit K > 1
(a node id no organization can have: organization ids are digits only).
Routes never leave the platform and are never accepted as a frame's target.

Which unit a document goes to is decided once, by the platform, from its
LK0 alone (``holder``): the same unit gets every copy of it, its resends and
the inquiries about it, so each unit's duplicate suppression sees all of its
documents. Acks and confirmations name the unit of the record they are
about (``dest_semq_id``); so do inquiries and answers sent to a document's
origin (its LK0's ``semq_id``). Pure: no I/O.
"""

from __future__ import annotations

import struct
import zlib
from functools import lru_cache
from typing import Final

from semq.umxt_protocol import LK0, Endpoint

__all__ = ["MAX_UNITS", "UNIT_SEP", "holder", "route_of", "route_org", "route_unit", "unit_for"]

MAX_UNITS: Final = 32  # units of one node: processes on one machine, each with its own store and connection
UNIT_SEP: Final = ":"
_KEY: Final = struct.Struct(">BHHQ")


def holder(lk0: LK0, units: int) -> int:
    """The unit (1..units) of a receiving organization that holds the
    document ``lk0``: a function of the LK0 alone, the same at every
    platform instance and after every restart."""
    if units <= 1:
        return 1
    e = lk0.endpoint
    h = zlib.crc32(_KEY.pack(int(e.node_type), lk0.semq_id, lk0.semq_db_id, lk0.record_id), _seed(e.node_id))
    return 1 + h % units


@lru_cache(maxsize=4096)
def _seed(node_id: str) -> int:
    return zlib.crc32(node_id.encode())


def unit_for(target: Endpoint, lk0: LK0, units: int) -> int:
    """The unit of ``target`` (an organization of ``units`` units) that a
    frame about ``lk0`` is for: its own record's unit when ``target`` is the
    document's origin, else the unit that holds the document."""
    if lk0.endpoint == target:
        return min(max(lk0.semq_id, 1), units)
    return holder(lk0, units)


def route_of(org: Endpoint, unit: int) -> Endpoint:
    """The platform's key of ``org``'s unit ``unit``."""
    if unit <= 1:
        return org
    return Endpoint(node_type=org.node_type, node_id=f"{org.node_id}{UNIT_SEP}{unit}")


def route_org(route: Endpoint) -> Endpoint:
    """The organization of a route (the route itself for unit 1)."""
    nid = route.node_id
    if UNIT_SEP not in nid:
        return route
    return Endpoint(node_type=route.node_type, node_id=nid.partition(UNIT_SEP)[0])


def route_unit(route: Endpoint) -> int:
    """The unit of a route: 1 for an organization's own endpoint."""
    nid = route.node_id
    if UNIT_SEP not in nid:
        return 1
    return int(nid.rpartition(UNIT_SEP)[2])
