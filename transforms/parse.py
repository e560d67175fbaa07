"""From raw payloads to validated, de-duplicated wire messages in event time."""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
from apache_beam.coders import BooleanCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration

from core.config import Configs
from core.parse import ParsedMessage, RawMessage, summarize
from core.records import dead_letter_row, failure_reason
from core.schema import DEAD_LETTER, TRIAGE
from core.triage import TriageItem
from trainguard import wire
from transforms import progress
from transforms.coders import AnyRecord


class ParseMessageFn(beam.DoFn):
    """Validates one payload; good messages go out stamped with their event time.

    Invalid payloads, and invalid points or events inside otherwise good
    messages, go to the ``dead_letter`` output with the reason and the payload;
    so does a payload the parser itself fails on, with the exception as the reason.
    With a progress id (a counter of ``transforms.progress``), each message and
    its valid points are also counted there.
    """

    def __init__(self, progress_id: Optional[str] = None):
        self.messages_read = beam.metrics.Metrics.counter("trainguard", "messages_read")
        self.progress_id = progress_id

    def start_bundle(self):
        self._progress = progress.counter_for(self.progress_id)

    def process(self, raw: RawMessage):
        self.messages_read.inc()
        try:
            message, rejections = wire.parse_message(raw.payload)
        except wire.InvalidMessage as e:
            reason = f"invalid message: {e}"
        except Exception as error:  # noqa: BLE001 - whatever one payload does to the parser is that payload's
            reason = failure_reason("parse", error)
        else:
            reason = None
        if self._progress is not None:
            self._progress.read_message(0 if reason is not None else len(message.points))
        if reason is not None:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                reason, raw.payload, raw.source, raw.received_at))
            return
        for rejection in rejections:
            payload = raw.payload if rejection.payload is None else rejection.payload
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                rejection.reason, payload, raw.source, raw.received_at))
        if message.triage is not None:
            yield beam.pvalue.TaggedOutput(TRIAGE.name, beam.window.TimestampedValue(
                TriageItem.of(message), message.event_time))
        elif message.points or message.events:
            yield beam.window.TimestampedValue(ParsedMessage(message, raw.payload, raw.span), message.event_time)


class ParseMessages(beam.PTransform):
    """RawMessage -> (ParsedMessage in event time, TriageItem of control messages in event time, dead letters).

    ``progress_id``: see :class:`ParseMessageFn`.
    """

    def __init__(self, progress_id: Optional[str] = None):
        super().__init__()
        self.progress_id = progress_id

    def expand(self, raw_messages):
        outputs = raw_messages | beam.ParDo(ParseMessageFn(self.progress_id)).with_outputs(
            TRIAGE.name, DEAD_LETTER.name, main="messages")
        return outputs.messages, outputs[TRIAGE.name], outputs[DEAD_LETTER.name]


class SummarizeMessageFn(beam.DoFn):
    """ParsedMessage -> MessageSummary; a message it fails on goes to ``dead_letter`` whole."""

    def __init__(self, configs: Configs):
        self.configs = configs

    def process(self, parsed: ParsedMessage, timestamp=beam.DoFn.TimestampParam):
        message = parsed.message
        try:
            yield summarize(message, parsed.payload, self.configs.for_test(message.test, message.event_time),
                            parsed.span)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("summarize", error), parsed.payload, f"run:{message.test}/{message.run}",
                float(timestamp)))


class SummarizeMessages(beam.PTransform):
    """ParsedMessage -> (MessageSummary: per-tag partial aggregates under the test's config, dead letters).

    Done before any shuffle, so that points never cross one: only small
    summaries (and the raw payload bytes) do.
    """

    def __init__(self, configs: Configs):
        super().__init__()
        self.configs = configs

    def expand(self, parsed_messages):
        outputs = parsed_messages | "Summarize" >> beam.ParDo(SummarizeMessageFn(self.configs)).with_outputs(
            DEAD_LETTER.name, main="summaries")
        return outputs.summaries, outputs[DEAD_LETTER.name]


class DeduplicateMessages(beam.PTransform):
    """MessageSummary (or TriageItem) -> the same, each message id once within ``horizon_seconds`` of event time.

    Pub/Sub delivers at least once; a redelivered message carries the same id
    and event time, so keying by id catches it wherever it lands in the stream.
    ``forget=False`` (a bounded replay): each id once in the whole input. A
    batch runner reads a bounded input whole before its event-time timers
    fire, so forgetting ids would change nothing there but cost a timer per
    message (8% of a replay).
    """

    def __init__(self, horizon_seconds: float, forget: bool = True):
        super().__init__()
        self.horizon_seconds = horizon_seconds
        self.forget = forget

    def expand(self, messages):
        keyed = messages | "KeyById" >> beam.Map(lambda m: (m.id, m)).with_output_types(
            beam.typehints.KV[str, AnyRecord])
        first = (keyed | "FirstPerId" >> FirstPerKeyInEventTime(self.horizon_seconds) if self.forget
                 else keyed | "FirstPerId" >> beam.ParDo(_FirstPerKeyEverFn()))
        return first | "DropKey" >> beam.Values()


class FirstPerKeyInEventTime(beam.PTransform):
    """(key, value) -> the first (key, value) of each key, again once ``horizon_seconds`` of event time have passed.

    Beam's ``DeduplicatePerKey(event_time_duration=...)`` without its processing-time timer: that timer, declared
    even when unused, makes Beam's ``DirectRunner`` leave the FnApiRunner for the BundleBasedDirectRunner, whose
    user timers do not hold the watermark of the stages after them, so a replay named ``--runner=DirectRunner``
    gave other rows. The step, state and timer names are Beam's, so that ``--update`` finds the running job's.
    """

    def __init__(self, horizon_seconds: float):
        super().__init__()
        self.horizon_seconds = horizon_seconds

    def expand(self, keyed):
        return keyed | "DeduplicateFn" >> beam.ParDo(_FirstPerKeyFn(Duration(seconds=self.horizon_seconds)))


class _FirstPerKeyFn(beam.DoFn):
    SEEN = BagStateSpec("seen", BooleanCoder())
    FORGET = TimerSpec("event_timer", TimeDomain.WATERMARK)

    def __init__(self, horizon: Duration):
        self.horizon = horizon

    def process(self, keyed, at=beam.DoFn.TimestampParam, seen=beam.DoFn.StateParam(SEEN),
                forget=beam.DoFn.TimerParam(FORGET)):
        if True in seen.read():
            return
        forget.set(at + self.horizon)
        seen.add(True)
        yield keyed

    @on_timer(FORGET)
    def on_forget(self, seen=beam.DoFn.StateParam(SEEN)):
        seen.clear()


class _FirstPerKeyEverFn(beam.DoFn):
    """(key, value) -> the first (key, value) of each key."""
    SEEN = _FirstPerKeyFn.SEEN

    def process(self, keyed, seen=beam.DoFn.StateParam(SEEN)):
        if True in seen.read():
            return
        seen.add(True)
        yield keyed
