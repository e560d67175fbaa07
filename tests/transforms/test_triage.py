"""Triage through the whole graph: the same rows in a replay (any order, duplicates) and in a stream."""

import json
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import ALERT_UPDATES, ALERTS, DEAD_LETTER, METRIC_HISTORY, TRIAGE
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, detect, finished, raw, started, streaming_pipeline
from trainguard import wire

DAY = 86400.0
CONFIGS = configs(cifar={"regression_test_config": {
    "alert_after_second_test_failure": False, "rebaseline_after": 0,
    "metric_success_conditions": {"loss_final": {
        "comparison": "less", "success_threshold": {"mads_from_median": 5}, "wait_for_n_points_of_history": 5}}}})
LIFECYCLE = RunLifecycle(grace_seconds=60, timeout_seconds=3600)
LOSS = [1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.00, 1.3, 1.5, 1.5, 3.0, 1.51]


def run_messages(day, loss):
    start = T0 + day * DAY
    run = f"r{day:02d}"
    return [raw("cifar", run, f"{run}-p", points=[("loss", loss, 100, start + 10)]),
            raw("cifar", run, f"{run}-e", events=[started(start), finished(start + 20)])]


def triage(day, action, **fields):
    return RawMessage(wire.encode_triage("cifar", wire.Triage(action, T0 + day * DAY, **fields),
                                         f"triage-{action}-{day}"), "test")


def alert_id(run):
    from core.records import Alert
    return Alert(kind="metric_out_of_bounds", test="cifar", run=run, message="", created_at=0,
                 metric="loss_final").alert_id


ACTIONS = [
    triage(8.5, "dismiss", metric="loss_final", run="r08", alert_id=alert_id("r08"), alert_kind="metric_out_of_bounds",
           note="noisy host"),
    triage(9.5, "accept", metric="loss_final", run="r09", note="new tokenizer"),
    triage(10.5, "mute", until=T0 + 11.5 * DAY, note="cluster maintenance"),
]


def all_messages():
    messages = [m for day, loss in enumerate(LOSS) for m in run_messages(day, loss)]
    return messages + ACTIONS + ACTIONS[:1]  # a redelivered control message


def state_of(row):
    return (json.loads(row["details"]).get("triage") or {}).get("state", "open")


EXPECTED_ALERTS = [("r08", "open"), ("r09", "open"), ("r11", "muted")]
EXPECTED_UPDATES = [("r08", "dismissed"), ("r09", "accepted")]
# r10 is judged against the accepted level; r12 too (r11 was out of bounds and stays out of the history)
EXPECTED_WITHIN = [("r08", False), ("r09", False), ("r10", True), ("r11", False), ("r12", True)]


def check(outputs):
    assert_that(outputs[ALERTS.name] | beam.Map(lambda r: (r["run_id"], state_of(r))),
                equal_to(EXPECTED_ALERTS), label="alerts")
    assert_that(outputs[ALERT_UPDATES] | beam.Map(lambda r: (r["run_id"], state_of(r))),
                equal_to(EXPECTED_UPDATES), label="updates")
    assert_that(outputs[TRIAGE.name] | beam.Map(lambda r: (r["action"], r["run_id"], r["note"])),
                equal_to([("dismiss", "r08", "noisy host"), ("accept", "r09", "new tokenizer"),
                          ("mute", None, "cluster maintenance")]), label="triage rows")
    assert_that(outputs[METRIC_HISTORY.name] | beam.Filter(lambda r: r["run_id"] >= "r08" and r["metric_name"] == "loss_final")
                | beam.Map(lambda r: (r["run_id"], r["within_bounds"])), equal_to(EXPECTED_WITHIN), label="within")
    assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")


@pytest.mark.parametrize("seed", [0, 1])
def test_triage_actions_apply_in_event_time_order_in_a_replay_whatever_the_input_order(seed):
    messages = all_messages()
    random.Random(seed).shuffle(messages)
    with batch_pipeline() as p:
        check(detect(p | beam.Create(messages), GraphSettings(CONFIGS, LIFECYCLE)))


def in_half_days(messages):
    """The messages as a stream, half a day at a time: the actions come after the runs and alerts they name, as
    they do when a user acts on an alert (the local runner holds no watermark for the timers that emit runs)."""
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    by_half_day = {}
    for message in messages:
        by_half_day.setdefault(int(wire.parse_message(message.payload)[0].event_time // (DAY / 2)), []).append(message)
    for half_day in sorted(by_half_day):
        stream = (stream.add_elements(by_half_day[half_day])
                  .advance_watermark_to(Timestamp.of((half_day + 1) * DAY / 2)))
    return stream.advance_watermark_to_infinity()


def test_triage_actions_apply_the_same_way_in_a_stream():
    with streaming_pipeline() as p:
        check(detect(p | in_half_days(all_messages()), GraphSettings(CONFIGS, LIFECYCLE, streaming=True)))


UNKNOWN = [
    triage(9.6, "accept", metric="loss_fnal", run="r09"),  # a misspelled metric
    triage(9.7, "accept", metric="loss_final", run="r99"),  # a run the job has not seen, not said to be to come
    triage(9.8, "dismiss", metric="loss_final", run="r08", alert_id="0" * 32, alert_kind="metric_out_of_bounds"),
]
TO_COME = triage(12.5, "accept", metric="loss_final", run="r13", future=True)  # waits for r13


def test_actions_naming_what_the_job_does_not_hold_are_dead_letters_with_a_reason_and_change_nothing():
    """A triage message that bypassed the CLI's checks (another publisher, a stale name): each stage that would
    act on it refuses it as a dead letter saying why; alerts, their states and bounds are as without it. (A
    replay; the streaming job steps the same machines, as the test above shows for the valid actions.)"""
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(all_messages() + UNKNOWN + [TO_COME]), GraphSettings(CONFIGS, LIFECYCLE))
        assert_that(outputs[ALERTS.name] | beam.Map(lambda r: (r["run_id"], state_of(r))),
                    equal_to(EXPECTED_ALERTS), label="alerts")
        assert_that(outputs[ALERT_UPDATES] | beam.Map(lambda r: (r["run_id"], state_of(r))),
                    equal_to(EXPECTED_UPDATES), label="updates")
        assert_that(outputs[METRIC_HISTORY.name]
                    | beam.Filter(lambda r: r["run_id"] >= "r08" and r["metric_name"] == "loss_final")
                    | beam.Map(lambda r: (r["run_id"], r["within_bounds"])), equal_to(EXPECTED_WITHIN), label="within")
        assert_that(outputs[DEAD_LETTER.name]
                    | beam.Map(lambda r: (r["source"], r["reason"], json.loads(r["payload"])["id"])),
                    equal_to([
                        ("stage:metric", "metric check refused: accept of 'loss_fnal' of test 'cifar': no successful "
                         "run of the test has reported it (a misspelled test or metric? a run still going or to come "
                         "needs the accept's future flag (trainguard-triage accept --allow_future))",
                         "triage-accept-9.6"),
                        ("stage:metric", "metric check refused: accept of 'loss_final' of test 'cifar' from run "
                         "'r99': not among the 1 runs of its history (those since its last re-baseline; a run still "
                         "going or to come needs the accept's future flag (trainguard-triage accept --allow_future))",
                         "triage-accept-9.7"),
                        ("stage:triage", "triage check refused: dismiss of alert '" + "0" * 32 + "': test 'cifar' has "
                         "raised no such alert (it has raised 2)", "triage-dismiss-9.8"),
                    ]), label="refused")
