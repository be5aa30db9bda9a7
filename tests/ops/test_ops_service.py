"""systemd units: contents, install into a directory (never systemctl),
--print, refusals (a different unit there without --force, a data directory
the unit could not use: missing, not initialised, another role, an account
that does not exist, does not own it or cannot reach it); SIGHUP reload
calls the callback and survives failures."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import trio

from semq.cli import main as semq_main
from semq.ops.cli import main as ops_main
from semq.ops.service import UnitSpec, install_unit, reload_on_sighup, unit_name, unit_text


def test_unit_text_node() -> None:
    text = unit_text(UnitSpec(role="node", directory=Path("/var/lib/semq/10008"), ident="10008",
                              command=("/opt/semq/bin/semq",), extra_args=("--metrics", "127.0.0.1:9410")))
    lines = text.splitlines()
    assert "Type=simple" in lines
    assert "ExecStart=/opt/semq/bin/semq node run --dir /var/lib/semq/10008 --metrics 127.0.0.1:9410" in lines
    assert "ExecReload=/bin/kill -HUP $MAINPID" in lines
    assert "Restart=on-failure" in lines
    assert "User=semq" in lines and "Group=semq" in lines
    for opt in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/semq/10008",
                "PrivateTmp=yes", "ProtectHome=yes", "CapabilityBoundingSet=", "UMask=0077",
                "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "SystemCallFilter=@system-service",
                "WantedBy=multi-user.target", "After=network-online.target"):
        assert opt in lines, opt
    assert "Description=SEMQ organization node 10008 (store-and-forward messaging)" in lines
    assert unit_name("node", "10008") == "semq-node-10008.service"
    assert unit_name("platform", "p") == "semq-platform.service"


def test_unit_text_platform_under_home() -> None:
    text = unit_text(UnitSpec(role="platform", directory=Path("/home/ops/relay"), user="relay", group="ops",
                              command=("/usr/bin/python3", "-m", "semq")))
    assert "ExecStart=/usr/bin/python3 -m semq platform run --dir /home/ops/relay" in text
    assert "ProtectHome=read-only" in text and "User=relay" in text and "Group=ops" in text


def test_unit_refuses_unsafe_values() -> None:
    with pytest.raises(ValueError, match="data directory"):
        unit_text(UnitSpec(role="node", directory=Path("/var/lib/my semq")))
    with pytest.raises(ValueError, match="data directory"):
        unit_text(UnitSpec(role="node", directory=Path("/var/lib/semq%i")))
    with pytest.raises(ValueError, match="account"):
        unit_text(UnitSpec(role="node", directory=Path("/x"), user="root\nExecStartPre=/bin/sh"))
    with pytest.raises(ValueError, match="role"):
        unit_text(UnitSpec(role="relay", directory=Path("/x")))


def test_install_writes_file_and_prints_next_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    units = tmp_path / "units"
    path = install_unit(UnitSpec(role="platform", directory=tmp_path / "P", command=("/usr/bin/semq",)), units)
    assert path == units / "semq-platform.service" and path.read_text().startswith("# Written by")
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    out = capsys.readouterr().out
    assert "systemctl daemon-reload" in out and "systemctl enable --now semq-platform.service" in out
    assert out.startswith("# Written by") and f"wrote {path} (above)" in out


ME = pwd.getpwuid(os.getuid()).pw_name


def test_cli_service_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "n"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    capsys.readouterr()
    units = tmp_path / "units"
    assert ops_main(["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(units),
                     "--user", ME]) == 0
    text = (units / "semq-node-10008.service").read_text()
    assert f"--dir {d}" in text and f"User={ME}" in text
    out = capsys.readouterr().out
    assert out.startswith("# Written by 'semq service install'") and f"wrote {units / 'semq-node-10008.service'}" in out
    assert ops_main(["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(tmp_path / "u2"),
                     "--print"]) == 0
    assert "[Service]" in capsys.readouterr().out and not (tmp_path / "u2").exists()
    assert ops_main(["service", "install", "--role", "platform", "--dir", str(d), "--print"]) == 2
    assert "holds a node, not a platform" in capsys.readouterr().err


def one_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"


def test_install_never_overwrites_a_different_unit_without_force(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "n"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    units = tmp_path / "units"
    unit = units / "semq-node-10008.service"
    base = ["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(units), "--user", ME]
    assert ops_main(base) == 0
    capsys.readouterr()
    assert ops_main(base) == 0  # the same unit again: nothing to do
    assert capsys.readouterr().out == f"{unit} is already this unit; nothing written\n"
    before = unit.read_text()
    assert ops_main([*base, "--metrics", "127.0.0.1:9410"]) == 2
    one_error(capsys.readouterr().err, f"{unit} exists and differs", "--force")
    assert unit.read_text() == before
    assert ops_main([*base, "--metrics", "127.0.0.1:9410", "--force"]) == 0
    out = capsys.readouterr().out
    assert f"--- {unit} (before)" in out and "+ExecStart=" in out and "--metrics 127.0.0.1:9410" in out
    assert "-ExecStart=" in out and f"replaced {unit}" in out and "systemctl restart semq-node-10008" in out
    assert "--metrics 127.0.0.1:9410" in unit.read_text()


def test_install_refuses_a_data_directory_the_unit_could_not_use(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    units = tmp_path / "units"

    def install(d: Path, *extra: str) -> str:
        assert ops_main(["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(units),
                         "--user", ME, *extra]) == 2
        err = capsys.readouterr().err
        one_error(err)
        return err

    assert "does not exist: create it first (semq node init" in install(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    assert "is not initialised (no semq.toml)" in install(tmp_path / "empty")
    assert semq_main(["platform", "init", "--dir", str(tmp_path / "P"), "--no-security"]) == 0
    capsys.readouterr()
    assert "holds a platform, not a node" in install(tmp_path / "P")
    assert semq_main(["node", "init", "--dir", str(tmp_path / "n"), "--org", "10008", "--no-security"]) == 0
    capsys.readouterr()
    err = install(tmp_path / "n", "--user", "no-such-semq-account")
    assert "user no-such-semq-account (User= of the unit) does not exist" in err and "useradd --system" in err
    assert not units.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="changes a directory's owner: needs root")
def test_install_refuses_a_directory_its_user_does_not_own_or_cannot_reach(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account 'nobody'")
    grp.getgrgid(nobody.pw_gid)
    group = grp.getgrgid(nobody.pw_gid).gr_name
    units = tmp_path / "units"
    base = ["service", "install", "--role", "node", "--unit-dir", str(units), "--user", "nobody", "--group", group]
    # Under pytest's owner-only base directory: nobody cannot get there.
    d = tmp_path / "n"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    capsys.readouterr()
    assert ops_main([*base, "--dir", str(d)]) == 2
    one_error(capsys.readouterr().err, f"nobody cannot reach {d}", "is not searchable by it")
    # Reachable, but owned by root.
    top = Path(tempfile.mkdtemp(prefix="semq-unit-", dir="/tmp"))
    try:
        top.chmod(0o711)
        d = top / "n"
        assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
        capsys.readouterr()
        assert ops_main([*base, "--dir", str(d)]) == 2
        one_error(capsys.readouterr().err, f"data directory {d} is owned by root, not by nobody",
                  f"chown -R nobody:{group} {d}")
        os.chown(d, nobody.pw_uid, nobody.pw_gid)  # the directory, not yet what is in it
        assert ops_main([*base, "--dir", str(d)]) == 2
        one_error(capsys.readouterr().err, "is owned by root, not by nobody", "more)")
        for p in [d, *d.rglob("*")]:
            os.chown(p, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        assert ops_main([*base, "--dir", str(d)]) == 0
        assert "User=nobody" in (units / "semq-node-10008.service").read_text()
    finally:
        shutil.rmtree(top)


async def test_reload_on_sighup() -> None:
    calls: list[str] = []

    async def reload() -> dict[str, str]:
        calls.append("r")
        if len(calls) == 2:
            raise RuntimeError("bad certificate")
        return {"changed": "x"}

    async with trio.open_nursery() as nursery:
        await nursery.start(reload_on_sighup, reload)
        for n in (1, 2, 3):
            os.kill(os.getpid(), signal.SIGHUP)
            with trio.fail_after(5):
                while len(calls) < n:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert calls == ["r", "r", "r"]  # the failing reload did not stop it
