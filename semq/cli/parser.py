"""The parser tree of ``semq``: every command, its options and help, each
command group's handler from its module (a mistake in a command line is
one ``error:`` line, exit 2)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from semq import __version__
from semq.cli.edge import register as register_edge
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

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        """Options before, between or after the positionals, and before a
        subcommand's name. A command's options are taken first wherever
        they stand, then its positionals from what is left (intermixed
        parsing): plain argparse takes positionals in runs, so ``user add
        --dir B alice`` gave ``add`` to the action and nothing to the
        optional name, and then refused ``alice``. In a group (``admin``,
        ``tx``...), options of a subcommand written before its name
        (``admin --dir A list``) are handed to it after the name."""
        line = list(sys.argv[1:] if args is None else args)
        if _intermixable(self):
            return self._parse_intermixed(line, namespace)
        return super().parse_known_args(_name_first(self, line), namespace)

    def _parse_intermixed(self, line: list[str], namespace: Any) -> tuple[argparse.Namespace, list[str]]:
        """argparse's ``parse_known_intermixed_args``, with ``--`` kept:
        the options first with the positionals switched off, then the
        positionals from the words left and everything after ``--``
        (Python 3.11's own lets the switched-off positionals eat ``--``)."""
        cut = line.index("--") if "--" in line else len(line)
        head, tail = line[:cut], line[cut:]
        positionals = self._get_positional_actions()
        kept = [(a, a.nargs, a.default) for a in positionals]
        try:
            for a in positionals:
                a.nargs = a.default = argparse.SUPPRESS
            namespace, rest = super().parse_known_args(head, namespace)
        finally:
            for a, nargs, default in kept:
                a.nargs, a.default = nargs, default
        optionals = [(a, a.required) for a in self._get_optional_actions()]
        groups = [(g, g.required) for g in self._mutually_exclusive_groups]
        try:  # (a missing required option was named by the first pass)
            for a, _ in optionals:
                a.required = False
            for g, _ in groups:
                g.required = False
            return super().parse_known_args(rest + tail, namespace)
        finally:
            for a, required in optionals:
                a.required = required
            for g, required in groups:
                g.required = required


def _intermixable(parser: argparse.ArgumentParser) -> bool:
    """Whether ``parser`` has positionals that intermixed parsing can
    take: not a subcommand (or the rest of the line), not in a group of
    mutually exclusive options."""
    positionals = [a for a in parser._actions if not a.option_strings]
    if not positionals or any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in positionals):
        return False
    return not any(a in positionals for g in parser._mutually_exclusive_groups for a in g._group_actions)


def _name_first(group: argparse.ArgumentParser, line: list[str]) -> list[str]:
    """``line`` with the subcommand's name moved before the options
    written ahead of it, when every word before the name is an option of
    that subcommand or its value (``--dir A list`` -> ``list --dir A``);
    else ``line`` as it is (the group's own options, or a mistake for
    argparse to name)."""
    subs = next((a for a in group._actions if isinstance(a, argparse._SubParsersAction)), None)
    if subs is None or not line or not line[0].startswith("-"):
        return line
    for i, word in enumerate(line):
        leaf = subs.choices.get(word)
        if leaf is not None and _all_options(leaf, line[:i]):
            return [word, *line[:i], *line[i + 1:]]
    return line


def _all_options(parser: argparse.ArgumentParser, words: list[str]) -> bool:
    """Whether ``words`` are, exactly, options of ``parser`` with their values."""
    j = 0
    while j < len(words):
        name, eq, _ = words[j].partition("=")
        action = parser._option_string_actions.get(name)
        if action is None:
            return False
        j += 1
        if eq:
            continue
        n = action.nargs
        if n is None:
            j += 1
        elif isinstance(n, int):
            j += n
        elif n in ("?", "*", "+"):  # its values: the words up to the next option
            while j < len(words) and not words[j].startswith("-"):
                j += 1
                if n == "?":
                    break
    return j == len(words)


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
    register_edge(sub, common)  # semq partner add|list|remove|cert: AS2 / AS4 partners (semq.edge)
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
