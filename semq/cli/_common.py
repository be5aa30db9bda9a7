"""What the ``semq`` commands share: the user's-mistake error
(``UsageError``, exit 2), the data directory and configuration a command
names, the node client, how times are shown, a listening address's port,
and the checks of a ``--to`` address."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from semq.ops.display import age, shown
from semq.settings.config import Config, data_dir, load_config

__all__ = ["UsageError", "app_key_shown", "check_address", "check_colleague", "client_of", "config_of",
           "daemon_status", "dir_of", "format_age", "format_time", "positive_seconds", "require_port",
           "warn_unknown_target"]


class UsageError(Exception):
    """A user's mistake: one ``error:`` line, exit 2 (semq.cli.app.run_command)."""


def positive_seconds(text: str) -> float:
    """An option's seconds (``type=``): a finite number over 0; else the
    parser's one-line refusal naming the value (``--expires-in -5``: the
    document could only expire)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return v


def dir_of(args: argparse.Namespace) -> Path:
    """The data directory a command names: ``--dir``, else $SEMQ_DIR, else ./semq-data."""
    return data_dir(getattr(args, "dir", None))


def config_of(args: argparse.Namespace, role: str | None = None) -> Config:
    """The configuration of the command's data directory; UsageError when it
    holds the other ``role``."""
    cfg = load_config(dir_of(args))
    if role and cfg.role != role:
        raise UsageError(f"{cfg.directory} holds a {cfg.role}, not a {role}")
    return cfg


def daemon_status(cfg: Config) -> dict[str, Any] | None:
    """What the daemon of ``cfg``'s directory last wrote to its status.json
    (every second while it runs); None when it does not run (nothing
    written in the last 5 s)."""
    try:
        st: dict[str, Any] = json.loads(cfg.status_path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if time.time() * 1000 - st.get("time_ms", 0) > 5000:
        return None
    return st


def format_age(ms: int | None) -> str:
    """How long ago a ms timestamp was, for tables: 42s, 17m, 3.5h, 2.0d."""
    return age(ms)


def format_time(ms: int | None) -> str:
    """A ms timestamp as this machine's local time, ``2026-12-05 10:47:55``."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def app_key_shown(ak: Any) -> str:
    """An AppKey as ``domain/type/subtype/key`` (an AppKey, or its dict from the user socket)."""
    if isinstance(ak, dict):
        parts = (ak["domain"], ak["data_type"], ak["subtype"], ak["key"])
    else:
        parts = (ak.domain, ak.data_type, ak.subtype, ak.key)
    return "/".join(shown(p) for p in parts)


def client_of(args: argparse.Namespace) -> Any:
    """The NodeClient of the command's node (UsageError for a platform's directory)."""
    from semq.node.api import NodeClient

    return NodeClient(dir_of(args), config=config_of(args, "node"))


def require_port(text: str, option: str) -> str:
    """A listening address given on the command line must say its port:
    ``--listen localhost`` would otherwise listen on a default port the
    user did not choose (and that another instance may hold). Returns
    ``text``; raises UsageError naming the option and an example."""
    t = text.strip()
    has_port = ("]:" in t) if t.startswith("[") else t.count(":") == 1
    if not has_port:
        host = t.strip("[]") or "127.0.0.1"
        example = f"[{host}]" if ":" in host else host
        raise UsageError(f"{option} {text!r} has no port; a listening address needs one: HOST:PORT,"
                         f" e.g. {example}:7410 (port 0: any free port)")
    return text


def check_address(to: str, me: str) -> str:
    """The organization of a ``--to`` address (ORG, ORG/USER or a
    colleague's name), checked; UsageError naming what is wrong."""
    from semq.node.envelope import EnvelopeError, parse_address
    from semq.node.limits import check_target

    try:
        org, user = parse_address(to, me)
    except EnvelopeError as e:
        raise UsageError(f"--to {to!r}: {e}") from None
    if not (org == me and user):
        check_target(org, me, "--to")
    return org


def check_colleague(node: Any, to: str) -> None:
    """A ``--to`` that can only name a user of this node must name one."""
    from semq.node.envelope import parse_address
    from semq.settings.config import ORG_ID_ALLOWED

    org, user = parse_address(to, node.org)
    if org == node.org and user and user not in {u.name for u in node.users()}:
        raise UsageError(f"--to {json.dumps(to)} is not an organization id nor a user of this node"
                         f" ('semq user list'); allowed: {ORG_ID_ALLOWED}, ORG/USER, or a user of this node")


def warn_unknown_target(known: bool, org: str) -> None:
    """A target the node had not heard of is accepted (it may be new), but
    said, once the document is accepted: a mistyped organization id would
    otherwise only show as a NACK later. Shown with -q too: -q silences
    notes, not warnings."""
    if not known:
        print(f"warning: organization {org} is not known to this node yet; the platform decides whether it exists",
              file=sys.stderr)
