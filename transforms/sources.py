"""Sources of raw wire messages."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import BytesCoder

from transforms.parse import RawMessage


class ReadReplayFiles(beam.PTransform):
    """Lines of ``.jsonl`` files matching a glob -> RawMessage (bounded).

    Lines are read as bytes, so that invalid UTF-8 reaches the dead-letter
    output with its bytes intact instead of failing the read. Blank lines are
    layout, not messages, and are skipped.
    """

    def __init__(self, file_pattern: str):
        super().__init__()
        self.file_pattern = file_pattern

    def expand(self, pbegin):
        return (pbegin
                | "ReadLines" >> beam.io.ReadFromTextWithFilename(self.file_pattern, coder=BytesCoder())
                | "SkipBlank" >> beam.Filter(lambda named_line: named_line[1].strip() != b"")
                | "ToRawMessage" >> beam.MapTuple(lambda filename, line: RawMessage(line, f"file:{filename}")))
