"""Percentiles and moments, defined once for the trainer's ``Stat`` and the pipeline (``core.stats``).

Standard library only: trainers install it without the pipeline, and the
pipeline's Beam-free core imports it like the wire contract.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating linearly (numpy's default)."""
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def moments(values: Sequence[float]) -> Tuple[int, float, float]:
    """(count, mean, sum of squared deviations from the mean), by two exact-sum passes."""
    n = len(values)
    mean = math.fsum(values) / n
    return n, mean, math.fsum((v - mean) ** 2 for v in values)


def mean_and_pstdev(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and population standard deviation."""
    n, mean, squares = moments(values)
    return mean, math.sqrt(squares / n)
