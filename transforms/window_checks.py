"""The checks of live windows as a Beam stage: emitted windows and finished runs in, window alerts out.

The logic is the Beam-free state machine of ``core.window_checks``, fed in
event-time order per (test, tag, window kind) by ``transforms.ordered``.
"""

from __future__ import annotations

from typing import Any, Iterable, List

import apache_beam as beam

from core.records import Alert
from core.runs import RunResult
from core.schema import DEAD_LETTER
from core.triage import TriageItem
from core.window_checks import RunEnded, WindowHistory, WindowTriage, step_window_history, window_triage_targets
from core.windows import WindowResult
from transforms.coders import AnyRecord
from transforms.ordered import ConfiguredMachine, OrderedCheck


class WindowCheckMachine(ConfiguredMachine):
    """The state machine of one (test, tag, window kind): its windows, run ends and triage, in event time."""
    def initial(self, key) -> WindowHistory:
        return WindowHistory()

    def step(self, history: WindowHistory, item: Any) -> Iterable[Alert]:
        config = self.configs.for_test(item.test, item.order[0])
        tag_config = config.windows.tags.get(item.tag)  # None: removed since
        return step_window_history(history, item, tag_config, config.regression_test.rebaseline_after)


class CheckWindows(OrderedCheck):
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
        outputs = ((first_results, ends, window_actions) | "CheckInputs" >> beam.Flatten()
                   | "KeyByTagKind" >> beam.Map(lambda i: ((i.test, i.tag, i.kind), i)).with_output_types(
                       beam.typehints.KV[beam.typehints.Tuple[str, str, str], AnyRecord])
                   | "WithSeeds" >> self.with_seeds("windows")
                   | "CheckInOrder" >> self.in_order(WindowCheckMachine(configs), "window").with_outputs(
                       DEAD_LETTER.name, main="alerts"))
        return outputs.alerts, outputs[DEAD_LETTER.name]
