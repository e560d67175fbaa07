"""A v1.1 message keeps its valid columns whole (``wire.MessagePoints``) and is summarized from them: the same
summary, to the bit, as the same points parsed one by one."""

from __future__ import annotations

import json
import pickle
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import ConfigSet, parse_test_config
from core.parse import columns_by_tag, points_of_tags, summarize
from tests.support import T0
from tests.trainguard.test_columns import bursts, loops, points
from trainguard import wire
from trainguard.encoding import MessageEncoder

T0_MS = int(T0 * 1000)
CONFIG = ConfigSet({"t": parse_test_config({
    "metric_collection_config": {"default_aggregation_strategies": ["final", "min", "max", "average"],
                                 "tags_to_ignore": ["lr"],
                                 "time_to_accuracy": {"accuracy_tag": "loss", "accuracy_threshold": 0.5}},
    "window_config": {"tags": {"grad_norm": {"count": 3, "aggregations": ["mean"]},
                               "loss": {"count": 5, "aggregations": ["max"]}}},
}, "t.json")}).for_test("t")


def mixed_message() -> bytes:
    """v1 points, a good column, a column with one bad point among good ones, a good column of another tag."""
    return json.dumps({
        "schema": wire.SCHEMA_V1_1, "id": "m", "test": "t", "run": "r",
        "points": [{"tag": "loss", "value": 2.5, "time": T0 + 9, "step": 9}],
        "columns": [
            {"tag": "loss", "values": [2.0, 1.5], "steps": [10, 1], "ms": [T0_MS + 10_000, 1000]},
            {"tag": "acc", "values": [0.5, "x", 0.7], "ms": [T0_MS + 3_000, 1, 1]},
            {"tag": "grad_norm", "f32": True, "values": [0.25, 3.0], "steps": [4, 0], "ms": [T0_MS - 5_000, 7]},
        ]}).encode()


def test_good_columns_stay_columns_and_the_points_are_the_tuple_of_every_point_in_order():
    message, rejections = wire.parse_message(mixed_message())
    assert [r.reason for r in rejections] == ["invalid point [column 1, 1]: value must be a number, got str"]
    parts = message.points.parts
    assert [type(part).__name__ for part in parts] == ["tuple", "PointColumn", "tuple", "PointColumn"]
    expected = ((("loss", 2.5, 9, T0 + 9),) + (("loss", 2.0, 10, T0 + 10), ("loss", 1.5, 11, T0 + 11))
                + (("acc", 0.5, None, T0 + 3), ("acc", 0.7, None, T0 + 3.002))
                + (("grad_norm", 0.25, 4, T0 - 5), ("grad_norm", 3.0, 4, T0 - 4.993)))
    assert message.points == expected and expected == message.points and (message.points != expected) is False
    assert hash(message.points) == hash(expected) and repr(message.points) == repr(expected)
    assert len(message.points) == 7 and message.points[1] == expected[1] and list(message.points) == list(expected)
    assert message == message._replace(points=expected)
    assert pickle.loads(pickle.dumps(message)) == message
    assert wire.time_range(message.points) == (T0 - 5, T0 + 11) == wire.time_range(expected)
    assert message.event_time == T0 + 11
    assert list(points_of_tags(message.points, {"grad_norm", "acc"})) == [p for p in expected if p[0] != "loss"]
    assert columns_by_tag(message.points, {"acc"}) == columns_by_tag(expected, {"acc"})


def summaries(payload: bytes):
    message, _ = wire.parse_message(payload)
    one_by_one = message._replace(points=tuple(message.points))
    return summarize(message, payload, CONFIG), summarize(one_by_one, payload, CONFIG)


def exactly(summary):
    """The summary with every float spelled by its bits (so that 0.0 and -0.0 differ)."""
    def bits(value):
        if isinstance(value, float):
            return struct.pack("<d", value)
        if isinstance(value, (tuple, list)):
            return type(value)(bits(v) for v in value)
        return value
    return [(tag, bits(tuple(vars(aggregate).values()))) for tag, aggregate in summary.tags.items()], summary


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(points, loops, bursts), st.sampled_from([7, 1000]))
def test_a_message_is_summarized_from_its_columns_as_from_its_points(batch, max_points):
    batch = [(tag, value, step, time) for tag, value, step, time in batch]
    for message in MessageEncoder("t", "r", max_points=max_points, schema=wire.SCHEMA_V1_1).encode(batch):
        from_columns, from_points = summaries(message.payload)
        assert exactly(from_columns) == exactly(from_points)


def test_a_message_with_a_bad_point_is_summarized_from_its_columns_as_from_its_points():
    from_columns, from_points = summaries(mixed_message())
    assert exactly(from_columns) == exactly(from_points)
    assert from_columns.window_points and set(from_columns.tags) == {"loss", "acc", "grad_norm"}


def test_a_tag_of_one_column_reads_its_lists_and_a_tag_met_again_extends_copies_not_the_column():
    """``columns_by_tag`` hands a tag of one column that column's own lists (no copy a message); a tag met again,
    in another column or in the points of a column with a bad one, gets copies, and the columns stay as parsed."""
    payload = json.dumps({
        "schema": wire.SCHEMA_V1_1, "id": "m", "test": "t", "run": "r",
        "columns": [
            {"tag": "loss", "values": [2.0, 1.5], "steps": [10, 1], "ms": [T0_MS + 10_000, 1000]},
            {"tag": "acc", "values": [0.5], "ms": [T0_MS]},
            {"tag": "loss", "values": [1.0, "x"], "steps": [12, 1], "ms": [T0_MS + 12_000, 1000]},
            {"tag": "acc", "values": [0.75], "ms": [T0_MS + 1]},
            {"tag": "lr", "values": [0.1, 0.2], "ms": [T0_MS, 1]},
        ]}).encode()
    message, _ = wire.parse_message(payload)
    parts = message.points.parts
    assert [type(part).__name__ for part in parts] == ["PointColumn", "PointColumn", "tuple", "PointColumn",
                                                        "PointColumn"]
    before = [tuple(map(tuple, (part.values, part.times, part.steps or ()))) for part in parts[::3]]
    by_tag = columns_by_tag(message.points, set())
    assert by_tag == columns_by_tag(tuple(message.points), set())
    assert by_tag["loss"] == ([2.0, 1.5, 1.0], [T0 + 10, T0 + 11, T0 + 12], [10, 11, 12])
    assert by_tag["acc"][0] == [0.5, 0.75] and by_tag["lr"][0] is parts[4].values  # one column: its own list
    assert [tuple(map(tuple, (part.values, part.times, part.steps or ()))) for part in parts[::3]] == before


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12), st.integers(0, 10 ** 6))
def test_step_sums_are_the_running_sums_of_the_deltas(deltas, first):
    from itertools import accumulate

    from trainguard._columns import _step_sums
    for steps in ([first, *deltas[1:]], [first] + [1] * (len(deltas) - 1), [1] * len(deltas), deltas):
        sums = list(accumulate(steps))
        assert _step_sums(steps) == (sums, min(sums), max(sums))
