"""Sources of raw wire messages."""

from __future__ import annotations

import array
import dataclasses
import os
import re
import zlib
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union, cast

import apache_beam as beam
import msgspec
import numpy as np
from apache_beam import PCollection
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp.pubsub import PubsubMessage, ReadFromPubSub
from apache_beam.pvalue import PBegin

from core.parse import FileSpan, RawMessage
from trainguard import wire
from transforms import progress


def raw_from_pubsub(message: PubsubMessage, source: str) -> RawMessage:
    """A Pub/Sub message -> RawMessage: its data untouched, received_at = its publish time where known."""
    publish_time = getattr(message, "publish_time", None)
    received_at = publish_time.timestamp() if publish_time else None
    return RawMessage(message.data, source, received_at)


class ReadPubSubMessages(beam.PTransform[PBegin, PCollection[RawMessage]]):
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


READ_BUFFER_BYTES = 1 << 20


class ReadLinesFn(beam.DoFn):
    r"""A file name -> RawMessage per line; with a progress id, counts the file.

    Lines are read as bytes, so that invalid UTF-8 reaches the dead-letter
    output with its bytes intact; ``\n`` and ``\r\n`` end a line, as for
    Beam's text source; blank lines are layout, not messages, and are skipped.
    A line of a local, uncompressed file also says where it lies (``span``),
    so that the summaries crossing the shuffles need not carry it.
    """

    def __init__(self, progress_id: Optional[str] = None, group: Optional[LineGroup] = None):
        self.progress_id = progress_id
        self.group = group

    def start_bundle(self):
        self._progress = progress.counter_for(self.progress_id)

    def process(self, filename: str):
        source = file_source(filename)
        path = os.path.realpath(filename) if is_local_text(filename) else None
        ranges = None if self.group is None else self.group.ranges.get(path or "", ())
        if ranges == ():  # none of its lines is this group's
            return ()
        if self._progress is not None:
            self._progress.read_file(filename)
        return self._messages(filename, source, path, ranges)

    @staticmethod
    def _messages(filename: str, source: str, path: Optional[str],
                  ranges: Optional[Sequence[int]]) -> Iterator[RawMessage]:
        # A local file is read through a buffer of READ_BUFFER_BYTES: through Beam's (8 KiB), a line of a few KiB
        # took several reads and copies (0.6 s against 0.2 s for 736 MB of 7 KiB lines).
        with (open(path, "rb", buffering=READ_BUFFER_BYTES) if path is not None
              else FileSystems.open(filename, mime_type="application/octet-stream")) as lines:
            for start, line in (file_lines(lines) if ranges is None else lines_in_ranges(lines, ranges)):
                yield RawMessage(line, source, None, FileSpan(path, start, len(line)) if path else None)


def is_local_text(filename: str) -> bool:
    """Whether a file is local and uncompressed: its lines can be found again by offset."""
    return (FileSystems.get_scheme(filename) in (None, "file")
            and CompressionTypes.detect_compression_type(filename) == CompressionTypes.UNCOMPRESSED)


def file_lines(lines: IO[bytes], base: int = 0) -> Iterator[Tuple[int, bytes]]:
    r"""(offset, line) of each message line of a binary file object: ``\n`` or ``\r\n`` ends a line, blank
    lines are skipped; ``base`` is the object's first byte's offset in its file."""
    offset = base
    for line in iter(lines.readline, b""):
        start, offset = offset, offset + len(line)
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if line and not line.isspace():
            yield start, line


class _Bounded:
    """A binary file object's next ``size`` bytes, as ``readline`` gives them."""

    def __init__(self, lines: IO[bytes], size: int):
        self.lines, self.left = lines, size

    def readline(self) -> bytes:
        if self.left <= 0:
            return b""
        line = self.lines.readline(self.left)
        self.left -= len(line)
        return line


def lines_in_ranges(lines: IO[bytes], ranges: Sequence[int]) -> Iterator[Tuple[int, bytes]]:
    """``file_lines`` of the byte ranges ``ranges`` (start, end, start, end, ...) of a seekable file, each read
    line by line (a range may be a whole file)."""
    for i in range(0, len(ranges), 2):
        lines.seek(ranges[i])
        yield from file_lines(cast(IO[bytes], _Bounded(lines, ranges[i + 1] - ranges[i])), ranges[i])


Spans = Mapping[str, Tuple[int, int]]
"""By a file's real path, the bytes ``[start, end)`` of it a replay reads (``sinks.replayed_files``); a file
that is not there is read whole."""


class _TestOnly(msgspec.Struct):
    test: Any = None


_TEST_ONLY = msgspec.json.Decoder(_TestOnly)


def line_test_name(line: bytes) -> Optional[str]:
    """The ``test`` of a message line as the wire parser reads it (a duplicate key: the last), None where it
    has none (not JSON, not an object, no string ``test``: the parser dead-letters such a line whole)."""
    try:
        test = _TEST_ONLY.decode(line).test
    except msgspec.DecodeError:  # not strict JSON: decoded as the wire's parser decodes it (NaN literals...)
        try:
            obj = wire.decode_json(line)
        except wire.InvalidMessage:
            return None
        test = obj.get("test") if isinstance(obj, dict) else None
    return test if isinstance(test, str) else None


class _RunOnly(msgspec.Struct):
    test: Any = None
    run: Any = None


_RUN_ONLY = msgspec.json.Decoder(_RunOnly)
# How trainguard's encoders begin a message (wire.encode_message): its test and run read without decoding the
# line, whose points may be 1 MiB of it. A line that begins otherwise (escapes, another key order) is decoded.
_NAMES_FIRST = re.compile(rb'\{"schema":"[^"\\]*","id":"[^"\\]*(?:\\.[^"\\]*)*","test":"([^"\\]*)","run":"([^"\\]*)"')


def count_lines(filenames: Sequence[str], spans: Optional[Spans] = None) -> int:
    """At least as many as the lines of local files (of their spans, where ``spans`` names them): their line
    feeds, and one for each file's last line."""
    lines = 0
    for filename in filenames:
        with open(filename, "rb") as f:
            start, end = (spans or {}).get(os.path.realpath(filename), (0, os.fstat(f.fileno()).st_size))
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(1 << 20, left))
                if not chunk:
                    break
                lines += chunk.count(b"\n")
                left -= len(chunk)
        lines += 1
    return lines


def _decoded_names(line: bytes) -> Tuple[Optional[str], Any]:
    """(test, run) of a message line that does not begin as trainguard's encoders begin one: the test as the wire
    parser reads it (``line_test_name``), the run as strict JSON gives it (None where it has none)."""
    try:
        names = _RUN_ONLY.decode(line)
    except msgspec.DecodeError:
        return line_test_name(line), None
    return (names.test if isinstance(names.test, str) else None), names.run


@dataclasses.dataclass
class _SurveyedFile:
    """The message lines of one file that a ``LineSurvey`` saw: where each begins and ends (its line feed not
    included), and the CRC-32 of its test (-1: none), in file order."""
    starts: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    ends: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    test_crcs: array.array = dataclasses.field(default_factory=lambda: array.array("q"))

    def as_numpy(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, test CRCs) as int64 arrays over the same memory."""
        return (np.frombuffer(self.starts, dtype=np.int64), np.frombuffer(self.ends, dtype=np.int64),
                np.frombuffer(self.test_crcs, dtype=np.int64))


@dataclasses.dataclass
class LineSurvey:
    """What one pass over a replay's local text files finds, for all that a replay plans before it runs a graph:
    how many message lines and runs they hold (to size its groups), the tests they name (to read the seed of
    those only; None past the survey's limit) and where each line lies with its test (to group them)."""
    lines: int
    runs: int
    files: Dict[str, _SurveyedFile]
    crcs: Dict[Optional[str], int]  # each test met (None: lines without one): ``crc_of_test``
    test_limit: Optional[int] = None
    exact: bool = True  # each line's test as the wire parser reads it (``line_names``): a survey that may group

    @property
    def tests(self) -> Optional[Set[str]]:
        """The tests the lines name; None past ``test_limit``."""
        named = len(self.crcs) - (None in self.crcs)
        if self.test_limit is not None and named > self.test_limit:
            return None
        return {test for test in self.crcs if test is not None}

    def bytes_of_tests(self, which: Callable[[Optional[str]], bool]) -> int:
        """The bytes of the lines whose test ``which`` holds (a line without a test: ``which(None)``); those of
        another test whose CRC-32 is the same count too."""
        chosen = np.array(sorted({crc for test, crc in self.crcs.items() if which(test)}), dtype=np.int64)
        total = 0
        for surveyed in self.files.values():
            if not surveyed.starts:
                continue
            starts, ends, crcs = surveyed.as_numpy()
            mine = np.isin(crcs, chosen)
            total += int((ends[mine] - starts[mine]).sum())
        return total

    def groups(self, count: int) -> List[LineGroup]:
        """The lines in ``count`` groups by test (``group_of_test``, on whole arrays): per file, a range (start, end)
        per block of consecutive lines of one group. Groups that get no line are left out."""
        if not self.exact:
            raise ValueError("a survey that only sized the lines cannot place them (survey_lines(exact=True))")
        ranges: List[Dict[str, array.array]] = [{} for _ in range(count)]
        for path, surveyed in self.files.items():
            if not surveyed.starts:
                continue
            starts, ends, crcs = surveyed.as_numpy()
            group = np.where(crcs < 0, 0, crcs % count)
            first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])  # each block's first line
            last = np.r_[first[1:] - 1, len(group) - 1]
            for index in np.unique(group[first]).tolist():
                mine = group[first] == index
                joined = np.column_stack((starts[first[mine]], ends[last[mine]])).ravel()
                ranges[index][path] = array.array("q", joined.tobytes())
        return [LineGroup(index, count, by_file) for index, by_file in enumerate(ranges) if by_file]


_SECOND_TEST_KEY = b'"test":'


def line_names(line: bytes, exact: bool = True) -> Tuple[Optional[str], Any]:
    """(test, run) of a message line: the test as the wire parser reads it (``line_test_name``) of every line it
    takes, read from the line's beginning where trainguard's encoders wrote it and no other ``"test":`` follows (a
    doubled key: the parser takes the last), else by decoding the line; the run as bytes or as decoded (a line
    without a string run names no run). Not ``exact``: the names at the line's beginning whatever follows, which
    only a line with a doubled key gets wrong (the search for it is half of a survey's time)."""
    first = _NAMES_FIRST.match(line)
    if first is not None and (not exact or line.find(_SECOND_TEST_KEY, first.end()) < 0):
        test_bytes, run = first.groups()
        try:
            return test_bytes.decode(), run
        except UnicodeDecodeError:
            pass
    return _decoded_names(line)


def survey_lines(filenames: Sequence[str], spans: Optional[Spans] = None,
                 test_limit: Optional[int] = None, exact: bool = True) -> LineSurvey:
    """One pass over local text files (their spans, where ``spans`` names them), read as a replay reads them
    (``lines_in_ranges``), each line's test and run taken by ``line_names``: a line the wire parser takes is put with
    the test it parses; one it refuses whole is a dead letter of whichever group reads it. The runs counted size
    groups and decide nothing about a line. ``tests`` is None once there are more than ``test_limit``. Not
    ``exact`` (``line_names``): a survey that only sizes, whose tests neither place lines nor scope a seed."""
    lines, runs = 0, set()
    crcs: Dict[Optional[str], int] = {}
    files: Dict[str, _SurveyedFile] = {}
    for filename in filenames:
        path = os.path.realpath(filename)
        surveyed = files[path] = _SurveyedFile()
        with open(path, "rb", buffering=READ_BUFFER_BYTES) as f:
            span = (spans or {}).get(path, (0, os.fstat(f.fileno()).st_size))
            for offset, line in lines_in_ranges(f, span):
                test, run = line_names(line, exact)
                lines += 1
                if isinstance(run, (str, bytes)):
                    runs.add((test, run.encode() if isinstance(run, str) else run))
                crc = crcs.get(test)
                if crc is None:
                    crc = crcs[test] = crc_of_test(test)
                surveyed.starts.append(offset)
                surveyed.ends.append(offset + len(line))
                surveyed.test_crcs.append(crc)
    return LineSurvey(lines, len(runs), files, crcs, test_limit, exact)


def crc_of_test(test: Optional[str]) -> int:
    """The CRC-32 that places a test's messages in a replay group (``group_of_test``); -1 for no test."""
    return -1 if test is None else zlib.crc32(test.encode("utf-8", "surrogatepass"))


def group_of_test(test: Optional[str], groups: int) -> int:
    """Which of ``groups`` replay groups a test's messages go to (a line without a test: the first)."""
    crc = crc_of_test(test)
    return 0 if crc < 0 else crc % groups


@dataclasses.dataclass(frozen=True)
class LineGroup:
    """The lines of one replay group: per file (by real path), the byte ranges they lie in (start, end, ...),
    and which group of how many it is."""
    index: int
    count: int
    ranges: Mapping[str, Sequence[int]]

    def holds(self, test: Optional[str]) -> bool:
        return group_of_test(test, self.count) == self.index


class ReadReplayFiles(beam.PTransform[PBegin, PCollection[RawMessage]]):
    """Lines of ``.jsonl`` files matching a glob (or several) -> RawMessage (bounded).

    See :class:`ReadLinesFn` for what a line is. ``progress_id`` names a
    counter of ``transforms.progress`` that the files read are counted into
    (a file counts once it is opened). With ``group`` (a ``LineGroup``), only
    that group's lines are read.
    """

    def __init__(self, file_pattern: Union[str, Sequence[str]], progress_id: Optional[str] = None,
                 group: Optional[LineGroup] = None):
        super().__init__()
        self.file_patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
        self.progress_id = progress_id
        self.group = group

    def expand(self, pbegin):
        return (pbegin
                | "Patterns" >> beam.Create(self.file_patterns)
                | "Files" >> beam.FlatMap(matching_files)
                | "ReadLines" >> beam.ParDo(ReadLinesFn(self.progress_id, self.group)))


def matching_files(pattern: str) -> List[str]:
    """The files a glob matches, in name order."""
    return sorted(metadata.path for result in FileSystems.match([pattern]) for metadata in result.metadata_list)


def file_source(filename: str) -> str:
    """The source of a replay file's lines: its real absolute path, whatever glob or spelling named it, so that a
    dead letter's key (source, reason, payload) is the same every time the same file is replayed."""
    return f"file:{os.path.realpath(filename)}"
