"""Client-side aggregation of a metric over count or time windows.

``Stat("step_time_ms", ["mean", "p99"], window=100)`` collects values with
``add(value, step=None)`` and, each time a window closes, publishes one point
per aggregation (``step_time_ms.mean``, ``step_time_ms.p99``) plus the
window's sample count (``step_time_ms.count``) through a metric stream.

Windows: ``window=100`` closes after 100 samples; ``window=timedelta(seconds=30)``
(or ``Window(seconds=30)``) closes when a sample arrives 30 s or more after the
window's first sample (that sample opens the next window), or on ``flush()``;
``Window(count=100, seconds=30)`` closes on whichever comes first. Open windows
are flushed at interpreter exit. Non-finite values are not samples: they are
counted and reported as ``<name>.nonfinite`` when a window has any.

Aggregations: ``mean``, ``min``, ``max``, ``sum``, ``count``, ``stddev``
(population), and percentiles ``pQ`` for 0 <= Q <= 100 (``p50``, ``p99.9``;
linear interpolation, numpy's default). A window of more than ``max_samples``
samples keeps exact count, sum, mean, min, max and stddev, and computes
percentiles from a uniform reservoir sample of ``max_samples`` values.

A Stat is not thread-safe: use one per thread.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import random
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

from . import lifecycle
from .metrics import api
from .stats_math import moments as _moments
from .stats_math import percentile

_PERCENTILE = re.compile(r"^p(\d{1,3}(?:\.\d+)?)$")
_SIMPLE = ("mean", "min", "max", "sum", "count", "stddev")


@dataclasses.dataclass(frozen=True)
class Window:
    """Closes after ``count`` samples and/or ``seconds`` after its first sample."""
    count: Optional[int] = None
    seconds: Optional[float] = None

    def __post_init__(self):
        if self.count is None and self.seconds is None:
            raise ValueError("a window needs a count, seconds, or both")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int)
                                       or self.count < 1):
            raise ValueError(f"window count must be a positive integer, got {self.count!r}")
        if self.seconds is not None and not (isinstance(self.seconds, (int, float)) and self.seconds > 0):
            raise ValueError(f"window seconds must be positive, got {self.seconds!r}")


WindowSpec = Union[int, datetime.timedelta, Window]


def as_window(window: WindowSpec) -> Window:
    if isinstance(window, Window):
        return window
    if isinstance(window, datetime.timedelta):
        return Window(seconds=window.total_seconds())
    if isinstance(window, int) and not isinstance(window, bool):
        return Window(count=window)
    raise TypeError(f"window must be an int (samples), a timedelta or a Window, got {window!r}")


def _aggregation_name(aggregation: Any) -> str:
    name = getattr(aggregation, "name", aggregation)  # e.g. torch.monitor.Aggregation.MEAN
    if not isinstance(name, str):
        raise TypeError(f"aggregation must be a string, got {aggregation!r}")
    name = name.lower()
    match = _PERCENTILE.match(name)
    if name not in _SIMPLE and not (match and 0 <= float(match.group(1)) <= 100):
        raise ValueError(f"unknown aggregation {aggregation!r}: use {', '.join(_SIMPLE)} or pQ (0 <= Q <= 100)")
    return name


def _combine(a: Tuple[int, float, float], b: Tuple[int, float, float]) -> Tuple[int, float, float]:
    """Merges two (count, mean, M2) summaries (Chan et al.)."""
    n = a[0] + b[0]
    delta = b[1] - a[1]
    return n, a[1] + delta * b[0] / n, a[2] + b[2] + delta * delta * a[0] * b[0] / n


class Stat:
    """Aggregates values client-side and publishes each closed window (see module doc)."""

    def __init__(self, name: str, aggregations: Sequence[Any] = ("mean",), window: WindowSpec = 100, *,
                 group: str = api.DEFAULT_GROUP, stream: Optional[api.MetricStream] = None,
                 max_samples: int = 10_000, clock: Callable[[], float] = time.time):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if max_samples < 1:
            raise ValueError("max_samples must be positive")
        self.name = name
        self.aggregations: Tuple[str, ...] = tuple(dict.fromkeys(_aggregation_name(a) for a in aggregations))
        self.window = as_window(window)
        self.group = group
        self._stream = stream
        self.max_samples = max_samples
        self._clock = clock
        self._count_limit = self.window.count
        self._seconds = self.window.seconds
        self._tags = {agg: f"{name}.{agg}" for agg in self.aggregations + ("count", "nonfinite")}
        self.last: Dict[str, float] = {}
        """The aggregations of the last closed window (with ``count``)."""
        self.windows_closed = 0
        self.invalid = 0
        self._reset(None)
        lifecycle.on_exit(self.flush, lifecycle.PRIORITY_STATS)

    def _reset(self, start: Optional[float]) -> None:
        self._values: List[float] = []
        self._n = 0
        self._nonfinite = 0
        self._step: Optional[int] = None
        self._start = start
        self._last_time = start
        self._overflow: Optional[Tuple[int, float, float]] = None  # exact moments once sampling
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add(self, value: Any, step: Optional[int] = None) -> None:
        """Adds one sample; closes the window if it is complete. Never raises."""
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            self.invalid += 1
            return
        now = None
        if self._seconds is not None:
            now = self._clock()
            if self._start is None:
                self._start = now
            elif now - self._start >= self._seconds:
                self._close(cast(float, self._last_time))  # set with _start
                self._start = now
            self._last_time = now
        if v - v != 0.0:
            self._nonfinite += 1
            return
        if step is not None:
            self._step = step
        self._n += 1
        values = self._values
        if len(values) < self.max_samples:
            values.append(v)
        else:
            self._add_beyond_reservoir(v)
        if self._count_limit is not None and self._n >= self._count_limit:
            self._close(now if now is not None else self._clock())
            self._start = None

    def _add_beyond_reservoir(self, v: float) -> None:
        if self._overflow is None:  # the list is about to become a sample: keep its exact summary
            values = self._values
            self._overflow = _moments(values)
            self._sum, self._min, self._max = math.fsum(values), min(values), max(values)
        self._overflow = _combine(self._overflow, (1, v, 0.0))
        self._sum += v
        self._min = min(self._min, v)
        self._max = max(self._max, v)
        slot = random.randrange(self._n)
        if slot < self.max_samples:
            self._values[slot] = v

    def flush(self) -> None:
        """Closes the current window now if it holds anything."""
        if self._n or self._nonfinite:
            self._close(self._last_time if self._last_time is not None else self._clock())
            self._start = None

    def _aggregate(self) -> Dict[str, float]:
        values = self._values
        if self._overflow is None:
            n, mean, m2 = _moments(values)
            total, low, high = math.fsum(values), min(values), max(values)
        else:
            (n, mean, m2), total, low, high = self._overflow, self._sum, self._min, self._max
        result: Dict[str, float] = {}
        ordered: Optional[List[float]] = None
        for agg in self.aggregations:
            if agg == "mean":
                result[agg] = mean
            elif agg == "min":
                result[agg] = low
            elif agg == "max":
                result[agg] = high
            elif agg == "sum":
                result[agg] = total
            elif agg == "count":
                result[agg] = n
            elif agg == "stddev":
                result[agg] = math.sqrt(max(m2, 0.0) / n)
            else:
                if ordered is None:
                    ordered = sorted(values)
                result[agg] = percentile(ordered, float(agg[1:]))
        result["count"] = n
        return result

    def _close(self, timestamp: float) -> None:
        if not (self._n or self._nonfinite):
            return
        result: Dict[str, float] = self._aggregate() if self._n else {"count": 0}
        if self._nonfinite:
            result["nonfinite"] = self._nonfinite
        step = self._step
        self._reset(None)
        self.last = result
        self.windows_closed += 1
        try:
            stream = self._stream or api.getStream(self.group)
            handler, group = stream.handler, stream.group_name
            for agg, value in result.items():
                handler.emit(api.MetricData(timestamp, group, self._tags[agg], value, step))
        except Exception:  # noqa: BLE001 - a user handler's failure must not break training
            pass
