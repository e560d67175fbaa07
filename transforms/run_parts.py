"""A bounded replay's run assembly: messages taken into run parts before the shuffle, merged after it, each
message id once."""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable, Dict, Optional, Union

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from core.config import Configs
from core.parse import different_copy_reason, payload_of, summarize_again
from core.records import dead_letter_row, failure_reason, record_payload
from core.run_parts import Failures, RunPart, SummaryOf
from core.runs import RunAccumulator, RunLifecycle
from core.schema import DEAD_LETTER
from trainguard import wire
from transforms.coders import AnyRecord, outputs_any
from transforms.ordered import at_time
from transforms.run_assembly import (
    INTERRUPTED,
    AssembleRunFn,
    RunKey,
    assembly_failure,
    events_over_the_limit,
)


@dataclasses.dataclass
class BundlePart:
    """One run's messages of one bundle (``PreAssembleRunsFn``), output as one element when the bundle ends."""
    part: RunPart  # the messages taken so far
    latest: float  # the latest of their times (seconds): the element's timestamp


class PreAssembleRunsFn(beam.DoFn):
    """MessageSummary -> ((test, run), RunPart) per run and bundle, and dead-letter rows.

    A bounded replay's messages are taken into their runs' accumulators before the shuffle to run assembly,
    as ``AssembleRunFn`` would take them one by one (a message that fails is dead-lettered alone): the shuffle,
    which a batch runner holds whole in memory, then carries one element per run and bundle instead of one per
    message. A message whose id the bundle already brought for its run is another copy: nothing if its bytes
    are the same, else the copy whose bytes sort first counts and the other is put aside
    (``core.run_parts.RunPart.offer``; ``AssembleRunPartsFn`` does the same across bundles and dead-letters
    the copies put aside). Events over a run's limit are found when the run ends. Not for a streaming job,
    whose runs end while messages still come.
    """

    def __init__(self, configs: Configs):
        self.configs = configs

    def start_bundle(self):
        self._parts: Dict[RunKey, BundlePart] = {}
        self._summary_of = lambda source: summarize_again(source, self.configs)

    def process(self, summary):
        # The element's timestamp is its message's event time, the latest time in it (ParseMessageFn stamped it),
        # and its window the global one: nothing windows a replay's messages. (A DoFn that asks for neither is
        # invoked several µs an element faster.)
        test, run = summary.test, summary.run
        bundle_part = self._parts.get((test, run))
        if bundle_part is None:
            bundle_part = self._parts[(test, run)] = BundlePart(RunPart(RunAccumulator(test, run)), summary.last_time)
        try:
            bundle_part.part, failed = bundle_part.part.offer(summary, self._summary_of)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's, not the run's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, assembly_failure(
                summary, test, run, float(Timestamp.of(summary.last_time)), error))
            return
        if failed:
            yield from _taken_again_failures(failed, test, run, float(Timestamp.of(summary.last_time)))
        bundle_part.latest = max(bundle_part.latest, summary.last_time)

    def finish_bundle(self):
        for key, bundle_part in self._parts.items():
            if bundle_part.part.ids:  # (not a run whose every message failed)
                yield WindowedValue((key, bundle_part.part), Timestamp.of(bundle_part.latest), [GlobalWindow()])
        self._parts = {}


def _taken_again_failures(failed, test: str, run: str, at: Optional[float]):
    """The dead-letter rows of messages a run could not read or take again (``RunPart.without``)."""
    for source, error in failed:
        yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
            failure_reason("assemble run", error), payload_of(source), f"run:{test}/{run}", at))


def whole_run(held: Optional[RunPart], resumed: Optional[RunAccumulator]) -> RunAccumulator:
    """A replay's run as one accumulator: its messages' (``held``, their parts merged) and a resumed run's
    (earlier: its events first), changing neither."""
    if resumed is None:
        assert held is not None  # a run has its messages' part, a resumed state, or both
        return held.accumulator
    whole = copy.deepcopy(resumed)
    if held is not None:
        whole.absorb(held.accumulator)  # events it leaves out: see RunPart.events_over_the_limit
    return whole


@dataclasses.dataclass(frozen=True)
class RunSoFar:
    """A replay's run with one more element taken (``with_element``): what ``AssembleRunPartsFn`` keeps of it."""
    held: Optional[RunPart]  # its messages, their parts merged (RUN_PART)
    resumed: Optional[RunAccumulator]  # the state of the run a drained job left open (ACCUMULATOR)
    taken_again_failures: Failures  # messages of a merged part that could not be read or taken again
    finalize_at: float  # when the run ends, by event time


def with_element(held: Optional[RunPart], resumed: Optional[RunAccumulator], value: Union[RunPart, RunAccumulator],
                 summary_of: SummaryOf, lifecycle: RunLifecycle) -> RunSoFar:
    """The run (``held``, ``resumed``: what it kept so far) with one more element: a part of its messages,
    merged with those it holds (``RunPart.merged``, which may change ``held``), or a run a drained job left
    open. Raises what cannot be taken."""
    failed: Failures = []
    if not isinstance(value, RunPart):  # a run a drained job left open
        resumed = value
    elif held is None:
        held = value
    else:
        held, failed = held.merged(value, summary_of)
    return RunSoFar(held, resumed, failed, whole_run(held, resumed).finalize_at(lifecycle))


def with_time(element, timestamp=beam.DoFn.TimestampParam):
    """(run, part or resumed state) -> (run, (it, its timestamp in µs)): what ``AssembleRunPartsFn`` needs to know
    of each element once the shuffle has grouped them."""
    key, value = element
    return key, (value, timestamp.micros)


@outputs_any
class AssembleRunPartsFn(beam.DoFn):
    """A bounded replay's run assembly: ((test, run), each ``RunPart`` of it and the state of it a drained job
    left open, with their times (``with_time``), grouped) -> its ``RunResult`` (or ``interrupted``, as
    ``AssembleRunFn`` decides), and dead-letter rows. It is where the replay de-duplicates messages, by id
    within their run.

    The run's parts are merged into one: its accumulator and, per message taken, where to read it again. A
    part that brings an id the run took is merged by ``RunPart.merged``: the same bytes count once, and of
    different bytes the copy that sorts first counts, whichever came first (the part that took the other is
    taken again without it, its other messages read again from their files). So a replay keeps where to read
    each message of its runs (tens of bytes a message) instead of a keyed state per message, and the rows are
    those of de-duplicating first. When the run ends, the copies not taken are dead letters (reason
    ``core.parse.DIFFERENT_COPY``, naming the copy taken), and so, if the run is at its events' limit, are the
    events it does not keep, each once (``RunPart.events_over_the_limit``). A run a drained job left open (a
    ``RunAccumulator`` from the seed) joins the run.

    A batch runner reads the whole input before any run can end, so the shuffle hands over a run's parts
    together, and the run ends in the same call, at the time its timer would fire: no state, no timer, where a
    stateful DoFn cost a state read and write and a timer per run (a third of a replay of many one-run tests).
    Each output carries the time it would have had: an element's dead letters its time, the run's end its end.
    """

    def __init__(self, configs: Configs, lifecycle: RunLifecycle, interruptions: bool = False,
                 clock: Optional[Callable[[], float]] = None):
        self.configs = configs
        self.lifecycle = lifecycle
        self.runs = AssembleRunFn(configs, lifecycle, interruptions, clock)  # what a run's end gives

    def process(self, element):
        key, values = element
        test, run = key
        held: Optional[RunPart] = None
        resumed: Optional[RunAccumulator] = None
        finalize_at: Optional[float] = None
        for value, micros in values:
            timestamp = Timestamp(micros=micros)
            at = float(timestamp) if isinstance(value, RunPart) else None  # (a resumed run comes at the start of time)
            try:
                run_so_far = with_element(held, resumed, value, lambda source: summarize_again(source, self.configs),
                                          self.lifecycle)
            except Exception as error:  # noqa: BLE001 - what cannot be merged is a dead letter, not a crash
                yield at_time(beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                    failure_reason("assemble run", error), record_payload(value.to_state()), f"run:{test}/{run}",
                    at)), timestamp)
                continue
            for output in _taken_again_failures(run_so_far.taken_again_failures, test, run, at):
                yield at_time(output, timestamp)
            held, resumed, finalize_at = run_so_far.held, run_so_far.resumed, run_so_far.finalize_at
            if not isinstance(value, RunPart):
                self.runs.runs_resumed.inc()
        if finalize_at is None:  # no element could be taken
            return
        ends = Timestamp.of(finalize_at)  # as a timer set at it fires
        for output in self._ended(key, held, resumed, float(ends)):
            yield at_time(output, ends)

    def _ended(self, key: RunKey, held: Optional[RunPart], resumed: Optional[RunAccumulator], at: float):
        accumulator = whole_run(held, resumed)
        source = f"run:{key[0]}/{key[1]}"
        if held is not None:
            yield from self._copies_not_taken(held, source)
            if accumulator.at_event_limit():
                over, failed = held.events_over_the_limit(resumed.events if resumed is not None else ())
                yield from events_over_the_limit(over, source)
                yield from _taken_again_failures(failed, key[0], key[1], at)
        yield from self.runs.run_ended(key, accumulator, at)

    @staticmethod
    def _copies_not_taken(held: RunPart, source: str):
        """The dead-letter rows of the copies of the run's message ids that did not count, each at its own event
        time."""
        for payload, taken in held.copies_not_taken():
            try:
                at: Optional[float] = wire.parse_message(payload)[0].event_time
            except Exception:  # noqa: BLE001 - the copy is a dead letter all the same, without a time
                at = None
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                different_copy_reason(taken), payload, source, at))


class GroupedRunAssembly(beam.PTransform):
    """((test, run), ``RunPart`` or resumed ``RunAccumulator``) -> ``AssembleRunPartsFn``'s outputs (``runs``,
    dead letters, ``interrupted``): each element with its time, grouped by run, assembled."""

    def __init__(self, fn: AssembleRunPartsFn):
        super().__init__()
        self.fn = fn

    def expand(self, parts):
        return (parts
                | "WithTime" >> beam.Map(with_time).with_output_types(
                    beam.typehints.KV[beam.typehints.Tuple[str, str], beam.typehints.Tuple[AnyRecord, int]])
                | "GroupByRun" >> beam.GroupByKey()
                | "AssembleRuns" >> beam.ParDo(self.fn).with_outputs(DEAD_LETTER.name, INTERRUPTED, main="runs"))
