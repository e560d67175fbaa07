"""Sources of raw wire messages."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp.pubsub import PubsubMessage, ReadFromPubSub

from core.parse import FileSpan, RawMessage
from trainguard import wire
from transforms import progress


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


class ReadLinesFn(beam.DoFn):
    r"""A file name -> RawMessage per line; with a progress id, counts the file.

    Lines are read as bytes, so that invalid UTF-8 reaches the dead-letter
    output with its bytes intact; ``\n`` and ``\r\n`` end a line, as for
    Beam's text source; blank lines are layout, not messages, and are skipped.
    A line of a local, uncompressed file also says where it lies (``span``),
    so that the summaries crossing the shuffles need not carry it.
    """

    def __init__(self, progress_id: Optional[str] = None):
        self.progress_id = progress_id

    def start_bundle(self):
        self._progress = progress.counter_for(self.progress_id)

    def process(self, filename: str):
        source = file_source(filename)
        local = (FileSystems.get_scheme(filename) in (None, "file")
                 and CompressionTypes.detect_compression_type(filename) == CompressionTypes.UNCOMPRESSED)
        path = os.path.realpath(filename) if local else None
        if self._progress is not None:
            self._progress.read_file(filename)
        with FileSystems.open(filename, mime_type="application/octet-stream") as lines:
            offset = 0
            for line in iter(lines.readline, b""):
                start, offset = offset, offset + len(line)
                if line.endswith(b"\n"):
                    line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
                if line and not line.isspace():
                    yield RawMessage(line, source, None, FileSpan(path, start, len(line)) if path else None)


class ReadReplayFiles(beam.PTransform):
    """Lines of ``.jsonl`` files matching a glob (or several) -> RawMessage (bounded).

    See :class:`ReadLinesFn` for what a line is. ``progress_id`` names a
    counter of ``transforms.progress`` that the files read are counted into
    (a file counts once it is opened).
    """

    def __init__(self, file_pattern: Union[str, Sequence[str]], progress_id: Optional[str] = None):
        super().__init__()
        self.file_patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
        self.progress_id = progress_id

    def expand(self, pbegin):
        return (pbegin
                | "Patterns" >> beam.Create(self.file_patterns)
                | "Files" >> beam.FlatMap(matching_files)
                | "ReadLines" >> beam.ParDo(ReadLinesFn(self.progress_id)))


def matching_files(pattern: str) -> List[str]:
    """The files a glob matches, in name order."""
    return sorted(metadata.path for result in FileSystems.match([pattern]) for metadata in result.metadata_list)


def file_source(filename: str) -> str:
    """The source of a replay file's lines: its real absolute path, whatever glob or spelling named it, so that a
    dead letter's key (source, reason, payload) is the same every time the same file is replayed."""
    return f"file:{os.path.realpath(filename)}"
