"""The dashboard in a real browser (headless Chromium through its driver): the page shows the
members and the partition table, and when a member is killed it shows it dead, the removal
and the migrations that follow, without a reload. The last screenshot is kept in
test-artifacts/ (or $SHMGRID_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ARTIFACTS = Path(os.environ.get("SHMGRID_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "test-artifacts"))


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "the browser test needs chromium and chromedriver: bash .ci/browser"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1500,1000", "--disable-gpu"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def test_the_page_follows_a_kill_without_a_reload(dashboard, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    client = dashboard.cluster.connect()
    client.get_map("orders").put_all({f"o{i}": b"x" * 100 for i in range(2000)})
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)

    # The page redraws on every snapshot: read it in one script, never through stale handles.
    def query(script: str):
        return browser.execute_script(script)

    def members(process: str) -> list[str]:
        return query(f"""return [...document.querySelectorAll('#members tbody tr')]
            .filter(r => r.dataset.process === '{process}').map(r => r.dataset.member)""")

    def timeline(kind: str) -> int:
        return query(f"return document.querySelectorAll('#timeline li[data-type={kind}]')"
                     ".length")

    def text(element: str) -> str:
        return query(f"return document.getElementById('{element}').textContent")

    browser.get(dashboard.url)
    wait.until(lambda _: len(members("running")) == 3)
    assert query("return document.querySelectorAll('#grid .cell').length") == 271
    wait.until(lambda _: "orders" in text("maps"))
    assert text("safe") == "safe" and text("link") == "live"
    page = query("return performance.timeOrigin")

    os.kill(dashboard.cluster.member("member-2")["pid"], signal.SIGKILL)
    wait.until(lambda _: members("dead") == ["member-2"])
    for kind in ("member_removed", "migration_started", "cluster_safe"):
        wait.until(lambda _, kind=kind: timeline(kind))
    assert query("return performance.timeOrigin") == page  # never reloaded
    owners = set(query("""return [...document.querySelectorAll('#grid .cell')]
        .map(c => c.title.split(';')[0].split('owner ')[1])"""))
    assert owners == {"member-0", "member-1"}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
