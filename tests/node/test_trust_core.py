"""The trust rules on the sans-IO cores (semq.node.core) and the library
(semq.identity.crypto): receipts prove the inbox, refusals are signed, the relay and
third organizations settle nothing, the AppKey travels sealed, documents
outside the dedup window are refused. The same rules with real processes
and a dishonest relay: tests/e2e/test_trust_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from semq.identity.crypto import (
    BadSignature,
    UnknownCertificate,
    enclose_app_key,
    make_refusal,
    split_app_key,
    verify_refusal,
)
from semq.node.core import DEDUP_RETENTION_MS, NewDocument, NodeCore, Output
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Endpoint,
    Frame,
    Inquiry,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    ResultCode,
    encode_frame,
)
from tests.conftest import NodeClock
from tests.e2e.test_security_e2e import _pki, _raw, _relayed

A, B, C = "10008", "56001", "77003"
KEY = AppKey(domain="trade", data_type="INVOICE", subtype="COMMERCIAL", key="INV-0042")


@pytest.fixture
def cores(tmp_path: Path):  # type: ignore[no-untyped-def]
    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _frames(out: Output) -> list[Frame]:
    return [r.frame() for r in _relayed(out.data)]


def _outbox(core: NodeCore) -> list[tuple[int, int]]:
    core.write_deferred_now()
    return core.conn.execute("SELECT state, code FROM outbox ORDER BY id").fetchall()


# ---------------------------------------------------------------- library


def test_a_refusal_verifies_only_for_its_document_code_and_signer(tmp_path: Path) -> None:
    sa, sb = _pki(tmp_path)
    lk0 = LK0(endpoint=Endpoint.org(A), record_id=42)
    proof = make_refusal(lk0, ResultCode.EXPIRED, sb.identity.keys.signing_key)
    info = verify_refusal(proof, lk0=lk0, code=ResultCode.EXPIRED, receiver_certs=sb.certs(B))
    assert (info.org, info.lk0, info.code) == (B, lk0, ResultCode.EXPIRED)
    with pytest.raises(BadSignature, match="with code 303, not"):
        verify_refusal(proof, lk0=lk0, code=ResultCode.DECRYPT_FAILED, receiver_certs=sb.certs(B))
    with pytest.raises(BadSignature):
        verify_refusal(proof, lk0=LK0(endpoint=Endpoint.org(A), record_id=43), code=ResultCode.EXPIRED,
                       receiver_certs=sb.certs(B))
    with pytest.raises(UnknownCertificate):  # signed by A, claimed to be B's
        verify_refusal(make_refusal(lk0, ResultCode.EXPIRED, sa.identity.keys.signing_key), lk0=lk0,
                       code=ResultCode.EXPIRED, receiver_certs=sb.certs(B))
    for bad in (b"", b"SQF1" + bytes(90), proof[:-1], proof[:30] + bytes([proof[30] ^ 1]) + proof[31:]):
        with pytest.raises(BadSignature):
            verify_refusal(bad, lk0=lk0, code=ResultCode.EXPIRED, receiver_certs=sb.certs(B))


@pytest.mark.parametrize("key", [AppKey(), KEY, AppKey(domain="dömain", key="ключ" * 20, subtype="x" * 255)])
def test_a_sealed_app_key_comes_back_whole(key: AppKey) -> None:
    body = enclose_app_key(key.domain, key.data_type, key.subtype, key.key, b"<doc/>")
    assert split_app_key(body) == (key, b"<doc/>")


@pytest.mark.parametrize("body", [b"", b"\x05ab", b"\x00\x00\x00\xff", b"\x01\xff\x00\x00\x00"])
def test_a_malformed_sealed_app_key_is_a_bad_signature(body: bytes) -> None:
    with pytest.raises(BadSignature, match="sealed AppKey"):
        split_app_key(body)


# ---------------------------------------------------------------- cores


def test_the_app_key_travels_inside_unless_asked_for_in_clear(cores: tuple[NodeCore, NodeCore]) -> None:
    a, b = cores
    a.accept([NewDocument(target=B, app_data=b"private key", app_key=KEY, encrypt=True),
              NewDocument(target=B, app_data=b"clear key", app_key=KEY, encrypt=True, clear_app_key=True),
              NewDocument(target=B, app_data=b"not sealed", app_key=KEY, encrypt=False)])
    data = _relayed(a.claim(10).data)
    headers = [r.frame().body for r in data]
    assert [(d.app_key, d.key_sealed, d.encrypt) for d in headers] == [
        (AppKey(), True, True), (KEY, False, True), (KEY, False, False)]
    assert all(KEY.key.encode() not in r.raw for r in data[:1])
    b.handle(data)
    rows = b.conn.execute("SELECT domain, data_type, subtype, key, app_data FROM inbox ORDER BY id").fetchall()
    assert rows == [(*(KEY.domain, KEY.data_type, KEY.subtype, KEY.key), body)
                    for body in (b"private key", b"clear key", b"not sealed")]


def test_an_expired_document_gets_a_signed_refusal_and_no_receipt(cores: tuple[NodeCore, NodeCore],
                                                                   node_clock: NodeClock) -> None:
    a, b = cores
    a.accept([NewDocument(target=B, app_data=b"late", encrypt=True, expires_ms=node_clock.t + 1000)])
    data = _relayed(a.claim(10).data)
    node_clock.t += 2000  # the relay held it past its expiry
    out = b.handle(data)
    assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (0,)
    assert b.conn.execute("SELECT count(*) FROM dedup").fetchone() == (0,)  # a later copy in time is delivered
    [nack] = [f for f in _frames(out)]
    assert isinstance(nack.body, Nack) and nack.body.code is ResultCode.EXPIRED and nack.body.proof
    a.handle(_relayed(out.data))
    assert _outbox(a) == [(9, int(ResultCode.EXPIRED))]
    assert a.conn.execute("SELECT target_id, code FROM refusals").fetchall() == [(B, int(ResultCode.EXPIRED))]
    assert a.receipt_proof(1) is None


def test_a_stored_copy_refused_is_settled_at_the_platform(cores: tuple[NodeCore, NodeCore],
                                                          node_clock: NodeClock) -> None:
    from semq.umxt_protocol import LK1, FrameDecoder, relay_bytes

    a, b = cores
    a.accept([NewDocument(target=B, app_data=b"stored", encrypt=True, expires_ms=node_clock.t + 1000)])
    dec = FrameDecoder()
    dec.receive_data(b"".join(a.claim(10).data))
    stored = FrameDecoder()
    stored.receive_data(b"".join(relay_bytes(r, Endpoint.platform(), LK1(record_id=77)) for r in dec))
    node_clock.t += 2000
    frames = _frames(b.handle(list(stored)))
    acks = [f.body for f in frames if isinstance(f.body, AckBatch) and f.body.ack_kind is Kind.ACK]
    assert [e.dest_ref_id for batch in acks for e in batch.entries] == [77]  # the platform may drop its copy
    assert [type(f.body) for f in frames].count(Nack) == 1


@pytest.mark.parametrize("age_ms", [DEDUP_RETENTION_MS + 1, DEDUP_RETENTION_MS - 60_000, -3_600_000])
def test_a_document_created_outside_the_dedup_window_is_stale(cores: tuple[NodeCore, NodeCore],
                                                              node_clock: NodeClock, age_ms: int) -> None:
    """Older than the retention minus the allowed clock skew (10 minutes by
    default), or further ahead than the skew: a replay could not be told
    from a new document."""
    a, b = cores
    node_clock.t = 100 * DEDUP_RETENTION_MS
    a.accept([NewDocument(target=B, app_data=b"old", encrypt=True, created_ms=node_clock.t - age_ms)])
    out = b.handle(_relayed(a.claim(10).data))
    [nack] = _frames(out)
    assert isinstance(nack.body, Nack) and nack.body.code is ResultCode.STALE
    assert b.conn.execute("SELECT count(*) FROM dedup").fetchone() == (0,)


def test_within_the_window_and_skew_a_document_is_delivered(cores: tuple[NodeCore, NodeCore],
                                                            node_clock: NodeClock) -> None:
    a, b = cores
    node_clock.t = 100 * DEDUP_RETENTION_MS
    a.accept([NewDocument(target=B, app_data=b"old but in time", encrypt=True,
                          created_ms=node_clock.t - DEDUP_RETENTION_MS + 11 * 60_000),
              NewDocument(target=B, app_data=b"a clock 5 minutes fast", encrypt=True,
                          created_ms=node_clock.t + 5 * 60_000)])
    assert b.handle(_relayed(a.claim(10).data)).delivered == 2


def test_only_the_origin_confirms_a_pending_ack_and_only_the_platform_its_hop(
        cores: tuple[NodeCore, NodeCore], node_clock: NodeClock) -> None:
    a, b = cores
    a.accept([NewDocument(target=B, app_data=b"x", encrypt=True)])
    b.handle(_relayed(a.claim(10).data))
    b.write_deferred_now()
    [(rid, p_ack, s_ack)] = b.conn.execute("SELECT id, p_ack, s_ack FROM inbound").fetchall()
    assert (p_ack, s_ack) == (1, 0)

    def reack2(sender: str, kind: Kind = Kind.REACK2) -> list:  # type: ignore[type-arg]
        flag = AckFlag.DELIVERY if kind is Kind.REACK2 else AckFlag.PLATFORM
        return _raw(Frame(kind=Kind.ACK_BATCH, source=Endpoint.platform(), origin=Endpoint.org(sender),
                          target=Endpoint.org(B), body=AckBatch(ack_kind=kind, entries=(
                              AckEntry(1, 1, 0, 1, 1, rid, int(flag), 0),))))

    b.handle(reack2(C))  # a third organization
    b.handle(reack2(A, Kind.REACK))  # the origin speaking for the platform
    b.write_deferred_now()
    assert b.conn.execute("SELECT p_ack, s_ack FROM inbound").fetchall() == [(1, 0)]
    b.handle(reack2(A))  # the origin
    assert b.pending_ack_count() == 0


def test_with_security_only_a_receipt_confirms(cores: tuple[NodeCore, NodeCore]) -> None:
    """The target's STATE inquiry and its unsigned "received" settle nothing;
    its answer to the origin's inquiry comes with an ACK2 and a receipt made
    from the digest kept with its dedup row, which does; a third
    organization's question gets NO_RECORD and no receipt."""
    a, b = cores
    [lk0] = a.accept([NewDocument(target=B, app_data=b"x", encrypt=True)])
    b.handle(_relayed(a.claim(10).data))  # its ACK2 is lost
    state = Frame(kind=Kind.INQUIRY, source=Endpoint.platform(), origin=Endpoint.org(B), target=Endpoint.org(A),
                  body=Inquiry(topic=InquiryTopic.STATE, items=(lk0,)))
    [resp] = _frames(a.handle(_raw(state)))
    assert isinstance(resp.body, InquiryResp) and resp.body.answers[0].result is InquiryResult.MARKED_ACKED
    said = Frame(kind=Kind.INQUIRY_RESP, source=Endpoint.platform(), origin=Endpoint.org(B), target=Endpoint.org(A),
                 body=InquiryResp(topic=InquiryTopic.RECEIVED, answers=((lk0, InquiryResult.RECEIVED),)))
    a.handle(_raw(said))
    assert [s for s, _ in _outbox(a)] == [1]  # still SS_SENT

    def ask(who: str) -> list[Frame]:
        q = Frame(kind=Kind.INQUIRY, source=Endpoint.platform(), origin=Endpoint.org(who), target=Endpoint.org(B),
                  body=Inquiry(topic=InquiryTopic.RECEIVED, items=(lk0,)))
        return _frames(b.handle(_raw(q)))

    stranger = ask(C)
    assert [type(f.body) for f in stranger] == [InquiryResp]
    assert stranger[0].body.answers[0].result is InquiryResult.NO_RECORD  # type: ignore[union-attr]
    answer = ask(A)
    kinds = sorted(type(f.body).__name__ for f in answer)
    assert kinds == ["AckBatch", "InquiryResp"]
    out = a.handle(_relayed([encode_frame(f) for f in answer]))
    assert out.bad_receipts == 0
    assert _outbox(a) == []  # confirmed by the receipt, cleaned
    assert a.receipt_proof(lk0.record_id) is not None


def test_without_security_the_targets_word_still_settles(tmp_path: Path) -> None:
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF")
    try:
        [lk0] = a.accept([NewDocument(target=B, app_data=b"x")])
        a.claim(10)
        state = Frame(kind=Kind.INQUIRY, source=Endpoint.platform(), origin=Endpoint.org(B), target=Endpoint.org(A),
                      body=Inquiry(topic=InquiryTopic.STATE, items=(lk0,)))
        a.handle(_raw(state))
        assert _outbox(a) == []
    finally:
        a.close()


def test_a_header_the_relay_changed_is_refused(cores: tuple[NodeCore, NodeCore]) -> None:
    from semq.testing.dishonest import patch_data

    a, b = cores
    a.accept([NewDocument(target=B, app_data=f"doc {i}".encode(), encrypt=True, expires_ms=2**50) for i in range(5)])
    data = _relayed(a.claim(10).data)
    changes = [{"expires_ms": 2**51}, {"created_ms": 1}, {"priority": 7}, {"ack2": 0}, {"reliable": 0}]
    out = b.handle([patch_data(r, ch) if ch != {"reliable": 0} else patch_data(r, {"reliable": 0, "ack2": 0})
                    for r, ch in zip(data, changes, strict=True)])
    assert out.delivered == 0
    codes = sorted(f.body.code for f in _frames(out) if isinstance(f.body, Nack))
    assert codes == [ResultCode.DECRYPT_FAILED] * 4  # best effort (Reliable=0) is never answered


def test_a_document_signed_by_a_key_not_held_yet_waits_for_its_certificate(tmp_path: Path) -> None:
    """B rolled over and signs with its new key; A holds only B's first
    certificate. A asks for B's certificates instead of refusing, delivers
    once it has them; a key still unknown when it comes again is refused."""
    from semq.identity.security import NodeSecurity, enroll, import_certificate, rollover_keys

    sa, _ = _pki(tmp_path)
    csr = rollover_keys(tmp_path / B, B)
    _, cert = enroll(tmp_path / "P", csr, B, tmp_path / B / "new.pem", rollover=True)
    import_certificate(tmp_path / B, cert, tmp_path / "P" / "ca" / "ca.pem")
    sb = NodeSecurity(tmp_path / B)
    sb.directory.add(sa.identity.certificate.der)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        b.accept([NewDocument(target=A, app_data=f"signed with the new key {i}".encode(), encrypt=True)
                  for i in range(2)])
        first, second = (_relayed([d]) for d in b.claim(10).data)
        out = a.handle(first)
        assert out.deferred == first and out.missing == {Endpoint.org(B)} and not out.data
        sa.directory.add(sb.identity.certificate.der)  # the platform's answer came
        assert a.handle(out.deferred).delivered == 1
        sa.directory.remove(B)
        sa.directory.add(_pki_first_cert(tmp_path))  # B's first certificate only, again
        out = a.handle(second)  # within the minute: refused, not asked for again
        assert not out.deferred and [f.body.code for f in _frames(out) if isinstance(f.body, Nack)] == [
            ResultCode.UNKNOWN_CERTIFICATE]
    finally:
        a.close()
        b.close()


def _pki_first_cert(tmp: Path) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    from semq.identity.crypto import load_certificate

    old = next((tmp / B / "old").glob("*/node.pem"))
    return load_certificate(old).public_bytes(Encoding.DER)


def test_a_document_that_expires_before_it_is_sent_fails_now(tmp_path: Path, node_clock: NodeClock) -> None:
    """Its failed row is kept the failed rows' 7 days from when it failed,
    not from when it was accepted (housekeeping reads state_ms)."""
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF")
    try:
        a.accept([NewDocument(target=B, app_data=b"too late", expires_ms=node_clock.t + 1000)])
        node_clock.t += 3 * 86_400_000  # sent three days later
        assert a.claim(10).data == []
        assert a.conn.execute("SELECT state, code, state_ms FROM outbox").fetchall() == [
            (9, int(ResultCode.EXPIRED), node_clock.t)]
    finally:
        a.close()
