"""Errors that explain: one line naming the value and the limit, no
traceback. A port that is taken, a listening address without a port, a
node init that fails half-way (nothing left behind), a reader that closes
the pipe early, a clean SIGTERM (nothing alarming in the log), text from
other organizations with control characters and times in epoch
milliseconds shown for a person, counts out of range."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semq.cli import main
from semq.node.api import NodeClient
from tests._procs import Cluster, free_port, wait_until

A = "10008"
NASTY = "INV\x1b[2J\x07-1\n"  # clears the screen and rings the bell if printed as it is
ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A platform P and a node A without security, nothing running; a daemon
    that gets as far as starting fails the test."""
    def started(*_a: object, **_k: object) -> int:
        raise AssertionError("the daemon started")

    monkeypatch.setattr("semq.cli.platform.run_daemon", started)
    monkeypatch.setattr("semq.cli.node.run_daemon", started)
    monkeypatch.delenv("SEMQ_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "platform", "init", "--dir", "P", "--no-security", "--listen", f"127.0.0.1:{free_port()}")[0] == 0
    assert run(capsys, "node", "init", "--dir", A, "--org", A, "--no-security")[0] == 0
    yield tmp_path


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_in_use_is_named_with_a_hint(dirs: Path, taken: int, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "platform", "run", "--dir", "P", "--listen", f"127.0.0.1:{taken}")
    assert rc == 1
    one_error(err, f"cannot listen on 127.0.0.1:{taken} (--listen): the address is in use",
              "another instance may be running")
    for option in ("--metrics", "--web"):
        rc, _, err = run(capsys, "platform", "run", "--dir", "P", "--listen", "127.0.0.1:0", option,
                         f"127.0.0.1:{taken}")
        assert rc == 1
        one_error(err, f"cannot listen on 127.0.0.1:{taken} ({option})", "another instance may be running")
    rc, _, err = run(capsys, "node", "run", "--dir", A, "--metrics", f"127.0.0.1:{taken}")
    assert rc == 1
    one_error(err, f"127.0.0.1:{taken} (--metrics): the address is in use")


def test_the_configured_listen_address_in_use_names_the_file(dirs: Path, taken: int,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    p = dirs / "P" / "semq.toml"
    text = p.read_text()
    p.write_text("\n".join(f'listen = "127.0.0.1:{taken}"' if ln.startswith("listen =") else ln
                           for ln in text.splitlines()) + "\n")
    rc, _, err = run(capsys, "platform", "run", "--dir", "P")
    assert rc == 1
    one_error(err, f"127.0.0.1:{taken} (listen in {dirs / 'P' / 'semq.toml'})")


def test_a_listening_address_without_a_port_is_refused(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "platform", "run", "--dir", "P", "--listen", "localhost")
    assert rc == 2
    one_error(err, "--listen 'localhost' has no port", "e.g. localhost:7410 (port 0: any free port)")
    rc, _, err = run(capsys, "platform", "init", "--dir", "P2", "--listen", "0.0.0.0")
    assert rc == 2 and not (dirs / "P2").exists()
    one_error(err, "--listen '0.0.0.0' has no port")
    rc, _, err = run(capsys, "node", "run", "--dir", A, "--web", "127.0.0.1")
    assert rc == 2
    one_error(err, "--web '127.0.0.1'")


@pytest.mark.parametrize("platform", ["missing", "a node", "no CA"])
def test_a_failed_enrolling_init_leaves_nothing_behind(dirs: Path, platform: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    pdir = {"missing": dirs / "nowhere", "a node": dirs / A, "no CA": dirs / "P"}[platform]
    target = dirs / "B"
    rc, _, err = run(capsys, "node", "init", "--dir", str(target), "--org", "56001", "--enroll-from", str(pdir))
    assert rc in (1, 2)
    one_error(err)
    assert not target.exists(), sorted(p.name for p in target.iterdir())
    # A directory that was there keeps what it held, and nothing more.
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    rc, _, err = run(capsys, "node", "init", "--dir", str(target), "--org", "56001", "--enroll-from", str(pdir))
    assert rc in (1, 2)
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]


def test_an_enrolment_refused_after_the_keys_were_written_leaves_nothing_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.identity.security

    assert run(capsys, "platform", "init", "--dir", str(tmp_path / "P"))[0] == 0

    def refused(*_a: object, **_k: object) -> None:
        raise semq.identity.security.SecurityError("the CA refused the request")

    monkeypatch.setattr(semq.identity.security, "enroll", refused)
    target = tmp_path / "B"
    rc, _, err = run(capsys, "node", "init", "--dir", str(target), "--org", "56001", "--enroll-from",
                     str(tmp_path / "P"))
    assert rc == 1
    one_error(err, "the CA refused the request")
    assert not target.exists()


def test_a_reader_that_stops_early_ends_the_command_quietly(dirs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The reader has gone before semq writes: every write meets a closed pipe.
    p = subprocess.Popen([sys.executable, "-m", "semq", "status", "--dir", str(dirs / A)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and err == "", err
    # And as a shell runs it: more output than a pipe holds, `head -1` leaves.
    r = subprocess.run(["bash", "-c", f"set -o pipefail; for i in 1 2 3; do {sys.executable} -m semq help codes;"
                        f" done | head -1"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("Result codes"), r


@pytest.mark.e2e
def test_sigterm_stops_the_daemons_with_nothing_alarming_in_their_logs(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    try:
        c.add_org(A)
        c.start_platform()
        c.start_node(A, "--metrics", "127.0.0.1:0", "--web", "127.0.0.1:0")
        wait_until(lambda: "connected" in (tmp_path / f"{A}.log").read_text(), 20, "the node to connect")
        assert c.kill(A, signal.SIGTERM) == 0
        assert c.kill("P", signal.SIGTERM) == 0
    finally:
        c.stop_all()
    for log in (tmp_path / "platform.log", tmp_path / f"{A}.log"):
        text = log.read_text()
        for alarming in ("Traceback", "Exceptions from Trio nursery", "ERROR", "Exception"):
            assert alarming not in text, f"{log.name}:\n{text[-3000:]}"


def test_control_characters_are_escaped_and_times_shown(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from semq.node.features.txn import Transactions

    with NodeClient(dirs / A) as node:
        node.send("56001", b"x", data_type="INVOICE", key=NASTY)
        Transactions(node).send("56001", b"y", data_type="ORDER", key=NASTY)
    rc, out, _ = run(capsys, "messages", "--dir", A)
    assert rc == 0 and "INV\\x1b[2J\\x07-1\\n" in out and "\x1b" not in out and "\x07" not in out
    rc, out, _ = run(capsys, "messages", "--dir", A, "--json")
    assert json.loads(out)[0]["app_key"].endswith(NASTY)  # JSON keeps the value
    rc, out, _ = run(capsys, "tx", "list", "--dir", A)
    assert rc == 0 and "INV\\x1b[2J" in out and "\x1b" not in out
    rc, out, _ = run(capsys, "tx", "show", "--dir", A, "1")
    assert rc == 0 and "\x1b" not in out
    created = next(ln for ln in out.splitlines() if ln.startswith("created_ms: "))
    assert created[len("created_ms: "):][:2] == "20" and ":" in created[len("created_ms: "):], created


def test_admin_rows_and_records_are_shown_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    from semq.ops.cli import _print_fields, _print_rows

    _print_rows([{"id": 1, "target": "56001", "state": "SS_SENT", "save_fwd": 3, "attempts": 1, "code": 0,
                  "size": 10, "created_ms": 1_795_329_835_412, "app_key": {"data_type": "INVOICE", "key": NASTY}}])
    _print_fields({"id": 1, "created_ms": 1_795_329_835_412, "app_key": {"key": NASTY}, "took_ms": 12})
    out = capsys.readouterr().out
    assert "\x1b" not in out and "INVOICE/INV\\x1b[2J" in out
    assert "created_ms: 2026-" in out and "  key: INV\\x1b" in out and "took_ms: 12" in out


@pytest.mark.parametrize("argv", [
    ["messages", "--limit", "0"], ["messages", "--limit", "-5"], ["tx", "list", "--limit", "0"],
    ["dead", "--limit", "-1"], ["dead", "list", "--limit", "0"], ["requests", "--limit", "0"],
    ["replies", "--limit", "100000"], ["admin", "list", "--limit", "0"], ["admin", "stuck", "--limit", "-3"],
])
def test_counts_out_of_range_are_refused_with_the_range(dirs: Path, argv: list[str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, *argv, "--dir", A)
    assert rc == 2
    value = argv[argv.index("--limit") + 1]
    one_error(err, f"--limit {value} is outside 1..10000")


def test_daemon_durations_out_of_range_are_refused(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "platform", "run", "--dir", "P", "--drain-timeout", "0")
    assert rc == 2
    one_error(err, "--drain-timeout 0 is outside 0.1..86400")
    rc, _, err = run(capsys, "node", "run", "--dir", A, "--stuck-after", "-1")
    assert rc == 2
    one_error(err, "--stuck-after -1 is outside 1..31536000")


def test_each_units_metrics_port_is_checked_once_before_the_units_start(
        dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "node", "init", "--dir", "U", "--org", "77000", "--no-security", "--units", "2")[0] == 0
    with socket.socket() as held:  # a free port whose next one another process holds
        for _ in range(50):
            first = free_port()
            try:
                held.bind(("127.0.0.1", first + 1))
                break
            except OSError:
                continue
        held.listen()
        rc, _, err = run(capsys, "node", "run", "--dir", "U", "--metrics", f"127.0.0.1:{first}")
    assert rc == 1
    one_error(err, f"cannot listen on 127.0.0.1:{first + 1} (--metrics of unit 2)")


@pytest.mark.parametrize("argv,says", [
    (["queue", "get", "q", "--lease", "-1"], "argument --lease: '-1' is not a positive number of seconds"
                                             " (semq queue get --help)"),
    (["admin", "lst"], "argument admin_cmd: invalid choice: 'lst'"),
    (["messages", "--limit", "x"], "argument --limit: invalid int value: 'x' (semq messages --help)"),
])
def test_a_command_line_argparse_refuses_is_one_line_too(argv: list[str], says: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    one_error(capsys.readouterr().err, says)
