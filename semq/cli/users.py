"""A node's users: ``semq user add|list|remove``, and how a command acts
as one (its token, the node's user socket: ``--user``, ``--token-file``,
``--socket``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from semq.cli._common import UsageError, client_of, config_of, format_age
from semq.settings.config import Config

__all__ = ["cmd_user", "register", "token_of", "user_client", "user_options"]


def token_of(args: argparse.Namespace) -> str | None:
    """A user's token: ``--token-file``, else $SEMQ_TOKEN; None: act as the
    node's operator (who can open its store)."""
    path = getattr(args, "token_file", None)
    if path:
        try:
            return Path(path).read_text("utf-8").strip()
        except OSError as e:
            raise UsageError(f"cannot read the token file {path}: {e.strerror}") from None
    return os.environ.get("SEMQ_TOKEN") or None


def user_client(args: argparse.Namespace, cfg: Config | None, token: str) -> Any:
    from semq.ops.usersock import UserClient, user_socket_path

    if not args.user:
        raise UsageError("a token (SEMQ_TOKEN or --token-file) needs --user NAME")
    if getattr(args, "socket", None):
        path: Path | None = Path(args.socket)
    else:
        path = user_socket_path(cfg if cfg is not None else config_of(args, "node"))
    if path is None:
        raise UsageError("this node has no user socket (user_socket is empty in semq.toml); use --socket PATH")
    return UserClient(path, args.user, token)


def user_options(x: argparse.ArgumentParser, what: str) -> None:
    x.add_argument("--user", metavar="NAME", help=f"{what}; with a token ($SEMQ_TOKEN or --token-file) this"
                                                   " goes through the node's user socket as that user")
    x.add_argument("--token-file", metavar="FILE", help="the user's token (else $SEMQ_TOKEN)")
    x.add_argument("--socket", metavar="PATH", help="the node's user socket (default: its user_socket setting)")


def cmd_user(args: argparse.Namespace) -> int:
    from semq.node.users import UserError

    with client_of(args) as node:
        try:
            if args.action == "list":
                for u in node.users():
                    print(f"{u.name:<24} {u.os_user or '-':<16} added {format_age(u.created_ms)} ago")
                return 0
            if not args.name:
                raise UsageError(f"user {args.action} needs a user name")
            if args.action == "add":
                token = node.add_user(args.name, os_user=args.os_user)
                print(token)
                print(f"user {args.name} added to {node.org}; its token is above, shown this once (only its"
                      f" digest is kept): give it to {args.name}'s application (SEMQ_TOKEN)", file=sys.stderr)
                return 0
            node.remove_user(args.name)
            print(f"user {args.name} removed (its documents stay)", file=sys.stderr)
            return 0
        except UserError as e:
            raise UsageError(str(e)) from None


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq user``."""
    x = sub.add_parser("user", parents=[common], help="users inside this organization and their tokens")
    x.add_argument("action", choices=["add", "list", "remove"],
                   help="add a user (prints its token once), list them, or remove one")
    x.add_argument("name", nargs="?", help="user name: a-z 0-9 . _ -, starting with a letter (e.g. alice)")
    x.add_argument("--os-user", default="", metavar="ACCOUNT",
                   help="add: also accept this operating-system account on the user socket, without a token")
    x.set_defaults(func=cmd_user)
