"""The dashboard in headless Chromium, served by ``python -m dashboard`` on the replayed demo: the alerts page, an
alert's interactive chart (hover shows value, run and step), a dismiss with a note that is pending until a replay
applies it; hostile names stay text. Screenshots at 1,400 px and a phone's width are kept as artifacts."""

from __future__ import annotations

import shutil
import urllib.parse

import pytest

from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY
from sinks.duckdb_store import DuckDBStore
from tests.browser.support import (
    FLAG_MESSAGE,
    FLAG_METRIC,
    FLAG_RUN,
    FLAG_TEST,
    WIDE,
    event_handler_attributes,
    injected,
    screenshot,
    shows,
    sticking_out,
    visible_text,
)
from tests.dashboard.conftest import replay
from tests.dashboard.support import served
from tests.report.test_report import alert_row, job_row, metric_row, small_store_rows

PHONE = 390
CIFAR = "pt-cifar-tpu-v3-8"


def show(browser, url: str, width: int) -> None:
    """Opens ``url`` at ``width`` px and waits until the page's charts are drawn."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 700})
    browser.get(url)
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30).until(lambda b: b.execute_script("return document.body.dataset.chartsReady"))


@pytest.fixture
def demo(demo_replay, tmp_path):
    store, alerts = demo_replay
    shutil.copy(store, tmp_path / "trainguard.duckdb")
    shutil.copy(alerts, tmp_path / "alerts.jsonl")
    return tmp_path / "trainguard.duckdb"


@pytest.mark.long
def test_follow_an_alert_to_its_chart_and_dismiss_it(browser, demo, artifacts):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with served(f"--local_store={demo}", "--user=browser") as base:
        show(browser, f"{base}/alerts", WIDE)
        assert shows(browser, "Alerts") and shows(browser, CIFAR)
        screenshot(browser, artifacts / "dashboard-alerts-1400.png", WIDE)
        rows = browser.find_elements(By.CSS_SELECTOR, "table.alerts tbody tr")
        target = next(r for r in rows if "Accuracy/test_max" in r.text and f"{CIFAR}-011" in r.text)
        target.find_element(By.CSS_SELECTOR, "td a").click()
        show(browser, browser.current_url, WIDE)
        assert "/alerts/" in browser.current_url
        assert shows(browser, "Accuracy/test_max = 70.1028 is outside bounds")
        charts = browser.find_elements(By.CSS_SELECTOR, ".chart-box .u-over")
        assert charts, "no chart was drawn"
        history = charts[0]
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", history)
        width = history.size["width"]
        ActionChains(browser).move_to_element_with_offset(history, width // 2 - 2, 0).perform()
        legend = browser.find_element(By.CSS_SELECTOR, ".chart .u-legend").text
        assert f"{CIFAR}-0" in legend and "step" in legend, legend
        assert "lower bound" in legend and "out of bounds" in legend and "this run" in legend
        assert "triaged" not in legend  # a mark with no point is left out
        labels = browser.execute_script("return Array.from(document.querySelectorAll('.u-label')).map(e => e.textContent)")
        assert "run end (UTC)" in labels and "Accuracy/test_max" in labels
        screenshot(browser, artifacts / "dashboard-alert-1400.png", WIDE)

        browser.find_element(By.NAME, "note").send_keys("flaky host <b>")
        browser.find_element(By.CSS_SELECTOR, "button[value=dismiss]").click()
        show(browser, browser.current_url, WIDE)
        assert shows(browser, "pending: dismissed") and shows(browser, "flaky host <b>")

        replay(demo, demo.parent / "alerts.jsonl")  # the pipeline applies the triage file
        browser.refresh()
        show(browser, browser.current_url, WIDE)
        assert "pending: dismissed" not in visible_text(browser)
        assert browser.find_element(By.CSS_SELECTOR, "dd .state").text == "dismissed"
        screenshot(browser, artifacts / "dashboard-alert-dismissed-1400.png", WIDE)
        show(browser, browser.current_url, PHONE)
        assert sticking_out(browser) == []
        screenshot(browser, artifacts / "dashboard-alert-phone.png", PHONE)
        show(browser, f"{base}/alerts", PHONE)
        assert sticking_out(browser) == []
        screenshot(browser, artifacts / "dashboard-alerts-phone.png", PHONE)
        assert injected(browser) == []


def test_hostile_names_stay_text(browser, tmp_path, artifacts):
    rows = small_store_rows()
    rows[JOB_HISTORY] += [job_row(FLAG_TEST, FLAG_RUN, 0, "success")]
    rows[METRIC_HISTORY] += [metric_row(FLAG_TEST, FLAG_RUN, 0, FLAG_METRIC, 3.0, 1.0, 2.0, False)]
    rows[ALERTS] += [{**alert_row(FLAG_TEST, FLAG_RUN, 0, "metric_out_of_bounds", FLAG_METRIC, FLAG_MESSAGE, {}),
                      "alert_id": "f1a9"}]
    store = DuckDBStore(str(tmp_path / "hostile.duckdb"))
    store.ensure_schema()
    for table, table_rows in rows.items():
        store.insert(table, table_rows)
    store.close()
    with served(f"--local_store={tmp_path / 'hostile.duckdb'}") as base:
        for path in ["/alerts", "/alerts/f1a9", "/test?" + urllib.parse.urlencode({"name": FLAG_TEST}),
                     "/run?" + urllib.parse.urlencode({"test": FLAG_TEST, "run": FLAG_RUN}), "/tests"]:
            show(browser, base + path, WIDE)
            assert injected(browser) == [], path
            assert event_handler_attributes(browser) == [], path
        assert shows(browser, FLAG_TEST)
        show(browser, base + "/alerts/f1a9", WIDE)
        assert shows(browser, FLAG_MESSAGE)
        screenshot(browser, artifacts / "dashboard-hostile-1400.png", WIDE)


def test_every_page_draws_and_fits_a_phone(browser, demo, artifacts):
    from selenium.webdriver.common.by import By

    run = f"{CIFAR}-011"
    paths = {"test": "/test?" + urllib.parse.urlencode({"name": CIFAR}),
             "run": "/run?" + urllib.parse.urlencode({"test": CIFAR, "run": run}),
             "dead-letters": "/dead-letters", "tests": "/tests"}
    with served(f"--local_store={demo}") as base:
        for name, path in paths.items():
            for width in (WIDE, PHONE):
                show(browser, base + path, width)
                assert sticking_out(browser) == [], (name, width)
                screenshot(browser, artifacts / f"dashboard-{name}-{width}.png", width)
            if name in ("test", "run"):
                assert browser.find_elements(By.CSS_SELECTOR, ".chart-box canvas"), name
        assert injected(browser) == []


def test_the_bigquery_path_in_the_browser(browser, demo, bigquery_emulator, artifacts):
    """The demo's rows in the BigQuery emulator, served with --bigquery_dataset: the alerts page and an alert's
    chart as from the store (read-only: no topic, so no triage buttons)."""
    from selenium.webdriver.common.by import By

    from tests.test_docs import demo_rows_into_bigquery

    demo_rows_into_bigquery(str(demo), bigquery_emulator, "dashboard_browser")
    with served(f"--bigquery_project={bigquery_emulator.project}", "--bigquery_dataset=dashboard_browser",
                f"--bigquery_endpoint={bigquery_emulator.endpoint}") as base:
        show(browser, f"{base}/alerts", WIDE)
        assert shows(browser, f"BigQuery {bigquery_emulator.project}.dashboard_browser")
        rows = browser.find_elements(By.CSS_SELECTOR, "table.alerts tbody tr")
        assert len(rows) == 11
        target = next(r for r in rows if "Accuracy/test_max" in r.text and f"{CIFAR}-011" in r.text)
        target.find_element(By.CSS_SELECTOR, "td a").click()
        show(browser, browser.current_url, WIDE)
        assert shows(browser, "Accuracy/test_max = 70.1028 is outside bounds")
        assert browser.find_elements(By.CSS_SELECTOR, ".chart-box canvas")
        assert shows(browser, "Read-only: this dashboard has no triage file or topic to write to.")
        screenshot(browser, artifacts / "dashboard-bigquery-alert-1400.png", WIDE)
        assert injected(browser) == []
