"""``semq watch`` that dies right after its Nth commit of outbox files,
before it moves them to sent/ — the one window a SIGKILL hits only by
chance: ``python -m tests.e2e._crashing_watch N watch --dir ...``. It
ends with ``os._exit`` (no cleanup, nothing flushed, like SIGKILL)."""

from __future__ import annotations

import os
import sys
from typing import Any

from semq.cli import main
from semq.node import folders

CRASH_EXIT = 137  # what a shell shows for a SIGKILLed process


def _crash_after(n: int) -> None:
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


if __name__ == "__main__":
    _crash_after(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
