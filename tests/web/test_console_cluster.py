"""The platform console of a cluster: two platform instances on one
PostgreSQL store as real processes (a real PostgreSQL server: SEMQ_TEST_PG,
or the test session's throwaway one), the console on instance 1. Its
Instances page lists both, alive, then the stopped one gone; its
Organizations page shows an organization connected to the other instance
as online there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from semq.cli import main as semq_main
from tests._procs import Cluster, Proc, read_status, wait_until
from tests.web._console import PASSWORDS, client, login
from tests.web.test_console_browser import _context, _login, _shots
from tests.web.test_console_browser import browser as browser  # (the module's fixture)

pytestmark = pytest.mark.e2e

A, B = "10011", "20022"


def _cells(html: str, attr: str, key: str) -> list[str]:
    """The text of the cells of the row ``data-{attr}="{key}"``."""
    m = re.search(rf'<tr data-{attr}="{re.escape(key)}"[^>]*>(.*?)</tr>', html, re.S)
    assert m, f"no row {key} in the page"
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1), re.S)]


def _screenshots(browser: Any, web: str, names: dict[str, str]) -> None:
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, web, "alice")
        for path, name in names.items():
            page.goto(web + path)
            page.screenshot(path=str(_shots() / f"c-{name}.png"), full_page=True)
    finally:
        ctx.close()


def test_instances_and_organizations_of_a_cluster(tmp_path: Path, pg_url: str, browser: Any) -> None:
    c = Cluster(tmp_path, store=pg_url, platforms=2)  # type: ignore[arg-type]
    try:
        c.add_org(A, instance=1)
        c.add_org(B, instance=2)
        pw = tmp_path / "alice.pw"
        pw.write_text(PASSWORDS["alice"] + "\n")
        assert semq_main(["console", "user", "add", "alice", "--role", "operator", "--password-file", str(pw),
                          "--dir", str(tmp_path / "P")]) == 0
        c.procs["P"] = Proc("platform", ["platform", "run", "--dir", str(tmp_path / "P"), "--listen",
                                         f"127.0.0.1:{c.ports[0]}", "--inquiry-interval", c.iq,
                                         "--web", "127.0.0.1:0"], tmp_path / "platform.log", "listening on")
        c.start_platform(instance=2)
        c.start_node(A)
        c.start_node(B)
        web = "https://" + wait_until(lambda: read_status(tmp_path / "P").get("web"), 20, "the console")
        wait_until(lambda: read_status(tmp_path / A).get("connected") and read_status(tmp_path / B).get("connected"),
                   30, "both nodes connected")
        p1, p2 = (f"127.0.0.1:{p}" for p in c.ports)
        import ssl

        ctx = ssl.create_default_context(cafile=str(tmp_path / "P" / "ca" / "ca.pem"))
        with client(web, ctx) as h:
            assert login(h, "alice").status_code == 303

            def instances() -> dict[str, list[str]]:
                page = h.get("/instances").text
                assert "share this platform's PostgreSQL store" in page
                ids = re.findall(r'<tr data-instance="([^"]+)"', page)
                return {_cells(page, "instance", i)[1]: _cells(page, "instance", i) for i in ids}

            got = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(instances()), 20, "two instances")
            assert got[p1][3] == "alive" and got[p2][3] == "alive", got
            assert "(this console" in got[p1][0] and "(this console" not in got[p2][0]
            # B is connected to instance 2: online there, as the shared presence says.
            orgs = wait_until(lambda: (lambda t: t if "online at" in _cells(t, "org", B)[1] else None)(
                h.get("/orgs").text), 20, "B online at instance 2")
            inst2 = next(i for i, row in got.items() if i == p2)
            assert _cells(orgs, "org", B)[1] == f"online at {got[inst2][0]}"
            assert _cells(orgs, "org", A)[1] == "online"
            _screenshots(browser, web, {"/instances": "01-cluster-instances", "/orgs": "02-cluster-organizations"})
            # Instance 2 killed: gone once its heartbeat is older than 5 s (its row stays: no clean stop).
            c.kill("P2")
            after = wait_until(lambda: (lambda r: r if r.get(p2, ["", "", "", ""])[3] == "gone" else None)(
                instances()), 20, "instance 2 gone")
            assert after[p1][3] == "alive"
            _screenshots(browser, web, {"/instances": "03-cluster-instance-gone"})
    finally:
        c.stop_all()
