"""The live windows of a distributed run's ranks as a Beam stage: each rank's windows in; the run's windows and
straggler alerts out.

The logic is the Beam-free state machine of ``core.rank_windows``, fed in
event-time order per (test, run, tag) by ``transforms.ordered``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core.config import ranks_matter
from core.rank_windows import RankWindows, add_rank_window, close_rank_windows
from core.records import Alert
from core.runs import TIMER_BUCKET_SECONDS, RunLifecycle, RunResult
from core.schema import ALERTS, DEAD_LETTER
from core.window_checks import RunEnded
from core.windows import WindowResult
from transforms.coders import AnyRecord
from transforms.ordered import ConfiguredMachine, OrderedCheck


class RankWindowMachine(ConfiguredMachine):
    """The state machine of one distributed run's tag: its ranks' windows, combined and compared."""
    def __init__(self, configs, retention_seconds: float):
        super().__init__(configs)
        self.retention_seconds = retention_seconds

    def initial(self, key) -> RankWindows:
        return RankWindows()

    def step(self, state: RankWindows, item: Any) -> Iterable[Any]:
        config = self.configs.for_test(item.test, item.order[0])
        tag_config = config.windows.tags.get(item.tag)
        if tag_config is None:  # its windows were removed from the config since
            return
        reduction = config.metric_collection.rank_reduction_for(item.tag)
        if isinstance(item, RunEnded):
            windows, alerts = close_rank_windows(state, tag_config, reduction, item.finalized_at)
        else:
            windows, alerts = add_rank_window(state, item, tag_config, reduction)
        for window in windows:
            yield window, 0
        for alert in alerts:
            yield beam.pvalue.TaggedOutput(ALERTS.name, alert)

    def forget_at(self, state: RankWindows) -> Optional[float]:
        """A run's key is forgotten a retention after it ended (until then its late windows are ignored)."""
        return None if state.ended_at is None else state.ended_at + self.retention_seconds


class CombineRankWindows(OrderedCheck[Tuple[PCollection[Tuple[WindowResult, int]], PCollection[RunResult]],
                                      Tuple[PCollection[Tuple[WindowResult, int]], PCollection[Alert],
                                            PCollection[Dict[str, Any]]]]):
    """((WindowResult of one rank, revision), RunResult) -> ((the run's WindowResult, 0), rank_straggler alerts,
    dead letters).

    Keyed by (test, run, tag), in event-time order. Each rank's windows of an index
    are combined once every rank below the world size has one, or when the run ends;
    later revisions of a rank's window (late points) do not change a combined window.
    No history is kept: a run's state is dropped ``retention_seconds`` of event
    time after it ended (a streaming job's; a bounded replay's ends with it).
    """

    def __init__(self, configs, seed=None, streaming: bool = True,
                 timer_bucket_seconds: float = TIMER_BUCKET_SECONDS,
                 retention_seconds: float = RunLifecycle().retention_seconds):
        super().__init__(configs, seed, streaming, timer_bucket_seconds)
        self.retention_seconds = retention_seconds

    def expand(self, inputs):
        rank_results, runs = inputs
        configs = self.configs

        def run_ends(run: RunResult) -> List[RunEnded]:
            config = configs.for_test(run.test, run.finalized_at)
            return [RunEnded(run.test, run.run, run.status, run.finalized_at, tag, tag_config.spec.kind)
                    for tag, tag_config in config.windows.tags.items() if ranks_matter(config, tag)]

        firsts = rank_results | "FirstRevisions" >> beam.FlatMapTuple(
            lambda result, revision: [result] if revision == 0 else [])
        ends = runs | "RunEnds" >> beam.FlatMap(run_ends)
        machine = RankWindowMachine(configs, self.retention_seconds)
        outputs = ((firsts, ends) | "RankInputs" >> beam.Flatten()
                   | "KeyByRunTag" >> beam.Map(lambda i: ((i.test, i.run, i.tag), i)).with_output_types(
                       beam.typehints.KV[beam.typehints.Tuple[str, str, str], AnyRecord])
                   | "CombineInOrder" >> self.in_order(machine, "rank_windows").with_outputs(
                       ALERTS.name, DEAD_LETTER.name, main="windows"))
        return outputs.windows, outputs[ALERTS.name], outputs[DEAD_LETTER.name]
