"""Regression bounds from a success condition and a metric's history: pure maths.

One condition language for run-level conditions and window checks:

``fixed_value`` v:        greater* -> (v, +inf); less* -> (-inf, v); equal -> (v, v)
``stddevs_from_mean`` k:  centre = mean, scale = population stddev; greater* -> (centre - k*scale, +inf) ...
``mads_from_median`` k:   centre = median, scale = 1.4826*MAD (``core.stats.robust_scale``)
``false_alert_rate`` p:   centre = median, scale = 2.2219·Qn (``core.stats.false_alert_scale``, a robust
                          scale twice as efficient as the MAD); the multiplier is calibrated for the history
                          size n so that a healthy value of heavy-tailed noise passes the cutoff with
                          probability p (``false_alert_multiplier``; or normal noise, for a condition that
                          declares ``"noise": "normal"``); a young level pools its scale with
                          the level before it (``compute_bounds``)

Within bounds is strict (lo < x < hi) unless the comparison contains ``equal``,
which makes it inclusive (``Comparison.inclusive``). A value equal to the centre of a statistical
threshold is always within, also when the history never varied (a constant
metric does not alert on itself). An out-of-bounds value only counts as a
regression when it is at least ``min_effect_abs`` away from the reference (the
centre, or the fixed value) and ``min_effect_rel`` times the reference's
magnitude (:func:`judge`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from core import false_alert_calibration as calibration
from core.config import HEAVY_TAILED, NORMAL, Comparison, SuccessCondition
from core.stats import false_alert_scale, mean_and_pstdev, median, robust_scale

# a calibrated cutoff needs at least this many values
MIN_FALSE_ALERT_HISTORY = min(calibration.N_GRID_ODD[0], calibration.N_GRID_EVEN[0])


@dataclasses.dataclass(frozen=True)
class Bounds:
    lower: Optional[float]  # None: unbounded below
    upper: Optional[float]  # None: unbounded above
    centre: Optional[float] = None  # the centre of a statistical threshold; None for fixed values
    # A one-sided statistical threshold's mirror: beyond it a value is an improvement (``stored_bounds``).
    improvement: Optional[float] = None


class RecentValue(NamedTuple):
    """One of a level's latest values, and whether it counted (joined the history: it was not out of bounds)."""
    value: float
    counted: bool


def compute_bounds(condition: SuccessCondition, history: Sequence[float],
                   previous: Sequence[float] = (), recent: Sequence[RecentValue] = ()) -> Optional[Bounds]:
    """Bounds for the next value, or None while the history is too short to judge.

    ``previous`` is the history before the metric's baseline last moved
    (``core.history``). For ``false_alert_rate``, while ``history`` holds fewer
    than ``POOLED_BELOW`` values the scale is pooled from both levels' deviations
    from their own medians (:func:`_pooled_margin`), so a re-baselined or accepted
    metric is checked from the first run after the change with the precision of
    its whole past, not of a few values. For the other thresholds, while
    ``history`` is still shorter than the condition needs, the centre comes from
    ``history`` and the scale from ``previous``, widened for the centre's own
    uncertainty. ``recent``: the level's latest values (``RecentValue``), also those left out of
    ``history`` for being out of bounds, which only tell a second mode (:func:`_beyond_second_mode`).
    """
    greater = condition.comparison.greater
    if condition.fixed_value is not None:
        if len(history) < condition.wait_for_n_points_of_history:
            return None
        v = condition.fixed_value
        if condition.comparison.is_equal:
            return Bounds(v, v)
        return Bounds(v, None) if greater else Bounds(None, v)
    needed = max(condition.wait_for_n_points_of_history, minimum_history(condition))
    if condition.false_alert_rate is not None and pools_levels(condition, history, previous):
        centre = median(history)
        margin = _pooled_margin(condition, history, centre, previous)
    elif len(history) >= needed:
        centre, margin = _centre_and_margin(condition, history)
    elif history and len(previous) >= needed:
        _, previous_margin = _centre_and_margin(condition, previous)
        centre = centre_of(condition, history)
        margin = previous_margin * math.sqrt(1 + _centre_variance(condition) / len(history))
    else:
        return None
    mirror = centre + margin if greater else centre - margin
    if condition.stddevs_from_mean is None:
        margin = _beyond_second_mode(condition, history, recent, centre, margin)
    bound = centre - margin if greater else centre + margin
    if not math.isfinite(bound):
        return None  # k scales of a history near the top of the float range: not a bound, so unchecked
    return Bounds(bound, None, centre, mirror) if greater else Bounds(None, bound, centre, mirror)


MODE_SHARE = 0.1  # a share of the history this large beyond a cutoff, or beyond an improvement, is a mode
MODE_SHARE_RECENT = 0.2  # ... or this share of the latest values, those out of bounds included
MODE_RECENT = 20  # ... of this many
MODE_MIN_VALUES = 3  # ... and at least this many values


def _beyond_second_mode(condition: SuccessCondition, history: Sequence[float],
                        recent: Sequence[RecentValue], centre: float, margin: float) -> float:
    """The margin of a median-centred cutoff, widened past a second mode of the history on the bad side.

    A test whose runs land on two machine types has a two-mode history; its median sits in whichever mode
    holds more of the latest runs and flips when the other does, and the cutoff around it would then put a
    whole mode out of bounds. It is a mode when ``MODE_SHARE`` of the history (and at least four times the
    false-alert rate: so many healthy values pass a loose cutoff by design) already lies beyond the cutoff,
    or ``MODE_SHARE_RECENT`` times ``MODE_RECENT`` of the level's latest ``MODE_RECENT`` values, those out of
    bounds included but for the ones in a row at the end (a mode the warm-up missed is out of bounds from its
    first run and would never join the history; a fault in fewer of the latest runs than that stays an alert
    each time, and a streak is a change, for ``rebaseline_after``). The cutoff is then measured from the
    median of the mode's values instead of the history's. A one-mode history of healthy runs never holds so
    many values beyond its own cutoff, so this costs no power there."""
    greater = condition.comparison.greater

    def beyond(value: float) -> bool:
        return value < centre - margin if greater else value > centre + margin
    latest = list(recent[-MODE_RECENT:])
    while latest and not latest[-1].counted:
        latest.pop()  # the runs out of bounds in a row at the end are a change, if anything (rebaseline_after)
    mode = [value for value in history if beyond(value)]
    excluded = [entry.value for entry in latest if not entry.counted and beyond(entry.value)]
    share = max(MODE_SHARE, 4 * (condition.false_alert_rate or 0.0))
    if not (len(mode) >= max(MODE_MIN_VALUES, share * len(history))
            or sum(beyond(entry.value) for entry in latest) >= MODE_SHARE_RECENT * MODE_RECENT):
        return margin
    return abs(median(mode + excluded) - centre) + margin


def stored_bounds(bounds: Optional[Bounds]) -> Tuple[Optional[float], Optional[float]]:
    """(lower, upper) as a metric's history row stores them: a one-sided statistical threshold's free side
    holds its improvement bound (the mirror of its cutoff), which the history follows (``core.history``)."""
    if bounds is None:
        return None, None
    if bounds.improvement is None or not math.isfinite(bounds.improvement):
        return bounds.lower, bounds.upper
    return (bounds.lower, bounds.improvement) if bounds.upper is None else (bounds.improvement, bounds.upper)


def is_improvement(value: float, stored: Tuple[Optional[float], Optional[float]], upward: Optional[bool]) -> bool:
    """Whether a value lies beyond the improvement side of its stored (lower, upper): above ``upper`` when a
    higher value is better (``upward``), below ``lower`` when a lower one is, never for a two-sided check
    (None). Decided from the stored pair alone, so the seed decides it as the running check did."""
    lower, upper = stored
    if upward is None:
        return False
    return upper is not None and value > upper if upward else lower is not None and value < lower


POOLED_BELOW = 30  # a false_alert_rate history shorter than this borrows the scale of the level before it
POOLED_LEVEL_RATIO = 2.0  # the older level's deviations follow the level's size within this factor
MEDIAN_VARIANCE = math.pi / 2  # the median of m values varies about this / m times as much as one value
OWN_SPREAD_FROM = 3  # a young level's own deviations join the pooled scale from this many values on


def pools_levels(condition: SuccessCondition, history: Sequence[float], previous: Sequence[float]) -> bool:
    """Whether a ``false_alert_rate`` cutoff measures its scale on both levels (``pooled_deviations``)."""
    needed = max(condition.wait_for_n_points_of_history, minimum_history(condition))
    pooled = (len(history) if len(history) >= OWN_SPREAD_FROM else 0) + len(previous)
    return (condition.false_alert_rate is not None and bool(history) and bool(previous)
            and len(history) < POOLED_BELOW and pooled >= needed)


def pooled_scale(history: Sequence[float], previous: Sequence[float]) -> float:
    """The scale of a young level measured with the one before it (see ``pooled_deviations``)."""
    return false_alert_scale(pooled_deviations(history, median(history), previous), 0.0)


def minimum_history(condition: SuccessCondition) -> int:
    """The fewest values a statistical threshold can be computed from."""
    return MIN_FALSE_ALERT_HISTORY if condition.false_alert_rate is not None else 1


def centre_of(condition: SuccessCondition, values: Sequence[float]) -> float:
    """The centre a statistical threshold measures from: the mean for stddevs_from_mean, else the median."""
    return mean_and_pstdev(values)[0] if condition.stddevs_from_mean is not None else median(values)


def _centre_variance(condition: SuccessCondition) -> float:
    """The variance of the centre of m values is about this / m times the noise's (mean: 1, median: pi/2)."""
    return 1.0 if condition.stddevs_from_mean is not None else MEDIAN_VARIANCE


def _centre_and_margin(condition: SuccessCondition, history: Sequence[float]) -> Tuple[float, float]:
    if condition.stddevs_from_mean is not None:
        mean, std = mean_and_pstdev(history)
        return mean, condition.stddevs_from_mean * std
    centre = median(history)
    if condition.mads_from_median is not None:
        return centre, condition.mads_from_median * robust_scale(history, centre)
    assert condition.false_alert_rate is not None
    scale = false_alert_scale(history, centre)
    if scale == 0:
        return centre, 0.0
    margin = false_alert_multiplier(len(history), condition.false_alert_rate, condition.noise) * scale
    return centre, max(margin, _range_floor(history, centre, condition.false_alert_rate))


def pooled_deviations(history: Sequence[float], centre: float, previous: Sequence[float]) -> List[float]:
    """The deviations a young level's scale is measured on: its own from its median (from ``OWN_SPREAD_FROM``
    values on: fewer say little of the spread) and the older level's from its median, in proportion to the two levels' sizes
    (noise that scales with the level, as loss and step time do, keeps its relative size across a change;
    the proportion is held within ``POOLED_LEVEL_RATIO``)."""
    previous_centre = median(previous)
    ratio = 1.0
    if centre and previous_centre and (centre > 0) == (previous_centre > 0):
        ratio = min(POOLED_LEVEL_RATIO, max(1 / POOLED_LEVEL_RATIO, centre / previous_centre))
    own = [value - centre for value in history] if len(history) >= OWN_SPREAD_FROM else []
    return own + [(value - previous_centre) * ratio for value in previous]


def _pooled_margin(condition: SuccessCondition, history: Sequence[float], centre: float,
                   previous: Sequence[float]) -> float:
    """The margin of a young level (see ``compute_bounds``): the calibrated multiplier of the pooled count
    times the pooled scale, widened for the young centre's own uncertainty."""
    rate = condition.false_alert_rate
    assert rate is not None
    deviations = pooled_deviations(history, centre, previous)
    scale = false_alert_scale(deviations, 0.0)
    if scale == 0:
        return _range_floor(history, centre, rate)
    n = len(deviations)
    widening = math.sqrt((1 + MEDIAN_VARIANCE / len(history)) / (1 + MEDIAN_VARIANCE / n))
    margin = false_alert_multiplier(n, rate, condition.noise) * scale * widening
    return max(margin, _range_floor(history, centre, rate))


def _range_floor(history: Sequence[float], centre: float, rate: float) -> float:
    """The least margin of a ``false_alert_rate`` cutoff: just beyond any deviation the history holds twice.

    A value that healthy runs produced at least twice is no rare event, so for a rate below
    1/(n + 1) (the chance that a healthy value passes the most extreme of n earlier ones,
    whatever the noise) the cutoff belongs beyond it. Continuous noise never repeats a
    value, so this binds only for quantized metrics (a few values repeating, whole seconds),
    which are lighter-tailed than the normal and Student-t noise the multiplier is
    calibrated on: there, the fitted light-tail side of the multiplier would put the cutoff
    inside the history's range and alert on values the history holds. One wild value, seen
    once, does not move it.
    """
    if len(history) < 2 or rate >= 1 / (len(history) + 1):
        return 0.0
    counts = collections.Counter(abs(value - centre) for value in history)
    repeated = [deviation for deviation, seen in counts.items() if seen >= 2]
    return max(repeated) * (1 + RANGE_FLOOR_SLACK) if repeated else 0.0


RANGE_FLOOR_SLACK = 1e-9  # strictly beyond: a value equal to the second most extreme one stays within


def false_alert_multiplier(n: int, rate: float, noise: str = HEAVY_TAILED) -> float:
    """How many scales (``core.stats.false_alert_scale``) from the median the cutoff of a history of ``n``
    values lies, for a one-sided false alert ``rate``: calibrated by ``scripts/calibrate_false_alert_rate.py``
    so that heavy-tailed (Student t, 3 degrees of freedom) noise passes it with probability ``rate``, averaged
    over histories; normal noise less often. With ``noise`` ``"normal"``, calibrated on normal noise instead:
    about half as far at the rates a budget gives, and heavy-tailed noise passes it several times as often.
    Between the fitted n (of the same parity) and p, ln c is interpolated in ln n and ln p; beyond them the
    nearest fitted value is used (for n above the largest, that is slightly conservative)."""
    i0, i1, wn = grid_bracket(_LOG_N[n % 2], math.log(n))
    j0, j1, wp = grid_bracket(_LOG_P, math.log(rate))
    table = _LOG_C[noise][n % 2]
    low = table[i0][j0] * (1 - wp) + table[i0][j1] * wp
    high = table[i1][j0] * (1 - wp) + table[i1][j1] * wp
    return math.exp(low * (1 - wn) + high * wn)


# Per parity of n (0: even, 1: odd): the median and Qn of odd and even counts behave differently.
_LOG_N = ([math.log(n) for n in calibration.N_GRID_EVEN], [math.log(n) for n in calibration.N_GRID_ODD])
_LOG_C = {noise: tuple([[math.log(c) for c in row] for row in table] for table in tables)
          for noise, tables in ((HEAVY_TAILED, (calibration.MULTIPLIERS_EVEN, calibration.MULTIPLIERS_ODD)),
                                (NORMAL, (calibration.NORMAL_MULTIPLIERS_EVEN, calibration.NORMAL_MULTIPLIERS_ODD)))}
_LOG_P = [math.log(p) for p in calibration.P_GRID]


def grid_bracket(grid: Sequence[float], x: float) -> Tuple[int, int, float]:
    """Indices around x in an ascending grid and x's weight towards the upper one (clamped at the ends)."""
    if x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        last = len(grid) - 1
        return last, last, 0.0
    upper = bisect.bisect_right(grid, x)
    lower = upper - 1
    return lower, upper, (x - grid[lower]) / (grid[upper] - grid[lower])


def is_within(value: float, bounds: Bounds, comparison: Comparison) -> bool:
    if bounds.centre is not None and value == bounds.centre:
        return True  # zero deviation is never a regression, whatever the spread
    inclusive = comparison.inclusive
    lower, upper = bounds.lower, bounds.upper
    if lower is not None and not (lower <= value if inclusive else lower < value):
        return False
    return upper is None or (value <= upper if inclusive else value < upper)


def reference(bounds: Bounds, condition: SuccessCondition) -> Optional[float]:
    """What a value's effect is measured from: the centre, or the fixed value."""
    return bounds.centre if bounds.centre is not None else condition.fixed_value


def is_significant(value: float, bounds: Bounds, condition: SuccessCondition) -> bool:
    """Whether an out-of-bounds value is far enough from the reference to count (min_effect_abs/rel)."""
    if not (condition.min_effect_abs or condition.min_effect_rel):
        return True
    ref = reference(bounds, condition)
    if ref is None:
        return True
    effect = abs(value - ref)
    return effect >= condition.min_effect_abs and effect >= condition.min_effect_rel * abs(ref)


def threshold_details(condition: SuccessCondition, bounds: Bounds) -> Dict[str, Any]:
    """What an alert says about the threshold it broke: {"threshold": kind, kind: value, "centre": ...}."""
    kind, value = condition.threshold
    details: Dict[str, Any] = {"threshold": kind, kind: value}
    if bounds.centre is not None:
        details["centre"] = bounds.centre
    return details


def judge(value: float, bounds: Bounds, condition: SuccessCondition) -> bool:
    """True when the value is within bounds or out by less than the minimum effect; False: a regression."""
    return is_within(value, bounds, condition.comparison) or not is_significant(value, bounds, condition)
