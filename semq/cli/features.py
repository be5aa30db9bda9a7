"""``python -m semq.cli.features``: ``semq`` with the commands of the
node's features (transactional messages, request/reply, dead letters,
local queues: semq.cli.capabilities), run with the same exit codes and
one-line errors as ``semq.cli.main``. Kept as the entry the tests and the
seed documents use (docs/seed-capabilities.md); the commands themselves
are in semq.cli.capabilities, which the parser tree registers."""

from __future__ import annotations

import argparse
import logging
import sys

from semq.cli.app import run_command
from semq.cli.capabilities import EXIT_NOTHING, register
from semq.cli.parser import build_parser

__all__ = ["EXIT_NOTHING", "main", "register"]


def main(argv: list[str] | None = None) -> int:
    """``semq`` with these commands registered, also before semq.cli
    registers them itself (``python -m semq.cli.features tx watch ...``);
    the same exit codes and one-line errors as ``semq.cli.main``."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "tx" not in sub.choices:
        register(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
