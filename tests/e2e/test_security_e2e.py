"""Security with real processes and on the cores (SPEC "Security"):
mutual TLS refusals, an organization speaks only as itself, key files,
ciphertext-only relay, tampering refused and reported, signed receipts."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from semq.cli import main as semq_main
from semq.identity.security import (
    NodeSecurity,
    enroll,
    import_certificate,
    init_node_keys,
    init_platform_pki,
)
from semq.node.api import NodeClient
from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import (
    LK0,
    Data,
    Endpoint,
    Error,
    Frame,
    FrameDecoder,
    Hello,
    Kind,
    Nack,
    ResultCode,
    encode_frame,
    relay_bytes,
)
from tests._procs import Cluster, wait_until

A, B = "10008", "56001"


def online(c: Cluster) -> list[str]:
    try:
        return list(json.loads((c.root / "P" / "status.json").read_text())["online"])
    except (OSError, ValueError, KeyError):
        return []


@pytest.mark.e2e
def test_relay_stores_only_ciphertext_and_the_receipt_verifies(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    secret = b"<order id='S0001'>TOP-SECRET-PRICE 4711</order>"
    with NodeClient(cluster.root / A) as node:
        lk0 = node.send(B, secret, data_type="ORDER", key="S0001")
        open_lk0 = node.send(B, b"PUBLIC-NOTICE", data_type="NOTE", encrypt=False)
    wait_until(lambda: cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == 2, 30, "stored at P")
    frames = [f for (f,) in cluster.q("P", "SELECT frame FROM stored WHERE kind=1")]
    assert not any(b"TOP-SECRET" in f for f in frames)  # the relay cannot read it
    assert any(b"PUBLIC-NOTICE" in f for f in frames)  # --no-encrypt: stated as readable
    logs = [*(cluster.root / "P" / "events").glob("*.jsonl"), cluster.root / "platform.log"]
    assert logs and not any(b"TOP-SECRET" in p.read_bytes() for p in logs)
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == 2, 30, "delivery")
    assert cluster.inbox(B)[f"{A}/{lk0.record_id}"] == secret
    assert cluster.q(B, "SELECT encrypt, signer FROM inbox ORDER BY record_id") == [(1, A), (0, A)]
    wait_until(lambda: cluster.settled([A, B]), 30, "cleanup")
    capsys.readouterr()
    assert semq_main(["messages", "--dir", str(cluster.root / A), "--receipt", str(lk0), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["verified"] is True and info["signer"] == B
    assert semq_main(["messages", "--dir", str(cluster.root / A), "--receipt", str(open_lk0.record_id)]) == 0


@pytest.mark.e2e
def test_certificate_from_another_ca_is_refused_at_the_handshake(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_org(A)
    cluster.start_platform()
    # An organization enrolled with a different platform (another CA).
    other = tmp_path / "other"
    assert semq_main(["platform", "init", "--dir", str(other / "P")]) == 0
    assert semq_main(["node", "init", "--dir", str(other / "X"), "--org", "66000", "--platform",
                      f"127.0.0.1:{cluster.port}", "--enroll-from", str(other / "P")]) == 0
    log = tmp_path / "x.log"
    p = subprocess.Popen([sys.executable, "-m", "semq", "node", "run", "--dir", str(other / "X")],
                         stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "TLS handshake refused" in (cluster.root / "platform.log").read_text(), 20,
                   "the platform to refuse the handshake")
        time.sleep(1)
        assert "66000" not in online(cluster)
    finally:
        p.kill()
        p.wait(timeout=10)


def _tls_socket(c: Cluster, org: str) -> ssl.SSLSocket:
    d = c.root / org
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(d / "ca.pem")
    ctx.load_cert_chain(d / "node.pem", d / "keys" / "sign.key.pem")
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _read_frames(s: ssl.SSLSocket, timeout: float = 5) -> list[Frame]:
    dec = FrameDecoder()
    s.settimeout(timeout)
    out: list[Frame] = []
    try:
        while chunk := s.recv(65536):
            dec.receive_data(chunk)
            out += [f.frame() for f in dec]
    except (TimeoutError, ssl.SSLError, OSError):
        pass
    return out


@pytest.mark.e2e
def test_a_valid_certificate_cannot_speak_as_another_organization(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    with _tls_socket(cluster, A) as s:  # A's certificate, B's name
        s.sendall(encode_frame(Frame(kind=Kind.HELLO, source=Endpoint.org(B), target=Endpoint.platform(),
                                     body=Hello())))
        frames = _read_frames(s)
    errors = [f.body for f in frames if isinstance(f.body, Error)]
    assert errors and errors[0].code is ResultCode.AUTH_FAILED
    assert A in errors[0].message and B in errors[0].message


@pytest.mark.e2e
def test_revoked_organization_is_disconnected(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(B)
    wait_until(lambda: B in online(cluster), 20, "B online")
    assert semq_main(["platform", "revoke", "--dir", str(cluster.root / "P"), B]) == 0
    wait_until(lambda: B not in online(cluster), 20, "B disconnected after revocation")
    time.sleep(2)  # B keeps retrying: every handshake is refused now
    assert B not in online(cluster)
    assert "TLS handshake refused" in (cluster.root / "platform.log").read_text()


@pytest.mark.e2e
def test_document_to_an_unknown_organization_fails_with_unknown_target(cluster: Cluster) -> None:
    """An organization the platform does not know (never enrolled nor
    registered): the platform's CERT_RESPONSE says UNKNOWN_TARGET, not
    "no certificate", and the document fails with it (was 502 before: the
    same code as a known organization without a certificate yet)."""
    cluster.add_org(A)
    cluster.start_platform()
    cluster.start_node(A)
    with NodeClient(cluster.root / A) as node:
        node.send("99999", b"to nobody", data_type="ORDER")
    rows = wait_until(lambda: cluster.q(A, "SELECT state, code FROM outbox WHERE state=9"), 20,
                      "the document to fail")
    assert rows == [(9, int(ResultCode.UNKNOWN_TARGET))]


def test_key_file_readable_by_others_is_refused(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    d = cluster.add_org(A)
    key = d / "keys" / "sign.key.pem"
    os.chmod(key, 0o644)
    assert semq_main(["node", "run", "--dir", str(d)]) != 0
    err = capsys.readouterr().err
    assert str(key) in err and "0644" in err and err.count("\n") == 1


def _pki(tmp: Path) -> tuple[NodeSecurity, NodeSecurity]:
    init_platform_pki(tmp / "P", "platform", [])
    secs = []
    for org in (A, B):
        csr = init_node_keys(tmp / org, org)
        _, cert = enroll(tmp / "P", csr, org, tmp / org / "issued.pem")
        import_certificate(tmp / org, cert, tmp / "P" / "ca" / "ca.pem")
        secs.append(NodeSecurity(tmp / org))
    a, b = secs
    a.directory.add(b.identity.certificate.der)
    b.directory.add(a.identity.certificate.der)
    return a, b


def test_tampered_document_is_refused_never_delivered_and_the_origin_told(tmp_path: Path) -> None:
    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    a.accept([NewDocument(target=B, app_data=b"pay 100 EUR", encrypt=True)])
    [data] = a.claim(10).data
    dec = FrameDecoder()
    dec.receive_data(data)
    frame = next(iter(dec)).frame()
    assert isinstance(frame.body, Data) and frame.body.encrypt
    body = frame.body
    tampered = bytearray(body.app_data)
    tampered[-1] ^= 1
    for bad in (
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=frame.target, origin=frame.origin,
              body=Data(lk0=body.lk0, app_key=body.app_key, created_ms=body.created_ms, encrypt=True,
                        session_key=body.session_key, app_data=bytes(tampered)), ack2=True),
        # The relay re-addresses the AppKey: the AAD no longer matches.
        Frame(kind=Kind.DATA, source=Endpoint.platform(), target=frame.target, origin=frame.origin,
              body=Data(lk0=body.lk0, created_ms=body.created_ms, encrypt=True,
                        session_key=body.session_key, app_data=body.app_data), ack2=True, save_fwd=2),
    ):
        dec.receive_data(encode_frame(bad))
        out = b.handle(list(dec))
        assert out.delivered == 0 and out.errors
        assert b.conn.execute("SELECT count(*) FROM inbox").fetchone()[0] == 0
        assert b.conn.execute("SELECT count(*) FROM dedup").fetchone()[0] == 0  # the genuine copy still gets in
        dec.receive_data(out.data[0])
        nack = next(iter(dec)).frame()
        assert isinstance(nack.body, Nack) and nack.body.code in (ResultCode.DECRYPT_FAILED, ResultCode.BAD_SIGNATURE)
    # The NACK, relayed by the platform, fails A's row with the code (visible in 'semq messages').
    a.conn.execute("UPDATE outbox SET state=2")  # as if ACK_FWD had arrived
    relayed = Frame(kind=Kind.NACK, source=Endpoint.platform(), target=Endpoint.org(A), origin=Endpoint.org(B),
                    body=nack.body)
    dec.receive_data(encode_frame(relayed))
    a.handle(list(dec))
    assert a.conn.execute("SELECT state, code FROM outbox").fetchall() == [(9, int(nack.body.code))]
    # The genuine copy is delivered.
    dec.receive_data(data)
    assert b.handle(list(dec)).delivered == 1
    assert b.conn.execute("SELECT app_data FROM inbox").fetchone()[0] == b"pay 100 EUR"


def _frames(data: bytes) -> list[Frame]:
    dec = FrameDecoder()
    dec.receive_data(data)
    return [r.frame() for r in dec]


def _raw(frame: Frame) -> list:  # type: ignore[type-arg]
    dec = FrameDecoder()
    dec.receive_data(encode_frame(frame))
    return list(dec)


def _relayed(chunks: list[bytes]) -> list:  # type: ignore[type-arg]
    """A node's frames as the platform passes them on (``relay_bytes``)."""
    dec = FrameDecoder()
    dec.receive_data(b"".join(chunks))
    out = FrameDecoder()
    out.receive_data(b"".join(relay_bytes(r, Endpoint.platform()) for r in dec))
    return list(out)


def test_replayed_moved_and_redirected_documents_never_reach_an_inbox(tmp_path: Path) -> None:
    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    a.accept([NewDocument(target=B, app_data=b"order 1", encrypt=True),
              NewDocument(target=B, app_data=b"order 2", encrypt=True)])
    first, second = (f for f in _frames(b"".join(a.claim(10).data)))
    assert isinstance(first.body, Data) and isinstance(second.body, Data)
    relay = Endpoint.platform()

    def via_platform(frame: Frame, body: Data, **kw: object) -> Frame:
        args: dict[str, object] = dict(kind=Kind.DATA, source=relay, target=frame.target, origin=frame.origin,
                                       body=body, ack2=True)
        args.update(kw)
        return Frame(**args)  # type: ignore[arg-type]

    assert b.handle(_raw(via_platform(first, first.body))).delivered == 1
    # A replay of a delivered document: suppressed, never a second copy.
    assert b.handle(_raw(via_platform(first, first.body))).delivered == 0
    # Document 2's ciphertext moved to another LK0: refused (the AAD binds the LK0).
    moved = Data(lk0=LK0(endpoint=first.body.lk0.endpoint, record_id=99), app_key=second.body.app_key,
                 created_ms=second.body.created_ms, encrypt=True, session_key=second.body.session_key,
                 app_data=second.body.app_data)
    out = b.handle(_raw(via_platform(second, moved)))
    assert out.delivered == 0 and out.errors[0][0] in (ResultCode.DECRYPT_FAILED, ResultCode.BAD_SIGNATURE)
    # Redirected to another organization (C enrolled with the same CA): refused too.
    c_dir = tmp_path / "77000"
    csr = init_node_keys(c_dir, "77000")
    _, cert = enroll(tmp_path / "P", csr, "77000", c_dir / "issued.pem")
    import_certificate(c_dir, cert, tmp_path / "P" / "ca" / "ca.pem")
    sc = NodeSecurity(c_dir)
    sc.directory.add(sa.identity.certificate.der)
    c = NodeCore(tmp_path / "c.sqlite", "77000", create=True, synchronous="OFF", security=sc)
    out = c.handle(_raw(via_platform(second, second.body, target=Endpoint.org("77000"))))
    assert out.delivered == 0 and out.errors
    assert [r[0] for r in b.conn.execute("SELECT app_data FROM inbox")] == [b"order 1"]
    assert c.conn.execute("SELECT count(*) FROM inbox").fetchone()[0] == 0
    # The genuine second document still gets in.
    assert b.handle(_raw(via_platform(second, second.body))).delivered == 1
    for core in (a, b, c):
        core.close()


def test_forged_receipt_is_kept_unverified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from semq.identity.crypto import NodeKeys, make_batch_receipt
    from semq.umxt_protocol import AckBatch, AckEntry, AckFlag

    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    [lk0] = a.accept([NewDocument(target=B, app_data=b"order", encrypt=True)])
    [data] = _frames(b"".join(a.claim(10).data))
    a.write_deferred_now()  # (the digest is held with the claimed row until then)
    digest = a.conn.execute("SELECT digest FROM receipts WHERE record_id=?", (lk0.record_id,)).fetchone()[0]
    forger = NodeKeys.generate()  # not B's key
    entry = AckEntry(1, 1, 1, 1, 1, lk0.record_id, int(AckFlag.DELIVERY), 0)
    ack = Frame(kind=Kind.ACK_BATCH, source=Endpoint.platform(), target=Endpoint.org(A), origin=Endpoint.org(B),
                body=AckBatch(ack_kind=Kind.ACK2, entries=(entry,),
                              receipt=make_batch_receipt([(lk0, digest)], forger.signing_key)))
    a.handle(_raw(ack))
    assert a.conn.execute("SELECT verified FROM receipts WHERE record_id=?", (lk0.record_id,)).fetchone() == (0,)
    a.close()
    _ = (data, sb)


def test_batch_receipt_kept_once_and_each_document_proves_alone(tmp_path: Path) -> None:
    """ACK2 for 7 documents carries one batch receipt: A keeps it once (not a
    proof per document) and derives each document's own receipt on request;
    each verifies alone against B's certificate, and a proof written by an
    older version (form 3 in the row) is still served as it is."""
    from semq.identity.crypto import verify_receipt

    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        lk0s = a.accept([NewDocument(target=B, app_data=f"order {i}".encode(), encrypt=True) for i in range(7)])

        out_b = b.handle(_relayed(a.claim(10).data))
        assert out_b.delivered == 7
        a.handle(_relayed(out_b.data))
        assert a.conn.execute("SELECT count(*) FROM receipt_batches").fetchone() == (1,)
        rows = a.conn.execute("SELECT verified, length(receipt), batch_index FROM receipts ORDER BY record_id").fetchall()
        assert rows == [(1, 0, i) for i in range(7)]
        for lk0 in lk0s:
            got = a.receipt_proof(lk0.record_id)
            assert got is not None
            target, digest, proof, _ms = got
            info = verify_receipt(proof, digest=digest, lk0=lk0, receiver_certs=[sb.identity.certificate])
            assert target == B and info.org == B and info.batch_size == 7
        # A row as schema v5 wrote it: the form-3 proof in the row itself.
        first = lk0s[0].record_id
        _t, _d, proof, _ms = a.receipt_proof(first)  # type: ignore[misc]
        a.conn.execute("UPDATE receipts SET receipt=?, batch_id=NULL WHERE record_id=?", (proof, first))
        assert a.receipt_proof(first) == (B, _d, proof, _ms)
        assert a.receipt_proof(10_000) is None
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("late", ["the resent copies' receipt", "the first copies' receipt, late"])
def test_a_resent_document_keeps_its_digest_and_its_receipt_verifies(tmp_path: Path, late: str) -> None:
    """A resend signs a document again, in another batch. Its salt, and so
    its digest, are those of the first copy — also after A restarts — so
    the receiver's receipt verifies whichever copy it is about. (Before,
    each copy had a random salt and A kept the first digest: a receipt for
    a resent copy did not verify, and with it the whole batch's proof was
    lost.)"""
    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        lk0s = a.accept([NewDocument(target=B, app_data=f"order {i}".encode(), encrypt=True) for i in range(3)])
        first = a.claim(10).data
        a.write_deferred_now()  # (the digests are held with the claimed rows until then)
        digests = a.conn.execute("SELECT digest FROM receipts ORDER BY record_id").fetchall()
        out_first = b.handle(_relayed(first))  # its ACK2 is held up (lost, or late)
        assert out_first.delivered == 3
        a.close()  # A restarts; the rows go again (as if the platform lacked them)
        a = NodeCore(tmp_path / "a.sqlite", A, synchronous="OFF", security=sa)
        a.conn.execute("UPDATE outbox SET state=0")
        again = a.claim(10).data
        assert len(again) == 3 and again != first
        out_again = b.handle(_relayed(again))
        assert out_again.delivered == 0  # duplicates: acknowledged, not delivered twice
        a.handle(_relayed(out_again.data if late.startswith("the resent") else out_first.data))
        assert a.conn.execute("SELECT digest FROM receipts ORDER BY record_id").fetchall() == digests
        assert a.conn.execute("SELECT verified FROM receipts").fetchall() == [(1,)] * 3
        for lk0 in lk0s:
            proof = a.receipt_proof(lk0.record_id)
            assert proof is not None and proof[0] == B
    finally:
        a.close()
        b.close()


def test_a_receipt_row_is_written_once_with_its_receipt(tmp_path: Path) -> None:
    """The digest a document was signed with stays in memory with its held
    SS_SENT: the claim writes no receipts row, and the ACK2 that brings the
    receipt writes each document's row once, digest and receipt together,
    without reading a digest back."""
    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        lk0s = a.accept([NewDocument(target=B, app_data=f"order {i}".encode(), encrypt=True) for i in range(4)])
        sql: list[str] = []
        a.conn.set_trace_callback(sql.append)
        data = a.claim(10).data
        assert a.conn.execute("SELECT count(*) FROM receipts").fetchone() == (0,)
        out_b = b.handle(_relayed(data))
        a.handle(_relayed(out_b.data))
        a.conn.set_trace_callback(None)
        receipts = [q.split(" (")[0] for q in sql if " receipts" in q and "count(*)" not in q]
        assert receipts == ["INSERT INTO receipts"] * 4  # (executemany traces each row): no SELECT, no UPDATE
        rows = a.conn.execute("SELECT record_id, verified, batch_index, length(digest) FROM receipts"
                              " ORDER BY record_id").fetchall()
        assert rows == [(lk.record_id, 1, i, 32) for i, lk in enumerate(lk0s)]
        assert a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        assert all(a.receipt_proof(lk.record_id) is not None for lk in lk0s)
    finally:
        a.close()
        b.close()


def test_a_digest_outlives_its_row_and_a_crash(tmp_path: Path) -> None:
    """A row confirmed without a receipt (an ACK2 that carries none) is
    cleaned and its digest written then, so a receipt that comes later
    still verifies; and when a crash loses the digests held with rows still
    pending, a receipt that comes before they are sent again verifies
    against the digests made again from the rows (deterministic salts)."""
    from semq.umxt_protocol import AckBatch

    sa, sb = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    try:
        first = a.accept([NewDocument(target=B, app_data=f"order {i}".encode(), encrypt=True) for i in range(3)])
        ack2 = _relayed(b.handle(_relayed(a.claim(10).data)).data)
        bare = []  # the same ACK2 with its receipt stripped
        for raw in ack2:
            f = raw.frame()
            if isinstance(f.body, AckBatch) and f.body.receipt:
                f = Frame(kind=f.kind, source=f.source, target=f.target, origin=f.origin,
                          body=AckBatch(ack_kind=f.body.ack_kind, entries=f.body.entries))
            bare += _raw(f)
        out = a.handle(bare)
        # An ACK2 without its receipt proves nothing: the rows stay open.
        assert out.bad_receipts == 3
        assert a.state_counts().get("SS_SENT") == 3
        a.handle(ack2)  # the receipt, late
        assert a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)  # confirmed, cleaned
        assert a.conn.execute("SELECT verified FROM receipts ORDER BY record_id").fetchall() == [(1,)] * 3
        assert all(a.receipt_proof(lk.record_id) is not None for lk in first)

        later = a.accept([NewDocument(target=B, app_data=f"invoice {i}".encode(), encrypt=True) for i in range(2)])
        ack2 = _relayed(b.handle(_relayed(a.claim(10).data)).data)
        a.log.close() if a.log else None
        a.db.close()  # a crash: the held SS_SENT and digests are gone, the rows SS_INIT on disk
        a = NodeCore(tmp_path / "a.sqlite", A, synchronous="OFF", security=sa)
        assert a.conn.execute("SELECT count(*) FROM receipts").fetchone() == (3,)
        assert a.conn.execute("SELECT state FROM outbox").fetchall() == [(0,), (0,)]
        a.handle(ack2)  # before the rows went again
        assert a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        rows = a.conn.execute("SELECT record_id, verified FROM receipts WHERE record_id > ?"
                              " ORDER BY record_id", (first[-1].record_id,)).fetchall()
        assert rows == [(lk.record_id, 1) for lk in later]
        assert all(a.receipt_proof(lk.record_id) is not None for lk in later)
    finally:
        a.close()
        b.close()


def test_certificate_rollover_overlap(tmp_path: Path) -> None:
    """B rolls over. A document sealed to B's old certificate (A's directory
    was not refreshed yet) and one sealed to the new one are both readable;
    after a refresh A seals to both (newest first)."""
    from semq.identity.security import rollover_keys

    sa, sb_old = _pki(tmp_path)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", security=sa)
    a.accept([NewDocument(target=B, app_data=b"sealed to the old key", encrypt=True)])
    to_old = a.claim(10).data  # A knows only B's first certificate
    csr = rollover_keys(tmp_path / B, B)
    _, cert = enroll(tmp_path / "P", csr, B, tmp_path / B / "new.pem", rollover=True)
    import_certificate(tmp_path / B, cert, tmp_path / "P" / "ca" / "ca.pem")
    sb = NodeSecurity(tmp_path / B)  # the daemon restarted with the new identity
    assert sb.identity.certificate.serial != sb_old.identity.certificate.serial
    assert [p.certificate.serial for p in sb.previous] == [sb_old.identity.certificate.serial]
    sb.directory.add(sa.identity.certificate.der)
    sa.directory.add(sb.identity.certificate.der)  # A learns the new certificate too
    assert len(sa.certs(Endpoint.org(B))) == 2
    a.accept([NewDocument(target=B, app_data=b"sealed to both", encrypt=True)])
    to_both = a.claim(10).data
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", security=sb)
    dec = FrameDecoder()
    dec.receive_data(b"".join(to_old + to_both))
    relayed = [Frame(kind=Kind.DATA, source=Endpoint.platform(), target=f.target, origin=f.origin, body=f.body,
                     ack2=f.ack2) for f in (r.frame() for r in dec)]
    out = b.handle(_raw(relayed[0]) + _raw(relayed[1]))
    assert out.delivered == 2, out.errors
    assert sorted(r[0] for r in b.conn.execute("SELECT app_data FROM inbox")) == [
        b"sealed to both", b"sealed to the old key"]
    a.close()
    b.close()


@pytest.mark.e2e
def test_rollover_with_real_processes(cluster: Cluster) -> None:
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"before", data_type="T")
    wait_until(lambda: len(cluster.inbox(B)) == 1, 30, "first document")
    assert semq_main(["node", "rollover", "--dir", str(cluster.root / B), "--enroll-from",
                      str(cluster.root / "P")]) == 0
    cluster.kill(B, signal.SIGTERM)
    cluster.start_node(B)
    with NodeClient(cluster.root / A) as node:
        node.send(B, b"after", data_type="T")
    wait_until(lambda: len(cluster.inbox(B)) == 2, 30, "document after the rollover")
    assert sorted(cluster.inbox(B).values()) == [b"after", b"before"]
    assert len(list((cluster.root / B / "old").iterdir())) == 1
