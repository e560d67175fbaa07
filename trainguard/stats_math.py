"""Percentiles and moments, defined once for the trainer's ``Stat`` and the pipeline (``core.stats``).

Standard library only: trainers install it without the pipeline, and the
pipeline's Beam-free core imports it like the wire contract.

Any finite input gives a finite result. Values near the top of the float range
(a perplexity of exp(400), 1.7e308) would overflow a plain sum or a square, so
such batches are scaled by a power of two first: exact, and the same rounding
steps as the plain formulas, so ordinary values give the same bits as before.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

_SAFE_EXPONENT = 500
"""Below 2**500 in magnitude, sums of up to 2**500 values and squares of differences stay finite."""


def _scale_exponent(values: Sequence[float]) -> int:
    """0 when the plain formulas are safe, else the power of two that brings every value below 1."""
    largest = max((abs(v) for v in values), default=0.0)
    exponent = math.frexp(largest)[1]
    return exponent if exponent > _SAFE_EXPONENT else 0


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating linearly (numpy's default)."""
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    gap = ordered[high] - ordered[low]
    if math.isinf(gap):  # the two neighbours straddle most of the float range
        return ordered[low] * (1.0 - fraction) + ordered[high] * fraction
    return ordered[low] + gap * fraction


def moments(values: Sequence[float]) -> Tuple[int, float, float]:
    """(count, mean, sum of squared deviations from the mean), by two exact-sum passes.

    The sum of squared deviations can exceed the float range for huge values
    (it is ``inf`` then); ``mean_and_pstdev`` never overflows.
    """
    n = len(values)
    exponent = _scale_exponent(values)
    scaled = [math.ldexp(v, -exponent) for v in values] if exponent else values
    mean = math.fsum(scaled) / n
    squares = math.fsum((v - mean) ** 2 for v in scaled)
    if not exponent:
        return n, mean, squares
    try:
        return n, math.ldexp(mean, exponent), math.ldexp(squares, 2 * exponent)
    except OverflowError:
        return n, math.ldexp(mean, exponent), math.inf


def mean_and_pstdev(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and population standard deviation; both finite for any finite values."""
    n = len(values)
    exponent = _scale_exponent(values)
    scaled = [math.ldexp(v, -exponent) for v in values] if exponent else values
    mean = math.fsum(scaled) / n
    stddev = math.sqrt(math.fsum((v - mean) ** 2 for v in scaled) / n)
    return math.ldexp(mean, exponent), math.ldexp(stddev, exponent)
