import math

import pytest

from core.bounds import Bounds, compute_bounds, is_within
from core.config import SuccessCondition
from core.stats import mean_and_pstdev


def fixed(comparison, v, wait=0):
    return SuccessCondition(comparison, fixed_value=v, wait_for_n_points_of_history=wait)


def stddevs(comparison, k, wait=0):
    return SuccessCondition(comparison, stddevs_from_mean=k, wait_for_n_points_of_history=wait)


@pytest.mark.parametrize("comparison, expected", [
    ("greater", Bounds(5.0, None)), ("greater_or_equal", Bounds(5.0, None)),
    ("less", Bounds(None, 5.0)), ("less_or_equal", Bounds(None, 5.0)), ("equal", Bounds(5.0, 5.0))])
def test_fixed_value_bounds(comparison, expected):
    assert compute_bounds(fixed(comparison, 5.0), []) == expected


def test_stddev_bounds_use_population_stddev():
    history = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]  # mean 5, population std 2
    assert mean_and_pstdev(history) == (5.0, 2.0)
    assert compute_bounds(stddevs("greater", 1.5), history) == Bounds(2.0, None)
    assert compute_bounds(stddevs("less_or_equal", 1.5), history) == Bounds(None, 8.0)


def test_no_history_no_stddev_bounds():
    assert compute_bounds(stddevs("less", 2), []) is None


def test_wait_for_history_applies_to_both_kinds():
    assert compute_bounds(fixed("less", 1.0, wait=3), [1.0, 2.0]) is None
    assert compute_bounds(fixed("less", 1.0, wait=2), [1.0, 2.0]) == Bounds(None, 1.0)
    assert compute_bounds(stddevs("less", 1.0, wait=3), [1.0, 2.0]) is None


@pytest.mark.parametrize("value, bounds, comparison, within", [
    (5.0, Bounds(5.0, None), "greater", False),
    (5.0, Bounds(5.0, None), "greater_or_equal", True),
    (5.1, Bounds(5.0, None), "greater", True),
    (5.0, Bounds(None, 5.0), "less", False),
    (5.0, Bounds(None, 5.0), "less_or_equal", True),
    (5.0, Bounds(5.0, 5.0), "equal", True),
    (5.0000001, Bounds(5.0, 5.0), "equal", False),
    (-math.inf, Bounds(None, 5.0), "less", True),
])
def test_within_is_strict_unless_equal(value, bounds, comparison, within):
    assert is_within(value, bounds, comparison) is within


def test_zero_variance_history_with_strict_comparison_rejects_the_mean():
    bounds = compute_bounds(stddevs("less", 3), [10.0, 10.0, 10.0])
    assert bounds == Bounds(None, 10.0)
    assert not is_within(10.0, bounds, "less") and is_within(10.0, bounds, "less_or_equal")
