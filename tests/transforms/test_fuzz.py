"""Fuzzing the whole graph: hostile but schema-valid messages never stop it, and every input is accounted for."""

from __future__ import annotations

import json
import math

import apache_beam as beam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import DEAD_LETTER, JOB_HISTORY, METRIC_WINDOWS
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import assert_rows, batch_pipeline, configs, detect
from trainguard import wire

CONFIG = {
    "metric_collection_config": {"default_aggregation_strategies": ["final", "min", "max", "average"]},
    "regression_test_config": {"metric_success_conditions": {"default": {
        "comparison": "less", "success_threshold": {"stddevs_from_mean": 2}}}},
    "window_config": {"stall_seconds": 5, "tags": {"loss": {"count": 2, "aggregations": list(
        ("last", "mean", "min", "max", "sum", "stddev", "p50", "p90", "p99", "histogram")), "checks": [{
            "aggregation": "mean", "history": "trailing", "trailing_windows": 2,
            "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 1}}}]}}},
}
SETTINGS = GraphSettings(configs(**{"t": CONFIG, "t" * 256: CONFIG}), RunLifecycle(grace_seconds=5, timeout_seconds=60))

names = st.one_of(st.sampled_from(["t", "t" * 256, "ünï/cødé", "x"]),
                  st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=20))
values = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([1.7e308, -1.7e308, math.exp(400), 5e-324, -0.0]))
times = st.floats(T0, T0 + 100).map(lambda t: round(t, 3))
point = st.fixed_dictionaries({"tag": st.sampled_from(["loss", "acc", "l" * 256]), "value": values, "time": times},
                              optional={"step": st.integers(0, 2 ** 63 - 1)})


def nested(depth: int, width: int) -> dict:
    data: dict = {"leaf": "v"}
    for level in range(depth):
        data = {f"k{i}": (data if i == 0 else level) for i in range(width)}
    return data


event_data = st.builds(nested, st.integers(0, 40), st.integers(1, 4))
event = st.one_of(
    st.fixed_dictionaries({"type": st.just("run_started"), "time": times, "data": event_data}),
    st.fixed_dictionaries({"type": st.just("run_finished"), "time": times,
                           "data": st.fixed_dictionaries({"status": st.sampled_from(wire.FINISHED_STATUSES)})}),
    st.fixed_dictionaries({"type": names, "time": times, "data": event_data}))
message = st.fixed_dictionaries({"test": st.sampled_from(["t", "t" * 256]), "run": st.sampled_from(["r1", "r2"]),
                                 "points": st.lists(point, max_size=6), "events": st.lists(event, max_size=3)})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(message, min_size=1, max_size=8))
@pytest.mark.long
def test_hostile_valid_messages_are_all_accounted_for(bodies):
    payloads = [json.dumps(dict(body, schema=wire.SCHEMA, id=f"m{i}")).encode() for i, body in enumerate(bodies)]
    rejected, with_data = 0, []
    for payload in payloads:
        try:
            parsed, rejections = wire.parse_message(payload)
        except wire.InvalidMessage:
            rejected += 1
            continue
        rejected += len(rejections)
        if parsed.points or parsed.events:
            with_data.append((parsed.test, parsed.run))

    def check(outputs):
        runs = {(row["test_name"], row["run_id"]) for row in outputs[JOB_HISTORY.name]}
        for run in with_data:
            assert run in runs
        dead = outputs[DEAD_LETTER.name]
        assert not [row for row in dead if row["reason"].startswith("error in")], "a stage failed on an input"
        assert len([row for row in dead if not row["reason"].startswith("late")]) == rejected
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create([RawMessage(payload, "fuzz") for payload in payloads]), SETTINGS)
        assert_rows({name: outputs[name] for name in (JOB_HISTORY.name, DEAD_LETTER.name, METRIC_WINDOWS.name)},
                    check)
