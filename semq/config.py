"""Configuration: one TOML file per data directory (``semq.toml``).

The directory is ``--dir``, else ``$SEMQ_DIR``, else ``./semq-data``."""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tomli_w

__all__ = ["CONFIG_NAME", "Config", "ConfigError", "data_dir", "load_config", "write_config"]

CONFIG_NAME = "semq.toml"


class ConfigError(Exception):
    pass


@dataclass
class Config:
    role: str  # "node" or "platform"
    directory: Path
    org: str = ""  # node: its organization id
    platform: str = "127.0.0.1:7410"  # node: the platform address
    platform_id: str = "platform"  # platform: its endpoint id
    listen: str = "127.0.0.1:7410"  # platform: listen address
    inquiry_interval: float = 15.0  # s (SPEC default)
    synchronous: str = "FULL"  # SQLite synchronous mode
    window: int = 4096
    queue_mib: int = 16  # platform: MiB queued for one slow node before its documents are stored instead
    auto_register: bool = True  # platform: accept nodes it does not know yet
    quota_mib: int = 4096  # platform: MiB of stored documents one organization may have (0: no limit)
    max_connections_per_org: int = 4  # platform: connections one organization may hold at once
    clock_skew: float = 600.0  # node: s the organizations' clocks may disagree (a document's creation time)
    security: bool = True  # mutual TLS, end-to-end encryption and signatures (docs/security.md)

    @property
    def store_path(self) -> Path:
        return self.directory / ("platform.sqlite" if self.role == "platform" else "node.sqlite")

    @property
    def events_dir(self) -> Path:
        return self.directory / "events"

    @property
    def status_path(self) -> Path:
        return self.directory / "status.json"


def data_dir(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("SEMQ_DIR") or "semq-data").resolve()


def load_config(directory: Path) -> Config:
    path = directory / CONFIG_NAME
    if not path.exists():
        raise ConfigError(f"no configuration at {path}; run 'semq node init' or 'semq platform init' (or set SEMQ_DIR)")
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"configuration {path} is not valid TOML: {e}") from e
    fields = set(Config.__dataclass_fields__) - {"directory"}
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"configuration {path} has unknown keys: {', '.join(sorted(unknown))}")
    if raw.get("role") not in ("node", "platform"):
        raise ConfigError(f"configuration {path}: role {raw.get('role')!r} is not 'node' or 'platform'")
    return Config(directory=directory, **raw)


def write_config(cfg: Config) -> Path:
    cfg.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(cfg.directory, 0o700)
    data = {k: v for k, v in asdict(cfg).items() if k != "directory"}
    path = cfg.directory / CONFIG_NAME
    path.write_text(tomli_w.dumps(data), "utf-8")
    return path
