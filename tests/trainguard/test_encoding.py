"""The background encoder writes exactly what wire.encode_message would."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import T0
from tests.trainguard.support import expected_ts, parse_all, points_of
from trainguard import wire
from trainguard.encoding import NONFINITE_EVENT, MessageEncoder

tags = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Co", "Cn")), min_size=1, max_size=40)
values = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.integers(min_value=-(1 << 53), max_value=1 << 53))
steps = st.one_of(st.none(), st.integers(min_value=0, max_value=wire.MAX_STEP))
times = st.floats(min_value=wire.MIN_TIME, max_value=wire.MAX_TIME - 1)
points = st.lists(st.tuples(tags.filter(str.isprintable), values, steps, times), min_size=1, max_size=60)
# (rank, world_size) as a worker may know them: neither, the rank alone, or both with rank < world_size
ranks = st.one_of(st.just((None, None)),
                  st.tuples(st.integers(min_value=0, max_value=wire.MAX_WORLD_SIZE), st.none()),
                  st.integers(min_value=1, max_value=wire.MAX_WORLD_SIZE).flatmap(
                      lambda size: st.tuples(st.integers(min_value=0, max_value=size - 1), st.just(size))))


def reference(test, run, message_id, batch, events=(), rank=None, world_size=None):
    """The same message built with the wire module's own helpers (times kept to the millisecond)."""
    dicts = [wire.point_dict(tag, value, int(time * 1000) / 1000, step) for tag, value, step, time in batch]
    return wire.encode_message(test, run, dicts, list(events), message_id=message_id, rank=rank,
                               world_size=world_size)


@settings(max_examples=150, deadline=None)
@given(points, ranks)
def test_messages_equal_wire_encode_message(batch, rank):
    encoder = MessageEncoder("my-test", "run \u00e9 1", max_points=25, rank=rank[0], world_size=rank[1])
    ids = iter(f"id{i}" for i in range(1000))
    messages = encoder.encode(batch, next_id=lambda: next(ids))
    assert sum(m.points for m in messages) == len(batch)
    assert all(m.points <= 25 for m in messages)
    offset = 0
    for index, message in enumerate(messages):
        chunk = batch[offset:offset + message.points]
        offset += message.points
        expected = reference("my-test", "run \u00e9 1", f"id{index}", chunk, rank=rank[0], world_size=rank[1])
        assert json.loads(message.payload) == json.loads(expected)
        [parsed] = parse_all([message.payload])
        assert (parsed.rank, parsed.world_size) == rank
        assert message.attributes == wire.message_attributes("my-test", "run \u00e9 1", int(expected_ts(parsed)),
                                                             f"id{index}")


def test_point_values_round_trip_exactly():
    encoder = MessageEncoder("t", "r")
    batch = [("a", 0.1, None, T0), ("b", 1e-300, 5, T0), ("c", 12345678901234567.0, None, T0),
             ("d", -0.0, 0, T0), ("e", 3, 1, T0), ("f", np.float32(0.25), np.int64(7), T0),
             ("g", np.float64(2.5), None, T0), ("h", True, None, T0), ("i", 1 << 60, None, T0)]
    [message] = encoder.encode(batch)
    got = {p.tag: (p.value, p.step) for p in points_of(parse_all([message.payload]))}
    assert got == {"a": (0.1, None), "b": (1e-300, 5), "c": (12345678901234567.0, None), "d": (-0.0, 0),
                   "e": (3.0, 1), "f": (0.25, 7), "g": (2.5, None), "h": (1.0, None), "i": (float(1 << 60), None)}


def test_rank_and_events_share_the_envelope_and_leave_the_attributes_alone():
    encoder = MessageEncoder("t", "r", rank=3, world_size=8)
    [message] = encoder.encode([("x", 1.0, None, T0)], [wire.event_dict("run_started", T0, {})], next_id=lambda: "i")
    assert message.payload.startswith(b'{"schema":"trainguard/v1","id":"i","test":"t","run":"r","rank":3,"world_size":8,')
    assert message.attributes == wire.message_attributes("t", "r", int(T0 * 1000), "i")


def test_time_is_kept_to_the_millisecond_and_ts_matches_the_payload():
    encoder = MessageEncoder("t", "r")
    [message] = encoder.encode([("x", 1.0, None, T0 + 0.1239), ("x", 2.0, None, T0 + 0.0005)])
    parsed = parse_all([message.payload])[0]
    assert [p.time for p in points_of([parsed])] == [T0 + 0.123, T0]
    assert message.attributes["ts"] == expected_ts(parsed) == str(int((T0 + 0.123) * 1000))


def test_invalid_points_are_counted_not_raised():
    encoder = MessageEncoder("t", "r")
    bad = [("", 1.0, None, T0), ("x" * 300, 1.0, None, T0), (5, 1.0, None, T0), ("ok", "1.5", None, T0),
           ("ok", None, None, T0), ("ok", object(), None, T0), ("ok", 1.0, -1, T0), ("ok", 1.0, 2.5, T0),
           ("ok", 1.0, None, 12.0), ("ok", 1.0, None, None), ("bad\ntag", 1.0, None, T0), (["x"], 1.0, None, T0),
           ("ok", 10 ** 400, None, T0)]
    messages = encoder.encode(bad + [("ok", 1.0, 3, T0)])
    assert [p.tag for p in points_of(parse_all([m.payload for m in messages]))] == ["ok"]
    assert encoder.counters.invalid_points == len(bad)


def test_nonfinite_values_are_dropped_and_reported_once_per_tag_as_an_event():
    encoder = MessageEncoder("t", "r")
    messages = encoder.encode([("loss", float("nan"), 7, T0), ("loss", float("inf"), 8, T0 + 1),
                               ("gnorm", np.float32("-inf"), None, T0 + 2), ("loss", 1.0, 9, T0 + 3)])
    [parsed] = parse_all([m.payload for m in messages])
    assert [(p.tag, p.value) for p in points_of([parsed])] == [("loss", 1.0)]
    assert [(e.type, e.data) for e in parsed.events] == [
        (NONFINITE_EVENT, {"tag": "loss", "value": "nan", "step": 7}),
        (NONFINITE_EVENT, {"tag": "gnorm", "value": "-inf"})]
    assert encoder.counters.nonfinite_points == 3


def test_messages_stay_under_the_byte_limit_with_long_tags():
    encoder = MessageEncoder("t", "r", max_points=10_000, max_bytes=50_000)
    batch = [("t" * 250 + str(i % 7), float(i), i, T0) for i in range(2000)]
    messages = encoder.encode(batch)
    assert all(len(m.payload) <= 50_000 for m in messages)
    assert len(points := points_of(parse_all([m.payload for m in messages]))) == 2000
    assert [p.step for p in points] == list(range(2000))


def test_events_are_validated_and_sanitized():
    encoder = MessageEncoder("t", "r")
    events = [wire.event_dict("run_started", T0, {"lr": np.float32(0.5), "nan": float("nan"), "obj": object()}),
              wire.event_dict("run_finished", T0 + 1, {"status": "exploded"}),  # refused: bad status
              wire.event_dict("", T0, {}),  # refused: empty type
              wire.event_dict("huge", T0, {"x": "y" * (wire.MAX_EVENT_DATA_BYTES + 1)}),  # refused: too big
              wire.event_dict("run_finished", T0 + 2, {"status": "success"})]
    messages = encoder.encode([], events)
    [parsed] = parse_all([m.payload for m in messages])
    assert [e.type for e in parsed.events] == ["run_started", "run_finished"]
    data = parsed.events[0].data
    assert data["lr"] == 0.5 and data["nan"] == "nan" and data["obj"].startswith("<object")
    assert encoder.counters.invalid_events == 3


def test_more_than_100_events_are_split_across_messages():
    encoder = MessageEncoder("t", "r")
    messages = encoder.encode([("x", 1.0, None, T0)], [wire.event_dict("e", T0, {"i": i}) for i in range(250)])
    assert [m.events for m in messages] == [100, 100, 50]
    assert len(parse_all([m.payload for m in messages])) == 3


@pytest.mark.parametrize("kwargs", [{"max_points": 0}, {"max_points": 10_001}, {"max_bytes": 100},
                                    {"max_bytes": wire.MAX_MESSAGE_BYTES + 1}, {"rank": -1},
                                    {"rank": wire.MAX_WORLD_SIZE + 1}, {"world_size": 4}, {"rank": 4, "world_size": 4},
                                    {"rank": True}])
def test_limits_outside_the_contract_are_refused(kwargs):
    with pytest.raises(ValueError):
        MessageEncoder("t", "r", **kwargs)
