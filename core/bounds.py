"""Regression bounds from a success condition and a metric's history: pure maths.

``fixed_value`` v:      greater* -> (v, +inf); less* -> (-inf, v); equal -> (v, v)
``stddevs_from_mean`` k: greater* -> (mean - k*std, +inf); less* -> (-inf, mean + k*std)
with the population standard deviation of the history. Within bounds is strict
(lo < x < hi) unless the comparison contains ``equal``, which makes it inclusive.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from core.config import SuccessCondition
from core.stats import mean_and_pstdev


@dataclasses.dataclass(frozen=True)
class Bounds:
    lower: Optional[float]  # None: unbounded below
    upper: Optional[float]  # None: unbounded above


def compute_bounds(condition: SuccessCondition, history: Sequence[float]) -> Optional[Bounds]:
    """Bounds for the next value, or None while the history is too short to judge."""
    if len(history) < condition.wait_for_n_points_of_history:
        return None
    comparison = condition.comparison
    if condition.fixed_value is not None:
        v = condition.fixed_value
        if comparison == "equal":
            return Bounds(v, v)
        return Bounds(v, None) if comparison.startswith("greater") else Bounds(None, v)
    if not history or condition.stddevs_from_mean is None:
        return None
    mean, std = mean_and_pstdev(history)
    margin = condition.stddevs_from_mean * std
    bound = mean - margin if comparison.startswith("greater") else mean + margin
    if not math.isfinite(bound):
        return None  # k stddevs of a history near the top of the float range: not a bound, so unchecked
    return Bounds(bound, None) if comparison.startswith("greater") else Bounds(None, bound)


def is_within(value: float, bounds: Bounds, comparison: str) -> bool:
    inclusive = "equal" in comparison
    lower, upper = bounds.lower, bounds.upper
    if lower is not None and not (lower <= value if inclusive else lower < value):
        return False
    return upper is None or (value <= upper if inclusive else value < upper)
