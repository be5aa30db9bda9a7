"""The node's trio half: ``semq node run`` (``node``), its direct links
(``direct``) and the features' background tasks (``background``)."""

from .direct import DirectLinks, DirectSettings, LinkRefused
from .node import INITIAL_DELAY, QUOTA_PAUSE, NodeDaemon, NodeSettings

__all__ = ["INITIAL_DELAY", "QUOTA_PAUSE", "DirectLinks", "DirectSettings", "LinkRefused", "NodeDaemon", "NodeSettings"]
