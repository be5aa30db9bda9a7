"""The ``semq`` command. ``main(argv) -> int``: 0 ok, 1 a runtime failure,
2 a user's mistake; errors are one line on stderr (``--verbose`` for the
traceback).

One module per command group, holding its commands and registering their
parsers (``register``); each imports only the modules below it, and none
imports this package (which only re-exports):

    app (main, run_command)  <-  parser (the tree: every group's register)
      <-  platform, node, send, inbox, status, users, bulk, watch, receive,
          capabilities, guide (the groups; node uses platform, platform
          status, send bulk and users; guide is handed the tree's builder)
      <-  daemons (running one), _common (what every command shares)

``python -m semq.cli.features`` (features.py) sits above app.
"""

from __future__ import annotations

from semq.cli.app import main, run_command
from semq.cli.daemons import GC_THRESHOLDS, tune_gc
from semq.cli.parser import build_parser
from semq.cli.platform import cmd_platform_run

__all__ = ["GC_THRESHOLDS", "build_parser", "cmd_platform_run", "main", "run_command", "tune_gc"]
