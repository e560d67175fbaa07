"""The maths stays finite for any finite input: values across the whole float range, subnormals to ±1.7e308."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from core.aggregation import TagAggregate
from core.bounds import compute_bounds
from core.config import SuccessCondition
from core.stats import mean_and_pstdev, percentile
from core.windows import AGGREGATIONS, WindowPoint, window_aggregates
from tests.support import T0

ANY_FINITE = st.floats(allow_nan=False, allow_infinity=False)
EXTREMES = st.sampled_from([1.7e308, -1.7e308, math.exp(400), -math.exp(400), 5e-324, -5e-324, 2.2250738585072014e-308,
                            0.0, -0.0, 1.0])
VALUES = st.lists(st.one_of(ANY_FINITE, EXTREMES), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_mean_and_population_stddev_are_finite_and_within_the_values(values):
    mean, stddev = mean_and_pstdev(values)
    assert math.isfinite(mean) and math.isfinite(stddev) and stddev >= 0
    low, high = min(values), max(values)  # the mean's last rounding may step one ulp outside
    assert low - math.ulp(low) <= mean <= high + math.ulp(high)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.floats(0, 100))
def test_percentiles_are_finite_and_within_the_values(values, q):
    ordered = sorted(values)
    assert ordered[0] <= percentile(ordered, q) <= ordered[-1]


def test_ordinary_values_give_the_same_bits_as_the_plain_formulas():
    values = [0.1 * i + 1e-3 * (i % 7) for i in range(100)]
    plain_mean = math.fsum(values) / len(values)
    plain_stddev = math.sqrt(math.fsum((v - plain_mean) ** 2 for v in values) / len(values))
    assert mean_and_pstdev(values) == (plain_mean, plain_stddev)


def test_two_huge_values_of_opposite_sign_have_a_finite_stddev():
    mean, stddev = mean_and_pstdev([1.7e308, -1.7e308])
    assert mean == 0.0 and stddev == 1.7e308


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_window_aggregates_are_finite_or_none_and_the_histogram_counts_every_point(values):
    points = [WindowPoint(T0 + i, i, v) for i, v in enumerate(values)]
    aggregates = window_aggregates(points, AGGREGATIONS)
    for name, value in aggregates.items():
        if name == "histogram":
            histogram = json.loads(value)
            assert sum(histogram["counts"]) == len(values)
            assert all(math.isfinite(edge) for edge in histogram["edges"])
        elif name == "sum":
            assert value is None or math.isfinite(value)
        else:
            assert math.isfinite(value), name


def test_a_window_sum_beyond_the_float_range_is_none_and_its_mean_is_still_exact():
    aggregates = window_aggregates([WindowPoint(T0, 1, 1.7e308), WindowPoint(T0 + 1, 2, 1.7e308)], ["sum", "mean"])
    assert aggregates == {"sum": None, "mean": 1.7e308}


@settings(max_examples=300, deadline=None)
@given(VALUES, st.floats(0, 1e6), st.sampled_from(["greater", "less", "greater_or_equal", "less_or_equal"]))
def test_stddev_bounds_are_finite_or_the_value_is_unchecked(history, k, comparison):
    bounds = compute_bounds(SuccessCondition(comparison, stddevs_from_mean=k), history)
    if bounds is not None:
        assert all(b is None or math.isfinite(b) for b in (bounds.lower, bounds.upper))


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_run_aggregates_are_finite(values):
    aggregate = TagAggregate.of_batch(values, [T0 + i for i in range(len(values))], list(range(len(values))))
    for strategy in ("final", "min", "max", "average"):
        assert math.isfinite(aggregate.value_of(strategy)[0])
