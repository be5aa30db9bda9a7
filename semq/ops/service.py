"""systemd units for the platform and for a node, and SIGHUP reload.

The seed 004 system had a supervisor process that restarted failed
servers; today that is systemd (``Restart=on-failure``), so SEMQ ships no
supervisor of its own. ``semq service install`` writes the unit and prints
the commands to run; it never runs systemctl itself.

Exit statuses decide restarts: ``semq ... run`` exits 0 after SIGTERM,
``semq admin stop`` or a drain (no restart: the operator meant it) and
non-zero when it fails (restart after ``RestartSec``).
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import trio

__all__ = [
    "DEFAULT_UNIT_DIR",
    "DEFAULT_USER",
    "UnitSpec",
    "install_unit",
    "reload_on_sighup",
    "semq_command",
    "unit_name",
    "unit_text",
]

log = logging.getLogger("semq.ops.service")

DEFAULT_UNIT_DIR: Final = Path("/etc/systemd/system")
DEFAULT_USER: Final = "semq"
_SAFE_PATH: Final = re.compile(r"^/[A-Za-z0-9._/@+:=,-]*$")
_SAFE_NAME: Final = re.compile(r"^[A-Za-z0-9._@-]+$")
_HOME_PREFIXES: Final = ("/home", "/root", "/run/user")


def semq_command() -> list[str]:
    """How to start ``semq``: the console script next to this Python (a
    virtualenv's bin/), else ``python -m semq``."""
    script = Path(sys.executable).parent / "semq"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "semq"]


def _check_path(p: str, what: str) -> str:
    # systemd splits on whitespace and expands % specifiers: keep paths plain
    # rather than half-quote them.
    if not _SAFE_PATH.match(p):
        raise ValueError(f"{what} {p!r} must be an absolute path of letters, digits and ._/@+:=,- only"
                         " (systemd unit files split on spaces and expand %)")
    return p


def unit_name(role: str, ident: str = "") -> str:
    """``semq-platform.service``, ``semq-node-<org>.service``."""
    if role not in ("node", "platform"):
        raise ValueError(f"role {role!r} is not node or platform")
    if role == "platform" or not ident:
        return f"semq-{role}.service"
    if not _SAFE_NAME.match(ident):
        raise ValueError(f"organization id {ident!r} cannot be part of a unit name")
    return f"semq-node-{ident}.service"


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    role: str  # node | platform
    directory: Path  # the data directory (semq.toml, store, keys)
    user: str = DEFAULT_USER
    group: str | None = None  # default: the user's name
    ident: str = ""  # organization id / platform id, for the description and name
    command: tuple[str, ...] = ()  # default semq_command()
    extra_args: tuple[str, ...] = ()  # e.g. ("--metrics", "127.0.0.1:9410")


def unit_text(spec: UnitSpec) -> str:
    """The unit file for ``spec``. Hardening: no new privileges, no
    capabilities, the whole file system read-only except the data directory
    (``ProtectSystem=strict`` + ``ReadWritePaths``), private /tmp and /dev,
    no access to home directories (read-only when SEMQ or its data live
    under one), kernel tunables/modules/logs/cgroups protected, only
    AF_UNIX/AF_INET/AF_INET6 sockets, the ``@system-service`` system calls,
    umask 077 (keys, stores, the admin socket are the owner's only)."""
    if spec.role not in ("node", "platform"):
        raise ValueError(f"role {spec.role!r} is not node or platform")
    if not _SAFE_NAME.match(spec.user) or (spec.group and not _SAFE_NAME.match(spec.group)):
        raise ValueError(f"user {spec.user!r} / group {spec.group!r} is not a plain account name")
    d = _check_path(str(Path(spec.directory).absolute()), "data directory")
    cmd = list(spec.command or semq_command())
    for part in cmd:
        if part.startswith("/"):
            _check_path(part, "semq command")
    for a in spec.extra_args:
        if not re.match(r"^[A-Za-z0-9._/:=,\[\]@+-]+$", a):
            raise ValueError(f"argument {a!r} cannot go into a unit file as is")
    exec_start = " ".join([*cmd, spec.role, "run", "--dir", d, *spec.extra_args])
    under_home = any(p.startswith(h + "/") or p == h for p in (d, cmd[0]) for h in _HOME_PREFIXES)
    what = f"SEMQ {'platform relay' if spec.role == 'platform' else 'organization node'}"
    if spec.ident:
        what += f" {spec.ident}"
    group = spec.group or spec.user
    lines = [
        "# Written by 'semq service install' (docs/operations.md).",
        "[Unit]",
        f"Description={what} (store-and-forward messaging)",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={spec.user}",
        f"Group={group}",
        f"ExecStart={exec_start}",
        "# SIGHUP: reload certificates and configuration without dropping connections.",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=2s",
        "# SIGTERM: stop accepting, let in-flight store work finish, exit 0.",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60s",
        "Environment=PYTHONUNBUFFERED=1",
        "UMask=0077",
        "LimitNOFILE=65536",
        "# Hardening",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "ProtectSystem=strict",
        f"ReadWritePaths={d}",
        "ProtectHome=" + ("read-only" if under_home else "yes"),
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        "# Not MemoryDenyWriteExecute: cffi callbacks (cryptography) may need W+X pages.",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def install_unit(spec: UnitSpec, unit_dir: Path = DEFAULT_UNIT_DIR, *, print_only: bool = False,
                 out: Callable[[str], Any] = print) -> Path:
    """Write the unit for ``spec`` into ``unit_dir`` (0644) and tell what to
    run next; with ``print_only`` print the unit and write nothing. Returns
    the unit's path. Never runs systemctl."""
    name = unit_name(spec.role, spec.ident)
    text = unit_text(spec)
    path = Path(unit_dir) / name
    if print_only:
        out(text.rstrip("\n"))
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text(text, "utf-8")
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    d = Path(spec.directory).absolute()
    group = spec.group or spec.user
    out(f"wrote {path}\nnext, as root:\n"
        f"  id {spec.user} >/dev/null 2>&1 || useradd --system --home-dir {d} --shell /usr/sbin/nologin {spec.user}\n"
        f"  chown -R {spec.user}:{group} {d} && chmod 700 {d}\n"
        f"  systemctl daemon-reload\n"
        f"  systemctl enable --now {name}\n"
        f"then: systemctl status {name}; journalctl -u {name}; systemctl reload {name} (SIGHUP)")
    return path


async def reload_on_sighup(callback: Callable[[], Any], *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run for the daemon's life: on every SIGHUP call ``callback`` (sync or
    async) and log what it returns; a failing reload is logged and the
    daemon keeps running with what it had. Must run in the main thread
    (trio's signal handling). Start it with ``nursery.start`` before
    announcing readiness: until then SIGHUP's default action ends the
    process."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            try:
                res = callback()
                if inspect.isawaitable(res):
                    res = await res
                log.info("SIGHUP: reloaded%s", f": {res}" if res else "")
            except Exception as e:
                log.error("SIGHUP: reload failed, keeping the running configuration: %s", e)
