"""What an operator sets, and what no one may exceed: ``semq.toml`` and its
rules (``config``), and the declared bounds of every surface that takes
input from outside (``bounds``, docs/security.md "Bounds")."""
