"""The web console served by a daemon (``semq node|platform run --web
HOST:PORT``; docs/operations.md, "Web console"): HTTPS, operator accounts
with roles, dashboard, message search, a document's timeline, operator
actions and their audit log.

Importing ``semq.web`` is cheap: Starlette, Hypercorn and Jinja2 load only
when a console is served.
"""

from __future__ import annotations

# (--web is one of the daemons' operational options: semq.ops.runtime reads it)
from semq.ops.runtime import parse_web_address

__all__ = ["parse_web_address"]
