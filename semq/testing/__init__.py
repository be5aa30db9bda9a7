"""Test tooling for SEMQ: the seeded TCP fault proxy, the dishonest relay, the load generator.

Exports are resolved lazily: ``python -m semq.testing.faultproxy`` must not find
the module already imported by this package (runpy warns about that), and
importing ``semq.testing`` should stay cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .faultproxy import (
        ConnectionFaults,
        Direction,
        FaultPlan,
        FaultProxy,
        FaultProxyStatistics,
        RefuseMode,
        open_fault_proxy,
        serve_fault_proxy,
    )

__all__ = [
    "ConnectionFaults",
    "Direction",
    "FaultPlan",
    "FaultProxy",
    "FaultProxyStatistics",
    "RefuseMode",
    "open_fault_proxy",
    "serve_fault_proxy",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".faultproxy", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
