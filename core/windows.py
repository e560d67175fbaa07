"""Live windows over one run's points of one tag: pure Python, no Beam.

Three kinds, configured per tag:

- ``count``: N points in step order (ties: time). Window i holds the points of
  ranks [i*N, (i+1)*N).
- ``time``: windows of T seconds of event time, aligned to the epoch, sliding
  every P seconds (P = T: fixed windows). Window k is [k*P, k*P + T).
- ``count_or_time``: consecutive windows that close after N points or once a
  point is T seconds after the window's first point, whichever comes first.

Points are placed only once the watermark has passed their time ("settled"),
in step order, so the windows do not depend on arrival order. A point that
arrives after its window was emitted, but within the allowed lateness, joins
that window and the window is emitted again with ``revision`` + 1. The end of
the run closes the open windows, flagged ``partial``. Percentiles are exact
(linear interpolation between order statistics, as numpy's default): windows
are small enough to keep their values.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from core.registry import record
from core.stats import mean_and_pstdev, percentile

AGGREGATIONS = ("last", "mean", "min", "max", "sum", "stddev", "p50", "p90", "p99", "histogram")
HISTOGRAM_BINS = 10
COUNT, TIME, COUNT_OR_TIME = "count", "time", "count_or_time"

@record("WindowPoint")
class WindowPoint(NamedTuple):
    """One point of a windowed tag. Fields in this order so that points sort by time (the wire's
    ``Point`` is (tag, value, step, time): a window's points all share one tag)."""
    time: float
    step: int  # NO_STEP (-1) when the point has none
    value: float


@record("WindowSpec")
@dataclasses.dataclass(frozen=True)
class WindowSpec:
    count: Optional[int] = None
    time_seconds: Optional[float] = None
    period_seconds: Optional[float] = None  # sliding period of time windows; None: fixed
    aggregations: Tuple[str, ...] = ("mean", "min", "max")

    @property
    def kind(self) -> str:
        if self.count and self.time_seconds:
            return COUNT_OR_TIME
        return COUNT if self.count else TIME

    @property
    def seconds(self) -> float:
        """How long a time window is (time and count_or_time kinds)."""
        if self.time_seconds is None:
            raise ValueError("a count window has no length in time")
        return self.time_seconds

    @property
    def points(self) -> int:
        """How many points close a count window (count and count_or_time kinds)."""
        if self.count is None:
            raise ValueError("a time window has no point count")
        return self.count

    @property
    def period(self) -> float:
        return self.period_seconds or self.seconds


def histogram(ordered: Sequence[float]) -> Dict[str, Union[List[float], List[int]]]:
    """10 equal-width bins between the smallest and the largest value: their edges and counts."""
    low, high = ordered[0], ordered[-1]
    width = (high - low) / HISTOGRAM_BINS
    huge = math.isinf(width)  # low and high straddle most of the float range: divide before subtracting
    if huge:
        width = high / HISTOGRAM_BINS - low / HISTOGRAM_BINS
    counts = [0] * HISTOGRAM_BINS
    for value in ordered:
        offset = value / width - low / width if huge else (value - low) / width if width else 0.0
        counts[min(int(offset), HISTOGRAM_BINS - 1)] += 1
    if huge:
        edges = [low * (1 - i / HISTOGRAM_BINS) + high * (i / HISTOGRAM_BINS) for i in range(HISTOGRAM_BINS + 1)]
    else:
        edges = [low + i * width for i in range(HISTOGRAM_BINS + 1)]
    return {"edges": edges, "counts": counts}


def _finite_sum(values: Sequence[float]) -> Optional[float]:
    """The sum, or None (NULL in the row, never checked) when it is beyond the float range."""
    try:
        total = math.fsum(values)
    except OverflowError:
        return None
    return total if math.isfinite(total) else None


def window_aggregates(points: Sequence[WindowPoint], aggregations: Sequence[str]) -> Dict[str, object]:
    """The requested aggregates of a window's points; every one is order-independent."""
    values = sorted(p.value for p in points)
    mean, stddev = mean_and_pstdev(values)
    available: Dict[str, Callable[[], object]] = {
        "last": lambda: max(points).value,
        "mean": lambda: mean,
        "min": lambda: values[0],
        "max": lambda: values[-1],
        "sum": lambda: _finite_sum(values),
        "stddev": lambda: stddev,
        "p50": lambda: percentile(values, 50),
        "p90": lambda: percentile(values, 90),
        "p99": lambda: percentile(values, 99),
        "histogram": lambda: json.dumps(histogram(values), separators=(",", ":")),
    }
    return {name: available[name]() for name in aggregations}


@record("Window")
@dataclasses.dataclass
class Window:
    kind: str
    index: int
    points: List[WindowPoint]
    start_time: float      # time windows: the window's bounds; others: first and last point
    end_time: float
    revision: int = 0
    partial: bool = False

    @property
    def start_step(self) -> Optional[int]:
        steps = [p.step for p in self.points if p.step >= 0]
        return min(steps) if steps else None

    @property
    def end_step(self) -> Optional[int]:
        steps = [p.step for p in self.points if p.step >= 0]
        return max(steps) if steps else None

@record("WindowResult")
@dataclasses.dataclass(frozen=True)
class WindowResult:
    """One emitted window of a run, as the checks see it (first revision only)."""
    test: str
    run: str
    tag: str
    kind: str
    index: int
    start_time: float
    end_time: float
    start_step: Optional[int]
    end_step: Optional[int]
    n: int
    partial: bool
    # aggregation -> value: a float (None where beyond the float range), the histogram as JSON text
    values: Dict[str, Any]
    # One worker's window of a distributed run (``core.rank_windows`` combines them); None: the run's own.
    rank: Optional[int] = None
    world_size: Optional[int] = None  # as the worker said
    host: Optional[str] = None        # the worker's host, from its run_started event
    # The step-aligned history its checks compare it with (``TestConfig.window_history_by``, e.g.
    # "accelerator=v5e", from the run's run_started data); "": the tag's one history.
    segment: str = ""

    @property
    def order(self) -> Tuple[float, str, int]:
        return self.end_time, self.run, self.index


def _step_order(point: WindowPoint) -> Tuple[int, float, float]:
    return point.step, point.time, point.value


def _kept(window: Window) -> List[Any]:
    """What ``TagWindows.kept`` holds of an emitted window: its end time and its last point in step order."""
    return [window.end_time, window.points[-1]]


@record("TagWindows")
class TagWindows:
    """The windows of one (test, run, tag), stepped by points and watermark advances."""

    def __init__(self, spec: WindowSpec):
        self.spec = spec
        self.pending: List[WindowPoint] = []        # not yet settled
        self.open: List[WindowPoint] = []           # count kinds: the open window, in step order
        self.open_index = 0
        self.open_by_index: Dict[int, List[WindowPoint]] = {}  # time kind: windows not yet ended
        self.emitted: Dict[int, Window] = {}        # kept while late points may still join them (see ``kept``)
        # Every emitted window still kept, by index: [its end time, its last point in step order]. What
        # ``needs_emitted`` and ``expire`` need, so that a caller may keep the windows themselves elsewhere
        # (``transforms.windows`` keeps them in a bag, read only for a point behind the open window) and
        # leave ``emitted`` empty until such a point comes.
        self.kept: Dict[int, List[Any]] = {}

    def to_state(self) -> Dict[str, Any]:
        """What the run's state keeps (``core.encoding``: a file format, fields by name)."""
        return {"spec": self.spec, "pending": self.pending, "open": self.open, "open_index": self.open_index,
                "open_by_index": self.open_by_index, "emitted": self.emitted, "kept": self.kept}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> TagWindows:
        windows = cls(state["spec"])
        windows.pending = state.get("pending", [])
        windows.open = state.get("open", [])
        windows.open_index = state.get("open_index", 0)
        windows.open_by_index = state.get("open_by_index", {})
        windows.emitted = state.get("emitted", {})
        kept = state.get("kept")  # None: written before ``kept`` was (every kept window was in ``emitted``)
        windows.kept = {i: _kept(w) for i, w in windows.emitted.items()} if kept is None else kept
        return windows

    def needs_emitted(self, point: WindowPoint) -> bool:
        """Whether ``update_emitted`` would add the point to an emitted window: the point is behind the
        open window (or within a kept time window). Needs only ``kept``, not the windows."""
        if not self.kept:
            return False
        if self.spec.kind == TIME:
            return any(k in self.kept for k in self._time_indexes(point.time))
        key = _step_order(point)
        if self.open:
            return key < _step_order(self.open[0])
        return key <= _step_order(self.kept[max(self.kept)][1])

    def _keep(self, window: Window) -> None:
        self.emitted[window.index] = window
        self.kept[window.index] = _kept(window)

    def add(self, point: WindowPoint) -> List[Window]:
        """A new point; returns already emitted windows it updates (a late point within lateness)."""
        updated = self.update_emitted(point)
        if updated is None:
            self.pending.append(point)
            return []
        return [updated]

    def update_emitted(self, point: WindowPoint) -> Optional[Window]:
        """Adds a point to the emitted window it belongs to, if any; returns that window.

        ``emitted`` must hold every kept window (as it does unless a caller keeps them elsewhere)."""
        if self.spec.kind == TIME:
            indexes = [k for k in self._time_indexes(point.time) if k in self.emitted]
            for k in indexes:
                self._join(self.emitted[k], point)
                self._keep(self.emitted[k])
            return self.emitted[indexes[-1]] if indexes else None
        if not self.emitted:
            return None
        key = _step_order(point)
        if self.open:
            if key >= _step_order(self.open[0]):
                return None
        elif key > _step_order(self.emitted[max(self.emitted)].points[-1]):
            return None  # after every emitted window: it starts the next one
        # Sequential windows are consecutive in step order: the point belongs to the
        # last emitted window that starts at or before it.
        ordered = [self.emitted[i] for i in sorted(self.emitted)]
        starting_before = [w for w in ordered if _step_order(w.points[0]) <= key]
        target = starting_before[-1] if starting_before else ordered[0]
        self._join(target, point)
        self._keep(target)
        return target

    @staticmethod
    def _join(window: Window, point: WindowPoint) -> None:
        bisect.insort(window.points, point, key=_step_order)
        window.revision += 1
        if window.kind != TIME:
            window.start_time = min(window.start_time, point.time)
            window.end_time = max(window.end_time, point.time)

    def _time_indexes(self, time: float) -> range:
        period, length = self.spec.period, self.spec.seconds
        return range(math.floor((time - length) / period) + 1, math.floor(time / period) + 1)

    def settle(self, watermark: float) -> List[Window]:
        """Places every pending point at or before the watermark; returns the windows that closed."""
        closed = self._place_pending(watermark)
        if self.spec.kind == TIME:
            for index in sorted(self.open_by_index):
                if index * self.spec.period + self.spec.seconds <= watermark:
                    closed.append(self._close_time_window(index, partial=False))
        return closed

    def _place_pending(self, watermark: float) -> List[Window]:
        ready = sorted((p for p in self.pending if p.time <= watermark), key=_step_order)
        self.pending = [p for p in self.pending if p.time > watermark]
        closed: List[Window] = []
        for point in ready:
            closed += self._place(point)
        return closed

    def _place(self, point: WindowPoint) -> List[Window]:
        spec = self.spec
        if spec.kind == TIME:
            for index in self._time_indexes(point.time):
                self.open_by_index.setdefault(index, []).append(point)
            return []
        closed = []
        if spec.kind == COUNT_OR_TIME and self.open and point.time >= self.open[0].time + spec.seconds:
            closed.append(self._close_sequential(partial=False))
        self.open.append(point)
        if len(self.open) >= spec.points:
            closed.append(self._close_sequential(partial=False))
        return closed

    def _close_sequential(self, partial: bool) -> Window:
        times = [p.time for p in self.open]
        window = Window(self.spec.kind, self.open_index, sorted(self.open, key=_step_order),
                        min(times), max(times), partial=partial)
        self._keep(window)
        self.open, self.open_index = [], self.open_index + 1
        return window

    def _close_time_window(self, index: int, partial: bool) -> Window:
        start = index * self.spec.period
        window = Window(TIME, index, sorted(self.open_by_index.pop(index), key=_step_order),
                        start, start + self.spec.seconds, partial=partial)
        self._keep(window)
        return window

    def close(self) -> List[Window]:
        """The run ended: every pending point is placed and every open window closes as partial."""
        closed = self._place_pending(math.inf)
        if self.spec.kind == TIME:
            closed += [self._close_time_window(index, partial=True) for index in sorted(self.open_by_index)]
        elif self.open:
            closed.append(self._close_sequential(partial=True))
        return closed

    def next_due(self) -> Optional[float]:
        """The earliest event time at which ``settle`` would have work."""
        candidates = [min(p.time for p in self.pending)] if self.pending else []
        if self.spec.kind == TIME and self.open_by_index:
            candidates.append(min(self.open_by_index) * self.spec.period + self.spec.seconds)
        return min(candidates) if candidates else None

    def expire(self, before: float) -> None:
        """Forgets emitted windows that ended before ``before``: late points can no longer join them."""
        for index in [i for i, (end_time, _) in self.kept.items() if end_time < before]:
            del self.kept[index]
            self.emitted.pop(index, None)
