"""How live windows keep their state: a run's points and windows as compact columns (``transforms.columns``).

``transforms.windows.WindowRunFn`` keeps, per run, a value (``RunWindows``, written packed as
``PackedRunWindows``: its tags' windows as a ``TagTable``), a small ``RunIntake`` that messages in order write
instead of the value, a bag of points waiting for the watermark (``PointColumns``) and two bags of closed windows
(``ClosedWindows``). Dataflow bills these bytes and reads them at every firing: on the bench's windowed test
(``bench/bench_state_bytes.py``) the stage went from 80.8 KiB a 1,000-point message to under 16. Every record here
is a file format (``core.registry``): registered names, never renamed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

from core.registry import record
from core.stalls import StallWatch
from core.windows import TagWindows, Window, WindowPoint, WindowSpec
from transforms.columns import (
    float64_column,
    pack_floats,
    pack_grouped_floats,
    pack_grouped_ints,
    pack_ints,
    split,
    unpack_floats,
    unpack_grouped_floats,
    unpack_grouped_ints,
    unpack_ints,
    zigzag_varints,
)


def _columns_v1_to_v2(fields: Dict[str, Any]) -> Dict[str, Any]:
    """Version 1 kept each tag's columns apart: times and values as float64 bytes, steps as zigzag varints of
    their differences."""
    points = []
    for times, steps, values in zip(fields["times"], fields["steps"], fields["values"]):
        n = len(times) // 8
        points.append(list(map(WindowPoint, struct.unpack(f"<{n}d", times),
                               itertools.accumulate(zigzag_varints(steps)), struct.unpack(f"<{n}d", values))))
    return {"tags": fields["tags"], "points": PointGroups.of(points)}


@record("PointGroups")
@dataclasses.dataclass
class PointGroups:
    """Groups of points (a tag's, a window's) as columns over all of them, group after group
    (``transforms.columns``: times and steps by their second differences within each group, values as decimals
    where they are, every bit kept)."""
    counts: bytes
    times: bytes
    steps: bytes
    values: bytes

    @classmethod
    def of(cls, groups: Sequence[Sequence[WindowPoint]], compact: bool = True) -> PointGroups:
        """``compact``: as small as the columns go; else quick to write and read (float64 bytes, steps at one
        width), for state read once."""
        sizes = [len(group) for group in groups]
        points = [point for group in groups for point in group]
        times, steps, values = zip(*points) if points else ((), (), ())
        if not compact:
            return cls(pack_ints(sizes), float64_column(times), pack_grouped_ints(steps, sizes, order=0),
                       float64_column(values))
        return cls(pack_ints(sizes), pack_grouped_floats(times, sizes, order=2),
                   pack_grouped_ints(steps, sizes, order=2), pack_grouped_floats(values, sizes, order=1))

    def groups(self) -> List[List[WindowPoint]]:
        sizes = unpack_ints(self.counts)
        points = list(map(WindowPoint, unpack_grouped_floats(self.times, sizes), unpack_grouped_ints(self.steps, sizes),
                          unpack_grouped_floats(self.values, sizes)))
        return [list(group) for group in split(points, sizes)]


@record("PointColumns", version=2, upgrades={1: _columns_v1_to_v2})
@dataclasses.dataclass
class PointColumns:
    """Points of several tags, as ``PointGroups`` of one group a tag. A point as a (tag, ``WindowPoint``) record
    is ~37 bytes encoded (its tag's name, a mark and three msgpack numbers); as float64 columns (version 1) ~17;
    on the bench's windowed test (six significant digits, a step a second) ~2.5. ``transforms.windows`` keeps
    the points waiting for the watermark (a message's 1,000 a batch) this way."""
    tags: List[str]
    points: PointGroups

    @classmethod
    def of(cls, items: Sequence[Tuple[str, WindowPoint]], compact: bool = True) -> PointColumns:
        by_tag: Dict[str, List[WindowPoint]] = {}
        for tag, point in items:
            by_tag.setdefault(tag, []).append(point)
        return cls(list(by_tag), PointGroups.of(list(by_tag.values()), compact))

    def items(self) -> List[Tuple[str, WindowPoint]]:
        """The (tag, point) items, by tag in the order they came."""
        return [(tag, point) for tag, points in zip(self.tags, self.points.groups()) for point in points]


@record("ClosedWindows")
@dataclasses.dataclass
class ClosedWindows:
    """Emitted windows, each with a seq of its keeper's, as columns (``transforms.columns``): how
    ``transforms.windows`` keeps a batch of closed windows for late points. A window as its own record with its
    points in columns took ~80 bytes besides them; here its index, seq, revision and bounds take a few."""
    tags: List[str]      # the batch's tags, each once
    kinds: List[str]     # their windows' kind
    tag_of: bytes        # per window: its tag's place in ``tags``
    seqs: bytes
    indexes: bytes
    revisions: bytes
    partial: bytes
    start_times: bytes
    end_times: bytes
    points: PointGroups  # a group a window

    @classmethod
    def of(cls, entries: Sequence[Tuple[int, str, Window]]) -> ClosedWindows:
        tags: Dict[str, int] = {}
        kinds: List[str] = []
        for _, tag, window in entries:
            if tag not in tags:
                tags[tag] = len(tags)
                kinds.append(window.kind)
        windows = [window for _, _, window in entries]
        return cls(list(tags), kinds, pack_ints([tags[tag] for _, tag, _ in entries], order=0),
                   pack_ints([seq for seq, _, _ in entries], order=2),
                   pack_ints([w.index for w in windows], order=2), pack_ints([w.revision for w in windows], order=0),
                   pack_ints([int(w.partial) for w in windows], order=0),
                   pack_floats([w.start_time for w in windows], order=2),
                   pack_floats([w.end_time for w in windows], order=2),
                   PointGroups.of([w.points for w in windows]))

    def entries(self) -> List[Tuple[int, str, Window]]:
        """The (seq, tag, window) entries, windows with their points."""
        points = self.points.groups()
        return [(seq, self.tags[tag], Window(self.kinds[tag], index, list(group), start, end, revision, bool(partial)))
                for seq, tag, index, revision, partial, start, end, group in zip(
                    unpack_ints(self.seqs), unpack_ints(self.tag_of), unpack_ints(self.indexes),
                    unpack_ints(self.revisions), unpack_ints(self.partial), unpack_floats(self.start_times),
                    unpack_floats(self.end_times), points)]


@record("TagTable")
@dataclasses.dataclass
class TagTable:
    """A run's ``TagWindows`` of every tag as columns across the tags (``transforms.columns``): what a run's live
    windows keep in state, read and written at every firing. As ``TagWindows`` records a tag of the bench's
    windowed test took ~300 bytes (its spec, its open window's points and its kept windows' ends and last
    points, each a msgpack number); as columns across 20 tags, ~50. Every field of every tag comes back as it
    was, dicts in their order."""
    tags: List[str]
    specs: List[WindowSpec]       # each distinct spec once
    spec_of: bytes                # per tag: its spec's place in ``specs``
    open_index: bytes             # per tag
    pending: PointGroups          # a group a tag
    open: PointGroups             # a group a tag
    timed_keys: bytes             # time windows not yet ended: (tag's place, index), flat
    timed: PointGroups            # their points, a group a window
    kept_counts: bytes            # per tag, how many windows it keeps
    kept_indexes: bytes
    kept_ends: bytes
    # each kept window's last point: its time where it is not the window's end (1 in ``kept_at_end``: it is)
    kept_at_end: bytes
    kept_times: bytes
    kept_steps: bytes
    kept_values: bytes
    emitted: Dict[str, Dict[int, Window]] = dataclasses.field(default_factory=dict)  # the tags' with any

    @classmethod
    def of(cls, tags: Dict[str, TagWindows]) -> TagTable:
        windows = list(tags.values())
        specs: Dict[WindowSpec, int] = {}
        for w in windows:
            specs.setdefault(w.spec, len(specs))
        timed = [(place, index, points) for place, w in enumerate(windows) for index, points in w.open_by_index.items()]
        kept = [list(w.kept.items()) for w in windows]
        ends = [(end, last) for k in kept for _, (end, last) in k]
        at_end = [int(_same_float(last.time, end)) for end, last in ends]
        return cls(list(tags), list(specs), pack_ints([specs[w.spec] for w in windows], order=0),
                   pack_ints([w.open_index for w in windows]), PointGroups.of([w.pending for w in windows]),
                   PointGroups.of([w.open for w in windows]),
                   pack_ints([n for place, index, _ in timed for n in (place, index)]),
                   PointGroups.of([points for _, _, points in timed]),
                   pack_ints([len(k) for k in kept], order=0),
                   pack_ints([index for k in kept for index, _ in k], order=2),
                   pack_floats([end for k in kept for _, (end, _) in k], order=2),
                   pack_ints(at_end, order=1),
                   pack_floats([last.time for (_, last), same in zip(ends, at_end) if not same], order=2),
                   pack_ints([last.step for _, last in ends], order=2),
                   pack_floats([last.value for _, last in ends]),
                   {tag: dict(w.emitted) for tag, w in tags.items() if w.emitted})

    def windows(self) -> Dict[str, TagWindows]:
        """The tags' ``TagWindows``, as ``of`` took them."""
        specs = [self.specs[i] for i in unpack_ints(self.spec_of)]
        out = {tag: TagWindows(spec) for tag, spec in zip(self.tags, specs)}
        windows = list(out.values())
        for w, open_index, pending, open_ in zip(windows, unpack_ints(self.open_index), self.pending.groups(),
                                                 self.open.groups()):
            w.open_index, w.pending, w.open = open_index, pending, open_
        keys = unpack_ints(self.timed_keys)
        for place, index, points in zip(keys[::2], keys[1::2], self.timed.groups()):
            windows[place].open_by_index[index] = points
        ends = unpack_floats(self.kept_ends)
        times = iter(unpack_floats(self.kept_times))
        lasts = iter(map(WindowPoint, [end if same else next(times) for end, same in zip(
            ends, unpack_ints(self.kept_at_end))], unpack_ints(self.kept_steps), unpack_floats(self.kept_values)))
        indexes, ends_in_order = iter(unpack_ints(self.kept_indexes)), iter(ends)
        for w, count in zip(windows, unpack_ints(self.kept_counts)):
            w.kept = {next(indexes): [next(ends_in_order), next(lasts)] for _ in range(count)}
        for tag, emitted in self.emitted.items():
            out[tag].emitted = emitted
        return out


def _same_float(a: float, b: float) -> bool:
    """Whether two floats are the same bits' worth (0.0 and -0.0 are not; a NaN is never taken as another)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@record("RunWindows")
@dataclasses.dataclass
class RunWindows:
    """Everything one run keeps for its windows."""
    tags: Dict[str, TagWindows]
    stalls: Optional[StallWatch] = None
    last_time: Optional[float] = None        # latest point or event
    finished_time: Optional[float] = None
    watermark_floor: float = float("-inf")   # the watermark is at least this (a timer fired there)
    scheduled: Optional[float] = None        # when the settle timer is set to fire
    closed: bool = False
    rank: int = 0                            # the worker of a distributed run these windows are of
    world_size: Optional[int] = None
    host: Optional[str] = None
    # The run_started data of the keys that pick its windows' history (``TestConfig.window_history_keys``); None:
    # no run_started seen yet, or no such key.
    started: Optional[Dict[str, Any]] = None
    started_time: Optional[float] = None     # the event time of that run_started
    # Where each kept emitted window is (``WindowRunFn._stash``): tag -> index -> [seq, revision, bag].
    stored: Dict[str, Dict[int, List[int]]] = dataclasses.field(default_factory=dict)
    stored_seq: int = 0                      # the last seq given to a stored window
    closed_bag: int = 0                      # the bag of closed windows new ones go to (0 or 1)
    closed_used: List[bool] = dataclasses.field(default_factory=lambda: [False, False])


@record("RunWindowsPacked")
@dataclasses.dataclass
class PackedRunWindows:
    """``RunWindows`` as the state keeps it: its tags' windows and where their emitted windows are stored as
    columns across the tags (``TagTable``). On the bench's windowed test (20 tags) the value went from 6.6 KB
    to 1.9; it is read at every message and every settle firing, and written at every firing."""
    tags: TagTable
    stored_tags: bytes        # each tag of ``stored``, in its order: its place in ``tags.tags``
    stored_counts: bytes      # how many windows each has stored
    stored_indexes: bytes
    stored_seqs: bytes        # each one's [seq, revision, bag]
    stored_revisions: bytes
    stored_bags: bytes
    stalls: Optional[StallWatch]
    last_time: Optional[float]
    finished_time: Optional[float]
    watermark_floor: float
    scheduled: Optional[float]
    closed: bool
    rank: int
    world_size: Optional[int]
    host: Optional[str]
    stored_seq: int
    closed_bag: int
    closed_used: List[bool]
    started: Optional[Dict[str, Any]] = None
    started_time: Optional[float] = None

    @classmethod
    def of(cls, run: RunWindows) -> PackedRunWindows:
        places = {tag: place for place, tag in enumerate(run.tags)}
        stored_tags = [tag for tag in run.stored if tag in places]  # ``_stash`` drops the others before a write
        stored = [(index, ref) for tag in stored_tags for index, ref in run.stored[tag].items()]
        seqs, revisions, bags = (pack_ints([ref[i] for _, ref in stored], order=1) for i in range(3))
        return cls(TagTable.of(run.tags), pack_ints([places[tag] for tag in stored_tags], order=0),
                   pack_ints([len(run.stored[tag]) for tag in stored_tags], order=0),
                   pack_ints([index for index, _ in stored], order=2), seqs, revisions, bags, **_plain_fields(run))

    def unpack(self) -> RunWindows:
        tags = self.tags.windows()
        names = list(tags)
        refs = iter(zip(unpack_ints(self.stored_indexes), unpack_ints(self.stored_seqs),
                        unpack_ints(self.stored_revisions), unpack_ints(self.stored_bags)))
        stored: Dict[str, Dict[int, List[int]]] = {}
        for place, count in zip(unpack_ints(self.stored_tags), unpack_ints(self.stored_counts)):
            stored[names[place]] = {index: [seq, revision, bag] for index, seq, revision, bag in
                                    itertools.islice(refs, count)}
        return RunWindows(tags, stored=stored, **_plain_fields(self))


def _plain_fields(run: Any) -> Dict[str, Any]:
    """The fields of ``RunWindows`` that its packed form keeps as they are (all but its tags and ``stored``)."""
    return {f.name: getattr(run, f.name) for f in dataclasses.fields(RunWindows) if f.name not in ("tags", "stored")}


@record("RunIntake")
@dataclasses.dataclass
class RunIntake:
    """What the messages since the run's value was last written changed of it, when they changed nothing else:
    its latest times, worker, settle time and the messages' spans for the stall watch. A message in order
    writes this (~60 bytes) instead of the whole value (~2 KB on the bench's 20 tags); the next firing merges
    it into the value (``apply``) and writes that."""
    last_time: Optional[float]
    finished_time: Optional[float]
    world_size: Optional[int]
    host: Optional[str]
    scheduled: Optional[float]
    spans: List[Tuple[float, float]] = dataclasses.field(default_factory=list)  # the stall watch's, in order

    @classmethod
    def after(cls, run: RunWindows, before: Optional[RunIntake], span: Optional[Tuple[float, float]]) -> RunIntake:
        """The intake once a message has changed ``run`` (already merged with ``before``), ``span`` its stall span."""
        spans = (before.spans if before is not None else []) + ([span] if span is not None else [])
        return cls(run.last_time, run.finished_time, run.world_size, run.host, run.scheduled, spans)

    def apply(self, run: RunWindows) -> None:
        run.last_time, run.finished_time, run.world_size = self.last_time, self.finished_time, self.world_size
        run.host, run.scheduled = self.host, self.scheduled
        if run.stalls is not None:
            run.stalls.pending.extend((first, last) for first, last in self.spans)


def read_run_and_intake(state, intake=None) -> Tuple[Optional[RunWindows], Optional[RunIntake]]:
    """(the run's value, what ``intake`` held of later messages, merged into it). The value is written packed; a
    value of the layout before, ``RunWindows`` itself, is still read."""
    value = state.read()
    run = value.unpack() if isinstance(value, PackedRunWindows) else value
    delta = intake.read() if intake is not None and run is not None else None
    if delta is not None:
        delta.apply(run)
    return run, delta


def write_run(state, run: RunWindows, packed: bool = True, intake=None, merged: Optional[RunIntake] = None) -> None:
    """Writes the run's value (``packed``: as columns, else as it is) and clears the ``intake`` cell when what it
    held was ``merged`` into the value (``read_run_and_intake``); an empty cell is left alone."""
    state.write(PackedRunWindows.of(run) if packed else run)
    if merged is not None:
        intake.clear()


def closed_entries(batch: Any) -> List[Tuple[int, str, Window]]:
    """(seq, tag, window) of a bag's batch of closed windows, as ``_stash`` writes it or wrote it before."""
    if isinstance(batch, ClosedWindows):
        return batch.entries()
    return [(seq, tag, dataclasses.replace(window, points=[point for _, point in points.items()]))
            for seq, tag, window, points in batch]
