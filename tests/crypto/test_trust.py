"""Trust in other organizations' certificates (docs/security.md, "Pinning",
"Revocation reaches senders", "Waiting for a certificate"): one identity
per organization at enrollment; nodes pin certificates on first use and
refuse a second one the CA issues, unless it is a rollover endorsed by the
pinned key or their operator accepts it; revocations and rollovers reach
running senders; documents to a known organization without a usable
certificate wait instead of failing.

The end-to-end tests run a platform and nodes as real processes and read
what the platform stores for an offline receiver: the key ids in each
stored document's session key blob say which certificates the sender
sealed it to (docs/security.md, "Session key blob")."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from semq.cli import main as semq_main
from semq.identity.crypto import (
    CertificateAuthority,
    CertificateError,
    NodeCertificate,
    NodeKeys,
    blob_key_ids,
    certificate_org,
    endorse_rollover,
    fingerprint,
    load_certificate,
    make_csr,
    save_certificate,
    save_csr,
    verify_node_certificate,
)
from semq.identity.crypto._pki import _parse_node_certificate
from semq.identity.security import (
    NodeSecurity,
    PlatformSecurity,
    enroll,
    import_certificate,
    init_node_keys,
    init_platform_pki,
    revoke,
)
from semq.identity.trust import PinStore, TrustError
from semq.node.api import NodeClient
from semq.umxt_protocol import Data, Endpoint, FrameDecoder, ResultCode
from tests._procs import Cluster, wait_until

A, B = "10008", "56001"


# ---------------------------------------------------------------- helpers


def _enc_id(cert: x509.Certificate) -> str:
    """The key id a sender's session key blob names for ``cert``'s X25519 key."""
    return _parse_node_certificate(cert).encryption_key_id.hex()


def stored_key_ids(c: Cluster) -> list[set[str]]:
    """Per document the platform stores (in order), the key ids its session
    key blob has wraps for."""
    out = []
    for (raw,) in c.q("P", "SELECT frame FROM stored WHERE kind=1 ORDER BY id"):
        dec = FrameDecoder()
        dec.receive_data(raw)
        body = next(iter(dec)).frame().body
        assert isinstance(body, Data)
        out.append({k.hex() for k in blob_key_ids(body.session_key)})
    return out


def send(c: Cluster, body: bytes, *, save_fwd: int = 3) -> int:
    with NodeClient(c.root / A) as node:
        return int(node.send(B, body, data_type="T", save_fwd=save_fwd).record_id)


def send_until_sealed_to(c: Cluster, want: set[str], timeout: float, what: str) -> float:
    """Send documents to B (offline: the platform stores them) until one is
    sealed to exactly the key ids ``want``. Returns the seconds it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last: set[str] = set()
    n = 0
    while time.monotonic() < deadline:
        n += 1
        before = c.count("P", "SELECT count(*) FROM stored WHERE kind=1")
        send(c, f"probe {n}".encode())

        def stored(before: int = before) -> bool:
            return c.count("P", "SELECT count(*) FROM stored WHERE kind=1") > before

        wait_until(stored, max(1.0, deadline - time.monotonic()), f"probe {n} stored at the platform")
        last = stored_key_ids(c)[-1]
        if last == want:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: last sealed to {sorted(last)},"
                         f" want {sorted(want)}")


def log_of(c: Cluster, name: str) -> str:
    return (c.root / f"{name}.log").read_text(errors="replace")


def pins(c: Cluster, org: str) -> dict[str, object]:
    data = json.loads((c.root / org / "pins.json").read_text())
    return dict(data["orgs"])


# ---------------------------------------------------------------- one identity


def test_enroll_refuses_a_second_certificate_without_rollover(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "P"
    assert semq_main(["platform", "init", "--dir", str(p)]) == 0
    assert semq_main(["node", "init", "--dir", str(tmp_path / "B"), "--org", B, "--enroll-from", str(p)]) == 0
    first = load_certificate(tmp_path / "B" / "node.pem")
    # Someone else's keys asking for B: one line naming B and the certificate it holds, exit 2.
    assert semq_main(["node", "init", "--dir", str(tmp_path / "B2"), "--org", B]) == 0
    capsys.readouterr()
    csr = str(tmp_path / "B2" / "node.csr.pem")
    assert semq_main(["platform", "enroll", "--dir", str(p), csr, "--out", str(tmp_path / "b2.pem")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: organization 56001 already holds a valid certificate")
    assert fingerprint(first) in err and "--rollover" in err
    assert not (tmp_path / "b2.pem").exists()
    assert len(CertificateAuthority.load(p / "ca").current_certificates(B)) == 1
    # node init --enroll-from refuses before it writes anything.
    assert semq_main(["node", "init", "--dir", str(tmp_path / "B3"), "--org", B, "--enroll-from", str(p)]) == 2
    assert "already holds a valid certificate" in capsys.readouterr().err
    assert not (tmp_path / "B3").exists()
    # --rollover: issued.
    assert semq_main(["platform", "enroll", "--dir", str(p), csr, "--rollover",
                      "--out", str(tmp_path / "b2.pem")]) == 0
    assert len(CertificateAuthority.load(p / "ca").current_certificates(B)) == 2
    # Revoked earlier certificates do not block a new enrollment ...
    assert semq_main(["platform", "revoke", "--dir", str(p), B]) == 0
    assert semq_main(["node", "init", "--dir", str(tmp_path / "B4"), "--org", B, "--enroll-from", str(p)]) == 0
    # ... and neither do expired ones.
    ca = CertificateAuthority.load(p / "ca")
    old = ca.issue_node_certificate(make_csr(NodeKeys.generate(), "77000"), org="77000",
                                    not_before=first.not_valid_before_utc.replace(year=2020), days=30)
    ca.save(p / "ca")
    assert certificate_org(old) == "77000" and not ca.current_certificates("77000")
    keys = NodeKeys.generate()
    save_csr(tmp_path / "c.csr", make_csr(keys, "77000"))
    org, path = enroll(p, tmp_path / "c.csr", "77000", tmp_path / "c.pem")
    assert org == "77000" and path.exists()


# ---------------------------------------------------------------- pinning


@pytest.mark.e2e
def test_a_second_certificate_from_the_ca_is_refused_until_the_operator_trusts_it(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """The platform operator, as a malicious CA would (calling the CA
    directly, past the CLI's check), issues a second certificate for B with
    other keys while A has pinned B's. A keeps sealing only to the pinned
    certificate, says so once (with the fingerprint and what to run), and
    uses the new one only after 'semq node trust B FINGERPRINT'."""
    for o in (A, B):
        cluster.add_org(o)
    genuine = _enc_id(load_certificate(cluster.root / B / "node.pem"))
    cluster.start_platform()
    cluster.start_node(A)
    send(cluster, b"first")
    wait_until(lambda: len(stored_key_ids(cluster)) == 1, 30, "the first document stored for B")
    assert stored_key_ids(cluster) == [{genuine}]
    assert [p["how"] for p in pins(cluster, A)[B]["pinned"]] == ["first use"]  # type: ignore[index]
    assert stat.S_IMODE(os.stat(cluster.root / A / "pins.json").st_mode) == 0o600

    ca = CertificateAuthority.load(cluster.root / "P" / "ca")
    evil_keys = NodeKeys.generate()
    evil = ca.issue_node_certificate(make_csr(evil_keys, B), org=B)
    ca.save(cluster.root / "P" / "ca")
    save_certificate(cluster.root / "evil.pem", evil)
    evil_fp, evil_id = fingerprint(evil), _enc_id(evil)

    # The platform pushes B's new certificate set; A refuses the unpinned one.
    wait_until(lambda: f"NOT TRUSTED (CERT_NOT_TRUSTED): fingerprint {evil_fp}" in log_of(cluster, A), 30,
               "A to refuse the second certificate")
    assert f"semq node trust {B} {evil_fp}" in log_of(cluster, A)
    send(cluster, b"second")
    wait_until(lambda: len(stored_key_ids(cluster)) == 2, 30, "the second document stored")
    assert stored_key_ids(cluster)[1] == {genuine}  # not sealed to the CA's key
    # Refused once, also across a restart (which asks for B's certificates again).
    cluster.kill(A, signal.SIGTERM)
    cluster.start_node(A)
    send(cluster, b"third")
    wait_until(lambda: len(stored_key_ids(cluster)) == 3, 30, "the third document stored")
    assert stored_key_ids(cluster)[2] == {genuine}
    assert log_of(cluster, A).count("NOT TRUSTED") == 1

    capsys.readouterr()
    assert semq_main(["node", "trust", "--dir", str(cluster.root / A), B]) == 0
    listing = capsys.readouterr().out
    assert "pinned" in listing and f"REFUSED  {evil_fp}" in listing
    # The operator compared the fingerprint and accepts it (a prefix will do).
    assert semq_main(["node", "trust", "--dir", str(cluster.root / A), B, evil_fp[:16]]) == 0
    assert evil_fp in capsys.readouterr().out
    send_until_sealed_to(cluster, {genuine, evil_id}, 30, "A to seal to the certificate its operator accepted")
    assert sorted(p["how"] for p in pins(cluster, A)[B]["pinned"]) == ["first use", "operator"]  # type: ignore[index]
    assert pins(cluster, A)[B]["refused"] == []  # type: ignore[index]


@pytest.mark.e2e
def test_a_rollover_endorsed_by_the_pinned_key_is_accepted_without_the_operator(cluster: Cluster) -> None:
    """B rolls over (semq node rollover: new keys endorsed by the current key;
    semq platform enroll --rollover; semq node import). A, which pinned B's first
    certificate, gets the new one from the platform, checks the endorsement
    against its pin and pins it: its next documents are sealed to both.
    B, started afterwards, opens all of them."""
    for o in (A, B):
        cluster.add_org(o)
    first = _enc_id(load_certificate(cluster.root / B / "node.pem"))
    first_fp = fingerprint(load_certificate(cluster.root / B / "node.pem"))
    cluster.start_platform()
    cluster.start_node(A)
    send(cluster, b"before the rollover")
    wait_until(lambda: len(stored_key_ids(cluster)) == 1, 30, "the first document stored for B")
    assert stored_key_ids(cluster) == [{first}]

    # Across machines: new keys and an endorsed request at B, issued by the
    # platform operator as a rollover, imported at B.
    assert semq_main(["node", "rollover", "--dir", str(cluster.root / B)]) == 0
    assert semq_main(["platform", "enroll", "--dir", str(cluster.root / "P"), "--rollover",
                      str(cluster.root / B / "next" / "node.csr.pem"), "--out", str(cluster.root / "b2.pem")]) == 0
    assert semq_main(["node", "import", "--dir", str(cluster.root / B), "--cert", str(cluster.root / "b2.pem"),
                      "--ca", str(cluster.root / "P" / "ca" / "ca.pem")]) == 0
    second_cert = load_certificate(cluster.root / B / "node.pem")
    second = _enc_id(second_cert)
    assert second != first
    send_until_sealed_to(cluster, {first, second}, 30, "A to seal to B's old and new certificates")
    assert "accepted and pinned" in log_of(cluster, A) and "NOT TRUSTED" not in log_of(cluster, A)
    how = {p["fingerprint"]: p["how"] for p in pins(cluster, A)[B]["pinned"]}  # type: ignore[index]
    assert how == {first_fp: "first use", fingerprint(second_cert): f"rollover endorsed by {first_fp}"}

    n = cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1")
    cluster.start_node(B)
    wait_until(lambda: len(cluster.inbox(B)) == n, 30, "B to receive every document")
    assert b"before the rollover" in cluster.inbox(B).values()


# ---------------------------------------------------------------- revocation reaches senders


@pytest.mark.e2e
def test_a_revoked_certificate_is_no_longer_sealed_to_within_a_minute(cluster: Cluster) -> None:
    """B holds two certificates (a rollover); A seals to both. The operator
    revokes the old one by serial: within 60 s, without restarting A, A's
    new documents are sealed to the new key only."""
    for o in (A, B):
        cluster.add_org(o)
    old_cert = load_certificate(cluster.root / B / "node.pem")
    assert semq_main(["node", "rollover", "--dir", str(cluster.root / B), "--enroll-from",
                      str(cluster.root / "P")]) == 0
    old, new = _enc_id(old_cert), _enc_id(load_certificate(cluster.root / B / "node.pem"))
    cluster.start_platform()
    cluster.start_node(A)
    send(cluster, b"to both")
    wait_until(lambda: len(stored_key_ids(cluster)) == 1, 30, "the first document stored for B")
    assert stored_key_ids(cluster) == [{old, new}]

    assert semq_main(["platform", "revoke", "--dir", str(cluster.root / "P"),
                      "--serial", f"{old_cert.serial_number:x}"]) == 0
    took = send_until_sealed_to(cluster, {new}, 60, "A to stop sealing to the revoked certificate")
    print(f"sealed to the new key only {took:.1f} s after the revocation")
    assert took < 60
    assert (cluster.root / A / "crl.pem").exists()  # kept for the next start
    assert cluster.procs[A].p.poll() is None  # the same process throughout


@pytest.mark.e2e
def test_documents_to_a_revoked_organization_wait(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Revoking B entirely: within 60 s A stops sealing to B, and its
    documents to B wait (SS_INIT, code CERT_REVOKED, visible in 'semq
    messages' and 'semq admin stuck') instead of failing; a SaveFwd 1
    document fails, as it would with B offline."""
    for o in (A, B):
        cluster.add_org(o)
    cluster.start_platform()
    cluster.start_node(A)
    send(cluster, b"before")
    wait_until(lambda: len(stored_key_ids(cluster)) == 1, 30, "the first document stored for B")

    assert semq_main(["platform", "revoke", "--dir", str(cluster.root / "P"), B]) == 0
    t0 = time.monotonic()

    def waiting() -> bool:
        rid = send(cluster, b"after")
        time.sleep(1.5)
        return bool(cluster.q(A, "SELECT 1 FROM outbox WHERE id=? AND state=0 AND code=?", rid,
                              int(ResultCode.CERT_REVOKED)))

    wait_until(waiting, 60, "A's documents to B to wait with CERT_REVOKED")
    assert time.monotonic() - t0 < 60
    stored = cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1")
    one = send(cluster, b"drop me", save_fwd=1)
    wait_until(lambda: cluster.q(A, "SELECT state, code FROM outbox WHERE id=?", one)
               == [(9, int(ResultCode.CERT_REVOKED))], 30, "the SaveFwd 1 document to fail")
    time.sleep(6)  # past the first retries: still waiting, nothing sealed to B
    assert cluster.count("P", "SELECT count(*) FROM stored WHERE kind=1") == stored
    rows = cluster.q(A, "SELECT state, code FROM outbox WHERE id != ? AND state != 3", one)
    assert rows and set(rows) == {(0, int(ResultCode.CERT_REVOKED))}

    capsys.readouterr()
    assert semq_main(["messages", "--dir", str(cluster.root / A)]) == 0
    out = capsys.readouterr().out
    assert "SS_INIT" in out and f"waiting for a certificate of {B}: CERT_REVOKED" in out
    assert semq_main(["admin", "stuck", "--dir", str(cluster.root / A), "--older-than", "0", "--json"]) == 0
    stuck = json.loads(capsys.readouterr().out)
    assert stuck["by_place"].get("waiting_for_certificate") == len(rows)
    assert all(r["reason"].startswith(f"waiting for a certificate of {B}: CERT_REVOKED")
               for r in stuck["rows"] if r.get("place") == "waiting_for_certificate")


# ---------------------------------------------------------------- waiting for a certificate


@pytest.mark.e2e
def test_a_document_to_an_organization_enrolled_while_the_platform_runs_waits_not_fails(
        cluster: Cluster) -> None:
    """B is enrolled while the platform runs ('semq platform enroll') and
    never connects. A sends to it at once: the platform issued B's
    certificate, so it serves it from enrollment on; the document is sealed
    to it and stored for B. (It failed with UNKNOWN_CERTIFICATE when the
    platform had not yet reloaded its CA state, which it did every 2 s.)"""
    cluster.add_org(A)
    cluster.start_platform()
    cluster.start_node(A)
    bdir = cluster.root / B
    assert semq_main(["node", "init", "--dir", str(bdir), "--org", B, "--platform",
                      f"127.0.0.1:{cluster.port}"]) == 0
    assert semq_main(["platform", "enroll", "--dir", str(cluster.root / "P"), str(bdir / "node.csr.pem"),
                      "--out", str(cluster.root / "b.pem")]) == 0
    rid = send(cluster, b"to a newcomer")
    wait_until(lambda: cluster.q(A, "SELECT state FROM outbox WHERE id=?", rid) in ([(3,)], [(9,)]), 30,
               "the document to be stored (or fail)")
    assert cluster.q(A, "SELECT state, code FROM outbox WHERE id=?", rid) == [(3, 0)]  # SS_ACK: stored
    assert stored_key_ids(cluster) == [{_enc_id(load_certificate(cluster.root / "b.pem"))}]


# ---------------------------------------------------------------- the parts, without processes


def _gen(ca: CertificateAuthority, org: str, endorser: NodeKeys | None = None) -> tuple[NodeKeys, NodeCertificate]:
    keys = NodeKeys.generate()
    e = endorse_rollover(endorser.signing_key, org, keys) if endorser is not None else None
    cert = ca.issue_node_certificate(make_csr(keys, org, endorsement=e), org=org)
    return keys, verify_node_certificate(cert, ca=ca.certificate, crl=ca.crl())


def test_pins_first_use_rollover_chain_refusal_and_the_operator(tmp_path: Path) -> None:
    ca = CertificateAuthority.create("Pins CA")
    k1, c1 = _gen(ca, B)
    store = PinStore(tmp_path)
    adm = store.admit(B, [c1])
    assert adm.accepted == [c1] and [h for _, h in adm.pinned] == ["first use"] and not adm.pinned_before
    assert stat.S_IMODE(os.stat(tmp_path / "pins.json").st_mode) == 0o600
    before = (tmp_path / "pins.json").stat().st_mtime_ns
    assert store.admit(B, [c1]).accepted == [c1]  # nothing new: nothing written
    assert (tmp_path / "pins.json").stat().st_mtime_ns == before
    # A rollover endorsed by the pinned key, and a chain of two in one answer.
    k2, c2 = _gen(ca, B, k1)
    k3, c3 = _gen(ca, B, k2)
    _, c4 = _gen(ca, B, k3)
    adm = store.admit(B, [c4, c3])
    assert adm.refused and not adm.accepted  # c3's endorser (k2) is not pinned, nor in the answer
    adm = store.admit(B, [c4, c3, c2])
    assert {c.fingerprint for c in adm.accepted} == {c2.fingerprint, c3.fingerprint, c4.fingerprint}
    assert dict((c.fingerprint, h) for c, h in adm.pinned)[c2.fingerprint] == f"rollover endorsed by {c1.fingerprint}"
    assert store.refusals(B) == []  # refused before, pinned now
    # A certificate the CA issued with other keys: refused, and said once.
    _, evil = _gen(ca, B)
    adm = store.admit(B, [evil, c4])
    assert adm.accepted == [c4] and [c.fingerprint for c, _ in adm.new_refusals] == [evil.fingerprint]
    assert not store.admit(B, [evil, c4]).new_refusals
    # Endorsed by a key that is not pinned: refused too.
    stranger, _ = _gen(ca, "77000")
    _, forged = _gen_endorsed_elsewhere(ca, stranger)
    assert "not a pinned one" in store.admit(B, [forged]).refused[0][1]
    # The operator (another process: its own PinStore) accepts evil by a prefix.
    other = PinStore(tmp_path)
    with pytest.raises(TrustError, match="at least 8"):
        other.trust(B, "abc")
    with pytest.raises(TrustError, match="no refused certificate"):
        other.trust(B, "0" * 12)
    pin = other.trust(B, evil.fingerprint[:12])
    assert pin.fingerprint == evil.fingerprint and pin.how == "operator"
    assert store.changed()
    store.reload()
    assert evil.fingerprint in store.snapshot()[B]
    assert store.admit(B, [evil, c4]).accepted == [evil, c4]
    # Pinned ahead of first use, then forgotten.
    _, later = _gen(ca, "88000")
    assert other.trust("88000", later.fingerprint).how == "operator, before first use"
    store.reload()
    assert store.admit("88000", [later]).accepted == [later]  # not "first use": it was expected
    assert other.forget(B, evil.fingerprint[:10]).fingerprint == evil.fingerprint
    with pytest.raises(TrustError):
        other.forget(B, evil.fingerprint)
    # A damaged file is refused, never read as "nothing pinned".
    (tmp_path / "pins.json").write_text("{")
    with pytest.raises(TrustError, match="not readable"):
        PinStore(tmp_path)


def _gen_endorsed_elsewhere(ca: CertificateAuthority, stranger: NodeKeys) -> tuple[NodeKeys, NodeCertificate]:
    """A certificate of B whose endorsement is by a key that is not B's (a
    CA that copies anything could issue it; ours refuses: see test_crypto_pki)."""
    keys = NodeKeys.generate()
    e = endorse_rollover(stranger.signing_key, B, keys)
    cert = ca.issue_node_certificate(make_csr(keys, B), org=B)  # without the endorsement ...
    info = verify_node_certificate(cert, ca=ca.certificate, crl=None)
    return keys, dataclasses.replace(info, endorsement=e)  # ... carrying one as a forger would


def test_a_node_applies_only_newer_revocation_lists_and_keeps_them(tmp_path: Path) -> None:
    init_platform_pki(tmp_path / "P", "platform", [])
    csr = init_node_keys(tmp_path / A, A)
    _, cert = enroll(tmp_path / "P", csr, A, tmp_path / A / "issued.pem")
    import_certificate(tmp_path / A, cert, tmp_path / "P" / "ca" / "ca.pem")
    sec = NodeSecurity(tmp_path / A)
    ca = CertificateAuthority.load(tmp_path / "P" / "ca")
    now = dt.datetime.now(dt.UTC)
    older, newer = ca.crl(now=now), ca.crl(now=now + dt.timedelta(seconds=1))
    assert sec.apply_crl(newer.public_bytes(Encoding.DER))
    assert (tmp_path / A / "crl.pem").exists()
    assert not sec.apply_crl(older.public_bytes(Encoding.DER))  # the relay cannot bring back an older list
    assert not sec.apply_crl(newer.public_bytes(Encoding.DER))
    foreign = CertificateAuthority.create("Other CA").crl()
    with pytest.raises(CertificateError, match="not by the platform CA"):
        sec.apply_crl(foreign.public_bytes(Encoding.DER))
    stale = ca.crl(now=now - dt.timedelta(days=40))
    with pytest.raises(CertificateError, match="expired"):
        sec.apply_crl(stale.public_bytes(Encoding.DER))
    with pytest.raises(CertificateError, match="not DER"):
        sec.apply_crl(b"0\x82nonsense")
    assert NodeSecurity(tmp_path / A).directory.crl is not None  # loaded at the next start


def test_the_platform_tells_an_unknown_organization_from_one_without_a_certificate(tmp_path: Path) -> None:
    init_platform_pki(tmp_path / "P", "platform", [])
    csr = init_node_keys(tmp_path / B, B)
    enroll(tmp_path / "P", csr, B, tmp_path / "b.pem")
    sec = PlatformSecurity(tmp_path / "P")
    ok = sec.cert_response(Endpoint.org(B))
    assert ok is not None and ok.code is ResultCode.OK and len(ok.certificates) == 1
    assert sec.cert_response(Endpoint.org("99999")) is None  # the caller answers UNKNOWN_TARGET
    assert not sec.changed()
    ca = CertificateAuthority.load(tmp_path / "P" / "ca")
    ca.issue_node_certificate(make_csr(NodeKeys.generate(), "77000"), org="77000",
                              not_before=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), days=30)
    ca.save(tmp_path / "P" / "ca")
    revoke(tmp_path / "P", B)
    assert sec.changed()
    sec.reload()
    revoked = sec.cert_response(Endpoint.org(B))
    assert revoked is not None and revoked.code is ResultCode.CERT_REVOKED
    expired = sec.cert_response(Endpoint.org("77000"))
    assert expired is not None and expired.code is ResultCode.AUTH_FAILED
    assert sec.revoked_orgs() == {B}


def test_a_restarted_node_uses_the_pinned_certificates_it_kept(tmp_path: Path) -> None:
    """certs/ORG.pem (kept when a certificate was accepted) is used from the
    next start when it still verifies and is pinned: a restarted node (a
    unit started again) verifies the first receipts it gets without asking
    the platform first. A kept certificate that is not pinned, or not the
    CA's, is not used."""
    from semq.identity.crypto import save_certificates

    init_platform_pki(tmp_path / "P", "platform", [])
    csr = init_node_keys(tmp_path / A, A)
    _, cert = enroll(tmp_path / "P", csr, A, tmp_path / A / "issued.pem")
    import_certificate(tmp_path / A, cert, tmp_path / "P" / "ca" / "ca.pem")
    ca = CertificateAuthority.load(tmp_path / "P" / "ca")
    _, b = _gen(ca, "56001")
    _, c = _gen(ca, "77000")
    certs = tmp_path / A / "certs"
    certs.mkdir()
    for org, info in (("56001", b), ("77000", c)):
        save_certificates(certs / f"{org}.pem", [x509.load_der_x509_certificate(info.der)])
    _, stranger = _gen(CertificateAuthority.create("Other CA"), "88000")
    save_certificates(certs / "88000.pem", [x509.load_der_x509_certificate(stranger.der)])
    PinStore(tmp_path / A).admit("56001", [b])  # only B's was accepted (pinned) here
    PinStore(tmp_path / A).admit("88000", [stranger])
    sec = NodeSecurity(tmp_path / A)
    assert [x.fingerprint for x in sec.certs("56001")] == [b.fingerprint]
    assert sec.certs("77000") == []  # kept, but never pinned here
    assert sec.certs("88000") == []  # pinned, but not issued by the platform's CA
