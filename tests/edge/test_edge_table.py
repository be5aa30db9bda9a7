"""EDGE_TABLE over every (state, event) pair, and the edge store applying it
(a real node store): a confirmed document never moves again, a failed one
only by the operator's resend, a resend keeps the document's key (its
message id), backoff grows, the tries run out into a failure."""

from __future__ import annotations

import itertools
from pathlib import Path

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
