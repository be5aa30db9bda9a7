"""The console's working pages in a real browser (Playwright driving
Debian's Chromium) against real daemons (tests/web/_console.py): a node's
Outbox (filters, a failed document requeued, confirmed ones offered no
action), the platform's Organizations and Instances, the dashboard's
charts with large values, the header. A screenshot of every console page,
the node's and the platform's, goes where test_console_browser.py puts its
own (``test-artifacts/console/``, or $SEMQ_SCREENSHOTS), prefixed ``p-``."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import pytest

from semq.node.api import NodeClient
from tests._procs import wait_until
from tests.web._console import ConsoleCluster
from tests.web.test_console_browser import _context, _login, _shots
from tests.web.test_console_browser import browser as browser  # (the module's fixture, shared)

pytestmark = pytest.mark.e2e

NOBODY = "40004"  # registered nowhere: a document to it fails (SS_FAILED)


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleCluster]:
    w = ConsoleCluster(tmp_path_factory.mktemp("pages"))
    try:
        w.start()
        with NodeClient(w.a_dir) as node:
            w.sent["failed"] = str(node.send(to=NOBODY, data=b"for nobody", data_type="ORDER", key="NOBODY-0001"))
        wait_until(lambda: _outbox_state(w, w.sent["failed"]) == "SS_FAILED", 30, "the document to 40004 failed")
        yield w
    finally:
        w.stop()


def _outbox_state(w: ConsoleCluster, lk0: str) -> str | None:
    from semq.ops.admin import admin_call, admin_socket_path

    rows = admin_call(admin_socket_path(w.a_dir), "list", {"table": "outbox"}, timeout=10)["rows"]
    return next((r["state"] for r in rows if r["lk0"] == lk0), None)


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(_shots() / f"p-{name}.png"), full_page=True)


def _rows(page: Any, table: str) -> list[str]:
    """The LK0s of a table's rows."""
    return [x for x in page.locator(f"#{table} tbody tr").evaluate_all("rs => rs.map(r => r.dataset.lk0)") if x]


def _errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_outbox_filters_requeue_and_confirmed_documents(web: ConsoleCluster, browser: Any) -> None:
    url, s = web.node_url, web.sent
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors = _errors(page)
        _login(page, url, "alice")
        page.click("nav a:text('Outbox')")
        page.wait_for_selector("#outbox")
        pending = _rows(page, "outbox")
        assert set(pending) == {s["waiting"], s["failed"]}, pending
        waiting = page.locator(f"#outbox tr[data-lk0='{s['waiting']}']")
        failed = page.locator(f"#outbox tr[data-lk0='{s['failed']}']")
        assert waiting.locator("td.state").text_content() == "stored at the platform (SS_ACK)"
        assert failed.locator("td.state").text_content().startswith("failed (SS_FAILED)")
        # Each row is offered what its state takes: resend a stored one, requeue a failed one, purge both.
        assert waiting.locator("button").all_text_contents() == ["Resend…", "Purge…"]
        assert failed.locator("button").all_text_contents() == ["Requeue…", "Purge…"]
        # The confirmed documents: listed apart, confirmed by 20002, no action anywhere.
        confirmed = _rows(page, "confirmed")
        for what in ("hostile", "inv0", "inv1", "inv2"):
            assert s[what] in confirmed and s[what] not in pending
            row = page.locator(f"#confirmed tr[data-lk0='{s[what]}']")
            assert row.locator("td.confirmed-by").text_content() == "confirmed by 20002"
            assert row.locator("button, input").count() == 0
        assert "semq send --to ORG" in page.locator("#confirmed-note").text_content()
        _shot(page, "01-outbox")

        # Filters: by state, by target, by key, by age; a filter that selects nothing says so.
        page.select_option("select[name=state]", "SS_FAILED")
        page.click("#outbox-filter button")
        assert _rows(page, "outbox") == [s["failed"]]
        assert page.locator("#confirmed").count() == 0
        _shot(page, "02-outbox-failed")
        page.goto(f"{url}/outbox?state=failed")  # (as typed: the code without SS_, any case)
        assert _rows(page, "outbox") == [s["failed"]]
        page.goto(f"{url}/outbox?target=30003")
        assert _rows(page, "outbox") == [s["waiting"]] and _rows(page, "confirmed") == []
        assert "No confirmed document with these filters" in page.locator("#confirmed-none").text_content()
        page.goto(f"{url}/outbox?text=INV-0001")
        assert _rows(page, "outbox") == [] and _rows(page, "confirmed") == [s["inv1"]]
        assert page.locator("#pending-none").text_content() == "No document waits to be sent with these filters."
        _shot(page, "03-outbox-key")
        page.goto(f"{url}/outbox?text={s['waiting']}")
        assert _rows(page, "outbox") == [s["waiting"]]
        page.goto(f"{url}/outbox?age=1d")
        assert _rows(page, "outbox") == []
        page.goto(f"{url}/outbox?state=confirmed")
        assert page.locator("#outbox").count() == 0 and s["inv2"] in _rows(page, "confirmed")
        _shot(page, "04-outbox-confirmed")

        # A document's page offers what its state takes, as its outbox row does.
        page.goto(f"{url}/doc?lk0={s['waiting']}")
        assert page.locator("#role-origin .actions button").all_text_contents() == ["Resend…", "Purge…"]
        page.goto(f"{url}/doc?lk0={s['failed']}")
        assert page.locator("#role-origin .actions button").all_text_contents() == ["Requeue…", "Purge…"]
        _shot(page, "04b-document-failed")

        # Requeue the failed document from its row: the dry run, then done, and audited.
        page.goto(f"{url}/outbox")
        page.locator(f"#outbox tr[data-lk0='{s['failed']}'] button.act-requeue").click()
        assert "1 of 1 selected document(s) would be requeued" in page.locator("#would").text_content()
        _shot(page, "05-outbox-requeue-confirm")
        page.click("#confirm")
        assert "1 of 1 selected document(s) requeued" in page.locator("#done").text_content()
        _shot(page, "06-outbox-requeue-done")
        page.click("a:text('Audit log')")
        top = page.locator("#audit tbody tr").nth(0)
        assert top.locator("td.action").text_content() == "requeue" and "changed 1" in top.text_content()
        _shot(page, "07-audit")

        # Rows ticked, then one action for them: its dry run names both (and nothing changes unconfirmed).
        page.goto(f"{url}/outbox")
        for what in ("waiting", "failed"):
            page.check(f"#outbox tr[data-lk0='{s[what]}'] input[type=checkbox]")
        page.click("#bulk-purge")
        assert "2 of 2 selected document(s) would be purged" in page.locator("#would").text_content()
        _shot(page, "06b-outbox-ticked-purge-confirm")
        # Every document a filter selects: the filter goes along, not the page's rows.
        page.goto(f"{url}/outbox?target=30003")
        page.click("#filter-actions button:text('Resend…')")
        assert "1 of 1 selected document(s) would be resent" in page.locator("#would").text_content()
        assert page.locator("dl.facts dd").all_text_contents() == ["30003"]
        assert _outbox_state(web, s["waiting"]) == "SS_ACK"  # (dry runs only)

        # A confirmed document's page: no Resend, no Purge; who confirmed it and how to send a new copy.
        page.goto(f"{url}/doc?lk0={s['inv1']}")
        assert page.locator("#act-resend-origin").count() == 0 and page.locator("#act-purge-origin").count() == 0
        text = page.locator("#confirmed-origin").text_content()
        assert text.startswith("Confirmed by 20002 at ") and "semq send --to 20002 --type INVOICE FILE" in text
        _shot(page, "08-document-confirmed")
        # ...and an action asked for it by hand says why nothing matches.
        page.goto(f"{url}/actions")
        _shot(page, "09-actions")
        page.fill("form[action='/action/resend'] input[name=lk0]", s["inv1"])
        page.click("form[action='/action/resend'] button")
        assert "0 of 0" in page.locator("#would").text_content()
        assert f"{s['inv1']} is already confirmed by 20002" in page.locator("p.note").text_content()
        _shot(page, "10-resend-confirmed-refused")
        page.goto(f"{url}/search?go=1")
        _shot(page, "11-search")
        assert not errors, errors  # no CSP violation, no script error on any page

        # Bad filters: one line naming the value, 400, nothing else.
        for query, says in (("state=SENT<script>", "state 'SENT<script>' is not one of"),
                            ("target=abc", "target 'abc' is not an organization's number"),
                            ("age=-5", "age '-5' is not a number of seconds"),
                            ("text=99999/1/1/1", "LK0 99999/1/1/1 is a document of 99999")):
            r = ctx.request.get(f"{url}/outbox?{query}")
            assert r.status == 400 and says in html.unescape(r.text()), (query, r.status)
            assert "<script>" not in r.text()
        for query in ("text=" + "9" * 40, f"text=10001/1/1/{'9' * 40}", f"text=10001/{'9' * 30}/1/5",
                      "text=" + "x" * 5000, "target=" + "1" * 5000):
            r = ctx.request.get(f"{url}/outbox?{query}")
            assert r.status == 200 and "No document waits to be sent with these filters." in r.text(), query[:40]
        page.goto(f"{url}/outbox?state=SENT%3Cscript%3E")
        assert page.locator("#error").text_content().startswith("state 'SENT<script>'")
        _shot(page, "12-outbox-bad-filter")
        assert ctx.request.get(f"{url}/orgs").status == 404
    finally:
        ctx.close()

    # A viewer sees the outbox and acts on nothing.
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, url, "victor")
        page.goto(f"{url}/outbox")
        assert page.locator("#outbox tbody tr").count() >= 1
        assert page.locator("#outbox button, #outbox input[type=checkbox], #filter-actions").count() == 0
        _shot(page, "13-outbox-viewer")
    finally:
        ctx.close()


def test_dashboard_charts_and_header(web: ConsoleCluster, browser: Any) -> None:
    """Tick labels as wide as '120,000' leave the axis titles clear; the
    header names the role once."""
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors = _errors(page)

        def large(route: Any) -> None:
            resp = route.fetch()
            d = resp.json()
            n = len(d["rates"].get("start") or [])
            d["rates"]["sent"] = [120_000 if i == n - 1 else 0 for i in range(n)]
            lat = d["latency"]
            lat["p99"] = [300_000 if i == len(lat["ts"]) - 1 else v for i, v in enumerate(lat["p99"])]
            route.fulfill(response=resp, body=json.dumps(d))

        page.route("**/api/dashboard", large)
        _login(page, web.node_url, "alice")
        page.wait_for_selector("#updated:text-matches('^Updated')")  # (a polled function is an eval: the CSP forbids it)
        page.wait_for_selector("#chart-rates canvas")
        assert page.locator("header .brand").text_content().strip() == "SEMQ node 10001"
        for chart in ("chart-rates", "chart-latency"):
            room = page.evaluate("""id => {
                const u = document.getElementById(id).semqChart, ax = u.axes[1];
                u.ctx.font = ax.font[0];
                const widest = Math.max(...ax._values.map(v => u.ctx.measureText(String(v)).width)) / devicePixelRatio;
                return {size: ax._size, need: ax.ticks.size + ax.gap + widest, values: ax._values};
            }""", chart)
            assert room["size"] >= room["need"], (chart, room)
        page.locator("#chart-rates").screenshot(path=str(_shots() / "p-14-chart-rates-large.png"))
        _shot(page, "15-dashboard-large-values")
        assert not errors, errors
    finally:
        ctx.close()


def test_platform_organizations_and_instances(web: ConsoleCluster, browser: Any) -> None:
    url = web.platform_url
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors = _errors(page)
        _login(page, url, "alice")
        page.wait_for_selector("#nodes tbody tr td:text('10001')")
        assert page.locator("header .brand").text_content().strip() == "SEMQ platform"
        assert "platform platform" not in page.title()
        _shot(page, "20-platform-dashboard")

        page.click("nav a:text('Organizations')")
        orgs = page.locator("#orgs tbody tr")
        by = {r.get_attribute("data-org"): r for r in orgs.all()}
        assert {"10001", "20002", "30003"} <= set(by), list(by)
        assert by["10001"].locator("td.online").text_content() == "online"
        assert by["30003"].locator("td.online").text_content() == "offline"
        # 30003 never ran: the document waiting for it is stored here.
        assert int(by["30003"].locator("td.stored").text_content()) >= 1
        assert by["30003"].locator("td").nth(2).text_content() == "never"
        assert "Storage quota per organization: 4.0 GiB" in page.locator("#orgs-summary").text_content()
        _shot(page, "21-platform-organizations")

        page.click("nav a:text('Instances')")
        rows = page.locator("#instances tbody tr")
        assert rows.count() == 1
        assert rows.nth(0).locator("td.alive").text_content() == "alive"
        assert "SQLite: one instance" in page.locator("#instances-note").text_content()
        _shot(page, "22-platform-instances")

        for path, name in (("/search?go=1", "23-platform-search"), ("/actions", "24-platform-actions"),
                           ("/audit", "25-platform-audit"), (f"/doc?lk0={web.sent['waiting']}", "26-platform-document"),
                           ("/outbox", "27-platform-outbox-404")):
            page.goto(url + path)
            _shot(page, name)
        assert ctx.request.get(f"{url}/outbox").status == 404
        page.click("button:text('Log out')")
        _shot(page, "28-platform-login")
        assert errors == ["Failed to load resource: the server responded with a status of 404 ()"], errors
    finally:
        ctx.close()
