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

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from semq.config import Config, ConfigError, load_config
from semq.umxt_protocol import LK0, AppKey, Endpoint, NodeType, ResultCode, SaveFwd

from .core import NewDocument, NodeCore
from .engine import SendState
from .limits import MAX_DOCUMENT_SIZE, BadTarget, DocumentTooLarge, check_target
from .writebehind import InboxRow, MessageRow, columns

__all__ = ["MAX_DOCUMENT_SIZE", "BadTarget", "DocumentTooLarge", "InboxItem", "NodeClient", "OutboxRow"]

KNOWS_ROWS: Final = 10_000  # newest rows of an unindexed table NodeClient.knows reads

# The rows read here by name (semq.node.writebehind): the SELECT lists are
# made from the named rows' fields.
_INBOX_COLS: Final = columns(InboxRow)
# A failed row refused by its target (SS_FAILED with a signed refusal) says
# who refused it: the join's column is named ``refused_by`` in a derived
# table, so the outer SELECT list is still the row's fields.
_MESSAGES: Final = (
    f"SELECT {columns(MessageRow)} FROM (SELECT o.*, f.target_id AS refused_by FROM outbox o"
    f" LEFT JOIN refusals f ON f.record_id = o.id AND o.state = {int(SendState.SS_FAILED)}) ORDER BY id LIMIT ?")


@dataclass(frozen=True)
class InboxItem:
    id: int
    lk0: LK0
    app_key: AppKey
    save_fwd: int
    priority: int
    created_ms: int
    received_ms: int
    encrypted: bool
    app_data: bytes
    consumed_ms: int | None


@dataclass(frozen=True)
class OutboxRow:
    lk0: LK0
    target: str
    state: SendState
    app_key: AppKey
    save_fwd: int
    ack2: bool
    priority: int
    created_ms: int
    attempts: int
    inquiries: int
    code: int
    size: int
    # Why a failed row failed, in words: the result code's name, and for a
    # target's signed refusal, who refused it (verified when it came).
    note: str = ""


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


class NodeClient:
    def __init__(self, directory: str | Path, *, config: Config | None = None) -> None:
        self.config = config or load_config(Path(directory))
        if self.config.role != "node":
            raise ConfigError(f"{self.config.directory} holds a {self.config.role}, not a node")
        self.core = NodeCore(self.config.store_path, self.config.org, events_dir=self.config.events_dir,
                             synchronous=self.config.synchronous)

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.core.close()

    @property
    def org(self) -> str:
        return self.config.org

    def send(
        self, to: str, data: bytes, *, data_type: str = "", domain: str = "", subtype: str = "",
        key: str = "", save_fwd: int = 3, ack2: bool = True, priority: int = 0,
        expires_in: float | None = None, reliable: bool = True, encrypt: bool = True,
        clear_app_key: bool = False,
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
        accepted (``knows`` tells): the platform decides whether it exists."""
        return self.send_many([dict(to=to, data=data, data_type=data_type, domain=domain, subtype=subtype,
                                    key=key, save_fwd=save_fwd, ack2=ack2, priority=priority,
                                    expires_in=expires_in, reliable=reliable, encrypt=encrypt,
                                    clear_app_key=clear_app_key)])[0]

    def send_many(self, docs: list[dict[str, Any]]) -> list[LK0]:
        """Accept several documents in one transaction (much faster); the
        errors of ``send``, and then nothing of the call is accepted."""
        for to in {d["to"] for d in docs}:  # once per target, not per document
            check_target(to, self.config.org)
        now = int(time.time() * 1000)
        news = []
        for d in docs:
            exp = d.get("expires_in")
            reliable = d.get("reliable", True)
            news.append(NewDocument(
                target=d["to"], app_data=bytes(d["data"]),
                app_key=AppKey(domain=d.get("domain", ""), data_type=d.get("data_type", ""),
                               subtype=d.get("subtype", ""), key=d.get("key", "")),
                save_fwd=SaveFwd(d.get("save_fwd", 3) if reliable else 1),
                ack2=bool(d.get("ack2", True)) and reliable, reliable=reliable,
                priority=d.get("priority", 0),
                expires_ms=now + int(exp * 1000) if exp else None, created_ms=now,
                encrypt=self.config.security and bool(d.get("encrypt", True)),
                clear_app_key=bool(d.get("clear_app_key", False)),
            ))
        return self.core.accept(news)

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
        q = self.core.conn.execute
        if q("SELECT 1 FROM dedup WHERE origin_type=? AND origin_id=? LIMIT 1",
             (int(NodeType.ORGANIZATION), org)).fetchone():
            return True
        for table, id_col, col in (("outbox", "id", "target_id"), ("inbox", "id", "origin_id"),
                                   ("receipts", "record_id", "target_id")):
            if q(f"SELECT 1 FROM (SELECT {col} AS o FROM {table} ORDER BY {id_col} DESC LIMIT ?) WHERE o=? LIMIT 1",
                 (KNOWS_ROWS, org)).fetchone():
                return True
        return False

    def inbox(self, *, unread: bool = True, limit: int = 1000, after_id: int = 0) -> list[InboxItem]:
        q = (f"SELECT {_INBOX_COLS} FROM inbox WHERE id > ?" + (" AND consumed_ms IS NULL" if unread else "")
             + " ORDER BY id LIMIT ?")
        item = self._item
        return [item(r) for r in map(InboxRow._make, self.core.conn.execute(q, (after_id, limit)))]

    def get(self, item_id: int) -> InboxItem:
        r = self.core.conn.execute(f"SELECT {_INBOX_COLS} FROM inbox WHERE id=?", (item_id,)).fetchone()
        if r is None:
            raise KeyError(f"no inbox document {item_id}")
        return self._item(InboxRow._make(r))

    @staticmethod
    def _item(r: InboxRow) -> InboxItem:
        return InboxItem(
            id=r.id, lk0=LK0(endpoint=Endpoint(node_type=NodeType(r.origin_type), node_id=r.origin_id),
                             semq_id=r.semq_id, semq_db_id=r.semq_db_id, record_id=r.record_id),
            app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
            save_fwd=r.save_fwd, priority=r.priority, created_ms=r.created_ms, received_ms=r.received_ms,
            encrypted=bool(r.encrypt), app_data=r.app_data, consumed_ms=r.consumed_ms,
        )

    def acknowledge(self, ids: list[int]) -> int:
        """The application has processed these documents (kept a day, then purged)."""
        ts = int(time.time() * 1000)
        with self.core.db.atomic("IMMEDIATE"):
            cur = self.core.conn.executemany(
                "UPDATE inbox SET consumed_ms=? WHERE id=? AND consumed_ms IS NULL", [(ts, i) for i in ids])
        return int(cur.rowcount)

    def receive(self, *, timeout: float = 10.0, poll: float = 0.1) -> Iterator[InboxItem]:
        """Yield unread documents as they arrive, until ``timeout`` passes
        with nothing new."""
        last = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            items = self.inbox(after_id=last)
            for it in items:
                last = it.id
                yield it
            if items:
                deadline = time.monotonic() + timeout
            else:
                time.sleep(poll)

    def messages(self, *, limit: int = 1000) -> list[OutboxRow]:
        me = self.core.me
        return [OutboxRow(lk0=LK0(endpoint=me, record_id=r.id), target=r.target_id, state=SendState(r.state),
                          app_key=AppKey(domain=r.domain, data_type=r.data_type, subtype=r.subtype, key=r.key),
                          save_fwd=r.save_fwd, ack2=bool(r.ack2), priority=r.priority, created_ms=r.created_ms,
                          attempts=r.attempts, inquiries=r.inquiries, code=r.code, size=r.size,
                          note=_note(r.state, r.code, r.refused_by))
                for r in map(MessageRow._make, self.core.conn.execute(_MESSAGES, (limit,)))]

    def status(self) -> dict[str, Any]:
        return self.core.counts()

    def receipt(self, record_id: int) -> dict[str, Any]:
        """The signed delivery receipt of one of our documents, verified now
        against the receiver's certificate (security on). Raises KeyError."""
        row = self.core.receipt_proof(record_id)
        if row is None:
            raise KeyError(f"no receipt for record {record_id} (not confirmed yet, or sent without security)")
        from semq.crypto import CertificateDirectory, CryptoError, load_certificate, verify_receipt

        target, digest, receipt, received_ms = row
        out: dict[str, Any] = {"lk0": str(LK0(endpoint=self.core.me, record_id=record_id)), "receiver": target,
                               "digest": digest.hex(), "received_ms": received_ms, "size": len(receipt)}
        try:
            ca = load_certificate(self.config.directory / "ca.pem")
            directory = CertificateDirectory(ca, None)
            certs = self._receiver_certs(directory, target)
            info = verify_receipt(receipt, digest=digest, lk0=LK0(endpoint=self.core.me, record_id=record_id),
                                  receiver_certs=certs)
            out.update(verified=True, signer=info.org, signed_ms=info.time_ms, batch_size=info.batch_size,
                       certificate=info.signer.describe())
        except (CryptoError, OSError, ValueError) as e:
            out.update(verified=False, error=str(e))
        return out

    def _receiver_certs(self, directory: Any, org: str) -> list[Any]:
        """Certificates of ``org`` cached by the daemon (certs/ORG.pem)."""
        from semq.crypto import CryptoError, load_certificates

        p = self.config.directory / "certs" / f"{org}.pem"
        if p.exists():
            directory.add_many(load_certificates(p))
        try:
            return list(directory.lookup(org))
        except CryptoError:
            return []
