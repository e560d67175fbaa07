"""Checks of live windows against history, as a pure state machine per (test, tag, window kind).

A window of a running run is compared with either

- ``step_aligned`` history: in each of the last K successful runs of the test,
  the window overlapping the most steps of this one (loss at steps 1000-1099
  against the same steps before), or
- ``trailing`` history: the previous J windows of the same run (spikes,
  divergence, stalls in throughput),

with the spine's condition language (``core.bounds``). An out-of-bounds
value only counts when it is at least ``min_effect_abs`` away from the
reference (the history's centre, or the fixed value) and ``min_effect_rel`` times
its magnitude, so that tiny deviations of very stable metrics stay quiet.
A (run, check) alerts once M of its last N windows counted, and not again
until it recovers (fewer than M of the last N). A step-aligned check that
already tripped in the previous successful run does not alert again in a run
that did not open within bounds: that is one moved level, announced live once
(see ``_continues_a_level``).

Step-aligned history leaves out the windows that counted as out of bounds, so
that an earlier regression does not widen the band that should catch its
repeat. It follows accepted changes as the run-level history does
(``core.history``): when a check trips in ``rebaseline_after`` successful runs
in a row, the level has moved for good; from then on the check compares with
those runs and later ones only (their windows count again), with the scale of
the runs before bridging the new level's warm-up. It follows improvements that
stay too, which trip no one-sided check: a run whose windows mostly lie at least
``IMPROVED_SHARE`` of the way from the centre to the improvement bound (the
cutoff's mirror) is an improved run, and ``rebaseline_after`` of them in a row
move the level the same way. Left in, the old level's windows would widen the
band for as long as they stay (``history_runs``), and a slowdown back to the
old level would pass it.

A step-aligned check also allows for where each run stands: a run's first
windows (``RUN_OFFSET_WINDOWS``) say how far above or below the compared runs'
first windows it runs (a slower host, another seed), as a share of them. From
its ``RUN_OFFSET_MIN + 1``-th window on, a window and each compared run's
same-step window are judged with their run's offset taken off
(``_run_offset``). What is left is the change within the run, whose noise is
far smaller than the spread between runs: a step time 15% slower from mid-run
stands out even where runs differ by several percent. A run whose offset lies
beyond what the compared runs' allow at the check's rate is off from its first
windows on: it is judged as before, without offsets.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import itertools
import operator
from typing import Any, Deque, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union, cast

from core.alert_details import change_facts, describe, previous_facts, threshold_facts
from core.bounds import (
    MODE_RECENT,
    MODE_SHARE,
    Bounds,
    RecentValue,
    compute_bounds,
    judge,
    reference,
    threshold_details,
)
from core.config import TagWindowConfig, WindowCheck, WindowConfig
from core.records import Alert, Refused
from core.registry import record
from core.stats import median
from core.triage import (
    WINDOW_ALERT_KINDS,
    TriageItem,
    reaches_metric_history,
    unknown_run_refusal,
    window_index_of,
    window_kind_of,
    window_metric,
)
from core.vocabulary import AlertKind, RunStatus, TriageAction
from core.windows import WindowResult

IMPROVED_SHARE = 0.5
"""A window is improved when its value lies at least this share of the way from its history's centre to the
improvement bound; a run is improved when at least half of its judged windows are (and ``MIN_JUDGED`` were):
under healthy noise that takes a run-wide deviation of half a cutoff, several scales, in every run of a
streak."""
MIN_JUDGED = 3

RUN_OFFSET_WINDOWS = 8
"""How many of a run's first windows tell where the run stands (``_run_offset``); later windows add nothing, so
a change from mid-run is not taken for the run's own level."""
RUN_OFFSET_MIN = 2  # a run's offset needs this many of its windows before the one judged
OPENING_WINDOWS = 2  # a run whose first judged windows were within bounds did not open at a level that moved


@record("RunEnded")
@dataclasses.dataclass(frozen=True)
class RunEnded:
    """The run's final status, so that its windows join the history if it succeeded."""
    test: str
    run: str
    status: str
    finalized_at: float
    tag: str
    kind: str

    @property
    def order(self) -> Tuple[float, str, float]:
        # After every window of the run, whose end times are all before finalization.
        return self.finalized_at, self.run, float("inf")


@record("WindowDebounce")
@dataclasses.dataclass
class _Debounce:
    recent: Deque[bool]
    firing: bool = False


@record("StepWindow")
@dataclasses.dataclass(frozen=True)
class StepWindow:
    """Of a finished run's window, what a step-aligned check reads of it (``NearWindows``): its index, its steps
    and the values of the aggregations checked."""
    index: int
    start_step: Optional[int]
    end_step: Optional[int]
    values: Dict[str, Optional[float]]


HistoryWindow = Union[WindowResult, StepWindow]


@record("FinishedRun")
@dataclasses.dataclass
class FinishedRun:
    """A successful run's windows, as step-aligned history (``StepWindow``s in a ``NearWindows``)."""
    run: str
    windows: Sequence[HistoryWindow]
    # Per aggregation, the indices of the windows that counted as out of bounds: not history.
    excluded: Dict[str, FrozenSet[int]] = dataclasses.field(default_factory=dict)
    # Per step-aligned aggregation, its first windows' values (``_OpenRun.leading``).
    leading: Dict[str, Tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def most_overlapping(self, window: WindowResult) -> Optional[HistoryWindow]:
        """The window of this run overlapping ``window``'s steps the most (ties: the lowest index, then the
        first in ``windows``), None when none overlaps: a lookup in a step index of the windows, built on first
        use and kept beside the fields (never encoded, pickled or compared), not a scan of every window."""
        index = self.__dict__.get(_STEP_INDEX)
        if index is None or index.windows is not self.windows or index.size != len(self.windows):
            index = self.__dict__[_STEP_INDEX] = _StepIndex(self.windows)
        return index.most_overlapping(window)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles and copies leave the step index out (it is rebuilt when needed)."""
        state = dict(self.__dict__)
        state.pop(_STEP_INDEX, None)
        return state


_STEP_INDEX = "_step_index"


class _StepIndex:
    """A run's windows that have steps, sorted by start step, with the running maximum of their end steps.

    The windows overlapping steps [s, e] all start at or before e (a prefix of the sorted windows) and end at
    or after s, so none lies before the first position whose running maximum end reaches s: two bisections
    bound them. Consecutive windows (the usual: each starts after the previous ends) leave one or two between
    the bounds; windows that overlap each other (sliding time windows) or span many steps (steps that
    restart) only widen the range, which is then filtered: the result is always that of a scan of every window
    (``bench/bench_window_history.py`` keeps that scan and times both)."""

    __slots__ = ("windows", "size", "starts", "reach", "positions")

    def __init__(self, windows: Sequence[HistoryWindow]):
        self.windows = windows
        self.size = len(windows)
        starts, ends = [w.start_step for w in windows], [w.end_step for w in windows]
        self.positions: Sequence[int] = range(len(windows))
        known = cast(List[int], starts)  # when the first two tests below pass
        if None in starts or None in ends or any(map(operator.gt, known, itertools.islice(known, 1, None))):
            spans = sorted(((w.start_step, w.end_step, p) for p, w in enumerate(windows)  # stable: ties keep order
                            if w.start_step is not None and w.end_step is not None), key=operator.itemgetter(0))
            starts, ends = [start for start, _, _ in spans], [end for _, end, _ in spans]
            self.positions = [position for _, _, position in spans]
        self.starts = cast(List[int], starts)
        self.reach = list(itertools.accumulate(cast(List[int], ends), max))

    def most_overlapping(self, window: WindowResult) -> Optional[HistoryWindow]:
        if window.start_step is None or window.end_step is None:
            return None
        lo = bisect.bisect_left(self.reach, window.start_step)
        hi = bisect.bisect_right(self.starts, window.end_step)
        best: Optional[Tuple[int, int, int]] = None
        for position in self.positions[lo:hi]:
            overlap = window_overlap(self.windows[position], window)
            if overlap >= 0:
                key = (overlap, -self.windows[position].index, -position)
                if best is None or key > best:
                    best = key
        return None if best is None else self.windows[-best[2]]


@record("OpenRun")
@dataclasses.dataclass
class _OpenRun:
    windows: List[WindowResult] = dataclasses.field(default_factory=list)
    out_of_bounds: Dict[str, Set[int]] = dataclasses.field(default_factory=dict)  # aggregation -> window indices
    tripped: Set[str] = dataclasses.field(default_factory=set)  # aggregations whose check tripped in this run
    # Per step-aligned aggregation: [windows improved (``IMPROVED_SHARE``), windows judged] in this run.
    improved: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    # How many of ``windows`` a state kept in parts holds in its log (``take_unlogged``), the first ones.
    logged: int = 0
    # Per step-aligned aggregation: the values of its first ``RUN_OFFSET_WINDOWS`` windows, in order: where the run
    # stands (``_run_offset``).
    leading: Dict[str, List[float]] = dataclasses.field(default_factory=dict)
    # Per aggregation: how many of its first ``OPENING_WINDOWS`` judged windows were within bounds so far, -1 once
    # one of them was not (``_continues_a_level``).
    opening_within: Dict[str, int] = dataclasses.field(default_factory=dict)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles and copies leave the kept ``_OffsetSpread`` out (it is made again when needed)."""
        state = dict(self.__dict__)
        state.pop(_OFFSET_SPREAD, None)
        return state


@record("WindowHistory")
@dataclasses.dataclass
class WindowHistory:
    """State of one (test, tag, window kind)."""
    # Oldest first; trimmed to twice what the checks compare as runs end (``_forget_old_levels``).
    finished_runs: Deque[FinishedRun] = dataclasses.field(default_factory=collections.deque)
    open_runs: Dict[str, _OpenRun] = dataclasses.field(default_factory=dict)
    debounce: Dict[Tuple[str, str], _Debounce] = dataclasses.field(default_factory=dict)
    # Per step-aligned aggregation: the successful runs in a row in which its check tripped...
    streaks: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    # ...and the run its history starts from since its level last moved.
    rebased_from: Dict[str, str] = dataclasses.field(default_factory=dict)
    # Per step-aligned aggregation: the successful runs in a row that were improved runs.
    improving: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    # Per aggregation: a run accepted as a new level (``core.triage``) before it ended.
    pending_accepts: Dict[str, str] = dataclasses.field(default_factory=dict)
    # A tag whose window checks have ``history_by``: one such history per segment of its runs
    # (``WindowResult.segment``, e.g. ``accelerator=v5e``), each run judged against its own type's runs.
    segments: Dict[str, WindowHistory] = dataclasses.field(default_factory=dict)

    def part(self, segment: str) -> WindowHistory:
        """The history of ``segment`` ("": this one), made when first asked."""
        return self if not segment else self.segments.setdefault(segment, WindowHistory())

    def parts(self) -> Iterator[Tuple[str, WindowHistory]]:
        """("", this one), then (segment, its history) of each segment."""
        yield "", self
        yield from self.segments.items()

    def judging(self, segment: str, run: str) -> WindowHistory:
        """The history that judges a window of ``run`` of ``segment`` ("": this one); a pending accept of the
        run moves there with it."""
        history = self.part(segment)
        if history is self:
            return self
        for aggregation, pending in list(self.pending_accepts.items()):
            if pending == run:
                history.pending_accepts[aggregation] = self.pending_accepts.pop(aggregation)
        return history

    def holding(self, run: str) -> WindowHistory:
        """The history (this one or a segment's) whose open or finished runs hold ``run``; this one if none."""
        return next((history for _, history in self.parts()
                     if run in history.open_runs or any(f.run == run for f in history.finished_runs)), self)

    @property
    def runs_held(self) -> int:
        """How many finished runs the history (with its segments) holds: what an accept can name."""
        return sum(len(history.finished_runs) for _, history in self.parts())


@record("WindowTriage")
@dataclasses.dataclass(frozen=True)
class WindowTriage:
    """A triage action (``core.triage``) for the checks of one aggregation of one (test, tag, window kind)."""
    item: TriageItem
    tag: str
    kind: str
    aggregation: str

    @property
    def test(self) -> str:
        return self.item.test

    @property
    def order(self) -> Tuple[float, str, str]:
        return self.item.order


def window_triage_targets(item: TriageItem, windows: WindowConfig) -> List[WindowTriage]:
    """The window checks an accept or a dismiss reaches: those whose alerts carry its metric name
    (``<tag>_<aggregation>``) and, for a dismiss, the window kind of the dismissed alert."""
    if item.metric is None or item.action not in (TriageAction.ACCEPT, TriageAction.DISMISS):
        return []
    if item.action == TriageAction.DISMISS and item.alert_kind not in WINDOW_ALERT_KINDS:
        return []
    kind = window_kind_of(item.instance) if item.action == TriageAction.DISMISS else None
    targets = {}
    for tag, tag_config in windows.tags.items():
        for check in tag_config.checks:
            if (check.history == "step_aligned" and window_metric(tag, check.aggregation) == item.metric
                    and kind in (None, tag_config.spec.kind)):
                targets[(tag, tag_config.spec.kind, check.aggregation)] = WindowTriage(
                    item, tag, tag_config.spec.kind, check.aggregation)
    return list(targets.values())


def reaches_run_level_history(item: TriageItem, windows: WindowConfig) -> bool:
    """Whether a run-level metric history takes the action: an accept or dismiss of its metric, unless the metric
    is a step-aligned window check's (``<tag>_<aggregation>``), whose history alone takes it."""
    return reaches_metric_history(item) and not window_triage_targets(item, windows)


def apply_window_triage(state: WindowHistory, triage: WindowTriage) -> None:
    """An accept moves the check's level to the run (when it ends, for a ``future`` accept of a run still going
    or to come; ``Refused`` for another run the history does not hold); a dismiss lets the dismissed window back
    into the history and takes its run out of the check's streak. Either acts on the segment holding the run
    (``history_by``); other segments keep their levels."""
    run, aggregation = triage.item.run, triage.aggregation
    if run is None:
        return
    whole, state = state, state.holding(run)
    finished = next((f for f in state.finished_runs if f.run == run), None)
    if triage.item.action == TriageAction.ACCEPT:
        if finished is None and not triage.item.future:
            raise unknown_run_refusal(triage.item, whole.runs_held)
        if finished is None:
            state.pending_accepts[aggregation] = run
        else:
            _move_level(state, aggregation, run)
        return
    index = window_index_of(triage.item.instance)
    if finished is not None:
        finished.excluded[aggregation] = finished.excluded.get(aggregation, frozenset()) - {index}
        streak = state.streaks.get(aggregation, [])
        if run in streak:
            state.streaks[aggregation] = streak[streak.index(run) + 1:]
    elif run in state.open_runs:
        open_run = state.open_runs[run]
        open_run.out_of_bounds.get(aggregation, set()).discard(index)
        open_run.tripped.discard(aggregation)


def _move_level(state: WindowHistory, aggregation: str, run: str) -> None:
    """The check's history starts at ``run`` from now on; the windows of that run and later ones count."""
    state.rebased_from[aggregation] = run
    moved = False
    for finished in state.finished_runs:
        moved = moved or finished.run == run
        if moved:
            finished.excluded.pop(aggregation, None)
    state.streaks[aggregation] = []
    state.improving[aggregation] = []


def window_overlap(a: HistoryWindow, b: WindowResult) -> int:
    """How many steps two windows share, minus one: 0 when they share one step, negative when they are apart
    or either has no step range."""
    if a.start_step is None or b.start_step is None or a.end_step is None or b.end_step is None:
        return -1
    return min(a.end_step, b.end_step) - max(a.start_step, b.start_step)


def step_aligned_history(window: WindowResult, runs: Sequence[FinishedRun], aggregation: str,
                         limit: Optional[int] = None) -> Tuple[List[float], List[str]]:
    """From each run, the value of its window overlapping ``window``'s steps the most, oldest first;
    runs whose window counted as out of bounds give none; at most the latest ``limit`` values."""
    aligned = _step_aligned(window, runs, aggregation, limit, 0)
    return aligned.values, [finished.run for finished in aligned.runs]


@dataclasses.dataclass
class _Aligned:
    """``step_aligned_history``'s values and their runs, oldest first, and the same-step values of the latest
    runs (``RecentValue``) with their runs: the windows left out for being out of bounds included, which only
    tell a second mode of the history (runs on two machine types: the slower mode's windows, each left out as it
    alerted, would otherwise leave a one-mode history that alerts on every run of that type;
    ``core.bounds._beyond_second_mode``)."""
    values: List[float]
    runs: List[FinishedRun]
    recent: List[RecentValue]
    recent_runs: List[FinishedRun]


def _step_aligned(window: WindowResult, runs: Sequence[FinishedRun], aggregation: str, limit: Optional[int],
                  recent_runs: int) -> _Aligned:
    """``step_aligned_history`` and, in the same walk back over the runs, the latest ``recent_runs`` runs'."""
    aligned = _Aligned([], [], [], [])
    for age, finished in enumerate(reversed(runs)):
        full = limit is not None and len(aligned.values) >= limit
        if full and age >= recent_runs:
            break
        found = _aligned_value(finished, window, aggregation)
        if found is None:
            continue
        if age < recent_runs:
            aligned.recent.append(found)
            aligned.recent_runs.append(finished)
        if found.counted and not full:
            aligned.values.append(found.value)
            aligned.runs.append(finished)
    for field in (aligned.values, aligned.runs, aligned.recent, aligned.recent_runs):
        field.reverse()
    return aligned


def _aligned_value(finished: FinishedRun, window: WindowResult, aggregation: str) -> Optional[RecentValue]:
    """The value, and whether it counted, of the run's window overlapping ``window``'s steps the most, if it has
    one with a value."""
    best = finished.most_overlapping(window)
    if best is None:
        return None
    value = best.values.get(aggregation)
    if value is None:
        return None
    return RecentValue(value, best.index not in finished.excluded.get(aggregation, ()))


def _offsets(runs: Sequence[Sequence[float]], count: int) -> Tuple[List[float], List[Optional[float]]]:
    """The centres of runs' first ``count`` window values (the median of each position's) and each run's offset
    from them: the median of its values' deviations from the centres, as shares of the centres' size (None: no
    value at a position with a non-zero centre)."""
    centres = [median(column) if column else 0.0
               for column in ([values[i] for values in runs if len(values) > i] for i in range(count))]
    return centres, [_offset_from(values, centres) for values in runs]


def _offset_from(values: Sequence[float], centres: Sequence[float]) -> Optional[float]:
    deviations = [(value - centre) / abs(centre) for value, centre in zip(values, centres) if centre]
    return median(deviations) if deviations else None


def _run_offset(state: WindowHistory, window: WindowResult, check: WindowCheck, aligned: _Aligned,
                before: _Aligned) -> Optional[Tuple[float, float, _Aligned, _Aligned]]:
    """Where ``window``'s run stands (a share of the history's median, and that median's size), and the compared
    runs' values with their own runs' offsets taken off (the history before the level moved: by its own
    centres), when the run has ``RUN_OFFSET_MIN`` values before this window and the check compares with a
    statistical threshold; None: the window is judged as it is.

    A run's offset is the median deviation of its first window values (as many as the judged run has so far, at
    most ``RUN_OFFSET_WINDOWS``) from the compared runs' centres of the same positions, as a share of them; a
    compared run without any leaves the history. A judged run whose offset lies beyond the bounds the compared
    runs' offsets give at the check's own rate (``core.bounds.compute_bounds``: a young level's pooled with the
    level's before, second modes of the latest runs included) is no healthy run from its first windows on: it is
    judged without offsets (None), so a run slower from its start is as easy to catch as before."""
    open_run = state.open_runs.get(window.run)
    own = open_run.leading.get(check.aggregation, ()) if open_run is not None else ()
    count = min(len(own), RUN_OFFSET_WINDOWS)
    if open_run is None or count < RUN_OFFSET_MIN or check.condition.fixed_value is not None or not aligned.values:
        return None
    spread = _offset_spread(open_run, check, count, aligned, before)
    mine = _offset_from(own[:count], spread.centres)
    if spread.allowed is None or mine is None or not spread.allowed[0] <= mine <= spread.allowed[1]:
        return None
    size = abs(median(aligned.values))
    return (mine, size, _taken_off(aligned, spread.offsets, size),
            _taken_off(before, spread.offsets, abs(median(before.values or [0.0]))))


@dataclasses.dataclass(frozen=True)
class _OffsetSpread:
    """Of the compared runs (and those before the level moved): the centres of their first windows, each run's
    offset from them (by run; its level's own centres), and the range a healthy run's offset lies in (None:
    too few offsets to tell)."""
    centres: List[float]
    offsets: Dict[str, Optional[float]]
    allowed: Optional[Tuple[float, float]]


_OFFSET_SPREAD = "_offset_spread"


def _offset_spread(open_run: _OpenRun, check: WindowCheck, count: int, aligned: _Aligned,
                   before: _Aligned) -> _OffsetSpread:
    """The ``_OffsetSpread`` of the runs ``window_bounds`` compares with, kept beside the open run's fields (never
    encoded, pickled or compared) for its next windows, which mostly compare with the same runs (the key names
    the check's condition and all the runs: a run's first windows never change once it ended)."""
    key = (check.aggregation, check.condition, count, tuple(f.run for f in aligned.runs),
           tuple(f.run for f in before.runs),
           tuple((f.run, entry.counted) for f, entry in zip(aligned.recent_runs, aligned.recent)))
    kept = open_run.__dict__.get(_OFFSET_SPREAD)
    if kept is not None and kept[0] == key:
        return cast(_OffsetSpread, kept[1])
    runs = {f.run: f for f in itertools.chain(aligned.runs, aligned.recent_runs)}
    centres, offsets = _offsets([f.leading.get(check.aggregation, ()) for f in runs.values()], count)
    offset_of = dict(zip(runs, offsets))
    _, earlier = _offsets([f.leading.get(check.aggregation, ()) for f in before.runs], count)
    offset_of.update(zip((f.run for f in before.runs), earlier))
    compared = [o for o in (offset_of[f.run] for f in aligned.runs) if o is not None]
    recent = [RecentValue(o, entry.counted) for o, entry in
              ((offset_of[f.run], entry) for f, entry in zip(aligned.recent_runs, aligned.recent)) if o is not None]
    bounds = compute_bounds(check.condition, compared, [o for o in earlier if o is not None], recent)
    cutoff = None if bounds is None else bounds.lower if bounds.upper is None else bounds.upper
    allowed = None
    if bounds is not None and bounds.improvement is not None and cutoff is not None:
        allowed = (min(cutoff, bounds.improvement), max(cutoff, bounds.improvement))
    spread = _OffsetSpread(centres, offset_of, allowed)
    open_run.__dict__[_OFFSET_SPREAD] = (key, spread)
    return spread


def _taken_off(part: _Aligned, offset_of: Dict[str, Optional[float]], size: float) -> _Aligned:
    """``part``'s values with their runs' offsets (times ``size``) taken off; runs without one leave it."""
    values = [(v, f, offset_of.get(f.run)) for v, f in zip(part.values, part.runs)]
    recent = [(r, f, offset_of.get(f.run)) for r, f in zip(part.recent, part.recent_runs)]
    return _Aligned([v - o * size for v, _, o in values if o is not None], [f for _, f, o in values if o is not None],
                    [RecentValue(r.value - o * size, r.counted) for r, _, o in recent if o is not None],
                    [f for _, f, o in recent if o is not None])


def _segments(state: WindowHistory, check: WindowCheck) -> Tuple[List[FinishedRun], List[FinishedRun]]:
    """(the runs since the check's level last moved, the runs before)."""
    runs = list(state.finished_runs)
    start = state.rebased_from.get(check.aggregation)
    split = next((i for i, finished in enumerate(runs) if finished.run == start), 0)
    return runs[split:], runs[:split]


@dataclasses.dataclass(frozen=True)
class CheckedWindow:
    """What one check compared one window with: the history it used, the bounds they gave, the window's value."""
    check: WindowCheck
    value: Optional[float]
    history: Tuple[float, ...]    # oldest first; with their runs' offsets taken off (``run_offset``)
    compared: Tuple[str, ...]     # the runs of ``history`` (step_aligned), or the window's own run (trailing)
    previous: Tuple[float, ...]   # step_aligned: the history before the check's level last moved
    bounds: Optional[Bounds]      # None: too little history to judge; else where ``value`` is judged, offset included
    run_offset: float = 0.0       # how far the window's run stands from the history, in the value's units...
    run_offset_share: float = 0.0  # ...and as a share of the history's median
    unadjusted: Optional[CheckedWindow] = None  # the same without the runs' offsets, when they were taken off

    @property
    def as_it_was(self) -> CheckedWindow:
        """The history and bounds as they were, no run's offset taken off."""
        return self.unadjusted or self

    @property
    def out_of_bounds(self) -> bool:
        """Whether the window counted as out of bounds (before debouncing: it may not have alerted)."""
        return self.value is not None and self.bounds is not None and not judge(self.value, self.bounds,
                                                                                  self.check.condition)


def window_bounds(state: WindowHistory, window: WindowResult, check: WindowCheck) -> CheckedWindow:
    """What ``check`` compares ``window`` with in ``state``: the one place the history and the bounds a window is
    judged by are chosen, for :func:`check_window` and for readers that draw them (the report)."""
    value = window.values.get(check.aggregation)
    if check.history == "trailing":
        open_run = state.open_runs.get(window.run, _OpenRun())
        history = [v for v in (w.values.get(check.aggregation) for w in open_run.windows[-check.trailing_windows:])
                   if v is not None]
        return CheckedWindow(check, value, tuple(history), (window.run,) if history else (), (),
                             compute_bounds(check.condition, history))
    current, earlier = _segments(state, check)
    aligned = _step_aligned(window, current, check.aggregation, check.history_runs, MODE_RECENT)
    before = _step_aligned(window, earlier, check.aggregation, check.history_runs, 0)
    checked = CheckedWindow(check, value, tuple(aligned.values), tuple(f.run for f in aligned.runs),
                            tuple(before.values), compute_bounds(check.condition, aligned.values, before.values,
                                                                 aligned.recent))
    adjusted = _run_offset(state, window, check, aligned, before)
    if adjusted is None:
        return checked
    share, size, aligned, before = adjusted
    bounds = compute_bounds(check.condition, aligned.values, before.values, aligned.recent)
    return CheckedWindow(check, value, tuple(aligned.values), tuple(f.run for f in aligned.runs),
                         tuple(before.values), _shifted(bounds, share * size), share * size, share, checked)


def _shifted(bounds: Optional[Bounds], shift: float) -> Optional[Bounds]:
    if bounds is None or not shift:
        return bounds

    def moved(at: Optional[float]) -> Optional[float]:
        return None if at is None else at + shift
    return Bounds(lower=moved(bounds.lower), upper=moved(bounds.upper), centre=moved(bounds.centre),
                  improvement=moved(bounds.improvement))


def check_window(state: WindowHistory, window: WindowResult, config: TagWindowConfig) -> List[Alert]:
    """Checks one window with every configured check; returns the alerts that fire."""
    open_run = state.open_runs.setdefault(window.run, _OpenRun())
    alerts = []
    judged: Dict[str, bool] = {}  # step-aligned aggregation -> whether a check of it counted this window out
    for check in config.checks:
        checked = window_bounds(state, window, check)
        bounds, value, out = checked.bounds, checked.value, checked.out_of_bounds
        if out:
            open_run.out_of_bounds.setdefault(check.aggregation, set()).add(window.index)
        if check.history == "step_aligned":
            _count_improved(open_run, checked)
            if bounds is not None and value is not None:
                judged[check.aggregation] = judged.get(check.aggregation, False) or out
        debounce = state.debounce.setdefault(
            (window.run, check.aggregation),
            _Debounce(collections.deque(maxlen=check.debounce_windows)))
        debounce.recent.append(out)
        tripped = sum(debounce.recent) >= check.debounce_out_of_bounds
        if tripped:
            open_run.tripped.add(check.aggregation)
        if (tripped and not debounce.firing and bounds is not None and value is not None
                and not _continues_a_level(state, check, open_run)):
            alerts.append(_alert(window, checked))
        debounce.firing = tripped
    for aggregation in {check.aggregation for check in config.checks if check.history == "step_aligned"}:
        leading, value = open_run.leading.setdefault(aggregation, []), window.values.get(aggregation)
        if value is not None and len(leading) < RUN_OFFSET_WINDOWS:
            leading.append(value)
        within = open_run.opening_within.get(aggregation, 0)
        if aggregation in judged and 0 <= within < OPENING_WINDOWS:
            open_run.opening_within[aggregation] = -1 if judged[aggregation] else within + 1
    open_run.windows.append(window)
    return alerts


def _count_improved(open_run: _OpenRun, checked: CheckedWindow) -> None:
    """Counts a judged window of a one-sided check into its run's [improved, judged] windows: improved when it
    lies ``IMPROVED_SHARE`` of the way to the improvement bound and beyond all but ``MODE_SHARE`` of its history
    (a level the history already holds as a mode, a faster machine type, is no new level). Both as they were,
    without the runs' offsets, which would take a run-wide improvement for the run's own standing."""
    value, bounds, history = checked.value, checked.as_it_was.bounds, checked.as_it_was.history
    if value is None or bounds is None or bounds.centre is None or bounds.improvement is None:
        return
    reach = bounds.improvement - bounds.centre  # towards the better side
    if not reach or not history:
        return
    counts = open_run.improved.setdefault(checked.check.aggregation, [0, 0])
    counts[1] += 1
    if (value - bounds.centre) / reach >= IMPROVED_SHARE:
        as_good = sum(1 for earlier in history if (earlier - value) * reach >= 0)
        counts[0] += as_good <= MODE_SHARE * len(history)


def _improved_run(open_run: _OpenRun, aggregation: str) -> bool:
    improved, judged = open_run.improved.get(aggregation, (0, 0))
    return judged >= MIN_JUDGED and 2 * improved >= judged


def _continues_a_level(state: WindowHistory, check: WindowCheck, open_run: _OpenRun) -> bool:
    """Whether the check also tripped in the previous successful run and this run did not open within bounds (its
    first ``OPENING_WINDOWS`` judged windows): a level that moved was announced live in the first run of its
    streak; the following runs are reported by the run-level checks (``metric_out_of_bounds``, then
    ``baseline_shifted``), not again by every window check. A run that opened within bounds and trips later is a
    fault of its own (a slow host twice in a row), alerted live again."""
    return (check.history == "step_aligned" and bool(state.streaks.get(check.aggregation))
            and open_run.opening_within.get(check.aggregation, 0) < OPENING_WINDOWS)


def _alert(window: WindowResult, checked: CheckedWindow) -> Alert:
    check, value, bounds = checked.check, checked.value, checked.bounds
    assert value is not None and bounds is not None
    metric = window_metric(window.tag, check.aggregation)
    history, previous = list(checked.history), list(checked.previous)
    facts = threshold_facts(check.condition, bounds, history, previous)
    # the value compared last, as it was: the same-step window of the latest compared run, or this run's previous one
    last = checked.as_it_was
    runs = list(last.compared) if check.history == "step_aligned" else [window.run] * len(last.history)
    alert = Alert(
        kind=AlertKind.WINDOW_OUT_OF_BOUNDS, test=window.test, run=window.run, metric=metric, value=value,
        lower_bound=bounds.lower, upper_bound=bounds.upper, created_at=window.end_time,
        instance=f"{window.kind}/{window.index}", message="",
        details={"window": {"kind": window.kind, "index": window.index, "start_time": window.start_time,
                            "end_time": window.end_time, "start_step": window.start_step,
                            "end_step": window.end_step, "n": window.n, "partial": window.partial},
                 "history": check.history, "history_size": len(history), "compared_runs": list(checked.compared),
                 "comparison": check.condition.comparison.value, **threshold_details(check.condition, bounds), **facts,
                 **change_facts(value, reference(bounds, check.condition), facts["scale"]),
                 **previous_facts(last.history, runs), "step": window.end_step,
                 **({"run_offset": checked.run_offset, "run_offset_share": checked.run_offset_share}
                    if checked.run_offset else {}),
                 "debounce": f"{check.debounce_out_of_bounds} of {check.debounce_windows}"})
    return dataclasses.replace(alert, message=describe(alert))


NUMERIC_AGGREGATIONS = ("last", "mean", "min", "max", "sum", "stddev", "p50", "p90", "p99")


def window_from_row(row: Sequence[Any]) -> WindowResult:
    """A stored window read back (the seed's, the report's and the dashboard's queries): ``row`` holds its first
    11 fields in ``WindowResult``'s order (its times in epoch seconds), then one value per
    ``NUMERIC_AGGREGATIONS``, NULL where the window did not compute it, then, if it has one, its
    ``history_segment`` (NULL: "")."""
    (test, run, tag, kind, index, start_time, end_time, start_step, end_step, n, partial) = row[:11]
    values = row[11:11 + len(NUMERIC_AGGREGATIONS)]
    segment = row[11 + len(NUMERIC_AGGREGATIONS)] if len(row) > 11 + len(NUMERIC_AGGREGATIONS) else None
    return WindowResult(test, run, tag, kind, index, start_time, end_time, start_step, end_step, n, partial,
                        {a: v for a, v in zip(NUMERIC_AGGREGATIONS, values) if v is not None}, segment=segment or "")


WINDOW_ROW_COLUMNS = ("start_step", "end_step", "n", "partial", *NUMERIC_AGGREGATIONS, "history_segment")
"""What ``window_from_row`` reads after a window's key and times, in its order."""


def runs_compared(config: TagWindowConfig) -> int:
    """How many finished runs the step-aligned checks of one tag look back at (what its history keeps)."""
    return max((c.history_runs for c in config.checks), default=0)


def seed_window_history(runs: List[Tuple[float, str, List[WindowResult]]], config: TagWindowConfig,
                        rebaseline_after: int, actions: Sequence[WindowTriage] = ()) -> WindowHistory:
    """Rebuilds one (test, tag, kind)'s step-aligned history from stored (finalized_at, run, windows)
    of successful runs and the triage actions that reach it, by checking them again in the event-time
    order the pipeline saw them in: which windows counted as out of bounds and where the level last
    moved are not stored, but follow from the windows and the actions."""
    history = WindowHistory()
    for item in _in_event_order([(f, run, RunStatus.SUCCESS, windows) for f, run, windows in runs], actions):
        _step_again(history, item, config, rebaseline_after)
    return history


def replay_window_checks(runs: Sequence[Tuple[Optional[float], str, str, Sequence[WindowResult]]],
                         config: TagWindowConfig, rebaseline_after: int, actions: Sequence[WindowTriage] = ()
                         ) -> Dict[Tuple[str, int], Tuple[CheckedWindow, ...]]:
    """What each of ``config.checks`` compared each stored window with, per (run, window index).

    ``runs`` are one (test, tag, kind)'s stored (finalized_at, run, status, windows) of every run,
    finished or not (None: not finalized yet); they are checked again as :func:`seed_window_history`
    does, so a window is compared with what the live check had: only earlier successful runs, without
    their out-of-bounds windows, from where the level last moved, with the triage ``actions`` applied.
    """
    history = WindowHistory()
    checked: Dict[Tuple[str, int], Tuple[CheckedWindow, ...]] = {}
    for item in _in_event_order(runs, actions):
        if isinstance(item, WindowResult):
            judging = history.judging(item.segment, item.run)
            checked[(item.run, item.index)] = tuple(window_bounds(judging, item, check) for check in config.checks)
        _step_again(history, item, config, rebaseline_after)
    return checked


def _step_again(state: WindowHistory, item: Any, config: TagWindowConfig, rebaseline_after: int) -> None:
    """Steps a stored item again; a triage action the job refused (a dead letter then) changes nothing now."""
    with contextlib.suppress(Refused):
        step_window_history(state, item, config, rebaseline_after)


def _in_event_order(runs: Sequence[Tuple[Optional[float], str, str, Sequence[WindowResult]]],
                    actions: Sequence[WindowTriage]) -> List[Any]:
    """The windows, run ends (of the finalized runs) and triage actions, in the order the pipeline steps them."""
    items: List[Any] = list(actions)
    for finalized_at, run, status, windows in runs:
        items += windows
        if finalized_at is not None and windows:
            items.append(RunEnded(windows[0].test, run, status, finalized_at, windows[0].tag, windows[0].kind))
    return sorted(items, key=lambda i: i.order)


def step_window_history(state: WindowHistory, item: Any, config: Optional[TagWindowConfig],
                        rebaseline_after: int) -> List[Alert]:
    """One item of a (test, tag, kind): a window to check (against its segment's history), a run's end (in the
    history holding the run) or a triage action."""
    if isinstance(item, RunEnded):
        end_run(state.holding(item.run), item, config, rebaseline_after)
        return []
    if isinstance(item, WindowTriage):
        apply_window_triage(state, item)
        return []
    return check_window(state.judging(item.segment, item.run), item, config) if config else []


def end_run(state: WindowHistory, ended: RunEnded, config: Optional[TagWindowConfig], rebaseline_after: int) -> None:
    """A run ended: its windows become step-aligned history if it succeeded; its debounce state goes.

    A successful run extends the streak of each step-aligned check that tripped
    in it and ends the streak of the others; a streak of ``rebaseline_after``
    runs (0: never) moves the check's history to start at the streak's first run.
    So does a streak of improved runs (``_improved_run``). Failed runs neither
    extend nor end a streak.
    """
    open_run = state.open_runs.pop(ended.run, _OpenRun())
    for key in [k for k in state.debounce if k[0] == ended.run]:
        del state.debounce[key]
    if ended.status != RunStatus.SUCCESS or not open_run.windows or config is None:
        return
    finished = FinishedRun(ended.run, open_run.windows,
                           {agg: frozenset(indices) for agg, indices in open_run.out_of_bounds.items()},
                           {agg: tuple(values) for agg, values in open_run.leading.items() if values})
    state.finished_runs.append(finished)
    for check in config.checks:
        if check.history != "step_aligned":
            continue
        if state.pending_accepts.get(check.aggregation) == ended.run:
            del state.pending_accepts[check.aggregation]
            _move_level(state, check.aggregation, ended.run)
            continue
        streak = state.streaks.setdefault(check.aggregation, [])
        improving = state.improving.setdefault(check.aggregation, [])
        if _improved_run(open_run, check.aggregation):
            improving.append(ended.run)
        else:
            improving.clear()
        if check.aggregation not in open_run.tripped:
            streak.clear()
        else:
            streak.append(ended.run)
        if rebaseline_after and len(streak) >= rebaseline_after:
            _move_level(state, check.aggregation, streak[0])  # (the successful runs since its first are the streak)
        elif rebaseline_after and len(improving) >= rebaseline_after:
            _move_level(state, check.aggregation, improving[0])
    _forget_old_levels(state, config)


def _forget_old_levels(state: WindowHistory, config: TagWindowConfig) -> None:
    """Keeps twice the runs the checks compare with (room for runs whose windows were left out, and
    for the runs before a new level, whose scale bridges its warm-up); a new level is no longer
    new once it fills a check's ``history_runs``."""
    runs = [finished.run for finished in state.finished_runs]
    for check in config.checks:
        start = state.rebased_from.get(check.aggregation)
        if start is not None and (start not in runs or len(runs) - runs.index(start) >= check.history_runs):
            del state.rebased_from[check.aggregation]
    while len(state.finished_runs) > 2 * runs_compared(config):
        state.finished_runs.popleft()


# -- the state in parts ------------------------------------------------------------------------------------------
#
# A streaming job keeps a (test, tag, kind)'s history in parts (``transforms.window_checks``): what changes at every
# window (debounces, open runs' verdicts: ``live_part``), the finished runs (changed by run ends and triage only),
# a small view of them for the steps being checked now (``NearWindows``), and a log of the open runs' windows,
# each added once (``take_unlogged``). A history with segments (``history_by``) keeps each segment's in the same
# parts: the finished runs by segment (``settled_runs``), a near view per segment, the log's windows each back in
# its segment. The functions below make and join the parts; the checks see one ``WindowHistory`` either way.

NEAR_SPANS_AHEAD = 16
NEAR_SPANS_BEHIND = 2
"""How far ``near_windows`` reaches past the windows it is made for, and before them (for the windows of runs a
little behind, due in the next firings): these many times the widest one's steps."""


def settles(item: Any) -> bool:
    """Whether stepping ``item`` may change the finished runs or drop an open run's windows: a run's end or a
    triage action (a window check only reads the finished runs and adds to its own run's windows)."""
    return isinstance(item, (RunEnded, WindowTriage))


def _step_span(window: WindowResult) -> Optional[Tuple[int, int]]:
    """The lowest and highest step of ``window`` (None: it has no steps, and shares none with any window)."""
    if window.start_step is None or window.end_step is None:
        return None
    return min(window.start_step, window.end_step), max(window.start_step, window.end_step)


@record("NearWindows")
@dataclasses.dataclass
class NearWindows:
    """The finished runs, in order, each with its ``excluded`` and, of its windows that share a step with steps
    [low, high], what a check of ``aggregations`` reads (``StepWindow``): what checking a window within those
    steps reads of them. ``FinishedRun.most_overlapping`` picks among the windows that share a step with the one
    checked, by overlap, index and order, so it picks the same one from these as from all of a run's windows."""
    low: int
    high: int
    aggregations: Tuple[str, ...]  # sorted
    runs: List[FinishedRun]

    def covers(self, window: WindowResult, aggregations: Iterable[str]) -> bool:
        """Whether checking ``window`` by ``aggregations`` reads only what these hold."""
        span = _step_span(window)
        return (span is None or (self.low <= span[0] and span[1] <= self.high)) and set(aggregations) <= set(
            self.aggregations)


def near_windows(runs: Iterable[FinishedRun], windows: Sequence[WindowResult],
                 aggregations: Iterable[str]) -> NearWindows:
    """The view of ``runs`` that covers ``windows`` and reaches ``NEAR_SPANS_AHEAD`` times the widest one's steps
    past the highest and ``NEAR_SPANS_BEHIND`` times before the lowest (the windows to come of the runs open
    now), so that the next checks need not read every finished run again."""
    kept = tuple(sorted(set(aggregations)))
    spans = [span for span in map(_step_span, windows) if span is not None]
    if not spans:
        return NearWindows(0, -1, kept, [FinishedRun(f.run, [], f.excluded, f.leading) for f in runs])
    widest = max(end - start + 1 for start, end in spans)
    low = min(start for start, _ in spans) - NEAR_SPANS_BEHIND * widest
    high = max(end for _, end in spans) + NEAR_SPANS_AHEAD * widest
    return NearWindows(low, high, kept, [FinishedRun(f.run, [_step_window(w, kept) for w in f.windows
                                                             if _shares_steps(w, low, high)], f.excluded, f.leading)
                                         for f in runs])


def _step_window(window: HistoryWindow, aggregations: Tuple[str, ...]) -> StepWindow:
    """What a check of ``aggregations`` reads of ``window`` (an aggregation it has no value of stays absent)."""
    return StepWindow(window.index, window.start_step, window.end_step,
                      {aggregation: window.values[aggregation] for aggregation in aggregations
                       if aggregation in window.values})


def _shares_steps(window: HistoryWindow, low: int, high: int) -> bool:
    """Whether ``window`` may share a step with a window within steps [low, high] (``window_overlap`` >= 0)."""
    return (window.start_step is not None and window.end_step is not None
            and window.start_step <= high and window.end_step >= low)


def is_whole(history: WindowHistory) -> bool:
    """Whether ``history`` (or one of its segments) holds finished runs or open runs' windows: a whole state (one
    cell, or a seed's), not the ``live_part`` of one kept in parts."""
    return any(part.finished_runs or any(open_run.windows for open_run in part.open_runs.values())
               for _, part in history.parts())


def live_part(history: WindowHistory) -> WindowHistory:
    """``history`` without its finished runs and its open runs' windows (which are kept apart), nor its
    segments'."""
    return dataclasses.replace(history, finished_runs=collections.deque(), open_runs={
        run: dataclasses.replace(open_run, windows=[]) for run, open_run in history.open_runs.items()},
        segments={segment: live_part(part) for segment, part in history.segments.items()})


SettledRuns = Union[Sequence[FinishedRun], Dict[str, Sequence[FinishedRun]]]
"""What ``<name>_settled`` holds: the finished runs, or with segments, each segment's ("": the key's own)."""


def settled_runs(history: WindowHistory) -> SettledRuns:
    """The finished runs as the settled part keeps them: a key without segments as before them."""
    if not history.segments:
        return history.finished_runs
    return {segment: part.finished_runs for segment, part in history.parts()}


def by_segment(settled: Optional[SettledRuns]) -> Dict[str, Sequence[FinishedRun]]:
    """A settled part's finished runs by segment ("": the key's own)."""
    if settled is None:
        return {}
    return dict(settled) if isinstance(settled, dict) else {"": settled}


def take_unlogged(history: WindowHistory, everything: bool, holds_logged: bool) -> List[Tuple[int, WindowResult]]:
    """(position in its run, window) of each open run's window not yet in the log (its segments' too), oldest
    first, which from now on count as logged; every window (from position 0) when ``everything`` (the log is
    written anew). ``holds_logged``: the runs' ``windows`` hold the logged ones too (the log was read), not only
    those since."""
    taken = []
    for _, part in history.parts():
        for open_run in part.open_runs.values():
            first = 0 if everything else open_run.logged
            held = open_run.windows[open_run.logged:] if holds_logged and not everything else open_run.windows
            taken += [(first + i, window) for i, window in enumerate(held)]
            open_run.logged = first + len(held)
    return taken


def put_back_logged(history: WindowHistory, logged: Iterable[Tuple[int, WindowResult]]) -> None:
    """Puts the log's windows back before the windows of their open runs (in their segment's history), in their
    positions' order."""
    by_run: Dict[Tuple[str, str], List[Tuple[int, WindowResult]]] = collections.defaultdict(list)
    for position, window in logged:
        by_run[(window.segment, window.run)].append((position, window))
    for (segment, run), entries in by_run.items():
        open_run = history.part(segment).open_runs.setdefault(run, _OpenRun())
        entries.sort(key=operator.itemgetter(0))
        open_run.windows = [window for _, window in entries] + open_run.windows
