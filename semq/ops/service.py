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

import difflib
import inspect
import logging
import os
import re
import signal
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import trio

__all__ = [
    "DEFAULT_UNIT_DIR",
    "DEFAULT_USER",
    "UnitExists",
    "UnitRefused",
    "UnitSpec",
    "check_data_dir",
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


class UnitRefused(ValueError):
    """The unit could not run as asked (its data directory, its account):
    the reason and the fix in one line; exit status 2."""


class UnitExists(UnitRefused):
    """A different unit file is there already and ``--force`` was not given."""


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
                 force: bool = False, out: Callable[[str], Any] = print) -> Path:
    """Write the unit for ``spec`` into ``unit_dir`` (0644), show what was
    written (the unit, or with ``force`` the difference from the unit it
    replaced) and tell what to run next; with ``print_only`` print the unit
    and write nothing. A unit file already there with other contents is
    replaced only with ``force`` (else UnitExists naming it); one with the
    same contents is left as it is. Returns the unit's path. Never runs
    systemctl."""
    name = unit_name(spec.role, spec.ident)
    text = unit_text(spec)
    path = Path(unit_dir) / name
    if print_only:
        out(text.rstrip("\n"))
        return path
    try:
        old: str | None = path.read_text("utf-8")
    except FileNotFoundError:
        old = None
    if old == text:
        out(f"{path} is already this unit; nothing written")
        return path
    if old is not None and not force:
        raise UnitExists(f"{path} exists and differs from the unit this would write; --force replaces it"
                         " (and shows the difference), --print shows the new one")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text(text, "utf-8")
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    if old is None:
        out(text.rstrip("\n"))
        out(f"wrote {path} (above)")
    else:
        out("".join(difflib.unified_diff(old.splitlines(keepends=True), text.splitlines(keepends=True),
                                         fromfile=f"{path} (before)", tofile=f"{path} (now)")).rstrip("\n"))
        out(f"replaced {path} (the difference is above)")
    start = f"systemctl enable --now {name}" if old is None else f"systemctl restart {name}"
    out(f"next, as root:\n"
        f"  systemctl daemon-reload\n"
        f"  {start}\n"
        f"then: systemctl status {name}; journalctl -u {name}; systemctl reload {name} (SIGHUP)")
    return path


def check_data_dir(spec: UnitSpec) -> None:
    """Refuse a data directory the unit could not use, before a unit that
    would fail at start is written: it must exist, hold a configuration of
    ``spec.role``, and be reachable and owned (with everything in it) by the
    account the unit runs as (``User=``; the directory is owner-only).
    Raises UnitRefused naming the path, the reason and the fix; ConfigError
    for a configuration that does not load."""
    import grp
    import pwd

    from semq.settings.config import CONFIG_NAME, load_config

    d = Path(spec.directory).absolute()
    init = f"semq {spec.role} init --dir {d}"
    if not d.exists():
        raise UnitRefused(f"data directory {d} does not exist: create it first ({init} ...)")
    if not d.is_dir():
        raise UnitRefused(f"data directory {d} is not a directory")
    if not (d / CONFIG_NAME).is_file():
        raise UnitRefused(f"data directory {d} is not initialised (no {CONFIG_NAME}): run {init} ... first")
    cfg = load_config(d)
    if cfg.role != spec.role:
        raise UnitRefused(f"{d} holds a {cfg.role}, not a {spec.role}: --role {cfg.role}")
    group = spec.group or spec.user
    try:
        account = pwd.getpwnam(spec.user)
    except KeyError:
        raise UnitRefused(f"user {spec.user} (User= of the unit) does not exist: create it and give it the"
                          f" directory first: useradd --system --home-dir {d} --shell /usr/sbin/nologin"
                          f" {spec.user} && chown -R {spec.user}:{group} {d}") from None
    try:
        grp.getgrnam(group)
    except KeyError:
        raise UnitRefused(f"group {group} (Group= of the unit) does not exist: groupadd --system {group},"
                          " or --group NAME") from None
    uid = account.pw_uid
    if uid == 0:
        return  # root reaches and owns whatever it needs
    gids = {account.pw_gid, *(g.gr_gid for g in grp.getgrall() if spec.user in g.gr_mem)}
    for parent in reversed(d.parents):
        if not _may(parent.stat(), uid, gids, 0o1):
            raise UnitRefused(f"{spec.user} cannot reach {d}: {parent} is not searchable by it"
                              f" (mode {stat.S_IMODE(parent.stat().st_mode):04o}); move the data directory,"
                              f" or chmod o+x {parent}")
    fix = f"chown -R {spec.user}:{group} {d}"
    st = d.stat()
    if st.st_uid != uid:
        raise UnitRefused(f"data directory {d} is owned by {_owner(st.st_uid)}, not by {spec.user} (User= of the"
                          f" unit), which must own it: {fix}")
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        raise UnitRefused(f"data directory {d} (mode {stat.S_IMODE(st.st_mode):04o}) is not readable, writable"
                          f" and searchable by its owner {spec.user}: chmod 700 {d}")
    others = [p for p in d.rglob("*") if not p.is_symlink() and p.lstat().st_uid != uid]
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise UnitRefused(f"{others[0]} is owned by {_owner(others[0].lstat().st_uid)}, not by {spec.user}"
                          f" (User= of the unit){more}: {fix}")


def _may(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    """Whether ``uid`` (in groups ``gids``) has permission ``bits`` (as for
    others: 1 search, 2 write, 4 read) on a file with ``st``."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        return mode >> 6 & bits == bits
    if st.st_gid in gids:
        return mode >> 3 & bits == bits
    return mode & bits == bits


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


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
