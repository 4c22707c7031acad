"""The admin in a real browser (Debian's headless Chromium driven by Selenium and
Debian's chromedriver): log in, watch a running batch's progress bar move, cancel it
with the detail page's button, see it reach `cancelled`. Screenshots go to
test-output/admin/ (gitignored)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.e2e.harness import ROOT, chat_lines, wait_until
from tests.services import in_ci

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "test-output" / "admin"
USERNAME, PASSWORD = "operator", "correct-horse-battery-staple"


@pytest.fixture
def browser():
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing:
        message = f"{', '.join(missing)} not installed (`make browser` installs them)"
        if in_ci():
            pytest.fail(f"{message}; CI must run the browser test")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def create_superuser(env: dict[str, str]) -> None:
    """In the server's own database: the same environment, from the repository root."""
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput"],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
        env={**env, "DJANGO_SUPERUSER_USERNAME": USERNAME,
             "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
             "DJANGO_SUPERUSER_EMAIL": "operator@example.com"},
    )


def screenshot(driver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / name))


def test_operator_watches_a_batch_and_cancels_it_in_the_admin(start_server, browser):
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    # Given: a running batch of 400 requests, 4 at a time, 0.3 s each (about 30 s)
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="300", BATCHGEN_MAX_POOL_SIZE="4",
                               BATCHGEN_CHUNK_SIZE="10")
    create_superuser(server.env)
    batch_id = api.create_batch(api.upload(chat_lines(400))["id"]).json()["id"]
    api.wait_status(batch_id, {"in_progress"}, timeout=60)

    # When: the operator logs in and opens the batch's page
    detail = f"/admin/batches/batch/{batch_id}/change/"
    browser.get(f"{server.base_url}/admin/login/?next={detail}")
    browser.find_element(By.ID, "id_username").send_keys(USERNAME)
    browser.find_element(By.ID, "id_password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_until(lambda: browser.current_url.endswith(detail), timeout=30,
               message="the batch's page after logging in")
    bar = f'.bg-progress[data-batch="{batch_id}"]'

    def progress() -> int:
        return int(browser.find_element(By.CSS_SELECTOR, bar).get_attribute("aria-valuenow"))

    def status() -> str:
        try:
            return browser.find_element(
                By.CSS_SELECTOR, f'.bg-status[data-batch="{batch_id}"]').text.strip()
        except WebDriverException:  # between two pages
            return ""

    # Then: the progress bar moves on its own (the page polls, nobody reloads it)
    first = progress()
    later = wait_until(lambda: (value := progress()) > first and value, timeout=60,
                       message="the progress bar to move")
    assert first < later < 400
    assert status() == "in_progress"
    assert browser.find_element(By.CSS_SELECTOR, f"{bar} .bg-progress-completed") \
        .get_attribute("style").startswith("width:")
    screenshot(browser, "batch-running.png")

    # and the batch list shows it with its bar, throughput and ETA
    browser.get(f"{server.base_url}/admin/batches/batch/")
    assert browser.find_elements(By.CSS_SELECTOR, f"#result_list {bar}")
    assert browser.find_element(
        By.CSS_SELECTOR, f'[data-batch="{batch_id}"][data-field="throughput"]').text.endswith(
        "req/s")
    screenshot(browser, "batch-list.png")

    # and the pool dashboard shows it among the active batches, with the live worker
    browser.get(f"{server.base_url}/admin/pool/")
    assert browser.find_element(By.CSS_SELECTOR, '[data-figure="active_batches"]').text == "1"
    assert browser.find_element(By.CSS_SELECTOR, '[data-figure="live_workers"]').text == "1"
    assert browser.find_elements(By.CSS_SELECTOR, f"#bg-active-batches {bar}")
    screenshot(browser, "pool-dashboard.png")

    # When: the operator cancels it with the button on its page
    browser.get(f"{server.base_url}{detail}")
    browser.find_element(By.ID, "bg-cancel-batch").click()
    browser.switch_to.alert.accept()

    # Then: the page confirms, follows it to cancelled and shows the partial output
    wait_until(lambda: "is cancel" in " ".join(
        m.text for m in browser.find_elements(By.CSS_SELECTOR, ".messagelist")),
        timeout=30, message="the confirmation message")
    wait_until(lambda: status() == "cancelled", timeout=60,
               message="the batch to show as cancelled")
    final = api.batch(batch_id)
    assert final["status"] == "cancelled"
    assert 0 < final["request_counts"]["completed"] < 400
    output_link = f'a.bg-download[href$="/{final["output_file_id"]}/content/"]'
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, output_link), timeout=30,
               message="the output file's download link")
    assert status() == "cancelled"
    assert not browser.find_elements(By.ID, "bg-cancel-batch")
    screenshot(browser, "batch-cancelled.png")
    assert (SCREENSHOTS / "batch-cancelled.png").stat().st_size > 10_000
