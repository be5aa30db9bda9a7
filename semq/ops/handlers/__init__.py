"""The admin console's commands for a running node or platform.

``node_handlers(daemon, core, ...)`` / ``platform_handlers(daemon, core,
...)`` return ``{command: handler}`` for semq.ops.admin.serve_admin. Every
store access runs through ``daemon.gate`` (the daemon's one store thread;
STYLE 6), in one transaction per command, and delivery events are appended
to the core's event log after the commit (docs/events.md), so the
analytics and the metrics see operator actions too.

Commands (``args`` in parentheses; every command answers JSON):

- ``ping`` — role, id, pid.
- ``status`` — connections, online nodes, queue depth per target and
  state, oldest unconfirmed, daemon counters, commit batches (with metrics).
- ``list`` (state, target, older_than, after, limit; node: table
  outbox|inbound; platform: kind data|relayed|all) — rows without contents.
- ``show`` (id or lk0) — one row, without contents.
- ``stuck`` (older_than, limit) — no end-to-end confirmation for longer
  than older_than seconds (default 1 h, the analytics report's
  ``--stuck-after``), with where each one is stuck.
- ``requeue`` / ``resend`` / ``purge`` (ids | filters state, target,
  older_than; all; dry_run) — see each handler.
- ``drain`` / ``stop`` — semq.ops.admin.DrainControl.
- ``reload`` — the callback the daemon passes (certificates, configuration).
- ``wait_inbox`` (after_id, timeout, user; node only) — answered as soon as
  the inbox holds an unacknowledged row above after_id, or at the timeout
  (semq.ops.waiters, semq.session.inbox_wait).

Documents' contents and keys are never returned: rows carry sizes only.
Which rows requeue / resend / purge take, and the state they leave them in,
is decided by semq.node.engine.OPERATOR_TABLE (a node's pending-send rows)
and semq.platform.engine.STORED_OPERATOR_TABLE (the platform's stored
copies); rows in any other state are reported ``skipped``.
"""

from __future__ import annotations

from ._common import (
    DEFAULT_LIMIT,
    DEFAULT_STUCK_AFTER,
    MAX_LIMIT,
    MAX_SELECT,
    ReloadCallback,
    store_bytes,
)
from .node import node_busy, node_handlers
from .platform import platform_busy, platform_handlers

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_STUCK_AFTER",
    "MAX_LIMIT",
    "MAX_SELECT",
    "ReloadCallback",
    "node_busy",
    "node_handlers",
    "platform_busy",
    "platform_handlers",
    "store_bytes",
]
