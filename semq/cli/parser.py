"""The parser tree of ``semq``: every command, its options and help, each
command group's handler from its module (a mistake in a command line is
one ``error:`` line, exit 2)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from semq import __version__
from semq.cli.inbox import register as register_inbox
from semq.cli.node import register as register_node
from semq.cli.partners import register as register_partners
from semq.cli.platform import register as register_platform
from semq.cli.receive import register as register_receive
from semq.cli.send import register as register_send
from semq.cli.status import register as register_status
from semq.cli.users import register as register_user
from semq.cli.watch import register as register_watch
from semq.ops.cli import register as register_ops

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """The ``semq`` parser and, through ``add_subparsers``, every command's:
    a mistake in the command line is one ``error:`` line naming where the
    help is, like every other error, not the usage text and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole tree: ``semq`` and every command, each group's registered
    by its module, in the order ``semq --help`` lists them."""
    common = _Parser(add_help=False)
    common.add_argument("--dir", help="data directory (default $SEMQ_DIR or ./semq-data)", default=argparse.SUPPRESS)
    p = _Parser(prog="semq", description="SEMQ store-and-forward messaging", parents=[common])
    p.add_argument("--version", action="version", version=f"semq {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log more; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    register_platform(sub, common)
    register_node(sub, common)
    register_send(sub, common)
    register_inbox(sub, common)
    register_receive(sub, common)
    register_user(sub, common)
    register_status(sub, common)  # messages, status
    register_partners(sub, common)  # semq partners (semq.ops.partners)
    register_ops(sub)
    register_watch(sub)  # semq watch: outbox and inbox folders (semq.node.features.folders)
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
