"""``transforms.window_state``: what live windows keep in state comes back as it was, bit for bit; state written by
earlier versions is still read."""

import dataclasses
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from core import encoding
from core.windows import COUNT, TIME, TagWindows, Window, WindowPoint, WindowSpec
from tests.support import T0
from transforms.window_state import ClosedWindows, PointColumns, TagTable


def _bits(items):
    return sorted((tag, struct.pack("<d", p.time), p.step, struct.pack("<d", p.value)) for tag, p in items)


@given(st.lists(st.tuples(st.sampled_from(["loss", "acc", "a/b"]),
                          st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(min_value=-1, max_value=2 ** 80) | st.just(-1),
                          st.floats(allow_nan=True, allow_infinity=True)), max_size=150), st.booleans())
@settings(max_examples=200, deadline=None)
def test_point_columns_give_back_every_point_bit_for_bit(raw_items, compact):
    """NaNs, -0.0, steps of any size and NO_STEP, compact (a streaming job's) or quick (a replay's): the bag's
    columns lose nothing, and keep each tag's order."""
    items = [(tag, WindowPoint(time, step, value)) for tag, time, step, value in raw_items]
    back = encoding.decode(encoding.encode(PointColumns.of(items, compact))).items()
    assert _bits(back) == _bits(items)
    for tag in {tag for tag, _ in items}:
        assert [p.step for t, p in back if t == tag] == [p.step for t, p in items if t == tag]


finite_times = st.floats(-1e12, 1e12)
any_values = st.floats(allow_nan=True, allow_infinity=True)
window_points = st.builds(WindowPoint, finite_times, st.integers(-1, 2 ** 40), any_values)
SPECS = [WindowSpec(count=2), WindowSpec(count=3, aggregations=("mean", "p90")),
         WindowSpec(time_seconds=10.0, period_seconds=5.0), WindowSpec(count=3, time_seconds=20.0)]


@given(st.dictionaries(st.sampled_from(["loss", "acc", "a/b", "tput"]), st.tuples(
    st.sampled_from(SPECS), st.lists(window_points, max_size=12), st.integers(0, 12), finite_times), max_size=4))
@settings(max_examples=200, deadline=None)
def test_a_tag_table_gives_back_every_tags_windows_as_they_were(plans):
    """Pending, open and kept windows (count and time kinds), emitted windows not yet stashed, dicts in their
    order: what the run's packed value keeps comes back field by field, bit for bit."""
    tags = {}
    for tag, (spec, pts, settled, watermark) in plans.items():
        windows = tags[tag] = TagWindows(spec)
        for point in pts[:settled]:
            windows.add(point)
        windows.settle(watermark)
        windows.expire(before=watermark - 5.0)
        for point in pts[settled:]:
            windows.add(point)
    back = encoding.decode(encoding.encode(TagTable.of(tags))).windows()
    assert list(back) == list(tags)
    for tag, windows in tags.items():
        state, again = windows.to_state(), back[tag].to_state()
        assert encoding.describe(again) == encoding.describe(state)
        assert list(again["kept"]) == list(state["kept"]) and list(again["open_by_index"]) == list(
            state["open_by_index"])


@given(st.lists(st.tuples(st.integers(0, 2 ** 40), st.sampled_from(["loss", "acc"]), st.integers(0, 99),
                          st.lists(window_points, max_size=5), finite_times, finite_times, st.integers(0, 3),
                          st.booleans()), max_size=6))
@settings(max_examples=200, deadline=None)
def test_closed_windows_give_back_every_window_bit_for_bit(raw):
    entries = [(seq, tag, Window(COUNT if tag == "loss" else TIME, index, pts, start, end, revision, partial))
               for seq, tag, index, pts, start, end, revision, partial in raw]
    back = encoding.decode(encoding.encode(ClosedWindows.of(entries))).entries()
    assert encoding.describe(back) == encoding.describe(entries)


def test_point_columns_written_by_version_1_are_read():
    """Version 1 wrote each tag's times and values as float64 bytes and its steps as zigzag varints of their
    differences: a bag an updated job finds still holds such batches."""
    @dataclasses.dataclass
    class PointColumnsV1:
        tags: list
        times: list
        steps: list
        values: list

    items = [("loss", WindowPoint(T0, 0, 1.5)), ("loss", WindowPoint(T0 + 1, 10, -0.0)),
             ("acc", WindowPoint(T0 + 0.5, -1, float("nan"))), ("loss", WindowPoint(T0 + 2, 2 ** 70, 2.0))]
    by_tag = {"loss": [p for t, p in items if t == "loss"], "acc": [p for t, p in items if t == "acc"]}

    def varints(numbers):
        out = bytearray()
        for number in numbers:
            unsigned = number * 2 if number >= 0 else -number * 2 - 1
            while unsigned >= 0x80:
                out.append((unsigned & 0x7F) | 0x80)
                unsigned >>= 7
            out.append(unsigned)
        return bytes(out)

    old = PointColumnsV1(list(by_tag), [struct.pack(f"<{len(p)}d", *(x.time for x in p)) for p in by_tag.values()],
                         [varints([b - a for a, b in zip([0] + [x.step for x in p], [x.step for x in p])])
                          for p in by_tag.values()],
                         [struct.pack(f"<{len(p)}d", *(x.value for x in p)) for p in by_tag.values()])
    registry = encoding.REGISTRY.copy()
    registry.register(PointColumnsV1, "PointColumns", version=1, replace=True)
    back = encoding.decode(encoding.encode(old, registry))
    assert isinstance(back, PointColumns)
    assert _bits(back.items()) == _bits([(t, p) for t in by_tag for p in by_tag[t]])
