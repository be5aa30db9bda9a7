"""Operations: admin console, metrics, systemd units, logging, backup and
restore (docs/operations.md).

Importing ``semq.ops`` is cheap; the names below load their module on first
use (prometheus-client only with the metrics).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AdminCommandError",
    "AdminError",
    "AdminUnavailable",
    "AfterReply",
    "BackupError",
    "DrainControl",
    "Metrics",
    "OpsOptions",
    "OpsRuntime",
    "RestoreRefused",
    "UnitSpec",
    "add_run_options",
    "admin_call",
    "admin_request",
    "admin_socket_path",
    "backup",
    "configure_logging",
    "instrument_core",
    "live_status",
    "node_handlers",
    "node_reloader",
    "ops_options",
    "platform_handlers",
    "platform_reloader",
    "register",
    "reload_on_sighup",
    "restore",
    "serve_admin",
    "serve_metrics",
    "store_in_use",
    "unit_text",
]

_WHERE = {
    "AdminCommandError": "admin", "AdminError": "admin", "AdminUnavailable": "admin", "AfterReply": "admin",
    "DrainControl": "admin", "admin_call": "admin", "admin_request": "admin", "admin_socket_path": "admin",
    "serve_admin": "admin",
    "BackupError": "backup", "RestoreRefused": "backup", "backup": "backup", "restore": "backup",
    "store_in_use": "backup",
    "Metrics": "metrics", "instrument_core": "metrics", "serve_metrics": "metrics",
    "OpsOptions": "runtime", "OpsRuntime": "runtime", "add_run_options": "runtime", "live_status": "runtime",
    "ops_options": "runtime",
    "UnitSpec": "service", "reload_on_sighup": "service", "unit_text": "service",
    "configure_logging": "logs",
    "node_handlers": "handlers", "platform_handlers": "handlers",
    "node_reloader": "reload", "platform_reloader": "reload",
    "register": "cli",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'semq.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"semq.ops.{mod}"), name)
    globals()[name] = value
    return value
