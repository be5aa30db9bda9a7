"""``semq partner``: the node's AS2 and AS4 partners (docs/interop.md) —
add, list, remove, and ``semq partner cert``, the certificate they know this
node by. A partner's address is ``as2:ID`` or ``as4:ID`` (``semq send --to
as2:ACME``): organization ids are digits and user names have no colon, so
it is never read as either."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from semq.cli._common import UsageError, client_of, config_of
from semq.ops.display import when

__all__ = ["cmd_partner_add", "cmd_partner_cert", "cmd_partner_list", "cmd_partner_remove", "register"]

_AS2_FLAGS = ("sign", "encrypt", "compress", "mdn")


def _cert(path: str) -> bytes:
    from cryptography import x509

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--cert {path}: no such file")
    if p.stat().st_size > 64 * 1024:
        raise UsageError(f"--cert {path}: over 64 KiB, not one PEM certificate")
    data = p.read_bytes()
    try:
        x509.load_pem_x509_certificate(data)
    except ValueError:
        raise UsageError(f"--cert {path}: not a PEM certificate") from None
    return data


def _options(args: argparse.Namespace, protocol: str) -> dict[str, str]:
    from semq.edge.as2 import OPTIONS

    opts: dict[str, str] = {}
    for item in args.option or []:
        k, eq, v = item.partition("=")
        if not eq or not k.strip() or len(item) > 1024:
            raise UsageError(f"--option {item!r} is not KEY=VALUE")
        opts[k.strip()] = v.strip()
    if protocol == "as2":
        for k, v in opts.items():
            if k in OPTIONS and v not in OPTIONS[k]:
                raise UsageError(f"--option {k}={v}: allowed: {', '.join(OPTIONS[k])}")
    for name in _AS2_FLAGS:
        v = getattr(args, name)
        if v is None:
            continue
        if protocol != "as2":
            raise UsageError(f"--{name} is an AS2 option; AS4 takes --option KEY=VALUE")
        if v not in OPTIONS[name]:
            raise UsageError(f"--{name} {v!r}: allowed: {', '.join(OPTIONS[name])}")
        opts[name] = v
    if args.tls_ca is not None:
        opts["tls_ca"] = _cert(args.tls_ca).decode("ascii", "replace")
    if protocol == "as4":
        from semq.edge.as4 import check_options

        if problems := check_options(opts):
            raise UsageError(problems[0])
    if args.require is not None:
        words = {w.strip() for w in args.require.split(",")}
        if not words <= {"signed", "encrypted", "none"}:
            raise UsageError(f"--require {args.require!r}: allowed: signed, encrypted (comma-separated), none")
        opts["require"] = args.require
    return opts


def cmd_partner_add(args: argparse.Namespace) -> int:
    from semq.edge.keys import load_or_make_keys
    from semq.edge.protocol import EdgePartner
    from semq.edge.store import EdgeError, EdgeStore

    if not (args.as2 or args.as4):
        raise UsageError("say the partner's protocol and id: --as2 ID or --as4 ID")
    protocol, ident = ("as2", args.as2) if args.as2 else ("as4", args.as4)
    url = urlsplit(args.url)
    if url.scheme not in ("http", "https") or not url.hostname or len(args.url) > 2000:
        raise UsageError(f"--url {args.url!r} is not an http:// or https:// URL")
    cert = _cert(args.cert)
    opts = _options(args, protocol)
    if protocol == "as4":
        from semq.edge.as4 import check_certificate

        if (why := check_certificate(cert)) is not None:
            raise UsageError(f"--cert {args.cert}: {why}")
    cfg = config_of(args, "node")
    our_id = args.our_id or cfg.org
    with client_of(args) as node:
        try:
            EdgeStore(node.core).add_partner(
                EdgePartner(id=ident, protocol=protocol, url=args.url, their_cert_pem=cert, our_id=our_id,
                            options=opts), int(time.time() * 1000))
        except EdgeError as e:
            raise UsageError(str(e)) from None
    load_or_make_keys(cfg.directory, our_id)
    if not args.quiet:
        print(f"partner {protocol}:{ident} added (we are {our_id!r} to it); send with"
              f" 'semq send --to {protocol}:{ident}'; it needs our certificate: 'semq partner cert'",
              file=sys.stderr)
    return 0


def cmd_partner_list(args: argparse.Namespace) -> int:
    from semq.edge.store import EdgeStore

    with client_of(args) as node:
        facts = EdgeStore(node.core).facts()
    rows: list[dict[str, Any]] = [{"partner": f"{f.partner.protocol}:{f.partner.id}", "protocol": f.partner.protocol,
             "url": f.partner.url, "our_id": f.partner.our_id, "options": dict(f.partner.options),
             "last_exchange_ms": f.last_ms, "backlog": f.backlog, "confirmed": f.confirmed, "failed": f.failed,
             "received": f.received} for f in facts]
    if args.json:
        print(json.dumps({"partners": rows}))
        return 0
    if not rows:
        print("no AS2 or AS4 partners (semq partner add --as2 ID --url URL --cert FILE)")
        return 0
    head = ("PARTNER", "URL", "LAST EXCHANGE", "BACKLOG", "CONFIRMED", "FAILED", "RECEIVED")
    body = [(r["partner"], r["url"], when(r["last_exchange_ms"])[:19] if r["last_exchange_ms"] else "-",
             str(r["backlog"]), str(r["confirmed"]), str(r["failed"]), str(r["received"])) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    for line in (head, *body):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _address(text: str, node: Any) -> tuple[str, str]:
    from semq.edge.store import EdgeError, EdgeStore, parse_edge_address

    try:
        parsed = parse_edge_address(text)
    except EdgeError as e:
        raise UsageError(str(e)) from None
    if parsed is not None:
        return parsed
    found = [(p.protocol, p.id) for p in EdgeStore(node.core).partners() if p.id == text]
    if len(found) != 1:
        raise UsageError(f"partner {text!r}: {'no such partner' if not found else 'ambiguous: say as2:ID or as4:ID'}"
                         " (semq partner list)")
    return found[0]


def cmd_partner_remove(args: argparse.Namespace) -> int:
    from semq.edge.store import EdgeError, EdgeStore

    with client_of(args) as node:
        protocol, ident = _address(args.partner, node)
        try:
            gone = EdgeStore(node.core).remove_partner(protocol, ident)
        except EdgeError as e:
            raise UsageError(str(e)) from None
    if not gone:
        raise UsageError(f"partner {protocol}:{ident}: no such partner (semq partner list)")
    if not args.quiet:
        print(f"partner {protocol}:{ident} removed", file=sys.stderr)
    return 0


def cmd_partner_cert(args: argparse.Namespace) -> int:
    from semq.edge.keys import edge_dir, load_or_make_keys

    cfg = config_of(args, "node")
    keys = load_or_make_keys(cfg.directory, cfg.org)
    sys.stdout.write(keys.cert_pem.decode())
    if not args.quiet:
        print(f"(the certificate AS2 / AS4 partners verify this node's signatures with and encrypt to:"
              f" {edge_dir(cfg.directory) / 'cert.pem'})", file=sys.stderr)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("partner", help="the node's AS2 and AS4 partners: add, list, remove, our certificate",
                       description="Partners that speak AS2 or AS4 instead of SEMQ (docs/interop.md). Their"
                                   " address is as2:ID or as4:ID: 'semq send --to as2:ACME'.")
    ps = p.add_subparsers(dest="partner_cmd", metavar="COMMAND", required=True)
    add = ps.add_parser("add", parents=[common], help="add an AS2 or AS4 partner")
    who = add.add_mutually_exclusive_group()  # (one of them: said by the command, one line)
    who.add_argument("--as2", metavar="ID", help="its AS2 name (the AS2-From it sends, the AS2-To we send)")
    who.add_argument("--as4", metavar="ID", help="its AS4 party id")
    add.add_argument("--url", required=True, help="where its gateway receives messages (http:// or https://)")
    add.add_argument("--cert", required=True, metavar="FILE",
                     help="its certificate (PEM): its signatures verify with it, our messages are encrypted to it")
    add.add_argument("--our-id", metavar="ID", help="our name towards it (AS2-From); default: our organization id")
    add.add_argument("--sign", help="AS2: digest we sign with: sha256 (default), sha384, sha512, none")
    add.add_argument("--encrypt", help="AS2: aes256-cbc (default), aes128-cbc, none")
    add.add_argument("--compress", help="AS2: zlib or none (default)")
    add.add_argument("--mdn", help="AS2: the receipt we ask for and accept: signed (default) or unsigned")
    add.add_argument("--require", help="what its messages must be: signed, encrypted (comma-separated) or none;"
                                       " default: what we send it")
    add.add_argument("--tls-ca", metavar="FILE",
                     help="an https URL: the certificate (PEM) its server must present, pinned; default: the"
                          " system's CAs and the host name")
    add.add_argument("--option", action="append", metavar="KEY=VALUE",
                     help="a protocol option as is; repeatable. AS4 (Peppol): sender, recipient, document_type,"
                          " process, country (needed to send); party_id, participants, max_bytes"
                          " (docs/interop-as4.md)")
    add.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")
    add.set_defaults(func=cmd_partner_add)
    ls = ps.add_parser("list", parents=[common], help="the AS2 and AS4 partners, their last exchange and backlog")
    ls.add_argument("--json", action="store_true", help="as JSON")
    ls.set_defaults(func=cmd_partner_list)
    rm = ps.add_parser("remove", parents=[common], help="remove a partner (refused while documents to it wait)")
    rm.add_argument("partner", help="as2:ID, as4:ID, or an ID that only one protocol has")
    rm.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")
    rm.set_defaults(func=cmd_partner_remove)
    cert = ps.add_parser("cert", parents=[common], help="print the certificate partners know this node by (PEM)")
    cert.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")
    cert.set_defaults(func=cmd_partner_cert)
