"""Wire contract v1.1: points as per-tag columns decode into exactly the points v1 carries, under v1's rules."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import struct
from array import array
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import T0
from trainguard import encoding, wire
from trainguard.encoding import MessageEncoder

T0_MS = int(T0 * 1000)
float32s = st.floats(width=32, allow_nan=False, allow_infinity=False).map(float)
values = st.one_of(st.floats(allow_nan=False, allow_infinity=False), float32s,
                   st.integers(min_value=-(1 << 53), max_value=1 << 53), st.sampled_from([-0.0, 0.0, 3.4028234663852886e38]))
steps = st.one_of(st.none(), st.integers(min_value=0, max_value=wire.MAX_STEP))
times = st.one_of(st.floats(min_value=wire.MIN_TIME, max_value=wire.MAX_TIME - 1),
                  st.integers(min_value=0, max_value=10_000).map(lambda ms: T0 + ms / 1000))
tags = st.sampled_from(["loss", "lr", "grad_norm", "ünï/cødé", "t" * 256])
points = st.lists(st.tuples(tags, values, steps, times), min_size=1, max_size=80)
# a training loop: the same tags every step, float32 values, steps counting up, times a few ms apart
loops = st.tuples(st.lists(tags, min_size=1, max_size=5, unique=True), st.integers(1, 40), float32s,
                  st.integers(0, 1000)).map(lambda a: [
                      (tag, a[2] + k, a[3] + step, T0 + (step * len(a[0]) + k) * 0.0017)
                      for step in range(a[1]) for k, tag in enumerate(a[0])])

# a fast loop: several points per millisecond and per step, values that repeat (a learning rate, 0.001 k), times
# and steps in order (the encoder writes them from where they change) or now and then not
dense_loops = st.tuples(st.lists(tags, min_size=1, max_size=5, unique=True), st.integers(1, 10),
                        st.integers(1, 60), st.sampled_from([1e-6, 1e-5, 2e-4, 0.0011]),
                        st.sampled_from([0, 1, 7, wire.MAX_STEP - 100]),
                        st.sampled_from(["repeat", "float32", "zeros", "signed zeros"]),
                        st.booleans(), st.booleans()).map(lambda a: [
                            (tag, _dense_value(a[5], i), None if a[7] else a[4] + step,
                             T0 + i * a[3] - (0.003 if a[6] and i % 97 == 50 else 0.0))
                            for step in range(a[2]) for r in range(a[1]) for k, tag in enumerate(a[0])
                            for i in (((step * a[1]) + r) * len(a[0]) + k,)])

# a training loop at a high rate: each step logs its tags (one round or several) in a burst of microseconds, then
# waits for the next step; the bursts cross a millisecond now and then, or the steps are shorter than one
bursts = st.tuples(st.lists(tags, min_size=1, max_size=5, unique=True), st.integers(1, 8), st.integers(1, 120),
                   st.sampled_from([1e-7, 3e-7, 2e-6, 3e-5]), st.sampled_from([5e-5, 2.5e-4, 5e-4, 0.0013]),
                   st.floats(0, 0.001), st.booleans(), float32s).map(lambda a: [
                       (tag, a[7] + (step * a[1] + r) * 0.01 + k, None if a[6] else step,
                        T0 + a[5] + step * a[4] + ((r * len(a[0])) + k) * a[3])
                       for step in range(a[2]) for r in range(a[1]) for k, tag in enumerate(a[0])])


def _dense_value(kind, i):
    if kind == "repeat":
        return 0.001 * (i % 11)
    if kind == "float32":
        return struct.unpack("<f", struct.pack("<f", 1 / (1 + i % 7)))[0]
    return [0.0, -0.0 if kind == "signed zeros" else 0.0, 0.5][i % 3]


def by_tag(batch):
    """The batch in v1.1's order: grouped by tag in the order tags first appear, each tag's points in order."""
    order = {}
    for point in batch:
        order.setdefault(point[0], len(order))
    return sorted(batch, key=lambda point: order[point[0]])  # stable


def encode_both(batch, max_points=1000):
    ids = iter(f"m{i}" for i in range(10_000))
    v1 = MessageEncoder("t", "r", max_points=max_points, schema=wire.SCHEMA).encode(
        by_tag(batch), next_id=lambda: next(ids))
    v1_1 = MessageEncoder("t", "r", max_points=max_points, schema=wire.SCHEMA_V1_1).encode(
        batch, next_id=lambda: next(ids))
    return v1, v1_1


def parsed_points(messages):
    points = []
    for message in messages:
        parsed, rejections = wire.parse_message(message.payload)
        assert rejections == []
        points += parsed.points
    return points


@settings(max_examples=200, deadline=None)
@given(st.one_of(points, loops, dense_loops, bursts))
def test_both_encodings_decode_into_identical_points(batch):
    v1, v1_1 = encode_both(batch)
    got = parsed_points(v1_1)
    assert got == parsed_points(v1)
    assert [struct.pack("<d", p[1]) for p in got] == [struct.pack("<d", p[1]) for p in parsed_points(v1)]  # -0.0
    assert [message.attributes["ts"] for message in v1_1] == [message.attributes["ts"] for message in v1]
    assert all(message.attributes["schema"] == wire.SCHEMA_V1_1 for message in v1_1)


@settings(max_examples=100, deadline=None)
@given(st.one_of(points, loops, dense_loops), st.integers(1, 30))
def test_the_encoder_writes_what_wire_encode_message_writes(batch, max_points):
    encoder = MessageEncoder("t", "r", max_points=max_points, schema=wire.SCHEMA_V1_1, rank=1, world_size=2)
    ids = iter(f"m{i}" for i in range(10_000))
    messages = encoder.encode(batch, next_id=lambda: next(ids))
    assert all(message.points <= max_points for message in messages)
    for message in messages:
        parsed, _ = wire.parse_message(message.payload)
        dicts = [wire.point_dict(tag, value, time, step) for tag, value, step, time in parsed.points]
        reference = wire.encode_message("t", "r", dicts, message_id=parsed.id, rank=1, world_size=2,
                                        schema=wire.SCHEMA_V1_1)
        assert as_float32(json.loads(message.payload)) == as_float32(json.loads(reference))


def as_float32(message):
    """The message with each ``f32`` column's values as the float32 they stand for: a float32 may be written
    in its shortest text (numpy and orjson) or to 9 digits (%-formatting, the reference's)."""
    for column in message.get("columns", []):
        if column.get("f32"):
            column["values"] = array("f", column["values"]).tolist()
    return message


def test_a_training_loop_costs_under_20_bytes_a_point_at_1000_points_a_message():
    batch = [(tag, struct.unpack("<f", struct.pack("<f", 2.5 / (1 + step * 0.01) + k))[0], step,
              T0 + (step * 5 + k) * 0.0021) for step in range(200) for k, tag in enumerate(
                  ["loss", "lr", "grad_norm", "throughput", "step_time_ms"])]
    v1, [message] = encode_both(batch)
    assert message.points == 1000
    assert len(message.payload) / 1000 <= 20
    assert sum(len(m.payload) for m in v1) / 1000 > 60


def test_non_finite_and_invalid_values_are_refused_as_in_v1():
    batch = [("loss", float("nan"), 1, T0), ("loss", 1.0, 2, T0), ("x", "1.5", None, T0), ("", 1.0, None, T0),
             ("loss", 2.0, -1, T0), ("loss", 3.0, 4, 12.0)]
    encoder = MessageEncoder("t", "r", schema=wire.SCHEMA_V1_1)
    messages = encoder.encode(batch)
    parsed = [wire.parse_message(m.payload)[0] for m in messages]
    assert [p for m in parsed for p in m.points] == [("loss", 1.0, 2, T0)]
    assert [e.type for m in parsed for e in m.events] == ["nonfinite_value"]
    assert (encoder.counters.nonfinite_points, encoder.counters.invalid_points) == (1, 4)


def encode_with_writer(dumps, batch, max_points, schema=wire.SCHEMA_V1_1, writer="compiled_dumps"):
    """The messages of ``batch`` and the encoder's counters, with ``encoding``'s ``writer`` swapped for ``dumps``
    (None: %-formatting; for ``float32_dumps``, to 9 digits)."""
    with mock.patch.object(encoding, writer, dumps):
        ids = iter(f"m{i}" for i in range(10_000))
        encoder = MessageEncoder("t", "r", max_points=max_points, schema=schema)
        return encoder.encode(batch, next_id=lambda: next(ids)), encoder.counters


# float64 values whose repr and orjson spell differently (1e-05 / 0.00001, 2.5e-07 / 2.5e-7), alongside the rest
small_exponents = st.sampled_from([1e-05, 2.5e-07, -5.517992275155738e-05, 5e-324, 1e-07, 1.7976931348623157e308, 1e16])
writer_batches = st.one_of(points, loops, dense_loops, bursts,
                           st.lists(st.tuples(tags, small_exponents, steps, times), min_size=1, max_size=40))


def compiled_writers():
    """The compiled number writers importable here (``encoding.compiled_writer`` takes the first)."""
    writers = []
    for module, name in (("orjson", "dumps"), ("msgspec.json", "encode")):
        with contextlib.suppress(ImportError):
            writers.append(pytest.param(getattr(importlib.import_module(module), name), id=module))
    return writers


@pytest.mark.parametrize("dumps", compiled_writers())
@settings(max_examples=300, deadline=None)
@given(batch=writer_batches, max_points=st.sampled_from([1, 7, 1000]))
def test_a_compiled_number_writer_sends_the_same_points(dumps, batch, max_points):
    compiled, compiled_counters = encode_with_writer(dumps, batch, max_points)
    plain, plain_counters = encode_with_writer(None, batch, max_points)
    assert [(m.points, m.events, m.attributes) for m in compiled] == [(m.points, m.events, m.attributes) for m in plain]
    for a, b in zip(compiled, plain):
        assert json.loads(a.payload) == json.loads(b.payload)
        points_a, points_b = parsed_points([a]), parsed_points([b])
        assert points_a == points_b
        assert [struct.pack("<d", p[1]) for p in points_a] == [struct.pack("<d", p[1]) for p in points_b]  # -0.0
    assert (compiled_counters.invalid_points, compiled_counters.nonfinite_points) == (
        plain_counters.invalid_points, plain_counters.nonfinite_points)


def test_the_compiled_number_writer_is_used_where_installed():
    writers = compiled_writers()
    if not writers:
        pytest.skip("neither orjson nor msgspec is importable")
    assert encoding.compiled_dumps is writers[0].values[0]
    calls = []

    def dumps(obj):
        calls.append(obj)
        return writers[0].values[0](obj)

    batch = [("lr", [1e-05, 2e-05, 3e-05][i % 3], i, T0 + i * 0.001) for i in range(10)]
    [message], _ = encode_with_writer(dumps, batch, 1000)
    assert len(calls) == 3  # values, steps and ms
    assert b'"values":[0.00001,0.00002,0.00003,' in message.payload
    [plain], _ = encode_with_writer(None, batch, 1000)
    assert b'"values":[1e-05,2e-05,3e-05,' in plain.payload


needs_float32_writer = pytest.mark.skipif(encoding.float32_dumps is None, reason="numpy or orjson is not importable")
any_float32 = st.integers(0, (1 << 32) - 1).map(lambda bits: struct.unpack("<f", struct.pack("<I", bits))[0]).filter(
    math.isfinite)


@needs_float32_writer
@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(any_float32, float32s), min_size=1, max_size=60),
       max_points=st.sampled_from([1, 7, 1000]))
def test_float32_values_in_their_shortest_text_read_back_bit_for_bit(values, max_points):
    batch = [("loss", value, i, T0 + i * 0.001) for i, value in enumerate(values)]
    shortest, _ = encode_with_writer(encoding.float32_dumps, batch, max_points, writer="float32_dumps")
    nine_digits, _ = encode_with_writer(None, batch, max_points, writer="float32_dumps")
    for messages in (shortest, nine_digits):
        assert [struct.pack("<f", p[1]) for p in parsed_points(messages)] == [struct.pack("<f", v) for v in values]
    assert [(m.points, m.attributes) for m in shortest] == [(m.points, m.attributes) for m in nine_digits]


@needs_float32_writer
def test_a_million_float32_values_and_every_binade_edge_read_back_from_their_shortest_text():
    """The reader's rule (``_columns``: the text read as a float64, then rounded to the nearest float32) gives
    back every float32 the writer wrote, near each power of two (where a float32's interval is lopsided) too."""
    import numpy as np

    bits = np.random.default_rng(7).integers(0, 1 << 32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    edges = (np.arange(255, dtype=np.uint32)[:, None] << 23) + np.array([0, 1, 2, 0x7FFFFE, 0x7FFFFF], np.uint32)
    floats = np.concatenate([bits, edges.ravel(), edges.ravel() | 0x80000000]).view(np.float32)
    floats = floats[np.isfinite(floats)]
    text = encoding.float32_dumps(array("f", floats.tobytes()))
    back = array("f", json.loads(text))
    assert back.tobytes() == floats.tobytes()


def test_float32_values_are_written_shortest_where_numpy_is_importable():
    batch = [("loss", struct.unpack("<f", struct.pack("<f", v))[0], i, T0) for i, v in enumerate([3.91, 0.1, 2.5])]
    [plain], _ = encode_with_writer(None, batch, 1000, writer="float32_dumps")
    assert b'"f32":true,"values":[3.91000009,0.100000001,2.5]' in plain.payload
    if encoding.float32_dumps is None:
        pytest.skip("numpy or orjson is not importable")
    [shortest], _ = encode_with_writer(encoding.float32_dumps, batch, 1000, writer="float32_dumps")
    assert b'"f32":true,"values":[3.91,0.1,2.5]' in shortest.payload


bad_points = st.sampled_from([("", 1.0, None, T0), ("loss", float("nan"), 3, T0), ("loss", "1.5", None, T0),
                              ("loss", 1.0, -1, T0), ("loss", 1.0, 2.5, T0), ("loss", 1.0, None, float("nan")),
                              ("loss", 1.0, None, float("inf")), ("loss", 1.0, None, 12.0), (["x"], 1.0, None, T0)])


@settings(max_examples=200, deadline=None)
@given(st.one_of(points, loops, dense_loops).flatmap(lambda batch: st.lists(bad_points, max_size=3).flatmap(
    lambda bad: st.permutations(batch + bad))), st.sampled_from(wire.SCHEMAS), st.sampled_from([1, 30, 1000]))
def test_flat_points_encode_as_the_same_points_as_tuples(batch, schema, max_points):
    """``encode_flat`` (what the handler's intake hands over) writes byte for byte what ``encode`` does."""
    ids = iter(f"m{i}" for i in range(20_000))
    from_tuples = MessageEncoder("t", "r", max_points=max_points, schema=schema)
    from_flat = MessageEncoder("t", "r", max_points=max_points, schema=schema)
    expected = from_tuples.encode(batch, next_id=lambda: next(ids))
    ids = iter(f"m{i}" for i in range(20_000))
    got = from_flat.encode_flat([x for point in batch for x in point], next_id=lambda: next(ids))
    assert [(m.payload, m.attributes, m.points, m.events) for m in got] == [
        (m.payload, m.attributes, m.points, m.events) for m in expected]
    assert (from_flat.counters.invalid_points, from_flat.counters.nonfinite_points) == (
        from_tuples.counters.invalid_points, from_tuples.counters.nonfinite_points)


def encode_flat_with(batch, max_points, points_per_bisection=None, floats=False):
    """``encode_flat``'s messages of ``batch``, with ``encoding.POINTS_PER_BISECTION`` changed if given (0: times
    in order are always written from their runs of equal milliseconds, 10**9: never, but for a single one)."""
    saved = encoding.POINTS_PER_BISECTION
    if points_per_bisection is not None:
        encoding.POINTS_PER_BISECTION = points_per_bisection
    try:
        ids = iter(f"m{i}" for i in range(20_000))
        encoder = MessageEncoder("t", "r", max_points=max_points, schema=wire.SCHEMA_V1_1)
        messages = encoder.encode_flat([x for point in batch for x in point], next_id=lambda: next(ids),
                                       floats=floats)
        return [(m.payload, m.attributes, m.points, m.events) for m in messages]
    finally:
        encoding.POINTS_PER_BISECTION = saved


@pytest.mark.parametrize("dumps", [None, *compiled_writers()])
@settings(max_examples=150, deadline=None)
@given(batch=st.one_of(bursts, dense_loops, loops), max_points=st.sampled_from([1, 7, 60, 1000]))
def test_times_written_from_their_runs_are_the_times_written_point_by_point(dumps, batch, max_points):
    saved = encoding.compiled_dumps
    encoding.compiled_dumps = dumps
    try:
        every_point = encode_flat_with(batch, max_points, 10 ** 9)
        assert encode_flat_with(batch, max_points, 0) == every_point
        assert encode_flat_with(batch, max_points) == every_point
    finally:
        encoding.compiled_dumps = saved


def test_a_high_rate_loop_takes_each_path_of_the_runs_writer():
    def loop(tags, rounds, burst, steps=200, gap=0.0005, offset=0.0):
        return [(tag, 0.5 + k, step, T0 + offset + step * gap + (r * len(tags) + k) * burst)
                for step in range(steps) for r in range(rounds) for k, tag in enumerate(tags)]

    tags5 = ["loss", "lr", "acc", "gpu", "mem"]
    stalled = loop(tags5[:4], 1, 1e-6, gap=0.0001, offset=0.0002)
    for stall in (401, 403):  # a round over 2 ms once: two milliseconds start between two points of a column
        stalled[stall:] = [(tag, value, step, time + 0.0012) for tag, value, step, time in stalled[stall:]]
    cases = [  # (batch, how many writers of milliseconds its columns share; 0: none, written point by point)
        (loop(tags5[:2], 3, 1e-7, offset=0.0002), 1),  # every millisecond starts with a step: one for all columns
        (loop(tags5, 1, 2e-5, offset=0.00095), 2),  # the steps that cross a millisecond do after the third tag
        (stalled, 3),  # ... after the second and after the fourth
        (loop([f"t{i}" for i in range(300)], 1, 1e-6, steps=3, offset=0.0004), 2),  # 300 columns, two runs
        (loop([f"t{i}" for i in range(50)], 40, 7.3e-5, steps=1), 0),  # 50 columns, a run every 14 points
    ]
    for batch, writers in cases:
        flat = [x for point in batch for x in point]
        columns = MessageEncoder("t", "r", schema=wire.SCHEMA_V1_1)._periodic_columns(
            flat[0::4], flat[1::4], flat[2::4], flat[3::4])
        kinds = {type(column.ms).__name__ for column in columns}
        assert kinds == ({"_RunMillis"} if writers else {"_Millis"})
        assert len({id(column.ms) for column in columns}) == (writers or len(columns))
        assert encode_flat_with(batch, 1000) == encode_flat_with(batch, 1000, 10 ** 9)
        points = parsed_points(MessageEncoder("t", "r", schema=wire.SCHEMA_V1_1).encode(batch))
        assert sorted(points) == sorted((tag, value, step, int(time * 1000) / 1000)
                                        for tag, value, step, time in batch)


def test_a_training_loops_full_message_is_written_without_a_pause_and_anything_else_pauses_as_asked():
    def pauses(batch, pause_every=256):
        calls = []
        MessageEncoder("t", "r", schema=wire.SCHEMA_V1_1).encode_flat(
            [x for point in batch for x in point], pause=lambda: calls.append(1), pause_every=pause_every)
        return len(calls)

    loop = [(tag, 0.5, step, T0 + step * 0.001 + k * 1e-6) for step in range(1000) for k, tag in enumerate("ab")]
    assert pauses(loop[:1000]) == 0 and pauses(loop[:1000], pause_every=100) == 1 and pauses(loop) == 1
    assert pauses(loop[1:1000]) == 0  # (a rotation of the same round)
    irregular = loop[:1000]
    irregular[10] = ("c", 0.5, 5, T0)
    assert pauses(irregular) == 1000 // 256 + 1  # grouped by tag: after every 256 points, and once more


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.integers(encoding.MIN_MS, encoding.MAX_MS - 1),
                 st.integers(T0_MS - 10, T0_MS + 10 ** 7)))
def test_the_first_time_of_a_millisecond_is_exactly_where_it_starts(ms):
    time = encoding.first_time_of(ms)
    assert int(time * 1000) >= ms and int(math.nextafter(time, 0.0) * 1000) < ms


@settings(max_examples=100, deadline=None)
@given(st.one_of(points, loops, dense_loops, bursts).map(
    lambda batch: [(tag, float(value), step, float(time)) for tag, value, step, time in batch]),
    st.sampled_from([1, 30, 1000]))
def test_values_and_times_known_to_be_floats_are_written_alike(batch, max_points):
    """``encode_flat(..., floats=True)``, as the handler calls it while its intake has only had floats."""
    assert encode_flat_with(batch, max_points, floats=True) == encode_flat_with(batch, max_points)


@pytest.mark.parametrize("bad", [("value", None), ("value", "1.5"), ("value", 2), ("time", None), ("time", "x"),
                                 ("time", T0_MS)])
def test_a_point_that_is_not_floats_after_all_is_checked_on_its_own(bad):
    """``floats=True`` but one value or time is not a float (the flag wrong, or a point that slipped past it):
    the same messages and counts as without the flag, never an exception in the background thread."""
    field, wrong = bad
    batch = [("loss", 1.0 + i, i, T0_MS / 1000 + i / 10) for i in range(40)]
    tag, value, step, time = batch[17]
    batch[17] = (tag, wrong, step, time) if field == "value" else (tag, value, step, wrong)
    assert encode_flat_with(batch, 30, floats=True) == encode_flat_with(batch, 30)


@pytest.mark.parametrize("schema", wire.SCHEMAS)
@pytest.mark.parametrize("bad_time", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_time_is_refused_with_its_point_not_raised(schema, bad_time):
    # a training loop's batch (the encoder's vectorized path) with one point's time broken
    batch = [("loss", 1.0 + i, i, T0 + i * 0.001) for i in range(6)]
    batch[3] = ("loss", 4.0, 3, bad_time)
    encoder = MessageEncoder("t", "r", schema=schema)
    for encode in (encoder.encode, lambda b: encoder.encode_flat([x for p in b for x in p])):
        points = parsed_points(encode(batch))
        assert [p[2] for p in points] == [0, 1, 2, 4, 5]
    assert encoder.counters.invalid_points == 2


def columns_message(*columns, schema=wire.SCHEMA_V1_1, **fields):
    body = {"schema": schema, "id": "m1", "test": "t", "run": "r", "columns": list(columns)}
    body.update(fields)
    return json.dumps(body).encode()


GOOD = {"tag": "loss", "values": [0.5, 0.25], "steps": [10, 1], "ms": [T0_MS, 5]}


def test_a_column_decodes_its_deltas():
    parsed, rejections = wire.parse_message(columns_message(
        GOOD, {"tag": "lr", "f32": True, "values": [0.100000001, 3], "ms": [T0_MS + 7, -7]},
        {"tag": "acc", "values": [1.0, 2.0, 3.0], "steps": [5, None, 2], "ms": [T0_MS, 0, 1]}))
    assert rejections == []
    assert parsed.points == (("loss", 0.5, 10, T0), ("loss", 0.25, 11, T0 + 0.005),
                             ("lr", struct.unpack("<f", struct.pack("<f", 0.1))[0], None, T0 + 0.007),
                             ("lr", 3.0, None, T0), ("acc", 1.0, 5, T0), ("acc", 2.0, None, T0),
                             ("acc", 3.0, 7, T0 + 0.001))


@pytest.mark.parametrize("column, reason", [
    ({**GOOD, "values": [float("nan"), 0.25]}, "value is nan"),
    ({**GOOD, "values": [1e400, 0.25]}, "value is inf"),
    ({**GOOD, "values": [True, 0.25]}, "value must be a number, got bool"),
    ({**GOOD, "values": ["1", 0.25]}, "value must be a number, got str"),
    ({**GOOD, "values": [[1], 0.25]}, "value must be a number, got list"),
    ({**GOOD, "values": [10 ** 400, 0.25]}, "value is out of float range"),
    ({**GOOD, "f32": True, "values": [1e39, 0.25]}, "out of float32 range"),
    ({**GOOD, "steps": [1.5, 11]}, "step must be an integer, got float"),  # the sum stays where it was
    ({**GOOD, "steps": [-1, 12]}, "step -1 is out of range"),
    ({**GOOD, "steps": [wire.MAX_STEP + 1, 11]},  # counts in no sum: a reader sums the deltas in int64
     "step delta must be an integer from -9223372036854775807 to 9223372036854775807, got 9223372036854775808"),
    ({**GOOD, "steps": [-(1 << 63), 11]}, "step delta must be an integer from"),
    ({**GOOD, "ms": [1 << 63, T0_MS + 5]}, "ms delta must be an integer from -9223372036854775807 to"),
    ({**GOOD, "ms": [10 ** 400, T0_MS + 5]}, "ms delta must be an integer from"),
    ({**GOOD, "ms": [12, T0_MS - 12 + 5]}, "not plausible"),
    ({**GOOD, "ms": [float(T0_MS), T0_MS + 5]}, "ms must be an integer, got float"),
    ({**GOOD, "ms": [None, T0_MS + 5]}, "ms must be an integer, got NoneType"),
])
def test_a_bad_point_is_rejected_alone(column, reason):
    parsed, rejections = wire.parse_message(columns_message(column))
    assert parsed.points == (("loss", 0.25, 11, T0 + 0.005),)  # the running sums go on past the bad point
    assert len(rejections) == 1
    assert rejections[0].reason.startswith("invalid point [column 0, 0]: ") and reason in rejections[0].reason
    context = json.loads(rejections[0].payload)
    assert context["id"] == "m1" and context["test"] == "t" and context["run"] == "r"
    assert context["point"]["tag"] == "loss"


def test_a_running_step_past_int64_is_out_of_range_though_no_delta_is():
    column = {"tag": "loss", "values": [1.0, 2.0, 3.0, 4.0], "steps": [wire.MAX_STEP, 0, 1, -2],
              "ms": [T0_MS, 1, 1, 1]}
    parsed, rejections = wire.parse_message(columns_message(column))
    assert [point[2] for point in parsed.points] == [wire.MAX_STEP, wire.MAX_STEP, wire.MAX_STEP - 1]
    assert [r.reason for r in rejections] == [f"invalid point [column 0, 2]: step {wire.MAX_STEP + 1} is out of range"]


@pytest.mark.parametrize("column, reason", [
    ("loss", "not an object"),
    ({**GOOD, "tag": ""}, "tag must have 1 to"),
    ({**GOOD, "tag": "a\nb"}, "control characters"),
    ({**GOOD, "tag": 5}, "tag must be a string"),
    ({**GOOD, "extra": 1}, "unknown fields ['extra']"),
    ({**GOOD, "values": [1.0]}, "must be as long"),
    ({**GOOD, "steps": [1]}, "must be as long"),
    ({**GOOD, "values": [], "steps": [], "ms": []}, "at least one point"),
    ({**GOOD, "values": 1.0}, "values must be a list"),
    ({**GOOD, "ms": None}, "ms must be a list"),
    ({**GOOD, "f32": 1}, "f32 must be true or false"),
])
def test_a_bad_column_is_rejected_alone_as_one_dead_letter(column, reason):
    parsed, rejections = wire.parse_message(columns_message(column, {"tag": "ok", "values": [1], "ms": [T0_MS]}))
    assert parsed.points == (("ok", 1.0, None, T0),)
    assert len(rejections) == 1
    assert rejections[0].reason.startswith("invalid column [0]: ") and reason in rejections[0].reason
    assert json.loads(rejections[0].payload)["column"] == column


@pytest.mark.parametrize("payload, reason", [
    (columns_message(GOOD, schema=wire.SCHEMA), "columns need schema 'trainguard/v1.1'"),
    (columns_message(schema="trainguard/v1.2"), "schema is 'trainguard/v1.2'"),
    (json.dumps({"schema": wire.SCHEMA_V1_1, "id": "m", "test": "t", "run": "r", "columns": GOOD}).encode(),
     "columns must be a list"),
    (columns_message({**GOOD, "values": [1.0] * 6000, "ms": [T0_MS] + [0] * 5999, "steps": None},
                     points=[wire.point_dict("x", 1.0, T0)] * 4001), "limit is 10000"),
    (columns_message(), "no points and no events"),
    (columns_message(GOOD, run=""), "run must have 1 to"),
    (columns_message(GOOD, rank=2, world_size=2), "rank 2 is not below world_size 2"),
])
def test_a_bad_envelope_rejects_the_whole_message(payload, reason):
    with pytest.raises(wire.InvalidMessage, match=reason.replace("(", r"\(")):
        wire.parse_message(payload)


def test_v1_1_carries_v1_points_and_triage_messages_too():
    parsed, rejections = wire.parse_message(columns_message(GOOD, points=[wire.point_dict("x", 1.0, T0, 3)]))
    assert rejections == [] and parsed.points[0] == ("x", 1.0, 3, T0) and len(parsed.points) == 3
    triage = json.dumps({"schema": wire.SCHEMA_V1_1, "id": "m", "test": "t",
                         "triage": {"action": "mute", "time": T0, "until": T0 + 1}}).encode()
    assert wire.parse_message(triage)[0].triage == wire.Triage("mute", T0, until=T0 + 1)


def test_a_nan_literal_in_a_column_is_a_point_rejection_not_a_crash():
    payload = columns_message(GOOD).replace(b"0.5", b"NaN")
    parsed, rejections = wire.parse_message(payload)
    assert parsed.points == (("loss", 0.25, 11, T0 + 0.005),) and "value is nan" in rejections[0].reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.sampled_from(["loss", ""]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["tag", "values", "steps", "ms", "f32"]), children, max_size=5),
    max_leaves=20), max_size=4))
def test_any_columns_parse_or_are_rejected_with_a_reason(columns):
    try:
        parsed, rejections = wire.parse_message(columns_message(*columns))
    except wire.InvalidMessage as e:
        assert str(e)
        return
    assert parsed.points or rejections
    assert all(r.reason and r.payload for r in rejections)
    for point in parsed.points:
        assert wire.parse_point(wire.point_dict(point[0], point[1], point[3], point[2])) == point

