"""The report's ``index.html`` in headless Chromium: images load, links resolve, hostile names stay text.

Two real reports, written by ``report.cli.run`` as ``python -m report`` writes them: one from the small
store of tests/report (its hostile test included) plus a test whose names carry scripts that would record
themselves if they ran, and one from the replayed demo data.
"""

from __future__ import annotations

import pathlib

import pytest

from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS
from report.cli import run
from sinks.duckdb_store import DuckDBStore
from tests.browser.support import (
    FLAG_MESSAGE,
    FLAG_METRIC,
    FLAG_RUN,
    FLAG_TAG,
    FLAG_TEST,
    LONG_RUN,
    LONG_TEST,
    NARROW,
    WIDE,
    broken_images,
    content_width,
    dangling_anchors,
    event_handler_attributes,
    fits,
    injected,
    missing_files,
    open_page,
    overflow,
    payload,
    screenshot,
    shows,
    sticking_out,
    tag_counts,
    wrapped,
)
from tests.report.test_report import (
    HOSTILE,
    HOSTILE_METRIC,
    alert_row,
    job_row,
    metric_row,
    small_store_rows,
    window_row,
)


def hostile_store_rows():
    """tests/report's small store, plus a test whose every name runs a script if it is not escaped.

    And names too long to fit a line, without a space to break at.
    """
    rows = small_store_rows()
    rows[JOB_HISTORY] += [job_row(FLAG_TEST, FLAG_RUN, 0, "success"), job_row(FLAG_TEST, LONG_RUN, 1, "failure"),
                          job_row(LONG_TEST, LONG_RUN, 1, "success")]
    rows[METRIC_HISTORY] += [metric_row(FLAG_TEST, FLAG_RUN, 0, FLAG_METRIC, 1.0, 0.0, 2.0, True),
                                  metric_row(FLAG_TEST, LONG_RUN, 1, FLAG_METRIC, 3.0, 0.0, 2.0, False),
                             metric_row(LONG_TEST, LONG_RUN, 1, LONG_RUN, 3.0)]
    rows[METRIC_WINDOWS] += [window_row(FLAG_TEST, run_id, day, FLAG_TAG, 0, 0, 99, float(day))
                                  for day, run_id in enumerate([FLAG_RUN, LONG_RUN])]
    rows[ALERTS] += [alert_row(FLAG_TEST, FLAG_RUN, 0, "metric_out_of_bounds", FLAG_METRIC, FLAG_MESSAGE,
                                    {"run_data": {"logs_link": f"javascript:{payload('logs link')}"}}),
                    alert_row(FLAG_TEST, LONG_RUN, 1, "job_failed", None, f"run {LONG_RUN} failed", {}),
                    alert_row(LONG_TEST, LONG_RUN, 1, "metric_out_of_bounds", LONG_RUN, LONG_RUN,
                              {"run_data": {"logs_link": f"https://logs.example/{LONG_RUN}"}})]
    return rows


def write_store(path: pathlib.Path, rows) -> str:
    store = DuckDBStore(str(path))
    store.ensure_schema()
    for table, table_rows in rows.items():
        assert store.insert(table, table_rows) == len(table_rows)
    store.close()
    return str(path)


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    """(index.html, figures) of a report on the hostile store."""
    root = tmp_path_factory.mktemp("hostile-report")
    store = write_store(root / "hostile.duckdb", hostile_store_rows())
    result = run([f"--local_store={store}", f"--out_dir={root / 'report'}", "--no_progress"])
    return pathlib.Path(result.index), result.figures


@pytest.fixture(scope="module")
def demo_report(demo_replay, tmp_path_factory):
    """(index.html, figures) of a report on the replayed demo data."""
    store, _ = demo_replay
    result = run([f"--local_store={store}", f"--out_dir={tmp_path_factory.mktemp('demo-report')}", "--no_progress"])
    return pathlib.Path(result.index), result.figures


@pytest.fixture(params=["hostile", "demo"])
def report_page(request, browser, artifacts):
    """The browser on a report's index page (all images loaded), after a screenshot of it."""
    index, figures = request.getfixturevalue(f"{request.param}_report")
    open_page(browser, index)
    shot = screenshot(browser, artifacts / f"report-{request.param}.png")
    assert shot.stat().st_size > 0
    return browser, index, figures


def test_every_image_of_the_report_loads(report_page):
    browser, _, figures = report_page
    assert broken_images(browser) == []
    assert tag_counts(browser)["img"] == len(figures)  # one <img> per figure written, no more


def test_every_link_inside_the_report_resolves(report_page):
    browser, index, _ = report_page
    assert dangling_anchors(browser) == []
    assert missing_files(browser, index.parent) == []


def test_nothing_overflows_a_1280_px_window(report_page):
    browser, _, _ = report_page
    assert fits(browser), overflow(browser)


@pytest.fixture(params=[(name, width) for name in ("hostile", "demo") for width in (WIDE, NARROW)],
                ids=lambda p: f"{p[0]}-{p[1]}px")
def sized_report_page(request, browser, artifacts):
    """(browser, report name, width): a report opened at 1,400 px or 600 px, after a screenshot of it."""
    name, width = request.param
    index, _ = request.getfixturevalue(f"{name}_report")
    open_page(browser, index, width)
    assert screenshot(browser, artifacts / f"report-{name}-{width}px.png", width).stat().st_size > 0
    return browser, name, width


def test_the_report_uses_the_page_width_and_only_a_table_scrolls(sized_report_page):
    browser, name, width = sized_report_page
    assert content_width(browser) > 0.9  # no narrow column in a wide window
    assert fits(browser, width), overflow(browser)
    assert sticking_out(browser) == []  # but inside the table's own scrolling box
    if name == "demo" and width == WIDE:  # names of a usual length: the table fits, nothing to scroll
        assert browser.execute_script(
            "const s = document.querySelector('.scroll'); return s.scrollWidth <= s.clientWidth + 2")


def test_no_identifier_or_command_is_broken_over_lines(sized_report_page):
    browser, name, _ = sized_report_page
    assert wrapped(browser, ".id") == []  # test, run and metric names: each on one line
    assert wrapped(browser, "pre.cmd code") == []  # each next step: one whole line, in a block to copy
    if name == "demo":
        commands = browser.execute_script(
            "return Array.from(document.querySelectorAll('pre.cmd code')).map(c => c.textContent)")
        assert commands and all(c.startswith("trainguard-triage ") for c in commands)


def test_scales_are_explained_where_they_appear(browser, demo_report):
    index, _ = demo_report
    open_page(browser, index)
    assert shows(browser, "scales) vs the")  # the demo's alerts say how far off they are in scales
    assert browser.execute_script("return document.getElementById('scales').innerText").count("1.4826") == 1


def test_hostile_names_show_as_text_and_inject_nothing(browser, hostile_report):
    index, figures = hostile_report
    open_page(browser, index)
    assert injected(browser) == []
    counts = tag_counts(browser)
    assert {"script", "iframe", "svg", "b", "i"}.isdisjoint(counts)  # the page has no script of its own either
    assert counts["img"] == len(figures)
    assert event_handler_attributes(browser) == []
    hrefs = browser.execute_script("return Array.from(document.links).map(a => a.protocol)")
    assert set(hrefs) <= {"file:", "https:", "http:"}  # the javascript: logs link is not a link
    for text in (HOSTILE, HOSTILE_METRIC, FLAG_TEST, FLAG_RUN, FLAG_METRIC, FLAG_TAG, FLAG_MESSAGE, LONG_TEST,
                 LONG_RUN, "<img src=x onerror=alert(1)>", "<script>x</script>"):
        assert shows(browser, text), text
