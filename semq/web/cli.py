"""``semq console user add|list|remove``: the web console's accounts
(semq.web.users). Works with the daemon running or not: the console reads
the accounts again at each login."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _store(args: argparse.Namespace) -> Any:
    from semq.settings.config import data_dir, load_config

    from .users import UserStore

    cfg = load_config(data_dir(getattr(args, "dir", None)))  # (a data directory, or one clear error line)
    return UserStore(cfg.directory)


def _password(args: argparse.Namespace) -> str:
    from .users import UserError

    if args.password_file:
        try:
            text = Path(args.password_file).read_text("utf-8")
        except OSError as e:
            raise UserError(f"cannot read the password file: {e}") from None
        return text.rstrip("\r\n")
    if not sys.stdin.isatty():
        raise UserError("no terminal to ask the password on: give --password-file FILE")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise UserError("the passwords differ")
    return first


def cmd_console_user(args: argparse.Namespace) -> int:
    from .users import UserError

    store = _store(args)
    if args.action == "list":
        accounts = store.list()
        if args.json:
            print(json.dumps([{"name": a.name, "role": a.role.value, "created_ms": a.created_ms} for a in accounts]))
        else:
            for a in accounts:
                print(f"{a.name:<24} {a.role.value}")
            print(f"{len(accounts)} console user(s) in {store.path}", file=sys.stderr)
        return 0
    if not args.name:
        raise UserError(f"console user {args.action} needs a NAME")
    if args.action == "add":
        if not args.role:
            raise UserError("console user add needs --role viewer or --role operator")
        acct = store.add(args.name, args.role, _password(args))
        print(f"console user {acct.name} ({acct.role.value}) saved in {store.path}")
        return 0
    store.remove(args.name)
    print(f"console user {args.name} removed (its open sessions end at their next request)")
    return 0


def register(sub: Any) -> None:
    """Add ``console`` to the subparsers ``sub`` of the ``semq`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    console = sub.add_parser("console", help="the web console (semq node|platform run --web HOST:PORT)")
    csub = console.add_subparsers(dest="sub", required=True)
    x = csub.add_parser("user", parents=[common], help="the web console's accounts (roles viewer, operator)")
    x.add_argument("action", choices=["add", "list", "remove"],
                   help="add an account (or replace its password and role), list them, or remove one")
    x.add_argument("name", nargs="?", help="account name: a-z 0-9 . _ -, starting with a letter")
    x.add_argument("--role", choices=["viewer", "operator"],
                   help="add: viewer (reads every page) or operator (also resend, requeue, purge, drain)")
    x.add_argument("--password-file", metavar="FILE",
                   help="add: read the password from FILE (its first line); default: ask on the terminal")
    x.add_argument("--json", action="store_true", help="list: as JSON")
    x.set_defaults(func=cmd_console_user)
