"""Help that teaches: every option of every command says what it is for and
every command shows an example (a walk over the whole parser); ``semq help
TOPIC`` prints the states, result codes, SaveFwd, LK0 and ACK2 from the
code's own definitions (every member appears); shell completion is
generated from the parser and installed by one command; ``semq config
reference`` prints every semq.toml key with its reload behaviour."""

from __future__ import annotations

import argparse
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
