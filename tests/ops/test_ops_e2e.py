"""Operations against real processes: ``semq admin`` commands
against a running platform and nodes, Prometheus counters moving during
traffic, a backup of the running platform restored with every stored
message, SIGHUP reload, drain and stop ending the processes with status 0.

Runs once semq.cli registers semq.ops and the run commands take the
operational options (docs/operations.md, "Wiring"); skipped before."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from semq.ops.admin import admin_call
from tests._procs import Cluster, Proc, free_port, wait_until
from tests.ops.test_ops_metrics import value

pytestmark = pytest.mark.e2e


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def admin(d: Path, cmd: str, **args: Any) -> Any:
    return admin_call(d / "admin.sock", cmd, args, timeout=10)


def test_operations_against_running_daemons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = Cluster(tmp_path, inquiry_interval=0.5)
    pdir, adir, bdir = tmp_path / "P", c.add_org("10008"), c.add_org("56001")
    pm, am = free_port(), free_port()
    procs: dict[str, Proc] = {}
    try:
        procs["P"] = Proc("platform", ["platform", "run", "--dir", str(pdir), "--listen", f"127.0.0.1:{c.port}",
                                       "--inquiry-interval", "0.5", "--metrics", f"127.0.0.1:{pm}"],
                          tmp_path / "platform.log", "listening on")
        procs["A"] = Proc("A", ["node", "run", "--dir", str(adir), "--inquiry-interval", "0.5",
                                "--metrics", f"127.0.0.1:{am}", "--log-format", "json"],
                          tmp_path / "A.log", "running")
        wait_until(lambda: admin(adir, "status")["connected"], 20, "A connected")
        for i in range(20):
            doc = tmp_path / f"po{i}.txt"
            doc.write_bytes(b"order %d" % i)
            assert semq_main(["send", "--dir", str(adir), "--to", "56001", "--type", "ORDER", "--key", f"S{i}",
                              "-q", str(doc)]) == 0
        # B is offline: the platform stores, A waits for ACK2
        wait_until(lambda: admin(pdir, "status")["stored"].get("56001", {}).get("stored") == 20, 20, "stored")
        pst = admin(pdir, "status")
        assert pst["online"] == ["10008"] and pst["sessions"][0]["node"] == "10008"
        capsys.readouterr()
        assert semq_main(["status", "--dir", str(pdir)]) == 0  # live over the admin socket
        assert "online: 10008" in capsys.readouterr().out
        assert {n["node"]: n["online"] for n in pst["nodes"]} == {"10008": True, "56001": False}
        wait_until(lambda: admin(adir, "status")["outbox"] == {"SS_ACK": 20}, 20, "A: SS_ACK")
        st = admin(adir, "stuck", older_than=0)
        assert st["count"] == 20 and st["by_place"] == {"stored_at_platform": 20}
        text = scrape(pm)
        assert value(text, "semq_stored_total") == 20
        wait_until(lambda: value(scrape(am), "semq_acks_total", kind="ack_save") == 20, 20, "A: ack_save metric")
        assert value(scrape(am), "semq_messages", table="outbox", state="SS_ACK") in (0, 20)  # polled every 15 s

        # backup of the running platform; SIGHUP and admin reload keep A running
        capsys.readouterr()
        assert semq_main(["backup", "--dir", str(pdir), "--out", str(tmp_path / "p.tar.gz")]) == 0
        procs["A"].p.send_signal(signal.SIGHUP)
        assert admin(adir, "reload")["reloaded"] is True
        time.sleep(0.2)
        assert procs["A"].p.poll() is None and admin(adir, "ping")["role"] == "node"
        assert any(json.loads(line).get("msg", "").startswith("SIGHUP: reloaded")
                   for line in (tmp_path / "A.log").read_text().splitlines() if line.startswith("{"))

        procs["B"] = Proc("B", ["node", "run", "--dir", str(bdir), "--inquiry-interval", "0.5"],
                          tmp_path / "B.log", "running")
        wait_until(lambda: c.settled(["10008", "56001"]), 30, "all delivered and confirmed")
        assert len(c.inbox("56001")) == 20
        text = scrape(pm)
        assert value(text, "semq_events_total", role="platform", event="delivered") >= 20
        assert value(text, "semq_acks_total", kind="ack") >= 20
        wait_until(lambda: value(scrape(am), "semq_e2e_latency_seconds_count", kind="confirmed") == 20, 20,
                   "A: end-to-end latency observed")

        # drain B (nothing in flight: it stops at once), stop the platform
        admin(bdir, "drain")
        assert procs.pop("B").p.wait(timeout=20) == 0
        assert semq_main(["admin", "stop", "--dir", str(pdir), "--wait", "20"]) == 0
        assert procs.pop("P").p.wait(timeout=20) == 0
        assert not (pdir / "admin.sock").exists()
    finally:
        for p in procs.values():
            p.kill()
    # the backup taken while the platform ran holds the 20 stored copies
    assert semq_main(["restore", str(tmp_path / "p.tar.gz"), "--dir", str(tmp_path / "P2")]) == 0
    with sqlite3.connect(str(tmp_path / "P2" / "platform.sqlite")) as db:
        assert db.execute("SELECT count(*) FROM stored WHERE kind=1 AND target_id='56001'").fetchone()[0] == 20
