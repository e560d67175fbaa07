"""``transforms.columns``: every number comes back bit for bit, numpy's bytes are plain Python's, and regular
columns take a few bytes."""

import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms import columns
from transforms.columns import (
    pack_floats,
    pack_grouped_floats,
    pack_grouped_ints,
    pack_ints,
    unpack_floats,
    unpack_grouped_floats,
    unpack_grouped_ints,
    unpack_ints,
)

any_ints = st.integers() | st.integers(-2**70, 2**70) | st.integers(-3, 3)
any_floats = (st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 5e-324, 1.5, 0.1])
              | st.integers(-10**6, 10**6).map(lambda k: k / 1000))
orders = st.integers(0, 2)


def bits(values):
    return [struct.pack("<d", value) for value in values]


@given(st.lists(any_ints, max_size=60), orders)
@settings(max_examples=400, deadline=None)
def test_integers_of_any_size_come_back(numbers, order):
    assert unpack_ints(pack_ints(numbers, order)) == numbers


@given(st.lists(any_floats, max_size=60), orders)
@settings(max_examples=400, deadline=None)
def test_floats_come_back_bit_for_bit(values, order):
    """NaNs (with their payload), infinities, -0.0, subnormals, decimals and float32 values alike."""
    assert bits(unpack_floats(pack_floats(values, order))) == bits(values)


def flat(groups):
    return [value for group in groups for value in group], [len(group) for group in groups]


@given(st.lists(st.lists(any_ints, max_size=8), max_size=6), orders)
@settings(max_examples=300, deadline=None)
def test_groups_of_integers_come_back(groups, order):
    values, sizes = flat(groups)
    assert list(unpack_grouped_ints(pack_grouped_ints(values, sizes, order), sizes)) == values


@given(st.lists(st.lists(any_floats, max_size=8), max_size=6), orders)
@settings(max_examples=300, deadline=None)
def test_groups_of_floats_come_back_bit_for_bit(groups, order):
    values, sizes = flat(groups)
    assert bits(unpack_grouped_floats(pack_grouped_floats(values, sizes, order), sizes)) == bits(values)


column_sizes = st.integers(0, 3 * columns.FAST_SIZE)
regular_ints = st.integers(-2 ** 59, 2 ** 59) | st.integers(-3, 3) | st.integers(0, 2 ** 20)


@given(st.data(), orders)
@settings(max_examples=150, deadline=None)
def test_numpy_writes_the_bytes_plain_python_writes_and_reads_them_back(data, order):
    """Long columns of numbers within 60 bits go through numpy; the bytes are the same either way, and each
    reader reads what the other wrote. Groups of any sizes, decimals, float32 values, -0.0 and NaNs included."""
    size = data.draw(column_sizes)
    kind = data.draw(st.sampled_from(["ints", "decimals", "float32", "any"]))
    if kind == "ints":
        values = data.draw(st.lists(regular_ints, min_size=size, max_size=size))
    elif kind == "decimals":
        values = [k / 1000 for k in data.draw(st.lists(st.integers(-10 ** 12, 10 ** 12), min_size=size,
                                                        max_size=size))]
    elif kind == "float32":
        values = [struct.unpack("<f", struct.pack("<f", 3 + x))[0] for x in data.draw(st.lists(
            st.floats(-0.01, 0.01), min_size=size, max_size=size))]
    else:
        values = data.draw(st.lists(any_floats, min_size=size, max_size=size))
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=6)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [size])]
    pack, unpack = (pack_grouped_ints, unpack_grouped_ints) if kind == "ints" else (
        pack_grouped_floats, unpack_grouped_floats)
    fast = pack(values, sizes, order)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "FAST_SIZE", 10 ** 9)  # plain Python only
        slow = pack(values, sizes, order)
        read_slow = list(unpack(fast, sizes))
        single_slow = pack_floats(values, order) if kind != "ints" else pack_ints(values, order)
    assert fast == slow
    read_fast = list(unpack(slow, sizes))
    if kind == "ints":
        assert read_fast == values and read_slow == values
        assert pack_ints(values, order) == single_slow and unpack_ints(single_slow) == values
    else:
        assert bits(read_fast) == bits(values) and bits(read_slow) == bits(values)
        assert pack_floats(values, order) == single_slow and bits(unpack_floats(single_slow)) == bits(values)


def test_nan_payloads_and_the_sign_of_zero_are_kept():
    quiet, payload = float("nan"), struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_1234))[0]
    values = [quiet, payload, -0.0, 0.0, math.inf, -math.inf]
    assert bits(unpack_floats(pack_floats(values))) == bits(values)
    assert bits(unpack_floats(pack_floats([-0.0, 1.5]))) == bits([-0.0, 1.5])  # -0.0 is no decimal's quotient


def test_regular_columns_take_a_few_bytes():
    """A step column, times in milliseconds a second apart, values of six significant digits and float32
    values: what a training job's points are like."""
    rng = random.Random(1)
    steps = list(range(1000, 2000))
    times = [round(1.79e9 + 0.5 + i, 3) for i in range(1000)]
    six_digits = [float(f"{4 + rng.gauss(0, 0.01):.6g}") for _ in range(1000)]
    float32 = [struct.unpack("<f", struct.pack("<f", 4 + rng.gauss(0, 0.01)))[0] for _ in range(1000)]
    smooth32 = [struct.unpack("<f", struct.pack("<f", 8 + rng.gauss(0, 0.001)))[0] for _ in range(1000)]
    full = [4 + rng.gauss(0, 0.01) for _ in range(1000)]
    assert len(pack_ints(steps, order=2)) < 10
    assert len(pack_floats(times, order=2)) < 30
    assert len(pack_floats(six_digits)) < 2.1 * 1000
    assert len(pack_floats(float32)) <= 1 + 4 * 1000
    assert len(pack_floats(smooth32)) < 2.1 * 1000  # by their bits' differences
    assert len(pack_floats(full)) == 1 + 8 * 1000  # never more than float64


def test_a_few_large_jumps_do_not_widen_a_column():
    """Four tags' points one after the other: each tag's start is a jump, written apart."""
    times = [round(1.79e9 + tag * 0.25 + i, 3) for tag in range(4) for i in range(250)]
    packed = pack_floats(times, order=2)
    assert len(packed) < 60
    assert bits(unpack_floats(packed)) == bits(times)


def test_groups_that_start_alike_cost_little_more_than_one():
    """20 tags logged at the same steps and times: their seeds are taken across the groups."""
    values, sizes = flat([[round(1.79e9 + i, 3) for i in range(50)] for _ in range(20)])
    assert len(pack_grouped_floats(values, sizes, order=2)) < 40
