"""The documentation site: built strictly (a broken link, a missing page or reference fails
the build), served locally and opened in a real headless browser (Chromium from Debian, as
tools/test.sh installs it): every page loads without a console error, the navigation leads
where it says, and search finds the page that explains ``TF_CONFIG``."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from selenium import webdriver
    except ImportError:
        pytest.fail("no selenium: pip install -e '.[docs]' (tools/test.sh installs every extra)")
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(
            f"no Chromium ({CHROMIUM}) or chromedriver ({CHROMEDRIVER}): "
            "apt-get install chromium chromium-driver (tools/test.sh does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_site_builds_strictly_with_every_page_of_the_nav(site: Path) -> None:
    for page in (
        "index.html",
        "getting-started.html",
        "reference/strategyjob.html",
        "reference/cli.html",
        "reference/api.html",
        "benchmarks/runs.html",
        "kubernetes/migrating-from-tfjob.html",
    ):
        assert (site / page).is_file(), page
    crd = (site / "reference" / "strategyjob.html").read_text()
    assert "rendezvousTimeoutSeconds" in crd and "Refused at" in crd
    api = (site / "reference" / "api.html").read_text()
    assert "MultiWorkerMirroredStrategy" in api and "experimental_distribute_dataset" in api


def test_every_page_loads_in_a_browser_without_console_errors(
    site: Path, served: str, browser: object
) -> None:
    from selenium.webdriver.common.by import By

    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    assert len(pages) > 20
    errors = {}
    for page in pages:
        if page == "404.html":
            continue
        browser.get(f"{served}/{page}")
        assert browser.find_element(By.CSS_SELECTOR, "article h1").text, page
        severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        if severe:
            errors[page] = severe
    assert not errors, errors


def test_the_navigation_leads_to_its_pages(served: str, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(f"{served}/index.html")
    link = browser.find_element(By.CSS_SELECTOR, "a[href='getting-started.html'].md-nav__link")
    browser.execute_script("arguments[0].click()", link)
    WebDriverWait(browser, 20).until(expected_conditions.url_contains("getting-started.html"))
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "Getting started"


def test_searching_tf_config_finds_the_page_that_explains_it(served: str, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(f"{served}/index.html")
    browser.find_element(By.CSS_SELECTOR, "label.md-search__icon, label[for='__search']").click()
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.send_keys("TF_CONFIG")

    def results(driver: object) -> list[str]:
        found = driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
        return [a.get_attribute("href") for a in found]

    hrefs = WebDriverWait(browser, 30).until(results)
    assert any("getting-started.html" in h or "guide/strategies.html" in h for h in hrefs), hrefs
