"""Statistics every part of trainguard computes the same way: one definition each.

Percentiles and moments are defined once in ``trainguard.stats_math`` (the trainer's
``Stat`` needs them too, and trainers install without the pipeline) and re-exported here.

Sums are exact (``math.fsum``, or an integer in units of the smallest double),
so results do not depend on the order values arrive in.
"""

from __future__ import annotations

import math
from typing import List

from trainguard.stats_math import mean_and_pstdev, percentile

__all__ = ["exact_batch_units", "exact_mean", "exact_units", "mean_and_pstdev", "percentile"]

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
