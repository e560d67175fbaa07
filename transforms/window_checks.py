"""The checks of live windows as a Beam stage: emitted windows and finished runs in, window alerts out.

The logic is the Beam-free state machine of ``core.window_checks``, fed in
event-time order per (test, tag, window kind) by ``transforms.ordered``.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core.config import WindowCheck
from core.records import Alert
from core.runs import RunResult
from core.schema import DEAD_LETTER
from core.triage import TriageItem
from core.window_checks import (
    NearWindows,
    RunEnded,
    WindowHistory,
    WindowTriage,
    by_segment,
    is_whole,
    live_part,
    near_windows,
    put_back_logged,
    settled_runs,
    settles,
    step_window_history,
    take_unlogged,
    window_triage_targets,
)
from core.windows import WindowResult
from transforms.coders import AnyRecord
from transforms.ordered import ApartCells, ConfiguredMachine, OrderedCheck


class _Loaded(NamedTuple):
    """What ``WindowCheckMachine.load`` read of a key's parts, for ``store``."""
    settling: bool  # the finished runs and the whole log were read (or the state was whole): all written anew
    log_read: bool  # the open runs' windows hold the logged ones


class WindowCheckMachine(ConfiguredMachine):
    """The state machine of one (test, tag, window kind): its windows, run ends and triage, in event time.

    It keeps its history in parts (``transforms.ordered.KeepsApart``): ``<name>_keyed`` holds what every window
    changes (``live_part``: debounces, open runs' verdicts), ``<name>_settled`` the finished runs, written when
    a run ends or a triage action reaches them, ``<name>_near`` their windows near the steps being checked
    (``NearWindows``), read instead of them by a firing of windows only, and ``<name>_log`` the open runs'
    windows, each added once, read for a run's end, triage and trailing checks only. A tag with ``history_by``
    keeps its machine types' histories in the same parts: the finished runs by type, a near view per type. A key
    whose ``<name>_keyed`` holds a whole history (one cell, before the parts; or its seed) is moved into the
    parts by its first firing."""

    def initial(self, key) -> WindowHistory:
        return WindowHistory()

    def step(self, history: WindowHistory, item: Any) -> Iterable[Alert]:
        config = self.configs.for_test(item.test, item.order[0])
        tag_config = config.windows.tags.get(item.tag)  # None: removed since
        return step_window_history(history, item, tag_config, config.regression_test.rebaseline_after)

    def _checks_of(self, item: Any) -> Tuple[WindowCheck, ...]:
        """The checks of ``item``: none for all but windows (and those of a tag no longer configured)."""
        if not isinstance(item, WindowResult):
            return ()
        config = self.configs.for_test(item.test, item.order[0]).windows.tags.get(item.tag)
        return config.checks if config is not None else ()

    def load(self, key: Any, stored: Optional[WindowHistory], items: List[Any], cells: ApartCells) -> Tuple[
            WindowHistory, _Loaded]:
        """The history to step ``items`` on: the live part, with the log if a run ends, a triage action or a
        trailing check needs the open runs' windows, and the finished runs (all of them for a run's end or
        triage; their ``NearWindows`` for windows)."""
        if stored is not None and is_whole(stored):
            return stored, _Loaded(settling=True, log_read=True)
        history = WindowHistory() if stored is None else stored
        settling = any(settles(item) for item in items)
        checks = [self._checks_of(item) for item in items]
        aligned = [(item, {c.aggregation for c in item_checks if c.history == "step_aligned"})
                   for item, item_checks in zip(items, checks)]
        aligned = [(item, aggregations) for item, aggregations in aligned if aggregations]
        log_read = settling or any(c.history == "trailing" for item_checks in checks for c in item_checks)
        if log_read:
            put_back_logged(history, cells.log.read())
        if settling:
            for segment, runs in by_segment(cells.settled.read()).items():
                history.part(segment).finished_runs = collections.deque(runs)
        elif aligned:
            for segment, near in self._near(cells, aligned).items():
                history.part(segment).finished_runs = collections.deque(near.runs)
        return history, _Loaded(settling, log_read)

    @staticmethod
    def _near(cells: ApartCells, aligned: List[Tuple[WindowResult, Set[str]]]) -> Dict[str, NearWindows]:
        """Per segment of the windows of ``aligned`` ("": the key's own history), the finished runs'
        ``NearWindows`` that covers each of its windows for their aggregations: the one kept, or one made from
        every finished run of the segment (and kept). The near part holds the key's own view, or with segments
        a view per segment."""
        kept = cells.near.read()
        views: Dict[str, NearWindows] = dict(kept) if isinstance(kept, dict) else {} if kept is None else {"": kept}
        wanted: Dict[str, List[Tuple[WindowResult, Set[str]]]] = collections.defaultdict(list)
        for window, aggregations in aligned:
            wanted[window.segment].append((window, aggregations))
        stale = [segment for segment, windows in wanted.items() if segment not in views
                 or not all(views[segment].covers(window, aggregations) for window, aggregations in windows)]
        if stale:
            settled = by_segment(cells.settled.read())
            for segment in stale:
                views[segment] = near_windows(settled.get(segment, ()), [window for window, _ in wanted[segment]],
                                              set().union(*(aggregations for _, aggregations in wanted[segment])))
            cells.near.write(views if set(views) != {""} else views[""])
        return {segment: views[segment] for segment in wanted}

    def store(self, history: WindowHistory, loaded: _Loaded, cells: ApartCells) -> WindowHistory:
        """Writes the finished runs and the log anew after a run's end or triage (the near view goes with them),
        else adds the open runs' new windows to the log; returns the live part."""
        if loaded.settling:
            cells.settled.write(settled_runs(history))
            cells.near.clear()
            cells.log.clear()
        for entry in take_unlogged(history, loaded.settling, loaded.log_read):
            cells.log.add(entry)
        return live_part(history)


class CheckWindows(OrderedCheck[Tuple[PCollection[Tuple[WindowResult, int]], PCollection[RunResult],
                                       PCollection[TriageItem]],
                                 Tuple[PCollection[Alert], PCollection[Dict[str, Any]]]]):
    """((WindowResult, revision), RunResult, TriageItem) -> (window_out_of_bounds alerts, dead letters).

    Each window is checked once, at its first revision; a run's end moves its
    windows into the step-aligned history if it succeeded. Keyed by (test,
    tag, window kind), in event-time order, so the result does not depend on
    the order windows and runs arrive in. ``seed`` (the one-element PCollection
    of the start-up ``HistorySeed``) carries the window history of earlier
    invocations, each key's to that key.
    Accepts and dismisses of a check's metric (``<tag>_<aggregation>``) move
    or widen its step-aligned history at their place in event time.
    """

    def expand(self, inputs):
        results, runs, actions = inputs
        configs = self.configs

        def first_checked_revision(result: WindowResult, revision: int) -> List[WindowResult]:
            tag_config = configs.for_test(result.test, result.end_time).windows.tags.get(result.tag)
            return [result] if revision == 0 and tag_config is not None and tag_config.checks else []

        def run_ends(run: RunResult) -> List[RunEnded]:
            return [RunEnded(run.test, run.run, run.status, run.finalized_at, tag, config.spec.kind)
                    for tag, config in configs.for_test(run.test, run.finalized_at).windows.tags.items() if config.checks]

        def targets(action: TriageItem) -> List[WindowTriage]:
            return window_triage_targets(action, configs.for_test(action.test, action.time).windows)

        first_results = results | "FirstRevisions" >> beam.FlatMapTuple(first_checked_revision)
        ends = runs | "RunEnds" >> beam.FlatMap(run_ends)
        window_actions = actions | "WindowActions" >> beam.FlatMap(targets)
        keyed = ((first_results, ends, window_actions) | "CheckInputs" >> beam.Flatten()
                 | "KeyByTagKind" >> beam.Map(lambda i: ((i.test, i.tag, i.kind), i)).with_output_types(
                     beam.typehints.KV[beam.typehints.Tuple[str, str, str], AnyRecord]))
        outputs = self.seeded_in_order(keyed, "CheckInOrder", WindowCheckMachine(configs), "window", "windows",
                                       DEAD_LETTER.name, main="alerts")
        return outputs.alerts, outputs[DEAD_LETTER.name]
