"""The edge end to end: two real ``semq`` nodes that know each other only as
AS2 partners (each one's edge listener on 127.0.0.1), a document sent with
``semq send --to as2:ID`` confirmed by the other's signed MDN; a message
posted twice delivered once with the same MDN bytes; hostile requests
refused with nothing stored; a negative MDN failing the document with the
partner's reason; an unreachable partner leaving it queued with its tries
counted and its message id kept."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semq.edge.as2 import AS2
from semq.edge.protocol import EdgePartner, OurKeys
from semq.edge.smime import compress
from semq.settings.bounds import EDGE_MAX_BODY
from tests._procs import Cluster, free_port, set_config, wait_until
from tests.edge.certs import make_keys

DOC = b"UNB+UNOC:3+SEMQA+SEMQB+261208:0900+1'\r\nUNZ+1+1'\r\n"


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
    for org, me, them in (("56001", "A", "B"), ("56002", "B", "A")):
        r = semq("partner", "add", "--dir", str(tmp_path / org), "--as2", f"SEMQ-{them}", "--url",
                 f"http://127.0.0.1:{ports[them]}/", "--cert", str(tmp_path / f"{them}.pem"), "--our-id", f"SEMQ-{me}")
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


def test_a_document_goes_out_over_as2_and_is_confirmed_by_the_signed_mdn(pair: tuple[Cluster, dict[str, int]],
                                                                       tmp_path: Path) -> None:
    c, _ = pair
    f = tmp_path / "invoice.edi"
    f.write_bytes(DOC)
    r = semq("send", "--dir", str(c.root / "56001"), "--to", "as2:SEMQ-B", "--type", "application/edifact", str(f))
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    wait_until(lambda: c.q("56001", "SELECT state FROM edge_out WHERE doc_key=?", key) == [(4,)], 20,
               "the MDN to confirm it")
    (msg_id, proof, tries), = c.q("56001", "SELECT message_id, proof, tries FROM edge_out WHERE doc_key=?", key)
    assert tries == 1 and b"disposition-notification" in proof and key in msg_id
    rows = c.q("56002", "SELECT origin_id, data_type, app_data FROM inbox")
    assert rows == [("as2:SEMQ-A", "application/edifact", DOC)]
    r = semq("partner", "list", "--dir", str(c.root / "56001"), "--json")
    assert '"confirmed": 1' in r.stdout and '"backlog": 0' in r.stdout


def test_a_message_posted_twice_is_delivered_once_with_the_same_mdn(pair: tuple[Cluster, dict[str, int]]) -> None:
    c, ports = pair
    b = EdgePartner("SEMQ-B", "as2", "", _keys(c, "56002").cert_pem, "SEMQ-A", {})
    out = AS2.build("replayed-1", DOC, "application/edifact", b, _keys(c, "56001"))
    url = f"http://127.0.0.1:{ports['B']}/"
    first = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=20)
    second = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=20)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and first.content
    assert AS2.read_receipt(200, dict(first.headers), first.content, out, b, _keys(c, "56001")).ok
    assert c.count("56002", "SELECT count(*) FROM inbox") == 1
    assert c.count("56002", "SELECT count(*) FROM edge_in") == 1


def test_hostile_requests_are_refused_and_nothing_is_stored(pair: tuple[Cluster, dict[str, int]]) -> None:
    c, ports = pair
    url = f"http://127.0.0.1:{ports['B']}/"
    b = EdgePartner("SEMQ-B", "as2", "", _keys(c, "56002").cert_pem, "SEMQ-A", {})
    # an unknown partner: HTTP 403
    stranger = EdgePartner("SEMQ-B", "as2", "", _keys(c, "56002").cert_pem, "MALLORY", {})
    out = AS2.build("x1", DOC, "text/plain", stranger, make_keys("mallory"))
    assert httpx.post(url, headers=dict(out.headers), content=out.body, timeout=20).status_code == 403
    # a known partner's name, another key: an MDN with an error disposition
    out = AS2.build("x2", DOC, "text/plain", b, make_keys("mallory"))
    r = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=20)
    assert r.status_code == 200 and b"authentication-failed" in r.content
    res = AS2.read_receipt(200, dict(r.headers), r.content, out, b, _keys(c, "56001"))
    assert not res.ok and "authentication-failed" in (res.reason or "")
    # not signed, not encrypted: the agreement requires both
    plain = EdgePartner("SEMQ-B", "as2", "", b.their_cert_pem, "SEMQ-A", {"sign": "none", "encrypt": "none"})
    out = AS2.build("x3", DOC, "text/plain", plain, _keys(c, "56001"))
    r = httpx.post(url, headers=dict(out.headers), content=out.body, timeout=20)
    assert b"insufficient-message-security" in r.content
    # a compression bomb (64 MiB of zeros in ~64 KiB), signed by the partner, encrypted to us
    bomb = compress(b"Content-Type: text/plain\r\n\r\n" + bytes(80 << 20))
    assert len(bomb) < 200_000
    h = dict(out.headers, **{"Content-Type": "application/pkcs7-mime; smime-type=compressed-data",
                             "Message-ID": "<bomb@x>"})
    r = httpx.post(url, headers=h, content=bomb, timeout=60)
    assert r.status_code == 200 and b"inflates past" in r.content
    # oversize: refused before it is parsed
    r = httpx.post(url, headers=dict(out.headers, **{"Message-ID": "<big@x>"}), content=bytes(EDGE_MAX_BODY + 1),
                   timeout=60)
    assert r.status_code == 413
    assert httpx.get(url, timeout=20).status_code == 405
    assert httpx.post(url, content=b"hello", timeout=20).status_code == 400
    assert c.count("56002", "SELECT count(*) FROM inbox") == 0
    assert c.count("56002", "SELECT count(*) FROM edge_in") == 0


def test_a_negative_mdn_fails_the_document_with_the_partners_reason(pair: tuple[Cluster, dict[str, int]],
                                                                   tmp_path: Path) -> None:
    c, ports = pair
    other = make_keys("not-a")
    (tmp_path / "other.pem").write_bytes(other.cert_pem)
    # B now knows SEMQ-A by another certificate: A's signatures no longer verify there
    d = str(c.root / "56002")
    assert semq("partner", "remove", "--dir", d, "as2:SEMQ-A", "-q").returncode == 0
    assert semq("partner", "add", "--dir", d, "--as2", "SEMQ-A", "--url", f"http://127.0.0.1:{ports['A']}/",
                "--cert", str(tmp_path / "other.pem"), "--our-id", "SEMQ-B", "-q").returncode == 0
    f = tmp_path / "doc"
    f.write_bytes(DOC)
    key = semq("send", "--dir", str(c.root / "56001"), "--to", "as2:SEMQ-B", str(f)).stdout.strip()
    wait_until(lambda: c.q("56001", "SELECT state FROM edge_out WHERE doc_key=?", key) == [(9,)], 20,
               "the negative MDN")
    (reason,), = c.q("56001", "SELECT reason FROM edge_out WHERE doc_key=?", key)
    assert "authentication-failed" in reason
    assert c.count("56002", "SELECT count(*) FROM inbox") == 0


def test_an_unreachable_partner_keeps_the_document_queued_with_its_message_id(
        pair: tuple[Cluster, dict[str, int]], tmp_path: Path) -> None:
    c, _ = pair
    d = str(c.root / "56001")
    assert semq("partner", "add", "--dir", d, "--as2", "GONE", "--url", f"http://127.0.0.1:{free_port()}/",
                "--cert", str(tmp_path / "B.pem"), "-q").returncode == 0
    r = subprocess.run([sys.executable, "-m", "semq", "send", "--dir", d, "--to", "as2:GONE", "--type", "text/plain",
                        "-"], input=b"hello", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    key = r.stdout.decode().strip()
    wait_until(lambda: c.q("56001", "SELECT tries, state FROM edge_out WHERE doc_key=?", key) == [(1, 0)], 20,
               "the first try to fail")
    (reason, msg_id), = c.q("56001", "SELECT reason, message_id FROM edge_out WHERE doc_key=?", key)
    assert "ConnectError" in reason and key in msg_id
    r2 = semq("partner", "remove", "--dir", d, "as2:GONE")
    assert r2.returncode == 2 and "waiting" in r2.stderr


def test_bad_partner_commands_say_one_line_and_store_nothing(tmp_path: Path) -> None:
    c = Cluster(tmp_path, security=False)
    d = str(c.add_org("56001"))
    (tmp_path / "junk.pem").write_text("junk")
    for args, words in (
        (["--as2", "X", "--url", "ftp://x/", "--cert", str(tmp_path / "junk.pem")], "--url"),
        (["--as2", "X", "--url", "http://x/", "--cert", str(tmp_path / "junk.pem")], "not a PEM certificate"),
        (["--url", "http://x/", "--cert", str(tmp_path / "junk.pem")], "--as2 ID or --as4 ID"),
    ):
        r = semq("partner", "add", "--dir", d, *args)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = semq("send", "--dir", d, "--to", "as2:NOBODY", "--type", "text/plain", str(tmp_path / "junk.pem"))
    assert r.returncode == 2 and "no partner of this node" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert c.count("56001", "SELECT count(*) FROM edge_partners") == 0
    assert c.count("56001", "SELECT count(*) FROM edge_out") == 0
