"""The platform's trio half: ``semq platform run``, the relay (``relay``)."""

from .relay import ForwardPort, PlatformDaemon, PlatformSettings, Session

__all__ = ["ForwardPort", "PlatformDaemon", "PlatformSettings", "Session"]
