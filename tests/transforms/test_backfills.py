"""Back-fills in the streaming job: old logs sent now end on their own run_finished, marked out of order.

Dataflow's Pub/Sub watermark trails the wall clock by seconds, so the messages of a back-filled run (event times
a month old) arrive far behind it. Here a TestStream holds the watermark just behind the real wall clock and
sends such a run in three bundles; processing time then passes the back-fill's quiet period.
"""

import json
import time

from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from core.runs import RunLifecycle
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import configs, detect, finished, gather, raw, started, streaming_pipeline

CONFIGS = configs(t={"regression_test_config": {"alert_after_second_test_failure": False}})
BACKFILLS = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0, backfill_lag_seconds=900.0,
                         backfill_quiet_seconds=600.0)


def backfilled_run(run, start, status="success"):
    """A run's logs, a month old by now, as three messages a shipper sends one after the other."""
    return [raw("t", run, f"{run}-0", points=[("acc", 70.0, 1, start + 10)], events=[started(start)]),
            raw("t", run, f"{run}-1", points=[("acc", 75.0, 2, start + 50), ("loss", 0.5, 2, start + 50)]),
            raw("t", run, f"{run}-2", points=[("acc", 80.0, 3, start + 90)], events=[finished(start + 100, status)])]


def stream_behind_the_watermark(messages):
    """The messages one bundle each, the watermark 10 s behind the wall clock, then processing time past the
    back-fill's quiet period (the direct runner's test clock starts at 0)."""
    now = int(time.time())  # TestStream's times are whole milliseconds
    stream = TestStream().advance_watermark_to(Timestamp.of(now - 10))
    for message in messages:
        stream = stream.add_elements([message]).advance_processing_time(60)
    return stream.advance_processing_time(now + 3600).advance_watermark_to_infinity()


def run_streaming(messages, lifecycle):
    with streaming_pipeline() as p:
        outputs = detect(p | stream_behind_the_watermark(messages), GraphSettings(CONFIGS, lifecycle, streaming=True))
        gathered = {name: gather(outputs[name], name)
                    for name in ("job_history", "metric_history", "alerts", "dead_letter")}
    return gathered


def test_a_backfilled_run_ends_on_its_own_run_finished_with_every_message_and_is_marked_out_of_order():
    outputs = run_streaming(backfilled_run("old", T0) + backfilled_run("broken", T0 + 86400, "failure"), BACKFILLS)
    assert outputs["dead_letter"] == []
    jobs = {row["run_id"]: row for row in outputs["job_history"]}
    assert {run: (row["job_status"], row["out_of_order"]) for run, row in jobs.items()} == {
        "old": ("success", True), "broken": ("failure", True)}
    assert jobs["old"]["processed_at"].startswith("2025-11-20T00:02:40")  # run_finished + grace, in event time
    metrics = {(row["run_id"], row["metric_name"]): row for row in outputs["metric_history"]}
    assert metrics[("old", "acc_final")]["metric_value"] == 80.0  # the last bundle's point counted
    assert all(row["out_of_order"] for row in metrics.values())
    [alert] = outputs["alerts"]
    assert alert["kind"] == "job_failed" and json.loads(alert["details"])["out_of_order"] is True


def test_a_backfilled_run_gets_no_live_windows_and_no_stall_alerts():
    """Live windows follow a live run as the watermark passes it; a back-fill is behind it already: each bundle
    would close the run's windows as partial and look like a stall (three false run_stalled alerts here)."""
    windowed = configs(t={"window_config": {"stall_seconds": 30, "tags": {"acc": {
        "count": 2, "aggregations": ["mean"]}}}})
    with streaming_pipeline() as p:
        outputs = detect(p | stream_behind_the_watermark(backfilled_run("old", T0)),
                         GraphSettings(windowed, BACKFILLS, streaming=True))
        windows, alerts = gather(outputs["metric_windows"], "windows"), gather(outputs["alerts"], "alerts")
        jobs, dead = gather(outputs["job_history"], "jobs"), gather(outputs["dead_letter"], "dead")
    assert windows == [] and alerts == [] and dead == []
    assert [(job["job_status"], job["out_of_order"]) for job in jobs] == [("success", True)]


def test_without_backfill_handling_the_watermark_ends_the_run_after_its_first_bundle():
    """What the handling is for: the run's end timer is behind the watermark and fires at once."""
    outputs = run_streaming(backfilled_run("old", T0), RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0))
    jobs = outputs["job_history"]
    # missing after the first bundle; the tombstone's expiry is behind the watermark too, so each later bundle
    # starts the run again: three rows of one run, its points split among them
    assert sorted(job["job_status"] for job in jobs) == ["missing", "missing", "success"]
    assert not any(job["out_of_order"] for job in jobs)


def test_a_live_run_is_not_a_backfill():
    now = time.time()
    lifecycle = RunLifecycle(backfill_lag_seconds=900.0)
    assert not lifecycle.backfilled(now - 60, now) and lifecycle.backfilled(now - 901, now)
    assert not RunLifecycle().backfilled(0.0, now)  # off unless the streaming job's option sets it
