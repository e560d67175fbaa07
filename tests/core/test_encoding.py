"""The versioned encoding of state and shuffled records (``core.encoding``): exact, deterministic, tolerant."""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import os
import struct
import subprocess
import sys
import textwrap
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import encoding
from core.aggregation import TagAggregate
from core.config_versions import ConfigCheck
from core.encoding import EncodingError, IncompatibleVersion, Registry, decode, describe, encode
from core.history import HistoryEntry, JobHistory, MetricHistory, SeededState, StoredIndex
from core.parse import FileSpan, MessageSummary
from core.rank_windows import RankWindows
from core.records import Alert, MetricObservation
from core.run_parts import RunPart
from core.runs import MetricValue, RankedEvent, RunAccumulator, RunResult
from core.stalls import StallWatch
from core.triage import AlertLedger, RaisedAlert, TriageItem
from core.vocabulary import AlertKind, RunStatus
from core.window_checks import (
    FinishedRun,
    NearWindows,
    RunEnded,
    StepWindow,
    WindowHistory,
    WindowTriage,
    _Debounce,
    _OpenRun,
)
from core.windows import TagWindows, Window, WindowPoint, WindowResult, WindowSpec
from tests.support import REPO_ROOT, T0
from trainguard import wire

FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures", "state_v1")

# -- strategies --------------------------------------------------------------------------------------------

floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [-0.0, 0.0, 5e-324, -5e-324, 1.7976931348623157e308, struct.unpack(">d", b"\xff\xf0\x00\x00\x00\x00\x00\x01")[0]])
ints = st.integers(min_value=-(2 ** 70), max_value=2 ** 70) | st.sampled_from(
    [2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, 2 ** 64, -(2 ** 63) - 1, 2 ** 1100, -(2 ** 1100)])
text = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb", "\x00"])
names = st.text(min_size=1, max_size=8)
scalars = st.none() | st.booleans() | ints | floats | text | st.binary(max_size=8)
hashable = st.recursive(st.none() | st.booleans() | ints | text | st.binary(max_size=8),
                        lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6)
plain = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(text, inner, max_size=3)
                   | st.dictionaries(hashable, inner, max_size=3) | st.sets(hashable, max_size=3)
                   | st.frozensets(hashable, max_size=3)
                   | st.builds(collections.deque, st.lists(inner, max_size=3), st.none() | st.integers(3, 5))),
    max_leaves=12)
json_data = st.recursive(st.none() | st.booleans() | ints | floats | text,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                         max_leaves=8)
optional_floats = st.none() | floats
steps = st.integers(-1, 2 ** 63 - 1)

window_points = st.builds(WindowPoint, floats, steps, floats)
window_results = st.builds(
    WindowResult, names, names, names, st.sampled_from(["count", "time", "count_or_time"]), st.integers(0, 10 ** 6),
    floats, floats, st.none() | steps, st.none() | steps, st.integers(0, 10 ** 6), st.booleans(),
    st.dictionaries(st.sampled_from(["mean", "min", "max", "p90", "sum"]), optional_floats, max_size=4),
    st.none() | st.integers(0, 64), st.none() | st.integers(1, 64), st.none() | names)
triage_items = st.builds(TriageItem, names, names, st.sampled_from(["accept", "dismiss", "mute"]), floats,
                         st.none() | names, st.none() | names, st.none() | names, st.none() | names,
                         st.none() | names, optional_floats, text, text)
alerts = st.builds(Alert, st.sampled_from(list(AlertKind)), names, names, text, floats, st.none() | names,
                   optional_floats, optional_floats, optional_floats, st.dictionaries(text, json_data, max_size=3),
                   st.none() | names)
extremes = st.tuples(floats, floats, floats, steps)
tag_aggregates = st.builds(TagAggregate, st.integers(0, 10 ** 9), ints, extremes, extremes,
                           st.tuples(floats, steps, floats, floats), st.none() | st.tuples(floats, steps))
wire_events = st.builds(wire.Event, names, floats, st.dictionaries(text, json_data, max_size=3))
file_spans = st.builds(FileSpan, text, st.integers(0, 2 ** 40), st.integers(0, 1 << 20))
message_summaries = st.builds(
    MessageSummary, names, names, names, st.dictionaries(names, tag_aggregates, max_size=2),
    st.lists(wire_events, max_size=2).map(tuple), floats, floats, st.binary(max_size=30),
    st.lists(st.tuples(names, floats, st.none() | steps, floats), max_size=3).map(tuple),
    st.none() | st.integers(0, 100), st.none() | st.integers(1, 100), st.none() | file_spans)
metric_values = st.builds(MetricValue, names, floats, st.none() | steps)
ranked_events = st.builds(RankedEvent, names, floats, st.dictionaries(text, json_data, max_size=2),
                          st.none() | st.integers(0, 8))
run_results = st.builds(
    RunResult, names, names, st.sampled_from(["success", "failure", "timeout", "missing"]),
    st.none() | st.integers(0, 5), optional_floats, floats, floats, st.lists(metric_values, max_size=3).map(tuple),
    st.lists(ranked_events, max_size=3).map(tuple), st.lists(names, max_size=3).map(tuple), st.booleans(),
    st.lists(st.tuples(st.integers(0, 8), metric_values), max_size=2).map(tuple))
metric_histories = st.builds(MetricHistory, st.lists(st.tuples(names, floats, st.booleans()), max_size=5),
                             st.none() | st.booleans(), st.lists(floats, max_size=4), st.none() | names)
step_windows = st.builds(StepWindow, st.integers(0, 99), st.none() | st.integers(0, 999), st.none() | st.integers(0, 999),
                        st.dictionaries(names, st.none() | floats, max_size=2))
finished_runs = st.builds(FinishedRun, names, st.lists(window_results | step_windows, max_size=2),
                          st.dictionaries(names, st.frozensets(st.integers(0, 100), max_size=3), max_size=2))
window_histories = st.builds(
    WindowHistory,
    st.lists(finished_runs, max_size=2).map(collections.deque),
    st.dictionaries(names, st.builds(_OpenRun, st.lists(window_results, max_size=2),
                                     st.dictionaries(names, st.sets(st.integers(0, 100), max_size=3), max_size=2),
                                     st.sets(names, max_size=2), st.integers(0, 9)), max_size=2),
    st.dictionaries(st.tuples(names, names),
                    st.builds(_Debounce, st.lists(st.booleans(), max_size=3).map(lambda b: collections.deque(b, 3)),
                              st.booleans()), max_size=2),
    st.dictionaries(names, st.lists(names, max_size=2), max_size=2), st.dictionaries(names, names, max_size=2),
    st.dictionaries(names, names, max_size=2))

def run_accumulator(test, run, tags, events, first_time, world_size) -> RunAccumulator:
    accumulator = RunAccumulator(test, run)
    accumulator.ranks = {0: tags}
    accumulator.events = events
    accumulator.first_time, accumulator.last_time, accumulator.world_size = first_time, first_time, world_size
    return accumulator


def run_part(accumulator: RunAccumulator, taken: Dict[str, Tuple[Any, Optional[int]]], others: list) -> RunPart:
    part = RunPart(accumulator, others=others)
    for message_id, (source, events) in taken.items():
        part.note_taken(message_id, source, events)
    return part


run_parts = st.builds(run_part, st.builds(
    run_accumulator, names, names, st.dictionaries(names, tag_aggregates, max_size=2),
    st.lists(ranked_events, max_size=2), floats, st.none() | st.integers(1, 8)),
    st.dictionaries(names, st.tuples(file_spans | st.binary(max_size=8), st.none() | st.integers(0, 100)),
                    max_size=4),
    st.lists(st.tuples(names, file_spans | st.binary(max_size=8)), max_size=2))

windows = st.builds(Window, names, st.integers(0, 100), st.lists(window_points, max_size=3), floats, floats,
                    st.integers(0, 5), st.booleans())
window_specs = st.builds(WindowSpec, st.none() | st.integers(1, 100), optional_floats, optional_floats,
                         st.lists(names, max_size=3).map(tuple))


STRATEGIES: Dict[type, Any] = {
    WindowPoint: window_points,
    WindowResult: window_results,
    WindowSpec: window_specs,
    Window: windows,
    TriageItem: triage_items,
    Alert: alerts,
    TagAggregate: tag_aggregates,
    wire.Event: wire_events,
    MessageSummary: message_summaries,
    RunPart: run_parts,
    FileSpan: file_spans,
    MetricValue: metric_values,
    RankedEvent: ranked_events,
    RunResult: run_results,
    MetricObservation: st.builds(MetricObservation, names, names, names, floats, st.none() | steps, names, floats,
                                 floats, st.dictionaries(text, json_data, max_size=2)),
    MetricHistory: metric_histories,
    JobHistory: st.builds(JobHistory, st.none() | st.sampled_from(list(RunStatus))),
    WindowHistory: window_histories,
    NearWindows: st.builds(NearWindows, st.integers(-5, 100), st.integers(-5, 100),
                           st.lists(names, max_size=2).map(lambda a: tuple(sorted(a))), st.lists(finished_runs, max_size=2)),
    StepWindow: step_windows,
    RunEnded: st.builds(RunEnded, names, names, names, floats, names, names),
    WindowTriage: st.builds(WindowTriage, triage_items, names, names, names),
    StallWatch: st.builds(StallWatch, floats, st.lists(st.tuples(floats, floats), max_size=3), optional_floats,
                          st.sets(st.floats(allow_nan=False), max_size=3)),
    RankWindows: st.builds(RankWindows, st.dictionaries(st.integers(0, 9), st.dictionaries(
        st.integers(0, 9), window_results, max_size=2), max_size=2), st.sets(st.integers(0, 99), max_size=3),
        st.none() | st.integers(1, 9), st.dictionaries(st.integers(0, 9), st.lists(st.booleans(), max_size=3).map(
            lambda b: collections.deque(b, 3)), max_size=2),
        st.dictionaries(st.integers(0, 9), st.booleans(), max_size=2),
        st.dictionaries(st.integers(0, 9), names, max_size=2)),
    RaisedAlert: st.builds(RaisedAlert, names, floats, st.dictionaries(text, json_data, max_size=4)),
    StoredIndex: st.builds(StoredIndex, st.frozensets(st.tuples(names, names), max_size=3),
                           st.frozensets(names, max_size=3)),
    SeededState: st.builds(SeededState, metric_histories | window_histories | plain),
    AlertLedger: st.builds(AlertLedger, st.lists(triage_items, max_size=2), st.dictionaries(
        names, st.tuples(floats, st.dictionaries(text, json_data, max_size=3)), max_size=2)),
    ConfigCheck: st.builds(ConfigCheck, names, text, floats, st.none() | text, st.none() | text, st.none() | names,
                           st.booleans()),
}


def same(a: Any, b: Any) -> bool:
    """Equal, bit for bit (NaNs and the sign of zero included)."""
    return describe(a) == describe(b)


# -- round trips -------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(plain)
def test_plain_values_round_trip_exactly(value):
    decoded = decode(encode(value))
    assert same(decoded, value)


@settings(max_examples=30, deadline=None)
@given(st.data())
@pytest.mark.parametrize("cls", sorted(STRATEGIES, key=lambda c: c.__qualname__), ids=lambda c: c.__qualname__)
def test_registered_records_round_trip_exactly(cls, data):
    value = data.draw(STRATEGIES[cls])
    decoded = decode(encode(value))
    assert type(decoded) is cls
    assert same(decoded, value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(names, plain, max_size=4), st.lists(window_results, max_size=3))
def test_encoding_is_deterministic(mapping, windows):
    value = [mapping, windows, {frozenset(mapping), "x"} if all(isinstance(v, str) for v in mapping) else None]
    assert encode(value) == encode(value)
    assert encode(decode(encode(value))) == encode(value)


def test_sets_encode_in_one_order_whatever_their_iteration_order():
    forward, backward = set(), set()
    items = [f"run-{i}" for i in range(50)] + [("a", 1), ("b", 2)]
    for item in items:
        forward.add(item)
    for item in reversed(items):
        backward.add(item)
    assert encode(forward) == encode(backward)
    assert encode({1.5, float("nan"), -0.0}) == encode({-0.0, float("nan"), 1.5})



def test_encoding_leaves_nothing_for_the_cyclic_garbage_collector():
    """Each state write encodes: an encoding whose objects form a cycle (e.g. an encoder holding a packer that
    holds the encoder's hook) keeps its buffer alive until a cyclic pass, and a replay then holds hundreds.

    In a fresh interpreter: ``gc.collect`` counts every thread's garbage, and a test process has other threads
    (servers, runners) making some."""
    code = textwrap.dedent("""
        import gc
        from core.encoding import decode, encode
        from core.history import MetricHistory
        from core.run_parts import RunPart
        from core.runs import RunAccumulator
        accumulator = RunAccumulator("t", "r")
        value = [accumulator, RunPart(accumulator), {("a", 1), "b", 2.5}, MetricHistory([("r", 1.0, True)])]
        gc.collect()
        gc.disable()
        for _ in range(20):
            decode(encode(value))
        print(gc.collect())
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0\n"


def test_floats_keep_every_bit():
    payload_nan = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x2a")[0]
    values = [-0.0, 0.0, float("inf"), float("-inf"), payload_nan, 5e-324, 1e308]
    decoded = decode(encode(values))
    assert [struct.pack(">d", v) for v in decoded] == [struct.pack(">d", v) for v in values]
    assert math.copysign(1.0, decode(encode(WindowPoint(-0.0, 1, -0.0))).value) == -1.0


def test_types_stay_apart():
    value = {"list": [1, 2], "tuple": (1, 2), "nested": [(1, [2, (3,)])], "set": {1}, "frozenset": frozenset({1}),
             (1, "a"): "tuple key", 3: "int key", "deque": collections.deque([1], maxlen=2), "true": True, "one": 1}
    decoded = decode(encode(value))
    assert decoded == value
    assert [type(v) for v in decoded.values()] == [type(v) for v in value.values()]
    assert decoded["deque"].maxlen == 2 and type(decoded["true"]) is bool


def test_enums_are_written_by_value():
    alert = Alert(AlertKind.JOB_FAILED, "t", "r", "m", T0)
    data = encode(alert)
    assert b"job_failed" in data and b"AlertKind" in data and b"core.vocabulary" not in data
    assert decode(data).kind is AlertKind.JOB_FAILED


def test_bytes_name_no_module_path_or_class_layout():
    data = encode([MetricHistory([("r", 1.0, True)]), RunAccumulator("t", "r"), TagWindows(WindowSpec(count=3))])
    for needle in (b"core.", b"__main__", b"builtins", b"_Debounce", b"dataclass"):
        assert needle not in data
    assert [name for name, _, _ in encoding.types_of(data)] == ["MetricHistory", "RunAccumulator", "TagWindows",
                                                                 "WindowSpec"]


def test_classes_with_to_state_round_trip():
    accumulator = RunAccumulator("t", "r")
    accumulator.ranks = {0: {"loss": TagAggregate(1, 2 ** 80, (1.0, 1.0, T0, 1), (1.0, 1.0, -T0, -1),
                                                  (T0, 1, 1.0, 1.0))}}
    accumulator.events = [RankedEvent("run_started", T0, {"host": "h"}, 1)]
    accumulator.first_time, accumulator.last_time, accumulator.world_size = T0, T0 + 1, 2
    assert vars(decode(encode(accumulator))) == vars(accumulator)
    windows = TagWindows(WindowSpec(time_seconds=60.0))
    windows.pending = [WindowPoint(T0, 1, 2.0)]
    windows.open_by_index = {5: [WindowPoint(T0 - 1, -1, 3.0)]}
    windows.emitted = {4: Window("time", 4, [WindowPoint(T0 - 70, 0, 1.0)], T0 - 90, T0 - 30, 1, False)}
    assert vars(decode(encode(windows))) == vars(windows)


def test_anything_unregistered_is_refused_when_written():
    class Unknown:
        pass

    with pytest.raises(EncodingError, match="Unknown.*register it"):
        encode({"state": [Unknown()]})
    with pytest.raises(EncodingError):
        encode(collections.OrderedDict(a=1))  # a dict subclass: not silently a dict


def test_garbage_is_refused_when_read():
    with pytest.raises(EncodingError):
        decode(b"\x80\x04\x95pickle")
    with pytest.raises(EncodingError):
        decode(msgpack.packb({"not": "ours"}))


# -- versions: fields added, removed, incompatible changes -----------------------------------------------------


@dataclasses.dataclass
class MetricHistoryOfBareTuples:
    """MetricHistory as it was before ``HistoryEntry``: its entries bare (run, value, counted) tuples."""
    entries: List[Tuple[str, float, bool]] = dataclasses.field(default_factory=list)
    last_out_of_bounds: Optional[bool] = None
    previous: List[float] = dataclasses.field(default_factory=list)
    pending_accept: Optional[str] = None
    improving: int = 0
    segments: Dict[str, MetricHistoryOfBareTuples] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class MetricHistoryWithAField(MetricHistoryOfBareTuples):
    """Today's MetricHistory, plus fields a later version might add."""
    rebaselined_at: Optional[float] = None
    notes: Dict[str, str] = dataclasses.field(default_factory=dict)


def variant(cls: type, name: str, version: int = 1, upgrades=None) -> Registry:
    registry = encoding.load_registry().copy()
    registry.register(cls, name, version, upgrades, replace=True)
    return registry


def fixture(name: str) -> bytes:
    with open(os.path.join(FIXTURES, f"{name}.bin"), "rb") as f:
        return f.read()


def test_an_added_field_takes_its_default_when_old_bytes_lack_it():
    old = fixture("metric_history")  # written by today's MetricHistory (state_v1)
    decoded = decode(old, variant(MetricHistoryWithAField, "MetricHistory"))
    today = decode(old)
    assert isinstance(decoded, MetricHistoryWithAField)
    assert (decoded.entries, decoded.last_out_of_bounds, decoded.previous, decoded.pending_accept) == (
        today.entries, today.last_out_of_bounds, today.previous, today.pending_accept)
    assert decoded.rebaselined_at is None and decoded.notes == {}


def test_an_added_field_reaches_nested_records_too():
    old = fixture("history_seed")  # MetricHistory inside the seed's dict, inside WindowHistory's neighbours
    decoded = decode(old, variant(MetricHistoryWithAField, "MetricHistory"))
    (history,) = decoded.metrics.values()
    assert isinstance(history, MetricHistoryWithAField) and history.notes == {}
    assert history.entries == decode(old).metrics[next(iter(decoded.metrics))].entries


def test_history_entries_are_written_as_the_bare_tuples_they_were_and_read_back_as_entries():
    entry = HistoryEntry("r1", 1.5, True)
    assert encode(entry) == encode(("r1", 1.5, True)) and describe(entry) == describe(("r1", 1.5, True))
    assert type(decode(encode(entry))) is tuple  # bare in the bytes: the history holding it names it
    history = MetricHistory([entry, HistoryEntry("r2", 9.0, False)], True, [1.0, 2.0], "r9", 1,
                            {"accelerator=v4": MetricHistory([HistoryEntry("r3", -0.0, True)])})
    bare = MetricHistoryOfBareTuples([("r1", 1.5, True), ("r2", 9.0, False)], True, [1.0, 2.0], "r9", 1,
                                     {"accelerator=v4": MetricHistoryOfBareTuples([("r3", -0.0, True)])})
    data = encode(history)
    assert data == encode(bare, variant(MetricHistoryOfBareTuples, "MetricHistory"))
    decoded = decode(data)
    assert decoded == history and describe(decoded) == describe(history)
    assert {type(e) for h in (decoded, *decoded.segments.values()) for e in h.entries} == {HistoryEntry}
    assert decoded.entries[1].run == "r2" and decoded.entries[1].value == 9.0 and not decoded.entries[1].counted


def test_only_a_named_tuple_not_a_record_is_written_as_a_plain_tuple():
    with pytest.raises(EncodingError):
        encoding.plain_tuple(list)
    with pytest.raises(EncodingError):
        encoding.plain_tuple(FileSpan)  # a record: its bytes name it


def test_a_field_the_code_no_longer_has_is_ignored():
    @dataclasses.dataclass
    class Older:
        last_status: Optional[str] = None
        streak: int = 0

    data = encode(Older("failure", 3), variant(Older, "JobHistory"))
    assert decode(data) == JobHistory("failure")


def test_newer_code_writes_what_older_code_reads():  # a rollback
    new = encode(MetricHistoryWithAField([("r", 1.0, True)], notes={"n": "x"}),
                 variant(MetricHistoryWithAField, "MetricHistory"))
    assert decode(new) == MetricHistory([("r", 1.0, True)])


def test_a_newer_major_version_is_refused_with_a_clear_error():
    data = encode(JobHistory("success"), variant(JobHistory, "JobHistory", version=2, upgrades={1: dict}))
    with pytest.raises(IncompatibleVersion, match="JobHistory was written with schema version 2.*up to version 1"):
        decode(data)


def test_an_older_major_version_is_upgraded_by_its_functions():
    @dataclasses.dataclass
    class JobHistoryV3:
        statuses: List[str] = dataclasses.field(default_factory=list)

    def v1_to_v2(fields):
        return {"status_list": [] if fields.get("last_status") is None else [fields["last_status"]]}

    def v2_to_v3(fields):
        return {"statuses": fields["status_list"]}

    old = encode(JobHistory("failure"))
    assert decode(old, variant(JobHistoryV3, "JobHistory", 3, {1: v1_to_v2, 2: v2_to_v3})) == JobHistoryV3(["failure"])
    with pytest.raises(EncodingError, match="no upgrade from schema version 1"):
        decode(old, variant(JobHistoryV3, "JobHistory", 3, {2: v2_to_v3}))


def test_a_field_without_default_must_be_in_the_bytes():
    @dataclasses.dataclass
    class Stricter:
        last_status: Optional[str]
        required_now: int

    with pytest.raises(EncodingError, match="lack \\['required_now'\\]"):
        decode(encode(JobHistory("x")), variant(Stricter, "JobHistory"))


def test_named_tuples_take_new_defaulted_fields_too():
    class PointWithUnit(NamedTuple):
        time: float
        step: int
        value: float
        unit: str = "s"

    decoded = decode(encode([WindowPoint(T0, 3, 1.5)]), variant(PointWithUnit, "WindowPoint"))
    assert decoded == [PointWithUnit(T0, 3, 1.5, "s")]


def test_an_unknown_name_says_it_may_be_newer():
    registry = Registry()
    registry.register(JobHistory, "SomethingNew")
    with pytest.raises(EncodingError, match="unknown record type 'SomethingNew'.*newer"):
        decode(encode(JobHistory(), registry))


def test_values_of_one_types_table_share_a_decoder_that_a_new_registration_replaces():
    registry = encoding.load_registry().copy()
    data = [encode(JobHistory(status), registry) for status in ("success", "failure", None)]
    assert [decode(d, registry) for d in data] == [JobHistory("success"), JobHistory("failure"), JobHistory()]
    assert len(registry.decoders) == 1  # one table for all three

    @dataclasses.dataclass
    class JobHistoryNamedAgain:
        last_status: Optional[str] = None

    registry.register(JobHistoryNamedAgain, "JobHistory", replace=True)  # what the kept decoder built is stale
    assert registry.decoders == {}
    assert decode(data[1], registry) == JobHistoryNamedAgain("failure")


def test_a_type_unknown_when_first_read_is_read_once_registered():
    registry = Registry()
    data = encode(JobHistory("failure"), encoding.load_registry())
    with pytest.raises(EncodingError, match="unknown record type 'JobHistory'"):
        decode(data, registry)
    registry.register(JobHistory, "JobHistory")
    assert decode(data, registry) == JobHistory("failure")


def test_a_registry_keeps_decoders_for_a_bounded_number_of_types_tables():
    registry = encoding.load_registry().copy()
    for n in range(encoding.MAX_DECODERS + 10):  # tables that differ in a field this code no longer has
        table = [["JobHistory", 1, ["last_status", f"gone_{n}"]]]
        body = msgpack.packb([msgpack.ExtType(encoding.Ext.RECORD, b"\x00"), "ok", n], use_bin_type=True)
        assert decode(msgpack.packb([1, table, body], use_bin_type=True), registry) == JobHistory("ok")
        assert len(registry.decoders) <= encoding.MAX_DECODERS


def test_a_types_table_that_is_no_list_of_types_is_refused():
    body = msgpack.packb([msgpack.ExtType(encoding.Ext.RECORD, b"\x00"), "x"], use_bin_type=True)
    for table in ([{"JobHistory": 1}], {"a": 1}, [["JobHistory", 1, {"last_status": 1}]]):
        with pytest.raises(EncodingError):
            decode(msgpack.packb([1, table, body], use_bin_type=True))


def test_a_str_enum_member_this_code_does_not_know_reads_as_its_value():
    class NewerKind(str, enum.Enum):
        BRAND_NEW = "brand_new"

    data = encode(NewerKind.BRAND_NEW, variant(NewerKind, "AlertKind"))
    assert decode(data) == "brand_new"


def test_a_value_of_hundreds_of_types_round_trips():
    """Each type's mark is its index in the value's types table: the first ones made once, the others as met."""
    registry = Registry()
    kinds = [dataclasses.make_dataclass(f"Kind{i}", [("n", int)]) for i in range(300)]
    for kind in kinds:
        registry.register(kind, kind.__name__)
    value = [kind(i) for i, kind in enumerate(kinds)]
    data = encode(value, registry)
    assert decode(data, registry) == value
    assert [name for name, _, _ in encoding.types_of(data)] == [kind.__name__ for kind in kinds]


def test_a_name_is_one_type():
    registry = Registry()
    registry.register(JobHistory, "JobHistory")
    with pytest.raises(EncodingError, match="taken"):
        registry.register(MetricHistory, "JobHistory")
    with pytest.raises(EncodingError, match="already registered"):
        registry.register(JobHistory, "Other")


def test_every_registered_type_has_a_round_trip_strategy_or_a_fixture():
    covered = {encoding.REGISTRY.by_class[cls].name for cls in STRATEGIES}
    sets = os.path.dirname(FIXTURES)
    for directory in [os.path.join(sets, d) for d in os.listdir(sets) if d.startswith("state_v")]:
        for name in os.listdir(directory):
            if name.endswith(".bin"):
                with open(os.path.join(directory, name), "rb") as f:
                    covered |= {type_name for type_name, _, _ in encoding.types_of(f.read())}
    missing = set(encoding.load_registry().by_name) - covered
    assert not missing, f"registered types with neither a strategy here nor a fixture: {sorted(missing)}"
