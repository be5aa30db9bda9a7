"""The Python API for applications; the CLI uses it too.

    from semq.node.api import NodeClient
    with NodeClient("/srv/semq/acme") as node:
        lk0 = node.send("56001", b"<order/>", data_type="ORDER", key="S0001")
        for doc in node.inbox():
            handle(doc.app_data)
            node.acknowledge([doc.id])

``send`` works whether or not the node daemon runs: the document is durable
in the node's store when it returns, and goes out when the daemon runs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from semq.settings.config import ORG_ID_ALLOWED, Config, ConfigError, load_config
from semq.umxt_protocol import LK0, AppKey, Endpoint, NodeType, ResultCode, SaveFwd

from ..core import NewDocument, NodeCore
from ..engine import SendState
from ..envelope import EnvelopeError, check_channel, check_user, parse_address
from ..large.manifest import Manifest, copy_in, move_in
from ..limits import (
    MAX_DOCUMENT_SIZE,
    BadTarget,
    DocumentRefused,
    DocumentTooLarge,
    LargeDocumentTooLarge,
    check_target,
)
from ..origin.outbox import OutboxFilter
from ..users import (
    User,
    add_user,
    authenticate,
    list_users,
    remove_user,
    user_for_os_account,
    user_for_token,
)
from .following import Following
from .items import UNIT_IDS, Cursor, InboxItem, InboxRow, MessageRow, OutboxRow

_NEVER: Final = float("inf")

__all__ = ["KNOWS_ROWS", "MAX_DOCUMENT_SIZE", "UNIT_IDS", "BadTarget", "Cursor", "DocumentTooLarge", "InboxItem",
           "NodeClient", "OutboxRow"]

log = logging.getLogger("semq.node.api")

KNOWS_ROWS: Final = 10_000  # newest rows of an unindexed table NodeClient.knows reads
_FAILED: Final = int(SendState.SS_FAILED)


def _note(state: int, code: int, refused_by: str | None) -> str:
    if not code:
        return ""
    try:
        name = ResultCode(code).name
    except ValueError:
        name = str(code)
    if refused_by:
        return f"refused by {refused_by} (signed): {name}"
    return name if state == SendState.SS_FAILED else f"last: {name}"


class NodeClient(Following):
    """The node's documents, for applications. A node of several units
    (semq.umxt_protocol.units) is one node here: sends are spread over its units' stores
    (one call's documents stay together, in one transaction), and the inbox,
    the messages and the counts are those of every unit. The other features
    (transactions, queues, requests) work on ``core``, unit 1's store."""

    def __init__(self, directory: str | Path, *, config: Config | None = None) -> None:
        self.config = config or load_config(Path(directory))
        if self.config.role != "node":
            raise ConfigError(f"{self.config.directory} holds a {self.config.role}, not a node")
        cfg = self.config
        self.cores: list[NodeCore] = []
        try:
            for k in range(1, cfg.units + 1):
                self.cores.append(NodeCore(cfg.for_unit(k).store_path, cfg.org, events_dir=cfg.events_dir,
                                           synchronous=cfg.synchronous, unit=k))
        except BaseException:
            self.close()
            raise
        self.core = self.cores[0]
        # Which unit takes the next send: from a different one in each process.
        self._turn = (time.monotonic_ns() // 1000) % len(self.cores)

    @property
    def units(self) -> int:
        return len(self.cores)

    def _unit_core(self, item_id: int) -> tuple[NodeCore, int]:
        """The store and row of an inbox id (see UNIT_IDS)."""
        if len(self.cores) == 1:
            return self.core, item_id
        unit, row = item_id % UNIT_IDS, item_id // UNIT_IDS
        if not 1 <= unit <= len(self.cores) or row < 1:
            raise KeyError(f"no inbox document {item_id}")
        return self.cores[unit - 1], row

    def _item_id(self, unit: int, row: int) -> int:
        return row if len(self.cores) == 1 else row * UNIT_IDS + unit

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for core in self.cores:
            core.close()

    @property
    def org(self) -> str:
        return self.config.org

    def send(
        self, to: str, data: bytes, *, data_type: str = "", domain: str = "", subtype: str = "",
        key: str = "", save_fwd: int = 3, ack2: bool = True, priority: int = 0,
        expires_in: float | None = None, reliable: bool = True, encrypt: bool = True,
        clear_app_key: bool = False, ordered: str | None = None, user: str | None = None,
    ) -> LK0:
        """Accept one document; durable when this returns. With security on
        (the default) it is signed and sealed for the target when it is sent,
        its AppKey sealed inside it (the relay routes without it;
        ``clear_app_key=True`` leaves it readable in the header);
        ``encrypt=False`` sends it signed but **not end-to-end private**.
        Raises DocumentTooLarge (a document over ``MAX_DOCUMENT_SIZE``, which
        no frame can carry), BadTarget (``to`` is not an organization id, or
        is this node), both LocalProtocolError like any other invalid field;
        StoreError for the store. A target the node has not heard of is
        accepted (``knows`` tells): the platform decides whether it exists.

        ``to`` is an organization (``56001``), a user of one (``56001/alice``)
        or a user of this node (``alice``: the document never leaves the
        node, but is a record like any other). ``user``: the user of this
        node it is from. ``ordered``: its channel — the documents of one
        (origin, target, channel) reach the target's application in the
        order they were accepted here (semq.node.envelope)."""
        return self.send_many([dict(to=to, data=data, data_type=data_type, domain=domain, subtype=subtype,
                                    key=key, save_fwd=save_fwd, ack2=ack2, priority=priority,
                                    expires_in=expires_in, reliable=reliable, encrypt=encrypt,
                                    clear_app_key=clear_app_key, ordered=ordered, user=user)])[0]

    def check_file(self, to: str, size: int, **options: Any) -> None:
        """Refuse now what ``send_file`` would refuse of a file of ``size``
        bytes for ``to`` with ``options`` (before anything is copied or
        uploaded): LargeDocumentTooLarge over ``max_document_mib``,
        BadTarget for what a large document cannot be (for a colleague, in
        an ordered channel, best effort, over direct links only)."""
        cfg = self.config
        limit = cfg.max_document_mib << 20
        if size > limit:
            raise LargeDocumentTooLarge(size, limit)
        if size <= cfg.large_from_mib << 20:
            return
        org, _ = self._address(to)
        if org == cfg.org:
            raise BadTarget(f"--to {to}: a large document ({size} bytes) cannot go to a user of this node"
                            f" (at most {cfg.large_from_mib} MiB)", ResultCode.INVALID_FIELD)
        if options.get("ordered"):
            raise BadTarget(f"a large document ({size} bytes) cannot be in an ordered channel"
                            f" (at most {cfg.large_from_mib} MiB)", ResultCode.INVALID_FIELD)
        if not options.get("reliable", True):
            raise BadTarget(f"a large document ({size} bytes) cannot be sent best effort",
                            ResultCode.INVALID_FIELD)
        if cfg.direct == "only":
            raise BadTarget(f"a large document ({size} bytes) goes through the platform, and this node"
                            ' sends over direct links only (direct = "only"); at most'
                            f" {cfg.large_from_mib} MiB go over a direct link", ResultCode.INVALID_FIELD)

    def send_file(self, to: str, path: str | Path, *, progress: Callable[[int], None] | None = None,
                  unit: int | None = None, move: bool = False, sha256: bytes | None = None,
                  **options: Any) -> LK0:
        """Accept the content of the file ``path``; durable when this
        returns. The options are ``send``'s. A file up to ``large_from_mib``
        is sent as one document; a larger one, up to ``max_document_mib``,
        as a **large document** (semq.node.large): copied into the data
        directory first (``progress(n)`` after each block), then sent in
        chunks, never read whole into memory. Raises LargeDocumentTooLarge
        for a file over the limit (nothing stored), OSError for one that
        cannot be read, and ``send``'s errors.

        ``move``: the caller gives the file up (a user's upload the node
        staged in its data directory, with its ``sha256``): a large one is
        renamed in rather than copied (copied when it is on another file
        system); the file is gone once this returns, and on an error
        after it was taken."""
        cfg = self.config
        src = Path(path)
        st = os.stat(src)
        if not stat.S_ISREG(st.st_mode):
            raise BadTarget(f"{src} is not a regular file", ResultCode.INVALID_FIELD)
        self.check_file(to, st.st_size, **options)
        if st.st_size <= cfg.large_from_mib << 20:
            data = src.read_bytes()
            if progress is not None:
                progress(len(data))
            lk0 = self.send(to, data, **options)
            if move:
                src.unlink(missing_ok=True)
            return lk0
        if unit is None:
            unit = self._turn % len(self.cores) + 1
            self._turn += 1
        base = self.cores[unit - 1].path.parent
        limit = cfg.max_document_mib << 20
        if move and sha256 is not None:
            try:
                copy, size, sha = move_in(src, base / "large" / "out"), st.st_size, sha256
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                copy, size, sha = copy_in(src, base / "large" / "out", progress)
                src.unlink(missing_ok=True)
        else:
            copy, size, sha = copy_in(src, base / "large" / "out", progress)
            if move:
                src.unlink(missing_ok=True)
        try:
            if size > limit:  # (it grew while it was copied)
                raise LargeDocumentTooLarge(size, limit)
            m = Manifest.new(size, sha, encrypt=cfg.security and bool(options.get("encrypt", True)))
            return self.send_many([{**options, "to": to, "data": m.encode(),
                                    "large_path": str(copy.relative_to(base))}], unit=unit)[0]
        except BaseException:
            copy.unlink(missing_ok=True)
            raise

    def send_many(self, docs: list[dict[str, Any]], *, unit: int | None = None,
                  also: Callable[[NodeCore, list[LK0]], None] | None = None) -> list[LK0]:
        """Accept several documents in one transaction (much faster); the
        errors of ``send``, and then nothing of the call is accepted. A node
        of several units takes them into its next unit in turn (``unit``:
        into that one).

        ``also(core, lk0s)`` is called inside that transaction, with the
        store's NodeCore that took the documents and their LK0s: what it writes commits
        with the documents or not at all (``semq watch`` records which file
        each document came from: semq.node.features.folders). Without it the
        documents are accepted exactly as before."""
        me = self.config.org
        addresses: dict[str, tuple[str, str]] = {}
        for to in {d["to"] for d in docs}:  # once per target, not per document
            addresses[to] = self._address(to)
        now = int(time.time() * 1000)
        news = []
        ordered = False
        for d in docs:
            exp = d.get("expires_in")
            reliable = d.get("reliable", True)
            org, to_user = addresses[d["to"]]
            channel = d.get("ordered") or ""
            from_user = d.get("user") or ""
            if exp is not None and not 0 <= exp < _NEVER:  # (0: no expiry, as None)
                raise DocumentRefused(f"expires_in {exp!r} is not a positive number of seconds: the document"
                                      " could only expire", ResultCode.INVALID_FIELD)
            try:
                if channel:
                    check_channel(channel)
                    ordered = True
                    if not reliable:
                        raise BadTarget(f"ordered channel {channel}: a best-effort document cannot be ordered"
                                        " (it may be dropped without a trace)", ResultCode.INVALID_FIELD)
                if from_user:
                    check_user(from_user)
            except EnvelopeError as e:
                raise BadTarget(str(e), ResultCode.INVALID_FIELD) from None
            news.append(NewDocument(
                target=org, app_data=bytes(d["data"]),
                app_key=AppKey(domain=d.get("domain", ""), data_type=d.get("data_type", ""),
                               subtype=d.get("subtype", ""), key=d.get("key", "")),
                save_fwd=SaveFwd(d.get("save_fwd", 3) if reliable else 1),
                # An ordered document always asks for its receipt: the
                # origin must know whether it arrived or the channel waits.
                ack2=(bool(d.get("ack2", True)) or bool(channel)) and reliable, reliable=reliable,
                priority=d.get("priority", 0),
                expires_ms=now + int(exp * 1000) if exp else None, created_ms=now,
                encrypt=self.config.security and bool(d.get("encrypt", True)),
                clear_app_key=bool(d.get("clear_app_key", False)),
                from_user=from_user, to_user=to_user, channel=channel,
                large_path=d.get("large_path", ""),
            ))
        if from_users := {n.from_user for n in news if n.from_user} - self._user_names():
            raise BadTarget(f"{sorted(from_users)[0]} is not a user of {me} (semq user add)",
                            ResultCode.INVALID_FIELD)
        if ordered:
            # A channel's documents are numbered in one store: unit 1's.
            core = self.core
        elif unit is not None:
            core = self.cores[unit - 1]
        else:
            core = self.cores[self._turn % len(self.cores)]
            self._turn += 1
        if also is None:
            return core.accept(news)
        with core.transaction():  # accept() joins it as a savepoint
            lk0s = core.accept(news)
            also(core, lk0s)
        return lk0s

    def send_edge(self, to: str, data: bytes, *, content_type: str = "application/octet-stream") -> str:
        """Accept a document for an AS2 or AS4 partner (``to``: ``as2:ID``,
        ``as4:ID``, added with ``semq partner add``); durable when this
        returns. The node's edge sender sends it and resends it with the
        same message id until the partner's signed receipt verifies and
        names its digest (docs/interop.md). Returns its key (``semq track
        KEY``). BadTarget: not a partner here, a content type not
        TYPE/SUBTYPE, or over ``EDGE_MAX_DOCUMENT``."""
        from semq.edge.store import EDGE_MAX_DOCUMENT, EdgeError, EdgeStore

        if len(data) > EDGE_MAX_DOCUMENT:
            raise BadTarget(f"{len(data)} bytes for {to}: over the edge's {EDGE_MAX_DOCUMENT >> 20} MiB per document",
                            ResultCode.INVALID_FIELD)
        try:
            return EdgeStore(self.core).accept(to, bytes(data), content_type, int(time.time() * 1000)).doc_key
        except EdgeError as e:
            raise BadTarget(str(e), ResultCode.INVALID_FIELD) from None

    def _user_names(self) -> set[str]:
        return set(self.core.users.names())

    def _address(self, to: str) -> tuple[str, str]:
        """(organization, user) of a ``to`` address, checked (BadTarget)."""
        me = self.config.org
        try:
            org, user = parse_address(to, me)
        except EnvelopeError as e:
            raise BadTarget(f"--to {to!r}: {e}", ResultCode.INVALID_FIELD) from None
        if org == me and user:
            if user not in self._user_names():
                if "/" in to:
                    raise BadTarget(f"{user} is not a user of {me} (semq user add {user})", ResultCode.INVALID_FIELD)
                raise BadTarget(f"target {json.dumps(to)} is not an organization id nor a user of this node;"
                                f" allowed: {ORG_ID_ALLOWED}, ORG/USER, or a user of this node",
                                ResultCode.INVALID_FIELD)
            return org, user
        check_target(org, me)
        return org, user

    def users(self) -> list[User]:
        """This node's users (semq.node.users)."""
        return list_users(self.core.users)

    def add_user(self, name: str, *, os_user: str = "") -> str:
        """Add a user; returns its token (shown once: only its digest is kept)."""
        return add_user([c.users for c in self.cores], name, os_user=os_user)

    def remove_user(self, name: str) -> None:
        remove_user([c.users for c in self.cores], name)

    def authenticate(self, name: str, token: str) -> str:
        """``name`` if ``token`` is its token; UserError otherwise (semq.node.users)."""
        return authenticate(self.core.users, name, token)

    def user_for_token(self, token: str) -> str:
        """The user whose token ``token`` is; UserError otherwise (semq.node.users)."""
        return user_for_token(self.core.users, token)

    def user_for_os_account(self, account: str) -> str | None:
        """The user tied to that operating-system account, if any (semq.node.users)."""
        return user_for_os_account(self.core.users, account)

    def knows(self, org: str) -> bool:
        """Whether this node has heard of organization ``org``: it holds its
        certificate (``certs/``), or has documents from it (dedup: the last
        30 days; the inbox) or for it (pending-send rows, delivery receipts).
        The tables without an index on the organization are read from their
        newest ``KNOWS_ROWS`` rows only, so this stays cheap on a big store.
        A node that does not know an organization cannot tell whether it
        exists: the platform decides (``semq send`` warns)."""
        if (self.config.directory / "certs" / f"{org}.pem").exists():
            return True
        org_type = int(NodeType.ORGANIZATION)
        for core in self.cores:
            if (core.inbox.knows(org_type, org, KNOWS_ROWS) or core.outbox.recently_for(org, KNOWS_ROWS)
                    or core.receipts.recently_for(org, KNOWS_ROWS)):
                return True
        return False

    def inbox(self, *, unread: bool = True, limit: int = 1000, after_id: int = 0,
              user: str | None = None) -> list[InboxItem]:
        """The inbox in id order (every unit's, for a node of several),
        documents with an id above ``after_id``, at most ``limit``;
        ``user``: only those for that user of this node."""
        item = self._item
        if len(self.cores) == 1:
            return [item(r) for r in self.core.inbox.rows(InboxRow, after_id=after_id, unread=unread, user=user,
                                                          limit=limit)]
        items = [item(r, k) for k, core in enumerate(self.cores, 1)
                 for r in core.inbox.rows(InboxRow, after_id=(after_id - k) // UNIT_IDS, unread=unread, user=user,
                                          limit=limit)]
        items.sort(key=lambda it: it.id)
        return items[:limit]

    def inbox_count(self, *, unread: bool = True, user: str | None = None) -> int:
        """How many documents ``inbox`` would list without a limit (every unit's)."""
        return sum(core.inbox.count(unread=unread, user=user) for core in self.cores)

    def get(self, item_id: int, *, user: str | None = None) -> InboxItem:
        """One inbox document; ``user``: only if it is that user's (KeyError
        with the same words as for a missing one otherwise)."""
        core, row = self._unit_core(item_id)
        r = core.inbox.get(InboxRow, row)
        if r is None or (user is not None and r.to_user != user):
            raise KeyError(f"no inbox document {item_id}")
        return self._item(r, core.unit)

    def find(self, lk0: LK0, *, user: str | None = None) -> InboxItem:
        """The inbox document named by its LK0 (every unit's inbox);
        KeyError like ``get`` when there is none (or it is another user's)."""
        for core in self.cores:
            r = core.inbox.find(InboxRow, lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
            if r is not None and (user is None or r.to_user == user):
                return self._item(r, core.unit)
        raise KeyError(f"no inbox document {lk0}")

    def _item(self, r: InboxRow, unit: int = 1) -> InboxItem:
        return InboxItem(
            id=self._item_id(unit, r.id),
            lk0=LK0(endpoint=Endpoint(node_type=NodeType(r.origin_type), node_id=r.origin_id),
                    semq_id=r.semq_id, semq_db_id=r.semq_db_id, record_id=r.record_id),
            app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
            save_fwd=r.save_fwd, priority=r.priority, created_ms=r.created_ms, received_ms=r.received_ms,
            encrypted=bool(r.encrypt), app_data=r.app_data, consumed_ms=r.consumed_ms, unit=unit,
            from_user=r.from_user, to_user=r.to_user, channel=r.channel,
            path=None if r.path is None else self.cores[unit - 1].path.parent / r.path, large_size=r.large_size or 0,
        )

    def acknowledge(self, ids: list[int], *, user: str | None = None) -> int:
        """The application has processed these documents (kept a day, then
        purged); ``user``: only that user's documents are acknowledged."""
        ts = int(time.time() * 1000)
        by_core: dict[int, list[int]] = {}
        for i in ids:
            try:
                core, row = self._unit_core(i)
            except KeyError:
                continue
            by_core.setdefault(core.unit, []).append(row)
        done = 0
        for unit, rows in by_core.items():
            done += self.cores[unit - 1].acknowledge(rows, ts, user)
        return done

    def receive(self, *, timeout: float = 10.0, poll: float = 0.1, user: str | None = None) -> Iterator[InboxItem]:
        """Yield unread documents as they arrive, until ``timeout`` passes
        with nothing new; ``user``: only those for that user of this node."""
        last = [0] * len(self.cores)  # per unit: the last row yielded
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = False
            for k, core in enumerate(self.cores, 1):
                for r in core.inbox.rows(InboxRow, after_id=last[k - 1], user=user, limit=1000):
                    last[k - 1] = r.id
                    got = True
                    yield self._item(r, k)
            if got:
                deadline = time.monotonic() + timeout
            else:
                time.sleep(poll)

    def messages(self, *, limit: int = 1000, user: str | None = None) -> list[OutboxRow]:
        """The documents this node sent and has not cleaned up (every
        unit's); ``user``: only those that user sent."""
        me = self.core.me
        rows = []
        for core in self.cores:
            found = core.outbox.rows(MessageRow, OutboxFilter(from_user=user) if user else OutboxFilter(), limit=limit)
            refused = core.receipts.refusers([r.id for r in found if r.state == _FAILED])
            sizes = core.large_out.sizes([r.id for r in found if r.large])
            rows += [OutboxRow(lk0=LK0(endpoint=me, semq_id=core.unit, record_id=r.id), target=r.target_id,
                               state=SendState(r.state),
                               app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
                               save_fwd=r.save_fwd, ack2=bool(r.ack2), priority=r.priority, created_ms=r.created_ms,
                               attempts=r.attempts, inquiries=r.inquiries, code=r.code,
                               size=sizes.get(r.id, 0) if r.large else r.size,
                               note=_note(r.state, r.code, refused.get(r.id)), from_user=r.from_user,
                               to_user=r.to_user, channel=r.channel)
                     for r in found]
        if len(self.cores) > 1:
            rows.sort(key=lambda o: (o.created_ms, o.lk0.record_id))
        return rows[:limit]

    def status(self) -> dict[str, Any]:
        """The store's counts; for a node of several units, their sums and
        each unit's under ``units``."""
        if len(self.cores) == 1:
            return self.core.counts()
        per = [core.counts() for core in self.cores]
        total: dict[str, Any] = {}
        for c in per:
            for key, v in c.items():
                if key.endswith("_ms"):  # a time: the earliest
                    if v is not None:
                        total[key] = v if total.get(key) is None else min(total[key], v)
                    else:
                        total.setdefault(key, None)
                elif isinstance(v, int | float) and not isinstance(v, bool):
                    total[key] = total.get(key, 0) + v
                elif isinstance(v, dict):
                    d = total.setdefault(key, {})
                    for k2, v2 in v.items():
                        if isinstance(v2, int | float) and not isinstance(v2, bool):
                            d[k2] = d.get(k2, 0) + v2
        total["channels_waiting"] = [w for c in per for w in c.get("channels_waiting", [])]
        total["units"] = per
        return total

    def _record_core(self, record_id: int, unit: int | None) -> NodeCore:
        if unit is not None:
            if not 1 <= unit <= len(self.cores):
                raise KeyError(f"unit {unit} is not one of this node's units 1..{len(self.cores)}")
            return self.cores[unit - 1]
        for core in self.cores:
            if core.receipt_proof(record_id) is not None:
                return core
        return self.core

    def receipt(self, record_id: int, unit: int | None = None) -> dict[str, Any]:
        """The signed delivery receipt of one of our documents (``unit``: the
        unit that sent it, its LK0's semq_id; found when not given), verified
        now against the receiver's certificate (security on). Raises KeyError."""
        core = self._record_core(record_id, unit)
        row = core.receipt_proof(record_id)
        if row is None:
            raise KeyError(f"no receipt for record {record_id} (not confirmed yet, or sent without security)")
        from semq.identity.crypto import (
            CertificateDirectory,
            CryptoError,
            load_certificate,
            verify_receipt,
        )

        target, digest, receipt, received_ms = row
        lk0 = core.ctx.lk0(record_id)
        out: dict[str, Any] = {"lk0": str(lk0), "receiver": target,
                               "digest": digest.hex(), "received_ms": received_ms, "size": len(receipt)}
        try:
            ca = load_certificate(self.config.directory / "ca.pem")
            directory = CertificateDirectory(ca, None)
            certs = self._receiver_certs(directory, target)
            info = verify_receipt(receipt, digest=digest, lk0=lk0,
                                  receiver_certs=certs)
            out.update(verified=True, signer=info.org, signed_ms=info.time_ms, batch_size=info.batch_size,
                       certificate=info.signer.describe())
        except (CryptoError, OSError, ValueError) as e:
            out.update(verified=False, error=str(e))
        return out

    def _receiver_certs(self, directory: Any, org: str) -> list[Any]:
        """Certificates of ``org`` cached by the daemon (certs/ORG.pem); this
        node's own (node.pem) for a document to one of its users."""
        from semq.identity.crypto import CryptoError, load_certificates

        p = self.config.directory / ("node.pem" if org == self.config.org else f"certs/{org}.pem")
        if p.exists():
            directory.add_many(load_certificates(p))
        try:
            return list(directory.lookup(org))
        except CryptoError:
            return []
