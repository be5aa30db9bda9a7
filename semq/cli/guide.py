"""The commands that explain ``semq`` itself: ``semq help [TOPIC|COMMAND]``,
``semq completion show|install`` and ``semq config reference``.

Shell completion is generated from the argparse parser by shtab, so it
knows every command and option the parser knows, with no list of ours to
keep up to date; it is imported only when a completion script is made.

These commands explain the whole tree of commands, which registers them:
the tree hands ``register`` the function that builds it (``build``), so
this module never imports it back."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semq.cli.examples import walk

__all__ = ["completion_path", "completion_script", "register"]

SHELLS = ("bash", "zsh")

Build = Callable[[], argparse.ArgumentParser]  # the whole tree of semq's commands (semq.cli.parser.build_parser)


class GuideUsageError(ValueError):
    """A mistake in these commands (exit 2 through semq.cli.run_command)."""


# ---------------------------------------------------------------- help


def cmd_help(args: argparse.Namespace, *, build: Build) -> int:
    from semq.cli.topics import TOPICS, topic_text

    words = [w.lower() for w in args.topic]
    if not words:
        width = max(len(t) for t in TOPICS)
        print("semq help TOPIC:")
        for name, (what, _) in TOPICS.items():
            print(f"  {name:<{width}}  {what}")
        print("semq help COMMAND (or semq COMMAND --help): a command's options and examples;"
              " semq --help lists the commands")
        return 0
    if len(words) == 1 and words[0] in TOPICS:
        print(topic_text(words[0]))
        return 0
    root = build()
    for path, parser in walk(root):
        if path and list(path) == words:
            parser.print_help()
            return 0
    raise GuideUsageError(f"no help topic or command {' '.join(args.topic)!r}; topics: {', '.join(TOPICS)}"
                          " (commands: semq --help)")


# ---------------------------------------------------------------- completion


def _mark_paths(parser: argparse.ArgumentParser) -> None:
    """Tell shtab which arguments are directories or files, so the shell
    completes paths there, and the help topics."""
    import shtab

    from semq.cli.topics import TOPICS

    for path, p in walk(parser):
        for a in p._actions:
            if path == ("help",) and a.dest == "topic":
                a.complete = shtab.cmd("echo " + " ".join(TOPICS))  # type: ignore[attr-defined]
            elif set(a.option_strings) & {"--dir", "--enroll-from", "--unit-dir"}:
                a.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
            elif a.dest in ("file", "csr", "cert", "ca", "password_file", "token_file", "log_file", "output") \
                    or a.metavar == "FILE":
                a.complete = shtab.FILE  # type: ignore[attr-defined]


def completion_script(shell: str, build: Build) -> str:
    """The completion script of ``semq`` (the tree ``build`` makes) for
    ``shell`` (bash or zsh)."""
    import shtab

    if shell not in SHELLS:
        raise GuideUsageError(f"--shell {shell!r} is not supported; allowed: {', '.join(SHELLS)}")
    parser = build()
    _mark_paths(parser)
    text: str = shtab.complete(parser, shell=shell)
    return text


def completion_path(shell: str, home: Path | None = None) -> Path:
    """Where ``semq completion install`` writes the script: for bash the
    user directory bash-completion loads on demand
    (``$BASH_COMPLETION_USER_DIR`` or ``$XDG_DATA_HOME/bash-completion``,
    default ``~/.local/share/bash-completion``, then ``completions/semq``);
    for zsh ``~/.zfunc/_semq``, a directory to put on ``fpath``."""
    home = home or Path.home()
    if shell == "bash":
        base = os.environ.get("BASH_COMPLETION_USER_DIR")
        if base:
            return Path(base) / "completions" / "semq"
        data = os.environ.get("XDG_DATA_HOME") or str(home / ".local" / "share")
        return Path(data) / "bash-completion" / "completions" / "semq"
    return home / ".zfunc" / "_semq"


def _default_shell() -> str:
    name = Path(os.environ.get("SHELL", "")).name
    return name if name in SHELLS else "bash"


def cmd_completion_show(args: argparse.Namespace, *, build: Build) -> int:
    sys.stdout.write(completion_script(args.shell or _default_shell(), build))
    return 0


def cmd_completion_install(args: argparse.Namespace, *, build: Build) -> int:
    shell = args.shell or _default_shell()
    text = completion_script(shell, build)
    path = completion_path(shell)
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, "utf-8")
    tmp.replace(path)
    print(f"{'replaced' if existed else 'wrote'} {path} ({shell} completion for semq, {len(text):,} bytes)")
    if shell == "bash":
        print("bash-completion loads it in every new shell (Debian/Ubuntu: apt install bash-completion);"
              f" in this shell now: source {path}")
    else:
        zshrc = Path.home() / ".zshrc"
        try:
            on_fpath = ".zfunc" in zshrc.read_text("utf-8")
        except OSError:
            on_fpath = False
        if on_fpath:
            print(f"{zshrc} already names ~/.zfunc; start a new shell (or: exec zsh)")
        else:
            print(f"zsh reads it once ~/.zfunc is on fpath before compinit; add to {zshrc}:\n"
                  "  fpath=(~/.zfunc $fpath)\n  autoload -Uz compinit && compinit\n"
                  "then start a new shell (or: exec zsh)")
    return 0


# ---------------------------------------------------------------- config


def cmd_config_reference(args: argparse.Namespace) -> int:
    from semq.settings.config import settings_reference, settings_table

    sys.stdout.write(settings_table() if args.format == "markdown" else settings_reference())
    return 0


# ---------------------------------------------------------------- parser


def register(sub: Any, build: Build) -> None:
    """Add ``help``, ``completion`` and ``config`` to semq's subparsers;
    ``build`` makes the whole tree they explain."""
    x = sub.add_parser("help", help="explain the states, result codes, SaveFwd, LK0, ACK2; or a command",
                       description="Without a topic: the topics. With one: its explanation, printed from the"
                                   " definitions the code uses. With a command (semq help admin list): its"
                                   " options and examples.")
    x.add_argument("topic", nargs="*", metavar="TOPIC|COMMAND",
                   help="states, codes, savefwd, lk0, ack2; or a command, e.g. admin list")
    x.set_defaults(func=functools.partial(cmd_help, build=build))

    comp = sub.add_parser("completion", help="shell completion for semq (bash, zsh)").add_subparsers(
        dest="sub", required=True)
    shells = ", ".join(SHELLS)
    x = comp.add_parser("show", help="print the completion script")
    x.add_argument("--shell", choices=SHELLS, help=f"{shells} (default: the one $SHELL names, else bash)")
    x.set_defaults(func=functools.partial(cmd_completion_show, build=build))
    x = comp.add_parser("install", help="write the completion script where the shell finds it",
                        description="bash: ~/.local/share/bash-completion/completions/semq (loaded by"
                                    " bash-completion); zsh: ~/.zfunc/_semq (put ~/.zfunc on fpath)."
                                    " Says what it wrote and what to do next.")
    x.add_argument("--shell", choices=SHELLS, help=f"{shells} (default: the one $SHELL names, else bash)")
    x.set_defaults(func=functools.partial(cmd_completion_install, build=build))

    cfg = sub.add_parser("config", help="the semq.toml keys").add_subparsers(dest="sub", required=True)
    x = cfg.add_parser("reference", help="every semq.toml key: type, default, values allowed, SIGHUP reload")
    x.add_argument("--format", choices=["text", "markdown"], default="text",
                   help="text for the terminal (default) or the Markdown table of docs/operations.md")
    x.set_defaults(func=cmd_config_reference)
