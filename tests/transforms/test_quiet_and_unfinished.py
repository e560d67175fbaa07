"""Streaming semantics the README documents, on TestStream: a run that never finishes, and a test quiet for weeks.

The watermark follows the data here, as Pub/Sub's follows the wall clock for live runs. Each runs on the local
streaming runner the tests use and on ``DirectRunner`` with ``--streaming``, as a user's team would name it.
"""

import json

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner, DirectRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from core.runs import RunLifecycle
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import assert_rows, configs, detect, drained, finished, raw, simple_run, started

DAY = 86400.0
LIFECYCLE = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0)
CHECKED = configs(t={"regression_test_config": {
    "alert_after_second_test_failure": False,
    "metric_success_conditions": {"acc_final": {"comparison": "greater", "success_threshold": {"stddevs_from_mean": 3},
                                                "wait_for_n_points_of_history": 3}}}})


RUNNERS = pytest.mark.parametrize("runner", [BundleBasedDirectRunner, DirectRunner])


def run_stream(stream, runner, check):
    """``check({table: rows})`` on the job_history, alerts and dead_letter rows, in ``assert_that``."""
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    with beam.Pipeline(runner=runner(), options=options) as p:
        outputs = detect(p | stream, GraphSettings(CHECKED, LIFECYCLE, streaming=True))
        assert_rows({name: outputs[name] for name in ("job_history", "alerts", "dead_letter")}, check)


@RUNNERS
def test_a_run_that_never_finishes_ends_missing_at_its_timeout_and_a_later_message_of_it_is_a_dead_letter(runner):
    stream = (TestStream().advance_watermark_to(Timestamp.of(T0))
              .add_elements([raw("t", "r", "m0", points=[("acc", 1.0, 1, T0 + 10)], events=[started(T0)]),
                             raw("t", "r", "m1", points=[("acc", 2.0, 2, T0 + 20)])])
              .advance_watermark_to(Timestamp.of(T0 + 3000))  # silent, not yet for the timeout: still open
              .advance_watermark_to(Timestamp.of(T0 + 20 + 3600 + 1))  # other runs' messages move the watermark
              .add_elements([raw("t", "r", "m2", points=[("acc", 3.0, 3, T0 + 30)], events=[finished(T0 + 40)])]))
    stream = drained(stream, T0 + 2 * DAY)

    def check(outputs):
        [job] = outputs["job_history"]
        assert job["job_status"] == "missing" and job["processed_at"].startswith("2025-11-20T01:00:20")
        assert [alert["kind"] for alert in outputs["alerts"]] == ["run_missing"]
        [late] = outputs["dead_letter"]
        assert late["reason"] == "late: run already finalized" and json.loads(late["payload"])["id"] == "m2"
    run_stream(stream, runner, check)


@RUNNERS
def test_a_test_quiet_for_weeks_checks_its_next_run_against_the_same_history(runner):
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for i, accuracy in enumerate([90.0, 90.5, 89.8, 90.2, 90.1]):
        stream = stream.add_elements(simple_run("t", f"r{i}", T0 + DAY * i, accuracy)).advance_watermark_to(
            Timestamp.of(T0 + DAY * i + 3600))
    stream = stream.advance_watermark_to(Timestamp.of(T0 + 40 * DAY))  # five weeks without a message
    stream = drained(stream.add_elements(simple_run("t", "after", T0 + 40 * DAY, 60.0)), T0 + 42 * DAY)

    def check(outputs):
        assert len(outputs["job_history"]) == 6 and outputs["dead_letter"] == []
        [alert] = outputs["alerts"]
        assert alert["kind"] == "metric_out_of_bounds" and alert["run_id"] == "after"
        assert json.loads(alert["details"])["history_size"] == 5
    run_stream(stream, runner, check)
