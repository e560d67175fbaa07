import dataclasses
import json
import random
import time

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from core.runs import RunLifecycle
from core.schema import ALERTS, DEAD_LETTER, METRIC_WINDOWS
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import (
    Detect,
    assert_rows,
    batch_pipeline,
    configs,
    detect,
    finished,
    raw,
    started,
    streaming_pipeline,
)

LOSS_WINDOWS = {"window_config": {
    "allowed_lateness_seconds": 30, "stall_seconds": 300,
    "tags": {"loss": {"count": 4, "aggregations": ["mean", "max", "p90"], "checks": [{
        "aggregation": "mean", "history": "step_aligned",
        "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
                      "wait_for_n_points_of_history": 2}, "min_effect_rel": 0.05}]},
             "tput": {"time_seconds": 20, "aggregations": ["mean"]}}}}
SETTINGS = GraphSettings(configs(cifar=LOSS_WINDOWS), RunLifecycle(grace_seconds=10, timeout_seconds=600))
STREAMING = dataclasses.replace(SETTINGS, streaming=True)


def loss_points(run, start, values, first_step=0):
    return [raw("cifar", run, f"{run}/loss/{i}", points=[("loss", v, first_step + i * 10, start + 5 + i)])
            for i, v in enumerate(values)]


def run_messages(run, start, values, status="success"):
    return ([raw("cifar", run, f"{run}/start", events=[started(start)])] + loss_points(run, start, values)
            + [raw("cifar", run, f"{run}/end", events=[finished(start + 5 + len(values), status)])])


def key(row):
    return row["run_id"], row["tag"], row["window_kind"], row["window_index"], row["revision"], row["partial"], row["n"]


def test_count_windows_partial_at_run_end_and_step_aligned_alerts():
    messages = (run_messages("r1", T0, [1.0] * 4 + [0.50, 0.52, 0.51, 0.49] + [0.3])
                + run_messages("r2", T0 + 1000, [1.0] * 4 + [0.51, 0.50, 0.50, 0.52] + [0.3])
                + run_messages("r3", T0 + 2000, [1.0] * 4 + [0.9, 0.95, 0.9, 0.92] + [0.3]))
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(messages), SETTINGS)
        windows = outputs[METRIC_WINDOWS.name]
        assert_that(windows | beam.Filter(lambda r: r["tag"] == "loss") | beam.Map(key), equal_to([
            (run, "loss", "count", index, 0, index == 2, 1 if index == 2 else 4)
            for run in ("r1", "r2", "r3") for index in range(3)]), label="loss windows")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["kind"], a["run_id"], a["metric_name"],
                                                          json.loads(a["details"])["window"]["index"])),
                    equal_to([("window_out_of_bounds", "r3", "loss_mean", 1)]), label="alert")


def test_window_rows_carry_the_requested_aggregations():
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(run_messages("r1", T0, [1.0, 2.0, 3.0, 4.0])), SETTINGS)
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Filter(lambda r: r["tag"] == "loss")
                    | beam.Map(lambda r: (r["mean"], r["max"], r["p90"], r.get("min"), r["start_step"],
                                          r["end_step"])),
                    equal_to([(2.5, 4.0, 3.7, None, 0, 30)]))


def test_windows_do_not_depend_on_input_order():
    messages = run_messages("r1", T0, [float(i) for i in range(11)]) + [
        raw("cifar", "r1", f"t{i}", points=[("tput", 100.0 + i, i, T0 + 3 * i)]) for i in range(12)]
    shuffled = messages[:] + messages[::4]  # and some redeliveries
    random.Random(5).shuffle(shuffled)

    def check(found):
        assert sorted(found["in order"]) == sorted(found["shuffled"])
        assert len(found["in order"]) == 3 + 2  # loss: 4 + 4 + 3 (partial); tput: [T0, T0+20) and [T0+20, T0+40)
    with batch_pipeline() as p:
        rows = {}
        for side, order in (("in order", messages), ("shuffled", shuffled)):
            windows = (p | f"Create {side}" >> beam.Create(order) | f"Detect {side}" >> Detect(SETTINGS))[
                METRIC_WINDOWS.name]
            rows[side] = windows | f"Json {side}" >> beam.Map(lambda r: json.dumps(r, sort_keys=True))
        assert_rows(rows, check)


def at(time):
    return Timestamp.of(time)


def test_streaming_late_points_update_within_lateness_and_dead_letter_beyond():
    stream = (TestStream()
              .advance_watermark_to(at(T0))
              .add_elements(run_messages("r1", T0, [1.0, 2.0, 3.0, 4.0, 5.0])[:5])  # start + 4 points
              .advance_watermark_to(at(T0 + 40))       # window 0 (4 points) emitted; timers seen up to T0+8
              .add_elements([raw("cifar", "r1", "late-ok", points=[("loss", 9.0, 15, T0 + 20)])])  # within 30 s
              .add_elements([raw("cifar", "r1", "next", points=[("loss", 1.0, 100, T0 + 70)])])
              .advance_watermark_to(at(T0 + 100))      # timers seen up to T0+70
              .add_elements([raw("cifar", "r1", "late-no", points=[("loss", 9.0, 16, T0 + 21)])])  # 49 s behind
              .add_elements([raw("cifar", "r1", "end", events=[finished(T0 + 101)])])
              .advance_watermark_to(at(T0 + 200))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, STREAMING)
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Filter(lambda r: r["tag"] == "loss")
                    | beam.Map(lambda r: (r["window_index"], r["revision"], r["n"], r["max"])),
                    equal_to([(0, 0, 4, 4.0), (0, 1, 5, 9.0), (1, 0, 1, 1.0)]), label="revision")
        assert_that(outputs[DEAD_LETTER.name] | beam.Map(lambda d: (d["reason"][:4], json.loads(d["payload"])["id"])),
                    equal_to([("late", "late-no")]), label="late")


def test_streaming_stall_alert_is_driven_by_the_watermark():
    stream = (TestStream()
              .advance_watermark_to(at(T0))
              .add_elements([raw("cifar", "r1", "s", events=[started(T0)], points=[("loss", 1.0, 0, T0 + 1)])])
              .advance_watermark_to(at(T0 + 200))  # 199 s of silence: not yet
              .advance_watermark_to(at(T0 + 302))  # 301 s: stalled
              .add_elements([raw("cifar", "r1", "p", points=[("loss", 1.0, 10, T0 + 303)])])
              .advance_watermark_to(at(T0 + 500))  # resumed, quiet again for 197 s: no second alert
              .add_elements([raw("cifar", "r1", "end", events=[finished(T0 + 501)])])
              .advance_watermark_to(at(T0 + 1000))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, STREAMING)
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["kind"], a["created_at"])),
                    equal_to([("run_stalled", "2025-11-20T00:05:01.000000Z")]), label="stall")


def test_a_drain_raises_no_stall_for_a_run_that_was_still_sending():
    """A drain moves the watermark to the end of time and fires every stall timer at once. A run that sent its
    last point a moment ago has not been silent: no ``run_stalled`` (its close finishes the stall check too).
    One that had already been silent for more than half its stall (300 s) when the job drained is reported."""
    now = float(int(time.time()))  # TestStream watermarks are whole milliseconds
    live = [raw("cifar", "live", "live-s", events=[started(now - 60)], points=[("loss", 1.0, 0, now - 5)])]
    quiet = [raw("cifar", "quiet", "quiet-s", events=[started(now - 600)], points=[("loss", 1.0, 0, now - 200)])]
    stream = (TestStream()
              .advance_watermark_to(at(now - 700))
              .add_elements(live + quiet)
              # the drain: the watermark jumps past every timer while the wall clock reads now (a finite jump
              # first, so that what the timers emit is not late for the assertion's window)
              .advance_watermark_to(at(now + 86400))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, STREAMING)
        stalls = outputs[ALERTS.name] | beam.Filter(lambda a: a["kind"] == "run_stalled")
        assert_that(stalls | beam.Map(lambda a: a["run_id"]), equal_to(["quiet"]))


def test_replay_finds_a_mid_run_stall_once_like_the_stream_would():
    points = [raw("cifar", "r1", f"p{i}", points=[("loss", 1.0, i, T0 + t)]) for i, t in enumerate([1, 2, 500, 501])]
    messages = ([raw("cifar", "r1", "s", events=[started(T0)])] + points
                + [raw("cifar", "r1", "e", events=[finished(T0 + 502)])])
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(messages + messages[:2]), SETTINGS)
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["kind"], a["created_at"])),
                    equal_to([("run_stalled", "2025-11-20T00:05:02.000000Z")]))  # silent from T0+2, +300 s


def test_streaming_time_windows_close_with_the_watermark_and_debounce_recovers():
    trailing = configs(cifar={"window_config": {"tags": {"tput": {
        "time_seconds": 10, "aggregations": ["mean"], "checks": [{
            "aggregation": "mean", "history": "trailing", "trailing_windows": 3,
            "condition": {"comparison": "greater", "success_threshold": {"fixed_value": 50}},
            "debounce": {"windows": 3, "out_of_bounds": 2}}]}}}})
    settings = GraphSettings(trailing, RunLifecycle(grace_seconds=10, timeout_seconds=600), streaming=True)
    # one point per 10 s window: 100, 10, 100, 10, 10, 100, 100, 100, 10, 10
    values = [100, 10, 100, 10, 10, 100, 100, 100, 10, 10]
    stream = TestStream().advance_watermark_to(at(T0))
    for i, value in enumerate(values):
        stream = (stream.add_elements([raw("cifar", "r1", f"t{i}", points=[("tput", float(value), i, T0 + 10 * i + 1)])])
                  .advance_watermark_to(at(T0 + 10 * i + 10)))  # window i ends: emitted live
    stream = (stream.add_elements([raw("cifar", "r1", "end", events=[finished(T0 + 101)])])
              .advance_watermark_to(at(T0 + 200)).advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, settings)
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Map(lambda r: (r["window_index"] - int(T0 // 10), r["partial"])),
                    equal_to([(i, False) for i in range(10)]), label="complete windows")
        assert_that(outputs[ALERTS.name] | beam.Map(lambda a: json.loads(a["details"])["window"]["index"] - int(T0 // 10)),
                    equal_to([3, 9]), label="fires, recovers (window 6), fires again")


def test_streaming_windows_carry_the_machine_type_their_run_started_names():
    """With history_by, each window row names its run's machine type, also where run_started arrives after the
    run's first points (within the lateness, before the watermark passes them) and where later messages only
    touch the run's intake; a run whose run_started lacks the key joins ``accelerator=``."""
    typed = {"regression_test_config": {"history_by": ["accelerator"]}, **LOSS_WINDOWS}
    settings = dataclasses.replace(STREAMING, configs=configs(cifar=typed))

    def typed_run(run, start, accelerator, started_late=False):
        begin = raw("cifar", run, f"{run}/start", events=[("run_started", start, {"accelerator": accelerator}
                                                             if accelerator else {})])
        points = loss_points(run, start, [1.0, 1.1, 0.9, 1.0, 1.2])
        end = raw("cifar", run, f"{run}/end", events=[finished(start + 10)])
        return points[:1] + [begin] + points[1:] + [end] if started_late else [begin] + points + [end]

    stream = TestStream().advance_watermark_to(at(T0))
    for number, (accelerator, late) in enumerate([("v4", False), ("v5e", True), (None, False)]):
        start = T0 + 1000 * number
        for message in typed_run(f"r{number}", start, accelerator, late):
            stream = stream.add_elements([message])
        stream = stream.advance_watermark_to(at(start + 900))
    with streaming_pipeline() as p:
        outputs = detect(p | stream.advance_watermark_to_infinity(), settings)
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Filter(lambda r: r["tag"] == "loss")
                    | beam.Map(lambda r: (r["run_id"], r["window_index"], r["history_segment"])),
                    equal_to([("r0", 0, "accelerator=v4"), ("r0", 1, "accelerator=v4"),
                              ("r1", 0, "accelerator=v5e"), ("r1", 1, "accelerator=v5e"),
                              ("r2", 0, "accelerator="), ("r2", 1, "accelerator=")]))
