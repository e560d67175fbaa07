"""The window checks' state in parts (``transforms.window_checks.WindowCheckMachine``, ``transforms.ordered.KeepsApart``).

A (test, tag, kind)'s history lives in ``window_keyed`` (what every window changes), ``window_settled`` (the finished
runs), ``window_near`` (their windows near the steps being checked) and the bag ``window_log`` (the open runs'
windows). Driven as a runner drives the stage (``bench.bench_ordered.OneKey``: state kept as bytes between calls),
against the same machine with its whole history in one cell, as before the parts:

- the same outputs after every firing, and the parts joined are the one cell's history, whatever the arrival
  order (late windows included), with trailing checks, failed runs, dismisses and accepts;
- the finished runs are written only by a firing that steps a run's end or a triage action, and read by another
  only when its windows leave the near view (which it then writes);
- a key whose history is in the one cell (an updated job's; a seed's) is moved into the parts by its first firing.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import os
import random
from typing import Any, Counter, List, Optional, Tuple

import pytest
from apache_beam.utils.timestamp import Timestamp

from bench.bench_ordered import OneKey
from core import encoding
from core.config import ConfigSet, parse_test_config
from core.history import SeededState
from core.schema import DEAD_LETTER
from core.triage import TriageItem
from core.vocabulary import AlertKind, RunStatus, TriageAction
from core.window_checks import (
    RunEnded,
    WindowHistory,
    by_segment,
    is_whole,
    put_back_logged,
    settles,
    window_triage_targets,
)
from core.windows import WindowResult
from tests.support import REPO_ROOT, T0
from tests.transforms.test_ordered import plain
from transforms.ordered import bucket_end, in_event_time_order
from transforms.window_checks import WindowCheckMachine

TEST, TAG = "cifar", "loss"
KEY = (TEST, TAG, "count")
BUCKET = 10.0
LAG = 20.0  # the watermark behind the latest arrival; items come up to 30 s after their time: some are late

STEP_ALIGNED = {"aggregation": "mean", "history": "step_aligned", "history_runs": 3,
                "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
                              "wait_for_n_points_of_history": 2},
                "debounce": {"windows": 3, "out_of_bounds": 2}}
TRAILING = {"aggregation": "max", "history": "trailing", "trailing_windows": 3,
            "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 4},
                          "wait_for_n_points_of_history": 2}}


def configs(*checks) -> ConfigSet:
    return ConfigSet({TEST: parse_test_config({
        "regression_test_config": {"rebaseline_after": 2},
        "window_config": {"tags": {TAG: {"count": 30, "aggregations": ["mean", "max"], "checks": list(checks)}}},
    }, "parts.json")})


class OneCell:
    """The window machine without its parts: its whole history in ``window_keyed``, as before them."""

    def __init__(self, machine: WindowCheckMachine):
        self.machine = machine

    def initial(self, key):
        return self.machine.initial(key)

    def step(self, state, item):
        return self.machine.step(state, item)

    def forget_at(self, state):
        return self.machine.forget_at(state)


class Poisoned(WindowCheckMachine):
    """Raises after stepping some windows and a run's end (the state changed): they are dead letters."""

    def step(self, state, item):
        alerts = list(super().step(state, item))
        if isinstance(item, RunEnded) and item.run == "r2" or getattr(item, "index", None) in (4, 17):
            raise RuntimeError("injected")
        return alerts


def keys(checks, machine_type=WindowCheckMachine) -> Tuple[OneKey, OneKey]:
    """(the key with its history in parts, the same with one cell)."""
    machine = machine_type(configs(*checks))
    return (OneKey(in_event_time_order(machine, "window", True, BUCKET), KEY),
            OneKey(in_event_time_order(OneCell(machine), "window", True, BUCKET), KEY))


def windows_of(run: str, start: float, count: int, scale: float, rng: random.Random) -> List[WindowResult]:
    """``count`` windows of 30 steps, 5 s apart, on a slow curve times ``scale``; a window now and then without
    steps, and one whose steps restart."""
    windows = []
    for i in range(count):
        steps = (30 * i, 30 * i + 29) if i % 11 != 7 else ((None, None) if i % 2 else (30 * i + 29, 5))
        mean = scale * (1.0 + 10.0 / (i + 5)) + rng.gauss(0, 0.01)
        windows.append(WindowResult(TEST, run, TAG, "count", i, start + 5 * i, start + 5 * i + 5, steps[0],
                                    steps[1], 30, False, {"mean": mean, "max": mean * (1.5 if i == 13 else 1.1)}))
    return windows


def workload(seed: int, typed: bool = False) -> List[Any]:
    """Nine runs, two or three at a time: one failed, two a level higher (a dismiss of a window of the first, an
    accept of the second before it ends), one longer than the others; ``typed``: the runs on two machine types
    (``history_by``), each type's windows with their segment."""
    rng = random.Random(seed)
    items: List[Any] = []
    for r in range(9):
        run, start = f"r{r}", T0 + 70.0 * r
        count = 40 if r == 4 else 25
        segment = f"accelerator={'v4' if r % 3 == 1 else 'v5e'}" if typed else ""
        items += [dataclasses.replace(window, segment=segment)
                  for window in windows_of(run, start, count, 1.6 if r in (6, 7) else 1.0, rng)]
        status = RunStatus.FAILURE if r == 3 else RunStatus.SUCCESS
        items.append(RunEnded(TEST, run, status.value, start + 5 * count + 12, TAG, "count"))
    windows = configs(STEP_ALIGNED).for_test(TEST).windows
    for action in (TriageItem("dismiss", TEST, TriageAction.DISMISS.value, T0 + 70 * 6 + 60, "loss_mean", "r6",
                              alert_id="a", alert_kind=AlertKind.WINDOW_OUT_OF_BOUNDS.value, instance="count/3"),
                   TriageItem("accept", TEST, TriageAction.ACCEPT.value, T0 + 70 * 7 + 30, "loss_mean", "r7",
                              future=True)):
        items += window_triage_targets(action, windows)
    return items


def arrivals(items: List[Any], seed: int) -> List[Tuple[float, Any]]:
    rng = random.Random(seed)
    return sorted(((item.order[0] + rng.uniform(0, 30), item) for item in items), key=lambda a: a[0])


def joined(key: OneKey) -> WindowHistory:
    """The key's history, its parts put together (as one cell holds it: nothing counted as logged)."""
    history = key.state["keyed"].read()
    if history is None or is_whole(history):
        return history
    put_back_logged(history, key.state["log"].read())
    for segment, runs in by_segment(key.state["settled"].read()).items():
        history.part(segment).finished_runs = collections.deque(runs)
    for _, part in history.parts():
        for open_run in part.open_runs.values():
            open_run.logged = 0
    return history


def due(key: OneKey, at: Timestamp) -> List[Any]:
    """The pending items a firing at ``at`` steps."""
    return [item for item in key.state["pending"].read() if Timestamp.of(item.order[0]) <= at]


def fire_until(parts: OneKey, one: OneKey, watermark: float, seen: List[Any],
               tally: Optional[Counter] = None) -> None:
    """Fires both keys' timers up to ``watermark``: the same outputs (added to ``seen``), the same history after
    each firing; the finished runs written only by a firing that steps a run's end or a triage action (or moves a
    whole history into the parts), read by
    another only when it writes the near view anew (``tally``: firings, and reads of the finished runs by the
    others)."""
    tally = collections.Counter() if tally is None else tally
    while parts.timer.at is not None and float(parts.timer.at) <= watermark:
        assert one.timer.at == parts.timer.at
        settled, near = parts.state["settled"], parts.state["near"]
        stored = parts.state["keyed"].read()
        settling = any(settles(item) for item in due(parts, parts.timer.at)) or bool(stored and is_whole(stored))
        before, near_before, reads = settled.data, near.data, settled.reads
        outputs = plain(parts.fire())
        tally["firings"] += 1
        if not settling:
            assert settled.data is before, "finished runs written by a firing of windows only"
            assert settled.reads == reads or near.data is not near_before, "finished runs read, near view kept"
            tally["refills"] += settled.reads - reads
        assert outputs == plain(one.fire())
        seen += outputs
        assert encoding.encode(joined(parts)) == encoding.encode(one.state["keyed"].read())
        assert not is_whole(parts.state["keyed"].read())


@pytest.mark.parametrize("checks", [(STEP_ALIGNED,), (STEP_ALIGNED, TRAILING)], ids=["step-aligned", "and trailing"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_parts_give_what_one_cell_gives_and_write_the_finished_runs_only_when_they_change(checks, seed):
    parts, one = keys(checks)
    seen: List[Any] = []
    tally: Counter = collections.Counter()
    for at, item in arrivals(workload(seed), seed):
        fire_until(parts, one, at - LAG, seen, tally)
        assert plain(parts.add(item)) == plain(one.add(item)) == []
    fire_until(parts, one, float("inf"), seen, tally)
    assert parts.state["pending"].read() == [] and parts.timer.at is None
    kinds = collections.Counter(alert.kind for _, alert in seen)
    assert kinds[AlertKind.WINDOW_OUT_OF_BOUNDS] >= 1  # the workload alerts: what the comparison covers
    assert [f.run for f in parts.state["settled"].read()] == [f.run for f in one.state["keyed"].read().finished_runs]
    assert 0 < tally["refills"] < tally["firings"] / 2, tally  # the near view spares most reads of the finished runs


@pytest.mark.parametrize("seed", [1, 2])
def test_a_history_per_machine_type_gives_in_parts_what_one_cell_gives(seed):
    """With history_by, each type's finished runs, near view and open runs' windows are kept in the parts too (the
    settled and near parts by segment): the same outputs and history as one cell, the finished runs written only
    when they change and mostly not read."""
    parts, one = keys((STEP_ALIGNED, TRAILING))
    seen: List[Any] = []
    tally: Counter = collections.Counter()
    for at, item in arrivals(workload(seed, typed=True), seed):
        fire_until(parts, one, at - LAG, seen, tally)
        assert plain(parts.add(item)) == plain(one.add(item)) == []
    fire_until(parts, one, float("inf"), seen, tally)
    history = one.state["keyed"].read()
    assert set(history.segments) == {"accelerator=v4", "accelerator=v5e"} and not history.finished_runs
    assert [f.run for f in history.segments["accelerator=v4"].finished_runs] == ["r1", "r4", "r7"]
    settled = parts.state["settled"].read()
    assert {segment: [f.run for f in runs] for segment, runs in settled.items() if runs} == {
        segment: [f.run for f in part.finished_runs] for segment, part in history.segments.items()}
    assert not any(part.finished_runs for part in parts.state["keyed"].read().segments.values())
    assert any(alert.kind == AlertKind.WINDOW_OUT_OF_BOUNDS for _, alert in seen)
    assert 0 < tally["refills"] < tally["firings"] / 2, tally


def test_a_step_that_fails_leaves_the_parts_as_one_cell_is_left():
    """A window or run end whose step raises is a dead letter, and every part is as if it had not been there."""
    parts, one = keys((STEP_ALIGNED, TRAILING), Poisoned)
    seen: List[Any] = []
    for at, item in arrivals(workload(1), 1):
        fire_until(parts, one, at - LAG, seen)
        parts.add(item)
        one.add(item)
    fire_until(parts, one, float("inf"), seen)
    assert sum(tag == DEAD_LETTER.name for tag, _ in seen) == 9 * 2 + 1  # windows 4 and 17 of each run, r2's end
    assert "r2" not in [f.run for f in parts.state["settled"].read()]


def test_a_firing_of_step_aligned_windows_reads_neither_the_log_nor_the_finished_runs_while_near_covers_them():
    parts, _ = keys((STEP_ALIGNED,))
    items = workload(1)
    for item in sorted(items, key=lambda i: i.order)[:80]:  # three runs ended, the next ones' first windows
        parts.add(item)
    while parts.timer.at is not None and float(parts.timer.at) < T0 + 70 * 3 + 40:
        parts.fire()
    reads = {name: cell.reads for name, cell in parts.state.items()}
    window = next(i for i in sorted(items, key=lambda i: i.order)[80:] if isinstance(i, WindowResult)
                  and i.start_step is not None and parts.state["near"].read().covers(i, ["mean"]))
    parts.add(window)
    parts.fire(bucket_end(window.order[0], BUCKET))
    assert parts.state["settled"].reads == reads["settled"] and parts.state["log"].reads == reads["log"]
    logged = [entry for entry in parts.state["log"].read() if entry[1].run == window.run]
    assert logged[-1] == (len(logged) - 1, window)  # added once, after the run's earlier windows


def one_cell_key_until(checks, items: List[Any], watermark: float) -> OneKey:
    one = keys(checks)[1]
    for item in items:
        one.add(item)
    while one.timer.at is not None and float(one.timer.at) <= watermark:
        one.fire()
    return one


@pytest.mark.parametrize("checks", [(STEP_ALIGNED,), (STEP_ALIGNED, TRAILING)], ids=["step-aligned", "and trailing"])
def test_a_key_kept_in_one_cell_before_an_update_is_moved_into_the_parts_by_its_first_firing(checks):
    """An updated job meets the cells of the job before it: the whole history in ``window_keyed``, items pending.
    Its first firing reads that cell, writes the finished runs, the log and the live part, and from then on the
    key gives what it would have given in one cell."""
    items = sorted(workload(4), key=lambda i: i.order)
    cut = T0 + 70 * 4 + 50  # four runs ended, two open
    before = one_cell_key_until(checks, [i for i in items if i.order[0] < cut + 30], cut)
    whole = before.state["keyed"].read()
    assert is_whole(whole) and whole.finished_runs and any(o.windows for o in whole.open_runs.values())
    parts, one = keys(checks)
    for key in (parts, one):  # the old job's cells, as the new one finds them
        for name in ("keyed", "pending", "scheduled"):
            key.state[name].data = copy.copy(before.state[name].data)
        key.timer.at = before.timer.at
    assert parts.state["settled"].data is None and parts.state["log"].data == []
    seen: List[Any] = []
    fire_until(parts, one, cut + 15, seen)
    assert not is_whole(parts.state["keyed"].read())
    assert [f.run for f in parts.state["settled"].read()] == [f.run for f in whole.finished_runs]
    assert sorted((w.run, w.index) for _, w in parts.state["log"].read()) == sorted(
        (w.run, w.index) for o in one.state["keyed"].read().open_runs.values() for w in o.windows)
    for item in [i for i in items if i.order[0] >= cut + 30]:
        fire_until(parts, one, item.order[0] - LAG, seen)
        assert plain(parts.add(item)) == plain(one.add(item))
    fire_until(parts, one, float("inf"), seen)
    assert any(alert.kind == AlertKind.WINDOW_OUT_OF_BOUNDS for _, alert in seen)


@pytest.mark.parametrize("typed", [False, True], ids=["one history", "by machine type"])
def test_a_seeded_history_is_moved_into_the_parts_by_the_keys_first_firing(typed):
    items = sorted(workload(5, typed), key=lambda i: i.order)
    earlier = [i for i in items if isinstance(i, (WindowResult, RunEnded)) and i.run < "r3"]
    history = one_cell_key_until((STEP_ALIGNED,), earlier, float("inf")).state["keyed"].read()
    parts, one = keys((STEP_ALIGNED,))
    for key in (parts, one):
        key.add(SeededState(copy.deepcopy(history)))
    seen: List[Any] = []
    for item in [i for i in items if i not in earlier]:
        fire_until(parts, one, item.order[0] - LAG, seen)
        parts.add(item)
        one.add(item)
    fire_until(parts, one, float("inf"), seen)
    settled = by_segment(parts.state["settled"].read())
    whole = dict(one.state["keyed"].read().parts())
    assert {segment: [f.run for f in runs] for segment, runs in settled.items()} == {
        segment: [f.run for f in whole[segment].finished_runs] for segment in settled}
    assert set(settled) == ({"accelerator=v4", "accelerator=v5e", ""} if typed else {""})
    assert min(f.run for runs in settled.values() for f in runs) < "r3"


def test_the_v1_fixture_of_a_whole_window_history_in_one_cell_is_moved_into_the_parts():
    """A key written before the window checks kept their state in parts: its whole history in ``window_keyed``
    (state_v1's ``window_history``) moves into the parts at its first firing, and reads back whole."""
    with open(os.path.join(REPO_ROOT, "tests", "fixtures", "state_v1", "window_history.bin"), "rb") as f:
        data = f.read()
    old = encoding.decode(data)
    assert is_whole(old) and old.finished_runs and old.open_runs
    machine = WindowCheckMachine(ConfigSet({}))  # no config: windows are not checked, runs still end
    key = OneKey(in_event_time_order(machine, "window", True, BUCKET), KEY)
    key.state["keyed"].data = data
    ended = RunEnded(KEY[0], "r-new", "success", T0, KEY[1], KEY[2])  # an item to fire for
    key.add(ended)
    key.fire()
    assert [f.run for f in key.state["settled"].read()][:len(old.finished_runs)] == [
        f.run for f in old.finished_runs]
    assert len(key.state["log"].read()) == sum(len(o.windows) for o in old.open_runs.values())
    expected = copy.deepcopy(old)
    list(machine.step(expected, ended))
    assert encoding.encode(joined(key)) == encoding.encode(expected)
