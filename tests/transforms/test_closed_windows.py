"""Live windows keep their emitted windows in bags of closed windows, not in the run's value, and a value of the
layout before the bags (its emitted windows inside it) goes on as if it had always been in the new one.

``WindowRunFn`` runs key by key on coded state stand-ins (``tests/transforms/held_watermarks.py``): the bytes
each cell holds between calls are what a runner would keep, so a value written by the earlier layout can be put
in the cell as Dataflow would hand it to the updated job (``--update``).
"""

from __future__ import annotations

import dataclasses
import random
import struct
from typing import Any, Dict, List, Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from core import encoding
from core.parse import summarize
from core.runs import RunLifecycle
from core.stalls import StallWatch
from tests.support import T0
from tests.transforms.held_watermarks import END_OF_TIME, HeldStage
from tests.transforms.support import configs, finished, raw, started
from trainguard import wire
from transforms.window_state import PackedRunWindows, RunWindows, read_run_and_intake
from transforms.windows import WindowRunFn

LATENESS = 60.0
CONFIGS = configs(cifar={"window_config": {"allowed_lateness_seconds": LATENESS, "stall_seconds": 300, "tags": {
    "loss": {"count": 4, "aggregations": ["mean", "max"]},
    "tput": {"time_seconds": 20, "aggregations": ["mean"]}}}})
LIFECYCLE = RunLifecycle(grace_seconds=10, timeout_seconds=600)
KEY = ("cifar", "r", 0)
LATE = (5, 9, 23)  # steps (x10) of the points that come late, within the allowed lateness


def run_value(cell, intake=None):
    """The run's value a cell holds, with what the intake holds merged in."""
    return read_run_and_intake(cell, intake)[0]


def summary(message):
    parsed, _ = wire.parse_message(message.payload)
    return summarize(parsed, message.payload, CONFIGS.for_test(parsed.test))


def point_message(i: int):
    """Step ``10 i`` at ``T0 + 5 + i``: a ``loss`` and a ``tput`` point."""
    return raw("cifar", "r", f"r/{i}", points=[("loss", 1.0 + i % 7, 10 * i, T0 + 5 + i),
                                               ("tput", 100.0 - i, 10 * i, T0 + 5 + i)])


def stage() -> HeldStage:
    return HeldStage(WindowRunFn(CONFIGS, LIFECYCLE, streaming=True, clock=lambda: T0 + 1000))


def send(held: HeldStage, i: int, watermark: float) -> List[Any]:
    """Message ``i`` arrives, then the watermark moves to ``watermark``: their outputs."""
    return held.process(KEY, summary(point_message(i)), T0 + 5 + i) + held.advance(watermark, watermark)


def first_half(held: HeldStage) -> List[Any]:
    outputs = held.process(KEY, summary(raw("cifar", "r", "r/start", events=[started(T0)])), T0)
    for i in range(30):
        if i not in LATE:
            outputs += send(held, i, T0 + 5 + i - 2)
    return outputs + held.advance(T0 + 45, T0 + 45)


def second_half(held: HeldStage) -> List[Any]:
    """The late points (each behind an emitted window, within the lateness), more points, the run's end."""
    outputs: List[Any] = []
    for i in LATE:
        outputs += send(held, i, T0 + 46)
    for i in range(30, 60):
        outputs += send(held, i, T0 + 5 + i - 2)
    outputs += held.process(KEY, summary(raw("cifar", "r", "r/end", events=[finished(T0 + 70)])), T0 + 70)
    return outputs + held.advance(END_OF_TIME, END_OF_TIME)


def plain(outputs) -> List[Any]:
    return [(getattr(o, "tag", "main"), getattr(o, "value", o)) for o in outputs]


@dataclasses.dataclass
class OldRunWindows:
    """``RunWindows`` as it was before the bags of closed windows: the emitted windows in its tags'."""
    tags: Dict[str, Any]
    stalls: Optional[StallWatch] = None
    last_time: Optional[float] = None
    finished_time: Optional[float] = None
    watermark_floor: float = float("-inf")
    scheduled: Optional[float] = None
    closed: bool = False
    rank: int = 0
    world_size: Optional[int] = None
    host: Optional[str] = None


class OldTagWindows:
    """``TagWindows`` as it was then: no ``kept``, every kept window in ``emitted``."""

    def __init__(self, state: Dict[str, Any]):
        self.state = state

    def to_state(self) -> Dict[str, Any]:
        return self.state

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> OldTagWindows:
        return cls(state)


def to_old_layout(held: HeldStage) -> None:
    """Rewrites the key's state as the code before the bags would have held it: the windows of the bags back in
    the value, written with the old types' fields; the bags empty."""
    cells, _ = held.keys[KEY]
    run_windows = run_value(cells["run_windows"])
    WindowRunFn._load(run_windows, (cells["closed_windows_0"], cells["closed_windows_1"]))
    old_tags = {}
    for tag, windows in run_windows.tags.items():
        assert set(windows.emitted) == set(windows.kept) and windows.kept, tag  # every kept window is found
        state = windows.to_state()
        del state["kept"]
        old_tags[tag] = OldTagWindows(state)
    fields = {f.name: getattr(run_windows, f.name) for f in dataclasses.fields(OldRunWindows) if f.name != "tags"}
    registry = encoding.REGISTRY.copy()
    registry.register(OldRunWindows, "RunWindows", replace=True)
    registry.register(OldTagWindows, "TagWindows", replace=True)
    old = encoding.encode(OldRunWindows(old_tags, **fields), registry)
    assert not {"kept", "stored"} & {f for _, _, fields in encoding.types_of(old) for f in fields or ()}
    cells["run_windows"].data = old
    cells["closed_windows_0"].clear()
    cells["closed_windows_1"].clear()


def test_a_value_of_the_layout_before_the_bags_goes_on_as_the_new_layout_does():
    """The same windows, revisions and late points after the update as without it; the next write moves the
    kept windows into a bag."""
    new, updated = stage(), stage()
    assert plain(first_half(new)) == plain(first_half(updated))
    to_old_layout(updated)
    cells, _ = updated.keys[KEY]
    assert any(run_value(cells["run_windows"]).tags["loss"].emitted.values())  # the old layout, decoded
    after = plain(second_half(updated))
    assert after == plain(second_half(new))
    revised = [(value[0].tag, value[0].index, value[1]) for tag, value in after if tag == "main" and value[1]]
    assert ("loss", 1, 1) in revised and ("loss", 5, 1) in revised  # late points joined emitted windows


def test_emitted_windows_leave_the_value_and_late_points_read_them_from_a_bag():
    held = stage()
    first_half(held)
    cells, _ = held.keys[KEY]
    run_windows = run_value(cells["run_windows"])
    assert all(not w.emitted and w.kept for w in run_windows.tags.values())
    stored = sum(len(batch.entries()) for bag in ("closed_windows_0", "closed_windows_1") for batch in cells[bag].read())
    assert stored >= len(run_windows.tags["loss"].kept) + len(run_windows.tags["tput"].kept)
    reads = cells["closed_windows_0"].reads + cells["closed_windows_1"].reads
    assert reads == 2  # this test's own, just now: points in order never read the bags
    outputs = send(held, LATE[0], T0 + 46)
    assert cells["closed_windows_0"].reads + cells["closed_windows_1"].reads > reads  # a late point did
    revised = [(v[0].tag, v[0].index, v[1]) for t, v in plain(outputs) if t == "main"]
    assert ("loss", 1, 1) in revised and [tag for tag, _, revision in revised if revision == 1] == ["loss", "tput"]


def test_the_bags_hold_about_the_allowed_lateness_of_windows_however_long_the_run():
    """Two bags take turns: once no kept window is in the other one, it is cleared and takes the new windows."""
    held = stage()
    held.process(KEY, summary(raw("cifar", "r", "r/start", events=[started(T0)])), T0)
    most = [0, 0]  # windows the bags held at most, in the first and the second half of the run
    for i in range(600):
        send(held, i, T0 + 5 + i - 2)
        cells, _ = held.keys[KEY]
        held_now = sum(len(cells[bag].coder.decode(data).entries()) for bag in ("closed_windows_0", "closed_windows_1")
                       for data in cells[bag].data)
        most[i >= 300] = max(most[i >= 300], held_now)
    windows_in_lateness = LATENESS / 4 + LATENESS / 20  # count windows of 4 points a second, 20 s time windows
    assert most[1] <= most[0] <= 3 * windows_in_lateness, most
    held.process(KEY, summary(raw("cifar", "r", "r/end", events=[finished(T0 + 610)])), T0 + 610)
    held.advance(T0 + 700, T0 + 700)
    cells, _ = held.keys[KEY]
    assert cells["closed_windows_0"].data == [] and cells["closed_windows_1"].data == []  # the run's close


def test_a_batch_of_points_of_the_layout_before_the_columns_is_still_placed():
    """The bag of points waiting for the watermark held lists of (tag, point) before ``PointColumns``: an updated
    job reads those it finds there."""
    new, updated = stage(), stage()
    for held in (new, updated):
        held.process(KEY, summary(raw("cifar", "r", "r/start", events=[started(T0)])), T0)
        held.process(KEY, summary(point_message(0)), T0 + 5)
    cells, _ = updated.keys[KEY]
    (columns,) = cells["window_points"].read()
    cells["window_points"].clear()
    cells["window_points"].add(columns.items())  # as the code before the columns wrote it
    assert isinstance(cells["window_points"].read()[0], list)
    assert plain(updated.advance(T0 + 45, T0 + 45)) == plain(new.advance(T0 + 45, T0 + 45))
    assert plain(second_half(updated)) == plain(second_half(new))


def test_a_value_written_before_the_packed_layout_goes_on_as_the_packed_one_does():
    """Before ``PackedRunWindows`` the cell held ``RunWindows`` itself: an updated job reads it, gives the same
    windows, revisions and late points, and writes the packed value next."""
    new, updated = stage(), stage()
    assert plain(first_half(new)) == plain(first_half(updated))
    cells, _ = updated.keys[KEY]
    packed = cells["run_windows"].read()
    assert isinstance(packed, PackedRunWindows)
    cells["run_windows"].data = encoding.encode(packed.unpack())
    assert isinstance(cells["run_windows"].read(), RunWindows)
    assert plain(send(updated, LATE[0], T0 + 46)) == plain(send(new, LATE[0], T0 + 46))  # a late point's revision
    assert isinstance(cells["run_windows"].read(), PackedRunWindows)
    assert encoding.describe(run_value(cells["run_windows"])) == encoding.describe(
        run_value(new.keys[KEY][0]["run_windows"]))


def test_the_packed_value_is_the_run_windows_field_by_field():
    held = stage()
    first_half(held)
    for i in LATE[:1]:
        send(held, i, T0 + 46)
    cells, _ = held.keys[KEY]
    run_windows = run_value(cells["run_windows"])
    assert run_windows.stored and run_windows.stalls is not None and run_windows.tags
    again = encoding.decode(encoding.encode(PackedRunWindows.of(run_windows))).unpack()
    assert encoding.describe(again) == encoding.describe(run_windows)


def plain_stage() -> HeldStage:
    """The streaming DoFn keeping the plain layout a replay keeps (value as it is, points as float64 columns)."""
    fn = WindowRunFn(CONFIGS, LIFECYCLE, streaming=True, clock=lambda: T0 + 1000)
    fn.compact = False
    return HeldStage(fn)


def random_message(rng, i: int):
    """Step ``10 i`` at ``T0 + 5 + i`` with values of any kind: decimals, float32 values, full floats, -0.0."""
    values = [round(rng.gauss(3, 1), 3), struct.unpack("<f", struct.pack("<f", rng.gauss(3, 1)))[0],
              rng.gauss(3, 1), -0.0]
    return raw("cifar", "r", f"r/{i}", points=[("loss", rng.choice(values), 10 * i, T0 + 5 + i + rng.random()),
                                               ("tput", rng.choice(values), 10 * i, T0 + 5 + i)])


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(20, 80))
def test_the_packed_state_gives_what_the_plain_state_gives_on_any_stream(rng, messages):
    """Messages out of order, late ones (within and beyond the lateness), watermark steps of any size, the run's
    end and a drain: the packed value, intake and columns give the same outputs after every step as the plain
    value does, and hold the same run."""
    compact, plain = stage(), plain_stage()
    order = list(range(messages))
    rng.shuffle(order)
    order.sort(key=lambda i: i + rng.choice([0, 0, 0, 5, 30, 90]))  # mostly in order, some late
    watermark = T0
    steps = [("start", None)] + [("message", i) for i in order] + [("end", None)]
    for kind, i in steps:
        if kind == "start":
            message = raw("cifar", "r", "r/start", events=[started(T0)])
        elif kind == "end":
            message = raw("cifar", "r", "r/end", events=[finished(T0 + 5 + messages + 1)])
        else:
            message = random_message(random.Random(i), i)
        at = T0 + 5 + (i if i is not None else messages)
        outputs = [held.process(KEY, summary(message), at) for held in (compact, plain)]
        assert plain_bits(outputs[0]) == plain_bits(outputs[1])
        if rng.random() < 0.4:
            watermark = max(watermark, at - rng.choice([1, 5, 20]))
            fired = [held.advance(watermark, watermark + 10) for held in (compact, plain)]
            assert plain_bits(fired[0]) == plain_bits(fired[1])
        states = [run_value(held.keys[KEY][0]["run_windows"], held.keys[KEY][0]["run_intake"])
                  for held in (compact, plain)]
        assert encoding.describe(states[0]) == encoding.describe(states[1])
    drained = [held.advance(END_OF_TIME, END_OF_TIME) for held in (compact, plain)]
    assert plain_bits(drained[0]) == plain_bits(drained[1])


def plain_bits(outputs) -> Any:
    return encoding.describe(plain(outputs))
