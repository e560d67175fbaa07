"""Wire contract v1.1: a run sent as columns gives the same rows as the same run sent as v1 point objects."""

from __future__ import annotations

import struct

import apache_beam as beam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import TABLES
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import Detect, assert_rows, batch_pipeline, configs
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


def check_rows(check, **encodings):
    """One pipeline with a graph per encoding's messages; ``check(encoding={table: sorted reprs of its rows})`` in
    ``assert_that``."""
    with batch_pipeline() as p:
        tables = {}
        for side, raws in encodings.items():
            outputs = p | f"Create_{side}" >> beam.Create(raws) | f"Detect_{side}" >> Detect(SETTINGS)
            tables.update({f"{side}.{name}": outputs[name] for name in TABLES if name in outputs})
        assert_rows(tables, lambda found: check(**by_side(found)), label="tables")


def by_side(found):
    """``{"side.table": rows}`` as ``{side: {table: sorted reprs of the rows}}``."""
    sides = {}
    for name, rows in found.items():
        side, table = name.split(".", 1)
        sides.setdefault(side, {})[table] = sorted(map(repr, rows))
    return sides


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(run, min_size=1, max_size=3, unique_by=lambda r: r[0]))
@pytest.mark.long
def test_both_encodings_give_identical_rows(runs):
    v1, v1_1 = messages(runs, wire.SCHEMA), messages(runs, wire.SCHEMA_V1_1)
    assert all(b'"columns"' in raw.payload or b'"points"' not in raw.payload for raw in v1_1)
    points = [sorted(struct.pack("<d", v) + repr((t, s, time)).encode() for m in raws
                     for t, v, s, time in wire.parse_message(m.payload)[0].points) for raws in (v1, v1_1)]
    assert points[0] == points[1]

    def check(v1, v1_1):
        assert v1 == v1_1
        assert v1["job_history"] and not v1["dead_letter"]
    check_rows(check, v1=v1, v1_1=v1_1)
