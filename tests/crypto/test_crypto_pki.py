"""PKI: CA, enrollment, node certificates, revocation, key files, directory."""

from __future__ import annotations

import datetime as dt
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from semq.identity.crypto import (
    CertificateAuthority,
    CertificateDirectory,
    CertificateError,
    CertificateExpired,
    CertificateRevoked,
    KeyFileError,
    NodeIdentity,
    NodeKeys,
    UnknownCertificate,
    certificate_org,
    check_private_key_permissions,
    endorse_rollover,
    expiring_within,
    load_certificate,
    load_crl,
    load_csr,
    load_private_key,
    make_csr,
    save_certificate,
    save_crl,
    save_csr,
    save_private_key,
    verify_crl,
    verify_node_certificate,
)
from semq.identity.crypto._pki import SEMQ_ROLLOVER_OID, SEMQ_X25519_OID
from semq.umxt_protocol import CertResponse, Endpoint, NodeType, ResultCode

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create("Test CA")


def enroll(ca: CertificateAuthority, org: str, **kw: object) -> tuple[NodeKeys, x509.Certificate]:
    keys = NodeKeys.generate()
    return keys, ca.issue_node_certificate(make_csr(keys, org), **kw)  # type: ignore[arg-type]


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.DER)


# ---------------------------------------------------------------- issuing and verifying


def test_node_certificate_names_org_and_both_keys(ca: CertificateAuthority) -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    keys, cert = enroll(ca, "56001")
    info = verify_node_certificate(cert, ca=ca.certificate, crl=ca.crl())
    assert info.org == "56001" == certificate_org(cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "56001"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["semq:org:56001"]
    assert info.signing_key_id == keys.signing_key_id
    assert info.encryption_key_id == keys.encryption_key_id
    assert info.endpoint == Endpoint.org("56001")
    assert not cert.extensions.get_extension_for_oid(SEMQ_X25519_OID).critical
    # default validity: one year
    assert dt.timedelta(days=365) <= info.not_after - before <= dt.timedelta(days=365, seconds=5)
    assert NodeIdentity(keys, info).org == "56001"
    assert "56001" in info.describe()


def test_verify_accepts_der(ca: CertificateAuthority) -> None:
    _, cert = enroll(ca, "org-a")
    assert verify_node_certificate(der(cert), ca=ca.certificate, crl=None).org == "org-a"


def test_configurable_validity(ca: CertificateAuthority) -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    _, cert = enroll(ca, "56001", days=30)
    assert dt.timedelta(days=30) <= cert.not_valid_after_utc - before <= dt.timedelta(
        days=30, seconds=5)


def test_other_ca_refused(ca: CertificateAuthority) -> None:
    other = CertificateAuthority.create("Evil CA")
    _, cert = enroll(other, "56001")
    with pytest.raises(CertificateError, match=r"issued by 'CN=Evil CA', not by the platform CA 'CN=Test CA'") as e:
        verify_node_certificate(cert, ca=ca.certificate, crl=None)
    assert e.value.code is ResultCode.AUTH_FAILED


def test_same_name_other_key_refused(ca: CertificateAuthority) -> None:
    impostor = CertificateAuthority.create("Test CA")  # same subject, other key
    _, cert = enroll(impostor, "56001")
    with pytest.raises(CertificateError, match="signature that does not verify"):
        verify_node_certificate(cert, ca=ca.certificate, crl=None)


def test_expired_and_not_yet_valid(ca: CertificateAuthority) -> None:
    _, old = enroll(ca, "56001", not_before=dt.datetime(2025, 1, 1, tzinfo=dt.UTC), days=365)
    with pytest.raises(CertificateExpired,
                       match=r"certificate for org 56001 \(serial 0x[0-9a-f]+\) expired on 2026-01-01T00:00:00Z"):
        verify_node_certificate(old, ca=ca.certificate, crl=None)
    _, future = enroll(ca, "56001", not_before=NOW + dt.timedelta(days=2))
    with pytest.raises(CertificateExpired, match="is not valid before"):
        verify_node_certificate(future, ca=ca.certificate, crl=None)
    # verification at a given time
    at = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    ca_old = CertificateAuthority.create("Old CA", now=dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
    _, c = enroll(ca_old, "56001", not_before=dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    assert verify_node_certificate(c, ca=ca_old.certificate, crl=None, at=at).org == "56001"


def test_certificate_never_outlives_ca() -> None:
    short = CertificateAuthority.create("Short CA", days=10)
    _, cert = enroll(short, "x")
    assert cert.not_valid_after_utc == short.certificate.not_valid_after_utc


def test_revoke_org_and_serial() -> None:
    ca = CertificateAuthority.create("Revoking CA")
    _, a1 = enroll(ca, "A")
    _, a2 = enroll(ca, "A")
    _, b = enroll(ca, "B")
    assert sorted(ca.revoke("A")) == sorted([a1.serial_number, a2.serial_number])
    crl = ca.crl()
    for cert in (a1, a2):
        with pytest.raises(CertificateRevoked, match=r"org A .* was revoked on") as e:
            verify_node_certificate(cert, ca=ca.certificate, crl=crl)
        assert e.value.code is ResultCode.CERT_REVOKED
    assert verify_node_certificate(b, ca=ca.certificate, crl=crl).org == "B"
    ca.revoke(b.serial_number)
    with pytest.raises(CertificateRevoked):
        verify_node_certificate(b, ca=ca.certificate, crl=ca.crl())
    with pytest.raises(CertificateError, match="no certificate was issued to org 'C'"):
        ca.revoke("C")
    with pytest.raises(CertificateError, match="no certificate with serial 0x5"):
        ca.revoke(5)


def test_crl_must_be_signed_by_ca_and_fresh(ca: CertificateAuthority) -> None:
    other = CertificateAuthority.create("Test CA")  # same name, other key
    with pytest.raises(CertificateError, match="signature does not verify"):
        verify_crl(other.crl(), ca=ca.certificate)
    stranger = CertificateAuthority.create("Stranger")
    with pytest.raises(CertificateError, match="issued by 'CN=Stranger'"):
        verify_crl(stranger.crl(), ca=ca.certificate)
    stale = ca.crl(now=NOW - dt.timedelta(days=40), days=30)
    with pytest.raises(CertificateError, match="revocation list of CA 'CN=Test CA' expired on"):
        verify_crl(stale, ca=ca.certificate)
    _, cert = enroll(ca, "56001")
    with pytest.raises(CertificateError, match="expired on"):
        verify_node_certificate(cert, ca=ca.certificate, crl=stale)


def test_csr_checks(ca: CertificateAuthority) -> None:
    keys = NodeKeys.generate()
    csr = make_csr(keys, "56001")
    with pytest.raises(CertificateError, match="is for org '56001', not '56002'"):
        ca.issue_node_certificate(csr, org="56002")
    assert certificate_org(ca.issue_node_certificate(csr, org="56001")) == "56001"
    # a CSR without the X25519 key
    bare = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "56001")]))
        .add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier("semq:org:56001")]), critical=False)
        .sign(keys.signing_key, None)
    )
    with pytest.raises(CertificateError, match="no X25519 encryption key"):
        ca.issue_node_certificate(bare)
    # CN and SAN disagree
    mixed = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "56002")]))
        .add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier("semq:org:56001")]), critical=False)
        .sign(keys.signing_key, None)
    )
    with pytest.raises(CertificateError, match=r"subject CN \['56002'\] but SAN URI names org '56001'"):
        ca.issue_node_certificate(mixed)
    with pytest.raises(CertificateError, match="not a valid node id"):
        make_csr(keys, "bad org!")
    with pytest.raises(CertificateError, match="validity of 0 days"):
        ca.issue_node_certificate(csr, days=0)


def test_server_certificate_sans(ca: CertificateAuthority) -> None:
    _, cert = ca.issue_server_certificate(names=["relay.example", "10.0.0.7"])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    assert ips == {"127.0.0.1", "::1", "10.0.0.7"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "relay.example"}
    with pytest.raises(CertificateError):  # not a node certificate
        verify_node_certificate(cert, ca=ca.certificate, crl=None)


def test_identity_must_match_keys(ca: CertificateAuthority) -> None:
    _, cert = enroll(ca, "56001")
    info = verify_node_certificate(cert, ca=ca.certificate, crl=None)
    with pytest.raises(CertificateError, match="not this node's keys"):
        NodeIdentity(NodeKeys.generate(), info)


def test_expiring_within(ca: CertificateAuthority) -> None:
    _, cert = enroll(ca, "56001", days=20)
    assert expiring_within(cert, 30)
    assert not expiring_within(cert, 10)
    info = verify_node_certificate(cert, ca=ca.certificate, crl=None)
    assert expiring_within(info, 21) and not expiring_within(info, 19)


# ---------------------------------------------------------------- files and permissions


def test_private_key_files_are_owner_only(tmp_path: Path) -> None:
    keys = NodeKeys.generate()
    d = tmp_path / "new" / "keys"
    keys.save(d / "node.sign.pem", d / "node.enc.pem")
    for p in (d / "node.sign.pem", d / "node.enc.pem"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    back = NodeKeys.load(d / "node.sign.pem", d / "node.enc.pem")
    assert back.signing_key_id == keys.signing_key_id
    assert back.encryption_key_id == keys.encryption_key_id
    assert not list(d.glob(".*tmp"))


def test_world_readable_key_refused(tmp_path: Path) -> None:
    p = save_private_key(tmp_path / "key.pem", ed25519.Ed25519PrivateKey.generate())
    os.chmod(p, 0o644)
    msg = f"key file {p} is readable by group/others (mode 0644); run chmod 600 {p}"
    with pytest.raises(KeyFileError) as e:
        check_private_key_permissions(p)
    assert str(e.value) == msg
    with pytest.raises(KeyFileError, match="mode 0644"):
        load_private_key(p)
    os.chmod(p, 0o620)
    with pytest.raises(KeyFileError, match=r"writable by group/others \(mode 0620\)"):
        check_private_key_permissions(p)
    os.chmod(p, 0o600)
    check_private_key_permissions(p)
    assert isinstance(load_private_key(p), ed25519.Ed25519PrivateKey)
    with pytest.raises(KeyFileError, match="does not exist"):
        check_private_key_permissions(tmp_path / "missing.pem")


def test_node_identity_load(tmp_path: Path, ca: CertificateAuthority) -> None:
    keys, cert = enroll(ca, "56001")
    keys.save(tmp_path / "k" / "sign.pem", tmp_path / "k" / "enc.pem")
    save_certificate(tmp_path / "node.pem", cert)
    me = NodeIdentity.load(tmp_path / "node.pem", tmp_path / "k" / "sign.pem",
                           tmp_path / "k" / "enc.pem", ca=ca.certificate, crl=ca.crl())
    assert me.org == "56001" and me.keys.signing_key_id == keys.signing_key_id
    os.chmod(tmp_path / "k" / "enc.pem", 0o604)
    with pytest.raises(KeyFileError, match=r"enc\.pem is readable by group/others \(mode 0604\)"):
        NodeIdentity.load(tmp_path / "node.pem", tmp_path / "k" / "sign.pem",
                          tmp_path / "k" / "enc.pem", ca=ca.certificate)


def test_wrong_key_types_and_passphrase(tmp_path: Path) -> None:
    sk = tmp_path / "s.pem"
    ek = tmp_path / "e.pem"
    save_private_key(sk, x25519.X25519PrivateKey.generate())
    save_private_key(ek, x25519.X25519PrivateKey.generate())
    with pytest.raises(KeyFileError, match="not an Ed25519 signing key"):
        NodeKeys.load(sk, ek)
    enc = save_private_key(tmp_path / "p.pem", ed25519.Ed25519PrivateKey.generate(),
                           passphrase=b"secret")
    assert load_private_key(enc, passphrase=b"secret")
    with pytest.raises(KeyFileError, match="not a readable PEM private key"):
        load_private_key(enc, passphrase=b"wrong")


def test_public_files_round_trip(tmp_path: Path, ca: CertificateAuthority) -> None:
    keys = NodeKeys.generate()
    csr = make_csr(keys, "56001")
    save_csr(tmp_path / "n.csr", csr)
    cert = ca.issue_node_certificate(load_csr(tmp_path / "n.csr"))
    save_certificate(tmp_path / "n.pem", cert)
    save_crl(tmp_path / "crl.pem", ca.crl())
    assert load_certificate(tmp_path / "n.pem") == cert
    verify_crl(load_crl(tmp_path / "crl.pem"), ca=ca.certificate)
    (tmp_path / "junk.pem").write_text("nope")
    with pytest.raises(CertificateError, match=r"junk\.pem is not PEM certificates"):
        load_certificate(tmp_path / "junk.pem")


def test_ca_save_load(tmp_path: Path) -> None:
    ca = CertificateAuthority.create("Persisted CA")
    _, a = enroll(ca, "A")
    _, b = enroll(ca, "B")
    ca.revoke("A")
    d = tmp_path / "ca"
    ca.save(d)
    assert stat.S_IMODE((d / "ca.key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    back = CertificateAuthority.load(d)
    assert back.certificate == ca.certificate
    assert set(back.issued) == {a.serial_number, b.serial_number}
    assert set(back.revoked) == {a.serial_number}
    with pytest.raises(CertificateRevoked):
        verify_node_certificate(a, ca=back.certificate, crl=back.crl())
    # the reloaded CA keeps issuing
    _, c = enroll(back, "C")
    assert verify_node_certificate(c, ca=ca.certificate, crl=back.crl()).org == "C"
    os.chmod(d / "ca.key.pem", 0o640)
    with pytest.raises(KeyFileError, match=r"ca\.key\.pem is readable by group/others"):
        CertificateAuthority.load(d)


# ---------------------------------------------------------------- directory


def test_directory_rollover_and_lookup() -> None:
    ca = CertificateAuthority.create("Dir CA")
    _, old = enroll(ca, "B", not_before=NOW - dt.timedelta(days=300))
    _, new = enroll(ca, "B")
    d = CertificateDirectory(ca.certificate, ca.crl())
    d.add(old)
    d.add(der(new))
    got = d.lookup(Endpoint.org("B"))
    assert [c.serial for c in got] == [new.serial_number, old.serial_number]  # newest first
    assert d.orgs() == ["B"]
    assert [c.serial for c in d.expiring(70)] == [old.serial_number]
    with pytest.raises(UnknownCertificate, match="no certificate is known for org C") as e:
        d.lookup("C")
    assert e.value.code is ResultCode.UNKNOWN_CERTIFICATE
    with pytest.raises(UnknownCertificate, match="not an organization"):
        d.lookup(Endpoint.platform())
    # revocation applies at lookup time once the directory has the new CRL
    ca.revoke(old.serial_number)
    d.set_crl(ca.crl())
    assert [c.serial for c in d.lookup("B")] == [new.serial_number]
    ca.revoke("B")
    d.set_crl(ca.crl())
    with pytest.raises(CertificateRevoked, match="org B"):
        d.lookup("B")
    assert d.cert_response(Endpoint.org("B")).code is ResultCode.CERT_REVOKED


def test_directory_expiry_at_lookup_time() -> None:
    ca = CertificateAuthority.create("Clock CA")
    _, cert = enroll(ca, "B", days=10)
    # The clock starts now, not at the module's NOW: the CA is valid from its
    # creation minus CLOCK_SKEW, and a long suite reaches this test later.
    start = dt.datetime.now(dt.UTC)
    now = [start]
    d = CertificateDirectory(ca.certificate, None, clock=lambda: now[0])
    d.add(cert)
    assert d.lookup("B")
    now[0] = start + dt.timedelta(days=11)
    with pytest.raises(CertificateExpired, match=r"certificate for org B .* expired on"):
        d.lookup("B")
    assert len(d.certificates("B")) == 1


def test_directory_refuses_bad_certificates() -> None:
    ca = CertificateAuthority.create("Strict CA")
    other = CertificateAuthority.create("Other CA")
    _, foreign = enroll(other, "B")
    _, expired = enroll(ca, "B", not_before=NOW - dt.timedelta(days=400), days=30)
    d = CertificateDirectory(ca.certificate, ca.crl())
    errors = d.add_many([foreign, expired])
    assert [type(e) for e in errors] == [CertificateError, CertificateExpired]
    with pytest.raises(UnknownCertificate):
        d.lookup("B")


def test_cert_response_round_trip() -> None:
    ca = CertificateAuthority.create("Platform CA")
    _, b_old = enroll(ca, "B", not_before=NOW - dt.timedelta(days=100))
    _, b_new = enroll(ca, "B")
    enroll(ca, "C")
    ca.issue_server_certificate()
    platform = CertificateDirectory.from_authority(ca)
    assert platform.orgs() == ["B", "C"]
    resp = platform.cert_response(Endpoint.org("B"))
    assert resp.code is ResultCode.OK and len(resp.certificates) == 2
    node = CertificateDirectory(ca.certificate, ca.crl())
    got = node.apply_cert_response(resp)
    assert [c.serial for c in got] == [b_new.serial_number, b_old.serial_number]
    missing = platform.cert_response(Endpoint.org("Z"))
    assert missing.code is ResultCode.UNKNOWN_CERTIFICATE
    with pytest.raises(UnknownCertificate, match="platform has no certificate for organization:Z"):
        node.apply_cert_response(missing)
    # a relay that answers with another org's certificate is caught
    c_cert = platform.cert_response(Endpoint.org("C")).certificates
    forged = CertResponse(endpoint=Endpoint.org("B"), certificates=c_cert)
    with pytest.raises(CertificateError, match="answer for org B holds a certificate for org C"):
        node.apply_cert_response(forged)
    assert len(node.lookup("B")) == 2  # the old entries stay
    # a certificate the CA never issued is refused even if the relay serves it
    evil = CertificateAuthority.create("Platform CA")
    _, fake = enroll(evil, "B")
    fake_resp = CertResponse(endpoint=Endpoint(node_type=NodeType.ORGANIZATION, node_id="B"),
                             certificates=(der(fake),))
    with pytest.raises(CertificateError, match="does not verify"):
        node.apply_cert_response(fake_resp)


# ---------------------------------------------------------------- rollover endorsements


def test_rollover_endorsement_is_checked_by_the_ca_and_copied() -> None:
    """semq node rollover: the current key signs the next keys; the CA issues
    only if a current certificate of the organization holds that key, and
    copies the endorsement into the new certificate, where it verifies under
    the old key (what a node that pinned the old certificate checks)."""
    ca = CertificateAuthority.create("Rollover CA")
    old_keys, old = enroll(ca, "56001")
    new_keys = NodeKeys.generate()
    e = endorse_rollover(old_keys.signing_key, "56001", new_keys)
    assert e.signer_key_id == old_keys.signing_key_id and len(e.encode()) == 81
    cert = ca.issue_node_certificate(make_csr(new_keys, "56001", endorsement=e), org="56001")
    info = verify_node_certificate(cert, ca=ca.certificate, crl=ca.crl())
    assert info.endorsement == e
    assert info.endorsed_by(old_keys.signing_key.public_key())
    assert not info.endorsed_by(new_keys.signing_key.public_key())
    assert verify_node_certificate(old, ca=ca.certificate, crl=None).endorsement is None
    ext = cert.extensions.get_extension_for_oid(SEMQ_ROLLOVER_OID)
    assert not ext.critical
    # Another organization's key, or keys other than the request's: refused.
    other_keys, _ = enroll(ca, "77000")
    forged = endorse_rollover(other_keys.signing_key, "56001", new_keys)
    with pytest.raises(CertificateError, match="does not verify under any current certificate of org 56001"):
        ca.issue_node_certificate(make_csr(new_keys, "56001", endorsement=forged))
    elsewhere = endorse_rollover(old_keys.signing_key, "56001", NodeKeys.generate())
    with pytest.raises(CertificateError, match="rollover endorsement"):
        ca.issue_node_certificate(make_csr(new_keys, "56001", endorsement=elsewhere))
    # An endorsement is bound to its organization.
    assert not e.verifies(old_keys.signing_key.public_key(), "56002",
                                         info.signing_key_raw, info.encryption_key_raw)
    # A revoked key vouches for nothing (the new certificate is the one current).
    ca.revoke(old.serial_number)
    again = NodeKeys.generate()
    with pytest.raises(CertificateError, match=r"\(1 current\)"):
        ca.issue_node_certificate(make_csr(again, "56001",
                                           endorsement=endorse_rollover(old_keys.signing_key, "56001", again)))


def test_current_certificates_leave_out_revoked_and_expired() -> None:
    ca = CertificateAuthority.create("Current CA")
    _, expired = enroll(ca, "56001", not_before=NOW - dt.timedelta(days=400), days=30)
    _, revoked = enroll(ca, "56001")
    _, good = enroll(ca, "56001")
    ca.revoke(revoked.serial_number)
    assert [c.serial_number for c in ca.current_certificates("56001")] == [good.serial_number]
    assert ca.current_certificates("99999") == []
    assert expired.serial_number in {c.serial_number for c in ca.certificates_of("56001")}
