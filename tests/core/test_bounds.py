import math
import statistics

import numpy as np
import pytest

from core.bounds import Bounds, RecentValue, compute_bounds, false_alert_multiplier, is_within, judge
from core.config import Comparison, SuccessCondition
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
    assert compute_bounds(stddevs("greater", 1.5), history) == Bounds(2.0, None, 5.0, 8.0)
    assert compute_bounds(stddevs("less_or_equal", 1.5), history) == Bounds(None, 8.0, 5.0, 2.0)


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
    assert is_within(value, bounds, Comparison(comparison)) is within


def test_zero_deviation_is_never_out_of_bounds_even_for_a_constant_history():
    bounds = compute_bounds(stddevs("less", 3), [90.0, 90.0, 90.0])
    assert bounds == Bounds(None, 90.0, 90.0, 90.0)
    assert is_within(90.0, bounds, Comparison.LESS) and is_within(90.0, bounds, Comparison.GREATER)
    assert not is_within(90.5, bounds, Comparison.LESS)  # a constant that moves is a change
    assert is_within(10.0, compute_bounds(stddevs("less", 0), [9.0, 10.0, 11.0]), Comparison.LESS)  # k = 0: the mean


def mads(comparison, k, wait=0, **effects):
    return SuccessCondition(comparison, mads_from_median=k, wait_for_n_points_of_history=wait, **effects)


def test_mads_from_median_centre_on_the_median_with_1_4826_mad():
    history = [1.0, 2.0, 3.0, 4.0, 100.0]  # median 3, MAD 1: the outlier moves neither
    assert compute_bounds(mads("less", 2), history) == Bounds(None, 3.0 + 2 * 1.4826, 3.0, 3.0 - 2 * 1.4826)
    assert compute_bounds(mads("greater", 2), history) == Bounds(3.0 - 2 * 1.4826, None, 3.0, 3.0 + 2 * 1.4826)


def test_a_mostly_constant_history_falls_back_to_the_mean_absolute_deviation():
    history = [100.0] * 8 + [101.0, 99.0]  # MAD 0: the two different seconds still give a scale
    bounds = compute_bounds(mads("less", 3), history)
    assert bounds == Bounds(None, 100.0 + 3 * 1.2533 * 0.2, 100.0, 100.0 - 3 * 1.2533 * 0.2)
    assert is_within(100.7, bounds, Comparison.LESS) and not is_within(101.0, bounds, Comparison.LESS)


def test_min_effect_keeps_tiny_deviations_of_stable_metrics_quiet():
    condition = mads("greater", 3, min_effect_abs=0.5, min_effect_rel=0.01)
    bounds = compute_bounds(condition, [76.0, 76.01, 75.99, 76.0])
    assert not is_within(75.8, bounds, Comparison.GREATER)
    assert judge(75.8, bounds, condition)           # 0.2 from the median: below min_effect_abs
    assert not judge(75.0, bounds, condition)       # 1.0 away, and more than 1% of 76
    relative_only = mads("greater", 3, min_effect_rel=0.02)
    assert judge(75.0, bounds, relative_only) and not judge(74.0, bounds, relative_only)


def test_fixed_values_have_no_centre_and_keep_their_strict_meaning():
    bounds = compute_bounds(fixed("greater", 70.0, wait=0), [70.0, 70.0])
    assert bounds.centre is None and not is_within(70.0, bounds, Comparison.GREATER)
    assert judge(69.9, bounds, SuccessCondition("greater", fixed_value=70.0, min_effect_abs=0.5))


def test_false_alert_rate_needs_a_minimum_history_and_widens_for_small_ones():
    condition = SuccessCondition("less", false_alert_rate=0.001)
    assert compute_bounds(condition, [1.0, 2.0, 3.0]) is None
    history = np.random.default_rng(2).standard_normal(200).tolist()
    narrow = compute_bounds(condition, history).upper
    wide = compute_bounds(condition, history[:10]).upper
    assert wide > narrow > max(history)


def test_false_alert_multiplier_grows_with_rarer_alerts_and_shorter_histories():
    assert false_alert_multiplier(30, 0.0001) > false_alert_multiplier(30, 0.001)
    assert false_alert_multiplier(12, 0.001) > false_alert_multiplier(30, 0.001)
    assert false_alert_multiplier(1000, 0.001) == false_alert_multiplier(200, 0.001)


def test_no_history_size_makes_a_false_alert_cutoff_blind():
    """At most 12 noise scales for the 5 to 200 values a history holds, at a budget's usual rates (the
    tail-weighted fit this replaced reached hundreds at n = 12)."""
    for n in range(10, 201):
        for rate in (0.0003, 0.001, 0.002, 0.005):
            assert false_alert_multiplier(n, rate) < 12 * (1 + 10 / n), (n, rate)


def test_a_young_level_borrows_the_scale_of_the_level_before_it():
    condition = SuccessCondition("greater", false_alert_rate=0.002, wait_for_n_points_of_history=10)
    rng = np.random.default_rng(5)
    older = (100 + rng.standard_normal(40)).tolist()
    young = (90 + rng.standard_normal(3)).tolist()
    bounds = compute_bounds(condition, young, older)
    assert bounds.centre == sorted(young)[1]
    assert 4 < bounds.centre - bounds.lower < 12  # a few values alone would need tens of noise scales
    alone = compute_bounds(condition, (90 + rng.standard_normal(10)).tolist())
    pooled = compute_bounds(condition, (90 + rng.standard_normal(10)).tolist(), older)
    assert pooled.centre - pooled.lower < alone.centre - alone.lower


def test_a_pooled_scale_follows_the_level_of_noise_that_scales_with_it():
    condition = SuccessCondition("less", false_alert_rate=0.002)
    rng = np.random.default_rng(6)
    older = (1.0 + 0.02 * rng.standard_normal(40)).tolist()
    young = (1.5 + 0.03 * rng.standard_normal(5)).tolist()
    bounds = compute_bounds(condition, young, older)
    same_scale = compute_bounds(condition, young, [v * 1.5 for v in older])
    assert bounds.upper == pytest.approx(same_scale.upper, rel=0.05)


# -- a second mode on the bad side (two machine types, no history_by) -------------------------------------


def two_modes(fast, slow, seed):
    rng = np.random.default_rng(seed)
    return list(10 + 0.1 * rng.standard_normal(fast)) + list(12.5 + 0.1 * rng.standard_normal(slow))


RATE = SuccessCondition("less", false_alert_rate=0.002)


def test_a_second_mode_in_the_history_moves_the_cutoff_past_it():
    """Median in the fast mode: the cutoff around it alone would put the slow runs out of bounds; a fifth of
    the history there is a mode, and the cutoff is measured from its median; the improvement side stays."""
    history = two_modes(24, 16, seed=1)
    alone = compute_bounds(RATE, history[:24])
    bounds = compute_bounds(RATE, history)
    assert bounds.centre < 10.2 and bounds.upper > 12.5 + (alone.upper - alone.centre) * 0.9
    # the improvement side is not widened by the distance to the slow mode
    assert (bounds.upper - bounds.centre) - (bounds.centre - bounds.improvement) == pytest.approx(
        statistics.median(history[24:]) - bounds.centre)


def test_a_mode_out_of_bounds_since_the_warm_up_is_learned_from_the_latest_runs_not_a_streak():
    """A slow mode the warm-up missed never joins the history (out of bounds each time): four of the latest
    twenty runs among in-bounds ones make it a mode; the same four in a row at the end are a change (left to
    rebaseline_after), and three among twenty stay faults."""
    history = two_modes(30, 0, seed=2)
    plain = compute_bounds(RATE, history)

    def recent(pattern):
        return [RecentValue(12.5, False) if bad else RecentValue(10.0, True) for bad in pattern]
    interleaved = recent([0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    assert compute_bounds(RATE, history, recent=interleaved).upper > 12.5
    assert compute_bounds(RATE, history, recent=recent([0] * 16 + [1] * 4)) == plain
    assert compute_bounds(RATE, history, recent=interleaved[:-9] + [RecentValue(10.0, True)] * 9) == plain


def test_one_mode_histories_are_not_widened():
    """Healthy heavy-tailed noise never holds a tenth of its values beyond its own cutoff."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        history = list(10 + 0.1 * rng.standard_t(3, size=int(rng.integers(10, 80))))
        bounds = compute_bounds(RATE, history)
        counted = [value for value in history if value < bounds.upper]
        recent = [RecentValue(v, True) for v in counted]
        assert compute_bounds(RATE, counted) == compute_bounds(RATE, counted, recent=recent)
