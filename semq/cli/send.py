"""``semq send``: one document (a file, standard input, or a large document
sent in chunks), as the node's operator or as a user through the node's
user socket; several documents are semq.cli.bulk's."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from semq.cli._common import (
    UsageError,
    check_address,
    check_colleague,
    client_of,
    config_of,
    warn_unknown_target,
)
from semq.cli.bulk import cmd_send_bulk, progress_bar
from semq.cli.users import token_of, user_client
from semq.settings.config import Config

__all__ = ["cmd_send"]


def cmd_send(args: argparse.Namespace) -> int:
    from semq.node.limits import check_document_size

    files = args.files
    if args.ndjson or len(files) > 1 or (files[0] != "-" and Path(files[0]).is_dir()):
        return cmd_send_bulk(args)
    args.file = files[0]
    if args.type is None:
        raise UsageError("--type is required: the AppKey data type, e.g. ORDER")
    if args.key_from_name:
        if args.file == "-":
            raise UsageError("--key-from-name needs a file name, not - (standard input)")
        args.key = Path(args.file).stem
    token = token_of(args)
    # A user's application with its token and the socket's path needs no
    # access to the node's data directory (the node checks the address).
    cfg = None if token is not None and args.socket else config_of(args, "node")
    # (A missing configuration is said before waiting for stdin; what cannot
    # be sent is refused at once, exit 2.)
    org = check_address(args.to, cfg.org) if cfg is not None else ""
    if args.file == "-":
        data = sys.stdin.buffer.read()
    else:
        p = Path(args.file)
        if not p.is_file():
            raise UsageError(f"no such file: {args.file}")
        size = p.stat().st_size
        if token is not None:  # by blocks through the user socket: the node says what it refuses
            return _send_as_user(args, cfg, p, token)
        if cfg is not None and token is None:
            from semq.node.limits import LargeDocumentTooLarge

            if size > cfg.max_document_mib << 20:
                raise UsageError(f"{args.file}: {LargeDocumentTooLarge(size, cfg.max_document_mib << 20)}")
            if size > cfg.large_from_mib << 20:
                return _send_large(args, cfg, org, p, size)
        check_document_size(size)  # before reading it
        data = p.read_bytes()
    check_document_size(len(data))
    if token is not None:
        return _send_as_user(args, cfg, data, token)
    assert cfg is not None
    with client_of(args) as node:
        check_colleague(node, args.to)
    if args.transactional and (args.ordered or args.user or org == cfg.org):
        raise UsageError("--transactional sends to an organization: not with --ordered, --user or a colleague")
    if args.transactional:
        # Seed 002: a half message, sent only after 'semq tx commit ID'.
        from semq.node.txn import Transactions

        with client_of(args) as node:
            known = node.knows(args.to)
            half = Transactions(node).send(
                args.to, data, data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
                save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                reliable=not args.best_effort, encrypt=not args.no_encrypt)
        print(half.id)
        warn_unknown_target(known, args.to)
        if not args.quiet:
            print(f"half message {half.id} stored, NOT sent: 'semq tx commit {half.id}' sends it,"
                  f" 'semq tx rollback {half.id}' discards it", file=sys.stderr)
        return 0
    with client_of(args) as node:
        known = org == cfg.org or node.knows(org)
        lk0 = node.send(
            args.to, data, data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
            save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
            reliable=not args.best_effort, encrypt=not args.no_encrypt, clear_app_key=args.clear_app_key,
            ordered=args.ordered, user=args.user,
        )
        secure = node.config.security
    print(lk0)
    warn_unknown_target(known, org)
    if not args.quiet:
        how = ("signed; NOT end-to-end private (--no-encrypt): the relay can read it" if secure and args.no_encrypt
               else "signed and end-to-end encrypted when sent" if secure
               else "NOT signed or encrypted (security is off for this node)")
        print(f"accepted {len(data)} bytes for {args.to} (SaveFwd={args.save_fwd}, Ack2={int(args.ack2)}); {how}",
              file=sys.stderr)
    return 0


def _send_large(args: argparse.Namespace, cfg: Any, org: str, path: Path, size: int) -> int:
    """``semq send`` of a file over large_from_mib: a large document, copied
    into the data directory (a progress bar on a terminal), then sent in
    chunks by the daemon (semq.node.large)."""
    if args.transactional:
        raise UsageError(f"--transactional: a file of {size} bytes is a large document (over {cfg.large_from_mib}"
                         " MiB), which cannot be a half message")
    with client_of(args) as node:
        check_colleague(node, args.to)
        known = org == cfg.org or node.knows(org)
        bar = progress_bar(size, "B")
        try:
            lk0 = node.send_file(
                args.to, path, progress=bar.update if bar is not None else None, data_type=args.type, domain=args.domain, subtype=args.subtype,
                key=args.key, save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority,
                expires_in=args.expires_in, reliable=not args.best_effort, encrypt=not args.no_encrypt,
                clear_app_key=args.clear_app_key, ordered=args.ordered, user=args.user)
        finally:
            if bar is not None:
                bar.close()
        secure = node.config.security
    print(lk0)
    warn_unknown_target(known, org)
    if not args.quiet:
        how = ("chunks sealed for the target" if secure and not args.no_encrypt
               else "signed; NOT end-to-end private (--no-encrypt)" if secure
               else "NOT signed or encrypted (security is off for this node)")
        print(f"accepted {size} bytes for {args.to} as a large document ({-(-size // (1 << 20))} chunks; {how})",
              file=sys.stderr)
    return 0


def _send_as_user(args: argparse.Namespace, cfg: Config | None, data: bytes | Path, token: str) -> int:
    """``semq send`` with a user's token: through the node's user socket,
    a file (``data`` a path) read and uploaded block by block, up to the
    node's max_document_mib (a progress bar on a terminal)."""
    from semq.ops.usersock import UserSocketError

    if args.transactional:
        raise UsageError("--transactional is for the node's operator, not a user's token")
    options = dict(data_type=args.type, domain=args.domain, subtype=args.subtype, key=args.key,
                   save_fwd=args.save_fwd, ack2=args.ack2, priority=args.priority, expires_in=args.expires_in,
                   encrypt=not args.no_encrypt, clear_app_key=args.clear_app_key, ordered=args.ordered)
    with user_client(args, cfg, token) as me:
        try:
            if isinstance(data, Path):
                size = data.stat().st_size
                bar = progress_bar(size, "B") if size > me.block else None
                try:
                    lk0 = me.send_file(args.to, data, progress=bar.update if bar is not None else None, **options)
                finally:
                    if bar is not None:
                        bar.close()
            else:
                size = len(data)
                lk0 = me.send(args.to, data, **options)
        except UserSocketError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot read {args.file}: {e.strerror or e}") from None
    print(lk0)
    if not args.quiet:
        print(f"accepted {size} bytes from {args.user} for {args.to}", file=sys.stderr)
    return 0
