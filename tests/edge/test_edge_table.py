"""EDGE_TABLE over every (state, event) pair, and the edge store applying it
(a real node store): a confirmed document never moves again, a failed one
only by the operator's resend, a resend keeps the document's key (its
message id), backoff grows, the tries run out into a failure."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from semq.edge.protocol import EdgePartner, Inbound
from semq.edge.store import EdgeStore
from semq.node.core import NodeCore
from semq.node.engine import EDGE_TABLE, EdgeEvent, EdgeState, edge_step
from tests.edge.certs import make_keys

S, E = EdgeState, EdgeEvent


def test_every_pair_of_the_edge_table() -> None:
    for state, event in itertools.product(S, E):
        nxt = edge_step(state, event)
        assert nxt == EDGE_TABLE.get((state, event))
        if state is S.CONFIRMED:
            assert nxt is None  # the proof is kept: nothing moves a confirmed document
        if state is S.FAILED:
            assert nxt in (None, S.QUEUED) and (nxt is None) == (event is not E.RESEND)
        if event is E.CLAIMED:
            assert (nxt is not None) == (state is S.QUEUED)


def _core(tmp_path: Path) -> NodeCore:
    return NodeCore(tmp_path / "node.sqlite", "56001", create=True, synchronous="OFF", events_dir=tmp_path / "events")


def test_the_store_moves_documents_only_through_the_table(tmp_path: Path) -> None:
    core = _core(tmp_path)
    try:
        store = EdgeStore(core)
        store.add_partner(EdgePartner("ACME", "as2", "http://x/", make_keys("acme").cert_pem, "ME", {}), 1)
        doc = store.accept("as2:ACME", b"x", "text/plain", 1000)
        assert doc.state is S.QUEUED and doc.doc_key.startswith("56001-1000-")
        assert store.claim(999) == []  # due from its acceptance, not before
        got = store.claim(1000)
        assert [d.id for d in got] == [doc.id] and got[0].state is S.SENDING and got[0].tries == 1
        assert store.claim(1000) == []  # claimed once
        again = store.no_receipt(doc.id, "HTTP 503", 2000)
        assert again is not None and again.state is S.QUEUED and again.next_ms == 2000 + 5000
        assert again.doc_key == doc.doc_key
        for i in range(2, 13):
            (d,) = store.claim(10**12)
            assert d.tries == i
            moved = store.no_receipt(doc.id, "HTTP 503", 3000)
            assert moved is not None
        assert moved.state is S.FAILED and "no receipt after 12 tries" in (moved.reason or "")
        assert store.confirmed(doc.id, b"proof", 4000) is None  # a failed document is not confirmed
        resent = store.resend(doc.id, 5000)
        assert resent is not None and resent.state is S.QUEUED and resent.doc_key == doc.doc_key
        (d,) = store.claim(5000)
        done = store.confirmed(d.id, b"proof", 6000)
        assert done is not None and done.state is S.CONFIRMED and store.proof(d.id) == b"proof"
        assert store.refused(d.id, "late", b"p", 7000) is None  # confirmed stays confirmed
        assert store.restart(8000) == 0
    finally:
        core.close()


def test_a_message_is_delivered_once_and_its_receipt_kept(tmp_path: Path) -> None:
    core = _core(tmp_path)
    try:
        store = EdgeStore(core)
        got = Inbound("ACME", "<m1@acme>", b"doc", "text/plain", "a.txt", "x, sha-256")
        first = store.deliver("as2", got, (200, {"A": "1"}, b"mdn-1"), 1)
        second = store.deliver("as2", got, (200, {"A": "2"}, b"mdn-2"), 2)
        assert first == (True, (200, {"A": "1"}, b"mdn-1"))
        assert second == (False, (200, {"A": "1"}, b"mdn-1"))
        assert core.inbox.count() == 1
    finally:
        core.close()


async def test_a_resend_after_a_restart_posts_the_very_same_message(tmp_path: Path, monkeypatch: Any) -> None:
    """The first try's message is committed before it is posted; after a
    restart (a new sender, the adapter's memory gone) the document is posted
    as those very bytes, not built again: a partner that answers the
    duplicate with its first receipt (whose references are the first
    signature's) confirms it."""
    import secrets

    import httpx

    from semq.edge import protocol as edge_protocol
    from semq.edge.daemon.sender import EdgeSender
    from semq.edge.protocol import Outgoing, ReceiptResult

    class Fresh:  # an adapter that signs anew on each build, as AS4's does
        name = "as2"
        builds = 0

        def build(self, doc_id: str, content: bytes, content_type: str, partner: Any, ours: Any) -> Outgoing:
            Fresh.builds += 1
            return Outgoing(f"<{doc_id}@me>", {"X-Try": str(Fresh.builds)}, content + secrets.token_bytes(16), "d")

        def read_receipt(self, status: int, headers: Any, body: bytes, sent: Outgoing, partner: Any,
                         ours: Any) -> ReceiptResult:
            return ReceiptResult(body == sent.body, None if body == sent.body else "other message", b"")

    monkeypatch.setitem(edge_protocol.PROTOCOLS, "as2", Fresh())
    monkeypatch.setattr(edge_protocol, "load_protocols", lambda: edge_protocol.PROTOCOLS)
    import semq.edge.daemon.sender as sender_module
    monkeypatch.setattr(sender_module, "load_protocols", lambda: edge_protocol.PROTOCOLS)
    posted: list[Outgoing] = []

    def cut(partner: Any, out: Outgoing) -> tuple[int, dict[str, str], bytes]:
        posted.append(out)
        raise httpx.ReadTimeout("the receipt was lost")

    def first_receipt(partner: Any, out: Outgoing) -> tuple[int, dict[str, str], bytes]:
        posted.append(out)
        return 200, {}, posted[0].body  # the partner answers its duplicate as the first

    async def gate(f: Any, *args: Any) -> Any:
        return f(*args)

    core = _core(tmp_path)
    try:
        store = EdgeStore(core)
        store.add_partner(EdgePartner("ACME", "as2", "http://x/", make_keys("acme").cert_pem, "ME", {}), 1)
        doc = store.accept("as2:ACME", b"<invoice/>", "application/xml", 1000)
        (claimed,) = store.claim(10**12)
        await EdgeSender(store, gate, lambda: make_keys("me"), poster=cut)._send(claimed)
        assert store.get(doc.id).state is S.QUEUED  # type: ignore[union-attr]
        assert store.restart(10**12) == 0  # (it waits its backoff, not in flight)
        (again,) = store.claim(10**13)
        await EdgeSender(store, gate, lambda: make_keys("me"), poster=first_receipt)._send(again)
        assert Fresh.builds == 1 and len(posted) == 2
        assert posted[1].body == posted[0].body and posted[1].message_id == posted[0].message_id
        assert dict(posted[1].headers) == dict(posted[0].headers)
        done = store.get(doc.id)
        assert done is not None and done.state is S.CONFIRMED
        assert store.sent(doc.id) is None  # the kept bytes go once it is confirmed
    finally:
        core.close()
