"""What ``semq admin reload`` and SIGHUP do: re-read ``semq.toml`` and the
certificates, apply what can change without dropping connections, and say
what needs a restart.

Applied at once: the inquiry interval, the window (new sessions), the
platform's auto-registration. From the next connection: a node's platform
address and its TLS certificate (renewed ``node.pem``/keys; sessions in
progress keep theirs); the platform's CA state, CRL and TLS certificate
(the daemon's own CRL watcher applies them and closes revoked sessions).
Which keys, and when, is declared on each key's Rule in semq.settings.config
(``semq config reference``). Only settings that changed in the file since
the last (re)load are applied, so command-line overrides (``--platform``,
``--inquiry-interval``) stay until the file itself changes them; any other
key that changed is reported as needing a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio

from semq.settings.config import SETTINGS, Config, load_config, parse_platform_addresses

__all__ = ["APPLIERS", "node_reloader", "platform_reloader"]

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


# What a reload does with each key it applies, per role: an applier takes the
# daemon, its core and the new configuration and returns what to report
# (None: nothing to report). Which keys these are, and when they take effect
# in words, is declared once on the key's Rule (``Rule.reload``, printed by
# ``semq config reference`` and docs/operations.md); a test checks that the
# appliers here and those declarations agree. Every other key that changed
# is reported as ``needs_restart``.
_Applier = Callable[[Any, Any, Config], Awaitable[Any]]


async def _inquiry_interval(daemon: Any, core: Any, cfg: Config) -> Any:
    await daemon.gate.run(_set, core, "inquiry_ms", int(cfg.inquiry_interval * 1000))
    return cfg.inquiry_interval


async def _node_window(daemon: Any, core: Any, cfg: Config) -> Any:
    if hasattr(daemon, "set_window"):
        daemon.set_window(cfg.window)  # the running session too
    else:
        daemon.s.window = cfg.window
    return cfg.window


async def _max_document(daemon: Any, core: Any, cfg: Config) -> Any:
    await daemon.gate.run(setattr, core.receiver.large, "max_size", cfg.max_document_mib << 20)
    return cfg.max_document_mib


async def _large_from(daemon: Any, core: Any, cfg: Config) -> Any:
    return cfg.large_from_mib  # read by each send (semq.node.api)


async def _node_platform(daemon: Any, core: Any, cfg: Config) -> Any:
    daemon.s.addresses = parse_platform_addresses(cfg.platform)
    return f"{cfg.platform} (from the next connection)"


async def _clock_skew(daemon: Any, core: Any, cfg: Config) -> Any:
    await daemon.gate.run(_set, core, "skew_ms", int(cfg.clock_skew * 1000))
    return cfg.clock_skew


async def _queue_mib(daemon: Any, core: Any, cfg: Config) -> Any:
    daemon.s.high_water = max(1, cfg.queue_mib) << 20
    return cfg.queue_mib


async def _platform_window(daemon: Any, core: Any, cfg: Config) -> Any:
    daemon.s.window = cfg.window
    return f"{cfg.window} (new sessions)"


async def _quota_mib(daemon: Any, core: Any, cfg: Config) -> Any:
    await daemon.gate.run(_set, core, "quota_bytes", max(0, cfg.quota_mib) << 20)
    return cfg.quota_mib


async def _max_connections(daemon: Any, core: Any, cfg: Config) -> Any:
    daemon.s.max_connections_per_org = cfg.max_connections_per_org
    return f"{cfg.max_connections_per_org} (new connections)"


async def _max_units(daemon: Any, core: Any, cfg: Config) -> Any:
    daemon.s.max_units_per_org = cfg.max_units_per_org
    return f"{cfg.max_units_per_org} (new connections)"


async def _auto_register(daemon: Any, core: Any, cfg: Config) -> Any:
    if cfg.security:  # with certificates only enrolled organizations are known
        return None
    await daemon.gate.run(_set, core, "auto_register", cfg.auto_register)
    return cfg.auto_register


APPLIERS: Final[dict[str, dict[str, _Applier]]] = {
    "node": {"inquiry_interval": _inquiry_interval, "window": _node_window, "platform": _node_platform,
             "clock_skew": _clock_skew, "max_document_mib": _max_document, "large_from_mib": _large_from},
    "platform": {"inquiry_interval": _inquiry_interval, "queue_mib": _queue_mib, "window": _platform_window,
                 "quota_mib": _quota_mib, "max_connections_per_org": _max_connections,
                 "max_units_per_org": _max_units, "auto_register": _auto_register},
}


async def _apply(role: str, daemon: Any, core: Any, directory: Path,
                 state: dict[str, Any]) -> tuple[Config, dict[str, Any], list[str]]:
    """Read the configuration (still this role; a wrong value raises before
    anything is applied) and apply each key that changed since the last
    (re)load and that a reload applies for ``role``. Returns the new
    configuration, what changed, and the changed keys that need a restart."""
    cfg: Config = await trio.to_thread.run_sync(load_config, directory)
    old: Config = state["cfg"]
    if cfg.role != role:
        raise ValueError(f"{directory} now holds a {cfg.role} configuration; not reloaded")
    changed: dict[str, Any] = {}
    needs: list[str] = []
    for name, rule in SETTINGS.items():
        if getattr(cfg, name) == getattr(old, name):
            continue
        if rule.reload_when(role) is None:
            needs.append(name)
            continue
        shown = await APPLIERS[role][name](daemon, core, cfg)
        if shown is not None:
            changed[name] = shown
    return cfg, changed, needs


def node_reloader(daemon: Any, core: Any, directory: Path) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A reload callback for a running node (NodeDaemon ``daemon``, its
    NodeCore ``core``, data directory ``directory``). Raises ConfigError /
    SecurityError (nothing applied from the part that failed)."""
    directory = Path(directory)
    state: dict[str, Any] = {"cfg": load_config(directory), "certs": _mtimes(directory, _NODE_CERT_FILES)}

    async def reload() -> dict[str, Any]:
        cfg, changed, needs = await _apply("node", daemon, core, directory, state)
        certs = _mtimes(directory, _NODE_CERT_FILES)
        if cfg.security and certs != state["certs"]:
            from semq.identity.security import NodeSecurity

            sec = await trio.to_thread.run_sync(NodeSecurity, directory)  # refuses unusable keys
            ctx = sec.ssl_context()
            await daemon.gate.run(_set, core, "sec", sec)
            daemon.s.ssl_context = ctx
            changed["certificate"] = (f"serial {sec.identity.certificate.serial:x}, expires in"
                                      f" {sec.expires_in_days():.0f} days (from the next connection)")
        state["cfg"], state["certs"] = cfg, certs
        if needs:
            changed["needs_restart"] = needs
        log.info("reload: %s", changed or "nothing changed")
        return {"changed": changed}

    return reload


def platform_reloader(daemon: Any, core: Any, directory: Path) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A reload callback for the running platform (PlatformDaemon
    ``daemon``, its PlatformCore ``core``)."""
    directory = Path(directory)
    state: dict[str, Any] = {"cfg": load_config(directory)}

    async def reload() -> dict[str, Any]:
        cfg, changed, needs = await _apply("platform", daemon, core, directory, state)
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
        if needs:
            changed["needs_restart"] = needs
        state["cfg"] = cfg
        log.info("reload: %s", changed or "nothing changed")
        return {"changed": changed}

    return reload
