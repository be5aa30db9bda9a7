"""Mutual TLS 1.3 over trio.SSLStream on 127.0.0.1: a real handshake, and the
refusals at the handshake (another CA, expired, revoked, no certificate)."""

from __future__ import annotations

import datetime as dt
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from semq.identity.crypto import (
    CertificateAuthority,
    CertificateError,
    CertificateRevoked,
    KeyFileError,
    NodeKeys,
    client_ssl_context,
    make_csr,
    peer_certificate,
    peer_organization,
    save_certificate,
    save_crl,
    save_private_key,
    server_ssl_context,
)

NOW = dt.datetime.now(dt.UTC)


@dataclass
class Pki:
    ca: CertificateAuthority
    dir: Path

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def crl_file(self) -> Path:
        return self.dir / "crl.pem"

    def publish_crl(self) -> None:
        save_crl(self.crl_file, self.ca.crl())

    def server_context(self) -> ssl.SSLContext:
        key, cert = self.ca.issue_server_certificate()
        save_private_key(self.dir / "server.key.pem", key)
        save_certificate(self.dir / "server.pem", cert)
        return server_ssl_context(cert_file=self.dir / "server.pem",
                                  key_file=self.dir / "server.key.pem",
                                  ca_file=self.ca_file, crl_file=self.crl_file)

    def node(self, org: str, **kw: object) -> tuple[Path, Path, int]:
        keys = NodeKeys.generate()
        cert = self.ca.issue_node_certificate(make_csr(keys, org), **kw)  # type: ignore[arg-type]
        base = self.dir / f"{org}-{cert.serial_number:x}"
        keys.save(f"{base}.sign.pem", f"{base}.enc.pem")
        save_certificate(f"{base}.pem", cert)
        return Path(f"{base}.pem"), Path(f"{base}.sign.pem"), cert.serial_number

    def client_context(self, cert: Path, key: Path) -> ssl.SSLContext:
        return client_ssl_context(cert_file=cert, key_file=key, ca_file=self.ca_file,
                                  crl_file=self.crl_file)


def make_pki(path: Path, name: str = "Platform CA") -> Pki:
    pki = Pki(CertificateAuthority.create(name), path)
    path.mkdir(parents=True, exist_ok=True)
    save_certificate(pki.ca_file, pki.ca.certificate)
    pki.publish_crl()
    return pki


@dataclass
class Outcome:
    server_peer_der: bytes | None = None
    server_version: str | None = None
    server_error: BaseException | None = None
    client_error: BaseException | None = None
    client_got: bytes = b""


async def connect(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                  hostname: str = "127.0.0.1") -> Outcome:
    out = Outcome()
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]

    async def serve() -> None:
        tcp = await listener.accept()
        stream = trio.SSLStream(tcp, server_ctx, server_side=True)
        try:
            await stream.do_handshake()
            out.server_peer_der = stream.getpeercert(binary_form=True)
            out.server_version = stream.version()
            assert await stream.receive_some(100) == b"hello"
            await stream.send_all(b"welcome")
        except trio.BrokenResourceError as e:
            out.server_error = e.__cause__
        finally:
            await trio.aclose_forcefully(stream)
            await listener.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            client = trio.SSLStream(tcp, client_ctx, server_hostname=hostname)
            try:
                await client.do_handshake()
                await client.send_all(b"hello")
                out.client_got = bytes(await client.receive_some(100))
            except trio.BrokenResourceError as e:
                out.client_error = e.__cause__
            finally:
                await trio.aclose_forcefully(client)
    return out


def refused_by_server(out: Outcome, reason: str) -> None:
    assert out.server_peer_der is None
    assert isinstance(out.server_error, ssl.SSLCertVerificationError), out.server_error
    assert reason in out.server_error.verify_message, out.server_error.verify_message
    assert out.client_got == b""


async def test_mutual_tls13_handshake_binds_org(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    cert, key, _ = pki.node("56001")
    out = await connect(pki.server_context(), pki.client_context(cert, key))
    assert out.server_error is None and out.client_error is None
    assert out.server_version == "TLSv1.3"
    assert out.client_got == b"welcome"
    assert peer_organization(out.server_peer_der, ca=pki.ca.certificate, crl=pki.ca.crl()) == "56001"
    # localhost works as a name too
    out2 = await connect(pki.server_context(), pki.client_context(cert, key), hostname="localhost")
    assert out2.client_got == b"welcome"


async def test_certificate_from_another_ca_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "platform")
    evil = make_pki(tmp_path / "evil", "Platform CA")  # same name, other key
    cert, key, _ = evil.node("56001")
    ctx = client_ssl_context(cert_file=cert, key_file=key, ca_file=pki.ca_file)
    out = await connect(pki.server_context(), ctx)
    refused_by_server(out, "unable to get local issuer certificate")


async def test_expired_certificate_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    cert, key, _ = pki.node("56001", not_before=NOW - dt.timedelta(days=400), days=30)
    out = await connect(pki.server_context(), pki.client_context(cert, key))
    refused_by_server(out, "certificate has expired")


async def test_revoked_certificate_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    cert, key, serial = pki.node("56001")
    pki.ca.revoke("56001")
    pki.publish_crl()
    out = await connect(pki.server_context(), pki.client_context(cert, key))
    refused_by_server(out, "certificate revoked")
    # and the post-handshake check says so in our words
    with pytest.raises(CertificateRevoked, match=f"org 56001 \\(serial 0x{serial:x}\\) was revoked"):
        peer_certificate(_der(cert), ca=pki.ca.certificate, crl=pki.ca.crl())


async def test_client_without_certificate_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cafile=pki.ca_file)
    out = await connect(pki.server_context(), ctx)
    assert out.server_peer_der is None
    assert isinstance(out.server_error, ssl.SSLError)
    assert "peer did not return a certificate" in str(out.server_error)


async def test_node_refuses_a_platform_from_another_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "platform")
    impostor = make_pki(tmp_path / "impostor", "Platform CA")
    cert, key, _ = pki.node("56001")
    out = await connect(impostor.server_context(), pki.client_context(cert, key))
    assert isinstance(out.client_error, ssl.SSLCertVerificationError)
    # the impostor sends its (self-signed) CA along: still not our CA
    assert out.client_error.verify_message in (
        "self-signed certificate in certificate chain", "unable to get local issuer certificate"
    )


def test_contexts_are_tls13_only_and_check_key_files(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    ctx = pki.server_context()
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert ctx.options & ssl.OP_NO_TICKET
    os.chmod(tmp_path / "server.key.pem", 0o644)
    with pytest.raises(KeyFileError, match=r"server.key.pem is readable by group/others \(mode 0644\)"):
        server_ssl_context(cert_file=tmp_path / "server.pem", key_file=tmp_path / "server.key.pem",
                           ca_file=pki.ca_file)
    cert, _, _ = pki.node("56001")
    with pytest.raises(KeyFileError, match="cannot be loaded together"):
        client_ssl_context(cert_file=cert, key_file=tmp_path / "server.key.pem",
                           ca_file=pki.ca_file, check_key_permissions=False)
    with pytest.raises(CertificateError, match="presented no certificate"):
        peer_organization(None, ca=pki.ca.certificate, crl=None)


def _der(pem_path: Path) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem_path.read_bytes()).public_bytes(Encoding.DER)
