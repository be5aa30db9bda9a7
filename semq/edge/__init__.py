"""SEMQ at its edge: partners that speak AS2 (RFC 4130) or AS4 (ebMS3,
Peppol) instead of UMX-T (docs/interop.md).

``protocol.py`` is the interface every protocol adapter implements and the
registry of adapters; ``as2.py`` is the AS2 adapter. Both are sans-IO: bytes
and headers in, bytes and headers out. The partners' table and the edge's
documents have their owner in ``semq/edge/store.py``; the trio halves (the
sender, the listener) are ``semq/edge/daemon/``."""
