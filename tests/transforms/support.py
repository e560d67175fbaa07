"""Shared helpers for tests that run Beam pipelines (always with an explicit runner)."""

import time
import uuid
from typing import Any, Callable, Dict, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.utils.timestamp import Duration

from core.config import Configs, ConfigSet, parse_test_config
from core.history import HistorySeed
from core.parse import RawMessage
from core.runs import RunLifecycle
from pipeline.graph import DetectRegressions, GraphSettings
from trainguard import wire
from transforms.backfills import AssembleRunOrBackfillFn
from transforms.history import JobMachine, MetricMachine
from transforms.ordered import in_event_time_order
from transforms.parse import FirstPerKeyFn
from transforms.rank_windows import RankWindowMachine
from transforms.run_assembly import AssembleRunFn
from transforms.run_parts import AssembleRunPartsFn
from transforms.triage import LedgerMachine
from transforms.window_checks import WindowCheckMachine
from transforms.windows import WindowRunFn


def batch_pipeline() -> beam.Pipeline:
    return beam.Pipeline(runner=FnApiRunner())


def streaming_pipeline() -> beam.Pipeline:
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return beam.Pipeline(runner=BundleBasedDirectRunner(), options=options)


def configs(**by_test) -> ConfigSet:
    return ConfigSet({test: parse_test_config(raw, f"{test}.json") for test, raw in by_test.items()})


def detect(raw_messages, settings: GraphSettings, seed: HistorySeed = None):
    pipeline = raw_messages.pipeline
    return raw_messages | DetectRegressions(settings, pipeline | "Seed" >> beam.Create([seed or HistorySeed()]))


def raw(test, run, mid, points=(), events=()) -> RawMessage:
    """A RawMessage; points are (tag, value, step, time) and events (type, time, data) tuples."""
    return RawMessage(wire.encode_message(
        test, run, [wire.point_dict(tag, value, time, step) for tag, value, step, time in points],
        [wire.event_dict(t, time, data) for t, time, data in events], message_id=mid), "test")


def finished(time, status="success"):
    return ("run_finished", time, {"status": status, "num_failures": 0})


def started(time):
    return ("run_started", time, {})


def simple_run(test, run, start, accuracy, status="success"):
    """Two messages: a point and the lifecycle events."""
    return [raw(test, run, f"{test}/{run}-p", points=[("acc", accuracy, 100, start + 10)]),
            raw(test, run, f"{test}/{run}-e", events=[started(start), finished(start + 20, status)])]



_GATHERED = {}


def _gather_into(element, key):
    _GATHERED[key].append(element)


def gather(pcoll, label: str) -> list:
    """A list that fills with ``pcoll``'s elements when the pipeline runs (in-process runners only)."""
    # A key of its own (not the pipeline's id, which Python reuses once an earlier test's pipeline is gone).
    key = f"{uuid.uuid4().hex}/{label}"
    sink = _GATHERED[key] = []
    pcoll | f"Gather_{label}" >> beam.Map(_gather_into, key)
    return sink


def stateful_dofns(configs: Configs, lifecycle: RunLifecycle,
                   clock: Callable[[], float] = time.time) -> Dict[str, Tuple[beam.DoFn, Any]]:
    """Every stateful DoFn of the graph (those with timers), by name, with a key of the kind it is keyed by: as
    the graph makes them (the streaming job's, and a replay's run assembly), on ``configs`` and ``lifecycle``,
    those that read the wall clock on ``clock``. ``tests/transforms/test_timers_without_state.py`` checks that
    a new one in ``transforms/`` joins it."""
    return {
        "ordered metric check": (in_event_time_order(MetricMachine(configs), "metric", True), ("t", "m")),
        "ordered job check": (in_event_time_order(JobMachine(configs), "job", True), "t"),
        "ordered window check": (in_event_time_order(WindowCheckMachine(configs), "window", True),
                                 ("t", "tag", "count")),
        "ordered triage ledger": (in_event_time_order(LedgerMachine(configs), "triage", True), "t"),
        "ordered rank windows": (in_event_time_order(RankWindowMachine(configs, lifecycle.retention_seconds),
                                                     "ranks", True), ("t", "r", "tag")),
        "first per key (dedup)": (FirstPerKeyFn(Duration(seconds=lifecycle.dedup_horizon_seconds)), "message-id"),
        "run assembly": (AssembleRunFn(configs, lifecycle, interruptions=True, clock=clock), ("t", "r")),
        "run assembly with back-fills": (AssembleRunOrBackfillFn(configs, lifecycle, interruptions=True,
                                                                 clock=clock), ("t", "r")),
        "run assembly of a replay's parts": (AssembleRunPartsFn(configs, lifecycle), ("t", "r")),
        "live windows": (WindowRunFn(configs, lifecycle, streaming=True, clock=clock), ("t", "r", 0)),
    }
