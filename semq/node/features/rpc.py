"""Request / reply over SEMQ (seed 000, ITS-MQ's application patterns).

A request and its reply are two ordinary documents; nothing new on the
wire. They are told apart and correlated by their AppKey:

    request  semq.rpc / TYPE / request / <the requester's own key, may be "">
    reply    semq.rpc / TYPE / reply   / <the request's LK0, e.g. 10008/1/1/1795329835412042>

The request's LK0 names it uniquely at its origin, so it is the
correlation id. The requester records each request it sends
(``rpc_requests``, in the transaction that queues it) and matches a reply
only if it comes **from the organization it asked** with that key; the
first such reply is matched, once (``reply_inbox_id`` is set only while
NULL), and duplicates of it never reach the inbox (dedup). The responder
records each request it answered (``rpc_answers``), so it answers once.

Patterns (docs/seed-capabilities.md):

- pseudo-synchronous inquiry / update: ``request(...)`` sends and waits for
  the reply (``request_async`` in trio: semq.node.features.tasks), or
  raises ReplyTimeout;
- asynchronous inquiry: ``send_request(...)`` now, ``replies()`` /
  ``take_reply(...)`` later — a reply that came after a timeout is still
  matched to its request;
- the responder: ``incoming(...)`` lists requests, ``reply(...)`` answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from semq.tracking.events import now_ms
from semq.umxt_protocol import LK0, NodeType

from ..api import UNIT_IDS
from ..rows import columns
from ._access import core_of, write_tx

if TYPE_CHECKING:
    from ..api import InboxItem, NodeClient
    from ..core import NodeCore

__all__ = [
    "REPLY",
    "REQUEST",
    "RPC_DOMAIN",
    "Reply",
    "ReplyTimeout",
    "RequestInfo",
    "RpcError",
    "incoming",
    "is_request",
    "poll_reply",
    "purge",
    "replies",
    "reply",
    "request",
    "send_request",
    "take_reply",
    "unmatched_replies",
    "wait_reply",
]

RPC_DOMAIN: Final = "semq.rpc"  # AppKey domain of requests and replies
REQUEST: Final = "request"  # AppKey subtype of a request
REPLY: Final = "reply"  # AppKey subtype of a reply; its key is the request's LK0
POLL: Final = 0.05  # s between looks at the inbox while waiting


class RpcRequestRow(NamedTuple):
    """A request this node sent (``rpc_requests``) and its reply, if matched."""

    record_id: int
    target_id: str
    data_type: str
    sent_ms: int
    timeout_ms: int
    reply_inbox_id: int | None
    replied_ms: int | None
    taken_ms: int | None


class RpcError(ValueError):
    """A request / reply mistake (no such request, not a request, already
    answered): the user's. CLI exit 2."""


class ReplyTimeout(TimeoutError):
    """No reply within the timeout. The request stays recorded: a later
    reply is matched to it (``replies()``, ``take_reply()``)."""

    def __init__(self, request: LK0, target: str, timeout: float) -> None:
        super().__init__(f"no reply from {target} to request {request} within {timeout:g} s;"
                         " a later reply is kept for it (semq replies)")
        self.request = request
        self.target = target
        self.timeout = timeout


@dataclass(frozen=True)
class Reply:
    request: LK0  # the request it answers
    item: InboxItem  # the reply document in the inbox

    @property
    def data(self) -> bytes:
        return self.item.app_data

    @property
    def lk0(self) -> LK0:
        return self.item.lk0


@dataclass(frozen=True)
class RequestInfo:
    """A request this node sent and what became of it."""

    lk0: LK0
    target: str
    data_type: str
    sent_ms: int
    timeout_ms: int | None
    reply_inbox_id: int | None
    replied_ms: int | None
    taken_ms: int | None

    @property
    def state(self) -> str:
        """``waiting``, ``replied`` (in the inbox, not taken) or ``taken``."""
        return "taken" if self.taken_ms else "replied" if self.reply_inbox_id else "waiting"


# ---------------------------------------------------------------- requester


def send_request(
    node: NodeClient, to: str, data: bytes, *, data_type: str, key: str = "", priority: int = 0,
    save_fwd: int = 3, expires_in: float | None = None, encrypt: bool = True, timeout: float | None = None,
) -> LK0:
    """Queue a request (durable when this returns) and record it for its
    reply; returns its LK0 = the correlation id. Does not wait."""
    core = core_of(node)
    with write_tx(core) as conn:
        # (From the store that records it: unit 1 of a node of several.)
        [lk0] = node.send_many([dict(to=to, data=data, domain=RPC_DOMAIN, data_type=data_type,
                                     subtype=REQUEST, key=key, priority=priority, save_fwd=save_fwd,
                                     expires_in=expires_in, encrypt=encrypt)], unit=core.unit)
        conn.execute(
            "INSERT INTO rpc_requests (record_id, target_id, data_type, sent_ms, timeout_ms) VALUES (?,?,?,?,?)",
            (lk0.record_id, to, data_type, now_ms(), int(timeout * 1000) if timeout is not None else None),
        )
    return lk0


def _record_id(core: NodeCore, request: LK0 | int | str) -> int:
    if isinstance(request, int):
        return request
    if isinstance(request, str):
        request = int(request) if request.isdigit() else LK0.parse(request)
        if isinstance(request, int):
            return request
    if request.endpoint != core.me:
        raise RpcError(f"{request} is not a request of this node ({core.me.node_id})")
    return request.record_id


def _stores(node: NodeClient) -> list[tuple[NodeCore, Callable[[int], int]]]:
    """Every store whose inbox may hold a request or a reply (each unit's,
    semq.umxt_protocol.units), with how its row ids read as the node's inbox ids."""
    cores = getattr(node, "cores", None) or [core_of(node)]
    if len(cores) == 1:
        return [(cores[0], int)]
    return [(c, partial(node._item_id, c.unit)) for c in cores]


def _find_reply(node: NodeClient, key: str, target: str) -> int | None:
    """The node's inbox id of the first reply with ``key`` from ``target``."""
    for core, as_id in _stores(node):
        cand = core.inbox.reply_to(key, int(NodeType.ORGANIZATION), target)
        if cand is not None:
            return as_id(cand)
    return None


def _inbox_item(node: NodeClient, inbox_id: int) -> InboxItem:
    try:
        return node.get(inbox_id)
    except KeyError:
        raise RpcError(f"reply {inbox_id} is no longer in the inbox (purged a day after it was taken)") from None


def poll_reply(node: NodeClient, request: LK0 | int | str, *, take: bool = True) -> Reply | None:
    """One look for the reply to ``request``: match it (once) if it came,
    and with ``take`` acknowledge it in the inbox. None if none came yet.
    Raises RpcError for a request this node has no record of."""
    core = core_of(node)
    rid = _record_id(core, request)
    lk0 = core.ctx.lk0(rid)
    row = core.conn.execute("SELECT target_id, reply_inbox_id, taken_ms FROM rpc_requests WHERE record_id=?",
                            (rid,)).fetchone()
    if row is None:
        raise RpcError(f"no request {lk0} recorded here (sent with 'semq request'?)")
    target, matched, taken = row
    inbox_id = matched
    if inbox_id is None:
        inbox_id = _find_reply(node, str(lk0), target)
        if inbox_id is None:
            return None
    if (take and not taken) or matched is None:
        ts = now_ms()
        one_store = len(_stores(node)) == 1
        with write_tx(core) as conn:
            conn.execute("UPDATE rpc_requests SET reply_inbox_id=?, replied_ms=? WHERE record_id=?"
                         " AND reply_inbox_id IS NULL", (inbox_id, ts, rid))
            if take:
                conn.execute("UPDATE rpc_requests SET taken_ms=? WHERE record_id=? AND taken_ms IS NULL", (ts, rid))
                if one_store:
                    core.inbox.acknowledge([inbox_id], ts)
            inbox_id = conn.execute("SELECT reply_inbox_id FROM rpc_requests WHERE record_id=?",
                                    (rid,)).fetchone()[0]
        if take and not one_store:
            # The reply is in its unit's inbox (semq.umxt_protocol.units): taken there after
            # the match is recorded (once matched, it is this request's).
            node.acknowledge([inbox_id])
    return Reply(request=lk0, item=_inbox_item(node, inbox_id))


def wait_reply(node: NodeClient, request: LK0 | int | str, timeout: float = 10.0, *, take: bool = True,
               poll: float = POLL) -> Reply:
    """Wait up to ``timeout`` seconds for the reply. Raises ReplyTimeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = poll_reply(node, request, take=take)
        if got is not None:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            core = core_of(node)
            rid = _record_id(core, request)
            got = core.conn.execute("SELECT target_id FROM rpc_requests WHERE record_id=?", (rid,)).fetchone()
            (target,) = got if got is not None else ("?",)
            raise ReplyTimeout(core.ctx.lk0(rid), target, timeout)
        time.sleep(min(poll, left))


def request(node: NodeClient, to: str, data: bytes, *, data_type: str, timeout: float = 10.0,
            **options: Any) -> Reply:
    """Pseudo-synchronous inquiry / update: send, wait for the reply, take
    it. Raises ReplyTimeout (the request stays recorded; its reply, if it
    comes later, shows in ``replies()``). ``options``: key, priority,
    save_fwd, expires_in, encrypt."""
    lk0 = send_request(node, to, data, data_type=data_type, timeout=timeout, **options)
    return wait_reply(node, lk0, timeout)


def take_reply(node: NodeClient, request: LK0 | int | str) -> Reply:
    """The reply to an earlier request (asynchronous pattern), taken.
    Raises RpcError if it has not come."""
    got = poll_reply(node, request, take=True)
    if got is None:
        raise RpcError(f"no reply yet to request {request}")
    return got


def replies(node: NodeClient, *, include_taken: bool = False, limit: int = 1000) -> list[RequestInfo]:
    """Requests this node sent, oldest first, after matching every reply
    that arrived (asynchronous inquiry: "the reply arrives later in the
    inbox, correlated to the request"). Default: not yet taken."""
    core = core_of(node)
    for (rid,) in core.conn.execute("SELECT record_id FROM rpc_requests WHERE reply_inbox_id IS NULL").fetchall():
        poll_reply(node, int(rid), take=False)
    q = (f"SELECT {columns(RpcRequestRow)} FROM rpc_requests" + ("" if include_taken else " WHERE taken_ms IS NULL")
         + " ORDER BY record_id LIMIT ?")
    return [RequestInfo(lk0=core.ctx.lk0(r.record_id), target=r.target_id, data_type=r.data_type,
                        sent_ms=r.sent_ms, timeout_ms=r.timeout_ms, reply_inbox_id=r.reply_inbox_id,
                        replied_ms=r.replied_ms, taken_ms=r.taken_ms)
            for r in map(RpcRequestRow._make, core.conn.execute(q, (limit,)))]


def unmatched_replies(node: NodeClient) -> list[tuple[InboxItem, str]]:
    """Unread reply documents matched to no request, with why: a second
    reply to an answered request, one from an organization we did not ask,
    or one naming a request we have no record of."""
    core = core_of(node)
    out = []
    matched = {i for (i,) in core.conn.execute(
        "SELECT reply_inbox_id FROM rpc_requests WHERE reply_inbox_id IS NOT NULL")}
    ids = [as_id(i) for store, as_id in _stores(node) for i in store.inbox.rpc_ids(REPLY, unread=True)]
    for i in ids:
        if i in matched:
            continue
        item = node.get(i)
        try:
            rid = _record_id(core, item.app_key.key)
        except (ValueError, RpcError):
            out.append((item, f"its key {item.app_key.key!r} names no request of ours"))
            continue
        row = core.conn.execute("SELECT target_id, reply_inbox_id FROM rpc_requests WHERE record_id=?",
                                (rid,)).fetchone()
        if row is None:
            why = f"no request {item.app_key.key} is recorded here (purged, or not sent with 'semq request')"
        else:
            asked, answer = row
            if asked != item.lk0.endpoint.node_id:
                why = f"request {item.app_key.key} went to {asked}, not to {item.lk0.endpoint.node_id}"
            else:
                why = f"request {item.app_key.key} already has its reply (inbox {answer})"
        out.append((item, why))
    return out


# ---------------------------------------------------------------- responder


def is_request(item: InboxItem) -> bool:
    return item.app_key.domain == RPC_DOMAIN and item.app_key.subtype == REQUEST


def incoming(node: NodeClient, *, include_answered: bool = False, limit: int = 1000) -> list[tuple[InboxItem, LK0 | None]]:
    """Requests that arrived, with the LK0 of our reply (None: unanswered).
    Default: unanswered ones not acknowledged by other means."""
    # Each unit's requests with the answers it recorded (``reply`` answers
    # from the unit that holds the request).
    found = [(as_id(i), store.ctx.lk0(r) if r else None)
             for store, as_id in _stores(node) for i, r in _requests(store, include_answered, limit)]
    found.sort(key=lambda x: x[0])
    return [(node.get(i), lk) for i, lk in found[:limit]]


def _requests(store: NodeCore, include_answered: bool, limit: int) -> list[tuple[int, int | None]]:
    """A store's request documents (``include_answered``: all of them;
    else those unacknowledged and unanswered) with the record id of our
    reply, at most ``limit``, in id order."""
    out: list[tuple[int, int | None]] = []
    after = 0
    while len(out) < limit:
        ids = store.inbox.rpc_ids(REQUEST, unread=not include_answered, after_id=after, limit=limit)
        if not ids:
            break
        answers = dict(store.conn.execute(
            f"SELECT request_inbox_id, reply_record_id FROM rpc_answers WHERE request_inbox_id IN"
            f" ({','.join('?' * len(ids))})", ids).fetchall())
        out += [(i, answers.get(i)) for i in ids if include_answered or i not in answers]
        if len(ids) < limit:
            break
        after = ids[-1]
    return out[:limit]


def reply(
    node: NodeClient, request_id: int, data: bytes, *, data_type: str | None = None, priority: int | None = None,
    save_fwd: int = 3, expires_in: float | None = None, encrypt: bool = True,
) -> LK0:
    """Answer the request that is inbox document ``request_id``: the reply
    goes to the request's origin with key = the request's LK0. The reply is
    queued, the answer recorded and the request acknowledged in one
    transaction (of the unit that holds the request, for a node of several).
    Raises RpcError (not a request, already answered)."""
    try:
        item = node.get(int(request_id))
    except KeyError:
        raise RpcError(f"no inbox document {request_id}") from None
    cores = getattr(node, "cores", None) or [core_of(node)]
    core = cores[item.unit - 1] if len(cores) > 1 else core_of(node)
    row = item.id // UNIT_IDS if len(cores) > 1 else item.id
    if not is_request(item):
        raise RpcError(f"inbox document {request_id} is not a request (AppKey {item.app_key});"
                       f" requests carry domain {RPC_DOMAIN} and subtype {REQUEST}")
    origin = item.lk0.endpoint
    if origin.node_type is not NodeType.ORGANIZATION:
        raise RpcError(f"request {request_id} came from {origin}, which cannot receive documents")
    with write_tx(core) as conn:
        prev = conn.execute("SELECT reply_record_id FROM rpc_answers WHERE request_inbox_id=?",
                            (row,)).fetchone()
        if prev is not None:
            (answered_by,) = prev
            raise RpcError(f"request {request_id} ({item.lk0}) was already answered by"
                           f" {core.ctx.lk0(answered_by)}")
        [lk0] = node.send_many([dict(
            to=origin.node_id, data=data, domain=RPC_DOMAIN,
            data_type=item.app_key.data_type if data_type is None else data_type, subtype=REPLY,
            key=str(item.lk0), priority=item.priority if priority is None else priority, save_fwd=save_fwd,
            expires_in=expires_in, encrypt=encrypt,
        )], unit=core.unit)
        ts = now_ms()
        conn.execute("INSERT INTO rpc_answers (request_inbox_id, reply_record_id, replied_ms) VALUES (?,?,?)",
                     (row, lk0.record_id, ts))
        core.inbox.acknowledge([row], ts)
    return lk0


def purge(node: NodeClient | NodeCore, older_than_ms: int = 30 * 24 * 3600 * 1000) -> int:
    """Forget requests whose reply was taken (or that waited) longer than
    ``older_than_ms`` ago, and answers as old (the dedup retention: a
    request cannot come again after that)."""
    core = core_of(node)
    cut = now_ms() - older_than_ms
    with write_tx(core) as conn:
        n = conn.execute("DELETE FROM rpc_requests WHERE coalesce(taken_ms, sent_ms) < ?", (cut,)).rowcount
        n += conn.execute("DELETE FROM rpc_answers WHERE replied_ms < ?", (cut,)).rowcount
    return int(n)

