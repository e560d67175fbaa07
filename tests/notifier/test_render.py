"""Rendering of digest and summary e-mails: subject, both bodies, and escaping of hostile input."""

from __future__ import annotations

import dataclasses
import html.parser
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from core.alert_record import parse_alert
from core.config_versions import ConfigCheck, config_rejected_alert
from notifier.render import CONFIG_FIX, one_line, render_digest, render_summary
from tests.notifier.support import START, alert, config, payload

HOSTILE_TEST = '"><img src=x onerror=alert(1)>\r\nBcc: victim@example.com'
HOSTILE_METRIC = "<script>alert('metric')</script>&amp;"
HOSTILE_RUN = "run-1</title><style>*{display:none}</style>"


class _Elements(html.parser.HTMLParser):
    """Collects tags, attributes and text of an HTML document."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attributes, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes.extend(attrs)

    def handle_data(self, data):
        self.text.append(data)


def elements(document: str) -> _Elements:
    parser = _Elements()
    parser.feed(document)
    parser.close()
    return parser


ALLOWED_TAGS = {"html", "head", "meta", "title", "body", "p", "h2", "h3", "table", "tr", "th", "td", "br", "a",
                "code", "span"}
ALLOWED_ATTRIBUTES = {"charset", "style", "href", "colspan"}


def assert_inert(document: str, *texts: str) -> None:
    """Only our own tags and attributes, only http(s) hrefs, and each of ``texts`` present as plain text."""
    parsed = elements(document)
    assert set(parsed.tags) <= ALLOWED_TAGS
    assert {name for name, _ in parsed.attributes} <= ALLOWED_ATTRIBUTES
    assert all(value.startswith(("https://", "http://")) for name, value in parsed.attributes if name == "href")
    all_text = "".join(parsed.text)
    for text in texts:
        assert text in all_text


def shown(document: str) -> str:
    """The text of an HTML body as a reader gets it (words kept whole sit in elements of their own)."""
    return "".join(elements(document).text)


def digest(*alerts, **config_overrides):
    return render_digest([parse_alert(payload(a)) for a in alerts], config(**config_overrides))


def test_subject_names_test_run_and_what_went_wrong():
    email = digest(alert(metric="Accuracy/test_final"), alert(metric="loss_final"),
                   alert(kind="job_failed", status="failure"))
    assert email.subject == ("[trainguard] pt-cifar run run-1: job failed (failure); "
                             "Accuracy/test_final and loss_final out of bounds")
    many = digest(*(alert(metric=f"m{i}") for i in range(5)))
    assert many.subject.endswith("m0, m1 and 3 more out of bounds")


def test_each_alert_shows_metric_value_bounds_history_and_links():
    email = digest(alert(metric="Accuracy/test_final", value=70.5, lower=74.0, history_size=10),
                   links={"history": "https://bq.example/q?test={test}&run={run}&m={metric}"})
    for body in (shown(email.html), email.text):
        assert "Accuracy/test_final" in body and "70.5" in body and "(74, +inf) [greater]" in body
        assert "10 earlier values" in body
    assert 'href="https://logs.example/cifar/1"' in email.html and "https://logs.example/cifar/1" in email.text
    assert "https://bq.example/q?test=pt-cifar&run=run-1&m=Accuracy%2Ftest_final" in email.text
    assert 'href="https://bq.example/q?test=pt-cifar&amp;run=run-1&amp;m=Accuracy%2Ftest_final"' in email.html
    assert email.text.count("logs: https://logs.example/cifar/1") == 1


def test_alert_without_logs_link_or_bounds():
    email = digest(alert(kind="run_missing", logs_link=None, status="missing"))
    assert "logs" not in email.text and "bounds" not in email.text
    assert "run never finished" in email.subject and "status missing" in email.text


def test_window_alert_shows_window_and_compared_runs():
    window = {"kind": "count", "index": 3, "start_step": 400, "end_step": 780, "partial": True}
    email = digest(alert(kind="window_out_of_bounds", metric="Accuracy/test_mean", window=window,
                         compared_runs=[f"r{i}" for i in range(7)], run_data=None))
    assert "count window 3 (steps 400-780, partial)" in email.text
    assert "compared with runs r0, r1, r2, r3, r4 and 2 more" in email.html
    assert "Accuracy/test_mean window out of bounds" in email.subject


def test_a_moved_baseline_says_so_and_sorts_after_the_regressions():
    email = digest(alert(kind="baseline_shifted", metric="loss_final"), alert(kind="metric_out_of_bounds"))
    assert email.subject.endswith("Accuracy/test_final out of bounds; loss_final moved to a new level (baseline follows)")
    assert email.text.index("1. metric_out_of_bounds") < email.text.index("2. baseline_shifted: loss_final")


def test_a_rejected_config_names_the_file_and_key_and_says_how_to_fix_it():
    check = ConfigCheck("gs://b/tg/configs/pt-cifar.json", "d1", START, "regression_test_config.alert_for_failed_job",
                        "unknown key", "pt-cifar", True)
    email = digest(config_rejected_alert(check))
    assert email.subject == "[trainguard] pt-cifar run config: config pt-cifar.json rejected"
    for body in (shown(email.html), email.text):
        assert ("gs://b/tg/configs/pt-cifar.json: regression_test_config.alert_for_failed_job: unknown key "
                "(what was read before stays in use)") in body
        assert CONFIG_FIX in body and "config_rejected" in body


def test_hostile_names_are_escaped_everywhere():
    hostile = alert(test=HOSTILE_TEST, run=HOSTILE_RUN, metric=HOSTILE_METRIC,
                    logs_link="javascript:alert(document.cookie)")
    email = digest(hostile, links={"dash": "https://dash.example/?t={test}"})
    assert_inert(email.html, HOSTILE_METRIC, HOSTILE_TEST, HOSTILE_RUN,
                 "javascript:alert(document.cookie)")
    assert "\r" not in email.subject and "\n" not in email.subject
    assert "Bcc: victim@example.com" in email.subject  # kept, but on the one subject line
    assert 'href="https://dash.example/?t=%22%3E%3Cimg%20src%3Dx' in email.html
    assert "<script>" not in email.html and "<img" not in email.html


@settings(max_examples=60, deadline=None)
@given(test=st.text(min_size=1, max_size=40), metric=st.text(min_size=1, max_size=40),
       link=st.text(max_size=40))
def test_any_text_stays_text(test, metric, link):
    email = digest(alert(test=test, metric=metric, logs_link="https://l.example/" + link))
    assert_inert(email.html)
    parsed = "".join(elements(email.html).text)
    assert metric in parsed
    assert one_line(email.subject, 1000) == email.subject


def test_summary_groups_alerts_by_run():
    folded = [parse_alert(payload(alert(test=t, run=r, metric=m)))
              for t, r, m in [("b", "2", "x"), ("a", "1", "y"), ("b", "2", "z"), ("a", "9", "x")]]
    email = render_summary(folded, config(daily_budget=10), ["oncall@example.com"])
    assert email.kind == "summary" and email.recipients == ("oncall@example.com",)
    assert email.subject == "[trainguard] daily e-mail budget reached: 4 alerts from 3 runs of 2 tests"
    sections = [line for line in email.text.splitlines() if line.startswith("Test ")]
    assert sections == ["Test a, run 1", "Test a, run 9", "Test b, run 2"]
    assert sorted(email.alert_ids) == sorted(a.alert_id for a in folded)
    assert "budget (10)" in email.html


def test_recipients_and_sender_follow_per_test_overrides():
    overrides = {"per_test": {"pt-*": {"recipients": ["pt@example.com"]},
                              "pt-cifar": {"sender": "Cifar <cifar@example.com>"}}}
    cifar, other = digest(alert(test="pt-cifar"), **overrides), digest(alert(test="pt-llama"), **overrides)
    assert (cifar.sender, cifar.recipients) == ("Cifar <cifar@example.com>", ("oncall@example.com",))
    assert (other.sender, other.recipients) == ("trainguard <alerts@example.com>", ("pt@example.com",))


def finished_alert(test="pt-cifar", run="run-1", metric="Accuracy/test_final",
                   pattern="https://reports.example/{test}/{run}.html", **overrides):
    """A metric alert as the pipeline writes it: checked by the history, finished with the test's config."""
    from core.alert_details import finish_alert
    from core.config import parse_test_config
    from core.history import MetricHistory, check_metric
    from core.records import MetricObservation

    regression = {"metric_success_conditions": {metric: {"comparison": "greater",
                                                         "success_threshold": {"mads_from_median": 5}}},
                  "alert_after_second_test_failure": False}
    if pattern is not None:
        regression["report_url_pattern"] = pattern
    test_config = parse_test_config({"metric_collection_config": {"metric_units": {metric: "%"}},
                                     "regression_test_config": regression}, "t.json")
    history = MetricHistory()
    raised = None
    for i, value in enumerate([74.6, 74.6, 74.8, 74.4, 74.6, 70.1]):
        observation = MetricObservation(test, f"{run}-{i}" if i < 5 else run, metric, value, 100, "success",
                                        float(i), float(i), {"logs_link": "https://logs.example/cifar/1"})
        _, raised = check_metric(history, observation, test_config.regression_test)
    assert raised is not None
    return finish_alert(raised, test_config)


def test_each_alert_shows_unit_how_the_bounds_were_computed_previous_change_report_and_next_steps():
    raised = finished_alert()
    email = digest(raised)
    steps = raised.details["next_steps"]
    for body in (shown(email.html), email.text):
        assert "70.1 %" in body and "+inf) % [greater]" in body
        assert "median 74.6 % \u2212 5 \u00d7 robust scale" in body and "from 5 earlier runs" in body
        assert "previous 74.6 % (run run-1-4)" in body and "change \u22126.03%" in body
        assert all(step in body for step in steps)
    assert 'href="https://reports.example/pt-cifar/run-1.html">report</a>' in email.html
    assert "report: https://reports.example/pt-cifar/run-1.html" in email.text
    codes = re.findall(r'<code style="display:block;[^"]*">(.*?)</code>', email.html)
    assert ["".join(elements(code).text) for code in codes] == steps  # a block a command, whole, to copy
    assert "Next steps" in email.html
    assert_inert(email.html, *steps)


def test_hostile_names_in_next_steps_and_a_non_web_report_link_stay_text():
    raised = finished_alert(test=HOSTILE_TEST.replace("\r\n", " "), metric=HOSTILE_METRIC, pattern=None)
    hostile_link = {**raised.details, "report_url": "javascript:alert(1)"}
    email = digest(dataclasses.replace(raised, details=hostile_link))
    assert_inert(email.html, *raised.details["next_steps"], "javascript:alert(1)")
    assert "<script>" not in email.html and 'href="javascript' not in email.html


def test_the_notifiers_report_pattern_links_runs_whose_alerts_carry_no_report_url():
    pattern = {"report_url_pattern": "https://reports.example/{test}/{run}.html"}
    email = digest(alert(test="a/b", run="r 1"), **pattern)
    assert 'href="https://reports.example/a%2Fb/r%201.html">report</a>' in email.html
    own = digest(finished_alert(pattern="https://own.example/{test}/{run}"), **pattern)
    assert "https://own.example/pt-cifar/run-1" in own.html and "reports.example" not in own.html  # the alert's wins


def test_no_text_is_said_twice():
    """The message of a value alert is its value, bounds, change and previous value: each said once."""
    email = digest(finished_alert())
    text = "".join(elements(email.html).text)
    for said in ("previous 74.6 % (run run-1-4)", "median 74.6 % \u2212 5 \u00d7 robust scale", "change \u22126.03%",
                 "pt-cifar \u00b7 run run-1"):
        assert text.count(said) == 1, said
    assert email.text.count("previous 74.6 % (run run-1-4)") == 1
    failed = digest(dataclasses.replace(alert(kind="job_failed", status="timeout"),
                                        message="run run-1 finished with status timeout"))
    assert "".join(elements(failed.html).text).count("status timeout") == 1


def test_a_change_in_scales_says_what_a_scale_is():
    email = digest(finished_alert())
    assert "scales)" in email.html and "MAD \u00d7 1.4826" in email.html and "MAD \u00d7 1.4826" in email.text
    assert "1.4826" not in digest(alert(kind="run_missing", status="missing")).html


def test_a_lifecycle_alert_says_how_long_the_run_ran_when_it_was_last_heard_from_and_which_ranks_hung():
    hung = alert(kind="run_missing", status="missing", started_at=START - 7200, last_heard_at=START - 7200 + 4980,
                 ranks_missing=[2, 3], best_value={"metric": "Accuracy/test", "value": 71.25, "step": 900})
    email = digest(hung)
    said = ("ran 1 h 23 min from 2026-11-21 08:00 UTC; last heard from 2026-11-21 09:23 UTC; best Accuracy/test "
            "71.25 at step 900; ranks 2, 3 never finished")
    assert said in "".join(elements(email.html).text) and said in email.text
    hostile = digest(alert(kind="job_failed", status="failure", started_at="<b>", last_heard_at=True,
                           ranks_missing=["<i>", 1]))
    assert "rank 1 never finished" in hostile.text and "<b>" not in hostile.html  # anything else in details: ignored
