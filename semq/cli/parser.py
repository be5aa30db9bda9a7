"""The parser tree of ``semq``: every command, its options and help, each
command group's handler from its module (a mistake in a command line is
one ``error:`` line, exit 2)."""

from __future__ import annotations

import argparse
import textwrap
from typing import Final, NoReturn

from semq import __version__
from semq.cli.bulk import BULK_BATCH
from semq.cli.inbox import INBOX_LIMIT, cmd_inbox
from semq.cli.node import (
    cmd_node_import,
    cmd_node_init,
    cmd_node_rollover,
    cmd_node_run,
    cmd_node_trust,
    direct_options,
)
from semq.cli.platform import (
    cmd_platform_enroll,
    cmd_platform_init,
    cmd_platform_migrate,
    cmd_platform_register,
    cmd_platform_revoke,
    cmd_platform_run,
)
from semq.cli.send import cmd_send
from semq.cli.status import cmd_messages, cmd_status
from semq.cli.users import cmd_user, user_options
from semq.cli.watch import register as register_watch
from semq.ops.cli import register as register_ops
from semq.ops.display import MAX_LIMIT
from semq.ops.runtime import add_run_options

__all__ = ["SEND_EPILOG", "build_parser"]


SEND_EPILOG: Final = """\
examples:
  semq send --to 56001 --type ORDER --domain trade --subtype PO --key S0001 order.xml
  echo 'INV-0042 310.00 EUR' | semq send --to 56001 --type INVOICE --key INV-0042 -
  semq send --to 56001 --type INVOICE --key-from-name out/*.xml > lk0s.txt
  semq send --to 56001 --type INVOICE --key-from-name out/
  printf '%s\\n' '{"data": "<order/>", "key": "S1"}' '{"file": "scan.pdf", "type": "SCAN"}' \\
    | semq send --to 56001 --type ORDER --ndjson -
  semq send --to 56001 --type CAD --key DWG-7 drawing.step     # 1.2 GB: a large document, in chunks

Several documents: a file that cannot be sent (too large, a bad key) is
refused before anything is sent; a bad NDJSON line stops the command with
nothing of its batch accepted, while the batches before it stay accepted."""


class _Parser(argparse.ArgumentParser):
    """The ``semq`` parser and, through ``add_subparsers``, every command's:
    a mistake in the command line is one ``error:`` line naming where the
    help is, like every other error, not the usage text and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    p = _Parser(prog="semq", description="SEMQ store-and-forward messaging", parents=[common])
    p.add_argument("--version", action="version", version=f"semq {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log more; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    plat = sub.add_parser("platform", help="the relay").add_subparsers(dest="sub", required=True)
    x = plat.add_parser("init", parents=[common], help="create the platform's config, store and CA")
    x.add_argument("--listen", default="127.0.0.1:7410", metavar="HOST:PORT",
                   help="where the relay listens (default 127.0.0.1:7410; port 0: any free port at each start)")
    x.add_argument("--id", default="platform", help="the platform's endpoint id (default platform)")
    x.add_argument("--name", action="append", default=[], help="extra DNS name / IP for the TLS certificate")
    x.add_argument("--no-security", action="store_true", help="plain TCP, no CA (testing only)")
    x.add_argument("--store", metavar="URL",
                   help="keep the store in PostgreSQL (postgresql://USER@HOST:PORT/DB) instead of the SQLite file"
                        " platform.sqlite: several 'semq platform run' on copies of this directory then form one"
                        " platform")
    x.set_defaults(func=cmd_platform_init)
    x = plat.add_parser(
        "migrate", parents=[common], help="move a stopped platform's SQLite store into PostgreSQL",
        description="Copy the stopped platform's store (platform.sqlite) into an empty PostgreSQL database in"
                    " one transaction, check the row counts, then name the database in semq.toml."
                    " platform.sqlite is kept as it was.")
    x.add_argument("--to", required=True, metavar="URL",
                   help="the PostgreSQL database to move the store into (postgresql://USER@HOST:PORT/DB): empty,"
                        " or made by 'semq platform init --store' and never run")
    x.set_defaults(func=cmd_platform_migrate)
    x = plat.add_parser("run", parents=[common], help="run the relay")
    x.add_argument("--listen", help="HOST:PORT (port 0 = any free port)")
    x.add_argument("--inquiry-interval", metavar="SECONDS", help="default: the configuration's (15)")
    add_run_options(x)
    x.set_defaults(func=cmd_platform_run)
    x = plat.add_parser("register", parents=[common], help="make organizations known (and grant them units)")
    x.add_argument("orgs", nargs="+", metavar="ORG", help="organization ids, e.g. 77000")
    x.add_argument("--units", type=int, metavar="N",
                   help="grant each N units (its node may run that many, each holding a connection);"
                        " default: 1 for an organization new here, a known one keeps its grant")
    x.set_defaults(func=cmd_platform_register)
    x = plat.add_parser("enroll", parents=[common], help="issue a certificate from a node's request")
    x.add_argument("csr", help="the node's node.csr.pem")
    x.add_argument("--org", help="organization the request must name")
    x.add_argument("--rollover", action="store_true",
                   help="the organization already holds a valid certificate: issue a second one (key rollover)")
    x.add_argument("--out", help="certificate file to write (default ORG.pem)")
    x.add_argument("--units", type=int, metavar="N",
                   help="grant the organization N units (default: 1, or what it was granted before)")
    x.set_defaults(func=cmd_platform_enroll)
    x = plat.add_parser("revoke", parents=[common], help="revoke an organization's certificates")
    x.add_argument("org", nargs="?", default="", help="the organization whose certificates to revoke")
    x.add_argument("--serial", help="revoke one certificate by serial (hex) instead")
    x.set_defaults(func=cmd_platform_revoke)
    x = plat.add_parser("status", parents=[common], help="stored messages, online nodes")
    x.add_argument("--json", action="store_true", help="as JSON, for programs")
    x.set_defaults(func=cmd_status)

    node = sub.add_parser("node", help="an organization's node").add_subparsers(dest="sub", required=True)
    x = node.add_parser("init", parents=[common], help="create the node's config and store")
    x.add_argument("--org", required=True, help="the organization id: a number, e.g. 10008")
    x.add_argument("--platform", default="127.0.0.1:7410", metavar="HOST:PORT[,HOST:PORT...]",
                   help="the platform's address; several: tried in turn, the next when one fails"
                        " (default 127.0.0.1:7410)")
    x.add_argument("--no-security", action="store_true", help="plain TCP, no keys (testing only)")
    x.add_argument("--enroll-from", metavar="PLATFORM_DIR",
                   help="platform directory on this machine: enroll at once (demo, tests, one-host setups)")
    direct_options(x, init=True)
    x.add_argument("--units", type=int, default=1, metavar="N",
                   help="run the node as N processes (units), each with its own store, to spread its load over"
                        " cores (default 1; see docs/operations.md)")
    x.set_defaults(func=cmd_node_init)
    x = node.add_parser("rollover", parents=[common], help="new keys and certificate; the old one overlaps")
    x.add_argument("--enroll-from", metavar="PLATFORM_DIR", help="enroll at once with a platform on this host")
    x.add_argument("--no-endorse", action="store_true",
                   help="the current key is lost or revoked: no endorsement by it (nodes that pinned the current"
                        " certificate then need their operator's 'semq node trust')")
    x.set_defaults(func=cmd_node_rollover)
    x = node.add_parser("trust", parents=[common],
                        help="another organization's certificates this node trusts (pinned, refused); accept one")
    x.add_argument("org", help="the organization")
    x.add_argument("fingerprint", nargs="?", help="accept this certificate (SHA-256 fingerprint, or a unique"
                                                  " prefix of a refused one)")
    x.add_argument("--forget", metavar="FINGERPRINT", help="no longer trust this pinned certificate")
    x.add_argument("--json", action="store_true", help="what is pinned and refused, as JSON")
    x.set_defaults(func=cmd_node_trust)
    x = node.add_parser("import", parents=[common], help="install the certificate the platform issued")
    x.add_argument("--cert", required=True, metavar="FILE", help="the certificate the platform issued (ORG.pem)")
    x.add_argument("--ca", required=True, metavar="FILE", help="the platform's ca.pem")
    x.set_defaults(func=cmd_node_import)
    x = node.add_parser("run", parents=[common], help="run the node daemon")
    x.add_argument("--platform", metavar="HOST:PORT[,HOST:PORT...]",
                   help="the platform's address or addresses (default: the configuration's)")
    x.add_argument("--inquiry-interval", metavar="SECONDS", help="default: the configuration's (15)")
    direct_options(x, init=False)
    x.add_argument("--unit", type=int, metavar="K",
                   help="run only unit K of a node of several units (semq node run starts each one this way)")
    add_run_options(x)
    x.set_defaults(func=cmd_node_run)

    x = sub.add_parser(
        "send", parents=[common], help="hand documents to the node",
        description=textwrap.fill(
            "Hand documents to the node: durable in its store when the command returns, whether or not its daemon"
            " runs. One FILE (or - for standard input) is one document; several FILEs, a DIRECTORY (its regular"
            " files, in name order) or --ndjson lines are accepted in transactions of --batch documents. Prints"
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
    x.add_argument("--expires-in", type=float, metavar="SECONDS", help="seconds until the document expires")
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
    x.add_argument("-q", "--quiet", action="store_true", help="no note on stderr (warnings still show)")
    x.add_argument("files", nargs="+", metavar="FILE",
                   help="file to send, - for standard input, several files, or a directory")
    x.set_defaults(func=cmd_send)

    x = sub.add_parser(
        "inbox", parents=[common], help="documents that arrived",
        description=textwrap.fill("List the documents that arrived (unacknowledged ones by default), show or save one, acknowledge"
                    " them, or follow the inbox: each document printed as it arrives, woken by the running node"
                    " daemon (no polling).", 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  semq inbox --dir B                      # unacknowledged documents, oldest first\n"
               "  semq inbox --dir B show 17              # one document: its fields, then its contents\n"
               "  semq inbox --dir B show 10008/1/1/1795329835412001   # the same, by its LK0\n"
               "  semq inbox --dir B save 17 order.xml\n"
               "  semq inbox --dir B ack 17 18\n"
               "  semq inbox --dir B --follow --json      # one JSON line per document as it arrives\n"
               "  semq inbox --dir B --follow --ack       # print each new document, then acknowledge it")
    x.add_argument("action", nargs="?", default="list", choices=["list", "show", "save", "ack"],
                   help="list (default); show ID|LK0: its fields and contents; save ID|LK0 FILE: its contents to"
                        " FILE; ack ID|LK0...: the application has processed them")
    x.add_argument("ids", nargs="*", metavar="ID|LK0", help="inbox document ids (the ID column) or LK0s")
    x.add_argument("--all", action="store_true", help="include acknowledged documents (list)")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"list at most N documents, 1..{INBOX_LIMIT} (default 100)")
    x.add_argument("--json", action="store_true",
                   help="JSON for programs (times in ms since the epoch); with --follow one JSON object per line")
    x.add_argument("--follow", "-f", action="store_true",
                   help="print each unacknowledged document, then each new one as it arrives, until interrupted"
                        " (the node daemon wakes it; without a daemon it tries again every second)")
    x.add_argument("--after", type=int, default=0, metavar="ID",
                   help="--follow: start with the documents above inbox id ID (default 0: every unacknowledged one)")
    x.add_argument("--ack", action="store_true", help="--follow: acknowledge each document once it is printed")
    x.add_argument("--raw", action="store_true",
                   help="show: write the contents to a terminal even when they are not text (without it, binary"
                        " contents or control characters are refused on a terminal; a pipe or a file always gets"
                        " the bytes)")
    user_options(x, "only this user's documents")
    x.set_defaults(func=cmd_inbox)

    from semq.cli.receive import register as register_receive

    register_receive(sub, common)

    x = sub.add_parser("user", parents=[common], help="users inside this organization and their tokens")
    x.add_argument("action", choices=["add", "list", "remove"],
                   help="add a user (prints its token once), list them, or remove one")
    x.add_argument("name", nargs="?", help="user name: a-z 0-9 . _ -, starting with a letter (e.g. alice)")
    x.add_argument("--os-user", default="", metavar="ACCOUNT",
                   help="add: also accept this operating-system account on the user socket, without a token")
    x.set_defaults(func=cmd_user)

    x = sub.add_parser("messages", parents=[common], help="pending-send rows with state and age")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help=f"at most N rows (1..{MAX_LIMIT}, default 100)")
    x.add_argument("--receipt", metavar="LK0", help="show the signed delivery receipt of a document, verified")
    x.add_argument("--json", action="store_true", help="as JSON, with the raw values (times in epoch ms)")
    x.set_defaults(func=cmd_messages)

    x = sub.add_parser("status", parents=[common], help="node or platform status")
    x.add_argument("--json", action="store_true", help="as JSON, for programs")
    x.set_defaults(func=cmd_status)

    register_ops(sub)
    register_watch(sub)  # semq watch: outbox and inbox folders (semq.node.folders)
    from semq.cli.capabilities import register as register_features
    from semq.web.cli import register as register_console

    register_console(sub)  # semq console user add|list|remove (the web console's accounts)
    register_features(sub)  # tx, request/reply, dead letters, local queues (docs/seed-capabilities.md)

    try:
        from semq.analytics.cli import register as register_report
    except ImportError:  # analytics not installed / not yet present
        pass
    else:
        register_report(sub)
    from semq.cli.examples import add_examples
    from semq.cli.guide import register as register_guide

    register_guide(sub, build_parser)  # semq help TOPIC, semq completion, semq config reference
    add_examples(p)  # every command's examples, in its --help
    return p
