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
import itertools
import json
import math
import struct
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from core.columns import (
    pack_floats,
    pack_grouped_floats,
    pack_grouped_ints,
    pack_ints,
    unpack_floats,
    unpack_grouped_floats,
    unpack_grouped_ints,
    unpack_ints,
)
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


def _from_zigzag_varints(data: bytes) -> List[int]:
    numbers, unsigned, shift = [], 0, 0
    for byte in data:
        unsigned |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            numbers.append(unsigned // 2 if unsigned % 2 == 0 else -(unsigned + 1) // 2)
            unsigned, shift = 0, 0
    return numbers


def _columns_v1_to_v2(fields: Dict[str, Any]) -> Dict[str, Any]:
    """Version 1 kept each tag's columns apart: times and values as float64 bytes, steps as zigzag varints of
    their differences."""
    points = []
    for times, steps, values in zip(fields["times"], fields["steps"], fields["values"]):
        n = len(times) // 8
        points.append(list(map(WindowPoint, struct.unpack(f"<{n}d", times),
                               itertools.accumulate(_from_zigzag_varints(steps)), struct.unpack(f"<{n}d", values))))
    return {"tags": fields["tags"], "points": PointGroups.of(points)}


@record("PointGroups")
@dataclasses.dataclass
class PointGroups:
    """Groups of points (a tag's, a window's) as columns over all of them, group after group (``core.columns``:
    times and steps by their second differences, values as decimals where they are, every bit kept)."""
    counts: bytes
    times: bytes
    steps: bytes
    values: bytes

    @classmethod
    def of(cls, groups: Sequence[Sequence[WindowPoint]]) -> PointGroups:
        return cls(pack_ints([len(group) for group in groups]),
                   pack_grouped_floats([[p.time for p in group] for group in groups], order=2),
                   pack_grouped_ints([[p.step for p in group] for group in groups], order=2),
                   pack_grouped_floats([[p.value for p in group] for group in groups], order=1))

    def groups(self) -> List[List[WindowPoint]]:
        sizes = unpack_ints(self.counts)
        return [list(map(WindowPoint, times, steps, values)) for times, steps, values in zip(
            unpack_grouped_floats(self.times, sizes), unpack_grouped_ints(self.steps, sizes),
            unpack_grouped_floats(self.values, sizes))]


@record("PointColumns", version=2, upgrades={1: _columns_v1_to_v2})
@dataclasses.dataclass
class PointColumns:
    """Points of several tags, as ``PointGroups`` of one group a tag. A point as a (tag, ``WindowPoint``) record
    is ~37 bytes encoded (its tag's name, a mark and three msgpack numbers); as float64 columns (version 1) ~17;
    on the bench's windowed test (six significant digits, a step a second) ~2.5. ``transforms.windows`` keeps
    the points waiting for the watermark (a message's 1,000 a batch) this way."""
    tags: List[str]
    points: PointGroups

    @classmethod
    def of(cls, items: Sequence[Tuple[str, WindowPoint]]) -> PointColumns:
        by_tag: Dict[str, List[WindowPoint]] = {}
        for tag, point in items:
            by_tag.setdefault(tag, []).append(point)
        return cls(list(by_tag), PointGroups.of(list(by_tag.values())))

    def items(self) -> List[Tuple[str, WindowPoint]]:
        """The (tag, point) items, by tag in the order they came."""
        return [(tag, point) for tag, points in zip(self.tags, self.points.groups()) for point in points]


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

@record("ClosedWindows")
@dataclasses.dataclass
class ClosedWindows:
    """Emitted windows, each with a seq of its keeper's, as columns (``core.columns``): how
    ``transforms.windows`` keeps a batch of closed windows for late points. A window as its own record with its
    points in columns took ~80 bytes besides them; here its index, seq, revision and bounds take a few."""
    tags: List[str]      # the batch's tags, each once
    kinds: List[str]     # their windows' kind
    tag_of: bytes        # per window: its tag's place in ``tags``
    seqs: bytes
    indexes: bytes
    revisions: bytes
    partial: bytes
    start_times: bytes
    end_times: bytes
    points: PointGroups  # a group a window

    @classmethod
    def of(cls, entries: Sequence[Tuple[int, str, Window]]) -> ClosedWindows:
        tags: Dict[str, int] = {}
        kinds: List[str] = []
        for _, tag, window in entries:
            if tag not in tags:
                tags[tag] = len(tags)
                kinds.append(window.kind)
        windows = [window for _, _, window in entries]
        return cls(list(tags), kinds, pack_ints([tags[tag] for _, tag, _ in entries], order=0),
                   pack_ints([seq for seq, _, _ in entries], order=2),
                   pack_ints([w.index for w in windows], order=2), pack_ints([w.revision for w in windows], order=0),
                   pack_ints([int(w.partial) for w in windows], order=0),
                   pack_floats([w.start_time for w in windows], order=2),
                   pack_floats([w.end_time for w in windows], order=2),
                   PointGroups.of([w.points for w in windows]))

    def entries(self) -> List[Tuple[int, str, Window]]:
        """The (seq, tag, window) entries, windows with their points."""
        points = self.points.groups()
        return [(seq, self.tags[tag], Window(self.kinds[tag], index, list(group), start, end, revision, bool(partial)))
                for seq, tag, index, revision, partial, start, end, group in zip(
                    unpack_ints(self.seqs), unpack_ints(self.tag_of), unpack_ints(self.indexes),
                    unpack_ints(self.revisions), unpack_ints(self.partial), unpack_floats(self.start_times),
                    unpack_floats(self.end_times), points)]


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


@record("TagTable")
@dataclasses.dataclass
class TagTable:
    """A run's ``TagWindows`` of every tag as columns across the tags (``core.columns``): what a run's live
    windows keep in state, read and written at every firing. As ``TagWindows`` records a tag of the bench's
    windowed test took ~300 bytes (its spec, its open window's points and its kept windows' ends and last
    points, each a msgpack number); as columns across 20 tags, ~50. Every field of every tag comes back as it
    was, dicts in their order."""
    tags: List[str]
    specs: List[WindowSpec]       # each distinct spec once
    spec_of: bytes                # per tag: its spec's place in ``specs``
    open_index: bytes             # per tag
    pending: PointGroups          # a group a tag
    open: PointGroups             # a group a tag
    timed_keys: bytes             # time windows not yet ended: (tag's place, index), flat
    timed: PointGroups            # their points, a group a window
    kept_counts: bytes            # per tag, how many windows it keeps
    kept_indexes: bytes
    kept_ends: bytes
    # each kept window's last point: its time where it is not the window's end (1 in ``kept_at_end``: it is)
    kept_at_end: bytes
    kept_times: bytes
    kept_steps: bytes
    kept_values: bytes
    emitted: Dict[str, Dict[int, Window]] = dataclasses.field(default_factory=dict)  # the tags' with any

    @classmethod
    def of(cls, tags: Dict[str, TagWindows]) -> TagTable:
        windows = list(tags.values())
        specs: Dict[WindowSpec, int] = {}
        for w in windows:
            specs.setdefault(w.spec, len(specs))
        timed = [(place, index, points) for place, w in enumerate(windows) for index, points in w.open_by_index.items()]
        kept = [list(w.kept.items()) for w in windows]
        ends = [(end, last) for k in kept for _, (end, last) in k]
        at_end = [int(_same_float(last.time, end)) for end, last in ends]
        return cls(list(tags), list(specs), pack_ints([specs[w.spec] for w in windows], order=0),
                   pack_ints([w.open_index for w in windows]), PointGroups.of([w.pending for w in windows]),
                   PointGroups.of([w.open for w in windows]),
                   pack_ints([n for place, index, _ in timed for n in (place, index)]),
                   PointGroups.of([points for _, _, points in timed]),
                   pack_ints([len(k) for k in kept], order=0),
                   pack_ints([index for k in kept for index, _ in k], order=2),
                   pack_floats([end for k in kept for _, (end, _) in k], order=2),
                   pack_ints(at_end, order=1),
                   pack_floats([last.time for (_, last), same in zip(ends, at_end) if not same], order=2),
                   pack_ints([last.step for _, last in ends], order=2),
                   pack_floats([last.value for _, last in ends]),
                   {tag: dict(w.emitted) for tag, w in tags.items() if w.emitted})

    def windows(self) -> Dict[str, TagWindows]:
        """The tags' ``TagWindows``, as ``of`` took them."""
        specs = [self.specs[i] for i in unpack_ints(self.spec_of)]
        out = {tag: TagWindows(spec) for tag, spec in zip(self.tags, specs)}
        windows = list(out.values())
        for w, open_index, pending, open_ in zip(windows, unpack_ints(self.open_index), self.pending.groups(),
                                                 self.open.groups()):
            w.open_index, w.pending, w.open = open_index, pending, open_
        keys = unpack_ints(self.timed_keys)
        for place, index, points in zip(keys[::2], keys[1::2], self.timed.groups()):
            windows[place].open_by_index[index] = points
        ends = unpack_floats(self.kept_ends)
        times = iter(unpack_floats(self.kept_times))
        lasts = iter(map(WindowPoint, [end if same else next(times) for end, same in zip(
            ends, unpack_ints(self.kept_at_end))], unpack_ints(self.kept_steps), unpack_floats(self.kept_values)))
        indexes, ends_in_order = iter(unpack_ints(self.kept_indexes)), iter(ends)
        for w, count in zip(windows, unpack_ints(self.kept_counts)):
            w.kept = {next(indexes): [next(ends_in_order), next(lasts)] for _ in range(count)}
        for tag, emitted in self.emitted.items():
            out[tag].emitted = emitted
        return out


def _same_float(a: float, b: float) -> bool:
    """Whether two floats are the same bits' worth (0.0 and -0.0 are not; a NaN is never taken as another)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
