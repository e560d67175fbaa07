"""The live windows of a distributed run's ranks: combined into the run's own, and compared with each other.

A tag whose windows need every rank (``core.config.ranks_matter``: a rank
reduction other than ``rank0``, or a ``rank_check``) is windowed per rank
(``transforms.windows``). This state machine, one per (test, run, tag), gathers
the ranks' windows of each index and, once every rank below the world size has
one (or the run has ended, for the ranks that have one):

- combines them into the run's window of that index, each aggregation reduced
  across ranks as the tag's run-level metrics are (``core.runs.reduce_across_ranks``);
  the window checks and the ``metric_windows`` table see only these;
- with a ``rank_check``, judges each rank's value against the other ranks' in the
  same window (the condition language, e.g. ``mads_from_median``: a robust centre
  and scale of the others), and raises ``rank_straggler`` naming the rank and its
  host once M of the rank's last N windows were out of bounds, then not again
  until it recovers.

Windows of one rank reach it in index order (event-time order), so an index is
complete only after every earlier one: the debounce sees windows in index order
whatever the arrival order of the ranks' messages.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Optional, Set, Tuple

from core.alert_details import change_facts, describe, threshold_facts
from core.bounds import Bounds, compute_bounds, judge, reference, threshold_details
from core.config import RankCheck, TagWindowConfig
from core.records import Alert
from core.registry import record
from core.runs import reduce_across_ranks
from core.triage import window_metric
from core.vocabulary import AlertKind
from core.windows import WindowResult

MIN_OTHER_RANKS = 2  # a rank is compared with at least this many others (one other rank is no crowd)


@record("RankWindows")
@dataclasses.dataclass
class RankWindows:
    """The state of one (test, run, tag) of a distributed run."""
    pending: Dict[int, Dict[int, WindowResult]] = dataclasses.field(default_factory=dict)  # index -> rank -> window
    combined: Set[int] = dataclasses.field(default_factory=set)  # indices already combined
    world_size: Optional[int] = None
    recent: Dict[int, Deque[bool]] = dataclasses.field(default_factory=dict)  # rank -> out of bounds, latest last
    firing: Dict[int, bool] = dataclasses.field(default_factory=dict)
    hosts: Dict[int, str] = dataclasses.field(default_factory=dict)
    ended_at: Optional[float] = None  # event time the run ended: its state is forgotten a retention later


def add_rank_window(state: RankWindows, window: WindowResult, config: TagWindowConfig,
                    reduction: str) -> Tuple[List[WindowResult], List[Alert]]:
    """Takes one rank's window; returns the run's windows and straggler alerts that are now complete."""
    assert window.rank is not None
    if window.world_size is not None:
        state.world_size = max(state.world_size or 0, window.world_size)
    if window.host:
        state.hosts[window.rank] = window.host
    if window.index in state.combined:
        return [], []  # that index was combined at the run's end without this rank
    state.pending.setdefault(window.index, {})[window.rank] = window
    complete = state.world_size is not None and all(
        rank in state.pending[window.index] for rank in range(state.world_size))
    return _combine(state, [window.index], config, reduction) if complete else ([], [])


def close_rank_windows(state: RankWindows, config: TagWindowConfig, reduction: str,
                       ended_at: float) -> Tuple[List[WindowResult], List[Alert]]:
    """The run ended at ``ended_at``: combines every pending index from the ranks that have it, in index order."""
    state.ended_at = ended_at
    return _combine(state, sorted(state.pending), config, reduction)


def _combine(state: RankWindows, indices: List[int], config: TagWindowConfig,
             reduction: str) -> Tuple[List[WindowResult], List[Alert]]:
    windows, alerts = [], []
    for index in indices:
        by_rank = state.pending.pop(index)
        state.combined.add(index)
        windows.append(combined_window(by_rank, reduction))
        if config.rank_check is not None:
            alerts += _check_ranks(state, by_rank, config.rank_check)
    return windows, alerts


def combined_window(by_rank: Dict[int, WindowResult], reduction: str) -> WindowResult:
    """The run's window from its ranks' windows of one index: each aggregation reduced across ranks."""
    ranks = sorted(by_rank)
    first = by_rank[ranks[0]]
    values: Dict[str, Optional[float]] = {}
    for aggregation in first.values:
        present = [(rank, by_rank[rank].values.get(aggregation)) for rank in ranks]
        numbers = [(rank, value, None) for rank, value in present if isinstance(value, float)]
        values[aggregation] = reduce_across_ranks(aggregation, numbers, reduction).value if numbers else None
    steps = [s for w in by_rank.values() for s in (w.start_step, w.end_step) if s is not None]
    return WindowResult(first.test, first.run, first.tag, first.kind, first.index,
                        min(w.start_time for w in by_rank.values()), max(w.end_time for w in by_rank.values()),
                        min(steps) if steps else None, max(steps) if steps else None,
                        sum(w.n for w in by_rank.values()), any(w.partial for w in by_rank.values()), values,
                        segment=first.segment)


def _check_ranks(state: RankWindows, by_rank: Dict[int, WindowResult], check: RankCheck) -> List[Alert]:
    values = {rank: w.values.get(check.aggregation) for rank, w in by_rank.items()}
    numbers = {rank: v for rank, v in values.items() if isinstance(v, float)}
    alerts = []
    for rank in sorted(numbers):
        others = [v for other, v in sorted(numbers.items()) if other != rank]
        if len(others) < max(MIN_OTHER_RANKS, check.condition.wait_for_n_points_of_history):
            continue
        bounds = compute_bounds(check.condition, others)
        out = bounds is not None and not judge(numbers[rank], bounds, check.condition)
        recent = state.recent.setdefault(rank, collections.deque(maxlen=check.debounce_windows))
        recent.append(out)
        tripped = sum(recent) >= check.debounce_out_of_bounds
        if tripped and not state.firing.get(rank) and bounds is not None:
            alerts.append(_straggler(by_rank[rank], numbers, check, bounds, state.hosts.get(rank)))
        state.firing[rank] = tripped
    return alerts


def _straggler(window: WindowResult, numbers: Dict[int, float], check: RankCheck, bounds: Bounds,
               host: Optional[str]) -> Alert:
    assert window.rank is not None
    rank = window.rank
    metric = window_metric(window.tag, check.aggregation)
    others = [v for other, v in sorted(numbers.items()) if other != rank]
    facts = threshold_facts(check.condition, bounds, others)
    alert = Alert(
        kind=AlertKind.RANK_STRAGGLER, test=window.test, run=window.run, metric=metric, value=numbers[rank],
        lower_bound=bounds.lower, upper_bound=bounds.upper, created_at=window.end_time,
        instance=f"{rank}/{window.kind}/{window.index}", message="",
        details={"rank": rank, "host": host,
                 "window": {"kind": window.kind, "index": window.index, "start_time": window.start_time,
                            "end_time": window.end_time, "start_step": window.start_step,
                            "end_step": window.end_step, "n": window.n, "partial": window.partial},
                 "values_by_rank": {str(r): v for r, v in sorted(numbers.items())},
                 "comparison": check.condition.comparison.value, **threshold_details(check.condition, bounds), **facts,
                 **change_facts(numbers[rank], reference(bounds, check.condition), facts["scale"]),
                 "step": window.end_step,
                 "debounce": f"{check.debounce_out_of_bounds} of {check.debounce_windows}"})
    return dataclasses.replace(alert, message=describe(alert))
