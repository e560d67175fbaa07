"""Streaming timers in buckets (``RunLifecycle.timer_bucket_seconds``): one firing per bucket the watermark
passes, not one per distinct event time, with the same outputs.

A timer's outputs carry the time it fired at, so the distinct timestamps of a stage's outputs count the
firings that fed it something (every firing here does: each item is due in a bucket the watermark passes).
"""

import collections
import dataclasses
import json
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that
from apache_beam.utils.timestamp import Timestamp

from core.runs import RunLifecycle
from core.window_checks import RunEnded
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import (
    assert_rows,
    collect_outputs,
    configs,
    detect,
    finished,
    raw,
    started,
    streaming_pipeline,
)
from transforms.ordered import bucket_end, in_event_time_order

POINTS = 200


class Collect:
    """A state machine that keeps the runs it has seen and yields each one with how many came before it."""

    def initial(self, key):
        return []

    def forget_at(self, state):
        return None

    def step(self, state, item):
        state.append(item.run)
        yield key_of(item), len(state) - 1, item.run


def key_of(item):
    return item.test


def with_fired_at(output, fired_at=beam.DoFn.TimestampParam):
    return (*output, fired_at.micros)


def ordered_stage(bucket_seconds, items, check, keys=("a",)):
    """Runs ``in_event_time_order`` of ``Collect`` on ``items`` per key (shuffled, then one watermark advance
    past them all); ``check(outputs)`` in ``assert_that``, on the outputs with the time of the firing that gave
    each."""
    elements = [beam.window.TimestampedValue((key, dataclasses.replace(item, test=key)), item.finalized_at)
                for key in keys for item in items]
    random.Random(3).shuffle(elements)
    stream = (TestStream().advance_watermark_to(Timestamp.of(T0 - 100)).add_elements(elements)
              .advance_watermark_to(Timestamp.of(T0 + 100)).advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = (p | stream
                   | beam.ParDo(in_event_time_order(Collect(), "collect", True, bucket_seconds))
                   | beam.Map(with_fired_at))
        assert_that(outputs, check)


def distinct_times(n, spacing=0.04, start=T0 + 0.5):
    """``n`` run ends at distinct times, all inside the 10 s bucket (T0, T0 + 10]."""
    return [RunEnded("t", f"r{i:03d}", "success", start + spacing * i, "loss", "count") for i in range(n)]


def firings(outputs, key):
    return len({fired_at for k, _, _, fired_at in outputs if k == key})


def test_200_items_in_one_bucket_take_one_firing_per_key_not_200():
    def check(outputs):
        assert firings(outputs, "a") == firings(outputs, "b") == 1
        assert {fired_at for *_, fired_at in outputs} == {Timestamp.of(T0 + 10).micros}  # the bucket's end
        for key in ("a", "b"):  # every item once, in event-time order
            assert sorted((seen, run) for k, seen, run, _ in outputs if k == key) == [
                (i, f"r{i:03d}") for i in range(POINTS)]
    ordered_stage(10.0, distinct_times(POINTS), check, keys=("a", "b"))


def test_without_buckets_each_distinct_event_time_takes_a_firing():
    def check(outputs):
        assert firings(outputs, "a") == POINTS
        assert sorted((seen, run) for _, seen, run, _ in outputs) == [(i, f"r{i:03d}") for i in range(POINTS)]
    ordered_stage(0, distinct_times(POINTS), check)


def test_items_over_several_buckets_take_a_firing_per_bucket_in_order():
    items = distinct_times(POINTS, spacing=0.25)  # T0 + 0.5 ... T0 + 50.25: buckets ending T0 + 10 ... T0 + 60

    def check(outputs):
        assert firings(outputs, "a") == 6
        assert sorted((seen, run) for _, seen, run, _ in outputs) == [(i, f"r{i:03d}") for i in range(POINTS)]
        for _, _, run, fired_at in outputs:  # each item by the end of its own bucket, never before its time
            due = items[int(run[1:])].finalized_at
            assert due <= fired_at / 1e6 < due + 10
    ordered_stage(10.0, items, check)


@pytest.mark.parametrize("seconds, bucket, expected", [
    (T0 + 0.5, 10, T0 + 10), (T0 + 10, 10, T0 + 10), (T0 - 0.5, 10, T0), (T0 + 3, 0, T0 + 3),
    (T0 + 0.1, 0.3, T0 + 0.3), (-15.0, 10, -10.0)])
def test_bucket_end_rounds_up_to_a_multiple_of_the_bucket(seconds, bucket, expected):
    fires = bucket_end(seconds, bucket)
    assert fires == Timestamp.of(expected) or abs(float(fires) - expected) < 1e-6
    assert float(fires) >= seconds


def test_bucket_end_is_never_before_the_time_even_below_a_microsecond():
    """``Timestamp.of`` truncates: a settle timer set at ``Timestamp.of(T0 + 1.2 + 0.7 * 2)`` fired before that
    point's time (a float), left it pending and was set at the same time again, for ever."""
    assert float(Timestamp.of(T0 + 1.2 + 0.7 * 2)) < T0 + 1.2 + 0.7 * 2
    for seconds in (T0 + 10.0000004, T0 + 9.9999999, 0.3 * 7, T0 + 0.3 * 11, T0 + 1.2 + 0.7 * 2):
        for bucket in (0, 0.3, 1, 10):
            assert float(bucket_end(seconds, bucket)) >= seconds
    assert bucket_end(T0 + 1.2 + 0.7 * 2, 0).micros == Timestamp.of(T0 + 2.6).micros + 1


LOSS_WINDOWS = {
    "regression_test_config": {"metric_success_conditions": {"acc_final": {
        "comparison": "greater", "success_threshold": {"stddevs_from_mean": 2}, "wait_for_n_points_of_history": 2}},
        "alert_after_second_test_failure": False},
    "window_config": {
        "allowed_lateness_seconds": 30, "stall_seconds": 60,
        "tags": {"loss": {"count": 4, "aggregations": ["mean", "max"], "checks": [{
            "aggregation": "mean", "history": "step_aligned",
            "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
                          "wait_for_n_points_of_history": 2}, "min_effect_rel": 0.05}]},
                 "tput": {"time_seconds": 7, "aggregations": ["mean"]}}}}
RUN_SECONDS = 20  # a run's points span 1.0 ... 12.9 s after its start; it ends at 13.2 s, is finalized 10 s later


def run_messages(run, start, loss, accuracy=90.0, spacing=0.7):
    """A run of ``len(loss)`` points at distinct times ``spacing`` apart (loss and throughput), then its end."""
    points = [raw("cifar", run, f"{run}/p{i}", points=[("loss", value, i * 10, start + 1 + spacing * i),
                                                        ("tput", 100.0 + i % 3, i * 10, start + 1.5 + spacing * i)])
              for i, value in enumerate(loss)]
    end = start + 2 + spacing * len(loss)
    return ([raw("cifar", run, f"{run}/s", events=[started(start)])] + points
            + [raw("cifar", run, f"{run}/e", points=[("acc", accuracy, len(loss) * 10, end)],
                   events=[finished(end)])])


def shuffled_stream():
    """Four runs (the last regresses) 20 s apart, each delivered shuffled and with redeliveries before the
    watermark reaches its first point, which then moves to the next run's start; a fifth run stalls.

    On time: no point arrives behind the watermark (a late point is placed when it arrives, so how far the
    watermark got, which buckets change, decides what it joins). A run's windows settle in the watermark step
    after its points, its end in the next one, with the next run's windows (in the same buckets).

    Nor does one watermark step pass both a run's last windows and its end: without buckets, the settle timer
    works through a run's point times one firing at a time, and the direct runner fires the run's close timer,
    due in the same step, between two of them, closing as partial windows that had ended (with buckets, one
    firing settles them all before the close)."""
    rng = random.Random(11)
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for r, (loss, accuracy) in enumerate([([1.0, 0.9, 0.8, 0.7] * 4, 90.0), ([1.02, 0.91, 0.79, 0.71] * 4, 91.0),
                                          ([0.98, 0.9, 0.81, 0.69] * 4, 90.5), ([1.0, 1.4, 1.6, 1.9] * 4, 60.0)]):
        start = T0 + RUN_SECONDS * r
        messages = run_messages(f"r{r}", start, loss, accuracy)
        messages += rng.sample(messages, 4)
        rng.shuffle(messages)
        stream = stream.add_elements(messages).advance_watermark_to(Timestamp.of(start + RUN_SECONDS))
    stalled = run_messages("r4", T0 + 4 * RUN_SECONDS, [1.0, 0.9])[:-1]
    return (stream.add_elements(stalled).advance_watermark_to(Timestamp.of(T0 + 100))
            .advance_watermark_to(Timestamp.of(T0 + 500))
            .advance_watermark_to(Timestamp.of(T0 + 1000)).advance_watermark_to_infinity())


def settings(bucket_seconds):
    return GraphSettings(configs(cifar=LOSS_WINDOWS), RunLifecycle(
        grace_seconds=10, timeout_seconds=300, timer_bucket_seconds=bucket_seconds), streaming=True)


def pipeline_outputs(bucket_seconds, check, collect=False):
    """``check({table: sorted JSON rows})`` in ``assert_that``; with ``collect``, the rows too, as the expected
    side of the comparison with the pipelines of the other buckets (each a TestStream of its own)."""
    with streaming_pipeline() as p:
        outputs = detect(p | shuffled_stream(), settings(bucket_seconds))
        tables = {name: outputs[name] | f"Json_{name}" >> beam.Map(json.dumps, sort_keys=True, default=str)
                  for name in sorted(outputs)}
        assert_rows(tables, lambda found: check({name: sorted(rows) for name, rows in found.items()}))
        collected = {name: collect_outputs(pcoll, name) for name, pcoll in tables.items()} if collect else {}
    return {name: sorted(rows) for name, rows in collected.items()}


@pytest.mark.long
def test_every_output_is_the_same_with_timers_in_buckets_or_at_each_event_time():
    def check(unbucketed):
        alerts = sorted((a["kind"], a["run_id"]) for a in map(json.loads, unbucketed["alerts"]))
        assert alerts == [("metric_out_of_bounds", "r3"), ("run_missing", "r4"), ("run_stalled", "r4"),
                          ("window_out_of_bounds", "r3")]
        windows = collections.Counter((w["run_id"], w["tag"], w["partial"]) for w in map(json.loads,
                                                                                          unbucketed["metric_windows"]))
        assert windows == {**{(f"r{r}", "loss", False): 4 for r in range(4)},  # settled live, none partial
                           **{(f"r{r}", "tput", False): 2 + r // 2 for r in range(4)},
                           ("r4", "tput", False): 1, ("r4", "loss", True): 1}  # the stalled run's loss: at its timeout
    unbucketed = pipeline_outputs(0, check, collect=True)
    for bucket_seconds in (10.0, 3.7):
        def same(found, bucket_seconds=bucket_seconds):
            assert found == unbucketed, bucket_seconds
        pipeline_outputs(bucket_seconds, same)


WINDOW_POINTS = 100


def window_rows_fired_at(bucket_seconds, check):
    """``check(rows)`` in ``assert_that``, on the loss windows of one run of 100 points at distinct times inside
    one 10 s bucket, each with the time of the settle timer's firing that emitted it."""
    messages = run_messages("r0", T0 - 0.5, [1.0, 2.0, 3.0, 4.0] * (WINDOW_POINTS // 4), spacing=0.08)  # T0 + 0.5 ... 8.42
    random.Random(4).shuffle(messages)
    stream = (TestStream().advance_watermark_to(Timestamp.of(T0 - 2)).add_elements(messages)
              .advance_watermark_to(Timestamp.of(T0 + 10)).advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        rows = (detect(p | stream, settings(bucket_seconds))["metric_windows"]
                | beam.Filter(lambda row: row["tag"] == "loss")
                | beam.Map(lambda row, fired_at=beam.DoFn.TimestampParam: (row["window_index"], row["partial"],
                                                                            fired_at.micros)))
        assert_that(rows, check)


def test_the_settle_timer_emits_a_bucket_of_windows_in_one_firing():
    windows = [(i, False) for i in range(WINDOW_POINTS // 4)]  # both: the same windows, each once

    def bucketed(rows):
        assert sorted(row[:2] for row in rows) == windows
        assert {fired_at for *_, fired_at in rows} == {Timestamp.of(T0 + 10).micros}  # one firing

    def unbucketed(rows):
        assert sorted(row[:2] for row in rows) == windows
        assert len({fired_at for *_, fired_at in rows}) == WINDOW_POINTS // 4  # one per window's last point
    window_rows_fired_at(10.0, bucketed)
    window_rows_fired_at(0, unbucketed)
