"""Order-independent aggregates of one tag's points: pure maths.

Every operation is commutative and ties are broken on content (time, then step,
then value), and the sum behind ``average`` is exact (an integer in units of
the smallest double), so that any order and any batching of the same points
yields the same bits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

from core.registry import record
from core.stats import exact_batch_units, exact_mean

NO_STEP = -1  # orders below any real step


@record("TagAggregate")
@dataclasses.dataclass
class TagAggregate:
    """Running aggregates of one tag; each extreme is kept with its (time, step).

    Every tuple orders -0.0 before 0.0 (by the value's sign), so that even a tie
    between the two zeros is broken the same way whatever the order of arrival.
    """
    count: int
    units: int
    min: Tuple[float, float, float, int]    # (value, sign, time, step): smallest value, then earliest
    max: Tuple[float, float, float, int]    # (value, sign, -time, -step): largest value, then earliest
    final: Tuple[float, int, float, float]  # (time, step, value, sign): latest time, then highest step
    first_reach: Optional[Tuple[float, int]] = None  # (time, step) of first value >= accuracy threshold

    @staticmethod
    def of_batch(values: List[float], times: List[float], steps: List[int]) -> TagAggregate:
        """Aggregates of one batch of points of a tag (all lists the same length)."""
        # Each extreme is found by C-speed list methods; only a tie (e.g. 0.0 and -0.0, or two points at the
        # same time) walks the points to break it on content.
        low, high, latest = min(values), max(values), max(times)
        if values.count(low) == 1:
            i = values.index(low)
            smallest = (low, _sign(low), times[i], steps[i])
        else:
            smallest = min((v, _sign(v), t, s) for v, t, s in zip(values, times, steps) if v == low)
        if values.count(high) == 1:
            i = values.index(high)
            largest = (high, _sign(high), -times[i], -steps[i])
        else:
            largest = max((v, _sign(v), -t, -s) for v, t, s in zip(values, times, steps) if v == high)
        if times.count(latest) == 1:
            i = times.index(latest)
            final = (latest, steps[i], values[i], _sign(values[i]))
        else:
            final = max((t, s, v, _sign(v)) for v, t, s in zip(values, times, steps) if t == latest)
        return TagAggregate(count=len(values), units=exact_batch_units(values), min=smallest, max=largest,
                            final=final)

    def copied(self) -> TagAggregate:
        """A copy that changes apart from this one (every field is immutable, so a field-for-field copy is
        whole; ``copy.copy`` took several times longer, once per tag and message)."""
        return TagAggregate(self.count, self.units, self.min, self.max, self.final, self.first_reach)

    def merged(self, other: TagAggregate) -> TagAggregate:
        """A new aggregate of both; neither changes."""
        result = self.copied()
        result.merge(other)
        return result

    def merge(self, other: TagAggregate) -> None:
        self.count += other.count
        self.units += other.units
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.final = max(self.final, other.final)
        if other.first_reach is not None:
            self.reach(*other.first_reach)

    def reach(self, time: float, step: int) -> None:
        if self.first_reach is None or (time, step) < self.first_reach:
            self.first_reach = (time, step)

    def value_of(self, strategy: str) -> Tuple[float, Optional[int]]:
        """(value, step) for one aggregation strategy."""
        if strategy == "final":
            return self.final[2], step_or_none(self.final[1])
        if strategy == "min":
            return self.min[0], step_or_none(self.min[3])
        if strategy == "max":
            return self.max[0], step_or_none(-self.max[3])
        if strategy == "average":
            return exact_mean(self.units, self.count), None
        raise ValueError(f"unknown aggregation strategy {strategy!r}")


def _sign(value: float) -> float:
    return math.copysign(1.0, value)


def step_or_none(step: int) -> Optional[int]:
    return None if step == NO_STEP else step
