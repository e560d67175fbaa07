"""Sources of raw wire messages."""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Union

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.io.gcp.pubsub import PubsubMessage, ReadFromPubSub

from trainguard import wire
from transforms import progress
from transforms.parse import RawMessage


def raw_from_pubsub(message: PubsubMessage, source: str) -> RawMessage:
    """A Pub/Sub message -> RawMessage: its data untouched, received_at = its publish time where known."""
    publish_time = getattr(message, "publish_time", None)
    received_at = publish_time.timestamp() if publish_time else None
    return RawMessage(message.data, source, received_at)


class ReadPubSubMessages(beam.PTransform):
    """A Pub/Sub subscription (or topic) -> RawMessage (unbounded; needs ``--streaming``).

    Element timestamps, and on Dataflow the watermark, come from the ``ts``
    attribute publishers set (the message's event time, milliseconds since
    the epoch); without one, from the publish time. ``id_attribute`` names an
    attribute Dataflow deduplicates on (``id_label``); the graph's own
    de-duplication by message id stays the guarantee, and the local runner
    does not support ``id_label`` at all. ``source`` in dead letters is
    ``pubsub:<subscription or topic>``.
    """

    def __init__(self, subscription: Optional[str] = None, topic: Optional[str] = None,
                 id_attribute: Optional[str] = None):
        super().__init__()
        if (subscription is None) == (topic is None):
            raise ValueError("exactly one of subscription and topic is needed")
        self.subscription = subscription
        self.topic = topic
        self.id_attribute = id_attribute

    def expand(self, pbegin):
        source = f"pubsub:{self.subscription or self.topic}"
        return (pbegin
                | "Read" >> ReadFromPubSub(topic=self.topic, subscription=self.subscription,
                                           id_label=self.id_attribute, with_attributes=True,
                                           timestamp_attribute=wire.ATTR_TS)
                | "ToRawMessage" >> beam.Map(raw_from_pubsub, source))


class LinesToRawMessages(beam.DoFn):
    """(filename, line) -> RawMessage, blank lines skipped; with a progress id, counts each file it reads.

    A file's source (its real path) is worked out, and the file counted, once per file and bundle, not per line.
    """

    def __init__(self, progress_id: Optional[str] = None):
        self.progress_id = progress_id

    def start_bundle(self):
        self._sources: Dict[str, str] = {}
        self._progress = progress.counter_for(self.progress_id)

    def process(self, named_line):
        filename, line = named_line
        source = self._sources.get(filename)
        if source is None:
            source = self._sources[filename] = file_source(filename)
            if self._progress is not None:
                self._progress.read_file(filename)
        if line.strip() != b"":
            yield RawMessage(line, source)


class ReadReplayFiles(beam.PTransform):
    """Lines of ``.jsonl`` files matching a glob (or several) -> RawMessage (bounded).

    Lines are read as bytes, so that invalid UTF-8 reaches the dead-letter
    output with its bytes intact instead of failing the read. Blank lines are
    layout, not messages, and are skipped. ``progress_id`` names a counter of
    ``transforms.progress`` that the files read are counted into (a file counts
    once its first line is read).
    """

    def __init__(self, file_pattern: Union[str, Sequence[str]], progress_id: Optional[str] = None):
        super().__init__()
        self.file_patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
        self.progress_id = progress_id

    def expand(self, pbegin):
        reads = [pbegin | f"ReadLines{i or ''}" >> beam.io.ReadFromTextWithFilename(pattern, coder=BytesCoder())
                 for i, pattern in enumerate(self.file_patterns)]
        lines = reads[0] if len(reads) == 1 else reads | "AllLines" >> beam.Flatten()
        return lines | "ToRawMessage" >> beam.ParDo(LinesToRawMessages(self.progress_id))


def file_source(filename: str) -> str:
    """The source of a replay file's lines: its real absolute path, whatever glob or spelling named it, so that a
    dead letter's key (source, reason, payload) is the same every time the same file is replayed."""
    return f"file:{os.path.realpath(filename)}"
