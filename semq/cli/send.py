"""``semq send``: one document (a file, standard input, or a large document
sent in chunks), as the node's operator or as a user through the node's
user socket; several documents are semq.cli.bulk's."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any, Final

from semq.cli._common import (
    UsageError,
    check_address,
    check_colleague,
    client_of,
    config_of,
    positive_seconds,
    warn_unknown_target,
)
from semq.cli.bulk import BULK_BATCH, cmd_send_bulk, file_problem, progress_bar, warn_empty
from semq.cli.users import token_of, user_client, user_options
from semq.settings.config import Config

__all__ = ["SEND_EPILOG", "cmd_send", "register"]


SEND_EPILOG: Final = """\
examples:
  semq send --to 56001 --type ORDER --domain trade --subtype PO --key S0001 order.xml
  echo 'INV-0042 310.00 EUR' | semq send --to 56001 --type INVOICE --key INV-0042 -
  semq send --to 56001 --type INVOICE --key-from-name out/*.xml > lk0s.txt
  semq send --to 56001 --type INVOICE --key-from-name --each-file out/
  printf '%s\\n' '{"data": "<order/>", "key": "S1"}' '{"file": "scan.pdf", "type": "SCAN"}' \\
    | semq send --to 56001 --type ORDER --ndjson -
  semq send --to 56001 --type CAD --key DWG-7 drawing.step     # 1.2 GB: a large document, in chunks

Several documents: a file that cannot be sent (too large, a bad key) is
refused before anything is sent; a bad NDJSON line stops the command with
nothing of its batch accepted, while the batches before it stay accepted."""


def cmd_send(args: argparse.Namespace) -> int:
    from semq.node.limits import check_document_size

    files = args.files
    directory = any(f != "-" and Path(f).is_dir() for f in files)
    if args.ndjson or len(files) > 1 or directory:
        return cmd_send_bulk(args)
    args.file = files[0]
    if _edge_address(args.to):
        return _send_edge(args)
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
        if not data:
            warn_empty(["standard input"])
    else:
        p = Path(args.file)
        why = file_problem(args.file)
        if why is not None:
            raise UsageError(why)
        size = p.stat().st_size
        if size == 0:
            warn_empty([args.file])
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
    if args.transactional:
        return _send_half(args, cfg, org, data)
    return _send_document(args, cfg, org, data)


def _send_half(args: argparse.Namespace, cfg: Config, org: str, data: bytes) -> int:
    """``semq send --transactional`` (seed 002): a half message, sent only
    after 'semq tx commit ID'."""
    if args.ordered or args.user or org == cfg.org:
        raise UsageError("--transactional sends to an organization: not with --ordered, --user or a colleague")
    from semq.node.features.txn import Transactions

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


def _edge_address(to: str) -> bool:
    from semq.edge.store import EdgeError, parse_edge_address

    try:
        return parse_edge_address(to) is not None
    except EdgeError as e:
        raise UsageError(f"--to {to!r}: {e}") from None


def _send_edge(args: argparse.Namespace) -> int:
    """One document for an AS2 / AS4 partner (docs/interop.md): its key on stdout."""
    from semq.edge.store import EDGE_MAX_DOCUMENT

    if args.ndjson or len(args.files) > 1:
        raise UsageError(f"--to {args.to}: one document at a time for an AS2 or AS4 partner")
    ctype = args.type if args.type and "/" in args.type else "application/octet-stream"
    if args.file == "-":
        data = sys.stdin.buffer.read(EDGE_MAX_DOCUMENT + 1)
    else:
        why = file_problem(args.file)
        if why is not None:
            raise UsageError(why)
        if Path(args.file).stat().st_size > EDGE_MAX_DOCUMENT:
            raise UsageError(f"{args.file}: over the edge's {EDGE_MAX_DOCUMENT >> 20} MiB per document")
        data = Path(args.file).read_bytes()
    if len(data) > EDGE_MAX_DOCUMENT:
        raise UsageError(f"standard input: over the edge's {EDGE_MAX_DOCUMENT >> 20} MiB per document")
    with client_of(args) as node:
        key = node.send_edge(args.to, data, content_type=ctype)
    print(key)
    if not args.quiet:
        print(f"accepted {len(data)} bytes ({ctype}) for {args.to}: sent by the node's edge sender, confirmed by"
              " the partner's signed receipt ('semq track " + key + "')", file=sys.stderr)
    return 0


def _send_document(args: argparse.Namespace, cfg: Config, org: str, data: bytes) -> int:
    """One document (``data``) accepted by the node: its LK0 on stdout."""
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


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """``semq send``."""
    x = sub.add_parser(
        "send", parents=[common], help="hand documents to the node",
        description=textwrap.fill(
            "Hand documents to the node: durable in its store when the command returns, whether or not its daemon"
            " runs. One FILE (or - for standard input) is one document; several FILEs, a DIRECTORY with"
            " --each-file (its regular files, in name order) or --ndjson lines are accepted in transactions of"
            " --batch documents. Prints"
            " one LK0 per document on stdout, in input order. One FILE over large_from_mib (4 MiB) is sent as"
            " a large document: copied into the data directory, then streamed in sealed chunks and resumed"
            " after a cut or a restart (up to max_document_mib, 4096).", 79),
        epilog=SEND_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("--to", required=True,
                   help="target: an organization id (56001), a user of one (56001/alice), or a user of this"
                        " node (alice: the document never leaves the node)")
    x.add_argument("--type", help="AppKey data type, e.g. ORDER (required, except with --ndjson, whose lines"
                                  " may give their own \"type\")")
    x.add_argument("--ordered", metavar="CHANNEL",
                   help="ordered channel: documents of one channel to one target reach its application in the"
                        " order they were sent (a failed one is announced as a gap, then the channel moves on)")
    user_options(x, "the user of this node the document is from")
    x.add_argument("--domain", default="", help="AppKey domain, e.g. trade")
    x.add_argument("--subtype", default="", help="AppKey subtype, e.g. PO")
    x.add_argument("--key", default="", help="AppKey key, e.g. S0001 (returned unchanged in acknowledgements)")
    x.add_argument("--key-from-name", action="store_true",
                   help="the AppKey key of each file is its name without the extension (INV-0042.xml: INV-0042)")
    x.add_argument("--save-fwd", type=int, default=3, choices=[1, 2, 3],
                   help="when the target is offline: 1 drop it (and tell the sender), 2 store it at the"
                        " platform, 3 must be delivered (default)")
    x.add_argument("--ack2", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the receiver for an end-to-end confirmation (default on)")
    x.add_argument("--priority", type=int, default=0, help="0..9, higher goes first (default 0)")
    x.add_argument("--expires-in", type=positive_seconds, metavar="SECONDS",
                   help="seconds until the document expires (over 0)")
    x.add_argument("--best-effort", action="store_true", help="Reliable=0: never stored, acked or retried")
    x.add_argument("--clear-app-key", action="store_true",
                   help="send the AppKey readable in the header (by default it travels sealed inside the"
                        " document: the relay routes without it)")
    x.add_argument("--no-encrypt", action="store_true",
                   help="signed but NOT end-to-end private: the platform operator can read it")
    x.add_argument("--transactional", action="store_true",
                   help="store a half message; it is sent only after 'semq tx commit ID' (or never: 'semq tx rollback ID')")
    x.add_argument("--ndjson", action="store_true",
                   help="the input (a file, or - for standard input) holds one JSON object per line, one"
                        " document each: data (text), data_b64 or file, and optionally key, type, domain,"
                        " subtype, priority, to (over the options')")
    x.add_argument("--batch", type=int, default=BULK_BATCH, metavar="N",
                   help=f"documents per transaction when sending several (default {BULK_BATCH})")
    x.add_argument("--each-file", action="store_true",
                   help="a directory given as FILE sends each regular file directly in it (in name order) as"
                        " one document; without this option a directory is refused")
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr (warnings still show)")
    x.add_argument("files", nargs="+", metavar="FILE",
                   help="file to send, - for standard input, several files, or a directory with --each-file")
    x.set_defaults(func=cmd_send)
