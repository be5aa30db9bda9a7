"""Settings of the seed capabilities: ``capabilities.toml`` in the node's
data directory, next to ``semq.toml`` (which stays the daemon's own file).
Missing file or keys: the defaults below. ``semq tx config`` and
``semq dead config`` write it; the node daemon's task re-reads it when it
changes, so no restart is needed.

    [tx]                        # transactional messages (seed 002)
    checkback = "/usr/local/bin/order-tx-status"   # shell command; "" = none
    first_check = 6.0           # s after the half message before the first check-back
    check_interval = 60.0       # s between check-backs
    max_checks = 15             # then the message waits for a person (NEEDS_ATTENTION)
    checkback_timeout = 10.0    # s the command may take; longer = "unknown"

    [dead]                      # dead letters
    max_attempts = 0            # send attempts before a document is dead (304); 0 = never
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

import tomli_w

from semq.settings.config import ConfigError, read_config_text

__all__ = [
    "CAPABILITIES_NAME",
    "Capabilities",
    "DeadSettings",
    "TxSettings",
    "load_capabilities",
    "update_capabilities",
    "write_capabilities",
]

CAPABILITIES_NAME: Final = "capabilities.toml"


@dataclass(frozen=True, kw_only=True)
class TxSettings:
    """Check-back schedule (seed 002; RocketMQ's transactionTimeout 6 s,
    transactionCheckMax 15, transactionCheckInterval 60 s)."""

    checkback: str = ""
    first_check: float = 6.0
    check_interval: float = 60.0
    max_checks: int = 15
    checkback_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("first_check", "check_interval", "checkback_timeout"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"tx.{name} = {v!r} is not a number of seconds >= 0")
        if not isinstance(self.max_checks, int) or isinstance(self.max_checks, bool) or self.max_checks < 1:
            raise ConfigError(f"tx.max_checks = {self.max_checks!r} is not a whole number >= 1")
        if not isinstance(self.checkback, str):
            raise ConfigError(f"tx.checkback = {self.checkback!r} is not a command string")


@dataclass(frozen=True, kw_only=True)
class DeadSettings:
    max_attempts: int = 0  # 0: documents are never given up for their number of attempts

    def __post_init__(self) -> None:
        v = self.max_attempts
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"dead.max_attempts = {v!r} is not a whole number >= 0")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    tx: TxSettings = TxSettings()
    dead: DeadSettings = DeadSettings()


def _section(cls: type[Any], name: str, raw: Any, path: Path) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [{name}] is not a table")
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{path}: [{name}] has unknown keys: {', '.join(sorted(unknown))}"
                          f" (known: {', '.join(sorted(known))})")
    values = {k: float(v) if isinstance(v, int) and not isinstance(v, bool)
              and isinstance(getattr(cls(), k), float) else v for k, v in raw.items()}
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def load_capabilities(directory: Path) -> Capabilities:
    """Read DIR/capabilities.toml (defaults when it does not exist).
    Raises ConfigError naming the file and the bad key."""
    path = Path(directory) / CAPABILITIES_NAME
    if not path.exists():
        return Capabilities()
    try:
        raw = tomllib.loads(read_config_text(path, "capabilities file"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e
    unknown = set(raw) - {"tx", "dead"}
    if unknown:
        raise ConfigError(f"{path} has unknown sections: {', '.join(sorted(unknown))} (known: dead, tx)")
    return Capabilities(tx=_section(TxSettings, "tx", raw.get("tx"), path),
                        dead=_section(DeadSettings, "dead", raw.get("dead"), path))


def write_capabilities(directory: Path, caps: Capabilities) -> Path:
    """Write DIR/capabilities.toml atomically (replace)."""
    path = Path(directory) / CAPABILITIES_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomli_w.dumps({"tx": asdict(caps.tx), "dead": asdict(caps.dead)}), "utf-8")
    os.replace(tmp, path)
    return path


def update_capabilities(directory: Path, *, tx: dict[str, Any] | None = None,
                        dead: dict[str, Any] | None = None) -> Capabilities:
    """Change some settings and write the file; returns the new settings."""
    caps = load_capabilities(directory)
    new = Capabilities(tx=replace(caps.tx, **(tx or {})), dead=replace(caps.dead, **(dead or {})))
    write_capabilities(directory, new)
    return new
