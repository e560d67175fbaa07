"""Back-fills in the streaming job: old logs sent now end on their own run_finished, marked out of order.

Dataflow's Pub/Sub watermark trails the wall clock by seconds, so the messages of a back-filled run (event times
a month old) arrive far behind it. Here a TestStream holds the watermark just behind the real wall clock and
sends such a run in three bundles; the watermark then passes the back-fill's quiet period. The local runner
holds no watermark for user timers; the tests at the end drive run assembly under Dataflow's rule, which does.
"""

import json
import time

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import TimerSpec, on_timer
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from core import encoding
from core.parse import summarize
from core.runs import RunLifecycle, RunResult, open_run_text
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.held_watermarks import HeldStage
from tests.transforms.support import (
    assert_rows,
    configs,
    detect,
    finished,
    raw,
    simple_run,
    started,
    streaming_pipeline,
)
from trainguard import wire
from transforms.backfills import AssembleRunOrBackfillFn
from transforms.runs import INTERRUPTED

CONFIGS = configs(t={"regression_test_config": {"alert_after_second_test_failure": False}})
BACKFILLS = RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0, backfill_lag_seconds=900.0,
                         backfill_quiet_seconds=600.0)


def backfilled_run(run, start, status="success"):
    """A run's logs, a month old by now, as three messages a shipper sends one after the other."""
    return [raw("t", run, f"{run}-0", points=[("acc", 70.0, 1, start + 10)], events=[started(start)]),
            raw("t", run, f"{run}-1", points=[("acc", 75.0, 2, start + 50), ("loss", 0.5, 2, start + 50)]),
            raw("t", run, f"{run}-2", points=[("acc", 80.0, 3, start + 90)], events=[finished(start + 100, status)])]


def stream_behind_the_watermark(messages):
    """The messages one bundle each, the watermark 10 s behind the wall clock, then the watermark, following
    the wall clock, past the back-fill's quiet period (its timer's time: the wall clock plus the period)."""
    now = int(time.time())  # TestStream's times are whole milliseconds
    stream = TestStream().advance_watermark_to(Timestamp.of(now - 10))
    for message in messages:
        stream = stream.add_elements([message])
    return stream.advance_watermark_to(Timestamp.of(now + 3600)).advance_watermark_to_infinity()


def run_streaming(messages, lifecycle, check):
    """``check({table: rows})`` on the job_history, metric_history, alerts and dead_letter rows, in
    ``assert_that``."""
    with streaming_pipeline() as p:
        outputs = detect(p | stream_behind_the_watermark(messages), GraphSettings(CONFIGS, lifecycle, streaming=True))
        assert_rows({name: outputs[name] for name in ("job_history", "metric_history", "alerts", "dead_letter")},
                    check)


def test_a_backfilled_run_ends_on_its_own_run_finished_with_every_message_and_is_marked_out_of_order():
    def check(outputs):
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
    run_streaming(backfilled_run("old", T0) + backfilled_run("broken", T0 + 86400, "failure"), BACKFILLS, check)


def test_a_backfilled_run_gets_no_live_windows_and_no_stall_alerts():
    """Live windows follow a live run as the watermark passes it; a back-fill is behind it already: each bundle
    would close the run's windows as partial and look like a stall (three false run_stalled alerts here)."""
    windowed = configs(t={"window_config": {"stall_seconds": 30, "tags": {"acc": {
        "count": 2, "aggregations": ["mean"]}}}})
    with streaming_pipeline() as p:
        outputs = detect(p | stream_behind_the_watermark(backfilled_run("old", T0)),
                         GraphSettings(windowed, BACKFILLS, streaming=True))
        assert_rows({name: outputs[name] for name in ("metric_windows", "alerts", "job_history", "dead_letter")},
                    check_no_windows_nor_alerts)


def check_no_windows_nor_alerts(outputs):
    assert outputs["metric_windows"] == [] and outputs["alerts"] == [] and outputs["dead_letter"] == []
    assert [(job["job_status"], job["out_of_order"]) for job in outputs["job_history"]] == [("success", True)]


def test_without_backfill_handling_the_watermark_ends_the_run_after_its_first_bundle():
    """What the handling is for: the run's end timer is behind the watermark and fires at once."""
    def check(outputs):
        jobs = outputs["job_history"]
        # missing after the first bundle; the tombstone's expiry is behind the watermark too, so each later bundle
        # starts the run again: three rows of one run, its points split among them
        assert sorted(job["job_status"] for job in jobs) == ["missing", "missing", "success"]
        assert not any(job["out_of_order"] for job in jobs)
    run_streaming(backfilled_run("old", T0), RunLifecycle(grace_seconds=60.0, timeout_seconds=3600.0), check)


def test_a_live_run_is_not_a_backfill():
    now = time.time()
    lifecycle = RunLifecycle(backfill_lag_seconds=900.0)
    assert not lifecycle.backfilled(now - 60, now) and lifecycle.backfilled(now - 901, now)
    assert not RunLifecycle().backfilled(0.0, now)  # off unless the streaming job's option sets it


# -- under Dataflow's watermark holds (tests/transforms/held_watermarks.py) ---------------------------------

DAY = 86400.0


def summaries(messages):
    """((test, run), MessageSummary, event time) of raw messages, as parsing makes them."""
    result = []
    for message in messages:
        parsed, _ = wire.parse_message(message.payload)
        result.append(((parsed.test, parsed.run), summarize(parsed, message.payload, CONFIGS.for_test(parsed.test)),
                       parsed.event_time))
    return result


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def assembly(clock):
    return HeldStage(AssembleRunOrBackfillFn(CONFIGS, BACKFILLS, interruptions=True, clock=clock))


def results(outputs):
    return [(o.test, o.run, o.status, o.out_of_order) for o in outputs if isinstance(o, RunResult)]


def test_on_dataflow_a_backfill_and_its_tombstone_hold_back_no_other_run():
    """Dataflow holds a stage's output watermark at each pending timer's hold, and every check (all tests'
    alerts) waits for run assembly's. A month-old back-fill waiting out its quiet period, then its 7-day
    tombstone, hold nothing back: a live run of another test that ends meanwhile reaches the checks at once."""
    clock = Clock(T0 + 30 * DAY)
    stage = assembly(clock)
    for key, summary, at in summaries(backfilled_run("old", T0)):
        stage.process(key, summary, at)
    for key, summary, at in summaries(simple_run("t", "live", clock.now - 200, 72.0)):
        stage.process(key, summary, at)
    assert results(stage.advance(clock.now - 10, clock.now)) == [("t", "live", "success", False)]
    assert stage.output_watermark(clock.now - 10) == Timestamp.of(clock.now - 10)  # not held at T0
    clock.now += BACKFILLS.backfill_quiet_seconds + 60
    assert results(stage.advance(clock.now - 10, clock.now)) == [("t", "old", "success", True)]
    # the tombstones, for 7 days: the live run's (in event time) and the back-fill's (from the wall clock)
    assert [(key, name) for key, name, _ in stage.pending()] == [(("t", "live"), "ts-expire"),
                                                                 (("t", "old"), "ts-expire_backfill")]
    assert stage.output_watermark(clock.now - 10) == Timestamp.of(clock.now - 10)
    late = summaries(backfilled_run("old", T0))[-1]
    assert stage.process(*late)[0].tag == "dead_letter"  # a late message of the back-fill: the tombstone works
    clock.now += BACKFILLS.retention_seconds + 60
    stage.advance(clock.now - 10, clock.now)
    assert stage.pending() == []


def test_the_rule_holds_the_watermark_at_a_processing_time_timer_set_by_an_old_element():
    """The harness is not blind: what a processing-time timer of the back-fill did (the design before)."""
    class OldDesign(beam.DoFn):
        WAIT = TimerSpec("wait", TimeDomain.REAL_TIME)

        def process(self, element, wait=beam.DoFn.TimerParam(WAIT)):
            wait.set(Timestamp.of(T0 + 30 * DAY + 600))

        @on_timer(WAIT)
        def waited(self):
            return []
    stage = HeldStage(OldDesign())
    stage.process("k", None, T0)
    assert stage.output_watermark(T0 + 30 * DAY) == Timestamp.of(T0)


def test_a_drain_interrupts_a_backfill_still_quiet_and_the_next_job_resumes_it_as_a_backfill():
    """A drain fires every timer at once. A back-fill without its run_finished yet is interrupted (its open
    state stored, as a live run's), not ended as missing; one with its run_finished ends as itself. The next job
    resumes the interrupted one as a back-fill: it ends its quiet period after the job starts, with the
    messages the shipper sends on."""
    clock = Clock(T0 + 30 * DAY)
    stage = assembly(clock)
    first, second, last = summaries(backfilled_run("cut", T0))
    for key, summary, at in summaries(backfilled_run("whole", T0 + DAY)) + [first, second]:
        stage.process(key, summary, at)
    drained = stage.advance(float(MAX_TIMESTAMP), clock.now + 60)
    assert results(drained) == [("t", "whole", "success", True)]
    [interrupted] = [o.value for o in drained if getattr(o, "tag", None) == INTERRUPTED]
    assert interrupted.run == "cut" and interrupted.status == "interrupted"
    state = encoding.from_text(open_run_text([e._asdict() for e in interrupted.events]))
    clock.now += 3600  # the next job
    resumed = assembly(clock)
    resumed.process(("t", "cut"), state, float(MIN_TIMESTAMP))
    assert results(resumed.advance(clock.now - 10, clock.now)) == []  # not ended at once, behind the watermark
    resumed.process(*last)
    clock.now += BACKFILLS.backfill_quiet_seconds + 60
    [result] = [o for o in resumed.advance(clock.now - 10, clock.now) if isinstance(o, RunResult)]
    assert (result.status, result.out_of_order) == ("success", True)
    assert {m.name: m.value for m in result.metrics}["acc_final"] == 80.0  # both jobs' messages
