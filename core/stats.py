"""Statistics every part of trainguard computes the same way: one definition each.

Percentiles and moments are defined once in ``trainguard.stats_math`` (the trainer's
``Stat`` needs them too, and trainers install without the pipeline) and re-exported here.

Sums are exact (``math.fsum``, or an integer in units of the smallest double),
so results do not depend on the order values arrive in.
"""

from __future__ import annotations

import math
from typing import List, Sequence

from trainguard.stats_math import mean_and_pstdev, percentile

__all__ = ["exact_batch_units", "exact_mean", "exact_units", "mean_and_pstdev", "median", "percentile", "robust_scale",
           "tail_weight"]

# Every finite double is an integer multiple of 2**-1074.
_SUM_SHIFT = 1074


def exact_units(value: float) -> int:
    """``value`` as an exact integer number of 2**-1074 units."""
    numerator, denominator = value.as_integer_ratio()
    return numerator << (_SUM_SHIFT + 1 - denominator.bit_length())


def exact_batch_units(values: List[float]) -> int:
    """The exact sum of ``values`` in 2**-1074 units, with C-speed ``math.fsum`` passes.

    ``fsum`` is correctly rounded, so ``values - s`` summed again gives the exact
    remainder's rounding, and so on: a few passes split the exact sum into a
    handful of doubles, each converted exactly. Falls back to one conversion
    per value when an intermediate sum overflows.
    """
    parts: List[float] = []
    try:
        for _ in range(64):
            part = math.fsum(values + [-p for p in parts])
            if part == 0.0:
                return sum(map(exact_units, parts))
            parts.append(part)
    except OverflowError:
        pass
    return sum(map(exact_units, values))


def exact_mean(units: int, count: int) -> float:
    """The correctly rounded mean of values whose exact sum is ``units``."""
    return units / (count << _SUM_SHIFT)


MAD_TO_SIGMA = 1.4826  # 1.4826·MAD estimates the standard deviation of normal noise
MEAN_AD_TO_SIGMA = 1.2533  # so does 1.2533·(mean absolute deviation): sqrt(pi/2)


def median(values: Sequence[float]) -> float:
    """The median (the mean of the two middle values for an even count); ``values`` must not be empty."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return low + (high - low) / 2 if math.isfinite(high - low) else low / 2 + high / 2


def robust_scale(values: Sequence[float], centre: float) -> float:
    """1.4826·MAD around ``centre``; when more than half the values equal the centre (MAD = 0),
    1.2533·(mean absolute deviation) instead, so that a mostly constant metric with a few
    different values still has a scale. 0 only when every value equals the centre."""
    deviations = [abs(v - centre) for v in values]
    mad = median(deviations)
    if mad > 0:
        return MAD_TO_SIGMA * mad
    return MEAN_AD_TO_SIGMA * (math.fsum(deviations) / len(deviations))


TAIL_WEIGHT_RANGE = (0.5, 2.5)  # beyond these the statistic says nothing more, so it is clamped


def tail_weight(values: Sequence[float], centre: float, scale: float) -> float:
    """How heavy the tails of ``values`` look: the root mean square deviation from ``centre``
    over ``scale``, leaving out the largest deviation. About 1 for normal noise, larger for
    heavy tails; one wild value (a regression that slipped into the history) does not move
    it. Clamped to ``TAIL_WEIGHT_RANGE``; 1 when ``scale`` is 0."""
    if scale <= 0:
        return 1.0
    deviations = sorted(abs(v - centre) for v in values)
    kept = deviations[:-1] or deviations
    rms = math.sqrt(math.fsum(d * d for d in kept) / len(kept))
    low, high = TAIL_WEIGHT_RANGE
    return min(high, max(low, rms / scale))
