"""systemd units: contents, install into a directory (never systemctl),
--print, refusals; SIGHUP reload calls the callback and survives failures."""

from __future__ import annotations

import os
import signal
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
    assert "useradd --system" in out


def test_cli_service_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "n"
    assert semq_main(["node", "init", "--dir", str(d), "--org", "10008", "--no-security"]) == 0
    capsys.readouterr()
    units = tmp_path / "units"
    assert ops_main(["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(units),
                     "--user", "semq10008"]) == 0
    text = (units / "semq-node-10008.service").read_text()
    assert f"--dir {d}" in text and "User=semq10008" in text
    capsys.readouterr()
    assert ops_main(["service", "install", "--role", "node", "--dir", str(d), "--unit-dir", str(tmp_path / "u2"),
                     "--print"]) == 0
    assert "[Service]" in capsys.readouterr().out and not (tmp_path / "u2").exists()
    assert ops_main(["service", "install", "--role", "platform", "--dir", str(d), "--print"]) == 2
    assert "holds a node, not a platform" in capsys.readouterr().err
    assert ops_main(["service", "install", "--role", "node", "--dir", str(tmp_path / "none"),
                     "--unit-dir", str(units)]) == 2
    assert "no configuration" in capsys.readouterr().err


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
