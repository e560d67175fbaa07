"""State and shuffles are encoded by the project's own coder (``transforms.coders.RecordCoder``), never pickled.

- every state fixture written by an earlier version (``tests/fixtures/state_v1``, ``state_v2``, ...) still decodes,
  field by field, and today's encoding is the latest set's, byte for byte;
- the graphs (the replay's and the streaming job's) hold no pickling coder in any state spec, stateful or
  grouping input, or side input: each is checked in the pipeline proto that the runner (Dataflow) gets.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Dict, Iterator, List, Tuple

import apache_beam as beam
import pytest
from apache_beam.coders import PickleCoder, StrUtf8Coder, TupleCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.typehints import typehints
from google.protobuf import wrappers_pb2

from core import encoding
from core.config import load_config_dir
from core.history import HistorySeed, MetricHistory
from core.parse import MessageSummary
from core.records import MetricObservation
from core.runs import RunResult
from core.triage import TriageItem
from core.windows import WindowResult
from pipeline.graph import DetectRegressions, GraphSettings
from pipeline.replay import SeedFromFile, WriteLocal
from pipeline.streaming import StreamingJobConfig, build_streaming_pipeline
from tests.support import REPO_ROOT, T0
from transforms.coders import AnyRecord, RecordCoder
from transforms.config_versions import read_config_dir
from transforms.sources import ReadReplayFiles

FIXTURE_ROOT = os.path.join(REPO_ROOT, "tests", "fixtures")
OUR_CODERS = {"RecordCoder"}
# Beam's BigQuery sink groups (destination, (row, insert id)) by key with Beam's own coders: the rows are plain
# JSON-ready dicts of str, float, int, bool and None (``core.records``), which FastPrimitivesCoder writes itself,
# with no pickle; no project class reaches it.
BEAM_SINK_STEPS = ("WriteBigQuery/",)


# -- the coder -------------------------------------------------------------------------------------------------


def test_record_coder_round_trips_nested_in_beam_coders():
    history = MetricHistory([("r1", -0.0, True), ("r2", float("inf"), False)], pending_accept="r3")
    kv = TupleCoder([TupleCoder([StrUtf8Coder(), StrUtf8Coder()]), RecordCoder()])
    key, value = kv.decode(kv.encode((("t", "m"), history)))
    assert key == ("t", "m") and value == history
    assert RecordCoder().is_deterministic()
    assert RecordCoder().encode(history) == RecordCoder().encode(MetricHistory(list(history.entries),
                                                                               pending_accept="r3"))


@pytest.mark.parametrize("cls", [MessageSummary, RunResult, MetricObservation, TriageItem, WindowResult, HistorySeed])
def test_beam_gives_record_coder_to_every_record_type(cls):
    assert isinstance(beam.coders.registry.get_coder(cls), RecordCoder)


def test_any_record_is_any_to_type_checks_and_record_coder_to_the_registry():
    coder = beam.coders.registry.get_coder(typehints.KV[typehints.Tuple[str, str], AnyRecord])
    assert coder.is_kv_coder() and isinstance(coder.value_coder(), RecordCoder)
    assert coder.key_coder() == TupleCoder([StrUtf8Coder(), StrUtf8Coder()])
    assert typehints.is_consistent_with(AnyRecord, TriageItem) and typehints.is_consistent_with(TriageItem, AnyRecord)


# -- state written by earlier versions ---------------------------------------------------------------------------


def versions() -> List[str]:
    """The fixture sets, oldest first: ``state_v1``, ``state_v2``, ... (``scripts/write_state_fixtures.py``)."""
    return sorted((name for name in os.listdir(FIXTURE_ROOT) if name.startswith("state_v")),
                  key=lambda name: int(name[len("state_v"):]))


LATEST = versions()[-1]


def fixture_names(version: str = LATEST) -> List[str]:
    return sorted(name[:-4] for name in os.listdir(os.path.join(FIXTURE_ROOT, version)) if name.endswith(".bin"))


def read_fixture(version: str, name: str) -> bytes:
    with open(os.path.join(FIXTURE_ROOT, version, f"{name}.bin"), "rb") as f:
        return f.read()


@functools.cache
def expected(version: str) -> Dict[str, Any]:
    with open(os.path.join(FIXTURE_ROOT, version, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_fixtures_cover_every_state_cell():
    assert {"run_accumulator", "run_windows", "window_points_bag", "metric_history", "job_history", "window_history", "rank_windows", "alert_ledger", "history_seed",
            "message_summary", "run_result", "metric_observations", "raised_alert", "triage_item",
            "window_results", "run_ended", "window_triage", "window_live", "window_settled", "window_near",
            "window_log_entry"} <= set(fixture_names())


@pytest.mark.parametrize("version, name", [(v, name) for v in versions() for name in fixture_names(v)])
def test_state_written_by_every_version_still_decodes_to_the_same_values(version, name):
    """Every field the bytes of every fixture set hold decodes to the value it had (fields added since take their
    defaults)."""
    data = read_fixture(version, name)
    decoded = RecordCoder().decode(data)
    held = {type_name: fields for type_name, _, fields in encoding.types_of(data) if fields is not None}
    assert encoding.describe(decoded, only=held) == expected(version)[name]


@pytest.mark.parametrize("name", fixture_names())
def test_todays_state_encodes_to_the_bytes_of_the_latest_fixtures(name):
    """Today's encoding is the latest fixture set's, byte for byte. When a type changes (a field added), this
    fails: write the next set (``python scripts/write_state_fixtures.py --out tests/fixtures/state_vN``) and
    keep the old ones, which the test above still decodes."""
    data = read_fixture(LATEST, name)
    assert RecordCoder().encode(RecordCoder().decode(data)) == data, (
        f"{LATEST}/{name}.bin no longer round-trips: a type changed; write the next fixture set")


# -- no pickles in the graphs ------------------------------------------------------------------------------------


def coder_classes(components, coder_id: str) -> Iterator[Tuple[str, str]]:
    """(urn, Python class of a pickled coder or "") of a coder and every coder it is made of."""
    coder = components.coders[coder_id]
    name = ""
    if coder.spec.urn == python_urns.PICKLED_CODER:
        name = wrappers_pb2.BytesValue.FromString(coder.spec.payload).value.split(b"$", 1)[0].decode()
    yield coder.spec.urn, name
    for component in coder.component_coder_ids:
        yield from coder_classes(components, component)


def encoded_places(proto) -> Iterator[Tuple[str, str, str]]:
    """(step, what, coder id) of every place where elements or state are encoded to be kept or shuffled."""
    components = proto.components
    for transform in components.transforms.values():
        if transform.subtransforms:
            continue
        step = transform.unique_name
        if transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn:
            for pcoll in transform.inputs.values():
                yield step, "grouped input", components.pcollections[pcoll].coder_id
        if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        for tag in payload.side_inputs:
            yield step, f"side input {tag}", components.pcollections[transform.inputs[tag]].coder_id
        if not payload.state_specs and not payload.timer_family_specs:
            continue
        for tag, pcoll in transform.inputs.items():
            if tag not in payload.side_inputs:
                yield step, "keyed input", components.pcollections[pcoll].coder_id
        for name, spec in payload.state_specs.items():
            kind = spec.WhichOneof("spec")
            part = getattr(spec, kind)
            for field in ("coder_id", "element_coder_id", "key_coder_id", "value_coder_id", "accumulator_coder_id"):
                if getattr(part, field, ""):
                    yield step, f"state {name}", getattr(part, field)
        for name, spec in payload.timer_family_specs.items():
            yield step, f"timer {name}", spec.timer_family_coder_id


def pickled_places(pipeline: beam.Pipeline, allowed_prefixes=()) -> List[str]:
    proto = pipeline.to_runner_api()
    found = []
    for step, what, coder_id in encoded_places(proto):
        if step.startswith(allowed_prefixes):
            continue
        foreign = sorted({name for urn, name in coder_classes(proto.components, coder_id)
                          if urn == python_urns.PICKLED_CODER and name not in OUR_CODERS})
        if foreign:
            found.append(f"{step}: {what} is encoded by {', '.join(foreign)}")
    return found


def replay_pipeline() -> beam.Pipeline:
    """The replay's graph, as ``pipeline.replay.run`` builds it (not run)."""
    pipeline = beam.Pipeline(runner=FnApiRunner())
    configs = load_config_dir(os.path.join(REPO_ROOT, "configs"))
    outputs = (pipeline
               | "ReadFiles" >> ReadReplayFiles([os.path.join(REPO_ROOT, "data", "demo", "*.jsonl")])
               | "DetectRegressions" >> DetectRegressions(GraphSettings(configs),
                                                          pipeline | "Seed" >> SeedFromFile("unused-seed")))
    outputs | "WriteLocal" >> WriteLocal("unused-staging")
    return pipeline


def streaming_pipeline() -> beam.Pipeline:
    """The streaming job's graph, as ``pipeline.streaming`` builds it for Dataflow (not run)."""
    options = PipelineOptions(["--streaming", "--input_subscription=projects/my-project/subscriptions/metrics",
                               "--bigquery_dataset=trainguard", "--project=my-project",
                               "--alerts_topic=projects/my-project/topics/alerts"])
    configs = read_config_dir(os.path.join(REPO_ROOT, "configs"))
    return build_streaming_pipeline(options, configs, StreamingJobConfig.from_options(options))


def test_the_replay_graph_pickles_nothing_it_keeps_or_shuffles():
    pipeline = replay_pipeline()
    places = list(encoded_places(pipeline.to_runner_api()))
    states = {what for _, what, _ in places if what.startswith("state ")}
    assert {"state run_windows", "state window_points"} <= states  # live windows keep state in a replay too
    grouped = {step for step, what, _ in places if what == "grouped input"}
    assert {"DetectRegressions/AssembleRuns/Assemble/GroupByRun",  # run assembly and the ordered checks group
            "DetectRegressions/CheckMetrics/CheckInOrder/GroupByKey",
            "DetectRegressions/CheckRuns/CheckInOrder/GroupByKey", "DetectRegressions/Triage/InOrder/GroupByKey"} <= grouped
    assert pickled_places(pipeline) == []


def test_a_replay_carries_a_runs_observations_through_the_flatten_before_its_metric_check_as_bytes():
    """FnApiRunner writes out and reads back every input of a Flatten: values encoded once beforehand cross it
    and the shuffle after it as bytes, instead of being encoded and decoded twice."""
    proto = replay_pipeline().to_runner_api()
    components = proto.components
    (flatten,) = [t for t in components.transforms.values()
                  if t.unique_name == "DetectRegressions/CheckMetrics/ObservationsAndActions"]
    assert len(flatten.inputs) == 2
    for pcoll in flatten.inputs.values():
        coder = components.coders[components.pcollections[pcoll].coder_id]
        while coder.spec.urn != common_urns.coders.KV.urn:  # (under the windowed value's, if any)
            coder = components.coders[coder.component_coder_ids[0]]
        key, value = (components.coders[c].spec.urn for c in coder.component_coder_ids)
        assert (key, value) == (common_urns.coders.STRING_UTF8.urn, common_urns.coders.BYTES.urn)


def test_the_streaming_graph_pickles_nothing_it_keeps_or_shuffles():
    pipeline = streaming_pipeline()
    assert pickled_places(pipeline, BEAM_SINK_STEPS) == []
    assert any(step.startswith("DetectRegressions/") and what.startswith("side input")
               for step, what, _ in encoded_places(pipeline.to_runner_api()))  # the seed, checked above


def test_the_check_finds_a_pickled_state_and_an_untyped_shuffle():
    spec = ReadModifyWriteStateSpec("legacy", PickleCoder())

    class LegacyFn(beam.DoFn):
        def process(self, element, state=beam.DoFn.StateParam(spec)):
            yield element

    pipeline = beam.Pipeline(runner=FnApiRunner())
    (pipeline | beam.Create([T0]) | "KeyUntyped" >> beam.Map(lambda t: ("k", MetricHistory()))
     .with_output_types(typehints.KV[str, typehints.Any]) | "Legacy" >> beam.ParDo(LegacyFn()))
    found = pickled_places(pipeline)
    assert "Legacy: keyed input is encoded by FastPrimitivesCoder" in found
    assert "Legacy: state legacy is encoded by PickleCoder" in found
