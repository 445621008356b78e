"""The console in a real headless browser (Debian's chromium and chromedriver, driven by
Selenium): the pages render, a hostile key is text and runs no script, an operator resolves
through the form, and a page of another origin that posts to the console is refused.
Skipped, and says why, where no chromium is installed. Set REPLAYSAFE_CONSOLE_SCREENSHOTS to
a directory to keep screenshots of the pages (docs/images/ holds the ones in the docs)."""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.console import HOSTILE, Served, state_of
from helpers.db import bind, dsn_as

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                reason="needs Debian's chromium and chromium-driver")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def _shot(driver: object, name: str) -> None:
    where = os.environ.get("REPLAYSAFE_CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"{name}.png"))  # type: ignore[attr-defined]


def test_an_operator_reads_and_resolves_in_a_browser(
        seeded: str, make_role: Callable[..., str], console_for: Callable[[str], Served],
        browser: object) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    operator = make_role("replaysafe_operator")
    bind(seeded, operator, "acme")
    served = console_for(dsn_as(seeded, operator))
    d.get(f"{served.base}/?token={served.token}")  # type: ignore[attr-defined]
    assert "token" not in d.current_url  # type: ignore[attr-defined]
    link = d.find_element(By.CSS_SELECTOR, "#unresolved-table a.key")  # type: ignore[attr-defined]
    assert link.text == HOSTILE
    _shot(d, "console-overview")
    link.click()
    with pytest.raises(NoAlertPresentException):
        d.switch_to.alert.text  # type: ignore[attr-defined]  # noqa: B018
    assert d.find_element(By.ID, "action-key").text == HOSTILE  # type: ignore[attr-defined]
    form = d.find_element(By.ID, "resolve")  # type: ignore[attr-defined]
    Select(form.find_element(By.NAME, "state")).select_by_value("succeeded")
    form.find_element(By.NAME, "result").send_keys('{"refunded": 42}')
    form.find_element(By.NAME, "note").send_keys("refund seen at the provider")
    _shot(d, "console-action")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _shot(d, "console-resolved")
    assert "unknown → succeeded" in d.find_element(By.ID, "done").text  # type: ignore[attr-defined]
    assert d.find_element(By.ID, "note").text == "refund seen at the provider"  # type: ignore[attr-defined]
    assert state_of(seeded, HOSTILE) == ("succeeded", "refund seen at the provider")


def test_a_page_of_another_origin_cannot_post_to_the_console(
        seeded: str, console_for: Callable[[str], Served], browser: object) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    served = console_for(seeded)
    d.get(f"{served.base}/?token={served.token}")  # type: ignore[attr-defined]
    # Another origin on the same machine (same site: the cookie is sent) with a form that
    # posts to the console as soon as it is clicked.
    page = (f'<form id="f" method="post" action="{served.base}/action/resolve">'
            f'<input name="tenant" value="acme"><input name="key" value="{HOSTILE}">'
            '<input name="state" value="succeeded"><input name="note" value="forged">'
            '<button id="go">go</button></form>').encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    evil = http.server.HTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        d.get(f"http://127.0.0.1:{evil.server_address[1]}/")  # type: ignore[attr-defined]
        d.find_element(By.ID, "go").click()  # type: ignore[attr-defined]
        assert "cross-site request refused" in d.find_element(By.TAG_NAME, "body").text  # type: ignore[attr-defined]
    finally:
        evil.shutdown()
    assert state_of(seeded, HOSTILE) == ("unknown", None)
