"""From raw payloads to validated, de-duplicated wire messages in event time."""

from __future__ import annotations

import dataclasses
from typing import Optional

import apache_beam as beam
from apache_beam.transforms.deduplicate import DeduplicatePerKey
from apache_beam.utils.timestamp import Duration

from transforms.records import dead_letter_row
from trainguard import wire

DEAD_LETTER = "dead_letter"


@dataclasses.dataclass(frozen=True)
class RawMessage:
    """One payload as it arrived: a Pub/Sub message's data or a line of a replay file."""
    payload: bytes
    source: str                  # e.g. "file:data/a.jsonl" or "pubsub:projects/p/subscriptions/s"
    received_at: Optional[float] = None  # publish time, where the source knows one


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
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_row(
                f"invalid message: {e}", raw.payload, raw.source, raw.received_at))
            return
        for rejection in rejections:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_row(
                rejection.reason, rejection.payload, raw.source, raw.received_at))
        if message.points or message.events:
            yield beam.window.TimestampedValue(message, message.event_time)


class ParseMessages(beam.PTransform):
    """RawMessage -> (valid ``wire.Message`` in event time, dead-letter rows)."""

    def expand(self, raw_messages):
        outputs = raw_messages | beam.ParDo(ParseMessageFn()).with_outputs(DEAD_LETTER, main="messages")
        return outputs.messages, outputs[DEAD_LETTER]


class DeduplicateMessages(beam.PTransform):
    """Drops redeliveries: a message id seen within ``horizon_seconds`` of event time passes once.

    Pub/Sub delivers at least once; a redelivered message carries the same id
    and event time, so keying by id catches it wherever it lands in the stream.
    """

    def __init__(self, horizon_seconds: float):
        super().__init__()
        self.horizon_seconds = horizon_seconds

    def expand(self, messages):
        return (messages
                | "KeyById" >> beam.Map(lambda m: (m.id, m)).with_output_types(beam.typehints.KV[str, wire.Message])
                | "FirstPerId" >> DeduplicatePerKey(event_time_duration=Duration(seconds=self.horizon_seconds))
                | "DropKey" >> beam.Values())
