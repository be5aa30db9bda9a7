"""``semq.toml`` is checked: every key has a type and the values allowed in
one place (``semq.settings.config.SETTINGS``, the rules on ``Config``'s fields), and a
wrong value stops the daemons and every command that loads the configuration
at start, with one line naming the key, the value and what is allowed, exit
2. Command-line overrides go through the same rules. The data directory and
the stores and event logs in it are owner-only, made so and checked at
daemon start. docs/operations.md lists the keys from the same definition."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.settings.config import Address, Config, ConfigError, load_config, parse_platform_addresses
from tests._procs import free_port

ROOT = Path(__file__).resolve().parents[2]
A, B = "10008", "56001"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


def set_key(d: Path, key: str, toml_value: str) -> None:
    """Replace (or add) ``key = ...`` in d/semq.toml with the TOML text given."""
    p = d / "semq.toml"
    text = p.read_text()
    line = f"{key} = {toml_value}"
    new, n = re.subn(rf"(?m)^{key} = .*$", lambda _m: line, text)
    p.write_text(new if n else text + line + "\n")


@pytest.fixture
def dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A platform P and a node A (security off: quick), nothing running. A
    run command that gets as far as starting its daemon fails the test at
    once instead of running (these tests are about what stops it before)."""
    def started(*_a: object, **_k: object) -> int:
        raise AssertionError("the daemon started")

    monkeypatch.setattr("semq.cli.platform.run_daemon", started)
    monkeypatch.setattr("semq.cli.node.run_daemon", started)
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    port = free_port()
    assert run(capsys, "platform", "init", "--dir", "P", "--no-security", "--listen", f"127.0.0.1:{port}")[0] == 0
    assert run(capsys, "node", "init", "--dir", A, "--org", A, "--no-security",
               "--platform", f"127.0.0.1:{port}")[0] == 0
    yield tmp_path


# Each wrong value of the issue, and one more per rule: (key, TOML text, the
# reason in the message, what the message says is allowed).
BAD = [
    ("window", '"big"', "is not an integer", "an integer 1..1000000"),
    ("window", "0", "is out of range", "an integer 1..1000000"),
    ("window", "true", "is not an integer", "an integer 1..1000000"),
    ("window", "1000001", "is out of range", "an integer 1..1000000"),
    ("queue_mib", '"x"', "is not an integer", "an integer 1..65536"),
    ("queue_mib", "0", "is out of range", "an integer 1..65536"),
    ("inquiry_interval", "-1", "is out of range", "a number of seconds 0.01..86400"),
    ("inquiry_interval", "0", "is out of range", "a number of seconds 0.01..86400"),
    ("inquiry_interval", '"15"', "is not a number", "a number of seconds"),
    ("inquiry_interval", "nan", "is not a number", "a number of seconds"),
    ("synchronous", '"FAST"', "is not allowed", 'one of "OFF", "NORMAL", "FULL", "EXTRA"'),
    ("synchronous", "2", "is not a string", 'one of "OFF", "NORMAL", "FULL", "EXTRA"'),
    ("listen", '"nonsense:abc"', "is not an address (port 'abc' is not a number)", "HOST:PORT"),
    ("listen", '"127.0.0.1:70000"', "is not an address (port 70000 is outside 0..65535", "HOST:PORT with PORT 0..65535"),
    ("listen", '"not a host:7410"', "is not an address (host 'not a host' is not a host name or an IP address)", "HOST:PORT"),
    ("platform", '"127.0.0.1:x"', "is not an address (port 'x' is not a number)", "HOST:PORT"),
    ("platform", '"127.0.0.1:0"', "is not an address (port 0 is outside 1..65535", "HOST:PORT with PORT 1..65535"),
    ("platform", '":7410"', "is not an address (has no host)", "HOST:PORT"),
    ("platform", '"127.0.0.1:7411,x:99999"', "has 'x:99999', which is not an address (port 99999 is outside 1..65535)",
     "HOST:PORT with PORT 1..65535"),
    ("platform", '"127.0.0.1:7411,,127.0.0.1:7412"', "has an empty entry (number 2)", "HOST:PORT"),
    ("platform", '"127.0.0.1:7411,127.0.0.1:7411"', "has '127.0.0.1:7411' twice", "HOST:PORT"),
    ("org", '"abc"', "is not an organization id", "an organization id: a number of 1 to 64 digits"),
    ("org", '"010008"', "is not an organization id", "an organization id: a number of 1 to 64 digits"),
    ("org", "10008", "is not a string", "an organization id: a number of 1 to 64 digits"),
    ("platform_id", '"a b"', "is not an endpoint id", "1 to 64 characters"),
    ("role", '"relay"', "is not allowed", '"node" or "platform"'),
    ("security", '"yes"', "is not a boolean", "true or false"),
    ("auto_register", "1", "is not a boolean", "true or false"),
]


@pytest.mark.parametrize("role", ["node", "platform"])
@pytest.mark.parametrize("key, value, why, allowed", BAD, ids=[f"{k}={v}" for k, v, *_ in BAD])
def test_a_wrong_value_stops_the_daemon_with_one_line(dirs: Path, capsys: pytest.CaptureFixture[str], role: str,
                                                     key: str, value: str, why: str, allowed: str) -> None:
    d = dirs / (A if role == "node" else "P")
    set_key(d, key, value)
    rc, out, err = run(capsys, role, "run", "--dir", str(d))
    assert rc == 2 and out == ""
    one_error(err, f"{d / 'semq.toml'}: {key} = {value} {why}", f"; allowed: {allowed}")
    assert not (d / "status.json").exists()  # it never started


def test_the_message_is_the_one_the_issue_asks_for(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_key(dirs / A, "window", "0")
    rc, _, err = run(capsys, "node", "run", "--dir", A)
    assert rc == 2
    assert err == f"error: {dirs / A / 'semq.toml'}: window = 0 is out of range; allowed: an integer 1..1000000\n"


def test_a_node_needs_an_organization_id(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_key(dirs / A, "org", '""')
    rc, _, err = run(capsys, "status", "--dir", A)
    assert rc == 2
    one_error(err, 'org = "" is not allowed for a node', "allowed: an organization id")


def test_unknown_and_missing_keys(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_key(dirs / A, "windw", "10")
    rc, _, err = run(capsys, "status", "--dir", A)
    assert rc == 2
    one_error(err, "has unknown keys: windw", "known: role, org")
    p = dirs / "P" / "semq.toml"
    p.write_text(re.sub(r"(?m)^role = .*\n", "", p.read_text()))
    rc, _, err = run(capsys, "status", "--dir", "P")
    assert rc == 2
    one_error(err, "role is missing", '"node" or "platform"')


def test_a_configuration_over_the_limit_is_refused_unread(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A semq.toml over CONFIG_MAX_BYTES (1 MiB) is refused with one line
    naming its size and the limit, before a byte of it is read; so is one
    that is not a regular file (a FIFO would block the reader)."""
    from semq.settings.bounds import CONFIG_MAX_BYTES

    p = dirs / A / "semq.toml"
    with open(p, "a") as f:  # a valid TOML comment, one byte over the limit
        f.write("#" + "x" * (CONFIG_MAX_BYTES - p.stat().st_size - 2) + "\n")
    assert p.stat().st_size == CONFIG_MAX_BYTES
    assert load_config(dirs / A).org == A  # at the limit: read
    with open(p, "a") as f:
        f.write("#")
    with pytest.raises(ConfigError) as e:
        load_config(dirs / A)
    assert str(e.value) == (f"configuration {p} of {CONFIG_MAX_BYTES + 1} bytes exceeds the 1 MiB limit of a"
                            " configuration file; not read")
    big = dirs / "big"
    big.mkdir()
    (big / "semq.toml").write_bytes(b"")
    os.truncate(big / "semq.toml", 8 << 30)  # 8 GiB (sparse): read, it would fill the memory
    with pytest.raises(ConfigError, match=f"of {8 << 30} bytes exceeds the 1 MiB limit"):
        load_config(big)
    rc, out, err = run(capsys, "status", "--dir", A)
    assert rc == 2 and out == ""
    one_error(err, f"of {CONFIG_MAX_BYTES + 1} bytes exceeds the 1 MiB limit")

    p.unlink()
    os.mkfifo(p)
    with pytest.raises(ConfigError, match="is not a regular file; not read"):
        load_config(dirs / A)


NODE_COMMANDS = [
    ["status"], ["inbox"], ["messages"], ["send", "--to", B, "--type", "X", "doc"], ["node", "run"],
    ["node", "import", "--cert", "c.pem", "--ca", "ca.pem"], ["admin", "status"], ["admin", "stuck"],
    ["backup", "--out", "b.tar"], ["compact"], ["tx", "list"], ["dead", "list"], ["queue", "list"],
    ["requests"], ["replies"],
]


@pytest.mark.parametrize("argv", NODE_COMMANDS, ids=[" ".join(a[:2]) for a in NODE_COMMANDS])
def test_every_command_that_loads_the_configuration_refuses_it(dirs: Path, capsys: pytest.CaptureFixture[str],
                                                               argv: list[str]) -> None:
    (dirs / "doc").write_bytes(b"x")
    set_key(dirs / A, "synchronous", '"FAST"')
    rc, out, err = run(capsys, *argv, "--dir", A)
    assert rc == 2 and out == ""
    one_error(err, 'synchronous = "FAST" is not allowed; allowed: one of "OFF", "NORMAL", "FULL", "EXTRA"')
    assert not (dirs / "b.tar").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["node", "run", "--dir", A, "--inquiry-interval", "-1"],
     "--inquiry-interval -1 is out of range; allowed: a number of seconds 0.01..86400"),
    (["node", "run", "--dir", A, "--inquiry-interval", "0"], "--inquiry-interval 0 is out of range"),
    (["node", "run", "--dir", A, "--inquiry-interval", "soon"], "--inquiry-interval soon is not a number"),
    (["platform", "run", "--dir", "P", "--inquiry-interval", "-1"], "--inquiry-interval -1 is out of range"),
    (["platform", "run", "--dir", "P", "--listen", "127.0.0.1:99999"],
     '--listen "127.0.0.1:99999" is not an address (port 99999 is outside 0..65535)'),
    (["node", "run", "--dir", A, "--platform", "127.0.0.1:0"], "port 0 is outside 1..65535"),
    (["node", "run", "--dir", A, "--platform", "127.0.0.1:7411,x:99999"],
     '--platform "127.0.0.1:7411,x:99999" has \'x:99999\', which is not an address (port 99999 is outside 1..65535)'),
    (["node", "init", "--dir", "N2", "--org", "1", "--no-security", "--platform", "h:1,not a host:2"],
     "has 'not a host:2', which is not an address (host 'not a host' is not a host name or an IP address)"),
    (["platform", "init", "--dir", "P2", "--id", "a b"], '--id "a b" is not an endpoint id'),
    (["node", "init", "--dir", "N2", "--org", "x1", "--no-security"], '--org "x1" is not an organization id'),
])
def test_command_line_overrides_are_checked_the_same_way(dirs: Path, capsys: pytest.CaptureFixture[str],
                                                         argv: list[str], fragment: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    one_error(err, fragment, "; allowed: ")
    assert not (dirs / "P2").exists() and not (dirs / "N2").exists()


def test_a_good_configuration_round_trips(dirs: Path) -> None:
    cfg = load_config(dirs / A)
    assert cfg.role == "node" and cfg.org == A and cfg.window == 4096 and cfg.inquiry_interval == 15.0
    set_key(dirs / A, "inquiry_interval", "2")  # an integer where a number is asked is a number
    set_key(dirs / A, "synchronous", '"normal"')
    set_key(dirs / A, "platform", '"[::1]:7411"')
    cfg = load_config(dirs / A)
    assert cfg.inquiry_interval == 2.0 and isinstance(cfg.inquiry_interval, float)
    with pytest.raises(ConfigError, match="window = -3 is out of range"):
        Config(role="node", directory=dirs / "X", org=A, window=-3).check()


# ---------------------------------------------------------------- platform addresses


def test_platform_addresses_are_read_in_the_order_given() -> None:
    """One address as always, or several separated by commas (spaces
    around them allowed), IPv6 in brackets, the default port when none is
    given; ``str`` writes each back as it is dialled."""
    assert parse_platform_addresses("127.0.0.1:7410") == [Address("127.0.0.1", 7410)]
    got = parse_platform_addresses("p1.example:7411, [::1]:7412 ,10.0.0.3")
    assert got == [Address("p1.example", 7411), Address("::1", 7412), Address("10.0.0.3", 7410)]
    assert [str(a) for a in got] == ["p1.example:7411", "[::1]:7412", "10.0.0.3:7410"]
    assert got[1] == ("::1", 7412)  # still a (host, port) pair


@pytest.mark.parametrize("text, message", [
    ("x:99999", 'platform "x:99999" is not an address (port 99999 is outside 1..65535)'),
    ("a:7410,x:99999", 'platform "a:7410,x:99999" has \'x:99999\', which is not an address'
                       " (port 99999 is outside 1..65535)"),
    ("a:7410,b:0", "has 'b:0', which is not an address (port 0 is outside 1..65535)"),
    ("a:7410,[::1]:x", "has '[::1]:x', which is not an address (port 'x' is not a number)"),
    ("a:7410,:7411", "has ':7411', which is not an address (has no host)"),
    ("a:7410,", "has an empty entry (number 2)"),
    ("a:7410,a", "has 'a' twice"),  # the default port: the same address
])
def test_a_bad_platform_address_is_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_platform_addresses(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_list_of_platform_addresses_is_configured_and_kept(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "node", "init", "--dir", str(dirs / "N2"), "--org", "77002", "--no-security",
                     "--platform", "127.0.0.1:7411,[::1]:7412")
    assert rc == 0, err
    assert load_config(dirs / "N2").platform == "127.0.0.1:7411,[::1]:7412"
    set_key(dirs / A, "platform", '"127.0.0.1:7411, 127.0.0.1:7412"')
    assert load_config(dirs / A).platform == "127.0.0.1:7411, 127.0.0.1:7412"


def test_real_daemon_with_a_bad_key_exits_2_with_one_line(dirs: Path) -> None:
    """What a user runs: ``semq node run`` as a process, a wrong window."""
    set_key(dirs / A, "window", '"big"')
    p = subprocess.run([sys.executable, "-m", "semq", "node", "run", "--dir", str(dirs / A)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == (f"error: {dirs / A / 'semq.toml'}: window = \"big\" is not an integer;"
                        " allowed: an integer 1..1000000\n")


# ---------------------------------------------------------------- permissions


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_stores_keys_and_event_logs_are_made_owner_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = os.umask(0o022)  # the usual umask: what was made 0644 before
    try:
        assert run(capsys, "platform", "init", "--dir", str(tmp_path / "P"))[0] == 0
        assert run(capsys, "node", "init", "--dir", str(tmp_path / A), "--org", A,
                   "--enroll-from", str(tmp_path / "P"))[0] == 0
        (tmp_path / "doc").write_bytes(b"<order/>")
        assert run(capsys, "send", "--dir", str(tmp_path / A), "--to", B, "--type", "ORDER", "-q",
                   str(tmp_path / "doc"))[0] == 0  # writes the store and the event log
        assert run(capsys, "backup", "--dir", str(tmp_path / A), "--out", str(tmp_path / "a.sqlite"))[0] == 0
    finally:
        os.umask(old)
    for d in (tmp_path / "P", tmp_path / A):
        assert _mode(d) == 0o700, d
    private = [tmp_path / "P" / "platform.sqlite", *(tmp_path / A).glob("node.sqlite*"),
               *(tmp_path / A / "events").glob("*.jsonl"), *(tmp_path / A / "keys").glob("*.key.pem"),
               tmp_path / "a.sqlite"]
    assert {p.name for p in private} >= {"node.sqlite", "node.sqlite-wal", "node.sqlite-shm", "sign.key.pem"}
    assert any(p.suffix == ".jsonl" for p in private)
    for p in private:
        assert _mode(p) == 0o600, f"{p} is {_mode(p):04o}"
    assert _mode(tmp_path / A / "events") == 0o700


@pytest.mark.parametrize("what", ["directory", "store", "wal", "event log", "platform store"])
def test_a_daemon_refuses_a_directory_or_store_others_can_read(dirs: Path, capsys: pytest.CaptureFixture[str],
                                                               what: str) -> None:
    (dirs / "doc").write_bytes(b"x")
    assert run(capsys, "send", "--dir", A, "--to", B, "--type", "X", "-q", "doc")[0] == 0
    d = dirs / ("P" if what == "platform store" else A)
    path, mode, fix = {
        "directory": (d, 0o755, f"chmod 700 {d}"),
        "store": (d / "node.sqlite", 0o644, f"chmod 600 {d / 'node.sqlite'}"),
        "wal": (d / "node.sqlite-wal", 0o640, f"chmod 600 {d / 'node.sqlite-wal'}"),
        "event log": (next((d / "events").glob("*.jsonl"), d), 0o604, "chmod 600 "),
        "platform store": (d / "platform.sqlite", 0o660, f"chmod 600 {d / 'platform.sqlite'}"),
    }[what]
    if what == "wal" and not path.exists():
        path.write_bytes(b"")
    assert path.is_file() or path.is_dir()
    os.chmod(path, mode)
    rc, out, err = run(capsys, "platform" if what == "platform store" else "node", "run", "--dir", str(d))
    assert rc == 2 and out == ""
    one_error(err, f"{path} is accessible by group/others (mode {mode:04o})", f"run {fix}")
    assert not (d / "status.json").exists()
    os.chmod(path, 0o700 if path.is_dir() else 0o600)  # what the message says fixes it


def test_one_line_names_every_fix(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = dirs / A
    (d / "events").mkdir(mode=0o700)
    for day in ("2026-01-01", "2026-01-02"):
        (d / "events" / f"events-{day}.jsonl").write_bytes(b"")
        os.chmod(d / "events" / f"events-{day}.jsonl", 0o644)
    os.chmod(d / "node.sqlite", 0o644)
    os.chmod(d, 0o750)
    rc, _, err = run(capsys, "node", "run", "--dir", str(d))
    assert rc == 2
    one_error(err, f"data directory {d} is accessible by group/others (mode 0750) (and 3 more);"
                   f" run chmod 700 {d} && chmod 600 {d / 'node.sqlite'} {d / 'events' / '*.jsonl'}")


# ---------------------------------------------------------------- the docs


def test_docs_list_every_key_from_the_one_definition() -> None:
    from semq.settings.config import SETTINGS, settings_table

    doc = (ROOT / "docs" / "operations.md").read_text()
    m = re.search(r"<!-- settings -->\n(.*?)<!-- /settings -->", doc, re.S)
    assert m, "docs/operations.md has no <!-- settings --> table"
    assert m.group(1).strip() == settings_table().strip(), (
        "docs/operations.md's settings table differs from semq.settings.config.settings_table(); paste its output")
    for key in SETTINGS:
        assert f"| `{key}` |" in m.group(1)
