"""From raw payloads to validated, de-duplicated wire messages in event time."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.deduplicate import DeduplicatePerKey
from apache_beam.utils.timestamp import Duration

from core.config import ConfigSet
from core.parse import MessageSummary, ParsedMessage, RawMessage, summarize
from core.records import dead_letter_row
from core.schema import DEAD_LETTER
from trainguard import wire


class ParseMessageFn(beam.DoFn):
    """Validates one payload; good messages go out stamped with their event time.

    Invalid payloads, and invalid points or events inside otherwise good
    messages, go to the ``dead_letter`` output with the reason and the payload.
    """

    def __init__(self):
        self.messages_read = beam.metrics.Metrics.counter("trainguard", "messages_read")

    def process(self, raw: RawMessage):
        self.messages_read.inc()
        try:
            message, rejections = wire.parse_message(raw.payload)
        except wire.InvalidMessage as e:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                f"invalid message: {e}", raw.payload, raw.source, raw.received_at))
            return
        for rejection in rejections:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                rejection.reason, rejection.payload, raw.source, raw.received_at))
        if message.points or message.events:
            yield beam.window.TimestampedValue(ParsedMessage(message, raw.payload), message.event_time)


class ParseMessages(beam.PTransform):
    """RawMessage -> (ParsedMessage in event time, dead-letter rows)."""

    def expand(self, raw_messages):
        outputs = raw_messages | beam.ParDo(ParseMessageFn()).with_outputs(DEAD_LETTER.name, main="messages")
        return outputs.messages, outputs[DEAD_LETTER.name]


class SummarizeMessages(beam.PTransform):
    """ParsedMessage -> MessageSummary: per-tag partial aggregates under the test's config.

    Done before any shuffle, so that points never cross one: only small
    summaries (and the raw payload bytes) do.
    """

    def __init__(self, configs: ConfigSet):
        super().__init__()
        self.configs = configs

    def expand(self, parsed_messages):
        configs = self.configs
        return parsed_messages | beam.Map(
            lambda parsed: summarize(parsed.message, parsed.payload, configs.for_test(parsed.message.test)))


class DeduplicateMessages(beam.PTransform):
    """MessageSummary -> the same, each message id once within ``horizon_seconds`` of event time.

    Pub/Sub delivers at least once; a redelivered message carries the same id
    and event time, so keying by id catches it wherever it lands in the stream.
    """

    def __init__(self, horizon_seconds: float):
        super().__init__()
        self.horizon_seconds = horizon_seconds

    def expand(self, messages):
        return (messages
                | "KeyById" >> beam.Map(lambda m: (m.id, m)).with_output_types(beam.typehints.KV[str, MessageSummary])
                | "FirstPerId" >> DeduplicatePerKey(event_time_duration=Duration(seconds=self.horizon_seconds))
                | "DropKey" >> beam.Values())
