"""The web console in a real browser (Playwright driving Debian's Chromium)
against real daemons: a platform and two nodes on 127.0.0.1 that exchanged
documents (tests/web/_console.py). A screenshot of each page is written to
``test-artifacts/console/`` at the repository root (or $SEMQ_SCREENSHOTS)
for a person to look at. scripts/test installs Chromium when it is missing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web._console import PASSWORDS, B, C, ConsoleCluster

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 20_000


def _shots() -> Path:
    d = Path(os.environ.get("SEMQ_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "test-artifacts" / "console")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleCluster]:
    w = ConsoleCluster(tmp_path_factory.mktemp("browser"))
    try:
        w.start()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise AssertionError(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=TIMEOUT_MS)
        try:
            yield b
        finally:
            b.close()


def _context(browser: Any) -> Any:
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    return ctx


def _login(page: Any, url: str, user: str) -> None:
    page.goto(f"{url}/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", PASSWORDS[user])
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")


def test_console_in_a_browser(web: ConsoleCluster, browser: Any) -> None:
    shots = _shots()
    url = web.node_url
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        # Not logged in: pages go to the login form, the JSON endpoint says 401.
        page.goto(f"{url}/search")
        assert "/login" in page.url
        page.screenshot(path=str(shots / "01-login.png"), full_page=True)
        assert ctx.request.get(f"{url}/api/dashboard").status == 401

        # The dashboard: both charts drawn (uPlot's canvases), tables filled by the poller.
        _login(page, url, "alice")
        page.wait_for_selector("#chart-rates canvas")
        page.wait_for_selector("#chart-latency canvas")
        page.wait_for_selector("#updated:text-matches('^Updated')")  # (a polled function is an eval: the CSP forbids it)
        page.wait_for_selector("#backlog tbody tr td:text('30003')")
        page.wait_for_selector("#certs tbody tr td:text('web console')")
        assert page.locator(".u-legend").count() == 2
        page.screenshot(path=str(shots / "02-dashboard.png"), full_page=True)

        # Search by key, then the document's timeline with its hops and the verified receipt.
        page.click("nav a:text('Search')")
        page.fill("input[name=text]", "INV-0001")
        page.click("button:text('Search')")
        link = page.locator("#results a", has_text=web.sent["inv1"])
        assert link.count() == 1
        page.screenshot(path=str(shots / "03-search.png"), full_page=True)
        link.click()
        page.wait_for_selector("#role-origin")
        events = page.locator("#role-origin td.event").all_text_contents()
        for step in ("queued", "sent", "ack_fwd", "ack2"):
            assert step in events, (step, events)
        assert events.index("queued") < events.index("sent") < events.index("ack_fwd") < events.index("ack2")
        assert page.locator("#receipt-verdict").text_content().startswith("Verified: signed by 20002")
        page.screenshot(path=str(shots / "04-timeline.png"), full_page=True)

        # Partners: B online, C (enrolled, never connected) offline as the platform says, with the
        # document waiting for it; that document's page says where it is and why it waits.
        page.click("nav a:text('Partners')")
        page.wait_for_selector(f"#partner-{C}")
        assert page.locator(f"#partner-{C} td.presence").text_content() == "offline"
        assert page.locator(f"#partner-{B} td.presence").text_content() == "online"
        assert page.locator(f"#partner-{C} td").nth(4).text_content() == "1"  # waiting to reach it
        page.screenshot(path=str(shots / "12-partners.png"), full_page=True)
        page.goto(f"{url}/doc?lk0={web.sent['waiting']}")
        why = page.locator("#why").text_content()
        assert why.startswith("stored at the platform (SS_ACK):") and f"{C} is offline" in why, why
        assert f"the platform delivers it when {C} connects" in why
        page.screenshot(path=str(shots / "13-document-why.png"), full_page=True)

        # Resend (operator): the dry run's confirmation page, then done; the audit page shows both.
        page.goto(f"{url}/doc?lk0={web.sent['waiting']}")
        page.click("#act-resend-origin")
        assert "1 of 1 selected document(s) would be resent" in page.locator("#would").text_content()
        page.screenshot(path=str(shots / "05-confirm-resend.png"), full_page=True)
        page.click("#confirm")
        assert "1 of 1 selected document(s) resent" in page.locator("#done").text_content()
        page.screenshot(path=str(shots / "06-resend-done.png"), full_page=True)
        page.click("a:text('Audit log')")
        rows = page.locator("#audit tbody tr")
        assert rows.count() >= 2
        assert rows.nth(0).locator("td.action").text_content() == "resend"
        assert "alice" in rows.nth(0).text_content() and "changed 1" in rows.nth(0).text_content()
        page.screenshot(path=str(shots / "07-audit.png"), full_page=True)
        page.click("nav a:text('Actions')")
        assert page.locator("form[action='/action/drain']").count() == 1
        page.screenshot(path=str(shots / "07b-actions.png"), full_page=True)

        # The hostile AppKey is text on the page, and nothing ran.
        page.goto(f"{url}/doc?lk0={web.sent['hostile']}")
        assert "<script>alert('pwned')</script>" in page.locator("#role-origin dd.key").text_content()
        page.screenshot(path=str(shots / "08-hostile-appkey.png"), full_page=True)
        assert not errors, errors  # no CSP violation, no script error on any page
    finally:
        ctx.close()

    # The platform's console: its own certificate, its nodes online, what it stores.
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, web.platform_url, "victor")
        page.wait_for_selector("#chart-rates canvas")
        page.wait_for_selector("#nodes tbody tr td:text('10001')")
        page.wait_for_selector("#backlog tbody tr td:text('30003')")
        page.screenshot(path=str(shots / "11-platform-dashboard.png"), full_page=True)
    finally:
        ctx.close()

    # A viewer: no action button, and a forged POST with a valid token is refused.
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, url, "victor")
        page.goto(f"{url}/doc?lk0={web.sent['waiting']}")
        assert page.locator("#act-resend-origin").count() == 0
        assert page.locator("nav a:text('Actions')").count() == 0
        page.screenshot(path=str(shots / "09-viewer-timeline.png"), full_page=True)
        token = page.locator("input[name=csrf]").first.get_attribute("value")
        r = ctx.request.post(f"{url}/action/resend", form={"csrf": token, "lk0": web.sent["waiting"], "confirm": "1"})
        assert r.status == 403
        page.set_content(r.text())
        page.screenshot(path=str(shots / "10-viewer-forged-post-403.png"), full_page=True)
    finally:
        ctx.close()
