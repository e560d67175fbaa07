"""Shared helpers for tests that run Beam pipelines (always with an explicit runner)."""

import time
import uuid
from typing import Any, Callable, Dict, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Duration, Timestamp

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


_COLLECTED = {}


def _collect_into(element, key):
    _COLLECTED[key].append(element)


def collect_outputs(pcoll, label: str) -> list:
    """A list that fills with ``pcoll``'s elements when the pipeline runs (in-process runners only). Not for
    checking a pipeline (``assert_that``, ``assert_rows`` do that): only for what a later pipeline needs, which
    one pipeline cannot give it: the expected side of a comparison between pipelines that cannot be one (two
    TestStreams, or a stream and a replay, each on its runner), or what the next job is seeded with (a restart)."""
    # A key of its own (not the pipeline's id, which Python reuses once an earlier test's pipeline is gone).
    key = f"{uuid.uuid4().hex}/{label}"
    sink = _COLLECTED[key] = []
    pcoll | f"Collect_{label}" >> beam.Map(_collect_into, key)
    return sink


def _tagged(element, name):
    return name, element


def _by_name(tagged, names, check):
    found = {name: [] for name in names}
    for name, element in tagged:
        found[name].append(element)
    check(found)


def assert_rows(pcolls: Dict[str, Any], check: Callable[[Dict[str, list]], None], label: str = "rows") -> None:
    """``assert_that`` on several PCollections of one pipeline at once (a graph's tables, or two graphs' tables):
    ``check`` receives ``{name: [elements]}`` (every name, an empty list for an empty PCollection) once all of
    them are in, in the runner, and raises ``AssertionError`` to fail the pipeline's ``run()``. It is pickled with
    the pipeline: closures over plain data only."""
    tagged = [pcoll | f"{label}_Tag_{name}" >> beam.Map(_tagged, name)
              | f"{label}_Global_{name}" >> beam.WindowInto(GlobalWindows()) for name, pcoll in pcolls.items()]
    assert_that(tagged | f"{label}_Flatten" >> beam.Flatten(), lambda found: _by_name(found, tuple(pcolls), check),
                label=label)


def drained(stream: TestStream, at: float) -> TestStream:
    """``stream``, then drained: the watermark jumps to ``at``, past every timer the test's runs set, then to the
    end of time. The finite jump first: what the timers emit once the watermark is at the end of time is late for
    ``assert_that``'s global window, which has closed by then (the direct runner drops it)."""
    return stream.advance_watermark_to(Timestamp.of(at)).advance_watermark_to_infinity()


class Detect(beam.PTransform):
    """``detect`` as a transform of its own, so that one pipeline can hold several graphs under their labels
    (``p | "Poisoned" >> Detect(...)``) and one ``assert_rows`` compares their tables."""

    def __init__(self, settings: GraphSettings, seed: HistorySeed = None):
        super().__init__()
        self.settings, self.seed = settings, seed

    def expand(self, raw_messages):
        return detect(raw_messages, self.settings, self.seed)


def stateful_dofns(configs: Configs, lifecycle: RunLifecycle,
                   clock: Callable[[], float] = time.time) -> Dict[str, Tuple[beam.DoFn, Any]]:
    """Every stateful DoFn of the graph (those with timers), by name, with a key of the kind it is keyed by: as
    the streaming graph makes them (a replay's run assembly and ordered checks group each key instead), on
    ``configs`` and ``lifecycle``, those that read the wall clock on ``clock``. ``tests/transforms/test_timers_without_state.py`` checks that
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
        "live windows": (WindowRunFn(configs, lifecycle, streaming=True, clock=clock), ("t", "r", 0)),
    }
