"""``semq watch`` that dies right after its Nth commit of outbox files,
before it moves them to ``sent/``: the one window a SIGKILL hits only by
chance (semq.node.features.folders says what a restart then does). For the
end-to-end test of folders:

    python -m semq.testing.crashing_watch N watch --dir ... --outbox ...

It ends with ``os._exit`` — no cleanup, nothing flushed but stdout, as a
SIGKILL leaves the process — with status CRASH_EXIT."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Final

from semq.cli import main as semq_main
from semq.node.features import folders

__all__ = ["CRASH_EXIT", "crash_after", "main"]

CRASH_EXIT: Final = 137  # what a shell shows for a SIGKILLed process


def crash_after(n: int) -> None:
    """Make this process's outbox folders die right after their ``n``th commit."""
    real = folders.OutboxFolder._accept
    commits = 0

    def accept(self: folders.OutboxFolder, ready: Any) -> Any:
        nonlocal commits
        got = real(self, ready)  # committed: the documents and their watch_files rows
        commits += 1
        if commits == n:
            sys.stdout.flush()
            os._exit(CRASH_EXIT)
        return got

    folders.OutboxFolder._accept = accept  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit() or int(args[0]) < 1:
        print("usage: python -m semq.testing.crashing_watch N watch --dir DIR --outbox DIR ...", file=sys.stderr)
        return 2
    crash_after(int(args[0]))
    return semq_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
