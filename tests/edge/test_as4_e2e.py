"""AS4 end to end with real ``semq`` nodes on 127.0.0.1: two nodes that
know each other only as AS4 (Peppol) partners exchange an invoice with
``semq send --to as4:ID``, confirmed by the signed receipt; a message
posted twice is delivered once and answered with the same receipt; a
stranger and a tampered message get the ebMS error with nothing stored; a
partner's ebMS error fails the document with its words; and peppol-py
sends an invoice to a node and accepts its receipt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semq.edge.as4 import AS4
from semq.edge.protocol import EdgePartner, OurKeys
from tests._procs import Cluster, free_port, set_config, wait_until
from tests.edge._as4kit import DOC_TYPE, INVOICE, PROCESS, access_point, join, split
from tests.edge._xmlsec_verify import verify_signal

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PEPPOL_IDS = ["--option", "sender=0088:5790000435975", "--option", "recipient=0208:0123456789",
              "--option", f"document_type={DOC_TYPE}", "--option", f"process={PROCESS}", "--option", "country=BE"]


def semq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "semq", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, int]]]:
    c = Cluster(tmp_path, security=False)
    ports = {"A": free_port(), "B": free_port()}
    for org, edge in (("56001", "A"), ("56002", "B")):
        d = c.add_org(org)
        set_config(d, edge_listen=f"127.0.0.1:{ports[edge]}")
        r = semq("partner", "cert", "--dir", str(d), "-q")
        assert r.returncode == 0, r.stderr
        (tmp_path / f"{edge}.pem").write_text(r.stdout)
    # Each node's edge certificate names its organization: that is its AS4 party id (To / From).
    for org, them, their_org in (("56001", "B", "56002"), ("56002", "A", "56001")):
        r = semq("partner", "add", "--dir", str(tmp_path / org), "--as4", their_org, "--url",
                 f"http://127.0.0.1:{ports[them]}/", "--cert", str(tmp_path / f"{them}.pem"), *PEPPOL_IDS)
        assert r.returncode == 0, r.stderr
    c.start_platform()
    c.start_node("56001")
    c.start_node("56002")
    try:
        yield c, ports
    finally:
        c.stop_all()


def _keys(c: Cluster, org: str) -> OurKeys:
    d = c.root / org / "edge"
    return OurKeys((d / "cert.pem").read_bytes(), (d / "key.pem").read_bytes())


def _b_as_seen_by_a(c: Cluster) -> EdgePartner:
    return EdgePartner("56002", "as4", "", _keys(c, "56002").cert_pem, "56001",
                       {"sender": "0088:5790000435975", "recipient": "0208:0123456789", "document_type": DOC_TYPE,
                        "process": PROCESS, "country": "BE"})


def test_an_invoice_goes_out_over_as4_and_is_confirmed_by_the_signed_receipt(
        pair: tuple[Cluster, dict[str, int]], tmp_path: Path) -> None:
    c, _ = pair
    f = tmp_path / "invoice.xml"
    f.write_bytes(INVOICE)
    r = semq("send", "--dir", str(c.root / "56001"), "--to", "as4:56002", "--type", "application/xml", str(f))
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    wait_until(lambda: c.q("56001", "SELECT state FROM edge_out WHERE doc_key=?", key) == [(4,)], 30,
               "the AS4 receipt to confirm it")
    (msg_id, proof, tries), = c.q("56001", "SELECT message_id, proof, tries FROM edge_out WHERE doc_key=?", key)
    assert tries == 1 and msg_id == f"{key}@semq" and b"NonRepudiationInformation" in proof
    verify_signal(proof, _keys(c, "56002").cert_pem)  # the proof kept verifies on its own (libxmlsec1)
    [(origin, data_type, content)] = c.q("56002", "SELECT origin_id, data_type, app_data FROM inbox")
    assert (origin, data_type) == ("as4:56001", "application/xml")
    assert b"StandardBusinessDocumentHeader" in content and b"<cbc:ID>INV-0042</cbc:ID>" in content
    r = semq("partner", "list", "--dir", str(c.root / "56001"), "--json")
    assert '"confirmed": 1' in r.stdout and '"backlog": 0' in r.stdout


def test_a_message_posted_twice_is_delivered_once_with_the_same_receipt(
        pair: tuple[Cluster, dict[str, int]]) -> None:
    c, ports = pair
    b = _b_as_seen_by_a(c)
    out = AS4.build("replayed-1", INVOICE, "application/xml", b, _keys(c, "56001"))
    url = f"http://127.0.0.1:{ports['B']}/"
    first = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=30)
    second = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=30)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and b"NonRepudiationInformation" in first.content
    assert AS4.read_receipt(200, dict(first.headers), first.content, out, b, _keys(c, "56001")).ok
    assert c.count("56002", "SELECT count(*) FROM inbox") == 1
    assert c.count("56002", "SELECT count(*) FROM edge_in") == 1


def test_strangers_and_tampering_get_the_ebms_error_and_nothing_is_stored(
        pair: tuple[Cluster, dict[str, int]]) -> None:
    c, ports = pair
    url = f"http://127.0.0.1:{ports['B']}/"
    b = _b_as_seen_by_a(c)
    mallory = access_point("56001")  # claims to be A, with its own key
    out = AS4.build("x1", INVOICE, "application/xml", b, mallory.keys)
    r = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=30)
    assert r.status_code == 500 and b'errorCode="EBMS:0101"' in r.content
    out = AS4.build("x2", INVOICE, "application/xml", b, _keys(c, "56001"))
    soap, cid, att = split(out.headers, out.body)
    r = httpx.post(url, **dict(zip(("headers", "content"), join(soap, cid, att[:-1] + b"\x00"), strict=True)),
                   timeout=30)
    assert r.status_code == 500 and b'errorCode="EBMS:0102"' in r.content
    bomb = b'<!DOCTYPE S12:Envelope [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
    r = httpx.post(url, **dict(zip(("headers", "content"), join(bomb + soap, cid, att), strict=True)), timeout=30)
    assert r.status_code == 500 and b'errorCode="EBMS:0009"' in r.content
    assert c.count("56002", "SELECT count(*) FROM inbox") == 0
    assert c.count("56002", "SELECT count(*) FROM edge_in") == 0


def test_the_partners_ebms_error_fails_the_document_with_its_words(
        pair: tuple[Cluster, dict[str, int]], tmp_path: Path) -> None:
    c, ports = pair
    d = str(c.root / "56002")
    assert semq("partner", "remove", "--dir", d, "as4:56001", "-q").returncode == 0
    assert semq("partner", "add", "--dir", d, "--as4", "56001", "--url", f"http://127.0.0.1:{ports['A']}/",
                "--cert", str(tmp_path / "A.pem"), "--option", "participants=0208:1111111111", "-q").returncode == 0
    f = tmp_path / "invoice.xml"
    f.write_bytes(INVOICE)
    key = semq("send", "--dir", str(c.root / "56001"), "--to", "as4:56002", "--type", "application/xml",
               str(f)).stdout.strip()
    wait_until(lambda: c.q("56001", "SELECT state FROM edge_out WHERE doc_key=?", key) == [(9,)], 30,
               "the partner's ebMS error")
    (reason, proof), = c.q("56001", "SELECT reason, proof FROM edge_out WHERE doc_key=?", key)
    assert reason == "the partner refused the message: EBMS:0004 Other: PEPPOL:NOT_SERVICED"
    assert b'errorCode="EBMS:0004"' in proof
    assert c.count("56002", "SELECT count(*) FROM inbox") == 0


def test_peppol_py_sends_an_invoice_to_a_node(pair: tuple[Cluster, dict[str, int]], tmp_path: Path) -> None:
    c, ports = pair
    peppol = access_point("POP000123")
    (tmp_path / "peppol-cert.pem").write_bytes(peppol.cert_pem)
    (tmp_path / "peppol-key.pem").write_bytes(peppol.key_pem)
    (tmp_path / "invoice.xml").write_bytes(INVOICE)
    shim = tmp_path / "xmlsec1"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT}/tests/edge/_xmlsec1_shim.py \"$@\"\n")
    shim.chmod(0o755)
    d = str(c.root / "56002")
    assert semq("partner", "add", "--dir", d, "--as4", "POP000123", "--url", "http://127.0.0.1:9/",
                "--cert", str(tmp_path / "peppol-cert.pem"), "-q").returncode == 0
    sent = subprocess.run(
        [sys.executable, "-m", "tests.edge._peppol_send", f"http://127.0.0.1:{ports['B']}/",
         str(tmp_path / "invoice.xml"), str(tmp_path / "peppol-key.pem"), str(tmp_path / "peppol-cert.pem"),
         str(tmp_path / "B.pem"), str(shim)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (sent.returncode, sent.stdout.strip()) == (0, "accepted"), sent.stdout + sent.stderr
    [(origin, content)] = c.q("56002", "SELECT origin_id, app_data FROM inbox")
    assert origin == "as4:POP000123" and b"<cbc:ID>INV-0042</cbc:ID>" in content


def test_a_nodes_outbound_as4_is_verified_by_an_independent_receiver(
        pair: tuple[Cluster, dict[str, int]], tmp_path: Path) -> None:
    """``semq send`` from a real node, its edge sender's POST, received by
    a process on libxmlsec1 / libxml2 / the standard library only
    (tests/edge/_xmlsec_receiver.py), which verifies and opens it. It sends
    no AS4 receipt, so the node keeps the document queued, same message id."""
    c, _ = pair
    them = access_point("POP000321")
    (tmp_path / "them-cert.pem").write_bytes(them.cert_pem)
    (tmp_path / "them-key.pem").write_bytes(them.key_pem)
    verdicts = tmp_path / "verdicts.jsonl"
    log = tmp_path / "receiver.log"
    proc = subprocess.Popen([sys.executable, "-m", "tests.edge._xmlsec_receiver", str(tmp_path / "A.pem"),
                             str(tmp_path / "them-key.pem"), str(verdicts)], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = wait_until(lambda: next((ln for ln in log.read_text().splitlines() if ln.startswith("ready ")), None),
                          30, "the receiver to listen")
        d = str(c.root / "56001")
        assert semq("partner", "add", "--dir", d, "--as4", "POP000321", "--url",
                    f"http://127.0.0.1:{line.split()[1]}/", "--cert", str(tmp_path / "them-cert.pem"), "-q",
                    *PEPPOL_IDS).returncode == 0
        f = tmp_path / "invoice.xml"
        f.write_bytes(INVOICE)
        key = semq("send", "--dir", d, "--to", "as4:POP000321", "--type", "application/xml", str(f)).stdout.strip()
        wait_until(lambda: verdicts.exists() and verdicts.read_text(), 30, "the receiver's verdict")
        verdict = json.loads(verdicts.read_text().splitlines()[0])
        assert verdict["status"] == 200, verdict
        seen = json.loads(verdict["answer"])
        assert (seen["message_id"], seen["from"], seen["to"]) == (f"{key}@semq", "56001", "POP000321")
        assert seen["sbd_has_invoice"] is True
        wait_until(lambda: c.q("56001", "SELECT tries, state, message_id FROM edge_out WHERE doc_key=?", key)
                   == [(1, 0, f"{key}@semq")], 30, "the try without a receipt to be counted")
        (reason,), = c.q("56001", "SELECT reason FROM edge_out WHERE doc_key=?", key)
        assert "not a verified ebMS signal" in reason
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bad_as4_options_say_one_line_and_store_nothing(tmp_path: Path) -> None:
    c = Cluster(tmp_path, security=False)
    d = str(c.add_org("56001"))
    cert = tmp_path / "p.pem"
    cert.write_bytes(access_point("P", 1024).cert_pem)
    for option, words in (("country=Belgium", "two-letter country code"), ("colour=red", "unknown AS4 option"),
                          ("max_bytes=0", "max_bytes '0'"), ("document_type=x", "busdox-docid-qns")):
        r = semq("partner", "add", "--dir", d, "--as4", "P", "--url", "http://x/", "--cert", str(cert),
                 "--option", option)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    ec_cert = tmp_path / "ec.pem"
    ec_cert.write_bytes(subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
         str(tmp_path / "ec.key"), "-subj", "/CN=P", "-days", "1"], capture_output=True, timeout=60).stdout)
    r = semq("partner", "add", "--dir", d, "--as4", "P", "--url", "http://x/", "--cert", str(ec_cert))
    assert r.returncode == 2 and "its key is not RSA" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert c.count("56001", "SELECT count(*) FROM edge_partners") == 0
