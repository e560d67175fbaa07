"""A replay's messages of one run taken before its shuffle (``core.run_parts.RunPart``): which copy of a message id
counts, and which events a run leaves out, whatever the bundles and the order."""

import dataclasses
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.config import ConfigSet
from core.encoding import decode, encode
from core.parse import FileSpan, content_digest, summarize, summarize_again
from core.registry import REGISTRY
from core.run_parts import RunPart
from core.runs import RunAccumulator, RunLifecycle
from tests.core.test_runs import ALL, msg, started
from tests.support import T0
from trainguard import wire

CONFIGS = ConfigSet({}, ALL)
LIFECYCLE = RunLifecycle(grace_seconds=60, timeout_seconds=3600)


def summary_of(source):
    return summarize_again(source, CONFIGS)


def payload(mid: str, value: float, notes: int = 0) -> bytes:
    """A message of run t/r: one point, and ``notes`` events."""
    return wire.encode_message("t", "r", [wire.point_dict("loss", value, T0 + value, 1)],
                               [wire.event_dict("note", T0 + value + i / 10, {"i": i}) for i in range(notes)],
                               message_id=mid)


def taken_in_parts(bundles):
    """Each bundle of payloads offered to a part of its own (``PreAssembleRunsFn``), then the parts merged in
    the order given (``AssembleRunPartsFn``)."""
    parts = []
    for bundle in bundles:
        part = RunPart(RunAccumulator("t", "r"))
        for source in bundle:
            part, failed = part.offer(summary_of(source), summary_of)
            assert failed == []
        parts.append(part)
    held = parts[0]
    for part in parts[1:]:
        held, failed = held.merged(part, summary_of)
        assert failed == []
    return held


def test_copies_with_the_same_bytes_count_once_and_of_different_bytes_the_first_in_byte_order():
    one, nine = payload("x", 1.0), payload("x", 9.0)
    first, other = sorted([one, nine])
    for bundles in ([[one, nine, one]], [[nine], [one, nine]], [[nine, nine], [one]], [[one], [nine], [one]]):
        part = taken_in_parts(bundles)
        assert part.ids == ["x"] and part.source_of("x") == first, bundles
        assert part.copies_not_taken() == [(other, content_digest(first))], bundles
        value = part.accumulator.result(ALL, LIFECYCLE).metrics[0].value
        assert value == json.loads(first)["points"][0]["value"]


def test_a_part_without_some_messages_is_the_part_of_the_others(monkeypatch):
    monkeypatch.setattr(RunAccumulator, "MAX_EVENTS", 4)
    messages = [msg([("loss", 3.0, 0, T0)], [started()], mid="a"),
                msg([("loss", 1.0, 1, T0 + 1)], [("note", T0 + 1, {}), ("note", T0 + 2, {})], mid="b"),
                msg([("loss", 2.0, 2, T0 + 2)], [("note", T0 + 3, {}), ("note", T0 + 4, {}), ("note", T0 + 5, {})],
                    mid="c")]
    payloads = {m.id: json.dumps(m.id).encode() for m in messages}  # a source: any bytes summary_of knows
    by_payload = {payloads[m.id]: summarize(m, payloads[m.id], ALL) for m in messages}
    part = RunPart(RunAccumulator("t", "r"))
    over = [event for m in messages for event in part.take(by_payload[payloads[m.id]])]
    assert [e.time for e in over] == [T0 + 5] and list(part.sources())[-1] == ("c", payloads["c"], 3)

    rest, failed = part.without({"b"}, by_payload.__getitem__)
    expected = RunPart(RunAccumulator("t", "r"))
    expected.take(by_payload[payloads["a"]])
    expected.take(by_payload[payloads["c"]])
    assert failed == [] and rest.ids == ["a", "c"]
    assert rest.accumulator.to_state() == expected.accumulator.to_state()
    # Without b's two notes, c's three fit: which events a run keeps depends on its messages only.
    assert sorted(e.time for e in rest.accumulator.events) == [T0, T0 + 3, T0 + 4, T0 + 5]

    unreadable, failed = part.without({"a"}, lambda source: by_payload[source] if source != payloads["b"] else 1 / 0)
    assert unreadable.ids == ["c"] and [(s, type(e)) for s, e in failed] == [(payloads["b"],
                                                                                          ZeroDivisionError)]


def test_the_events_a_run_leaves_out_are_read_again_once_whatever_its_parts(monkeypatch):
    monkeypatch.setattr(RunAccumulator, "MAX_EVENTS", 5)
    sources = [payload("a", 1.0, notes=3), payload("b", 2.0, notes=3), payload("c", 3.0), payload("d", 0.5, 2)]
    part = taken_in_parts([sources[:2], sources[2:], sources[1:2]])
    over, failed = part.events_over_the_limit()
    assert failed == [] and part.accumulator.at_event_limit()
    # The five earliest notes are kept: d's two and a's three; b's three are left out.
    assert sorted((e.time, e.data["i"]) for e in over) == [(T0 + 2.0 + i / 10, i) for i in range(3)]
    assert sorted(e.time for e in part.accumulator.events) == sorted(
        [T0 + 0.5, T0 + 0.6] + [T0 + 1.0 + i / 10 for i in range(3)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=14),
       st.randoms(use_true_random=False))
def test_which_copies_count_does_not_depend_on_order_or_bundles(copies, rng):
    """Copies (id, value, notes): the same triple is the same bytes; bundles overlap (a copy delivered twice)."""
    RunAccumulator.MAX_EVENTS, limit = 3, RunAccumulator.MAX_EVENTS
    try:
        sources = [payload(mid, float(value), notes) for mid, value, notes in copies]
        winners = {}
        for source in sources:
            mid = json.loads(source)["id"]
            winners[mid] = min(winners.get(mid, source), source)
        reference = taken_in_parts([sorted(winners.values())])
        shuffled = sources + rng.sample(sources, rng.randrange(len(sources) + 1))
        rng.shuffle(shuffled)
        cuts = sorted(rng.randrange(len(shuffled) + 1) for _ in range(rng.randrange(3)))
        bundles = [b for b in (shuffled[i:j] for i, j in zip([0, *cuts], [*cuts, len(shuffled)])) if b]
        part = taken_in_parts(bundles)
        assert part.accumulator.result(ALL, LIFECYCLE) == reference.accumulator.result(ALL, LIFECYCLE)
        assert sorted(part.ids) == sorted(winners) and all(part.source_of(m) == winners[m] for m in winners)
        assert part.copies_not_taken() == sorted(
            (source, content_digest(winners[json.loads(source)["id"]]))
            for source in set(sources) - set(winners.values()))
        assert sorted(e.data["i"] for e in part.events_over_the_limit()[0]) == sorted(
            e.data["i"] for e in reference.events_over_the_limit()[0])
    finally:
        RunAccumulator.MAX_EVENTS = limit


def test_a_part_keeps_where_to_read_each_message_again_packed_and_in_order():
    part = RunPart(RunAccumulator("t", "r"), others=[("a", b"{\"id\": \"a\", \"other\": 1}")])
    taken = [("a", FileSpan("/logs/a.jsonl", 0, 120), None), ("b", b"{\"id\": \"b\"}", 3),
             ("c", FileSpan("/logs/b.jsonl", 7, 9), 0), ("d", FileSpan("/logs/a.jsonl", 121, 2 ** 40), None)]
    for message_id, source, events in taken:
        part.note_taken(message_id, source, events)
    assert list(part.sources()) == taken and part.ids == ["a", "b", "c", "d"]
    assert part.files == ["/logs/a.jsonl", "/logs/b.jsonl"]  # each path once
    assert part.has("c") and not part.has("e") and part.source_of("b") == b"{\"id\": \"b\"}"
    decoded = decode(encode(part))
    assert list(decoded.sources()) == taken and decoded.has("d") and decoded.others == part.others


def test_a_part_taking_another_keeps_where_to_read_each_message_whatever_their_files():
    mine, theirs = RunPart(RunAccumulator("t", "r")), RunPart(RunAccumulator("t", "r"))
    taken = [("a", FileSpan("/logs/x.jsonl", 0, 10), 0), ("b", b"{}", 1)]
    other = [("c", FileSpan("/logs/y.jsonl", 1, 2), 2), ("d", FileSpan("/logs/x.jsonl", 3, 4), None), ("e", b"[]", 0)]
    for part, messages in ((mine, taken), (theirs, other)):
        for message_id, source, events in messages:
            part.note_taken(message_id, source, events)
    assert mine.has("a") and not mine.has("e")  # (its index made before it takes more)
    mine.absorb(theirs)
    assert list(mine.sources()) == taken + other and mine.files == ["/logs/x.jsonl", "/logs/y.jsonl"]
    assert mine.source_of("e") == b"[]" and mine.source_of("d") == FileSpan("/logs/x.jsonl", 3, 4)


def test_a_version_1_or_2_part_is_read_as_version_3():
    """RunPart's version 1 kept {id: (source, events kept)}; version 2 packed them in columns, the fourth how many
    events the part kept (-1: all); version 3's fourth column is how many events a message carries, which the
    older versions did not keep (None: not known)."""
    accumulator = RunAccumulator("t", "r")
    upgrades = REGISTRY.by_class[RunPart].upgrades
    v1 = {"accumulator": accumulator, "messages": {"a": (FileSpan("/logs/a.jsonl", 5, 6), None), "b": (b"x", 2)}}
    upgraded = RunPart.from_state(upgrades[2](upgrades[1](v1)))
    assert upgraded.accumulator is accumulator and upgraded.others == []
    assert list(upgraded.sources()) == [("a", FileSpan("/logs/a.jsonl", 5, 6), None), ("b", b"x", None)]
    v2 = {"accumulator": accumulator, "ids": ["a"], "files": ["/logs/a.jsonl"],
          "columns": struct.pack("<4q", 0, 5, 6, 2), "payloads": {}}
    assert list(RunPart.from_state(upgrades[2](v2)).sources()) == [("a", FileSpan("/logs/a.jsonl", 5, 6), None)]


def test_a_copy_that_cannot_be_taken_leaves_the_part_as_it_was():
    part, _ = RunPart(RunAccumulator("t", "r")).offer(summary_of(payload("x", 9.0)), summary_of)
    broken = dataclasses.replace(summary_of(payload("x", 1.0)), events=(None,))  # sorts first, cannot be added
    before = encode(part)
    with pytest.raises(TypeError):
        part.offer(broken, summary_of)
    assert encode(part) == before and part.others == []
