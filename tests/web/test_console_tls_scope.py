"""Why the console has no login by client certificate (docs/operations.md,
"Web console"): Hypercorn's trio worker, asked to verify a client
certificate during the handshake, hands the application nothing of it —
no ``tls`` extension in the request's scope. Checked against the real
server: when a Hypercorn release passes the certificate, this test fails
and the console can log in by it."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import httpx
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from semq.web.certs import console_tls


def _client_cert(d: Path) -> tuple[Path, Path]:
    """A self-signed client certificate (its own CA) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator maria")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    c, k = d / "client.pem", d / "client.key.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return c, k


async def test_hypercorn_gives_the_app_no_client_certificate(tmp_path: Path) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    tls = console_tls("node", tmp_path)
    client_cert, client_key = _client_cert(tmp_path)
    scopes: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.certfile, cfg.keyfile = str(tls.certfile), str(tls.keyfile)
    cfg.ca_certs = str(client_cert)
    cfg.verify_mode = ssl.CERT_REQUIRED  # the handshake demands and verifies the client's certificate
    cfg.accesslog = cfg.errorlog = None

    def get(url: str, *, with_cert: bool = True) -> int | str:
        ctx = ssl.create_default_context(cafile=str(tls.certfile))
        if with_cert:
            ctx.load_cert_chain(str(client_cert), str(client_key))
        try:
            with httpx.Client(verify=ctx, timeout=10) as c:
                return c.get(url).status_code
        except httpx.TransportError as e:
            return type(e).__name__

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, cfg)
            port = int(binds[0].rpartition(":")[2])
            url = f"https://127.0.0.1:{port}/"
            # The handshake checks the certificate: none, no request.
            assert await trio.to_thread.run_sync(lambda: get(url, with_cert=False)) != 200
            assert await trio.to_thread.run_sync(get, url) == 200
            nursery.cancel_scope.cancel()
    (scope,) = scopes
    assert scope["scheme"] == "https"
    # What the application sees of the connection: no certificate, no TLS extension.
    assert "tls" not in scope["extensions"], "Hypercorn passes the client certificate now: use it to log in"
    assert not any("cert" in k for k in scope) and not any("cert" in k for k in scope["extensions"])
