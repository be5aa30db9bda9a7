"""AS4 against implementations written by others, as real processes on
127.0.0.1 with certificates made here:

- peppol-py (PyPI; its own envelope, signature and xmlsec encryption)
  sends a UBL invoice to an endpoint process on SEMQ's adapter, and accepts
  the receipt; libxmlsec1 verifies that receipt's signature on its own;
- SEMQ's outbound message (``build``) is opened and verified by a receiver
  process on libxmlsec1, libxml2 and the standard library only, sharing no
  code with SEMQ's adapter or the as4 package it is built on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from semq.edge.as4 import AS4
from tests._procs import wait_until
from tests.edge._as4kit import INVOICE, AccessPoint, access_point, join, partner_of, split
from tests.edge._xmlsec_verify import NS, verify_signal

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


def _start(module: str, args: list[str], log: Path) -> Started:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    line = wait_until(lambda: next((ln for ln in log.read_text().splitlines() if ln.startswith("ready ")), None)
                      or (proc.poll() is not None and f"exited: {log.read_text()}"), 30, f"{module} to listen")
    assert line.startswith("ready "), line
    return Started(proc, int(line.split()[1]), log)


def _stop(started: Started) -> None:
    started.proc.terminate()
    try:
        started.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        started.proc.kill()
        started.proc.wait(timeout=10)


@dataclass
class World:
    dir: Path
    peppol: AccessPoint  # the peppol-py side
    semq: AccessPoint  # SEMQ's access point
    xmlsec1: Path

    def write(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    d = tmp_path_factory.mktemp("as4")
    shim = d / "xmlsec1"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT}/tests/edge/_xmlsec1_shim.py \"$@\"\n")
    shim.chmod(0o755)
    return World(d, access_point("POP000123"), access_point("POP000777"), shim)


@pytest.fixture
def endpoint(world: World, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Started, Path]]:
    """SEMQ's AS4 endpoint; it knows the peppol-py access point unless parametrized with False."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    partners = [] if not getattr(request, "param", True) else [{
        "id": world.peppol.party_id, "our_id": world.semq.party_id,
        "cert": world.write("peppol-cert.pem", world.peppol.cert_pem)}]
    config = {"cert": world.write("semq-cert.pem", world.semq.cert_pem),
              "key": world.write("semq-key.pem", world.semq.key_pem), "inbox": str(inbox), "partners": partners}
    (tmp_path / "endpoint.json").write_text(json.dumps(config))
    started = _start("tests.edge._as4_endpoint", [str(tmp_path / "endpoint.json")], tmp_path / "endpoint.log")
    try:
        yield started, inbox
    finally:
        _stop(started)


def _peppol_send(world: World, port: int) -> subprocess.CompletedProcess[str]:
    args = [f"http://127.0.0.1:{port}/as4", world.write("invoice.xml", INVOICE),
            world.write("peppol-key.pem", world.peppol.key_pem), world.write("peppol-cert.pem", world.peppol.cert_pem),
            world.write("semq-cert.pem", world.semq.cert_pem), str(world.xmlsec1)]
    return subprocess.run([sys.executable, "-m", "tests.edge._peppol_send", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_peppol_py_sends_an_invoice_and_accepts_semqs_receipt(world: World, endpoint) -> None:
    started, inbox = endpoint
    sent = _peppol_send(world, started.port)
    assert (sent.returncode, sent.stdout.strip()) == (0, "accepted"), sent.stdout + sent.stderr + started.log.read_text()
    [document] = inbox.glob("*.xml")
    content = document.read_bytes()
    assert b"StandardBusinessDocumentHeader" in content and b"<cbc:ID>INV-0042</cbc:ID>" in content
    assert b"0088:5790000435975" in content and b"0208:0123456789" in content
    # The receipt peppol-py accepted: libxmlsec1 verifies its signature on its own (peppol-py does not),
    # and it repeats the three references peppol-py signed.
    receipt = verify_signal(document.with_suffix(".receipt").read_bytes(), world.semq.cert_pem)
    refs = receipt.findall(".//{http://docs.oasis-open.org/ebxml-bp/ebbp-signals-2.0}"
                           "MessagePartNRInformation/{http://www.w3.org/2000/09/xmldsig#}Reference")
    uris = sorted(r.get("URI")[:4] for r in refs)
    assert uris == ["#bod", "#mes", "cid:"], uris  # peppol-py names them "body", "messaging", cid:...


@pytest.mark.parametrize("endpoint", [False], indirect=True)
def test_peppol_py_from_an_unknown_access_point_gets_semqs_ebms_error(world: World, endpoint) -> None:
    started, inbox = endpoint
    sent = _peppol_send(world, started.port)
    assert sent.returncode == 1, sent.stdout + sent.stderr
    assert sent.stdout.startswith("refused: Endpoint error: PartyInfo/From 'POP000123' is not a partner"), sent.stdout
    assert not list(inbox.glob("*.xml"))
    assert (inbox / "refusals.log").read_text().startswith("EBMS:0101 FailedAuthentication")


@pytest.fixture
def receiver(world: World, tmp_path: Path) -> Iterator[Started]:
    started = _start("tests.edge._xmlsec_receiver",
                     [world.write("semq-cert.pem", world.semq.cert_pem),
                      world.write("peppol-key.pem", world.peppol.key_pem)], tmp_path / "receiver.log")
    try:
        yield started
    finally:
        _stop(started)


def _post(port: int, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_semq_outbound_verified_by_libxmlsec1(world: World, receiver: Started) -> None:
    to_them = partner_of(world.semq, world.peppol)
    out = AS4.build("10008/1/1/1795329835412001", INVOICE, "application/xml", to_them, world.semq.keys)
    status, answer = _post(receiver.port, dict(out.headers), out.body)
    assert status == 200, answer
    seen = json.loads(answer)
    assert seen["message_id"] == out.message_id
    assert (seen["from"], seen["to"]) == (world.semq.party_id, world.peppol.party_id)
    assert seen["service"] == to_them.options["process"]
    assert seen["action"] == "busdox-docid-qns::" + to_them.options["document_type"]
    assert seen["properties"] == {"originalSender": "0088:5790000435975", "finalRecipient": "0208:0123456789"}
    assert seen["compression"] == {"MimeType": "application/xml", "CompressionType": "application/gzip"}
    assert seen["sbd_has_invoice"] is True

    # The same receiver refuses what it should: it is not a receiver that accepts anything.
    soap, cid, att = split(out.headers, out.body)
    for bad, why in [(join(soap.replace(b"0208:0123456789", b"0208:0123456780"), cid, att), "digest mismatch"),
                     (join(soap, cid, att[:-1] + bytes([att[-1] ^ 1])), "does not decrypt")]:
        status, answer = _post(receiver.port, *bad)
        assert status == 400 and why.encode() in answer, answer
    other = AS4.build("d/x", INVOICE, "application/xml", to_them, access_point("POP000778", 2048).keys)
    status, answer = _post(receiver.port, dict(other.headers), other.body)
    assert status == 400 and b"signature does not verify" in answer, answer
    assert NS["eb"]  # the namespace table the receiver reads with
