"""Raw payloads and what the pipeline keeps of each message: pure Python, no Beam.

A payload (``RawMessage``) is validated against the wire contract
(``trainguard.wire``) into a ``ParsedMessage``, then reduced under its test's
config to a ``MessageSummary``: per-tag partial aggregates, so that points never
cross a shuffle.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Collection, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from core.aggregation import NO_STEP, TagAggregate
from core.config import Configs, TestConfig, ranks_matter
from core.registry import record, register
from trainguard import wire


@record("FileSpan")
class FileSpan(NamedTuple):
    """Where a payload lies in a local, uncompressed replay file, so that it can be read again when needed."""
    path: str     # real absolute path
    offset: int   # of the payload's first byte
    length: int   # bytes, line end excluded

    def read(self) -> bytes:
        """The payload's bytes; if the file cannot give them back any more, a line that says so."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                payload = f.read(self.length)
            if len(payload) == self.length:
                return payload
            problem = f"the file now ends at byte {self.offset + len(payload)}"
        except OSError as e:
            problem = f"{type(e).__name__}: {e}"
        return (f"(the payload at bytes {self.offset}..{self.offset + self.length} of {self.path} "
                f"could not be read again: {problem})").encode()


PayloadSource = Union[FileSpan, bytes]  # where a payload can be had: its replay-file span, or its bytes


def payload_of(source: PayloadSource) -> bytes:
    """The payload a source holds (a span is read again: ``FileSpan.read``)."""
    return source if isinstance(source, bytes) else source.read()


@record("RawMessage")
@dataclasses.dataclass(frozen=True)
class RawMessage:
    """One payload as it arrived: a Pub/Sub message's data or a line of a replay file."""
    payload: bytes
    source: str                  # e.g. "file:data/a.jsonl" or "pubsub:projects/p/subscriptions/s"
    received_at: Optional[float] = None  # publish time, where the source knows one
    span: Optional[FileSpan] = None  # where a replay file holds the payload (a local, uncompressed file)


class ParsedMessage(NamedTuple):
    message: wire.Message
    payload: bytes  # the raw bytes it came from
    span: Optional[FileSpan] = None  # where they can be read again


register(wire.Event, "WireEvent")  # a run's events, as messages carry them


@record("MessageSummary")
@dataclasses.dataclass
class MessageSummary:
    """One validated message reduced to what its run needs: per-tag partial aggregates.

    Summaries, not points, cross the pipeline's shuffles. So that a message
    arriving after its run was finalized can still be dead-lettered intact, the
    raw payload rides along, or, for a line of a replay file, where to read it
    again (``payload_span``, ``payload`` then empty): a replay's shuffles hold
    every summary at once, and the payloads were most of their memory.
    """
    id: str
    test: str
    run: str
    tags: Dict[str, TagAggregate]
    events: Tuple[wire.Event, ...]
    first_time: float
    last_time: float
    payload: bytes
    window_points: Tuple[wire.Point, ...] = ()  # points of tags with live windows configured
    rank: Optional[int] = None        # the worker that sent it; None: not said (counts as rank 0)
    world_size: Optional[int] = None
    payload_span: Optional[FileSpan] = None

    @property
    def payload_source(self) -> PayloadSource:
        """Where the payload the message came in can be had: its replay-file span, else the payload itself."""
        return self.payload if self.payload_span is None else self.payload_span

    def raw_payload(self) -> bytes:
        """The payload the message came in, read again from its replay file if it is not carried."""
        return payload_of(self.payload_source)


DIFFERENT_COPY = "duplicate id with different content"
"""The dead-letter reason (its beginning) of a copy of a message whose ``id`` another copy, with other bytes, has:
one copy counts, never a mix, and each other one is a dead letter (README, "Wire contract v1")."""


def content_digest(content: bytes) -> bytes:
    """The SHA-256 of a copy's bytes: what names the copy taken, and what the streaming job keeps of it."""
    return hashlib.sha256(content).digest()


def different_copy_reason(taken: Optional[bytes]) -> str:
    """The dead-letter reason of a copy not taken, naming the copy taken by its ``content_digest`` (the start of
    its SHA-256 in hex, as ``sha256sum`` prints it); None: the copy taken cannot be named (it could not be read
    again)."""
    if taken is None:
        return f"{DIFFERENT_COPY} (the copy taken could not be read again)"
    return f"{DIFFERENT_COPY}: the copy taken has SHA-256 {taken.hex()[:16]}"


def summarize(message: wire.Message, payload: bytes, config: TestConfig,
              span: Optional[FileSpan] = None) -> MessageSummary:
    collection = config.metric_collection
    by_tag = columns_by_tag(message.points, collection.tags_to_ignore)
    tags = {}
    tta = collection.time_to_accuracy
    for tag, (values, times, steps) in by_tag.items():
        aggregate = tags[tag] = TagAggregate.of_batch(values, times, steps)
        if tta is not None and tag == tta.accuracy_tag:
            reached = [(t, s) for v, t, s in zip(values, times, steps) if v >= tta.accuracy_threshold]
            if reached:
                aggregate.first_reach = min(reached)
    times = [e.time for e in message.events]
    point_times = wire.time_range(message.points)
    if point_times is not None:
        times += point_times
    windowed = config.windows.tags
    # Live windows follow rank 0 (a message without a rank counts as rank 0's), but for the tags whose
    # windows need every rank (a reduction across ranks, or a straggler check): see README "Distributed jobs".
    window_points = tuple(p for p in points_of_tags(message.points, windowed)
                          if not message.rank or ranks_matter(config, p[0])) if windowed else ()
    return MessageSummary(message.id, message.test, message.run, tags, message.events,
                          min(times), max(times), b"" if span is not None else payload, window_points,
                          message.rank, message.world_size, span)


def summarize_again(source: PayloadSource, configs: Configs) -> MessageSummary:
    """The summary of a message summarized before, from where it can be read again (its replay-file span, or its
    payload): the same as the first time, since validation and the test's config depend on the payload and its
    event time only. Raises ``wire.InvalidMessage`` if the source no longer holds a valid message."""
    span = source if isinstance(source, FileSpan) else None
    payload = payload_of(source)
    message, _ = wire.parse_message(payload)
    return summarize(message, payload, configs.for_test(message.test, message.event_time), span)


def columns_by_tag(points: Sequence[wire.Point],
                   ignored: Collection[str]) -> Dict[str, Tuple[List[float], List[float], List[int]]]:
    """(values, times, steps) of each tag not ignored, in the order tags first appear; a point without a step
    has NO_STEP. A v1.1 column (``wire.PointColumn``) is taken whole: a tag of one column gets that column's own
    lists, not copies (read them, do not change them); single points in one loop (column-wise selections per tag
    measured three times slower)."""
    by_tag: Dict[str, Tuple[List[float], List[float], List[int]]] = {}
    borrowed: Set[str] = set()  # tags whose lists are still their one column's own, not to be extended

    def writable(tag: str) -> Tuple[List[float], List[float], List[int]]:
        columns = by_tag[tag]
        if tag in borrowed:
            borrowed.discard(tag)
            columns = by_tag[tag] = (list(columns[0]), list(columns[1]), list(columns[2]))
        return columns

    for part in wire.point_parts(points):
        if isinstance(part, wire.PointColumn):
            if part.tag not in by_tag:
                if part.tag in ignored:
                    continue
                by_tag[part.tag] = (part.values, part.times,
                                    [NO_STEP] * len(part.values) if part.steps is None else part.steps)
                borrowed.add(part.tag)
                continue
            columns = writable(part.tag)
            columns[0].extend(part.values)
            columns[1].extend(part.times)
            columns[2].extend([NO_STEP] * len(part.values) if part.steps is None else part.steps)
            continue
        for tag in list(borrowed):  # (points after a column: those of a column with a bad point, maybe its tag)
            writable(tag)
        for tag, value, step, time in part:
            lists = by_tag.get(tag)
            if lists is None:
                if tag in ignored:
                    continue
                by_tag[tag] = lists = ([], [], [])
            lists[0].append(value)
            lists[1].append(time)
            lists[2].append(NO_STEP if step is None else step)
    return by_tag


def points_of_tags(points: Sequence[wire.Point], tags: Collection[str]) -> Iterator[wire.Point]:
    """The points of ``tags``, in order (of a ``wire.MessagePoints``, only its columns of those tags are made
    into points)."""
    for part in wire.point_parts(points):
        if isinstance(part, wire.PointColumn):
            if part.tag in tags:
                yield from part.points()
        else:
            yield from (point for point in part if point[0] in tags)
