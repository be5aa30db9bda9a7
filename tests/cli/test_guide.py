"""Help that teaches: every option of every command says what it is for and
every command shows an example (a walk over the whole parser); ``semq help
TOPIC`` prints the states, result codes, SaveFwd, LK0 and ACK2 from the
code's own definitions (every member appears); shell completion is
generated from the parser and installed by one command; ``semq config
reference`` prints every semq.toml key with its reload behaviour."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import subprocess
from pathlib import Path

import pytest

from semq.cli import build_parser, main
from semq.cli.examples import is_leaf, walk
from semq.cli.topics import TOPICS, member_meanings, topic_text
from semq.node.engine import AckStatus, SendState, TxState
from semq.ops.reload import APPLIERS
from semq.platform.engine import StoredState
from semq.settings.config import SETTINGS, settings_reference
from semq.umxt_protocol import ResultCode, SaveFwd


def _commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return list(walk(build_parser()))


def test_every_option_of_every_command_has_help() -> None:
    missing = []
    for path, parser in _commands():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                name = "/".join(action.option_strings) or action.dest
                missing.append(f"semq {' '.join(path)}: {name}")
    assert not missing, "options without help:\n" + "\n".join(missing)


def test_every_command_has_an_example_in_its_help() -> None:
    missing = [" ".join(path) for path, parser in _commands()
               if path and is_leaf(parser) and "example" not in (parser.epilog or "")]
    assert not missing, "commands without an example in their --help: " + ", ".join(missing)
    # Shown as written, each example on its own line starting with semq.
    assert len(_commands()) > 60


def test_examples_are_shown_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["admin", "list", "--help"])
    out = capsys.readouterr().out
    assert "examples:\n  semq admin list --dir A --state SS_FAILED\n" in out
    assert "--limit N" in out and "1..10000" in out


def test_help_text_speaks_of_the_product_not_its_history() -> None:
    words = re.compile(r"\b(seed|issue #?\d+|seedcli|SPEC)\b", re.IGNORECASE)
    bad = []
    for path, parser in _commands():
        texts = [parser.description or "", parser.epilog or ""]
        texts += [a.help or "" for a in parser._actions]
        bad += [f"semq {' '.join(path)}: {t}" for t in texts if words.search(t)]
    bad += [f"semq help {name}" for name in TOPICS if words.search(topic_text(name))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("enum,topic", [(SendState, "states"), (AckStatus, "states"), (StoredState, "states"),
                                        (TxState, "states"), (ResultCode, "codes")])
def test_each_member_of_the_states_and_codes_appears_with_its_meaning(enum: type, topic: str) -> None:
    text = topic_text(topic)
    meanings = member_meanings(enum)
    for member in enum:
        line = rf"^\s+{member.value}\s+{member.name}\s+{re.escape(meanings[member.name])}$"
        assert re.search(line, text, re.M), f"{enum.__name__}.{member.name} is not in 'semq help {topic}'"


def test_the_topics_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    for name in ("states", "codes", "savefwd", "lk0", "ack2"):
        assert name in out
    assert main(["help", "codes"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"301\s+TARGET_OFFLINE_DROPPED\s+SaveFwd=1 and the target is offline", out)
    assert "(seed" not in out and " 3xx: routing" in out
    assert main(["help", "savefwd"]) == 0
    out = capsys.readouterr().out
    for m in (SaveFwd.DISCARD, SaveFwd.STORE, SaveFwd.MUST_DELIVER):
        assert re.search(rf"\b{m.value}\s+{m.name}\b", out)
    assert main(["help", "lk0"]) == 0 and "ORG/SEMQ_ID/DB_ID/RECORD_ID" in capsys.readouterr().out
    assert main(["help", "ack2"]) == 0 and "REACK2" in capsys.readouterr().out
    assert main(["help", "admin", "list"]) == 0 and "--older-than" in capsys.readouterr().out
    assert main(["help", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no help topic or command 'nonsense'; topics: states, codes") and err.count("\n") == 1


def test_the_bash_completion_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "show", "--shell", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete " in script and "_shtab_semq" in script
    for word in ("platform", "node", "messages", "admin", "stuck", "completion", "--older-than"):
        assert word in script, word
    assert main(["completion", "show", "--shell", "zsh"]) == 0
    assert "#compdef semq" in capsys.readouterr().out


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` with the script loaded."""
    line = " ".join(words)
    program = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1};"
               f" COMP_LINE={line!r}; COMP_POINT={len(line)}; _shtab_semq; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completes_commands_options_topics_and_directories(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "show", "--shell", "bash"]) == 0
    script = tmp_path / "semq.bash"
    script.write_text(capsys.readouterr().out)
    assert _complete(script, "semq", "adm") == ["admin"]
    assert _complete(script, "semq", "admin", "list", "--old") == ["--older-than"]
    assert _complete(script, "semq", "help", "sav") == ["savefwd"]
    (tmp_path / "data-dir").mkdir()
    assert _complete(script, "semq", "status", "--dir", str(tmp_path / "data-")) == [str(tmp_path / "data-dir")]


def test_completion_install_writes_where_the_shell_finds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_DATA_HOME", "BASH_COMPLETION_USER_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SHELL", "/bin/bash")
    assert main(["completion", "install"]) == 0
    path = tmp_path / ".local/share/bash-completion/completions/semq"
    out = capsys.readouterr().out
    assert path.is_file() and "stuck" in path.read_text()
    assert f"wrote {path}" in out and f"source {path}" in out
    assert main(["completion", "install", "--shell", "bash"]) == 0
    assert f"replaced {path}" in capsys.readouterr().out
    assert main(["completion", "install", "--shell", "zsh"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / ".zfunc/_semq").read_text().startswith("#compdef semq")
    assert "fpath=(~/.zfunc $fpath)" in out


def test_config_reference_says_type_default_and_reload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    out = capsys.readouterr().out
    assert out == settings_reference()
    for name in SETTINGS:
        assert re.search(rf"^{name} \(", out, re.M), name
    assert "window (integer, default 4096)" in out
    assert "reloaded by SIGHUP: node: at once, the running session too; platform: for new sessions" in out
    assert re.search(r"^listen .*\n(    .*\n)*    reloaded by SIGHUP: no: restart", out, re.M)
    assert main(["config", "reference", "--format", "markdown"]) == 0
    assert "| `quota_mib` | integer |" in capsys.readouterr().out


@pytest.mark.parametrize("role", ["node", "platform"])
def test_the_reload_applies_exactly_the_keys_the_rules_say(role: str) -> None:
    declared = {name for name, rule in SETTINGS.items() if rule.reload_when(role)}
    assert set(APPLIERS[role]) == declared


def test_semq_help_states_shows_every_move_of_the_engine_tables() -> None:
    from semq.node.engine import ORIGIN_TABLE
    from semq.platform.engine import STORED_TABLE

    text = topic_text("states")
    for table in (ORIGIN_TABLE, STORED_TABLE):
        for (state, event), nxt in table.items():
            to = nxt[0] if isinstance(nxt, tuple) else nxt
            if to is not state:
                assert re.search(rf"^\s+{state.name}\s+-> {to.name}\s+on .*\b{event.value}\b", text, re.M), \
                    f"{state.name} --{event.value}--> {to.name}"


# -- options anywhere: before, between or after the positionals, and before
# the command's name, for every command of the tree

_VALUES = ("7", "x", "2026-12-01", "1h", "127.0.0.1:7411")  # a date before "1h": "1h ago" moves between parses


def _parses(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, object] | None:
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return vars(parser.parse_args(argv))
    except SystemExit:
        return None


def _words(action: argparse.Action, value: str) -> list[str]:
    """``action`` with ``value`` as a command line writes it; a list-taking
    option as ``--opt=value`` (else it would take the positionals too)."""
    name = action.option_strings[-1]
    if action.nargs == 0:
        return [name]
    if action.nargs in ("*", "+", "?"):
        return [f"{name}={value}"]
    return [name] + [value] * (action.nargs if isinstance(action.nargs, int) else 1)


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each positional, two for one that takes a list."""
    words: list[str] = []
    for a in parser._get_positional_actions():
        value = str(next(iter(a.choices))) if a.choices else "7"
        words += [value, value] if a.nargs in ("*", "+") else [value]
    return words


def _candidates(action: argparse.Action) -> list[str]:
    return [str(c) for c in action.choices][:3] if action.choices else list(_VALUES)


def _options(root: argparse.ArgumentParser, path: tuple[str, ...], leaf: argparse.ArgumentParser,
             pos: list[str]) -> tuple[list[str], list[tuple[str, list[str]]], list[str]]:
    """The required options' words, each other option's words (with a value
    the command takes), and the options no value fitted."""
    actions = [a for a in leaf._get_optional_actions()
               if not isinstance(a, argparse._HelpAction | argparse._VersionAction)]
    needed = [a for a in actions if a.required]
    tries = (
        [w for a, v in zip(needed, values, strict=True) for w in _words(a, v)]
        for values in itertools.product(*(_candidates(a) for a in needed))
    )
    required = next((words for words in tries if _parses(root, [*path, *pos, *words]) is not None), None)
    if required is None:
        return [], [], [a.option_strings[-1] for a in needed]
    each, unfit = [], []
    for a in actions:
        if a.required:
            continue
        words = next((w for v in _candidates(a)
                      if _parses(root, [*path, *pos, *required, *(w := _words(a, v))]) is not None), None)
        if words is None:
            unfit.append(a.option_strings[-1])
        else:
            each.append((a.option_strings[-1], words))
    return required, each, unfit


def test_every_command_takes_its_options_before_between_or_after_its_positionals() -> None:
    root = build_parser()
    checked, wrong, unfit = 0, [], []
    for path, leaf in _commands():
        if not path or not is_leaf(leaf):
            continue
        pos = _positionals(leaf)
        required, each, missing = _options(root, path, leaf, pos)
        unfit += [f"semq {' '.join(path)} {name}" for name in missing]
        expected = _parses(root, [*path, *pos, *required])
        if expected is None:
            wrong.append(f"semq {' '.join([*path, *pos, *required])} does not parse")
            continue
        for _name, words in [("", required), *each]:
            base = required if words is not required else []
            after = [*path, *pos, *base, *words]
            want = _parses(root, after)
            lines = [[*path, *words, *pos, *base],                         # before the positionals
                     [*path[:-1], *words, path[-1], *pos, *base]]          # before the command's name
            lines += [[*path, *pos[:k], *words, *pos[k:], *base] for k in range(1, len(pos))]  # between
            for line in lines:
                got = _parses(root, line)
                checked += 1
                if got != want:
                    wrong.append(f"semq {' '.join(line)} parses as {got}, not as semq {' '.join(after)}: {want}")
    assert not unfit, "options no test value fits (add one to _VALUES):\n" + "\n".join(unfit)
    assert not wrong, "\n".join(wrong)
    assert checked > 500  # every option of every command, in every place


def test_user_add_with_the_directory_first_and_a_dash_dash_keep_their_meaning() -> None:
    p = build_parser()
    ns = p.parse_args(["user", "add", "--dir", "B", "alice"])
    assert (ns.action, ns.name, ns.dir) == ("add", "alice", "B")
    ns = p.parse_args(["admin", "--dir", "A", "list", "--limit", "3"])
    assert (ns.admin_cmd, ns.dir, ns.limit) == ("list", "A", 3)
    ns = p.parse_args(["send", "a.xml", "--to", "56001", "--", "-b.xml", "--to"])
    assert ns.files == ["a.xml", "-b.xml", "--to"] and ns.to == "56001"
    ns = p.parse_args(["--dir", "status", "status"])  # a directory named like a command
    assert ns.command == "status" and ns.dir == "status"
