"""The web console served by a daemon (``semq node|platform run --web
HOST:PORT``; docs/operations.md, "Web console"): HTTPS, operator accounts
with roles, dashboard, message search, a document's timeline, operator
actions and their audit log.

Importing ``semq.web`` is cheap: Starlette, Hypercorn and Jinja2 load only
when a console is served.
"""

from __future__ import annotations

__all__ = ["parse_web_address"]


def parse_web_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 = any free port).
    Raises ValueError naming the text."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--web {text!r} is not HOST:PORT (e.g. 127.0.0.1:8443)")
    return host, int(port)
