"""The console's Inbox and Send pages in a real browser (Playwright driving
Debian's Chromium) against real daemons (tests/web/_api.py): the pages
call the node's HTTP API themselves (a file posted as the document's
body, the content downloaded streamed, an acknowledgement with the
session's CSRF token). Screenshots go where test_console_browser.py puts
its own (``test-artifacts/console/``, or $SEMQ_SCREENSHOTS)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semq.web.api import PREFIX
from tests._procs import wait_until
from tests.web._api import PASSWORD, A, ApiCluster, B
from tests.web.test_console_browser import _context, _shots, browser  # noqa: F401 (the browser fixture)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCluster]:
    w = ApiCluster(tmp_path_factory.mktemp("api-browser"))
    try:
        w.start()
        yield w
    finally:
        w.stop()


def _login(page: Any, url: str, user: str) -> None:
    page.goto(f"{url}/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")


def test_inbox_and_send_pages_in_a_browser(api: ApiCluster, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    shots = _shots()
    url = api.urls[A]
    # Documents for node A: one small from bob (B), one large (2 MiB: streamed, read from its file).
    big = os.urandom(2 << 20)
    with api.client(B, "bob") as bob:
        small = bob.post(f"{PREFIX}/documents", params={"to": A, "data_type": "ORDER", "key": "PO-7781"},
                         content=b"<order id='PO-7781'><line n='1'/></order>").json()
        large = bob.post(f"{PREFIX}/documents", params={"to": A, "data_type": "CAD", "key": "DRAWING-12"},
                         content=big).json()
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        _login(page, url, "olga")

        def listed() -> bool:
            page.goto(f"{url}/inbox")
            return page.locator("#inbox td.key", has_text="DRAWING-12").count() == 1

        wait_until(listed, 90, "both documents in node A's inbox page")
        assert page.locator("#inbox td.key", has_text="PO-7781").count() == 1
        assert "waiting to be acknowledged" in page.locator("#inbox-count").text_content()
        page.screenshot(path=str(shots / "20-inbox.png"), full_page=True)

        # The small document: its page, its content downloaded, then acknowledged.
        page.locator("#inbox tr", has_text="PO-7781").locator("a").first.click()
        page.wait_for_selector("#doc")
        assert small["lk0"] in page.locator("#doc").text_content()
        with page.expect_download() as dl:
            page.click("#download")
        assert Path(dl.value.path()).read_bytes() == b"<order id='PO-7781'><line n='1'/></order>"
        page.click("#ack")
        expect(page.locator("#ack-result")).to_have_text("Acknowledged.")
        assert page.locator("#doc-state").text_content() == "acknowledged"
        page.screenshot(path=str(shots / "21-inbox-document-acknowledged.png"), full_page=True)

        # The large one: downloaded whole (streamed from its file).
        page.goto(f"{url}/inbox")
        page.locator("#inbox tr", has_text="DRAWING-12").locator("a").first.click()
        page.wait_for_selector("#download")
        assert large["lk0"] in page.locator("#doc").text_content() and "large document" in page.content()
        with page.expect_download() as dl:
            page.click("#download")
        assert hashlib.sha256(Path(dl.value.path()).read_bytes()).hexdigest() == hashlib.sha256(big).hexdigest()
        page.goto(f"{url}/inbox")
        assert page.locator("#inbox td.key", has_text="PO-7781").count() == 0  # acknowledged: not listed
        page.screenshot(path=str(shots / "22-inbox-after-ack.png"), full_page=True)

        # Send a file to a partner (over one block: staged on the node's disk, then a large document).
        f = tmp_path / "invoice-901.xml"
        f.write_bytes(b"<invoice id='INV-901'>" + b"<line/>" * 200_000 + b"</invoice>")
        page.click("nav a:text('Send')")
        page.fill("input[name=to]", f"{B}/bob")
        page.fill("input[name=data_type]", "INVOICE")
        page.fill("input[name=key]", "INV-901")
        page.set_input_files("input[name=file]", str(f))
        page.click("#send-button")
        page.wait_for_selector("#sent-lk0")
        lk0 = page.locator("#sent-lk0").text_content()
        assert lk0.startswith(f"{A}/") and "durable" in page.locator("#send-result").text_content()
        page.screenshot(path=str(shots / "23-send-done.png"), full_page=True)
        with api.client(B, "bob") as bob:
            doc = wait_until(lambda: next((d for d in bob.get(f"{PREFIX}/inbox").json()["documents"]
                                           if d["lk0"] == lk0), None), 90, "the sent file at bob")
            assert bob.get(f"{PREFIX}/inbox/{doc['id']}/content").content == f.read_bytes()

        assert not errors, errors  # no CSP violation, no script error
        # A refusal is shown as the API's one line (an unknown colleague); the
        # browser logs the answer's 400, and nothing else goes wrong.
        page.fill("input[name=to]", "nobody")
        page.click("#send-button")
        expect(page.locator("#send-result")).to_have_text(re.compile(r"^Not sent: .*nobody"))
        page.screenshot(path=str(shots / "24-send-refused.png"), full_page=True)
        assert errors == ["Failed to load resource: the server responded with a status of 400 ()"], errors
    finally:
        ctx.close()

    # A viewer: the inbox without Download or Acknowledge, and no Send page.
    ctx = _context(browser)
    try:
        page = ctx.new_page()
        _login(page, url, "vera")
        assert page.locator("nav a:text('Send')").count() == 0
        page.goto(f"{url}/inbox")
        page.locator("#inbox tr", has_text="DRAWING-12").locator("a").first.click()
        page.wait_for_selector("#doc")
        assert page.locator("#download").count() == 0 and page.locator("#ack").count() == 0
        page.screenshot(path=str(shots / "25-inbox-viewer.png"), full_page=True)
    finally:
        ctx.close()
