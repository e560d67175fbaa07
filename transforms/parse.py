"""From raw payloads to validated, de-duplicated wire messages in event time."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.coders import BooleanCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from core.config import Configs
from core.parse import MessageSummary, ParsedMessage, RawMessage, content_digest, different_copy_reason, summarize
from core.records import dead_letter_row, failure_reason, record_payload
from core.schema import DEAD_LETTER, TRIAGE
from core.triage import TriageItem
from trainguard import wire
from transforms import progress
from transforms.coders import AnyRecord, RecordCoder, outputs_any


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
        self._read = 0  # counted into messages_read once a bundle (an update of a Beam counter costs ~0.7 µs)

    def finish_bundle(self):
        if self._read:
            self.messages_read.inc(self._read)

    def process(self, raw: RawMessage):
        self._read += 1
        reason: Optional[str]
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
            yield beam.pvalue.TaggedOutput(TRIAGE.name, TimestampedValue(
                TriageItem.of(message), message.event_time))
        elif message.points or message.events:
            yield TimestampedValue(ParsedMessage(message, raw.payload, raw.span), message.event_time)


class ParseMessages(beam.PTransform[PCollection[RawMessage], Tuple[PCollection[ParsedMessage], PCollection[TriageItem],
                                                                     PCollection[Dict[str, Any]]]]):
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

    def process(self, parsed: ParsedMessage):
        # (No TimestampParam: a DoFn that asks for none is invoked several µs an element faster. The element's
        # timestamp is its message's event time, as ParseMessageFn stamped it.)
        message = parsed.message
        try:
            yield summarize(message, parsed.payload, self.configs.for_test(message.test, message.event_time),
                            parsed.span)
        except Exception as error:  # noqa: BLE001 - one message's failure is that message's
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason("summarize", error), parsed.payload, f"run:{message.test}/{message.run}",
                float(Timestamp.of(message.event_time))))


class SummarizeMessages(beam.PTransform[PCollection[ParsedMessage],
                                           Tuple[PCollection[MessageSummary], PCollection[Dict[str, Any]]]]):
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


DUPLICATE_OF_UNKNOWN = ("duplicate id (the copy taken came before this job compared copies: whether this one "
                        "differs is not known)")
"""The dead-letter reason of a later copy of an id that a streaming job took before it was updated to keep what
it took (a day at most: ``RunLifecycle.dedup_horizon_seconds``)."""


def copy_content(value) -> bytes:
    """What tells copies of a message id apart: a message's payload bytes; a triage action's fields (all the
    pipeline keeps of its payload), as JSON."""
    if isinstance(value, MessageSummary):
        return value.raw_payload()
    return record_payload(value).encode("utf-8")


def _copy_source(value) -> str:
    """The dead-letter source of a copy: its run, or its test for a triage action."""
    return f"run:{value.test}/{value.run}" if isinstance(value, MessageSummary) else f"triage:{value.test}"


def _different_copy(value, taken: Optional[bytes], at: float):
    """The dead letter of a copy that does not count: its content, and the ``content_digest`` of the copy taken."""
    return beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
        different_copy_reason(taken), copy_content(value), _copy_source(value), at))


class DeduplicateMessages(beam.PTransform[PCollection[Any], Tuple[PCollection[Any], PCollection[Dict[str, Any]]]]):
    """MessageSummary (or TriageItem) -> (the same, each message id once; dead letters of copies that differ).

    Pub/Sub delivers at least once; a redelivered message carries the same id and bytes, so keying by id
    catches it wherever it lands in the stream, and it is nothing more. Copies of an id whose content differs
    (``copy_content``) are not one message: one of them counts, never a mix, and each other one is a dead
    letter (reason ``core.parse.DIFFERENT_COPY``, naming the copy taken by the start of its SHA-256).

    Which one counts: in a streaming job (``forget=True``) the first one delivered, within
    ``horizon_seconds`` of event time (``first_per_key_in_event_time``): it has gone on by the time another comes.
    In a bounded replay (``forget=False``) the one whose content sorts first, whatever the order and the
    bundles (``_FirstCopyFn``, after a ``GroupByKey``: a batch runner has every copy before it goes on), each
    id once in the whole input; ``per_run``: once per (test, run), as the replay's run assembly takes them
    (``AssembleRunPartsFn``), so that ``LiveWindows`` windows the copy its run counts.
    """

    def __init__(self, horizon_seconds: float, forget: bool = True, per_run: bool = False):
        super().__init__()
        self.horizon_seconds = horizon_seconds
        self.forget = forget
        self.per_run = per_run

    def expand(self, messages):
        if self.forget:
            keyed = messages | "KeyById" >> beam.Map(lambda m: (m.id, m)).with_output_types(
                beam.typehints.KV[str, AnyRecord])
            first = keyed | "FirstPerId" >> first_per_key_in_event_time(self.horizon_seconds)
            return first.first | "DropKey" >> beam.Values(), first[DEAD_LETTER.name]
        if self.per_run:
            keyed = messages | "KeyByRunAndId" >> beam.Map(_keyed_in_run).with_output_types(
                beam.typehints.KV[beam.typehints.Tuple[str, str, str], AnyRecord])
        else:
            keyed = messages | "KeyById" >> beam.Map(_keyed_by_id).with_output_types(
                beam.typehints.KV[str, AnyRecord])
        first = (keyed
                 | "CopiesPerId" >> beam.GroupByKey()
                 | "FirstCopy" >> beam.ParDo(_FirstCopyFn()).with_outputs(DEAD_LETTER.name, main="first"))
        return first.first, first[DEAD_LETTER.name]


def _keyed_by_id(message, at=beam.DoFn.TimestampParam):
    """(id, (message, its event time)): a ``GroupByKey`` keeps no element's own time."""
    return message.id, (message, float(at))


def _keyed_in_run(message, at=beam.DoFn.TimestampParam):
    """((test, run, id), (message, its event time))."""
    return (message.test, message.run, message.id), (message, float(at))


@outputs_any
class _FirstCopyFn(beam.DoFn):
    """(key, [(copy, event time), ...]) -> the copy whose content sorts first, at its own time, and the dead
    letters of the others whose content differs (each distinct content once)."""

    def process(self, grouped):
        _, copies = grouped
        copies = list(copies)
        if len(copies) == 1:
            value, at = copies[0]
            yield TimestampedValue(value, at)
            return
        by_content = {}
        for value, at in copies:
            by_content.setdefault(copy_content(value), (value, at))
        contents = sorted(by_content)
        value, at = by_content[contents[0]]
        yield TimestampedValue(value, at)
        taken = content_digest(contents[0])
        for content in contents[1:]:
            other, other_at = by_content[content]
            yield _different_copy(other, taken, other_at)


def first_per_key_in_event_time(horizon_seconds: float):
    """(key, message) -> (``first``: the first (key, message) of each key, again once ``horizon_seconds`` of event
    time have passed; ``dead_letter``: later copies whose content differs from it).

    A later copy with the same content (``copy_content``) is a redelivery: nothing. One whose content differs is
    a dead letter naming the copy taken, whose ``content_digest`` the key keeps (state ``taken_digest``, added
    after ``seen``: a key ``seen`` says was taken, without a digest, was taken before the job was updated, and
    a later copy of it is a dead letter of its own, ``DUPLICATE_OF_UNKNOWN``). A first copy costs a read of
    ``seen`` and two writes (one before), a later one two reads.

    Beam's ``DeduplicatePerKey(event_time_duration=...)`` without its processing-time timer: that timer, declared
    even when unused, makes Beam's ``DirectRunner`` leave the FnApiRunner for the BundleBasedDirectRunner, whose
    user timers do not hold the watermark of the stages after them, so a replay named ``--runner=DirectRunner``
    gave other rows. The step, state and timer names are Beam's, so that ``--update`` finds the running job's:
    applied as ``"FirstPerId" >> ...``, the stateful step is ``FirstPerId/DeduplicateFn`` as it always was (a
    composite around a multi-output ``ParDo`` would put it one level down).
    """
    pardo = beam.ParDo(FirstPerKeyFn(Duration(seconds=horizon_seconds)))
    pardo.label = "DeduplicateFn"
    return pardo.with_outputs(DEAD_LETTER.name, main="first")


class FirstPerKeyFn(beam.DoFn):
    """The stateful DoFn of ``first_per_key_in_event_time`` (its docstring says what it keeps and emits)."""
    SEEN = BagStateSpec("seen", BooleanCoder())
    TAKEN_DIGEST = ReadModifyWriteStateSpec("taken_digest", RecordCoder())
    FORGET = TimerSpec("event_timer", TimeDomain.WATERMARK)

    def __init__(self, horizon: Duration):
        self.horizon = horizon

    def process(self, keyed, at=beam.DoFn.TimestampParam, seen=beam.DoFn.StateParam(SEEN),
                taken_digest=beam.DoFn.StateParam(TAKEN_DIGEST), forget=beam.DoFn.TimerParam(FORGET)):
        value = keyed[1]
        if True not in seen.read():
            forget.set(at + self.horizon)
            seen.add(True)
            taken_digest.write(content_digest(copy_content(value)))
            yield keyed
            return
        taken = taken_digest.read()
        if taken is None:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                DUPLICATE_OF_UNKNOWN, copy_content(value), _copy_source(value), float(at)))
        elif taken != content_digest(copy_content(value)):
            yield _different_copy(value, taken, float(at))

    @on_timer(FORGET)
    def on_forget(self, seen=beam.DoFn.StateParam(SEEN), taken_digest=beam.DoFn.StateParam(TAKEN_DIGEST)):
        seen.clear()
        taken_digest.clear()
