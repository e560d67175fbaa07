"""Checks of live windows against history, as a pure state machine per (test, tag, window kind).

A window of a running run is compared with either

- ``step_aligned`` history: in each of the last K successful runs of the test,
  the window overlapping the most steps of this one (loss at steps 1000-1099
  against the same steps before), or
- ``trailing`` history: the previous J windows of the same run (spikes,
  divergence, stalls in throughput),

with the spine's condition language (``core.bounds``). An out-of-bounds
value only counts when it is at least ``min_effect_abs`` away from the
reference (the history mean, or the fixed value) and ``min_effect_rel`` times
its magnitude, so that tiny deviations of very stable metrics stay quiet.
A (run, check) alerts once M of its last N windows counted, and not again
until it recovers (fewer than M of the last N).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Tuple

from core.bounds import Bounds, compute_bounds, is_within
from core.config import TagWindowConfig, WindowCheck
from core.records import Alert
from core.stats import mean_and_pstdev
from core.vocabulary import AlertKind, RunStatus
from core.windows import WindowResult


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


@dataclasses.dataclass
class _Debounce:
    recent: Deque[bool]
    firing: bool = False


@dataclasses.dataclass
class WindowHistory:
    """State of one (test, tag, window kind)."""
    # Oldest first; trimmed to what the checks compare (``keep_runs``) as runs end, never to a fixed size.
    finished_runs: Deque[Tuple[str, List[WindowResult]]] = dataclasses.field(default_factory=collections.deque)
    open_runs: Dict[str, List[WindowResult]] = dataclasses.field(default_factory=dict)
    debounce: Dict[Tuple[str, str], _Debounce] = dataclasses.field(default_factory=dict)


def _overlap(a: WindowResult, b: WindowResult) -> int:
    if a.start_step is None or b.start_step is None or a.end_step is None or b.end_step is None:
        return -1
    return min(a.end_step, b.end_step) - max(a.start_step, b.start_step)


def step_aligned_history(window: WindowResult, runs: List[Tuple[str, List[WindowResult]]],
                         aggregation: str) -> Tuple[List[float], List[str]]:
    """From each run, the value of its window overlapping ``window``'s steps the most."""
    values, compared = [], []
    for run, windows in runs:
        overlapping = [w for w in windows if _overlap(w, window) >= 0]
        if overlapping:
            best = max(overlapping, key=lambda w: (_overlap(w, window), -w.index))
            value = best.values.get(aggregation)
            if value is not None:
                values.append(value)
                compared.append(run)
    return values, compared


def _reference(check: WindowCheck, history: List[float]) -> float:
    if check.condition.fixed_value is not None:
        return check.condition.fixed_value
    return mean_and_pstdev(history)[0]


def counts_as_out_of_bounds(value: float, bounds: Bounds, check: WindowCheck, history: List[float]) -> bool:
    if is_within(value, bounds, check.condition.comparison):
        return False
    reference = _reference(check, history)
    effect = abs(value - reference)
    return effect >= check.min_effect_abs and effect >= check.min_effect_rel * abs(reference)


def check_window(state: WindowHistory, window: WindowResult, config: TagWindowConfig) -> List[Alert]:
    """Checks one window with every configured check; returns the alerts that fire."""
    run_windows = state.open_runs.setdefault(window.run, [])
    alerts = []
    for check in config.checks:
        if check.history == "trailing":
            previous = [v for v in (w.values.get(check.aggregation) for w in run_windows[-check.trailing_windows:])
                        if v is not None]
            history, compared = previous, [window.run] if previous else []
        else:
            recent_runs = list(state.finished_runs)[-check.history_runs:]
            history, compared = step_aligned_history(window, recent_runs, check.aggregation)
        bounds = compute_bounds(check.condition, history)
        value = window.values.get(check.aggregation)
        out = value is not None and bounds is not None and counts_as_out_of_bounds(value, bounds, check, history)
        debounce = state.debounce.setdefault(
            (window.run, check.aggregation),
            _Debounce(collections.deque(maxlen=check.debounce_windows)))
        debounce.recent.append(out)
        tripped = sum(debounce.recent) >= check.debounce_out_of_bounds
        if tripped and not debounce.firing and bounds is not None and value is not None:
            alerts.append(_alert(window, check, value, bounds, history, compared))
        debounce.firing = tripped
    run_windows.append(window)
    return alerts


def _alert(window: WindowResult, check: WindowCheck, value: float, bounds: Bounds, history: List[float],
           compared: List[str]) -> Alert:
    metric = f"{window.tag}_{check.aggregation}"
    return Alert(
        kind=AlertKind.WINDOW_OUT_OF_BOUNDS, test=window.test, run=window.run, metric=metric, value=value,
        lower_bound=bounds.lower, upper_bound=bounds.upper, created_at=window.end_time,
        instance=f"{window.kind}/{window.index}",
        message=(f"{metric} = {value:.6g} in {window.kind} window {window.index} (steps {window.start_step}-"
                 f"{window.end_step}) is outside bounds from {len(history)} {check.history} values"),
        details={"window": {"kind": window.kind, "index": window.index, "start_time": window.start_time,
                            "end_time": window.end_time, "start_step": window.start_step,
                            "end_step": window.end_step, "n": window.n, "partial": window.partial},
                 "history": check.history, "history_size": len(history), "compared_runs": compared,
                 "comparison": check.condition.comparison,
                 "debounce": f"{check.debounce_out_of_bounds} of {check.debounce_windows}"})


NUMERIC_AGGREGATIONS = ("last", "mean", "min", "max", "sum", "stddev", "p50", "p90", "p99")


def runs_compared(config: TagWindowConfig) -> int:
    """How many finished runs the step-aligned checks of one tag look back at (what its history keeps)."""
    return max((c.history_runs for c in config.checks), default=0)


def seed_window_history(runs: List[Tuple[float, str, List[WindowResult]]], keep_runs: int) -> WindowHistory:
    """Rebuilds one (test, tag, kind)'s step-aligned history from stored (finalized_at, run, windows)."""
    history = WindowHistory()
    for _, run, windows in sorted(runs, key=lambda r: (r[0], r[1]))[-keep_runs:] if keep_runs else []:
        history.finished_runs.append((run, sorted(windows, key=lambda w: w.index)))
    return history


def end_run(state: WindowHistory, ended: RunEnded, keep_runs: int) -> None:
    """A run ended: its windows become step-aligned history if it succeeded; its debounce state goes."""
    windows = state.open_runs.pop(ended.run, [])
    if ended.status == RunStatus.SUCCESS and windows:
        state.finished_runs.append((ended.run, windows))
        while len(state.finished_runs) > keep_runs:
            state.finished_runs.popleft()
    for key in [k for k in state.debounce if k[0] == ended.run]:
        del state.debounce[key]
