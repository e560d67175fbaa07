"""Ordered-stage benchmark: what an item and a firing of ``transforms.ordered.in_event_time_order`` cost, against
how many items a key has pending.

The real DoFn of the metric check (``transforms.history``) runs on one key, its state kept as a runner keeps it
between bundles, in Beam's state API shapes: each cell and bag element as bytes of its spec's coder, decoded at
each read and encoded at each write (as FnApiRunner does with its state cache off, and Dataflow does for a key
that is not in its worker's cache), each call its own bundle. For each ``--pending`` count N, it prints:

- per item: ``process`` of one more item with N pending (the best of ``--repeat`` batches of ``--items``),
  beside what the layout before the bag cost, one cell of the machine state and every pending item read and
  written whole per item (the fields of that layout's one value, decoded, the item inserted in order, encoded);
- per firing: one streaming firing with N pending of which one is due (the bag is read and all but one put
  back), and one bounded firing that steps all N (``check_metric`` on each).

Then the snapshot a firing takes to undo a failing step, on a window-check history of ``--runs`` runs of
``--windows`` windows: one ``core.encoding`` encode per firing, against the pickle per item it replaced.

    python bench/bench_ordered.py [--pending 10 100 1000 10000] [--items 200] [--repeat 3]
                                  [--runs 5] [--windows 2000]
"""

from __future__ import annotations

import bisect
import inspect
import os
import pickle
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam
from apache_beam.transforms.userstate import BagStateSpec
from apache_beam.utils.timestamp import Timestamp

from bench.bench_state_coders import window_history
from bench.timing import best
from core import encoding
from core.config import ConfigSet, parse_test_config
from core.records import MetricObservation
from trainguard.cli import DASHES_NOTE, StrictArgumentParser
from transforms.coders import RecordCoder
from transforms.history import MetricMachine
from transforms.ordered import in_event_time_order

T0 = 1763596800.0
TEST, METRIC = "pt-cifar-tpu-v3-8", "Accuracy/test_final"
CONFIG = {"regression_test_config": {"metric_success_conditions": {METRIC: {
    "comparison": "greater", "success_threshold": {"stddevs_from_mean": 3}, "wait_for_n_points_of_history": 5}}}}


class CodedCell:
    """A ReadModifyWriteState kept as bytes between bundles: decoded at each read, encoded at each write."""

    def __init__(self, coder: beam.coders.Coder):
        self.coder = coder
        self.data: Optional[bytes] = None
        self.reads = 0

    def read(self) -> Any:
        self.reads += 1
        return None if self.data is None else self.coder.decode(self.data)

    def write(self, value: Any) -> None:
        self.data = self.coder.encode(value)

    def clear(self) -> None:
        self.data = None


class CodedBag:
    """A BagState kept as bytes between bundles: each added element encoded, every element decoded at a read."""

    def __init__(self, coder: beam.coders.Coder):
        self.coder = coder
        self.data: List[bytes] = []
        self.reads = 0

    def add(self, value: Any) -> None:
        self.data.append(self.coder.encode(value))

    def read(self) -> List[Any]:
        self.reads += 1
        return [self.coder.decode(data) for data in self.data]

    def clear(self) -> None:
        self.data = []


class Timer:
    """A watermark timer: when it is set to fire (None: not set)."""

    def __init__(self) -> None:
        self.at: Optional[Timestamp] = None

    def set(self, at: Timestamp) -> None:
        self.at = at

    def clear(self) -> None:
        self.at = None


def arguments(method: Callable, key: Any, cells: Dict[str, Any], timers: Dict[str, Any], at: Timestamp) -> Dict:
    """What a runner passes a DoFn method besides its element: state cells and timers by spec name, the key, the
    element's (or the firing's) timestamp."""
    passed = {}
    for name, parameter in inspect.signature(method).parameters.items():
        default = parameter.default
        if getattr(default, "state_spec", None) is not None:
            passed[name] = cells[default.state_spec.name]
        elif getattr(default, "timer_spec", None) is not None:
            passed[name] = timers[default.timer_spec.name]
        elif default is beam.DoFn.KeyParam:
            passed[name] = key
        elif default is beam.DoFn.TimestampParam:
            passed[name] = at
    return passed


class OneKey:
    """The DoFn of ``in_event_time_order`` driven for one key as a runner drives it, its state and timer in
    stand-ins (``state`` by the spec's short name: ``keyed``, ``pending``, ``scheduled``, and a machine's cells kept
    apart: ``settled``, ``near``, ``log``)."""

    def __init__(self, fn: beam.DoFn, key: Any):
        self.fn = fn
        self.key = key
        self.params: Dict[str, Any] = {}
        self.state: Dict[str, Any] = {}
        self.timer = Timer()
        for name, parameter in {**inspect.signature(fn.process).parameters,
                                **inspect.signature(fn.on_flush).parameters}.items():
            spec = getattr(parameter.default, "state_spec", None)
            if spec is not None:
                stand_in = CodedBag(spec.coder) if isinstance(spec, BagStateSpec) else CodedCell(spec.coder)
                self.params[name] = self.state[spec.name.rsplit("_", 1)[1]] = stand_in
            elif getattr(parameter.default, "timer_spec", None) is not None:
                self.params[name] = self.timer
        # Looked up once: a signature per call would cost several times the ``process`` it measures.
        self._process_params = self._params(fn.process)
        self._flush_params = self._params(fn.on_flush)

    def _params(self, method: Callable) -> Dict[str, Any]:
        """The state and timer stand-ins ``method`` takes, by parameter name."""
        return {name: self.params[name] for name in inspect.signature(method).parameters if name in self.params}

    def add(self, item: Any) -> List[Any]:
        """``process`` of one element (an item, or a ``SeededState``): its outputs."""
        return list(self.fn.process((self.key, item), **self._process_params))

    def saved(self) -> Dict[str, Any]:
        """The key's state and timer as they are, for ``restore``."""
        return {"timer": self.timer.at, **{name: list(cell.data) if isinstance(cell, CodedBag) else cell.data
                                            for name, cell in self.state.items()}}

    def restore(self, saved: Dict[str, Any]) -> None:
        self.timer.at = saved["timer"]
        for name, cell in self.state.items():
            cell.data = list(saved[name]) if isinstance(cell, CodedBag) else saved[name]

    def fire(self, at: Optional[Timestamp] = None) -> List[Any]:
        """The flush timer fires (at ``at``, else where it is set): its outputs."""
        fired_at = self.timer.at if at is None else at
        assert fired_at is not None, "no timer set"
        if at is None:
            self.timer.clear()
        return list(self.fn.on_flush(key=self.key, fired_at=fired_at, **self._flush_params))


def observations(count: int, start: float = T0) -> List[MetricObservation]:
    """``count`` runs' values of one metric, a minute apart."""
    return [MetricObservation(TEST, f"run-{i:06d}", METRIC, 75.0 + (i % 7) * 0.1, 1000, "success",
                              start + 60 * i - 5, start + 60 * i) for i in range(count)]


def metric_key(streaming: bool) -> OneKey:
    configs = ConfigSet({TEST: parse_test_config(CONFIG, "bench.json")})
    return OneKey(in_event_time_order(MetricMachine(configs), "metric", streaming, 0), (TEST, METRIC))


def old_layout_item(keyed: Dict[str, Any], item: MetricObservation, coder: RecordCoder) -> None:
    """What ``process`` did per item before the bag: read the whole cell, insert the item, write it back."""
    state = coder.decode(coder.encode(keyed))
    bisect.insort(state["pending"], item, key=lambda i: i.order)
    coder.encode(state)


def process_seconds(key: OneKey, items: List[MetricObservation]) -> float:
    """The time ``process`` takes for ``items``, each with the key as it is now: after each, untimed, the item
    is taken out of the bag again and the timer put back (a copy of the bag would disturb the timing)."""
    bag, scheduled, total = key.state["pending"], key.state["scheduled"], 0.0
    count, saved, timer = len(bag.data), scheduled.data, key.timer.at
    for item in items:
        start = time.perf_counter()
        key.add(item)
        total += time.perf_counter() - start
        del bag.data[count:]
        scheduled.data, key.timer.at = saved, timer
    return total


def firing_seconds(key: OneKey, at: Optional[Timestamp], repeat: int) -> Tuple[float, int]:
    """The best of ``repeat`` firings of the key as it is now (restored after each): seconds, and how many
    outputs a firing gave."""
    saved, times, outputs = key.saved(), [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        outputs = len(key.fire(at))
        times.append(time.perf_counter() - start)
        key.restore(saved)
    return min(times), outputs


def with_pending(streaming: bool, items: List[MetricObservation]) -> OneKey:
    key = metric_key(streaming)
    for item in items:
        key.add(item)
    return key


def per_item_row(pending: int, items: int, repeat: int) -> str:
    """One row of the first table: the costs with ``pending`` items waiting."""
    waiting = observations(pending + items)
    process_s = min(process_seconds(with_pending(True, waiting[:pending]), waiting[pending:]) for _ in range(repeat))
    keyed, coder = {"machine_state": None, "pending": waiting[:pending], "scheduled_micros": None}, RecordCoder()
    old_s, _ = best(repeat, lambda: [old_layout_item(keyed, item, coder) for item in waiting[pending:]])
    one_due_s, outputs = firing_seconds(with_pending(True, waiting[:pending]),
                                        Timestamp.of(waiting[0].finalized_at), repeat)
    assert outputs == 1, outputs
    all_due_s, outputs = firing_seconds(with_pending(False, waiting[:pending]), None, repeat)
    assert outputs == pending, outputs
    return (f"| {pending:,} | {process_s / items * 1e6:,.1f} | {old_s / items * 1e6:,.1f} | "
            f"{one_due_s * 1e3:,.2f} | {all_due_s * 1e3:,.1f} | {all_due_s / pending * 1e6:,.1f} |")


def snapshot_row(runs: int, windows: int, items: int, repeat: int) -> str:
    history = window_history(runs, windows)
    encode_s, data = best(repeat, lambda: encoding.encode(history))
    pickle_s, _ = best(repeat, lambda: pickle.dumps(history, pickle.HIGHEST_PROTOCOL))
    return (f"| {runs} runs x {windows:,} windows ({len(data):,} bytes) | {encode_s * 1e3:,.1f} | "
            f"{pickle_s * items * 1e3:,.1f} ({items} x {pickle_s * 1e3:,.2f}) |")


def main(argv=None) -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--pending", type=int, nargs="+", default=[10, 100, 1000, 10000],
                        help="how many items a key has pending, one measure each")
    parser.add_argument("--items", type=int, default=200, help="items per timed batch of process calls")
    parser.add_argument("--repeat", type=int, default=3, help="timed batches per measure (the best is shown)")
    parser.add_argument("--runs", type=int, default=5, help="runs of the window history of the snapshot measure")
    parser.add_argument("--windows", type=int, default=2000, help="windows per run of that history")
    args = parser.parse_args(argv)
    print("| pending items | process, µs per item | before the bag, µs per item | streaming firing, one due, ms "
          "| bounded firing, all due, ms | same, µs per item |")
    print("|---:|---:|---:|---:|---:|---:|")
    for pending in args.pending:
        print(per_item_row(pending, args.items, args.repeat))
    print()
    print(f"| state snapshot of a firing of {args.items} items | one encode per firing, ms | a pickle per item "
          "(before), ms |")
    print("|---|---:|---:|")
    print(snapshot_row(args.runs, args.windows, args.items, args.repeat))


if __name__ == "__main__":
    main()
