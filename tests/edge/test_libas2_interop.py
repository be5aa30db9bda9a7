"""Interop with an AS2 implementation written by others: the Node.js
library ``libas2`` 0.8.2 (npm), as a real partner process on 127.0.0.1 with
certificates made by the test (docs/interop.md, "libas2").

- SEMQ to libas2: ``semq send --to as2:LIBAS2`` (signed, encrypted) reaches
  libas2's server, which answers a signed MDN; SEMQ confirms the document
  only once that MDN verifies and returns the MIC it sent.
- libas2 to SEMQ: libas2's client sends a signed message encrypted with
  RSAES-OAEP (SHA-512) key transport; SEMQ puts it in the inbox and answers
  a signed MDN, which OpenSSL verifies and which names libas2's MIC.

libas2 is installed from the npm registry into a cache the tests own
(``~/.cache/semq-tests/libas2``), once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.edge.mime import split_entity
from tests._procs import Cluster, free_port, set_config, wait_until
from tests.edge.certs import make_keys

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SEMQ_TEST_CACHE", Path.home() / ".cache" / "semq-tests")) / "libas2-0.8.2"
DOC = b"UNB+UNOC:3+LIBAS2+SEMQ+261208:0900+7'\r\nUNH+1+INVOIC:D:96A:UN'\r\nUNZ+1+7'\r\n"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed for the libas2 partner")
    mods = CACHE / "node_modules"
    if not (mods / "libas2" / "package.json").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), "libas2@0.8.2"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"npm could not install libas2: {r.stderr[-300:]}")
    return mods


def _semq(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "semq", *args], capture_output=True, input=stdin, timeout=60)


@pytest.fixture(params=["unsigned"])
def world(request: pytest.FixtureRequest, tmp_path: Path, node_modules: Path) -> Iterator[dict[str, object]]:
    c = Cluster(tmp_path, security=False)
    edge_port, lib_port = free_port(), free_port()
    d = c.add_org("56001")
    set_config(d, edge_listen=f"127.0.0.1:{edge_port}")
    r = _semq("partner", "cert", "--dir", str(d), "-q")
    assert r.returncode == 0, r.stderr
    (tmp_path / "semq.pem").write_bytes(r.stdout)
    lib = make_keys("LIBAS2")
    (tmp_path / "lib.pem").write_bytes(lib.cert_pem)
    (tmp_path / "lib.key").write_bytes(lib.key_pem)
    # libas2 on Node.js 20 opens only RSAES-OAEP key transport (PKCS#1 v1.5 private decryption is
    # refused since CVE-2023-46809) and only a base64 body (a binary one fails in its parser)
    r = _semq("partner", "add", "--dir", str(d), "--as2", "LIBAS2", "--url", f"http://127.0.0.1:{lib_port}/",
              "--cert", str(tmp_path / "lib.pem"), "--our-id", "SEMQ-A", "--option", "key_transport=rsa-oaep",
              "--option", "encoding=base64", "--mdn", request.param, "-q")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "libas2-out"
    out.mkdir()
    cfg = {"port": lib_port, "outdir": str(out), "url": f"http://127.0.0.1:{edge_port}/", "hostId": "LIBAS2",
           "hostCert": str(tmp_path / "lib.pem"), "hostKey": str(tmp_path / "lib.key"), "partnerId": "SEMQ-A",
           "partnerCert": str(tmp_path / "semq.pem"), "mdnSigned": request.param == "signed"}
    (tmp_path / "libas2.json").write_text(json.dumps(cfg))
    env = {**os.environ, "NODE_PATH": str(node_modules)}
    log = (tmp_path / "libas2.log").open("wb")
    server = subprocess.Popen(["node", str(HERE / "libas2" / "partner.js"), "server", str(tmp_path / "libas2.json")],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    c.start_platform()
    c.start_node("56001")
    try:
        wait_until(lambda: b"listening" in (tmp_path / "libas2.log").read_bytes() or server.poll() is not None, 20,
                   "the libas2 partner to listen")
        assert server.poll() is None, (tmp_path / "libas2.log").read_text()
        yield {"mdn": request.param, "cluster": c, "dir": d, "out": out, "env": env, "cfg": tmp_path / "libas2.json", "tmp": tmp_path}
    finally:
        server.kill()
        server.wait(timeout=20)
        log.close()
        c.stop_all()


def test_semq_sends_to_libas2_and_its_signed_mdn_confirms_the_document(world: dict[str, object]) -> None:
    c, d, out = world["cluster"], world["dir"], world["out"]
    assert isinstance(c, Cluster) and isinstance(d, Path) and isinstance(out, Path)
    r = _semq("send", "--dir", str(d), "--to", "as2:LIBAS2", "--type", "application/edifact", "-", stdin=DOC)
    assert r.returncode == 0, r.stderr
    key = r.stdout.decode().strip()
    wait_until(lambda: c.q("56001", "SELECT state FROM edge_out WHERE doc_key=?", key)[0][0] in (4, 9), 30,
               f"libas2's MDN ({(Path(str(world['tmp'])) / 'libas2.log').read_text()[-500:]})")
    (state, reason, digest, proof), = c.q("56001", "SELECT state, reason, digest, proof FROM edge_out WHERE doc_key=?",
                                          key)
    assert state == 4, reason
    # libas2 0.8.2 hands its application the part with the line break before the
    # closing delimiter (RFC 2046: that break belongs to the delimiter); its MIC,
    # below, is over the right bytes
    got_doc = (out / "doc-1.bin").read_bytes()
    assert got_doc in (DOC, DOC + b"\r\n")
    got = json.loads((out / "doc-1.json").read_text())
    assert key in got["messageId"] and got["from"] == "SEMQ-A"
    assert got["mic"]["mic"] == digest.split(",")[0]
    assert b"disposition-notification" in proof


@pytest.mark.parametrize("world", ["signed"], indirect=True)
def test_libas2s_signed_mdn_does_not_verify_so_semq_does_not_confirm(world: dict[str, object]) -> None:
    """libas2 0.8.2 signs its MDNs over other bytes than it sends (OpenSSL
    finds the same digest failure): SEMQ takes no such MDN as proof, sends
    the document again with the same message id, and says why."""
    c, d, out = world["cluster"], world["dir"], world["out"]
    assert isinstance(c, Cluster) and isinstance(d, Path) and isinstance(out, Path)
    r = _semq("send", "--dir", str(d), "--to", "as2:LIBAS2", "--type", "application/edifact", "-", stdin=DOC)
    key = r.stdout.decode().strip()
    wait_until(lambda: c.q("56001", "SELECT tries, state FROM edge_out WHERE doc_key=?", key)[0][0] >= 2, 30,
               "a second try")
    (state, reason, proof), = c.q("56001", "SELECT state, reason, proof FROM edge_out WHERE doc_key=?", key)
    assert state in (0, 1) and proof is None and "digest differs" in reason
    assert (out / "doc-1.bin").read_bytes().startswith(DOC)  # libas2 did receive it
    ids = {json.loads(p.read_text())["messageId"] for p in out.glob("doc-*.json")}
    assert len(ids) == 1  # every try, the same message id


def test_libas2_sends_to_semq_and_checks_its_signed_mdn(world: dict[str, object]) -> None:
    c, env, tmp = world["cluster"], world["env"], Path(str(world["tmp"]))
    assert isinstance(c, Cluster) and isinstance(env, dict)
    (tmp / "invoice.edi").write_bytes(DOC)
    r = subprocess.run(["node", str(HERE / "libas2" / "partner.js"), "client", str(world["cfg"]),
                        str(tmp / "invoice.edi")], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["status"] == 200, res
    rows = c.q("56001", "SELECT origin_id, app_data FROM inbox")
    assert rows == [("as2:LIBAS2", DOC)]
    # SEMQ's MDN, verified by OpenSSL against SEMQ's edge certificate
    mdn = b"Content-Type: " + res["contentType"].encode() + b"\r\n\r\n" + res["mdn"].encode("latin-1")
    v = subprocess.run(["openssl", "cms", "-verify", "-noverify", "-certfile", str(tmp / "semq.pem")], input=mdn,
                       capture_output=True, timeout=30)
    assert v.returncode == 0, v.stderr
    fields = split_entity(v.stdout)[1]
    assert b"; processed" in fields and res["messageId"].encode() in fields
    (digest,), = c.q("56001", "SELECT digest FROM edge_in")
    assert digest.encode() in fields
    # and a resend gets the same MDN, not a second delivery
    assert c.count("56001", "SELECT count(*) FROM edge_in") == 1
