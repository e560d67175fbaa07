"""Per-run assembly: messages of one (test, run) -> one ``RunResult`` when the run ends."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from typing import Callable, Optional, Tuple

import apache_beam as beam
from apache_beam.coders import BooleanCoder, StrUtf8Coder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from core import encoding
from core.config import Configs
from core.parse import different_copy_reason, payload_of, summarize_again
from core.records import dead_letter_row, failure_reason, record_payload
from core.run_parts import RunPart
from core.runs import RunAccumulator, RunLifecycle, event_json, interrupt
from core.schema import DEAD_LETTER
from core.vocabulary import RunStatus
from trainguard import wire
from transforms.coders import AnyRecord, RecordCoder

RunKey = Tuple[str, str]
INTERRUPTED = "interrupted"  # AssembleRuns' output of the runs a drain cut short (``RunStatus.INTERRUPTED``)


def stored_run_reason(test: str, run: str) -> str:
    """The dead-letter reason of a message of a run the store already holds (the same for every such message of
    the run, so that a message delivered twice is one dead-letter row)."""
    return (f"run already stored: {test}/{run} was finalized by an earlier job "
            "(a message later than its end, or one resent that it already holds)")


def assembly_failure(summary, test: str, run: str, at: float, error: Exception) -> dict:
    """The dead-letter row of a message its run could not take."""
    return dead_letter_row(failure_reason("assemble run", error), summary.raw_payload(), f"run:{test}/{run}", at)


def events_over_the_limit(events, source: str):
    """The dead-letter rows of events a run does not keep (``RunAccumulator.MAX_EVENTS``), each at its own time
    (whichever message made the run leave it out)."""
    for event in events:
        yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
            f"too many events in run (limit {RunAccumulator.MAX_EVENTS})", event_json(event), source, event.time))


def resumed_state_digest(stored: RunAccumulator) -> str:
    """A stored open state's identity: the digest of its encoding (the same stored row, read again, gives the
    same digest; a run drained again, with more in it, another)."""
    return hashlib.sha256(encoding.to_text(stored).encode()).hexdigest()


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
                stored_run_reason(message.test, message.run), message.raw_payload(), f"run:{message.test}/{message.run}",
                float(timestamp)))


class SkipStoredRuns(beam.PTransform):
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


class AssembleRunFn(beam.DoFn):
    """Accumulates a run's messages in state and emits its ``RunResult`` once, when it ends.

    A run ends ``lifecycle.grace_seconds`` of event time after its
    ``run_finished`` event (stragglers still count), or
    ``lifecycle.timeout_seconds`` after its latest point when it never finishes
    (status ``missing``). Messages arriving after that are dead-lettered as
    late; the run's tombstone is kept for ``lifecycle.retention_seconds``.

    With ``interruptions`` (the streaming job), a run that would end as
    ``missing`` further ahead of the wall clock (``clock``) than
    ``lifecycle.clock_skew_seconds`` was cut short by a drain
    (``RunLifecycle.interrupted``): it goes to the ``interrupted`` output with
    its open state (``core.runs.interrupt``) instead. An element whose value is
    a ``RunAccumulator`` is such a run's state, resumed from the store: it is
    merged with whatever the run's messages brought so far.
    """

    ACCUMULATOR = ReadModifyWriteStateSpec("accumulator", RecordCoder())
    FINALIZED = ReadModifyWriteStateSpec("finalized", BooleanCoder())
    # Whether the run is a back-fill (``AssembleRunOrBackfillFn`` decides it at the run's first message).
    BACKFILL = ReadModifyWriteStateSpec("backfill", BooleanCoder())
    # The digest of the stored open state the run was resumed from (``resumed_state_digest``): the same state
    # delivered again (a seed step run again, e.g. by an update) is taken once.
    RESUMED = ReadModifyWriteStateSpec("resumed", StrUtf8Coder())
    FINALIZE = TimerSpec("finalize", TimeDomain.WATERMARK)
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, configs: Configs, lifecycle: RunLifecycle, interruptions: bool = False,
                 clock: Optional[Callable[[], float]] = None):
        self.configs = configs
        self.lifecycle = lifecycle
        self.interruptions = interruptions
        self.clock = clock or time.time
        self.runs_finalized = beam.metrics.Metrics.counter("trainguard", "runs_finalized")
        self.runs_interrupted = beam.metrics.Metrics.counter("trainguard", "runs_interrupted")
        self.runs_resumed = beam.metrics.Metrics.counter("trainguard", "runs_resumed")

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                accumulator_state=beam.DoFn.StateParam(ACCUMULATOR),
                finalized=beam.DoFn.StateParam(FINALIZED),
                resumed=beam.DoFn.StateParam(RESUMED),
                finalize_timer=beam.DoFn.TimerParam(FINALIZE)):
        yield from self._add(element, timestamp, accumulator_state, finalized, finalize_timer, resumed)

    def _add(self, element, timestamp, accumulator_state, finalized, finalize_timer, resumed, backfill=None,
             finalize_backfill_timer=None):
        """Takes one message (or a resumed run's state) into the run; with ``backfill`` (a state cell), a run's
        first message decides whether it is a back-fill, which ends on ``finalize_backfill_timer`` instead."""
        (test, run), summary = element
        if isinstance(summary, RunAccumulator):
            digest = resumed_state_digest(summary)
            if resumed.read() == digest:  # the seed's state of the run again: it is in the run already
                return
            resumed.write(digest)
            yield from self._resume(summary, accumulator_state, finalized, finalize_timer)
            resumed = accumulator_state.read()
            if backfill is not None and resumed is not None and self.lifecycle.backfilled(
                    resumed.finalize_at(self.lifecycle), self.clock()):
                # its end is behind the watermark already: a back-fill a drain cut short, or a live run whose job
                # was down for longer than its timeout; it ends when its sender has been quiet, as a back-fill
                backfill.write(True)
                finalize_backfill_timer.set(Timestamp.of(self.clock() + self.lifecycle.backfill_quiet_seconds))
            return
        if finalized.read():
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", summary.raw_payload(), f"run:{test}/{run}", float(timestamp)))
            return
        accumulator = accumulator_state.read()
        if accumulator is None:
            accumulator = RunAccumulator(test, run)
            if backfill is not None and self.lifecycle.backfilled(float(timestamp), self.clock()):
                backfill.write(True)
        try:
            overflow = accumulator.add(summary)  # all or nothing: a failure leaves the run as it was
            finalize_at = accumulator.finalize_at(self.lifecycle)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's, not the run's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, assembly_failure(summary, test, run, float(timestamp),
                                                                              error))
            return
        yield from events_over_the_limit(overflow, f"run:{test}/{run}")
        accumulator_state.write(accumulator)
        if backfill is not None and backfill.read():
            finalize_backfill_timer.set(Timestamp.of(self.clock() + self.lifecycle.backfill_quiet_seconds))
        else:
            finalize_timer.set(Timestamp.of(finalize_at))

    def _resume(self, stored: RunAccumulator, accumulator_state, finalized, finalize_timer):
        """A run a drained job left open: its stored state joins what this job has of it (its events first), and
        its timer is set again (a run that never hears from its trainer again still ends, as ``missing``, at its
        own timeout). Its element comes from the seed, at the start of time: its dead letters have no time."""
        if (yield from self._merge(stored, True, "resume run", None, accumulator_state, finalized, finalize_timer)):
            self.runs_resumed.inc()

    def _merge(self, other: RunAccumulator, older: bool, step: str, at: Optional[float], accumulator_state,
               finalized, finalize_timer):
        """Merges another accumulator of the run into its state (``older``: before what the state holds) and
        sets its timer; returns whether it did. What cannot be merged is a dead letter of ``step``."""
        source = f"run:{other.test}/{other.run}"
        if finalized.read():  # cannot happen: a seed holds the watermark back, a bounded input is read whole first
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", record_payload(other.to_state()), source, at))
            return False
        current = accumulator_state.read()
        try:
            if older:
                accumulator = copy.deepcopy(other)  # the element's object may be shared: never change it
                overflow = [] if current is None else accumulator.absorb(current)
            else:
                accumulator = current or RunAccumulator(other.test, other.run)
                overflow = accumulator.absorb(other)  # takes copies of what it keeps
            finalize_at = accumulator.finalize_at(self.lifecycle)
        except Exception as error:  # noqa: BLE001 - what cannot be merged is a dead letter, not a crash
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason(step, error), record_payload(other.to_state()), source, at))
            return False
        yield from events_over_the_limit(overflow, source)
        accumulator_state.write(accumulator)
        finalize_timer.set(Timestamp.of(finalize_at))
        return True

    @on_timer(FINALIZE)
    def finalize(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 accumulator_state=beam.DoFn.StateParam(ACCUMULATOR),
                 finalized=beam.DoFn.StateParam(FINALIZED),
                 backfill=beam.DoFn.StateParam(BACKFILL),
                 expire_timer=beam.DoFn.TimerParam(EXPIRE)):
        if backfill.read():  # a back-fill ends on its own timer, by the wall clock
            return
        accumulator = accumulator_state.read()
        if accumulator is None:  # the runner fired a timer for a run whose state is gone
            return
        expire_timer.set(fired_at + Duration(seconds=self.lifecycle.retention_seconds))
        yield from self._finalize(key, accumulator, accumulator_state, finalized, float(fired_at))

    def _finalize(self, key, accumulator: RunAccumulator, accumulator_state, finalized, at: float,
                  out_of_order: bool = False, timer_at: Optional[float] = None):
        """Ends the run at event time ``at``: its ``RunResult`` (or its dead letter) out, its tombstone in.
        ``timer_at``: a back-fill's, the wall-clock time its quiet period ends."""
        accumulator_state.clear()
        finalized.write(True)
        try:
            result = accumulator.result(self.configs.for_test(key[0], at), self.lifecycle)
            if out_of_order:
                result = dataclasses.replace(result, out_of_order=True)
            if self.interruptions and result.status == RunStatus.MISSING:
                now = self.clock()
                if (self.lifecycle.interrupted(at, now) if timer_at is None
                        else self.lifecycle.backfill_interrupted(timer_at, now)):
                    result = interrupt(result, now, encoding.to_text(accumulator))
        except Exception as error:  # noqa: BLE001 - a run that cannot be summed up is that run's dead letter
            self.runs_finalized.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("finalize run", error), record_payload({
                    "test": accumulator.test, "run": accumulator.run, "tags": sorted(accumulator.tags),
                    "events": [event._asdict() for event in accumulator.events]}),
                f"run:{key[0]}/{key[1]}", at))
            return
        if result.status == RunStatus.INTERRUPTED:
            self.runs_interrupted.inc()
            yield beam.pvalue.TaggedOutput(INTERRUPTED, result)
        else:
            self.runs_finalized.inc()
            yield result

    @on_timer(EXPIRE)
    def expire(self, finalized=beam.DoFn.StateParam(FINALIZED), resumed=beam.DoFn.StateParam(RESUMED)):
        finalized.clear()
        resumed.clear()


class AssembleRunOrBackfillFn(AssembleRunFn):
    """``AssembleRunFn`` of the streaming job, which also takes back-fills.

    A run whose first message is older than the wall clock by
    ``lifecycle.backfill_lag_seconds`` is a back-fill (``RunLifecycle.backfilled``):
    its event-time end is behind the watermark, so a timer at that end would
    end it after its first bundle. It ends instead ``lifecycle.backfill_quiet_seconds``
    after its latest message arrived (by its own ``run_finished``, or as
    ``missing`` if the logs never had one), with ``out_of_order`` set, and its
    tombstone expires ``lifecycle.retention_seconds`` after that.

    Both are event-time timers set at the wall clock plus the wait, not
    processing-time timers: Dataflow holds a stage's output watermark at every
    pending user timer's hold, which for a processing-time timer is the
    timestamp of the element that set it, a month back for a back-fill. That
    would hold every check downstream, all tests' alerts, until the tombstone
    expired. An event-time timer's hold is its own time, ahead of the
    watermark, which follows the wall clock: it holds nothing back, and fires
    once the watermark passes the wall-clock time it was set for. A drain
    fires it at once; a back-fill it cuts short without its ``run_finished``
    is interrupted like a live run (``RunLifecycle.backfill_interrupted``), and
    the next job resumes it as a back-fill. A subclass: a replay reads history,
    all of it behind the wall clock, and has no back-fills.
    """

    FINALIZE_BACKFILL = TimerSpec("finalize_backfill", TimeDomain.WATERMARK)
    EXPIRE_BACKFILL = TimerSpec("expire_backfill", TimeDomain.WATERMARK)

    def default_label(self) -> str:
        return "AssembleRunFn"  # the step's name since before back-fills: what a running job's --update maps

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                accumulator_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                resumed=beam.DoFn.StateParam(AssembleRunFn.RESUMED),
                backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL),
                finalize_timer=beam.DoFn.TimerParam(AssembleRunFn.FINALIZE),
                finalize_backfill_timer=beam.DoFn.TimerParam(FINALIZE_BACKFILL)):
        yield from self._add(element, timestamp, accumulator_state, finalized, finalize_timer, resumed, backfill,
                             finalize_backfill_timer)

    @on_timer(FINALIZE_BACKFILL)
    def finalize_backfill(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                          accumulator_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                          finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                          backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL),
                          expire_timer=beam.DoFn.TimerParam(EXPIRE_BACKFILL)):
        accumulator = accumulator_state.read()
        if accumulator is None or not backfill.read():  # state gone, or a timer of an earlier life of the key
            return
        expire_timer.set(Timestamp.of(self.clock() + self.lifecycle.retention_seconds))
        at = accumulator.finalize_at(self.lifecycle)
        yield from self._finalize(key, accumulator, accumulator_state, finalized, at, out_of_order=True,
                                  timer_at=float(fired_at))

    @on_timer(EXPIRE_BACKFILL)
    def expire_backfill(self, finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                        resumed=beam.DoFn.StateParam(AssembleRunFn.RESUMED),
                        backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL)):
        finalized.clear()
        resumed.clear()
        backfill.clear()


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
        self._parts = {}
        self._summary_of = lambda source: summarize_again(source, self.configs)

    def process(self, summary, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        test, run = summary.test, summary.run
        part = self._parts.get((test, run))
        if part is None:
            part = self._parts[(test, run)] = [RunPart(RunAccumulator(test, run)), timestamp, window]
        try:
            part[0], failed = part[0].offer(summary, self._summary_of)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's, not the run's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, assembly_failure(summary, test, run, float(timestamp),
                                                                              error))
            return
        yield from _taken_again_failures(failed, test, run, float(timestamp))
        part[1] = max(part[1], timestamp)

    def finish_bundle(self):
        for key, (part, latest, window) in self._parts.items():
            if part.ids:  # (not a run whose every message failed)
                yield WindowedValue((key, part), latest, [window])
        self._parts = {}


def _taken_again_failures(failed, test: str, run: str, at: Optional[float]):
    """The dead-letter rows of messages a run could not read or take again (``RunPart.without``)."""
    for source, error in failed:
        yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
            failure_reason("assemble run", error), payload_of(source), f"run:{test}/{run}", at))


class AssembleRunPartsFn(AssembleRunFn):
    """``AssembleRunFn`` of a bounded replay: its input is ``RunPart``s (``PreAssembleRunsFn``), and it is where
    the replay de-duplicates messages, by id within their run.

    The run's parts are merged into one, kept in state (``RUN_PART``): its accumulator and, per message taken,
    where to read it again. A part that brings an id the run took is merged by ``RunPart.merged``: the same
    bytes count once, and of different bytes the copy that sorts first counts, whichever came first (the part
    that took the other is taken again without it, its other messages read again from their files). So a
    replay keeps where to read each message of its runs (tens of bytes a message; a batch runner finalizes
    runs once the input is read, then the job ends) instead of a keyed state per message, and the rows are
    those of de-duplicating first. When the run ends, the copies not taken are dead letters (reason
    ``core.parse.DIFFERENT_COPY``, naming the copy taken), and so, if the run is at its events' limit, are the
    events it does not keep, each once (``RunPart.events_over_the_limit``). A run a drained job left open
    (a ``RunAccumulator`` from the seed) is kept apart in ``ACCUMULATOR`` and joins the run when it ends.
    """

    RUN_PART = ReadModifyWriteStateSpec("run_part", RecordCoder())
    # The base class's timer, with this class's callback (a timer spec takes one): the same name.
    FINALIZE = TimerSpec(AssembleRunFn.FINALIZE.name, TimeDomain.WATERMARK)

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                run_part=beam.DoFn.StateParam(RUN_PART),
                resumed_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                finalize_timer=beam.DoFn.TimerParam(FINALIZE)):
        (test, run), value = element
        at = float(timestamp) if isinstance(value, RunPart) else None  # (a resumed run comes at the start of time)
        if finalized.read():  # cannot happen: a bounded input is read whole before any timer fires
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", record_payload(value.to_state()), f"run:{test}/{run}", at))
            return
        held, resumed = run_part.read(), resumed_state.read()
        failed = []
        try:
            if not isinstance(value, RunPart):  # a run a drained job left open
                resumed = value
            elif held is None:
                held = value
            else:
                held, failed = held.merged(value, lambda source: summarize_again(source, self.configs))
            finalize_at = self._whole(held, resumed).finalize_at(self.lifecycle)
        except Exception as error:  # noqa: BLE001 - what cannot be merged is a dead letter, not a crash
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("assemble run", error), record_payload(value.to_state()), f"run:{test}/{run}", at))
            return
        yield from _taken_again_failures(failed, test, run, at)
        if isinstance(value, RunPart):
            run_part.write(held)
        else:
            resumed_state.write(resumed)
            self.runs_resumed.inc()
        finalize_timer.set(Timestamp.of(finalize_at))

    @staticmethod
    def _whole(held: Optional[RunPart], resumed: Optional[RunAccumulator]) -> RunAccumulator:
        """The run's accumulator: its messages' and a resumed run's (earlier: its events first), changing
        neither."""
        if resumed is None:
            return held.accumulator
        whole = copy.deepcopy(resumed)
        if held is not None:
            whole.absorb(held.accumulator)  # events it leaves out: see RunPart.events_over_the_limit
        return whole

    @on_timer(FINALIZE)
    def finalize(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 run_part=beam.DoFn.StateParam(RUN_PART),
                 resumed_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                 finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                 expire_timer=beam.DoFn.TimerParam(AssembleRunFn.EXPIRE)):
        held, resumed = run_part.read(), resumed_state.read()
        if held is None and resumed is None:  # the runner fired a timer for a run whose state is gone
            return
        expire_timer.set(fired_at + Duration(seconds=self.lifecycle.retention_seconds))
        at, source = float(fired_at), f"run:{key[0]}/{key[1]}"
        accumulator = self._whole(held, resumed)
        run_part.clear()
        if held is not None:
            yield from self._copies_not_taken(held, source)
            if accumulator.at_event_limit():
                over, failed = held.events_over_the_limit(resumed.events if resumed is not None else ())
                yield from events_over_the_limit(over, source)
                yield from _taken_again_failures(failed, key[0], key[1], at)
        yield from self._finalize(key, accumulator, resumed_state, finalized, at)

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


def _open_runs(seed):
    """The runs a drained job left open (``HistorySeed.open_runs``), keyed as messages are."""
    return seed.open_runs.items()


class AssembleRuns(beam.PTransform):
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
            inputs = messages | "KeyByRun" >> beam.Map(lambda m: ((m.test, m.run), m)).with_output_types(keyed)
        if self.seed is not None:
            resumed = self.seed | "OpenRuns" >> beam.FlatMap(_open_runs).with_output_types(keyed)
            inputs = (inputs, resumed) | "MessagesAndOpenRuns" >> beam.Flatten().with_output_types(keyed)
        outputs = inputs | "Assemble" >> beam.ParDo(self.fn).with_outputs(DEAD_LETTER.name, INTERRUPTED, main="runs")
        dead_letters = outputs[DEAD_LETTER.name]
        if early_dead_letters is not None:
            dead_letters = (early_dead_letters, dead_letters) | "AssemblyDeadLetters" >> beam.Flatten()
        return outputs.runs, dead_letters, outputs[INTERRUPTED]
