"""Who is who: the CA, certificates and end-to-end cryptography (``crypto``),
a data directory's keys and certificates (``security``), and the
certificates a node has pinned for its partners (``trust``).
docs/security.md is their reference."""
