"""Run assembly's DoFn: the messages of one (test, run) -> one ``RunResult`` when the run ends.

The streaming job's back-fills (``transforms.backfills``) are a subclass; a replay's run parts
(``transforms.run_parts``) end their runs through ``AssembleRunFn.run_ended``; ``transforms.runs.AssembleRuns``
chooses one. Each DoFn method hands the state cells and timers Beam gave it to its helpers as one ``RunCells``;
what can be computed without them is a pure function (``join_resumed``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from typing import Any, Callable, List, Optional, Tuple

import apache_beam as beam
from apache_beam.coders import BooleanCoder, StrUtf8Coder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration, Timestamp

from core import encoding
from core.config import Configs
from core.records import dead_letter_row, failure_reason, record_payload
from core.runs import RankedEvent, RunAccumulator, RunLifecycle, event_json, interrupt
from core.schema import DEAD_LETTER
from core.vocabulary import RunStatus
from transforms.coders import RecordCoder, outputs_any

RunKey = Tuple[str, str]
INTERRUPTED = "interrupted"  # AssembleRuns' output of the runs a drain cut short (``RunStatus.INTERRUPTED``)


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


@dataclasses.dataclass(frozen=True)
class RunCells:
    """The state cells and timers of one run that a DoFn method was given, for the helpers it calls: each is
    what Beam passed for the spec of that name (``AssembleRunFn``'s, or a subclass's), None where the method has
    no such parameter. Made once at the top of each ``process`` and timer callback."""
    accumulator: Any  # ACCUMULATOR: the run so far (a replay's run parts: a resumed run's state, kept apart)
    finalized: Any  # FINALIZED: the run's tombstone
    resumed: Any = None  # RESUMED: the digest of the stored state the run was resumed from
    backfill: Any = None  # BACKFILL: whether the run is a back-fill (None: a DoFn without back-fills)
    finalize_timer: Any = None  # FINALIZE
    finalize_backfill_timer: Any = None  # AssembleRunOrBackfillFn.FINALIZE_BACKFILL
    expire_timer: Any = None  # EXPIRE, or AssembleRunOrBackfillFn.EXPIRE_BACKFILL


@dataclasses.dataclass(frozen=True)
class JoinedRun:
    """A stored open run joined with what the job has of it (``join_resumed``)."""
    accumulator: RunAccumulator  # the run as a whole, to keep
    over_the_limit: List[RankedEvent]  # the events it no longer keeps (``RunAccumulator.MAX_EVENTS``)
    finalize_at: float  # when the run ends, by event time


def join_resumed(stored: RunAccumulator, current: Optional[RunAccumulator], lifecycle: RunLifecycle) -> JoinedRun:
    """A run a drained job left open (``stored``) joined with what this job has of it (``current``, None: nothing
    yet), the stored run's events first; changes neither. Raises what cannot be joined (another run's state)."""
    accumulator = copy.deepcopy(stored)  # the element's object may be shared: never change it
    over_the_limit = [] if current is None else accumulator.absorb(current)
    return JoinedRun(accumulator, over_the_limit, accumulator.finalize_at(lifecycle))


@outputs_any
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
        cells = RunCells(accumulator_state, finalized, resumed=resumed, finalize_timer=finalize_timer)
        yield from self._add(element, timestamp, cells)

    def _add(self, element, timestamp, cells: RunCells):
        """Takes one message, or a resumed run's state, into the run. With ``cells.backfill`` (the streaming
        job's back-fills), a run's first message decides whether it is a back-fill, which then ends on
        ``cells.finalize_backfill_timer`` instead of ``cells.finalize_timer``."""
        (test, run), summary = element
        if isinstance(summary, RunAccumulator):
            yield from self._resume_once(summary, cells)
        else:
            yield from self._take_message(test, run, summary, float(timestamp), cells)

    def _resume_once(self, stored: RunAccumulator, cells: RunCells):
        """A stored open run, resumed unless the run took the same stored state already (``cells.resumed``); a
        back-fill's state, or a live run's whose job was down past its timeout, resumes as a back-fill."""
        digest = resumed_state_digest(stored)
        if cells.resumed.read() == digest:  # the seed's state of the run again: it is in the run already
            return
        cells.resumed.write(digest)
        yield from self._resume(stored, cells)
        current = cells.accumulator.read()
        if cells.backfill is not None and current is not None and self.lifecycle.backfilled(
                current.finalize_at(self.lifecycle), self.clock()):
            # its end is behind the watermark already: a back-fill a drain cut short, or a live run whose job
            # was down for longer than its timeout; it ends when its sender has been quiet, as a back-fill
            cells.backfill.write(True)
            cells.finalize_backfill_timer.set(Timestamp.of(self.clock() + self.lifecycle.backfill_quiet_seconds))

    def _take_message(self, test: str, run: str, summary, at: float, cells: RunCells):
        """One message of the run at event time ``at``: into the run's accumulator and its timer set again, or a
        dead letter (late, or one the run cannot take), and the events the run no longer keeps."""
        if cells.finalized.read():
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", summary.raw_payload(), f"run:{test}/{run}", at))
            return
        accumulator = cells.accumulator.read()
        if accumulator is None:
            accumulator = RunAccumulator(test, run)
            if cells.backfill is not None and self.lifecycle.backfilled(at, self.clock()):
                cells.backfill.write(True)
        try:
            overflow = accumulator.add(summary)  # all or nothing: a failure leaves the run as it was
            finalize_at = accumulator.finalize_at(self.lifecycle)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's, not the run's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, assembly_failure(summary, test, run, at, error))
            return
        yield from events_over_the_limit(overflow, f"run:{test}/{run}")
        cells.accumulator.write(accumulator)
        if cells.backfill is not None and cells.backfill.read():
            cells.finalize_backfill_timer.set(Timestamp.of(self.clock() + self.lifecycle.backfill_quiet_seconds))
        else:
            cells.finalize_timer.set(Timestamp.of(finalize_at))

    def _resume(self, stored: RunAccumulator, cells: RunCells):
        """A run a drained job left open: its stored state joins what this job has of it (its events first), and
        its timer is set again (a run that never hears from its trainer again still ends, as ``missing``, at its
        own timeout). Its element comes from the seed, at the start of time: its dead letters have no time. What
        cannot be joined is a dead letter, and the run's state stays as it was."""
        source = f"run:{stored.test}/{stored.run}"
        if cells.finalized.read():  # cannot happen: a seed holds the watermark back, a bounded input is read first
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", record_payload(stored.to_state()), source, None))
            return
        current = cells.accumulator.read()
        try:
            joined = join_resumed(stored, current, self.lifecycle)
        except Exception as error:  # noqa: BLE001 - what cannot be merged is a dead letter, not a crash
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("resume run", error), record_payload(stored.to_state()), source, None))
            return
        yield from events_over_the_limit(joined.over_the_limit, source)
        cells.accumulator.write(joined.accumulator)
        cells.finalize_timer.set(Timestamp.of(joined.finalize_at))
        self.runs_resumed.inc()

    @on_timer(FINALIZE)
    def finalize(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 accumulator_state=beam.DoFn.StateParam(ACCUMULATOR),
                 finalized=beam.DoFn.StateParam(FINALIZED),
                 backfill=beam.DoFn.StateParam(BACKFILL),
                 expire_timer=beam.DoFn.TimerParam(EXPIRE)):
        cells = RunCells(accumulator_state, finalized, backfill=backfill, expire_timer=expire_timer)
        if cells.backfill.read():  # a back-fill ends on its own timer, by the wall clock
            return
        accumulator = cells.accumulator.read()
        if accumulator is None:  # the runner fired a timer for a run whose state is gone
            return
        cells.expire_timer.set(fired_at + Duration(seconds=self.lifecycle.retention_seconds))
        yield from self._finalize(key, accumulator, cells, float(fired_at))

    def _finalize(self, key: RunKey, accumulator: RunAccumulator, cells: RunCells, at: float,
                  out_of_order: bool = False, timer_at: Optional[float] = None):
        """Ends the run at event time ``at``: its ``RunResult`` (or its dead letter) out, its tombstone in
        (``cells.finalized``; ``cells.accumulator`` cleared). ``timer_at``: a back-fill's, the wall-clock time
        its quiet period ends."""
        cells.accumulator.clear()
        cells.finalized.write(True)
        yield from self.run_ended(key, accumulator, at, out_of_order, timer_at)

    def run_ended(self, key: RunKey, accumulator: RunAccumulator, at: float, out_of_order: bool = False,
                  timer_at: Optional[float] = None):
        """What a run ending at event time ``at`` gives (``_finalize``, less its state): its ``RunResult``, to
        the ``interrupted`` output if a drain cut it short, or its dead letter."""
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
