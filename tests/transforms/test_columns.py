"""Wire contract v1.1: a run sent as columns gives the same rows as the same run sent as v1 point objects."""

from __future__ import annotations

import struct

import apache_beam as beam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import TABLES
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import batch_pipeline, configs, detect, gather
from trainguard import wire
from trainguard.encoding import MessageEncoder

CONFIG = {
    "metric_collection_config": {"default_aggregation_strategies": ["final", "min", "max", "average"]},
    "regression_test_config": {"metric_success_conditions": {"default": {
        "comparison": "less", "success_threshold": {"stddevs_from_mean": 2}}}},
    "window_config": {"tags": {"loss": {"count": 3, "aggregations": ["mean", "min", "p90"]}}},
}
SETTINGS = GraphSettings(configs(t=CONFIG), RunLifecycle(grace_seconds=5, timeout_seconds=60))

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6).map(float)
value = st.one_of(f32, st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
                  st.sampled_from([-0.0, 0.0]))
point = st.tuples(st.sampled_from(["loss", "acc", "lr"]), value, st.one_of(st.none(), st.integers(0, 50)),
                  st.integers(0, 5000).map(lambda ms: T0 + ms / 1000))
run = st.tuples(st.sampled_from(["r1", "r2", "r3"]), st.lists(point, min_size=1, max_size=40),
                st.sampled_from(wire.FINISHED_STATUSES), st.integers(1, 25))


def messages(runs, schema):
    """Each run's points through the trainer's encoder (``max_points`` per message), then its events."""
    raws = []
    for run_id, points, status, max_points in runs:
        encoder = MessageEncoder("t", run_id, max_points=max_points, schema=schema)
        ids = iter(f"{run_id}-{i}" for i in range(10_000))
        events = [wire.event_dict(wire.RUN_STARTED, T0 - 1), wire.event_dict(wire.RUN_FINISHED, T0 + 10,
                                                                             {"status": status})]
        raws += [RawMessage(m.payload, "test") for m in encoder.encode(points, events, next_id=ids.__next__)]
    return raws


def rows(raws):
    with batch_pipeline() as p:
        outputs = detect(p | beam.Create(raws), SETTINGS)
        gathered = {name: gather(outputs[name], name) for name in TABLES if name in outputs}
    return {name: sorted(map(repr, table)) for name, table in gathered.items()}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(run, min_size=1, max_size=3, unique_by=lambda r: r[0]))
def test_both_encodings_give_identical_rows(runs):
    v1, v1_1 = messages(runs, wire.SCHEMA), messages(runs, wire.SCHEMA_V1_1)
    assert all(b'"columns"' in raw.payload or b'"points"' not in raw.payload for raw in v1_1)
    points = [sorted(struct.pack("<d", v) + repr((t, s, time)).encode() for m in raws
                     for t, v, s, time in wire.parse_message(m.payload)[0].points) for raws in (v1, v1_1)]
    assert points[0] == points[1]
    got = rows(v1), rows(v1_1)
    assert got[0] == got[1]
    assert got[0]["job_history"] and not got[0]["dead_letter"]
