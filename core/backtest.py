"""The backtest: what the checks would have said of the stored history under other configs.

The store keeps every finalized run (``job_history``), its aggregated metrics
(``metric_history``), the live windows (``metric_windows``), the triage actions
(``triage``) and what fired (``alerts``), but no raw points. :func:`backtest`
feeds those records, per key and in the event-time order the pipeline uses
(``item.order``, as ``transforms.ordered`` does), through the same pure state
machines the pipeline runs (``check_metric``, ``check_job``, ``check_window`` /
``end_run``), starting from empty state, and compares the alerts they raise
with the stored ones, per test and alert kind. Alert ids are deterministic
(``Alert.alert_id``), so "the same alert" is "the same id".

What can and cannot be re-evaluated without the raw points:

- Metric bounds (``metric_out_of_bounds``, ``baseline_shifted``), failed and
  missing runs (``job_failed``, ``run_missing``) and window checks
  (``window_out_of_bounds``) are exact: their inputs are stored as they were
  checked. Window checks see the latest revision of each stored window (as the
  start-up seed does, ``sinks.seed``); the pipeline checks the first, which
  differs only for windows a late point revised.
- Only the stored metrics exist: a config that collects an aggregate (or tag)
  the stored config did not has no value for it, and one that drops an
  aggregate or ignores a tag drops its stored values (:func:`collected`).
  Window specs (``count``, ``time_seconds``) cannot change: stored windows are
  checked when the config windows their tag with the same kind, else skipped.
- ``required_metric_missing``: exact for the stored metrics; a required metric
  that only the new config would collect is reported missing.
- ``accuracy_not_reached``: whether the accuracy tag reached the threshold is
  read from its stored aggregates (:func:`accuracy_missed`): exact when one of
  them reaches it or ``<tag>_max`` is stored; otherwise the stored
  ``time_to_accuracy`` value says it was reached under the stored config.
  The ``time_to_accuracy`` value itself is the stored one (its threshold's).
- Triage: stored accepts and dismisses move or widen the histories at their
  event time, as in the pipeline; a mute changes nothing here (a muted alert
  is stored, marked muted, so it counts as fired).
- A changed reduction across the ranks of distributed runs is not
  re-evaluated: ``metric_history`` holds the reduced values.
- ``run_stalled`` needs the times of the raw messages, and ``config_rejected``
  is about the config files a running job read, not about runs: stored alerts
  of these kinds are carried over as they were and reported as not
  re-evaluated (:data:`NOT_RE_EVALUATED`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

from core.config import (
    STRATEGIES,
    TIME_TO_ACCURACY_METRIC,
    TOTAL_WALL_TIME_METRIC,
    Configs,
    MetricCollectionConfig,
    RegressionTestConfig,
)
from core.history import (
    JobHistory,
    MetricHistory,
    apply_metric_triage,
    check_job,
    check_metric,
    history_policy,
    history_segment,
)
from core.records import Alert, MetricObservation
from core.runs import MetricValue, RankedEvent, RunResult, effective_rank
from core.triage import AlertFacts, TriageItem
from core.vocabulary import AlertKind
from core.window_checks import (
    RunEnded,
    WindowHistory,
    reaches_run_level_history,
    step_window_history,
    window_triage_targets,
)
from core.windows import WindowResult
from trainguard import wire

NOT_RE_EVALUATED = frozenset({AlertKind.RUN_STALLED, AlertKind.CONFIG_REJECTED})
"""Kinds whose inputs the store does not keep: carried over from the stored alerts as they fired."""


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """One ``job_history`` row with the run's ``metric_history`` values: a finalized run as the store keeps it."""
    test: str
    run: str
    status: str
    num_failures: Optional[int]
    start_time: Optional[float]
    end_time: float
    finalized_at: float  # processed_at: the event time the pipeline finalized the run
    events: Tuple[RankedEvent, ...] = ()
    metrics: Tuple[MetricValue, ...] = ()


@dataclasses.dataclass(frozen=True)
class StoredHistory:
    """Everything the backtest reads of a store."""
    runs: Sequence[StoredRun]
    windows: Sequence[WindowResult] = ()   # the latest revision of every stored window
    alerts: Sequence[AlertFacts] = ()      # what fired
    actions: Sequence[TriageItem] = ()     # triage actions, applied at their event time


Key = Tuple[str, Tuple[str, ...]]
"""A state machine's key: ("metric", (test, metric)), ("job", (test,)) or ("window", (test, tag, kind))."""


class Ordered(Protocol):
    """An item of a keyed state machine; ``order`` starts with its event time (``transforms.ordered``)."""

    @property
    def order(self) -> Tuple[Any, ...]: ...


def step_in_event_time_order(state: Any, step: Callable[[Any, Any], Iterable[Alert]], items: Iterable[Ordered],
                             extra_items: Iterable[Ordered] = (),
                             errors: Optional[List[str]] = None) -> List[Alert]:
    """Feeds one key's items to ``step(state, item)`` in ``item.order`` order; returns the alerts it raises.

    The one place the backtest merges and steps, as ``transforms.ordered`` does
    per key in the pipeline. ``extra_items`` are more ordered items of the same
    key merged into the same order (control items such as triage actions,
    whose ``order`` is ``(time, "", action_id)``: before the runs of the same
    instant). An item whose step raises is skipped and described in
    ``errors`` (the pipeline dead-letters it), and the key goes on.
    """
    alerts: List[Alert] = []
    for item in sorted([*items, *extra_items], key=lambda i: i.order):
        try:
            alerts.extend(step(state, item))
        except Exception as error:  # noqa: BLE001 - one bad item is that item's, as in the pipeline
            if errors is not None:
                what = " ".join(str(getattr(item, name)) for name in ("test", "run", "metric", "tag", "index")
                                if getattr(item, name, None) is not None)
                errors.append(f"{type(item).__name__} {what}: {type(error).__name__}: {error}")
    return alerts


# -- rebuilding what the machines see ---------------------------------------------------------------------


def _split_metric(name: str) -> Optional[Tuple[str, str]]:
    """(tag, strategy) of a ``<tag>_<strategy>`` metric name; None for other names."""
    tag, _, strategy = name.rpartition("_")
    return (tag, strategy) if tag and strategy in STRATEGIES else None


def collected(name: str, collection: MetricCollectionConfig) -> bool:
    """Whether a stored metric is one ``collection`` would produce (its tag kept, its aggregate chosen)."""
    if name == TOTAL_WALL_TIME_METRIC:
        return True
    if name == TIME_TO_ACCURACY_METRIC:
        return collection.time_to_accuracy is not None
    split = _split_metric(name)
    if split is None:
        return True
    tag, strategy = split
    return tag not in collection.tags_to_ignore and strategy in collection.strategies_for(tag)


def accuracy_missed(metrics: Iterable[MetricValue], collection: MetricCollectionConfig) -> bool:
    """Whether the run never reached ``collection``'s accuracy threshold, from its stored aggregates.

    A stored aggregate of the accuracy tag at or above the threshold means the
    tag reached it (its maximum is at least that); a stored ``<tag>_max`` below
    it means it never did. Otherwise (only ``final``/``min``/``average`` stored,
    all below) the stored ``time_to_accuracy`` value says whether it was reached
    under the stored config, whose threshold is assumed unchanged; with no such
    value it is taken as missed (a run that reached the threshold and fell back
    below it is then counted as missed: an approximation).
    """
    tta = collection.time_to_accuracy
    if tta is None:
        return False
    aggregates: Dict[str, float] = {}
    reached_before = False
    for metric in metrics:
        if metric.name == TIME_TO_ACCURACY_METRIC:
            reached_before = True
        split = _split_metric(metric.name)
        if split is not None and split[0] == tta.accuracy_tag:
            aggregates[split[1]] = metric.value
    if any(value >= tta.accuracy_threshold for value in aggregates.values()):
        return False
    if "max" in aggregates:
        return True
    return not reached_before


def run_result(stored: StoredRun, configs: Configs) -> RunResult:
    """The ``RunResult`` the run-level checks see, rebuilt from the store under ``configs``."""
    collection = configs.for_test(stored.test, stored.finalized_at).metric_collection
    metrics = tuple(m for m in stored.metrics if collected(m.name, collection))
    missed = accuracy_missed(stored.metrics, collection)
    if missed:
        metrics = tuple(m for m in metrics if m.name != TIME_TO_ACCURACY_METRIC)
    tags = sorted({split[0] for split in map(_split_metric, (m.name for m in metrics)) if split is not None})
    return RunResult(test=stored.test, run=stored.run, status=stored.status, num_failures=stored.num_failures,
                     start_time=stored.start_time, end_time=stored.end_time, finalized_at=stored.finalized_at,
                     metrics=metrics, events=stored.events, tags_seen=tuple(tags), time_to_accuracy_missed=missed)


# -- the state machines, as the pipeline's stages step them -----------------------------------------------


MetricCheck = Callable[[MetricHistory, MetricObservation, RegressionTestConfig], Tuple[Dict[str, Any], Optional[Alert]]]
"""``core.history.check_metric``, or a function that wraps it to look at each value and its row."""


def _metric_step(configs: Configs, check: MetricCheck = check_metric) -> Callable[[MetricHistory, Any], List[Alert]]:
    def step(history: MetricHistory, item: Any) -> List[Alert]:
        config = configs.for_test(item.test, item.order[0]).regression_test
        if isinstance(item, TriageItem):
            apply_metric_triage(history, item, history_policy(config, item.metric or ""))
            return []
        _, alert = check(history, item, config)
        return [] if alert is None else [alert]
    return step


def _job_step(configs: Configs) -> Callable[[JobHistory, RunResult], List[Alert]]:
    def step(history: JobHistory, run: RunResult) -> List[Alert]:
        return check_job(history, run, configs.for_test(run.test, run.finalized_at))
    return step


def _window_step(configs: Configs) -> Callable[[WindowHistory, Any], List[Alert]]:
    def step(history: WindowHistory, item: Any) -> List[Alert]:
        config = configs.for_test(item.test, item.order[0])
        return step_window_history(history, item, config.windows.tags.get(item.tag),
                                   config.regression_test.rebaseline_after)
    return step


@dataclasses.dataclass(frozen=True)
class KindDiff:
    """What fired against what would fire, for one test and alert kind."""
    test: str
    kind: str
    fired: Tuple[AlertFacts, ...]
    would_fire: Tuple[AlertFacts, ...]
    re_evaluated: bool = True

    @property
    def only_fired(self) -> Tuple[AlertFacts, ...]:
        """Stored alerts the new configs would not raise."""
        ids = {a.alert_id for a in self.would_fire}
        return tuple(a for a in self.fired if a.alert_id not in ids)

    @property
    def only_would_fire(self) -> Tuple[AlertFacts, ...]:
        """Alerts the new configs would raise that did not fire."""
        ids = {a.alert_id for a in self.fired}
        return tuple(a for a in self.would_fire if a.alert_id not in ids)

    @property
    def changed(self) -> bool:
        return bool(self.only_fired or self.only_would_fire)


@dataclasses.dataclass(frozen=True)
class BacktestResult:
    diffs: Tuple[KindDiff, ...]  # by test, then kind (most severe first)
    runs: int                    # runs re-evaluated
    values: int                  # metric values re-evaluated
    windows: int                 # windows re-checked
    skipped_windows: int         # stored windows the configs do not check (tag not checked, or another kind)
    errors: Tuple[str, ...] = ()  # items whose check raised (the pipeline dead-letters them)

    @property
    def changed(self) -> Tuple[KindDiff, ...]:
        return tuple(d for d in self.diffs if d.changed)


def _facts(alert: Alert) -> AlertFacts:
    return AlertFacts(alert.alert_id, AlertKind(alert.kind).value, alert.test, alert.run, alert.metric,
                      alert.created_at)


def _kind_rank(kind: str) -> Tuple[int, str]:
    try:
        return AlertKind(kind).severity, kind
    except ValueError:
        return len(AlertKind), kind


def started_data(run: RunResult, rank: Optional[int]) -> Mapping[str, Any]:
    """The data of the earliest run_started of the run's worker ``rank`` (None: the run's own windows, rank 0's),
    as the live windows keep it (``transforms.windows.WindowRunFn``): what picks a window's history."""
    started = [event for event in run.events
               if event.type == wire.RUN_STARTED and effective_rank(event.rank) == effective_rank(rank)]
    return min(started, key=lambda event: event.time).data if started else {}


def backtest(history: StoredHistory, configs: Configs,
             extra_items: Optional[Mapping[Key, Sequence[Ordered]]] = None,
             metric_check: MetricCheck = check_metric) -> BacktestResult:
    """Re-evaluates ``history`` under ``configs`` and compares with what fired.

    Keys are those of the pipeline's stages: ``("metric", (test, metric))``,
    ``("job", (test,))`` and ``("window", (test, tag, kind))``. ``extra_items``
    adds ordered items to a key beyond the stored runs, windows and triage
    actions (:func:`step_in_event_time_order`). ``metric_check`` checks each
    metric value (``core.noise_evidence`` wraps it to measure the noise).
    """
    extra: Dict[Key, List[Ordered]] = {key: list(more) for key, more in (extra_items or {}).items()}
    errors: List[str] = []
    runs = sorted((run_result(stored, configs) for stored in history.runs), key=lambda r: r.order)
    items: Dict[Key, List[Ordered]] = collections.defaultdict(list)
    values = 0
    for run in runs:
        items[("job", (run.test,))].append(run)
        for observation in MetricObservation.all_of(run):
            items[("metric", (run.test, observation.metric))].append(observation)
            values += 1
    runs_by_key = {(run.test, run.run): run for run in runs}
    checked = skipped = 0
    window_runs: Dict[Key, Dict[str, RunResult]] = collections.defaultdict(dict)
    for window in history.windows:
        config = configs.for_test(window.test, window.end_time)
        tag_config = config.windows.tags.get(window.tag)
        if tag_config is None or not tag_config.checks or tag_config.spec.kind != window.kind:
            skipped += 1
            continue
        window_key: Key = ("window", (window.test, window.tag, window.kind))
        ended = runs_by_key.get((window.test, window.run))
        items[window_key].append(window if ended is None else dataclasses.replace(
            window, segment=history_segment(started_data(ended, window.rank), config.window_history_by(window.tag))))
        checked += 1
        if ended is not None:  # a run without a job_history row is still open: its windows have no end yet
            window_runs[window_key][ended.run] = ended
    for window_key, ended_runs in window_runs.items():
        test, tag, kind = window_key[1]
        items[window_key] += [RunEnded(test, run.run, run.status, run.finalized_at, tag, kind) for run in ended_runs.values()]
    for action in history.actions:
        windows = configs.for_test(action.test, action.time).windows
        if reaches_run_level_history(action, windows):
            extra.setdefault(("metric", (action.test, action.metric or "")), []).append(action)
        for target in window_triage_targets(action, windows):
            extra.setdefault(("window", (action.test, target.tag, target.kind)), []).append(target)

    steps: Dict[str, Tuple[Callable[[], Any], Callable[[Any, Any], Iterable[Alert]]]] = {
        "metric": (MetricHistory, _metric_step(configs, metric_check)),
        "job": (JobHistory, _job_step(configs)),
        "window": (WindowHistory, _window_step(configs)),
    }
    raised: List[Alert] = []
    for key in sorted(set(items) | set(extra)):
        initial, step = steps[key[0]]
        raised += step_in_event_time_order(initial(), step, items.get(key, ()), extra.get(key, ()), errors)
    return BacktestResult(diffs=diff(history.alerts, raised), runs=len(runs), values=values, windows=checked,
                          skipped_windows=skipped, errors=tuple(errors))


def diff(stored: Iterable[AlertFacts], raised: Iterable[Alert]) -> Tuple[KindDiff, ...]:
    """Per test and kind, the stored alerts against the raised ones; kinds in ``NOT_RE_EVALUATED`` carried over."""
    fired: Dict[Tuple[str, str], Dict[str, AlertFacts]] = collections.defaultdict(dict)
    for facts in stored:
        fired[(facts.test, facts.kind)][facts.alert_id] = facts  # one per id: BigQuery may hold duplicates
    would: Dict[Tuple[str, str], Dict[str, AlertFacts]] = collections.defaultdict(dict)
    for alert in raised:
        facts = _facts(alert)
        would[(facts.test, facts.kind)][facts.alert_id] = facts
    not_re_evaluated = {kind.value for kind in NOT_RE_EVALUATED}
    diffs = []
    for test, kind in sorted(set(fired) | set(would), key=lambda k: (k[0], _kind_rank(k[1]))):
        before = tuple(sorted(fired.get((test, kind), {}).values(), key=_by_time))
        if kind in not_re_evaluated:
            diffs.append(KindDiff(test, kind, before, before, re_evaluated=False))
        else:
            after = tuple(sorted(would.get((test, kind), {}).values(), key=_by_time))
            diffs.append(KindDiff(test, kind, before, after))
    return tuple(diffs)


def _by_time(facts: AlertFacts) -> Tuple[float, str]:
    return facts.created_at, facts.alert_id
