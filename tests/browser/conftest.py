"""A headless Chromium for the browser tests, and where their screenshots go.

Selenium drives Debian's ``chromium`` through Debian's ``chromedriver`` (package ``chromium-driver``):
the two come from one source package, so their versions always match, and naming the driver's path
keeps Selenium Manager from trying to download one. Without them every browser test skips, saying
what to install; ``.ci/run`` installs them when it can.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests.browser.support import ARTIFACTS_ENV, CHROMEDRIVER, CHROMIUM, FLAGS, browser_missing, watch_for_injection

ARTIFACT_DIRS = []  # the screenshot directory of this session, named in the terminal summary


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """One headless Chromium for the session, 1280 px wide, with a fresh profile."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(300)  # open_page waits for every image of a long report
    watch_for_injection(driver)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def demo_replay(tmp_path_factory):
    """(store, alerts file) of the bundled demo data replayed by the pipeline, as ``python -m pipeline`` does."""
    from pipeline.main import main as pipeline_main
    from pipeline.options import DEMO_INPUT

    root = tmp_path_factory.mktemp("demo")
    store, alerts = root / "trainguard.duckdb", root / "alerts.jsonl"
    assert pipeline_main([f"--input_files={DEMO_INPUT}", f"--local_store={store}", f"--alerts_file={alerts}"]) == 0
    return store, alerts


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> pathlib.Path:
    """The directory of the screenshots: pytest's tmp dir, or tests/browser/artifacts/ when asked."""
    if os.environ.get(ARTIFACTS_ENV):
        path = pathlib.Path(__file__).parent / "artifacts"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
    else:
        path = tmp_path_factory.mktemp("browser-artifacts")
    ARTIFACT_DIRS.append(path)
    return path


def pytest_terminal_summary(terminalreporter):
    for path in ARTIFACT_DIRS:
        terminalreporter.write_line(f"browser screenshots: {path}")
