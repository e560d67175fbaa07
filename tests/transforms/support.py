"""Shared helpers for tests that run Beam pipelines (always with an explicit runner)."""

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from core.config import ConfigSet, parse_test_config
from core.history import HistorySeed
from core.parse import RawMessage
from pipeline.graph import DetectRegressions, GraphSettings
from trainguard import wire


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
    # A new list each time: a pipeline of an earlier test may have had the same id (its memory reused).
    sink = _GATHERED[f"{id(pcoll.pipeline)}/{label}"] = []
    pcoll | f"Gather_{label}" >> beam.Map(_gather_into, f"{id(pcoll.pipeline)}/{label}")
    return sink
