"""Distributed runs through the whole graph: the same rows in a replay (any order, duplicates) and in a stream."""

import json
import random
import time

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY, RANK_METRICS
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, detect, streaming_pipeline
from trainguard import wire

DAY = 86400.0
CONFIGS = configs(dist={"regression_test_config": {"alert_after_second_test_failure": False}})
LIFECYCLE = RunLifecycle(grace_seconds=60, timeout_seconds=3600)
WORLD = 4
# run -> (rank that crashes, rank that never finishes, torchelastic restarts)
RUNS = {"healthy": (None, None, 0), "crashed": (2, None, 0), "hung": (None, 3, 0), "restarted": (None, None, 1)}


def rank_messages(day, run, rank, crash, hang, restarts):
    start = T0 + day * DAY
    send = lambda mid, points=(), events=(): RawMessage(wire.encode_message(  # noqa: E731
        "dist", run, points, events, f"{run}/{rank}/{mid}", rank=rank, world_size=WORLD), "test")
    started = [wire.event_dict("run_started", start + rank, {"host": f"host-{rank}"})]
    if restarts:
        started.append(wire.event_dict("elastic_restart", start + rank, {"restart_count": restarts}))
    messages = [send("start", events=started),
                send("loss", [wire.point_dict("loss", 1.0 + rank + day / 10, start + 50, 100)])]
    if rank != hang:
        status = "failure" if rank == crash else "success"
        messages.append(send("end", events=[wire.event_dict("run_finished", start + 100 + rank, {
            "status": status, "num_failures": restarts})]))
    return messages


def all_messages():
    messages = []
    for day, (run, (crash, hang, restarts)) in enumerate(RUNS.items()):
        for rank in range(WORLD):
            messages += rank_messages(day, run, rank, crash, hang, restarts)
    return messages + messages[::5]  # redeliveries


EXPECTED_JOBS = [("healthy", "success", 0), ("crashed", "failure", 0), ("hung", "missing", None),
                 ("restarted", "success", 1)]


def check(outputs):
    assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: (r["run_id"], r["job_status"], r["num_failures"])),
                equal_to(EXPECTED_JOBS), label="jobs")
    assert_that(outputs[JOB_HISTORY.name] | beam.FlatMap(
        lambda r: [(r["run_id"], e["data"]["ranks"]) for e in json.loads(r["events"]) if e["type"] == "ranks_missing"]),
        equal_to([("hung", [3])]), label="missing ranks")
    assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["run_id"], a["kind"])),
                equal_to([("crashed", "job_failed"), ("hung", "run_missing")]), label="alerts")
    # a lifecycle alert says how the run went: when it started, when it was last heard from, which ranks hung
    assert_that(outputs[ALERTS.name] | beam.Filter(lambda a: a["run_id"] == "hung") | beam.Map(lambda a: {
        key: json.loads(a["details"]).get(key) for key in ("started_at", "last_heard_at", "ranks_missing")}),
        equal_to([{"started_at": T0 + 2 * DAY, "last_heard_at": T0 + 2 * DAY + 102, "ranks_missing": [3]}]),
        label="how the hung run went")
    assert_that(outputs[METRIC_HISTORY.name] | beam.Filter(lambda r: r["metric_name"] == "loss_final")
                | beam.Map(lambda r: (r["run_id"], r["metric_value"])),
                equal_to([("healthy", 1.0), ("crashed", 1.1), ("hung", 1.2), ("restarted", 1.3)]), label="rank 0")
    assert_that(outputs[RANK_METRICS.name] | beam.Filter(lambda r: r["run_id"] == "healthy")
                | beam.Map(lambda r: (r["rank"], r["metric_name"], r["metric_value"])),
                equal_to([(rank, "loss_final", 1.0 + rank) for rank in range(WORLD)]), label="per rank")
    assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")


@pytest.mark.parametrize("seed", [0, 1])
def test_distributed_runs_in_a_replay_do_not_depend_on_order_or_duplicates(seed):
    messages = all_messages()
    random.Random(seed).shuffle(messages)
    with batch_pipeline() as p:
        check(detect(p | beam.Create(messages), GraphSettings(CONFIGS, LIFECYCLE)))


def test_distributed_runs_in_a_stream_give_the_same_rows():
    messages = all_messages()
    random.Random(2).shuffle(messages)
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for day in range(len(RUNS)):
        today = [m for m in messages if T0 + day * DAY <= wire.parse_message(m.payload)[0].event_time
                 < T0 + (day + 1) * DAY]
        stream = stream.add_elements(today).advance_watermark_to(Timestamp.of(T0 + (day + 1) * DAY))
    with streaming_pipeline() as p:
        check(detect(p | stream.advance_watermark_to_infinity(), GraphSettings(CONFIGS, LIFECYCLE, streaming=True)))


STRAGGLER_CONFIG = {
    "metric_collection_config": {"tag_to_rank_reduction": {"step_time": "max"}},
    "window_config": {"tags": {"step_time": {"count": 10, "aggregations": ["mean"], "rank_check": {
        "aggregation": "mean", "min_effect_rel": 0.1, "debounce": {"windows": 3, "out_of_bounds": 2},
        "condition": {"comparison": "less", "success_threshold": {"mads_from_median": 5}}}}}}}
STRAGGLER_CONFIGS = configs(slow=STRAGGLER_CONFIG)


def straggler_messages(run="run", start=T0):
    """One run of 4 ranks, 60 steps each; rank 1 slows down by half from step 30 on."""
    messages = []
    for rank in range(WORLD):
        send = lambda mid, points=(), events=(), rank=rank: RawMessage(wire.encode_message(  # noqa: E731
            "slow", run, points, events, f"{run}/{rank}/{mid}", rank=rank, world_size=WORLD), "test")
        messages.append(send("start", events=[wire.event_dict("run_started", start, {"host": f"gpu-host-{rank}"})]))
        for first in range(0, 60, 10):
            messages.append(send(f"p{first}", [wire.point_dict(
                "step_time", (1.5 if rank == 1 and step >= 30 else 1.0) + 0.01 * ((step + rank) % 3),
                start + 1 + step, step) for step in range(first, first + 10)]))
        messages.append(send("end", events=[wire.event_dict("run_finished", start + 100, {"status": "success"})]))
    return messages + messages[:3]


def check_straggler(outputs):
    assert_that(outputs[ALERTS.name] | beam.Map(lambda a: (a["kind"], json.loads(a["details"])["rank"],
                                                           json.loads(a["details"])["host"],
                                                           json.loads(a["details"])["window"]["index"])),
                equal_to([("rank_straggler", 1, "gpu-host-1", 4)]), label="straggler")
    assert_that(outputs["metric_windows"] | beam.Map(lambda r: (r["window_index"], round(r["mean"], 1), r["n"])),
                equal_to([(i, 1.0 if i < 3 else 1.5, 40) for i in range(6)]), label="the slowest rank's windows")
    assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")


def test_a_straggling_rank_is_named_with_its_host_in_a_replay_and_in_a_stream():
    messages = straggler_messages()
    random.Random(3).shuffle(messages)
    with batch_pipeline() as p:
        check_straggler(detect(p | beam.Create(messages), GraphSettings(STRAGGLER_CONFIGS, LIFECYCLE)))
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for first in range(0, len(messages), 7):
        stream = stream.add_elements(messages[first:first + 7])
    stream = stream.advance_watermark_to(Timestamp.of(T0 + 50)).advance_watermark_to(Timestamp.of(T0 + 1000))
    with streaming_pipeline() as p:
        check_straggler(detect(p | stream.advance_watermark_to_infinity(),
                               GraphSettings(STRAGGLER_CONFIGS, LIFECYCLE, streaming=True)))


def test_a_drain_combines_the_windows_a_slower_rank_had_not_reached_from_the_ranks_that_had():
    """An open distributed run at a drain is interrupted, not ended: its rank windows still close, so the window
    rank 1 never reached is combined from the other three ranks instead of being lost with the drained state."""
    start = float(int(time.time()) - 200)  # a live run: its timeout lies far ahead of the wall clock, as at a drain
    messages = [m for m in straggler_messages(start=start) if not json.loads(m.payload).get("events")
                or json.loads(m.payload)["events"][0]["type"] != "run_finished"]
    behind = [m for m in messages if json.loads(m.payload)["id"] == "run/1/p50"]
    assert len(behind) == 1  # rank 1's last ten steps, never sent
    # a bounded input ends as a drain does: the watermark jumps to the end of time, the wall clock reads now
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create([m for m in messages if m not in behind]),
                         GraphSettings(STRAGGLER_CONFIGS, LIFECYCLE, streaming=True))
        assert_that(outputs[JOB_HISTORY.name] | beam.Map(lambda r: r["job_status"]), equal_to(["interrupted"]),
                    label="interrupted")
        assert_that(outputs["metric_windows"] | beam.Map(lambda r: (r["window_index"], r["n"])),
                    equal_to([(i, 40) for i in range(5)] + [(5, 30)]), label="every window")
