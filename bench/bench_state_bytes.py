"""State-bytes benchmark: what the streaming job reads and writes in keyed state, and sends through its shuffles,
per message and per point, stage by stage, with the monthly cost that follows.

The stateful stages of the streaming graph (``pipeline/graph.py`` with ``--streaming``: ``Deduplicate``,
``AssembleRuns``, ``LiveWindows``, ``CheckMetrics``, ``CheckRuns``, ``LiveWindows/Checks``, ``Triage``) run on
their real DoFns, in graph order, each key driven as a runner drives it: every state cell is kept as bytes between
calls (``bench.bench_ordered``'s stand-ins: decoded at each read, encoded at each write, as a runner without a
state cache does) and counted here, bytes read and written; every element that enters a stage crosses a shuffle
and is encoded with the coder the graph gives it (a windowed value of the ``with_output_types`` KV); each call
(one element of one key, or one timer firing) is one work item. Timers fire as the watermark (the wall clock less
``--watermark_lag_seconds``) passes them, earliest first, each at its own time, as on Dataflow; the settle timers
of the windows in buckets of ``RunLifecycle.timer_bucket_seconds``. Every stage sees the same watermark (a
downstream stage's timers may fire earlier than Dataflow's held watermark lets them; the counts are the same).

Workload: ``--runs`` concurrent runs of a run-level-only test and as many of a windowed test, each run
``--messages`` messages of ``--points`` points (``--tags`` tags, a step per ``--step_seconds``, one point per
tag and step, trainguard/v1.1 columns as the trainer sends them) and a ``run_finished`` message. The windowed
test has count windows of ``--window_count`` points on every tag (aggregations mean, min, max, p90; the README's
live-windows example on ``--tags`` tags), ``--allowed_lateness_seconds`` 60, ``stall_seconds`` 600, and
step-aligned checks (5 runs) on ``--checked_tags`` of them, whose history holds ``--history_runs`` earlier runs
as long as these (given as a restarted job's seed gives it, uncounted; its move into the window checks' parts
at each key's first firing is counted; the metric and job checks start empty: their state is small). A message reaches the job ``--publish_delay_seconds`` after its latest point; the job
ends with the watermark a week past the last run, so every run's end, tombstone and expiry are in the counts.

Prints, per stage and test: state bytes read and written per message (per 1,000-point message: bytes per point
x ``--points``) and per point, work items and timer firings per message, bytes entering the stage through its
shuffle, and CPU of the stage's code; then the same per state cell, where the live-windows value's bytes are, what
crosses each shuffle (and how much of it is raw payload), and the monthly cost of ``--fleet`` concurrent runs
(``PRICES``; workers sized from the CPU measured here plus ``--work_item_ms`` per work item, an assumption).

    python bench/bench_state_bytes.py [--runs 3] [--messages 48] [--history_runs 10] [--quick]
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
import math
import os
import random
import struct
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, get_dofn_specs
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from bench.bench_ordered import CodedBag, CodedCell, arguments
from core import encoding
from core.alert_details import finish_alert
from core.config import ConfigSet, parse_test_config, ranks_matter
from core.history import SeededState
from core.parse import MessageSummary, RawMessage
from core.records import MetricObservation, job_history_row, window_row
from core.runs import BACKFILL_LAG_SECONDS, RunLifecycle, RunResult, effective_rank
from core.schema import ALERTS, DEAD_LETTER
from core.triage import RaisedAlert
from core.window_checks import RunEnded, seed_window_history
from core.windows import WindowPoint, WindowResult, window_aggregates
from trainguard import wire
from trainguard.cli import DASHES_NOTE, StrictArgumentParser
from transforms.backfills import AssembleRunOrBackfillFn
from transforms.coders import AnyRecord
from transforms.history import JobMachine, MetricMachine
from transforms.ordered import in_event_time_order
from transforms.parse import FirstPerKeyFn, ParseMessageFn, SummarizeMessageFn
from transforms.runs import INTERRUPTED, without_window_points
from transforms.triage import LedgerMachine
from transforms.window_checks import WindowCheckMachine
from transforms.window_state import PackedRunWindows
from transforms.windows import WindowRunFn, without_payload

T0 = 1763596800.0  # 2025-11-20T00:00:00Z
RUN_LEVEL, WINDOWED = "bench-run-level", "bench-windowed"
KINDS = {RUN_LEVEL: "run-level", WINDOWED: "windowed"}
HISTORY_RUN = "history"  # the seeded history's runs are named history-NNN
STAGGER_SECONDS = 7.3  # between the starts of concurrent runs (their buckets differ)
MONTH_HOURS = 730.0

# List prices, us-central1, USD. Dataflow: https://cloud.google.com/dataflow/pricing, "Default" table of streaming
# workers and Streaming Engine, as transcribed on 2026-09-08 (the stored copy of the page does not render its
# tables; the same figures in a transcription "as of 2026-06"). Pub/Sub: https://cloud.google.com/pubsub/pricing
# (stored copy, undated): $40 per TiB of publish and of delivery, the first 10 GiB a month free. BigQuery streaming
# inserts (run_dataflow.sh's default write method): $0.01 per 200 MB, each row billed as at least 1 KB
# (https://cloud.google.com/bigquery/pricing, stored copies). Storage Write API: $0.025 per GiB, the first 2 TiB a
# month free (help.nops.io's BigQuery page, stored 2026; the stored copies of Google's page predate the API).
PRICES = {
    "streaming_vcpu_hour": 0.069,
    "streaming_gib_hour": 0.003557,
    "pd_gib_hour": 0.000054,
    "streaming_engine_gib": 0.018,          # legacy data-processed billing: the job's (no resource-based option)
    "streaming_engine_compute_unit_hour": 0.089,
    "pubsub_tib": 40.0,
    "pubsub_free_gib": 10.0,
    "bigquery_write_gib": 0.025,
    "bigquery_write_free_gib": 2048.0,
    "bigquery_insert_gib": 0.01 * 1024 / 200,  # $0.01 per 200 MB
}
BIGQUERY_INSERT_MIN_ROW_BYTES = 1024  # streaming inserts bill each row as at least 1 KB
WORKER = {"name": "n2-standard-2", "vcpus": 2, "gib": 8.0, "disk_gib": 30.0}  # run_dataflow.sh's default


# -- the configs ------------------------------------------------------------------------------------------------


def tag_names(count: int) -> List[str]:
    return [f"metric/{i:02d}" for i in range(count)]


def bench_configs(tags: int, window_count: int, checked_tags: int, lateness: float = 60.0) -> ConfigSet:
    """The run-level test (every tag's final value and average checked against history) and the windowed test
    (the same, plus count windows on every tag, ``checked_tags`` of them checked step-aligned)."""
    run_level = {
        "metric_collection_config": {"default_aggregation_strategies": ["final", "average"]},
        "regression_test_config": {"metric_success_conditions": {"default": {
            "comparison": "less_or_equal", "success_threshold": {"stddevs_from_mean": 6},
            "wait_for_n_points_of_history": 3}}}}
    check = {"aggregation": "mean", "history": "step_aligned", "history_runs": 5,
             "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 6},
                           "wait_for_n_points_of_history": 3},
             "debounce": {"windows": 3, "out_of_bounds": 2}}
    windowed = dict(run_level, window_config={
        "allowed_lateness_seconds": lateness, "stall_seconds": 600,
        "tags": {tag: {"count": window_count, "aggregations": ["mean", "min", "max", "p90"],
                       **({"checks": [check]} if i < checked_tags else {})}
                 for i, tag in enumerate(tag_names(tags))}})
    return ConfigSet({RUN_LEVEL: parse_test_config(run_level, f"{RUN_LEVEL}.json"),
                      WINDOWED: parse_test_config(windowed, f"{WINDOWED}.json")})


# -- the workload -------------------------------------------------------------------------------------------------


class Arrival(NamedTuple):
    at: float        # by the wall clock
    payload: bytes
    points: int


SIX_DIGITS, FLOAT32 = "six_digits", "float32"


def point_value(rng: random.Random, tag_index: int, step: int, values: str = SIX_DIGITS) -> float:
    """A tag's value at a step: a slow curve and noise, to six significant digits (a logger's ``%.6g``) or as a
    float32 (``loss.item()`` of a float32 tensor, TensorBoard's scalars)."""
    value = (1.0 + tag_index) * (1.0 + math.exp(-step / 2000.0)) + rng.gauss(0.0, 0.01)
    if values == FLOAT32:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    return float(f"{value:.6g}")


def run_messages(test: str, run: str, start: float, messages: int, points: int, tags: int,
                 step_seconds: float, publish_delay: float, seed: int, values: str = SIX_DIGITS) -> List[Arrival]:
    """One run's messages as a trainer sends them: ``points // tags`` steps each, every tag once a step, values
    on slow curves (``point_value``), v1.1 columns; the first carries ``run_started``, a last one
    ``run_finished``."""
    rng = random.Random(f"{seed}/{test}/{run}")
    names = tag_names(tags)
    steps = max(1, points // tags)
    arrivals, latest = [], start
    for m in range(messages):
        batch = []
        for step in range(m * steps, (m + 1) * steps):
            at = start + 0.5 + step * step_seconds
            for i, tag in enumerate(names):
                batch.append(wire.point_dict(tag, point_value(rng, i, step, values), round(at, 3), step))
            latest = at
        events = [wire.event_dict(wire.RUN_STARTED, start, {"host": "bench"})] if m == 0 else []
        payload = wire.encode_message(test, run, batch, events, message_id=f"{test}/{run}/{m}",
                                      schema=wire.SCHEMA_V1_1)
        arrivals.append(Arrival(latest + publish_delay, payload, len(batch)))
    end = latest + 5.0
    finished = wire.event_dict(wire.RUN_FINISHED, end, {"status": "success", "num_failures": 0})
    arrivals.append(Arrival(end + publish_delay, wire.encode_message(
        test, run, events=[finished], message_id=f"{test}/{run}/finished"), 0))
    return arrivals


def wave(prefix: str, runs: int, start: float, args) -> List[Arrival]:
    arrivals = []
    for r in range(runs):
        for test in (RUN_LEVEL, WINDOWED):
            arrivals += run_messages(test, f"{prefix}-{r:03d}", start + r * STAGGER_SECONDS, args.messages,
                                     args.points, args.tags, args.step_seconds, args.publish_delay_seconds,
                                     args.seed, args.values)
    return sorted(arrivals, key=lambda a: a.at)


def pubsub_bytes(payload: bytes) -> int:
    """What Pub/Sub bills for one message: its data, its attributes (keys and values), 20 bytes of timestamp and
    its message id (16 digits here)."""
    message, _ = wire.parse_message(payload)
    attributes = wire.message_attributes(message.test, message.run, int(message.event_time * 1000), message.id,
                                         wire.SCHEMA_V1_1)
    return len(payload) + sum(len(k) + len(v) for k, v in attributes.items()) + 20 + 16


# -- counting stand-ins -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    reads: int = 0
    read_bytes: int = 0
    writes: int = 0            # a cell's write, or an element added to a bag
    written_bytes: int = 0
    clears: int = 0
    decode_seconds: float = 0.0  # CPU of decoding what it read
    encode_seconds: float = 0.0  # CPU of encoding what it wrote

    @property
    def coding_seconds(self) -> float:
        return self.decode_seconds + self.encode_seconds


class Meter:
    """Every count of the run, by (stage, test) and (stage, test, cell); off while the history is seeded."""

    def __init__(self) -> None:
        self.on = False
        self.cells: Dict[Tuple[str, str, str], Tally] = collections.defaultdict(Tally)
        self.firings: Dict[Tuple[str, str], int] = collections.Counter()
        self.firings_by_timer: Dict[Tuple[str, str, str], int] = collections.Counter()
        self.elements: Dict[Tuple[str, str], int] = collections.Counter()
        self.timer_sets: Dict[Tuple[str, str], int] = collections.Counter()
        self.shuffled: Dict[Tuple[str, str], int] = collections.Counter()
        self.shuffled_payload: Dict[Tuple[str, str], int] = collections.Counter()
        self.shuffled_window_points: Dict[Tuple[str, str], int] = collections.Counter()
        self.cpu: Dict[Tuple[str, str], float] = collections.Counter()
        self.shuffle_cpu = 0.0
        self.windows_parts: Dict[str, int] = collections.Counter()  # live windows' run_windows, by part
        self.bigquery: Dict[Tuple[str, str], int] = collections.Counter()  # (table, test) -> JSON bytes
        self.bigquery_billed: Dict[Tuple[str, str], int] = collections.Counter()  # as streaming inserts bill them
        self.pubsub: Dict[str, int] = collections.Counter()
        self.messages: Dict[str, int] = collections.Counter()
        self.points: Dict[str, int] = collections.Counter()

    def tally(self, stage: str, test: Optional[str], cell: str) -> Optional[Tally]:
        return self.cells[(stage, test, cell)] if self.on and test is not None else None


class CountingCell(CodedCell):
    """A ``CodedCell`` that counts the bytes it reads and writes into its stage's ``Tally``."""

    def __init__(self, coder: beam.coders.Coder, tally: Callable[[], Optional[Tally]],
                 on_write: Optional[Callable[[Any, int], None]] = None):
        super().__init__(coder)
        self._tally = tally
        self._on_write = on_write

    def read(self) -> Any:
        started = time.process_time()
        value = super().read()
        tally = self._tally()
        if tally is not None:
            tally.reads += 1
            tally.read_bytes += len(self.data or b"")
            tally.decode_seconds += time.process_time() - started
        return value

    def write(self, value: Any) -> None:
        started = time.process_time()
        super().write(value)
        tally = self._tally()
        if tally is not None:
            tally.writes += 1
            tally.written_bytes += len(self.data)
            tally.encode_seconds += time.process_time() - started
            if self._on_write is not None:
                self._on_write(value, len(self.data))

    def clear(self) -> None:
        super().clear()
        tally = self._tally()
        if tally is not None:
            tally.clears += 1


class CountingBag(CodedBag):
    """A ``CodedBag`` that counts: a read reads every element, an add writes one."""

    def __init__(self, coder: beam.coders.Coder, tally: Callable[[], Optional[Tally]]):
        super().__init__(coder)
        self._tally = tally

    def add(self, value: Any) -> None:
        started = time.process_time()
        super().add(value)
        tally = self._tally()
        if tally is not None:
            tally.writes += 1
            tally.written_bytes += len(self.data[-1])
            tally.encode_seconds += time.process_time() - started

    def read(self) -> List[Any]:
        started = time.process_time()
        values = super().read()
        tally = self._tally()
        if tally is not None:
            tally.reads += 1
            tally.read_bytes += sum(len(item) for item in self.data)
            tally.decode_seconds += time.process_time() - started
        return values

    def clear(self) -> None:
        super().clear()
        tally = self._tally()
        if tally is not None:
            tally.clears += 1


class WatermarkTimer:
    """A key's event-time timer: when it fires (None: not set); each set is counted, and queued in its stage."""

    def __init__(self, stage: KeyedStage, key: Any, name: str, test: Optional[str]):
        self.fires: Optional[Timestamp] = None
        self._stage, self._key, self._name, self._test = stage, key, name, test

    def set(self, at) -> None:
        self.fires = Timestamp.of(at)
        self._stage.queue(self.fires, self._key, self._name, self._test)

    def clear(self) -> None:
        self.fires = None


class Out(NamedTuple):
    tag: Optional[str]  # None: the main output
    value: Any
    at: float           # its event time


def outputs_of(results: Optional[Iterable[Any]], at: float) -> List[Out]:
    outputs = []
    for result in results or ():
        tag = None
        if isinstance(result, beam.pvalue.TaggedOutput):
            tag, result = result.tag, result.value
        when = at
        if isinstance(result, beam.window.TimestampedValue):
            when, result = float(result.timestamp), result.value
        outputs.append(Out(tag, result, when))
    return outputs


class KeyedStage:
    """One stateful DoFn of the graph: its keys with counting state stand-ins and timers, its input shuffle coder.

    ``test_of(key)`` names the test a key belongs to (what its counts are filed under)."""

    def __init__(self, name: str, fn: beam.DoFn, element_type, meter: Meter,
                 test_of: Callable[[Any], Optional[str]], on_write: Optional[Dict[str, Callable]] = None):
        self.name = name
        self.fn = fn
        self.meter = meter
        self.test_of = test_of
        self.on_write = on_write or {}
        self.state_specs, self.timer_specs = get_dofn_specs(fn)
        assert all(spec.time_domain == TimeDomain.WATERMARK for spec in self.timer_specs), name
        self.callbacks = {spec.name: getattr(fn, spec._attached_callback.__name__) for spec in self.timer_specs}
        self.coder = beam.coders.WindowedValueCoder(beam.coders.registry.get_coder(element_type),
                                                    beam.coders.coders.GlobalWindowCoder())
        self.keys: Dict[Any, Tuple[Dict[str, Any], Dict[str, WatermarkTimer], Optional[str]]] = {}
        self.by_repr: Dict[str, Any] = {}
        self.due: List[Tuple[int, str, str]] = []  # a heap of (micros, repr(key), timer) as set; stale ones skipped

    def queue(self, fires: Timestamp, key: Any, name: str, test: Optional[str]) -> None:
        self._count(self.meter.timer_sets, test)
        heapq.heappush(self.due, (fires.micros, repr(key), name))

    def _key(self, key: Any):
        if key not in self.keys:
            test = self.test_of(key)
            tally = {spec.name: (lambda cell=spec.name: self.meter.tally(self.name, test, cell))
                     for spec in self.state_specs}
            hooks = {name: (lambda value, size, hook=hook: hook(value, size, self.name, test))
                     for name, hook in self.on_write.items()}
            cells = {spec.name: CountingBag(spec.coder, tally[spec.name]) if isinstance(spec, BagStateSpec)
                     else CountingCell(spec.coder, tally[spec.name], hooks.get(spec.name))
                     for spec in self.state_specs}
            timers = {spec.name: WatermarkTimer(self, key, spec.name, test) for spec in self.timer_specs}
            self.keys[key] = (cells, timers, test)
            self.by_repr[repr(key)] = key
        return self.keys[key]

    def _count(self, counter, test: Optional[str], amount: float = 1) -> None:
        if self.meter.on and test is not None:
            counter[(self.name, test)] += amount

    def process(self, key: Any, value: Any, at: float) -> List[Out]:
        """One element of ``key`` at event time ``at`` (encoded and decoded as its shuffle does): its outputs."""
        cells, timers, test = self._key(key)
        started = time.process_time()
        encoded = self.coder.encode(WindowedValue((key, value), Timestamp.of(at), [GlobalWindow()]))
        key, value = self.coder.decode(encoded).value
        shuffle_cpu = time.process_time() - started
        if self.meter.on and test is not None:
            self.meter.shuffle_cpu += shuffle_cpu
        self._count(self.meter.shuffled, test, len(encoded))
        if isinstance(value, MessageSummary):
            self._count(self.meter.shuffled_payload, test, len(value.payload))
            if value.window_points and self.meter.on and test is not None:
                self._count(self.meter.shuffled_window_points, test, len(encoding.encode(value.window_points)))
        self._count(self.meter.elements, test)
        started = time.process_time()
        outputs = outputs_of(self.fn.process((key, value), **arguments(
            self.fn.process, key, cells, timers, Timestamp.of(at))), at)
        self._count(self.meter.cpu, test, time.process_time() - started)
        return outputs

    def advance(self, watermark: float) -> List[Out]:
        """The watermark moves to ``watermark``: every timer it passes fires, the earliest first (those set by the
        firings too), each at its own time; their outputs."""
        outputs: List[Out] = []
        limit = Timestamp.of(watermark).micros
        while self.due and self.due[0][0] <= limit:
            micros, shown, name = heapq.heappop(self.due)
            key = self.by_repr[shown]
            cells, timers, test = self.keys[key]
            fires = timers[name].fires
            if fires is None or fires.micros != micros:
                continue  # set again since, or cleared
            timers[name].clear()
            self._count(self.meter.firings, test)
            if self.meter.on and test is not None:
                self.meter.firings_by_timer[(self.name, test, name)] += 1
            method = self.callbacks[name]
            started = time.process_time()
            outputs += outputs_of(method(**arguments(method, key, cells, timers, fires)), float(fires))
            self._count(self.meter.cpu, test, time.process_time() - started)
        return outputs


# -- the graph ----------------------------------------------------------------------------------------------------


def _test_of_id(message_id: str) -> str:
    return message_id.split("/")[0]


def _test_of_first(key: Any) -> str:
    return key if isinstance(key, str) else key[0]


STAGES = ("Deduplicate", "AssembleRuns", "LiveWindows", "CheckMetrics", "CheckRuns", "LiveWindows/Checks", "Triage")
PARSE = "Parse, Summarize"


class StreamingGraph:
    """The streaming graph's path from a payload to rows and alerts, with its stateful stages as ``KeyedStage``s.

    Stateless steps (``SkipStoredRuns`` with an empty store, the filters and key functions, the rows) are done
    inline, as the graph does them between the shuffles."""

    def __init__(self, configs: ConfigSet, lifecycle: RunLifecycle, meter: Meter, clock: Callable[[], float]):
        self.configs = configs
        self.meter = meter
        bucket = lifecycle.timer_bucket_seconds
        kv = beam.typehints.KV
        tuple_of = beam.typehints.Tuple
        self.parse = ParseMessageFn()
        self.parse.start_bundle()
        self.summarize = SummarizeMessageFn(configs)
        self.stages = {
            "Deduplicate": KeyedStage("Deduplicate", FirstPerKeyFn(Duration(seconds=lifecycle.dedup_horizon_seconds)),
                                      kv[str, AnyRecord], meter, _test_of_id),
            "AssembleRuns": KeyedStage("AssembleRuns", AssembleRunOrBackfillFn(
                configs, lifecycle, interruptions=True, clock=clock), kv[tuple_of[str, str], AnyRecord], meter,
                _test_of_first),
            "LiveWindows": KeyedStage("LiveWindows", WindowRunFn(configs, lifecycle, streaming=True, clock=clock),
                                      kv[tuple_of[str, str, int], MessageSummary], meter, _test_of_first,
                                      on_write={WindowRunFn.STATE.name: self._windows_parts}),
            "CheckMetrics": KeyedStage("CheckMetrics", in_event_time_order(MetricMachine(configs), "metric", True,
                                                                           bucket),
                                       kv[tuple_of[str, str], AnyRecord], meter, _test_of_first),
            "CheckRuns": KeyedStage("CheckRuns", in_event_time_order(JobMachine(configs), "job", True, bucket),
                                    kv[str, RunResult], meter, _test_of_first),
            "LiveWindows/Checks": KeyedStage("LiveWindows/Checks", in_event_time_order(
                WindowCheckMachine(configs), "window", True, bucket),
                kv[tuple_of[str, str, str], AnyRecord], meter, _test_of_first),
            "Triage": KeyedStage("Triage", in_event_time_order(LedgerMachine(configs), "triage", True, bucket),
                                 kv[str, AnyRecord], meter, _test_of_first),
        }
        self.dead_letters: List[Out] = []
        self.runs: List[RunResult] = []
        self.windows: List[Tuple[Any, int]] = []

    def _windows_parts(self, run_windows, size: int, stage: str, test: str) -> None:
        """Where a written ``run_windows`` value's bytes are: what the value loses without each part of every tag's
        windows (emptied for a moment), and what is left without all three. Its time is not the stage's. The
        emitted windows' part is what the value keeps of them: since the bags of closed windows
        (``WindowRunFn._stash``), their index, end and last point (``kept``) and where they are (``stored``)."""
        started = time.process_time()
        run_windows = run_windows.unpack()
        tags = list(run_windows.tags.values())
        saved = [(w.emitted, w.kept, w.open, w.open_by_index, w.pending) for w in tags]
        stored = run_windows.stored
        parts: Dict[str, int] = collections.Counter()
        emptied = {"emitted": ("emitted", {}), "open": ("open", []), "pending": ("pending", [])}
        for part, (field, empty) in emptied.items():
            for w in tags:
                setattr(w, field, type(empty)())
                if part == "open":
                    w.open_by_index = {}
                if part == "emitted":
                    w.kept, run_windows.stored = {}, {}
            parts[part] += size - len(encoding.encode(PackedRunWindows.of(run_windows)))
            for w, (emitted, kept, open_, by_index, pending) in zip(tags, saved):
                w.emitted, w.kept, w.open, w.open_by_index, w.pending = emitted, kept, open_, by_index, pending
            run_windows.stored = stored
        for w in tags:
            w.emitted, w.kept, w.open, w.open_by_index, w.pending = {}, {}, [], {}, []
        run_windows.stored = {}
        parts["rest"] += len(encoding.encode(PackedRunWindows.of(run_windows)))
        run_windows.stored = stored
        for w, (emitted, kept, open_, by_index, pending) in zip(tags, saved):
            w.emitted, w.kept, w.open, w.open_by_index, w.pending = emitted, kept, open_, by_index, pending
            parts["emitted count"] += len(kept)
            parts["emitted points"] += sum(len(window.points) for window in emitted.values())
            parts["open points"] += len(open_) + sum(len(points) for points in by_index.values())
        parts["tags"] += len(tags)
        parts["writes"] += 1
        parts["bytes"] += size
        self.meter.windows_parts.update(parts)
        self.meter.cpu[(stage, test)] -= time.process_time() - started

    def _timed(self, test: Optional[str], fn: Callable[[], Any]) -> Any:
        started = time.process_time()
        result = fn()
        if self.meter.on and test is not None:
            self.meter.cpu[(PARSE, test)] += time.process_time() - started
        return result

    def _row(self, table: str, test: str, row: Dict[str, Any]) -> None:
        if self.meter.on:
            size = len(json.dumps(row, default=str, separators=(",", ":")))
            self.meter.bigquery[(table, test)] += size
            self.meter.bigquery_billed[(table, test)] += max(size, BIGQUERY_INSERT_MIN_ROW_BYTES)

    def receive(self, arrival: Arrival) -> None:
        """One payload from Pub/Sub: parsed, summarized, then through the stateful stages."""
        test = wire.parse_message(arrival.payload)[0].test
        if self.meter.on:
            self.meter.messages[test] += 1
            self.meter.points[test] += arrival.points
            self.meter.pubsub[test] += pubsub_bytes(arrival.payload)
        raw = RawMessage(arrival.payload, "pubsub:bench", arrival.at)
        stamped = self._timed(test, lambda: list(self.parse.process(raw)))
        for out in outputs_of(stamped, arrival.at):
            if out.tag is not None:
                self.dead_letters.append(out)
                continue
            summaries = self._timed(test, lambda out=out: list(self.summarize.process(out.value)))
            for summary in outputs_of(summaries, out.at):
                if summary.tag is not None:
                    self.dead_letters.append(summary)
                else:
                    self._feed("Deduplicate", summary.value.id, summary.value, summary.at)

    def advance(self, watermark: float) -> None:
        for name in STAGES:
            for out in self.stages[name].advance(watermark):
                self._route(name, out)

    def _feed(self, stage: str, key: Any, value: Any, at: float) -> None:
        for out in self.stages[stage].process(key, value, at):
            self._route(stage, out)

    def _route(self, source: str, out: Out) -> None:
        """Where an output of ``source`` goes next, as ``DetectRegressions`` wires it."""
        if out.tag == DEAD_LETTER.name or out.tag == INTERRUPTED:
            self.dead_letters.append(out)
        elif out.tag == ALERTS.name or (out.tag is None and source in ("CheckRuns", "LiveWindows/Checks")):
            alert = out.value
            finished = finish_alert(alert, self.configs.for_test(alert.test, alert.created_at))
            self._feed("Triage", alert.test, RaisedAlert(alert.test, alert.created_at, finished.to_row()), out.at)
        elif source == "Deduplicate":
            self._summary(out.value[1], out.at)  # the first copy of an id, its key dropped
        elif source == "AssembleRuns":
            self._run(out.value, out.at)
        elif source == "LiveWindows":
            self._window(*out.value, at=out.at)
        elif source == "CheckMetrics":
            self._row("metric_history", out.value["test_name"], out.value)
        elif source == "Triage":
            self._row("alerts", out.value["test_name"], out.value)

    def _summary(self, summary: MessageSummary, at: float) -> None:
        """``SkipStoredRuns`` (nothing stored) -> ``AssembleRuns``, and ``LiveWindows`` for a windowed test."""
        self._feed("AssembleRuns", (summary.test, summary.run), without_window_points(summary), at)  # as its KeyByRun
        config = self.configs.for_test(summary.test, summary.last_time)
        if config.windows.tags and (not summary.rank or any(ranks_matter(config, t) for t in config.windows.tags)):
            self._feed("LiveWindows", (summary.test, summary.run, effective_rank(summary.rank)),
                       without_payload(summary), at)  # as ``LiveWindows``' KeyByRun gives it

    def _run(self, run: RunResult, at: float) -> None:
        self.runs.append(run)
        self._row("job_history", run.test, job_history_row(run))
        for observation in MetricObservation.all_of(run):
            self._feed("CheckMetrics", (observation.test, observation.metric), observation, at)
        self._feed("CheckRuns", run.test, run, at)
        for tag, config in self.configs.for_test(run.test, run.finalized_at).windows.tags.items():
            if config.checks:
                ended = RunEnded(run.test, run.run, run.status, run.finalized_at, tag, config.spec.kind)
                self._feed("LiveWindows/Checks", (run.test, tag, config.spec.kind), ended, at)

    def _window(self, result, revision: int, at: float) -> None:
        self.windows.append((result, revision))
        self._row("metric_windows", result.test, window_row(result, revision))
        tag_config = self.configs.for_test(result.test, result.end_time).windows.tags.get(result.tag)
        if revision == 0 and tag_config is not None and tag_config.checks:
            self._feed("LiveWindows/Checks", (result.test, result.tag, result.kind), result, at)


def seeded_window_histories(configs: ConfigSet, args, before: float) -> Dict[Tuple[str, str, str], SeededState]:
    """What a long-running job's window checks hold before the measured runs: per checked tag, the step-aligned
    history of ``--history_runs`` earlier successful runs as long as the measured ones (their windows made from
    the same curves, as ``core.window_checks.seed_window_history`` rebuilds a restarted job's)."""
    config = configs.for_test(WINDOWED)
    names = tag_names(args.tags)
    steps = max(1, args.points // args.tags) * args.messages
    seeds = {}
    for index, tag in enumerate(names):
        tag_config = config.windows.tags[tag]
        if not tag_config.checks:
            continue
        runs = []
        for r in range(args.history_runs):
            run = f"{HISTORY_RUN}-{r:03d}"
            rng = random.Random(f"{args.seed}/{WINDOWED}/{run}/{tag}")
            start = before - (args.history_runs - r) * (steps * args.step_seconds + 3600.0)
            points = [WindowPoint(start + 0.5 + step * args.step_seconds, step, point_value(rng, index, step, args.values))
                      for step in range(steps)]
            count = tag_config.spec.points
            windows = [WindowResult(WINDOWED, run, tag, "count", i, chunk[0].time, chunk[-1].time, chunk[0].step,
                                    chunk[-1].step, len(chunk), len(chunk) < count,
                                    window_aggregates(chunk, tag_config.spec.aggregations))
                       for i, chunk in enumerate(points[j:j + count] for j in range(0, len(points), count))]
            runs.append((points[-1].time + 60.0, run, windows))
        seeds[(WINDOWED, tag, "count")] = SeededState(seed_window_history(
            runs, tag_config, config.regression_test.rebaseline_after))
    return seeds


# -- the measure --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Measure:
    """What one run of the benchmark counted, with the workload that made it."""
    meter: Meter
    points_per_message: int
    messages_per_run: int
    runs: int
    finished: Dict[str, int]          # runs finalized per test (both waves)
    windows: int                      # window results emitted (both waves)
    dead_letters: int
    seconds: float
    graph: StreamingGraph             # as the run left it: every key's state and timers


def measure(args) -> Measure:
    started = time.perf_counter()
    configs = bench_configs(args.tags, args.window_count, args.checked_tags, args.allowed_lateness_seconds)
    lifecycle = RunLifecycle(backfill_lag_seconds=BACKFILL_LAG_SECONDS, timer_bucket_seconds=args.bucket_seconds)
    meter = Meter()
    now = [T0]
    graph = StreamingGraph(configs, lifecycle, meter, lambda: now[0])
    for key, seeded in seeded_window_histories(configs, args, T0).items():  # uncounted: the meter is off
        graph.stages["LiveWindows/Checks"].process(key, seeded, T0 - lifecycle.retention_seconds)
    arrivals = wave("run", args.runs, T0, args)
    meter.on = True
    for arrival in arrivals:
        now[0] = arrival.at
        graph.advance(arrival.at - args.watermark_lag_seconds)
        graph.receive(arrival)
    last = arrivals[-1].at
    end = last + lifecycle.retention_seconds + lifecycle.dedup_horizon_seconds
    for step in range(1, 101):  # the watermark follows the wall clock to a week past the last run, in steps
        now[0] = last + (end - last) * step / 100
        graph.advance(now[0] - args.watermark_lag_seconds)
    finished = collections.Counter(run.test for run in graph.runs)
    return Measure(meter, args.points, args.messages, args.runs, dict(finished), len(graph.windows),
                   len(graph.dead_letters), time.perf_counter() - started, graph)


# -- the report ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageRow:
    stage: str
    test: str
    read_per_message: float      # bytes, per message of ``points_per_message`` points
    written_per_message: float
    read_per_point: float
    written_per_point: float
    work_items_per_message: float
    firings_per_message: float
    timer_sets_per_message: float
    shuffled_per_message: float  # bytes entering the stage through its shuffle
    payload_per_message: float   # of which raw payload bytes (summaries carry their message's payload)
    window_points_per_message: float  # of which window points (summaries of windowed tests carry them)
    cpu_us_per_point: float
    coding_us_per_point: float   # of which decoding what the state read and encoding what it wrote


def stage_rows(m: Measure) -> List[StageRow]:
    meter, rows = m.meter, []
    for test in (RUN_LEVEL, WINDOWED):
        points = max(1, meter.points[test])
        per_message = m.points_per_message / points
        for stage in (PARSE, *STAGES):
            tallies = [t for (s, t_test, _), t in meter.cells.items() if s == stage and t_test == test]
            read = sum(t.read_bytes for t in tallies)
            written = sum(t.written_bytes for t in tallies)
            key = (stage, test)
            work = meter.elements[key] + meter.firings[key]
            rows.append(StageRow(stage, test, read * per_message, written * per_message, read / points,
                                 written / points, work * per_message, meter.firings[key] * per_message,
                                 meter.timer_sets[key] * per_message, meter.shuffled[key] * per_message,
                                 meter.shuffled_payload[key] * per_message,
                                 meter.shuffled_window_points[key] * per_message, meter.cpu[key] / points * 1e6,
                                 sum(t.coding_seconds for t in tallies) / points * 1e6))
    return rows


def cell_rows(m: Measure) -> List[Tuple[str, str, str, Tally, float]]:
    """(stage, test, cell, its tally, messages it is divided by) for every cell that was touched."""
    out = []
    for (stage, test, cell), tally in sorted(m.meter.cells.items(), key=lambda item: (
            STAGES.index(item[0][0]), item[0][1], item[0][2])):
        messages = max(1, m.meter.points[test]) / m.points_per_message
        if tally.reads or tally.writes or tally.clears:
            out.append((stage, test, cell, tally, messages))
    return out


@dataclasses.dataclass(frozen=True)
class PathTotals:
    """One test's whole streaming path, per point."""
    test: str
    state_read_per_point: float
    state_written_per_point: float
    shuffled_bytes_per_point: float
    work_items_per_point: float
    cpu_us_per_point: float           # the stages' code, state coding and shuffle coding
    pubsub_bytes_per_point: float
    bigquery_bytes_per_point: float
    bigquery_billed_bytes_per_point: float  # as streaming inserts bill the rows (each at least 1 KB)


def path_totals(m: Measure) -> Dict[str, PathTotals]:
    meter, rows, totals = m.meter, stage_rows(m), {}
    shuffled_all = sum(meter.shuffled.values()) or 1
    for test in (RUN_LEVEL, WINDOWED):
        points = max(1, meter.points[test])
        mine = [r for r in rows if r.test == test]
        shuffle_cpu = meter.shuffle_cpu * sum(v for (_, t), v in meter.shuffled.items() if t == test) / shuffled_all
        totals[test] = PathTotals(
            test, sum(r.read_per_point for r in mine), sum(r.written_per_point for r in mine),
            sum(r.shuffled_per_message for r in mine) / m.points_per_message,
            sum(r.work_items_per_message for r in mine) / m.points_per_message,
            sum(r.cpu_us_per_point for r in mine) + shuffle_cpu / points * 1e6,
            meter.pubsub[test] / points,
            sum(v for (_, t), v in meter.bigquery.items() if t == test) / points,
            sum(v for (_, t), v in meter.bigquery_billed.items() if t == test) / points)
    return totals


@dataclasses.dataclass(frozen=True)
class CostRow:
    runs: int
    test: str
    points_per_second: float
    vcpus_needed: float
    workers: int
    workers_usd: float
    streaming_engine_gib: Tuple[float, float]   # data processed a month: shuffles only, shuffles + state
    streaming_engine_usd: Tuple[float, float]
    pubsub_usd: float
    bigquery_usd: float  # streaming inserts, run_dataflow.sh's default
    bigquery_storage_write_usd: float  # with --write_method=storage_write_api instead

    @property
    def total_usd(self) -> Tuple[float, float]:
        fixed = self.workers_usd + self.pubsub_usd + self.bigquery_usd
        return fixed + self.streaming_engine_usd[0], fixed + self.streaming_engine_usd[1]


def cost_rows(totals: Dict[str, PathTotals], fleet: Sequence[int], tags: int, points_per_second_per_tag: float,
              work_item_ms: float, utilization: float) -> List[CostRow]:
    """The monthly cost of ``fleet`` concurrent runs of each test kind (every run of that kind), by ``PRICES``."""
    rows = []
    seconds = MONTH_HOURS * 3600
    gib = 1024.0 ** 3
    for runs in fleet:
        for test, t in totals.items():
            rate = runs * tags * points_per_second_per_tag
            cpu_seconds = rate * (t.cpu_us_per_point * 1e-6 + t.work_items_per_point * work_item_ms * 1e-3)
            vcpus = cpu_seconds / utilization
            workers = max(1, math.ceil(vcpus / WORKER["vcpus"]))
            worker_hour = (WORKER["vcpus"] * PRICES["streaming_vcpu_hour"] + WORKER["gib"] * PRICES[
                "streaming_gib_hour"] + WORKER["disk_gib"] * PRICES["pd_gib_hour"])
            shuffled = rate * t.shuffled_bytes_per_point * seconds / gib
            state = t.state_read_per_point + t.state_written_per_point
            with_state = shuffled + rate * state * seconds / gib
            pubsub_gib = 2 * rate * t.pubsub_bytes_per_point * seconds / gib  # published, and delivered once
            bigquery_gib = rate * t.bigquery_bytes_per_point * seconds / gib
            billed_gib = rate * t.bigquery_billed_bytes_per_point * seconds / gib
            rows.append(CostRow(
                runs, test, rate, vcpus, workers, workers * worker_hour * MONTH_HOURS, (shuffled, with_state),
                (shuffled * PRICES["streaming_engine_gib"], with_state * PRICES["streaming_engine_gib"]),
                max(0.0, pubsub_gib - PRICES["pubsub_free_gib"]) * PRICES["pubsub_tib"] / 1024,
                billed_gib * PRICES["bigquery_insert_gib"],
                max(0.0, bigquery_gib - PRICES["bigquery_write_free_gib"]) * PRICES["bigquery_write_gib"]))
    return rows


def _b(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:,.1f}"


def report(m: Measure, args) -> str:
    lines = []
    meter = m.meter
    lines.append(f"{m.runs} runs of each test, {m.messages_per_run} messages of {m.points_per_message:,} points and "
                 f"a run_finished each ({meter.messages[RUN_LEVEL]:,} + {meter.messages[WINDOWED]:,} messages, "
                 f"{sum(meter.points.values()):,} points), the window checks' history holding "
                 f"{args.history_runs} earlier runs; {m.seconds:.1f} s")
    lines.append("")
    lines.append(f"Per stage (\"/msg\": per message of {m.points_per_message:,} points, each run's start, end and "
                 "expiry included; state bytes as a runner without a cache reads and writes them):")
    lines.append("")
    lines.append("| stage | test | state read, B/msg | state written, B/msg | read + written, B/point | work items/msg "
                 "| timer firings/msg | timer sets/msg | shuffle in, B/msg | of which raw payload | of which window "
                 "points | CPU µs/point | of which state coding |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in stage_rows(m):
        if r.stage != PARSE and not (r.read_per_point or r.written_per_point or r.work_items_per_message):
            continue
        lines.append(f"| {r.stage} | {KINDS[r.test]} | {_b(r.read_per_message)} | {_b(r.written_per_message)} | "
                     f"{r.read_per_point + r.written_per_point:,.1f} | {r.work_items_per_message:,.2f} | "
                     f"{r.firings_per_message:,.2f} | {r.timer_sets_per_message:,.2f} | "
                     f"{_b(r.shuffled_per_message)} | {_b(r.payload_per_message)} | "
                     f"{_b(r.window_points_per_message)} | {r.cpu_us_per_point:,.2f} | {r.coding_us_per_point:,.2f} |")
    idle = [stage for stage in STAGES if not any(meter.elements[(stage, test)] for test in KINDS)]
    if idle:
        lines.append("")
        lines.append(f"Nothing reached {', '.join(idle)} in this workload"
                     + (" (Triage: no alert was raised)." if "Triage" in idle else "."))
    totals = path_totals(m)
    lines.append("")
    lines.append("| whole path | state read, B/msg | state written, B/msg | shuffles, B/msg | work items/msg "
                 "| CPU µs/point (stages, state and shuffle coding) | Pub/Sub, B/msg | BigQuery rows (JSON), B/msg |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for test, t in totals.items():
        n = m.points_per_message
        lines.append(f"| {KINDS[test]} | {_b(t.state_read_per_point * n)} | {_b(t.state_written_per_point * n)} | "
                     f"{_b(t.shuffled_bytes_per_point * n)} | "
                     f"{t.work_items_per_point * n:,.2f} | {t.cpu_us_per_point:,.2f} | "
                     f"{_b(t.pubsub_bytes_per_point * n)} | {_b(t.bigquery_bytes_per_point * n)} |")
    lines.append("")
    lines.append("Per state cell:")
    lines.append("")
    lines.append("| stage | test | cell | reads/msg | B/read | read, B/msg | writes/msg | written, B/msg "
                 "| clears/msg | decode µs/point | encode µs/point |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for stage, test, cell, t, messages in cell_rows(m):
        points = messages * m.points_per_message
        lines.append(f"| {stage} | {KINDS[test]} | `{cell}` | {t.reads / messages:,.2f} | "
                     f"{_b(t.read_bytes / max(1, t.reads))} | {_b(t.read_bytes / messages)} | "
                     f"{t.writes / messages:,.2f} | {_b(t.written_bytes / messages)} | {t.clears / messages:,.2f} | "
                     f"{t.decode_seconds / points * 1e6:,.2f} | {t.encode_seconds / points * 1e6:,.2f} |")
    parts = meter.windows_parts
    if parts["writes"]:
        writes = parts["writes"]
        lines.append("")
        lines.append(f"LiveWindows `run_windows`, an average write: {_b(parts['bytes'] / writes)} B, "
                     f"{parts['tags'] / writes:,.1f} tags, {parts['emitted count'] / writes:,.1f} emitted windows "
                     f"kept ({parts['emitted points'] / writes:,.0f} of their points in the value), {parts['open points'] / writes:,.0f} "
                     "points in open windows; B the value loses without each part:")
        lines.append("")
        lines.append("| emitted windows kept for late points (their index, end and last point: the windows are in "
                     "the bags `closed_windows_0`/`_1`) | open windows' points | points taken from the bag, "
                     "not yet placed | without all three (specs, stall watch, fields, type table) |")
        lines.append("|---:|---:|---:|---:|")
        lines.append("| " + " | ".join(_b(parts[name] / writes) for name in ("emitted", "open", "pending", "rest"))
                     + " |")
    lines.append("")
    lines.append("Timer firings per message, by timer:")
    lines.append("")
    lines.append("| stage | test | timer | firings/msg |")
    lines.append("|---|---|---|---:|")
    for (stage, test, timer), count in sorted(meter.firings_by_timer.items(), key=lambda item: (
            STAGES.index(item[0][0]), item[0][1], item[0][2])):
        messages = max(1, meter.points[test]) / m.points_per_message
        lines.append(f"| {stage} | {KINDS[test]} | `{timer.replace('ts-', '')}` | {count / messages:,.2f} |")
    lines.append("")
    fleet = cost_rows(totals, args.fleet, args.tags, 1.0, args.work_item_ms, args.utilization)
    lines.append(f"Monthly cost ({MONTH_HOURS:g} h) of concurrent runs of {args.tags} tags x 1 point/s, all of one "
                 f"test kind, USD at PRICES; workers {WORKER['name']} sized from the CPU above plus "
                 f"{args.work_item_ms:g} ms a work item (assumed) at {args.utilization:.0%} use; Streaming Engine "
                 "data-processed billing, shuffles only - shuffles + state:")
    lines.append("")
    lines.append("| runs | test | points/s | vCPU needed | workers | workers $ | Streaming Engine GiB | "
                 "Streaming Engine $ | Pub/Sub $ | BigQuery streaming inserts $ (Storage Write API $) | total $ |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in fleet:
        lines.append(f"| {c.runs:,} | {KINDS[c.test]} | {c.points_per_second:,.0f} | {c.vcpus_needed:,.2f} | "
                     f"{c.workers} | {c.workers_usd:,.0f} | {c.streaming_engine_gib[0]:,.0f}-"
                     f"{c.streaming_engine_gib[1]:,.0f} | {c.streaming_engine_usd[0]:,.0f}-"
                     f"{c.streaming_engine_usd[1]:,.0f} | {c.pubsub_usd:,.0f} | {c.bigquery_usd:,.0f} "
                     f"({c.bigquery_storage_write_usd:,.0f}) | "
                     f"{c.total_usd[0]:,.0f}-{c.total_usd[1]:,.0f} |")
    lines.append("")
    lines.append(f"{sum(m.finished.values())} runs finalized, {m.windows:,} windows emitted, {m.dead_letters} "
                 "dead letters")
    return "\n".join(lines)


QUICK = ["--runs", "1", "--messages", "4", "--history_runs", "2", "--fleet", "20"]


def parser() -> StrictArgumentParser:
    p = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    p.add_argument("--runs", type=int, default=3, help="concurrent runs of each test")
    p.add_argument("--messages", type=int, default=48,
                   help="messages of points per run, 50 s each (48: a run of 40 minutes)")
    p.add_argument("--points", type=int, default=1000, help="points per message")
    p.add_argument("--tags", type=int, default=20, help="tags per run, one point each per step")
    p.add_argument("--step_seconds", type=float, default=1.0, help="event time between a run's steps")
    p.add_argument("--window_count", type=int, default=20, help="points per count window of the windowed test")
    p.add_argument("--checked_tags", type=int, default=2, help="tags of the windowed test with a step-aligned check")
    p.add_argument("--history_runs", type=int, default=10,
                   help="earlier runs in the window checks' history (10: all that 5-run checks keep)")
    p.add_argument("--allowed_lateness_seconds", type=float, default=60.0, help="of the windowed test")
    p.add_argument("--bucket_seconds", type=float, default=RunLifecycle().timer_bucket_seconds,
                   help="the streaming timers' bucket (--timer_bucket_seconds)")
    p.add_argument("--watermark_lag_seconds", type=float, default=10.0, help="the watermark behind the wall clock")
    p.add_argument("--publish_delay_seconds", type=float, default=1.0,
                   help="from a message's latest point to its arrival")
    p.add_argument("--fleet", type=int, nargs="+", default=[20, 200, 2000],
                   help="concurrent runs of the cost table")
    p.add_argument("--work_item_ms", type=float, default=0.5,
                   help="worker CPU of a work item beside the stage's code (assumed: not measured here)")
    p.add_argument("--utilization", type=float, default=0.5, help="the workers' CPU use the sizing aims at")
    p.add_argument("--seed", type=int, default=1, help="the values' random seed")
    p.add_argument("--values", choices=[SIX_DIGITS, FLOAT32], default=SIX_DIGITS,
                   help="the points' values: to six significant digits, or float32 values")
    p.add_argument("--quick", action="store_true", help=f"a small run for a test: {' '.join(QUICK)}")
    return p


def run(argv: Optional[Sequence[str]] = None) -> Tuple[Measure, Any]:
    """Parses ``argv`` (``--quick`` first puts in its own values, which the other options override), measures;
    returns the measure and the options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args((QUICK if "--quick" in argv else []) + argv)
    return measure(args), args


def main(argv: Optional[Sequence[str]] = None) -> int:
    m, args = run(argv)
    print(report(m, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
