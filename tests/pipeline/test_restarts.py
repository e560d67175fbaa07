"""A streaming job drained and replaced by a new one: open runs are not declared missing, and nothing is lost.

The local streaming runner drains as Dataflow does: the watermark's jump (``drained``: a day ahead, then to
the end of time) fires every timer at its own event time. The runs here happen now, by the wall clock, as a live
job's do.
"""

import json
import time

from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from core import encoding
from core.history import HistorySeed, JobHistory
from core.runs import RUN_INTERRUPTED, RunLifecycle, open_run_text
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY
from pipeline.graph import GraphSettings
from tests.transforms.support import (
    assert_rows,
    collect_outputs,
    configs,
    detect,
    drained,
    finished,
    raw,
    started,
    streaming_pipeline,
)
from transforms.runs import stored_run_reason

ALERTING = configs(cifar={"regression_test_config": {"alert_after_second_test_failure": False}})
SETTINGS = GraphSettings(ALERTING, RunLifecycle(grace_seconds=60, timeout_seconds=3600), streaming=True)


def run_job(messages, seed, watermark, check):
    """One streaming job on ``messages``, then drained: ``check({table: rows})`` in ``assert_that``; returns its
    job_history rows, which the next job's seed is made of (as ``sinks.seed`` reads them back)."""
    stream = drained(TestStream().advance_watermark_to(Timestamp.of(watermark)).add_elements(messages),
                     watermark + 86400)
    with streaming_pipeline() as p:
        outputs = detect(p | stream, SETTINGS, seed)
        assert_rows({name: outputs[name] for name in (JOB_HISTORY.name, METRIC_HISTORY.name, ALERTS.name,
                                                      DEAD_LETTER.name)}, check)
        stored = collect_outputs(outputs[JOB_HISTORY.name], "stored")
    return stored


def test_a_drained_jobs_open_run_is_resumed_by_the_next_job_and_its_stored_runs_messages_are_dead_letters():
    now = float(int(time.time()))
    open_before = [raw("cifar", "open", "o1", points=[("acc", 50.0, 1, now - 100)], events=[started(now - 120)]),
                   raw("cifar", "open", "o2", points=[("acc", 60.0, 2, now - 50)])]
    done = [raw("cifar", "done", "d1", points=[("acc", 70.0, 1, now - 290)], events=[started(now - 300)]),
            raw("cifar", "done", "d2", events=[finished(now - 280)])]
    of_stored_run = raw("cifar", "old", "x1", points=[("acc", 1.0, 9, now - 60)])

    def check_first(first):
        jobs = {row["run_id"]: row for row in first[JOB_HISTORY.name]}
        assert {run: row["job_status"] for run, row in jobs.items()} == {"done": "success", "open": "interrupted"}
        assert first[ALERTS.name] == []  # no run_missing for the run the drain cut short
        assert {row["run_id"] for row in first[METRIC_HISTORY.name]} == {"done"}
        [dead] = first[DEAD_LETTER.name]
        assert dead["reason"] == stored_run_reason("cifar", "old") and json.loads(dead["payload"])["id"] == "x1"
    stored = run_job(open_before + done + [of_stored_run], HistorySeed(
        stored_runs=frozenset({("cifar", "old")}), jobs={"cifar": JobHistory("success")}), now - 400, check_first)

    # The next job's seed, as sinks.seed reads it back: the run that ended is stored, the open one resumes.
    jobs = {row["run_id"]: row for row in stored}
    events = json.loads(jobs["open"]["events"])
    assert RUN_INTERRUPTED in [e["type"] for e in events]
    seed = HistorySeed(stored_runs=frozenset({("cifar", "done"), ("cifar", "old")}),
                       jobs={"cifar": JobHistory("success")},
                       open_runs={("cifar", "open"): encoding.from_text(open_run_text(events))})
    open_after = [raw("cifar", "open", "o3", points=[("acc", 80.0, 3, now + 10)]),
                  raw("cifar", "open", "o4", events=[finished(now + 20, "failure")]),
                  raw("cifar", "done", "d3", points=[("acc", 71.0, 2, now + 5)])]  # after its end: dead letter
    start_time = jobs["open"]["start_time"]

    def check_second(second):
        [row] = second[JOB_HISTORY.name]
        assert (row["run_id"], row["job_status"], row["start_time"]) == ("open", "failure", start_time)
        assert RUN_INTERRUPTED not in [e["type"] for e in json.loads(row["events"])]
        assert [(a["kind"], a["run_id"]) for a in second[ALERTS.name]] == [("job_failed", "open")]
        # the whole run's values: the first point came before the drain
        metrics = {m["metric_name"]: m["metric_value"] for m in second[METRIC_HISTORY.name]}
        assert metrics["acc_final"] == 80.0 and metrics["total_wall_time"] == 140.0
        assert [(d["source"], d["reason"]) for d in second[DEAD_LETTER.name]] == [
            ("run:cifar/done", stored_run_reason("cifar", "done"))]
    run_job(open_after, seed, now, check_second)
