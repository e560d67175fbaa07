"""The report's alert list: what an alert says, escaped, with its next steps and links."""

import dataclasses

from core.alert_record import alert_from_row
from report.page import alert_row
from tests.notifier.test_render import HOSTILE_METRIC, elements, finished_alert


def row_of(alert):
    record = alert_from_row(alert.to_row())
    return alert_row(record, set())


def text_of(row: str) -> str:
    """The row's text as a reader gets it: identifiers sit in their own (unbreakable) elements."""
    return "".join(elements(f"<table>{row}</table>").text)


def test_an_alert_row_shows_the_unit_how_the_bounds_were_computed_links_and_next_steps():
    raised = finished_alert()
    row = row_of(raised)
    assert "<td>70.1 %</td>" in row and "+inf) %" in row
    assert "median 74.6 % \u2212 5 \u00d7 robust scale" in row and "previous 74.6 % (run run-1-4)" in text_of(row)
    assert '<a href="https://reports.example/pt-cifar/run-1.html" rel="noopener noreferrer">report</a>' in row
    assert all(f"<code>{step}</code>" in row for step in raised.details["next_steps"])


def test_hostile_names_and_links_in_an_alert_row_stay_text():
    raised = finished_alert(metric=HOSTILE_METRIC, pattern=None)
    raised = dataclasses.replace(raised, details={**raised.details, "report_url": "javascript:alert(1)"})
    parsed = elements(f"<table>{row_of(raised)}</table>")
    assert set(parsed.tags) <= {"table", "tr", "td", "a", "br", "span", "code", "pre"}
    assert all(value.startswith(("#", "https://")) for name, value in parsed.attributes if name == "href")
    text = "".join(parsed.text)
    assert HOSTILE_METRIC in text and all(step in text for step in raised.details["next_steps"])


def test_a_rejected_config_row_names_the_file_the_key_and_what_is_used_instead():
    from core.config_versions import ConfigCheck, config_rejected_alert

    check = ConfigCheck("gs://b/tg/configs/pt-cifar.json", "d1", 1795255200.0,
                        "regression_test_config.alert_for_failed_job", "unknown key", "pt-cifar", True)
    row = row_of(config_rejected_alert(check))
    assert "<td>config_rejected</td>" in row and ">pt-cifar</span></a>" in row and ">config</span></a>" in row
    assert ("gs://b/tg/configs/pt-cifar.json: regression_test_config.alert_for_failed_job: unknown key "
            "(what was read before stays in use)") in text_of(row)


def test_a_lifecycle_row_says_how_long_the_run_ran_and_when_it_was_last_heard_from():
    from core.alert_record import AlertRecord
    from report.source import JobRow

    missing = AlertRecord("a1", "run_missing", "t", "r1", None, None, None, None, "run r1 never reported run_finished",
                          1795255200.0 + 6 * 3600, {"status": "missing"})
    job = JobRow("t", "r1", "missing", 1795255200.0 + 970, 1795255200.0 + 6 * 3600, 1795255200.0)
    text = text_of(alert_row(missing, set(), job))
    assert "run r1 never reported run_finished" in text
    assert "ran 16 min from 2026-11-21 10:00 UTC; last heard from 2026-11-21 10:16 UTC" in text
    assert "ran " not in text_of(alert_row(missing, set()))  # no job_history row: nothing made up
