"""``semq``'s entry point: ``main(argv) -> int`` parses the command line
and runs the command with the CLI's error contract (``run_command``): 0
ok, 1 a runtime failure, 2 a user's mistake; errors are one line on stderr
(``--verbose`` for the traceback)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from semq.cli._common import UsageError
from semq.cli.parser import build_parser
from semq.identity.crypto import CryptoError
from semq.identity.security import AlreadyEnrolled, SecurityError
from semq.settings.config import ConfigError
from semq.store.db import StoreError
from semq.umxt_protocol import ProtocolError

__all__ = ["main", "run_command"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (a node's units are started with these)
    logging.basicConfig(
        level=logging.INFO if args.verbose or (args.command in ("platform", "node") and getattr(args, "sub", "") == "run")
        else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        rc = run_command(args)
        sys.stdout.flush()  # here, where a closed pipe can be handled, not at exit
    except BrokenPipeError:
        # The reader went away (semq status | head -1): what it wanted it
        # has; end quietly, and point stdout at /dev/null so the flush at
        # exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    return rc


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command with the CLI's error contract: one ``error:``
    line, exit 2 for a user's mistake, 1 for a runtime failure; tracebacks
    only with ``--verbose``. (Also used by ``python -m semq.cli.features``.)"""
    try:
        rc: int = args.func(args)
        return rc
    except BrokenPipeError:
        raise  # the reader of stdout went away: main ends quietly
    except (UsageError, ConfigError, ValueError, AlreadyEnrolled) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (StoreError, ProtocolError, OSError, CryptoError, SecurityError) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ProtocolError) else 1
    except KeyboardInterrupt:
        return 130
