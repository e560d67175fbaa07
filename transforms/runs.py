"""Per-run assembly as a composite: messages of stored runs set aside, then messages of one (test, run) -> one
``RunResult`` when the run ends (the DoFns: ``transforms.run_assembly``, ``transforms.backfills``,
``transforms.run_parts``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core.config import Configs
from core.parse import MessageSummary
from core.records import dead_letter_row
from core.runs import RunLifecycle, RunResult
from core.schema import DEAD_LETTER
from transforms.backfills import AssembleRunOrBackfillFn
from transforms.coders import AnyRecord, outputs_any
from transforms.run_assembly import INTERRUPTED, AssembleRunFn
from transforms.run_parts import AssembleRunPartsFn, GroupedRunAssembly, PreAssembleRunsFn

__all__ = ["INTERRUPTED", "AssembleRuns", "SkipStoredRuns", "stored_run_reason"]


def stored_run_reason(test: str, run: str) -> str:
    """The dead-letter reason of a message of a run the store already holds (the same for every such message of
    the run, so that a message delivered twice is one dead-letter row)."""
    return (f"run already stored: {test}/{run} was finalized by an earlier job "
            "(a message later than its end, or one resent that it already holds)")


@outputs_any
class _SkipStoredRunsFn(beam.DoFn):
    def __init__(self, dead_letter: bool):
        self.dead_letter = dead_letter
        self.skipped = beam.metrics.Metrics.counter("trainguard", "messages_of_stored_runs")

    def process(self, message, stored, timestamp=beam.DoFn.TimestampParam):
        if (message.test, message.run) not in stored.stored_runs:
            yield message
            return
        self.skipped.inc()
        if self.dead_letter:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                stored_run_reason(message.test, message.run), message.raw_payload(),
                f"run:{message.test}/{message.run}", float(timestamp)))


class SkipStoredRuns(beam.PTransform[PCollection[MessageSummary],
                                        Tuple[PCollection[MessageSummary], PCollection[Dict[str, Any]]]]):
    """``MessageSummary``s -> (those of runs the store does not hold yet, dead-letter rows).

    ``stored`` is the singleton side input of the start-up ``core.history.StoredIndex``
    (or the whole ``HistorySeed``): its ``stored_runs`` are the runs that ended (a
    run a drain interrupted is not one: its messages pass, and ``AssembleRuns``
    resumes it). A message of a
    stored run is counted (``messages_of_stored_runs``) and, with
    ``dead_letter`` (the streaming job), dead-lettered with the reason and its
    payload. A replay only counts them: re-running it on the same files reads
    every message of its stored runs again, and adds nothing.
    """

    def __init__(self, stored, dead_letter: bool = False):
        super().__init__()
        self.stored = stored
        self.dead_letter = dead_letter

    def expand(self, messages):
        outputs = messages | "NotStored" >> beam.ParDo(_SkipStoredRunsFn(self.dead_letter), self.stored).with_outputs(
            DEAD_LETTER.name, main="new")
        return outputs.new, outputs[DEAD_LETTER.name]


def without_window_points(summary: MessageSummary) -> MessageSummary:
    """The summary as run assembly takes it: without the points of its windowed tags, which only the live
    windows read (``transforms.windows``); a run keeps its tags' aggregates, and a message it cannot take is
    dead-lettered as its raw payload. The shuffle into run assembly then carries ~35 KB less of a 1,000-point
    message of 20 windowed tags (``bench/bench_state_bytes.py``)."""
    return dataclasses.replace(summary, window_points=()) if summary.window_points else summary


def _open_runs(seed):
    """The runs a drained job left open (``HistorySeed.open_runs``), keyed as messages are."""
    return seed.open_runs.items()


class AssembleRuns(beam.PTransform[PCollection[MessageSummary],
                                   Tuple[PCollection[RunResult], PCollection[Dict[str, Any]], PCollection[RunResult]]]):
    """MessageSummary -> (RunResult per finalized run, dead-letter rows for late messages, ``interrupted`` RunResults).

    ``seed`` (the one-element PCollection of the start-up ``HistorySeed``, optional) brings the runs a drained
    job left open, which resume here; ``interruptions`` and ``clock``: see ``AssembleRunFn``; ``backfills``:
    ``AssembleRunOrBackfillFn``.
    """

    def __init__(self, configs: Configs, lifecycle: RunLifecycle, seed: Optional[beam.PCollection] = None,
                 interruptions: bool = False, clock: Optional[Callable[[], float]] = None,
                 backfills: bool = False, bounded: bool = False):
        super().__init__()
        if bounded and backfills:
            raise ValueError("a bounded replay has no back-fills")
        fn = AssembleRunPartsFn if bounded else AssembleRunOrBackfillFn if backfills else AssembleRunFn
        self.fn = fn(configs, lifecycle, interruptions, clock)
        self.seed = seed
        self.bounded = bounded

    def expand(self, messages):
        keyed = beam.typehints.KV[beam.typehints.Tuple[str, str], AnyRecord]
        early_dead_letters = None
        if self.bounded:  # see PreAssembleRunsFn
            parts = messages | "PreAssemble" >> beam.ParDo(PreAssembleRunsFn(self.fn.configs)).with_output_types(
                keyed).with_outputs(DEAD_LETTER.name, main="parts")
            inputs, early_dead_letters = parts.parts, parts[DEAD_LETTER.name]
        else:
            inputs = messages | "KeyByRun" >> beam.Map(
                lambda m: ((m.test, m.run), without_window_points(m))).with_output_types(keyed)
        if self.seed is not None:
            resumed = self.seed | "OpenRuns" >> beam.FlatMap(_open_runs).with_output_types(keyed)
            inputs = (inputs, resumed) | "MessagesAndOpenRuns" >> beam.Flatten().with_output_types(keyed)
        assemble = (GroupedRunAssembly(self.fn) if self.bounded
                    else beam.ParDo(self.fn).with_outputs(DEAD_LETTER.name, INTERRUPTED, main="runs"))
        outputs = inputs | "Assemble" >> assemble
        dead_letters = outputs[DEAD_LETTER.name]
        if early_dead_letters is not None:
            dead_letters = (early_dead_letters, dead_letters) | "AssemblyDeadLetters" >> beam.Flatten()
        return outputs.runs, dead_letters, outputs[INTERRUPTED]
