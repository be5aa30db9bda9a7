"""The edge sender: claims our documents for AS2 / AS4 partners, builds each
message with its protocol's adapter, POSTs it and judges the synchronous
receipt (docs/interop.md).

Only a receipt that verifies and names our digest confirms a document (the
proof is kept); a verified negative receipt fails it with the partner's
reason; anything else (no connection, a timeout, an HTTP error, a receipt
that does not verify) sends it again later with the same message id, with
backoff, until its tries run out (then failed, a dead letter): the message
built for the first try is committed before it is posted and every resend,
also after a restart, posts the very same bytes. The store is
reached only through the daemon's gate; building, posting and verifying run
in worker threads."""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import httpx
import trio

from semq.edge.protocol import EdgePartner, EdgeProtocol, OurKeys, Outgoing, load_protocols
from semq.edge.store import EdgeDoc, EdgeStore
from semq.settings.bounds import EDGE_MAX_BODY

__all__ = ["EdgeSender", "post"]

log = logging.getLogger("semq.edge")
T = TypeVar("T")
Gate = Callable[..., Awaitable[Any]]

SEND_TIMEOUT_S: Final = 60.0  # connect, send and read the synchronous receipt
IN_FLIGHT: Final = 4  # messages posted at once
POLL_S: Final = 0.5  # between looks at the due documents when idle


_CLIENTS: dict[str, httpx.Client] = {}


def _client(tls_ca: str) -> httpx.Client:
    """One client per trust (its TLS context and connections reused; making
    one costs tens of milliseconds). ``tls_ca``: the PEM certificate(s) a
    partner's HTTPS server must present (its own self-signed one, or its
    CA), checked without its host name (the certificate is pinned); empty:
    the system's CAs and the host name, as a browser does."""
    client = _CLIENTS.get(tls_ca)
    if client is None:
        verify: ssl.SSLContext | bool = True
        if tls_ca:
            ctx = ssl.create_default_context(cadata=tls_ca)
            ctx.check_hostname = False
            verify = ctx
        client = _CLIENTS[tls_ca] = httpx.Client(timeout=SEND_TIMEOUT_S, follow_redirects=False, trust_env=False,
                                                 verify=verify)
    return client


def post(partner: EdgePartner, out: Outgoing) -> tuple[int, dict[str, str], bytes]:
    """POST one message to the partner; the answer (status, headers, body: at
    most EDGE_MAX_BODY bytes read). Raises httpx.HTTPError / ValueError /
    ssl.SSLError."""
    client = _client(partner.options.get("tls_ca", ""))
    with client.stream("POST", partner.url, headers=dict(out.headers), content=out.body) as r:
        body = bytearray()
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > EDGE_MAX_BODY:
                raise ValueError(f"the partner's answer is over {EDGE_MAX_BODY} bytes")
        return r.status_code, dict(r.headers.items()), bytes(body)


class EdgeSender:
    def __init__(self, store: EdgeStore, gate: Gate, keys: Callable[[], OurKeys], *,
                 poster: Callable[[EdgePartner, Outgoing], tuple[int, dict[str, str], bytes]] = post) -> None:
        self.store = store
        self.gate = gate
        self._keys = keys  # read when first needed (semq.edge.daemon.service)
        self.poster = poster
        self.stats = {"edge_sent": 0, "edge_confirmed": 0, "edge_failed": 0, "edge_retried": 0}
        self._limit = trio.CapacityLimiter(IN_FLIGHT)
        self._wake = trio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        now = int(time.time() * 1000)
        again = await self.gate(self.store.restart, now)
        if again:
            log.info("edge: %d document(s) left being sent are sent again (same message ids)", again)
        async with trio.open_nursery() as nursery:
            while True:
                docs = await self.gate(self.store.claim, int(time.time() * 1000), IN_FLIGHT)
                for doc in docs:
                    await self._limit.acquire_on_behalf_of(doc.id)
                    nursery.start_soon(self._one, doc)
                if not docs:
                    with trio.move_on_after(POLL_S):
                        await self._wake.wait()
                    self._wake = trio.Event()

    async def _one(self, doc: EdgeDoc) -> None:
        try:
            await self._send(doc)
        except Exception as e:  # a bug must not stop the sender: the document waits its next try
            log.exception("edge: document %s", doc.doc_key)
            await self.gate(self.store.no_receipt, doc.id, f"internal error: {type(e).__name__}",
                            int(time.time() * 1000))
        finally:
            self._limit.release_on_behalf_of(doc.id)

    async def _send(self, doc: EdgeDoc) -> None:
        partner: EdgePartner | None = await self.gate(self.store.partner, doc.protocol, doc.partner)
        proto: EdgeProtocol | None = load_protocols().get(doc.protocol)
        if partner is None or proto is None:
            why = "the partner was removed" if partner is None else f"no {doc.protocol.upper()} adapter in this node"
            await self.gate(self.store.no_receipt, doc.id, why, int(time.time() * 1000))
            return
        out = await self.gate(self.store.sent, doc.id)
        if out is None:  # its first try: built, and committed before it is posted
            content = await self.gate(self.store.content, doc.id)
            out = await trio.to_thread.run_sync(proto.build, doc.doc_key, content, doc.content_type, partner,
                                                self._keys())
            await self.gate(self.store.built, doc.id, out)
        self.stats["edge_sent"] += 1
        try:
            status, headers, body = await trio.to_thread.run_sync(self.poster, partner, out)
        except (httpx.HTTPError, ValueError, OSError) as e:
            self.stats["edge_retried"] += 1
            await self.gate(self.store.no_receipt, doc.id, f"{type(e).__name__}: {e}"[:300], int(time.time() * 1000))
            return
        result = await trio.to_thread.run_sync(proto.read_receipt, status, headers, body, out, partner, self._keys())
        now = int(time.time() * 1000)
        if result.ok:
            self.stats["edge_confirmed"] += 1
            await self.gate(self.store.confirmed, doc.id, result.proof, now)
        elif result.proof:
            self.stats["edge_failed"] += 1
            await self.gate(self.store.refused, doc.id, result.reason or "refused", result.proof, now)
        else:
            self.stats["edge_retried"] += 1
            moved = await self.gate(self.store.no_receipt, doc.id, result.reason or "no receipt", now)
            if moved is not None and moved.state.name == "FAILED":
                self.stats["edge_failed"] += 1
