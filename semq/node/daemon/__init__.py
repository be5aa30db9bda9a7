"""The node's trio half: ``semq node run``, a thin trio shell around
semq.node.core.NodeCore.

- ``node``: ``NodeDaemon`` — its platform session (reconnect, fail-over,
  HELLO, the sender, the inquirer, what it registers with the session
  layer, semq.session.reader), its documents to its own users, and the
  tasks it starts;
- ``certificates``: the certificates of other organizations, asked for,
  applied, waited for;
- ``watch``: ``StoreWatch``, the one read-only look at the store every
  sender waits on (another process's commit);
- ``direct`` / ``listener`` / ``link``: the direct links — the ones we
  dial, the ones dialled to us, one link's session and ``LinkHost``, all
  they know of the daemon;
- ``background``: the features' tasks (check-backs, dead letters,
  retention);
- ``settings``: ``NodeSettings``, ``DirectSettings``.

Nothing here imports upwards (tests/test_layering.py), and the links never
import the daemon."""

from .direct import DirectLinks
from .link import LinkHost, LinkRefused
from .node import QUOTA_PAUSE, NodeDaemon
from .settings import INITIAL_DELAY, DirectSettings, NodeSettings

__all__ = ["INITIAL_DELAY", "QUOTA_PAUSE", "DirectLinks", "DirectSettings", "LinkHost", "LinkRefused", "NodeDaemon",
           "NodeSettings"]
