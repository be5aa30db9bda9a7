"""The platform's trio half: ``semq platform run``, the relay, a thin trio
shell around semq.platform.core.PlatformCore.

- ``relay``: ``PlatformDaemon`` — who is online, each node's session (what
  the relay registers with the session layer, semq.session.reader),
  forwarding, delivery of stored copies, inquiries, the other instances on
  a shared store;
- ``door``: a connection's way in, up to an accepted HELLO (TLS,
  admission);
- ``session``: one node's ``Session`` (its queue and writer) and the
  ``ForwardPort``;
- ``ca``: the CA's state, live (``CaWatch``);
- ``settings``: ``PlatformSettings``."""

from .relay import PlatformDaemon
from .session import ForwardPort, Session
from .settings import PlatformSettings

__all__ = ["ForwardPort", "PlatformDaemon", "PlatformSettings", "Session"]
