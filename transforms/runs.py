"""Per-run assembly: messages of one (test, run) -> one ``RunResult`` when the run ends."""

from __future__ import annotations

import json
from typing import Tuple

import apache_beam as beam
from apache_beam.coders import BooleanCoder, PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration, Timestamp

from core.config import Configs
from core.parse import MessageSummary
from core.records import dead_letter_row, failure_reason, record_payload
from core.runs import RunAccumulator, RunLifecycle
from core.schema import DEAD_LETTER

RunKey = Tuple[str, str]


class SkipStoredRuns(beam.PTransform):
    """Drops messages of runs that the store already holds (re-running the same files).

    Takes ``MessageSummary``s and the start-up seed as a singleton side input;
    what it drops is counted (``messages_of_stored_runs``) and reported.
    """

    def __init__(self, seed):
        super().__init__()
        self.seed = seed

    def expand(self, messages):
        skipped = beam.metrics.Metrics.counter("trainguard", "messages_of_stored_runs")

        def is_new(message, seed):
            if (message.test, message.run) in seed.stored_runs:
                skipped.inc()
                return False
            return True

        return messages | beam.Filter(is_new, self.seed)


class AssembleRunFn(beam.DoFn):
    """Accumulates a run's messages in state and emits its ``RunResult`` once, when it ends.

    A run ends ``lifecycle.grace_seconds`` of event time after its
    ``run_finished`` event (stragglers still count), or
    ``lifecycle.timeout_seconds`` after its latest point when it never finishes
    (status ``missing``). Messages arriving after that are dead-lettered as
    late; the run's tombstone is kept for ``lifecycle.retention_seconds``.
    """

    ACCUMULATOR = ReadModifyWriteStateSpec("accumulator", PickleCoder())
    FINALIZED = ReadModifyWriteStateSpec("finalized", BooleanCoder())
    FINALIZE = TimerSpec("finalize", TimeDomain.WATERMARK)
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, configs: Configs, lifecycle: RunLifecycle):
        self.configs = configs
        self.lifecycle = lifecycle
        self.runs_finalized = beam.metrics.Metrics.counter("trainguard", "runs_finalized")

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                accumulator_state=beam.DoFn.StateParam(ACCUMULATOR),
                finalized=beam.DoFn.StateParam(FINALIZED),
                finalize_timer=beam.DoFn.TimerParam(FINALIZE)):
        (test, run), summary = element
        if finalized.read():
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                "late: run already finalized", summary.payload, f"run:{test}/{run}", float(timestamp)))
            return
        accumulator = accumulator_state.read() or RunAccumulator(test, run)
        try:
            overflow = accumulator.add(summary)  # all or nothing: a failure leaves the run as it was
            finalize_at = accumulator.finalize_at(self.lifecycle)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's, not the run's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("assemble run", error), summary.payload, f"run:{test}/{run}", float(timestamp)))
            return
        for event in overflow:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                f"too many events in run (limit {RunAccumulator.MAX_EVENTS})",
                json.dumps(event._asdict(), sort_keys=True), f"run:{test}/{run}", float(timestamp)))
        accumulator_state.write(accumulator)
        finalize_timer.set(Timestamp.of(finalize_at))

    @on_timer(FINALIZE)
    def finalize(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 accumulator_state=beam.DoFn.StateParam(ACCUMULATOR),
                 finalized=beam.DoFn.StateParam(FINALIZED),
                 expire_timer=beam.DoFn.TimerParam(EXPIRE)):
        accumulator = accumulator_state.read()
        if accumulator is None:  # the runner fired a timer for a run whose state is gone
            return
        accumulator_state.clear()
        finalized.write(True)
        expire_timer.set(fired_at + Duration(seconds=self.lifecycle.retention_seconds))
        self.runs_finalized.inc()
        try:
            yield accumulator.result(self.configs.for_test(key[0], float(fired_at)), self.lifecycle)
        except Exception as error:  # noqa: BLE001 - a run that cannot be summed up is that run's dead letter
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("finalize run", error), record_payload({
                    "test": accumulator.test, "run": accumulator.run, "tags": sorted(accumulator.tags),
                    "events": [event._asdict() for event in accumulator.events]}),
                f"run:{key[0]}/{key[1]}", float(fired_at)))

    @on_timer(EXPIRE)
    def expire(self, finalized=beam.DoFn.StateParam(FINALIZED)):
        finalized.clear()


class AssembleRuns(beam.PTransform):
    """MessageSummary -> (RunResult per finalized run, dead-letter rows for late messages)."""

    def __init__(self, configs: Configs, lifecycle: RunLifecycle):
        super().__init__()
        self.fn = AssembleRunFn(configs, lifecycle)

    def expand(self, messages):
        outputs = (messages
                   | "KeyByRun" >> beam.Map(lambda m: ((m.test, m.run), m)).with_output_types(
                       beam.typehints.KV[beam.typehints.Tuple[str, str], MessageSummary])
                   | "Assemble" >> beam.ParDo(self.fn).with_outputs(DEAD_LETTER.name, main="runs"))
        return outputs.runs, outputs[DEAD_LETTER.name]
