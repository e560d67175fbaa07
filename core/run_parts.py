"""A bounded replay's messages of one run, taken before its shuffle (``RunPart``), and which copy of a message
counts: pure Python, no Beam.

A replay takes each bundle's messages of a run into a ``RunPart`` before the shuffle to run assembly
(``transforms.run_parts.PreAssembleRunsFn``) and merges the run's parts after it (``AssembleRunPartsFn``). A message
id counts once per run, whatever the order and the bundles its copies came in:

- copies with the same bytes (a line shipped twice) are one message: one is taken, the others are nothing;
- of copies whose bytes differ, the one whose bytes sort first is taken and each other one (each distinct one
  once) is put aside (``RunPart.others``), to be a dead letter when the run ends (``copies_not_taken``,
  reason ``core.parse.DIFFERENT_COPY``, naming the copy taken).

A part that took a copy that turns out not to count is taken again without it (``RunPart.without``): its
other messages are read again from where they lie. So is the first ``MAX_EVENTS`` of a run's events kept
whatever its parts: the events it does not keep are found when it ends, by reading again those of its
messages that carry events (``RunPart.events_over_the_limit``), so that each is a dead letter once.
"""

from __future__ import annotations

import array
import sys
from typing import Any, Callable, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

from core.parse import FileSpan, MessageSummary, PayloadSource, content_digest, payload_of
from core.registry import record
from core.runs import RankedEvent, RunAccumulator, kept_events
from trainguard import wire

SummaryOf = Callable[[PayloadSource], MessageSummary]  # a message summarized again from where it lies
Failures = List[Tuple[PayloadSource, Exception]]  # messages that could not be read or taken again, and why


def _part_v1_to_v2(fields: Dict[str, Any]) -> Dict[str, Any]:
    """A version-1 part's ``messages`` ({id: (source, events kept or None)}) in version 2's packed columns."""
    part = RunPart(fields["accumulator"])
    for message_id, (source, kept) in fields.get("messages", {}).items():
        part.note_taken(message_id, source, kept)
    return part.to_state()


def _part_v2_to_v3(fields: Dict[str, Any]) -> Dict[str, Any]:
    """Version 2's fourth column said how many of a message's events the part kept (-1: all); version 3's says
    how many events the message carries, which version 2 did not keep: -1, not known (read it to know)."""
    stored = array.array("q")
    stored.frombytes(fields.get("columns", b""))
    columns = array.array("q", _little_endian(stored))  # in the host's order, a copy
    for index in range(3, len(columns), 4):
        columns[index] = -1
    return {**fields, "columns": _little_endian(columns).tobytes()}


def _little_endian(columns: array.array[int]) -> array.array[int]:
    """Int64 columns in the byte order ``RunPart`` stores them in (little-endian): the same array on a
    little-endian host, else a byte-swapped copy (which also turns stored bytes into the host's order)."""
    if sys.byteorder == "little":
        return columns
    swapped = array.array("q", columns)
    swapped.byteswap()
    return swapped


@record("RunPart", version=3, upgrades={1: _part_v1_to_v2, 2: _part_v2_to_v3})
class RunPart:
    """Messages of one run taken into an accumulator before the shuffle to run assembly (a bounded replay does
    it per bundle, so that one element per run and bundle crosses the shuffle instead of one per message).

    For each message taken, in the order taken: its id (``ids``), where to read it again and how many events
    it carries. Read again when another copy of the same id, with other bytes, sorts first (the part is then
    taken without it: ``without``), and, for messages with events, when the run ends at its events' limit.
    Where to read them is packed (``_columns``: file index, offset, length and event count, four int64 a
    message; the files named once in ``files``; a payload not in a replay file in ``payloads``): a batch runner
    holds every part at once, and a span, a path and a tuple per message were most of a part's bytes.
    ``others`` holds (id, where to read it) of the copies of taken ids not taken (their bytes differ).
    """

    def __init__(self, accumulator: RunAccumulator, ids: Optional[List[str]] = None,
                 files: Optional[List[str]] = None, columns: bytes = b"",
                 payloads: Optional[Dict[int, bytes]] = None,
                 others: Optional[List[Tuple[str, PayloadSource]]] = None):
        self.accumulator = accumulator
        self.ids: List[str] = ids if ids is not None else []
        self.files: List[str] = files if files is not None else []
        stored = array.array("q")
        stored.frombytes(columns)
        self._columns = _little_endian(stored)  # a swap both ways
        self.payloads: Dict[int, bytes] = payloads if payloads is not None else {}
        self.others: List[Tuple[str, PayloadSource]] = list(others) if others is not None else []
        self._positions: Optional[Dict[str, int]] = None  # each id's index, made when first asked

    def to_state(self) -> Dict[str, Any]:
        return {"accumulator": self.accumulator, "ids": self.ids, "files": self.files,
                "columns": _little_endian(self._columns).tobytes(), "payloads": self.payloads,
                "others": self.others}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> RunPart:
        return cls(state["accumulator"], state.get("ids", []), state.get("files", []), state.get("columns", b""),
                   state.get("payloads", {}), state.get("others", []))

    def __repr__(self) -> str:
        return f"RunPart({self.accumulator.test!r}, {self.accumulator.run!r}, {len(self.ids)} messages)"

    def _index(self) -> Dict[str, int]:
        if self._positions is None:
            self._positions = {message_id: index for index, message_id in enumerate(self.ids)}
        return self._positions

    def has(self, message_id: str) -> bool:
        """Whether the part took a message of this id."""
        return message_id in self._index()

    def take(self, summary: MessageSummary) -> List[RankedEvent]:
        """Adds a message not taken yet (``RunAccumulator.add``, all or nothing); returns the events the run no
        longer keeps."""
        over = self.accumulator.add(summary)
        self.note_taken(summary.id, summary.payload_source, len(summary.events))
        return over

    def note_taken(self, message_id: str, source: PayloadSource, events: Optional[int]) -> None:
        """Records a message as taken (its summary already in the accumulator): its id, where to read it again
        and how many events it carries (None: not known)."""
        index = len(self.ids)
        self.ids.append(message_id)
        if self._positions is not None:
            self._positions[message_id] = index
        count = -1 if events is None else events
        if isinstance(source, FileSpan):
            self._columns.extend((self._file_number(source.path), source.offset, source.length, count))
        else:
            self.payloads[index] = source
            self._columns.extend((-1, 0, 0, count))

    def _at(self, index: int) -> Tuple[PayloadSource, Optional[int]]:
        file, offset, length, count = self._columns[4 * index:4 * index + 4]
        source = self.payloads[index] if file < 0 else FileSpan(self.files[file], offset, length)
        return source, None if count < 0 else count

    def source_of(self, message_id: str) -> PayloadSource:
        """Where the message of this id the part took can be read again."""
        return self._at(self._index()[message_id])[0]

    def sources(self) -> Iterator[Tuple[str, PayloadSource, Optional[int]]]:
        """(id, where to read it again, how many events it carries or None: not known) of each message taken,
        in the order taken."""
        for index, message_id in enumerate(self.ids):
            yield (message_id, *self._at(index))

    def without(self, taken: Collection[str], summary_of: SummaryOf) -> Tuple[RunPart, Failures]:
        """The part as if it had not taken the messages whose ids are in ``taken``: its other messages, each
        summarized again from its source by ``summary_of``, plus (source, error) of those that cannot be taken
        again (e.g. a replay file changed since). The copies it put aside stay aside."""
        part = RunPart(RunAccumulator(self.accumulator.test, self.accumulator.run), others=list(self.others))
        failed: Failures = []
        for message_id, source, _ in self.sources():
            if message_id in taken:
                continue
            try:
                part.take(summary_of(source))
            except Exception as error:  # noqa: BLE001 - one message's failure is that message's
                failed.append((source, error))
        return part, failed

    def offer(self, summary: MessageSummary, summary_of: SummaryOf) -> Tuple[RunPart, Failures]:
        """The part with one more message: taken if its id is new; nothing if the part took the same bytes;
        else whichever copy's bytes sort first is taken (the part taken again without the other, when that
        is the one it took) and the other one put aside. A summary that cannot be taken raises, and the part is
        as it was."""
        index = self._index().get(summary.id)
        if index is None:
            self.take(summary)
            return self, []
        source = self._at(index)[0]
        taken, offered = payload_of(source), summary.raw_payload()
        if offered == taken:
            return self, []
        if taken < offered:
            self.others.append((summary.id, summary.payload_source))
            return self, []
        part, failed = self.without({summary.id}, summary_of)
        part.take(summary)
        part.others.append((summary.id, source))
        return part, failed

    def merged(self, other: RunPart, summary_of: SummaryOf) -> Tuple[RunPart, Failures]:
        """This part and another of the same run as one (``offer``'s rule for each id both took): this part
        taken again without the copies of it that do not count, if any, else this part itself, changed."""
        mine: List[str] = []
        theirs: List[str] = []
        others = self.others + other.others
        for message_id in other.ids:
            if not self.has(message_id):
                continue
            my_source, their_source = self.source_of(message_id), other.source_of(message_id)
            my_copy, their_copy = payload_of(my_source), payload_of(their_source)
            if my_copy <= their_copy:
                theirs.append(message_id)
                if my_copy != their_copy:
                    others.append((message_id, their_source))
            else:
                mine.append(message_id)
                others.append((message_id, my_source))
        failed: Failures = []
        if theirs:
            other, failed = other.without(theirs, summary_of)
        part = self
        if mine:
            part, failed_here = self.without(mine, summary_of)
            failed += failed_here
        part.absorb(other)
        part.others = others
        return part, failed

    def absorb(self, other: RunPart) -> None:
        """Takes another part's messages, none of whose ids this part took (``merged`` sees to that): the
        events the run no longer keeps are found when it ends (``events_over_the_limit``). Its columns are
        appended whole, file indexes renumbered where its files are numbered otherwise."""
        self.accumulator.absorb(other.accumulator)
        first = len(self.ids)
        files = [self._file_number(path) for path in other.files]
        columns = other._columns
        if files != list(range(len(files))):
            columns = array.array("q", columns)
            for index in range(0, len(columns), 4):
                if columns[index] >= 0:
                    columns[index] = files[columns[index]]
        self._columns.extend(columns)
        self.ids.extend(other.ids)
        if self._positions is not None:
            self._positions.update((message_id, first + index) for index, message_id in enumerate(other.ids))
        self.payloads.update((first + index, payload) for index, payload in other.payloads.items())

    def _file_number(self, path: str) -> int:
        """The index of a file in ``files``, added if new."""
        files = self.files
        if files and files[-1] == path:  # (a part's messages mostly come from one file)
            return len(files) - 1
        if path in files:
            return files.index(path)
        files.append(path)
        return len(files) - 1

    def events_over_the_limit(self, earlier: Sequence[RankedEvent] = ()) -> Tuple[List[RankedEvent], Failures]:
        """The events of the messages taken (and ``earlier`` ones: a resumed run's) that the run does not keep
        (``core.runs.kept_events``), each once, read again from where they lie, plus (source, error) of the
        messages that cannot be read again. Only a run at its limit (``RunAccumulator.at_event_limit``) has any."""
        events = list(earlier)
        failed: Failures = []
        for _, source, count in self.sources():
            if count == 0:
                continue
            try:
                message, _ = wire.parse_message(payload_of(source))
            except Exception as error:  # noqa: BLE001 - one message's failure is that message's
                failed.append((source, error))
                continue
            events += [RankedEvent(*event, message.rank) for event in message.events]
        return kept_events(events, RunAccumulator.MAX_EVENTS)[1], failed

    def copies_not_taken(self) -> List[Tuple[bytes, Optional[bytes]]]:
        """(payload, ``content_digest`` of the copy taken, or None if it cannot be read again) of each copy put
        aside, each distinct payload once, in the order of their bytes."""
        copies: Dict[bytes, Optional[bytes]] = {}
        for message_id, source in self.others:
            payload = payload_of(source)
            if payload not in copies:
                copies[payload] = content_digest(payload_of(self.source_of(message_id))) \
                    if self.has(message_id) else None
        return sorted(copies.items())
