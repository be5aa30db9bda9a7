"""What ``semq admin reload`` and SIGHUP do: re-read ``semq.toml`` and the
certificates, apply what can change without dropping connections, and say
what needs a restart.

Applied at once: the inquiry interval, the window (new sessions), the
platform's auto-registration. From the next connection: a node's platform
address and its TLS certificate (renewed ``node.pem``/keys; sessions in
progress keep theirs); the platform's CA state, CRL and TLS certificate
(the daemon's own CRL watcher applies them and closes revoked sessions).
Only settings that changed in the file since the last (re)load are applied,
so command-line overrides (``--platform``, ``--inquiry-interval``) stay
until the file itself changes them. A listen address change needs a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from semq.config import Config, load_config, parse_platform_addresses

__all__ = ["node_reloader", "platform_reloader"]

log = logging.getLogger("semq.ops.reload")

_NODE_CERT_FILES = ("node.pem", "ca.pem", "keys/sign.key.pem", "keys/enc.key.pem")


def _mtimes(directory: Path, names: tuple[str, ...]) -> tuple[float, ...]:
    out = []
    for n in names:
        try:
            out.append((directory / n).stat().st_mtime)
        except OSError:
            out.append(0.0)
    return tuple(out)


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


async def _common(daemon: Any, core: Any, directory: Path, state: dict[str, Any],
                  role: str) -> tuple[Config, Config, dict[str, Any]]:
    """What both reloads do first: read the configuration (still this role),
    apply the inquiry interval on the store thread."""
    cfg: Config = await trio.to_thread.run_sync(load_config, directory)
    old: Config = state["cfg"]
    if cfg.role != role:
        raise ValueError(f"{directory} now holds a {cfg.role} configuration; not reloaded")
    changed: dict[str, Any] = {}
    if cfg.inquiry_interval != old.inquiry_interval:
        await daemon.gate.run(_set, core, "inquiry_ms", int(cfg.inquiry_interval * 1000))
        changed["inquiry_interval"] = cfg.inquiry_interval
    return cfg, old, changed


def node_reloader(daemon: Any, core: Any, directory: Path) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A reload callback for a running node (NodeDaemon ``daemon``, its
    NodeCore ``core``, data directory ``directory``). Raises ConfigError /
    SecurityError (nothing applied from the part that failed)."""
    directory = Path(directory)
    state: dict[str, Any] = {"cfg": load_config(directory), "certs": _mtimes(directory, _NODE_CERT_FILES)}

    async def reload() -> dict[str, Any]:
        cfg, old, changed = await _common(daemon, core, directory, state, "node")
        if cfg.window != old.window:
            if hasattr(daemon, "set_window"):
                daemon.set_window(cfg.window)  # the running session too
            else:
                daemon.s.window = cfg.window
            changed["window"] = cfg.window
        if cfg.platform != old.platform:
            daemon.s.addresses = parse_platform_addresses(cfg.platform)
            changed["platform"] = f"{cfg.platform} (from the next connection)"
        certs = _mtimes(directory, _NODE_CERT_FILES)
        if cfg.security and certs != state["certs"]:
            from semq.security import NodeSecurity

            sec = await trio.to_thread.run_sync(NodeSecurity, directory)  # refuses unusable keys
            ctx = sec.ssl_context()
            await daemon.gate.run(_set, core, "sec", sec)
            daemon.s.ssl_context = ctx
            changed["certificate"] = (f"serial {sec.identity.certificate.serial:x}, expires in"
                                      f" {sec.expires_in_days():.0f} days (from the next connection)")
        if cfg.clock_skew != old.clock_skew:
            await daemon.gate.run(_set, core, "skew_ms", int(cfg.clock_skew * 1000))
            changed["clock_skew"] = cfg.clock_skew
        state["cfg"], state["certs"] = cfg, certs
        unchanged = [k for k in ("security", "synchronous", "org") if getattr(cfg, k) != getattr(old, k)]
        if unchanged:
            changed["needs_restart"] = unchanged
        log.info("reload: %s", changed or "nothing changed")
        return {"changed": changed}

    return reload


def platform_reloader(daemon: Any, core: Any, directory: Path) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A reload callback for the running platform (PlatformDaemon
    ``daemon``, its PlatformCore ``core``)."""
    directory = Path(directory)
    state: dict[str, Any] = {"cfg": load_config(directory)}

    async def reload() -> dict[str, Any]:
        cfg, old, changed = await _common(daemon, core, directory, state, "platform")
        if cfg.queue_mib != old.queue_mib:
            daemon.s.high_water = max(1, cfg.queue_mib) << 20
            changed["queue_mib"] = cfg.queue_mib
        if cfg.window != old.window:
            daemon.s.window = cfg.window
            changed["window"] = f"{cfg.window} (new sessions)"
        if cfg.quota_mib != old.quota_mib:
            await daemon.gate.run(_set, core, "quota_bytes", max(0, cfg.quota_mib) << 20)
            changed["quota_mib"] = cfg.quota_mib
        if cfg.max_connections_per_org != old.max_connections_per_org:
            daemon.s.max_connections_per_org = cfg.max_connections_per_org
            changed["max_connections_per_org"] = f"{cfg.max_connections_per_org} (new connections)"
        if cfg.max_units_per_org != old.max_units_per_org:
            daemon.s.max_units_per_org = cfg.max_units_per_org
            changed["max_units_per_org"] = f"{cfg.max_units_per_org} (new connections)"
        if cfg.auto_register != old.auto_register and not cfg.security:
            await daemon.gate.run(_set, core, "auto_register", cfg.auto_register)
            changed["auto_register"] = cfg.auto_register
        sec = getattr(daemon.s, "security", None)
        if sec is not None:
            hook = getattr(daemon, "reload_security", None)
            if hook is not None:
                res = hook()
                if hasattr(res, "__await__"):
                    await res
                changed["security"] = "CA, CRL and TLS certificate reloaded"
            else:
                # The daemon's CRL watcher reloads when the CRL's mtime differs
                # from the one it loaded: make it differ (within seconds).
                sec.crl_mtime = -1.0
                changed["security"] = "CA, CRL and TLS certificate reload scheduled"
        needs = [k for k in ("listen", "security", "synchronous", "platform_id") if getattr(cfg, k) != getattr(old, k)]
        if needs:
            changed["needs_restart"] = needs
        state["cfg"] = cfg
        log.info("reload: %s", changed or "nothing changed")
        return {"changed": changed}

    return reload
