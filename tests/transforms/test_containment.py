"""No single input can stop the pipeline: each stage dead-letters the item it fails on and goes on.

Each test injects a failure into one stage for one item and checks that the
item lands in ``dead_letter`` with the exception as the reason, and that the
rest of the output equals a run without that item.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Union

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

import core.runs
import core.window_checks
import transforms.history
import transforms.parse
import transforms.window_checks
import transforms.windows
from core.parse import RawMessage
from core.runs import RunLifecycle
from core.schema import ALERTS, DEAD_LETTER, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import (
    Detect,
    assert_rows,
    batch_pipeline,
    collect_outputs,
    configs,
    detect,
    finished,
    raw,
    started,
    streaming_pipeline,
)
from trainguard import wire

CONFIG = {
    "metric_collection_config": {"default_aggregation_strategies": ["final", "average"]},
    "regression_test_config": {
        "metric_success_conditions": {"default": {"comparison": "less",
                                                  "success_threshold": {"stddevs_from_mean": 2}}},
        "alert_after_second_test_failure": False},
    "window_config": {"tags": {"loss": {"count": 2, "aggregations": ["mean", "max"], "checks": [{
        "aggregation": "mean", "history_runs": 3,
        "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3}}}]}}},
}
SETTINGS = GraphSettings(configs(cifar=CONFIG), RunLifecycle(grace_seconds=10, timeout_seconds=600))
TABLES = (JOB_HISTORY.name, METRIC_HISTORY.name, METRIC_WINDOWS.name, ALERTS.name, DEAD_LETTER.name)


def run_messages(run: str, start: float, losses: List[float], status: str = "success") -> List[RawMessage]:
    points = [("loss", value, 10 * i, start + 1 + i) for i, value in enumerate(losses)]
    return [raw("cifar", run, f"{run}/start", events=[started(start)]),
            raw("cifar", run, f"{run}/points", points=points),
            raw("cifar", run, f"{run}/end", events=[finished(start + 1 + len(losses), status)])]


def suite() -> List[RawMessage]:
    messages = []
    for day, losses in enumerate([[1.0, 0.9, 0.8, 0.7], [1.1, 0.9, 0.8, 0.7], [1.0, 1.0, 0.8, 0.6],
                                  [1.0, 0.9, 0.9, 0.7], [2.0, 2.5, 3.0, 3.5]]):
        messages += run_messages(f"run-{day}", T0 + day * 3600, losses, status="failure" if day == 3 else "success")
    return messages


Tables = Dict[str, List[dict]]


def replay(check: Callable[..., None], **sides: Union[List[RawMessage], Tables]) -> None:
    """One bounded pipeline with a graph per side given as messages (``got=messages, full=other_messages``),
    checked by ``assert_that``: ``check`` receives, for each side, its tables' rows (dicts in the order of their
    JSON), ``check(got={table: rows}, full={table: rows})``, and raises to fail the run. A side given as tables
    (``full=clean_tables``) is passed on as it is."""
    given = {side: tables for side, tables in sides.items() if isinstance(tables, dict)}
    with batch_pipeline() as p:
        tables = {}
        for side, messages in sides.items():
            if side in given:
                continue
            outputs = p | f"Create_{side}" >> beam.Create(messages) | f"Detect_{side}" >> Detect(SETTINGS)
            tables.update({f"{side}.{name}": outputs[name] | f"Json_{side}_{name}" >> beam.Map(json.dumps,
                                                                                                sort_keys=True)
                           for name in TABLES})
        assert_rows(tables, lambda found: check(**given, **{side: {name: [json.loads(row) for row in sorted(
            found[f"{side}.{name}"])] for name in TABLES} for side in sides if side not in given}), label="tables")


@pytest.fixture(scope="module")
def clean_tables() -> Tables:
    """The suite's tables with nothing injected: a module fixture, so it is made before any test's patch (a
    side replayed beside the poisoned one in the same pipeline would be poisoned too)."""
    found: Dict[str, list] = {}
    with batch_pipeline() as p:
        outputs = p | beam.Create(suite()) | Detect(SETTINGS)
        sinks = {name: collect_outputs(outputs[name] | f"Json_{name}" >> beam.Map(json.dumps, sort_keys=True), name)
                 for name in TABLES}
    for name, rows in sinks.items():
        found[name] = [json.loads(row) for row in sorted(rows)]
    return found


def without(rows: List[dict], **match) -> List[dict]:
    """The rows that do not match every given column."""
    return [row for row in rows if any(row.get(k) != v for k, v in match.items())]


def single_dead_letter(outputs, reason_start: str) -> dict:
    (dead,) = outputs[DEAD_LETTER.name]
    assert dead["reason"].startswith(reason_start), dead["reason"]
    assert "RuntimeError: injected" in dead["reason"]
    return dead


def poisoned(original, is_poison):
    def wrapper(*args, **kwargs):
        if is_poison(*args, **kwargs):
            raise RuntimeError("injected")
        return original(*args, **kwargs)
    return wrapper


def test_a_payload_the_parser_fails_on_is_dead_lettered_whole(monkeypatch):
    poison = raw("cifar", "run-9", "poison", points=[("loss", 1.0, 1, T0)])
    monkeypatch.setattr(wire, "parse_message", poisoned(wire.parse_message, lambda payload: b"poison" in payload))

    def check(outputs, full):
        dead = single_dead_letter(outputs, "error in parse: ")
        assert dead["payload"] == poison.payload.decode()
        assert {k: v for k, v in outputs.items() if k != DEAD_LETTER.name} == {
            k: v for k, v in full.items() if k != DEAD_LETTER.name}
    replay(check, outputs=suite() + [poison], full=suite())


def test_a_message_summarize_fails_on_is_dead_lettered_and_its_run_goes_on(monkeypatch):
    extra = raw("cifar", "run-1", "run-1/extra", points=[("accuracy", 70.0, 5, T0 + 3600 + 2)])
    monkeypatch.setattr(transforms.parse, "summarize",
                        poisoned(transforms.parse.summarize, lambda message, *_: message.id == "run-1/extra"))

    def check(outputs, full):
        dead = single_dead_letter(outputs, "error in summarize: ")
        assert json.loads(dead["payload"])["id"] == "run-1/extra" and dead["source"] == "run:cifar/run-1"
        assert {k: v for k, v in outputs.items() if k != DEAD_LETTER.name} == {
            k: v for k, v in full.items() if k != DEAD_LETTER.name}
    replay(check, outputs=suite() + [extra], full=suite())


def test_a_message_the_run_assembler_fails_on_leaves_the_run_as_it_was(monkeypatch):
    extra = raw("cifar", "run-1", "run-1/extra", points=[("accuracy", 70.0, 5, T0 + 3600 + 2)])
    monkeypatch.setattr(core.runs.RunAccumulator, "add", poisoned(
        core.runs.RunAccumulator.add, lambda self, summary: summary.id == "run-1/extra"))

    def check(outputs, full):
        single_dead_letter(outputs, "error in assemble run: ")
        assert {k: v for k, v in outputs.items() if k != DEAD_LETTER.name} == {
            k: v for k, v in full.items() if k != DEAD_LETTER.name}
    replay(check, outputs=suite() + [extra], full=suite())


def test_a_run_that_cannot_be_finalized_is_dead_lettered_and_later_runs_are_checked_without_it(monkeypatch):
    monkeypatch.setattr(core.runs.RunAccumulator, "result", poisoned(
        core.runs.RunAccumulator.result, lambda self, *_: self.run == "run-2"))

    def check(outputs, control):
        dead = single_dead_letter(outputs, "error in finalize run: ")
        assert json.loads(dead["payload"])["run"] == "run-2"
        # run-2's windows were checked live, before its end failed: their alerts stand
        outputs[ALERTS.name] = without(outputs[ALERTS.name], run_id="run-2", kind="window_out_of_bounds")
        assert {k: v for k, v in outputs.items() if k not in (DEAD_LETTER.name, METRIC_WINDOWS.name)} == {
            k: v for k, v in control.items() if k not in (DEAD_LETTER.name, METRIC_WINDOWS.name)}
    replay(check, outputs=suite(), control=[m for m in suite() if b'"run-2"' not in m.payload])


def test_a_metric_check_that_fails_leaves_that_metric_history_as_it_was(monkeypatch, clean_tables):
    monkeypatch.setattr(transforms.history, "check_metric", poisoned(
        transforms.history.check_metric, lambda history, observation, config: (
            observation.run, observation.metric) == ("run-2", "loss_final")))

    def check(outputs, full):
        dead = single_dead_letter(outputs, "error in metric check: ")
        assert json.loads(dead["payload"])["metric"] == "loss_final" and dead["source"] == "stage:metric"
        # Every other metric and table is as if nothing happened; loss_final's later bounds come from a
        # history without run-2 (its state was left as it was before the failing item).
        assert outputs[JOB_HISTORY.name] == full[JOB_HISTORY.name]
        assert without(outputs[METRIC_HISTORY.name], metric_name="loss_final") == without(
            full[METRIC_HISTORY.name], metric_name="loss_final")
        loss_final = [r for r in outputs[METRIC_HISTORY.name] if r["metric_name"] == "loss_final"]
        assert sorted(r["run_id"] for r in loss_final) == ["run-0", "run-1", "run-3", "run-4"]
        # run-0's 0.7 alone: run-1's 0.7 was out of its zero-variance bound, run-3 failed; with run-2's 0.6 the
        # bound would be 0.75.
        upper = [r["metric_upper_bound"] for r in loss_final if r["run_id"] == "run-4"][0]
        assert upper == pytest.approx(0.7)
    replay(check, outputs=suite(), full=clean_tables)


def test_a_job_check_that_fails_is_dead_lettered_and_the_other_runs_alert_as_before(monkeypatch, clean_tables):
    monkeypatch.setattr(transforms.history, "check_job", poisoned(
        transforms.history.check_job, lambda history, run, config: run.run == "run-3"))

    def check(outputs, full):
        single_dead_letter(outputs, "error in job check: ")
        assert {k: v for k, v in outputs.items() if k not in (DEAD_LETTER.name, ALERTS.name)} == {
            k: v for k, v in full.items() if k not in (DEAD_LETTER.name, ALERTS.name)}
        assert outputs[ALERTS.name] == without(full[ALERTS.name], kind="job_failed", run_id="run-3")
    replay(check, outputs=suite(), full=clean_tables)


def test_a_window_whose_aggregates_fail_is_dead_lettered_and_the_other_windows_are_written(monkeypatch, clean_tables):
    monkeypatch.setattr(transforms.windows, "window_aggregates", poisoned(
        transforms.windows.window_aggregates, lambda points, aggregations: any(p.value == 3.5 for p in points)))

    def check(outputs, full):
        dead = single_dead_letter(outputs, "error in aggregate a window of loss: ")
        assert json.loads(dead["payload"])["points"] == [[T0 + 4 * 3600 + 3, 20, 3.0], [T0 + 4 * 3600 + 4, 30, 3.5]]
        assert outputs[METRIC_WINDOWS.name] == without(full[METRIC_WINDOWS.name], run_id="run-4", window_index=1)
        assert outputs[JOB_HISTORY.name] == full[JOB_HISTORY.name]
        assert outputs[METRIC_HISTORY.name] == full[METRIC_HISTORY.name]
    replay(check, outputs=suite(), full=clean_tables)


def test_a_window_check_that_fails_is_dead_lettered_and_the_windows_are_still_written(monkeypatch, clean_tables):
    monkeypatch.setattr(core.window_checks, "check_window", poisoned(
        core.window_checks.check_window, lambda state, window, config: (window.run, window.index) == (
            "run-4", 0)))

    def check(outputs, full):
        dead = single_dead_letter(outputs, "error in window check: ")
        assert dead["source"] == "stage:window"
        assert {k: v for k, v in outputs.items() if k not in (DEAD_LETTER.name, ALERTS.name)} == {
            k: v for k, v in full.items() if k not in (DEAD_LETTER.name, ALERTS.name)}
        assert without(outputs[ALERTS.name], kind="window_out_of_bounds") == without(
            full[ALERTS.name], kind="window_out_of_bounds")
    replay(check, outputs=suite(), full=clean_tables)


def test_values_near_the_top_of_the_float_range_do_not_stop_the_replay():
    huge = [raw("cifar", "run-9", "run-9/start", events=[started(T0)]),
            raw("cifar", "run-9", "run-9/points", points=[("loss", 1.7e308, 0, T0 + 1), ("loss", 1.7e308, 10, T0 + 2),
                                                         ("loss", -1.7e308, 20, T0 + 3)]),
            raw("cifar", "run-9", "run-9/end", events=[finished(T0 + 4)])]

    def check(outputs):
        windows = [w for w in outputs[METRIC_WINDOWS.name] if w["run_id"] == "run-9"]
        assert [(w["window_index"], w["mean"], w["max"]) for w in windows] == [(0, 1.7e308, 1.7e308),
                                                                              (1, -1.7e308, -1.7e308)]
        metrics = {r["metric_name"]: r["metric_value"] for r in outputs[METRIC_HISTORY.name] if r["run_id"] == "run-9"}
        assert metrics["loss_final"] == -1.7e308 and metrics["loss_average"] == pytest.approx(1.7e308 / 3)
        assert outputs[DEAD_LETTER.name] == []
    replay(check, outputs=suite() + huge)


def test_event_data_nested_too_deep_is_dead_lettered_with_the_whole_payload():
    data: dict = {}
    for _ in range(900):
        data = {"a": data}
    deep = RawMessage(json.dumps({"schema": wire.SCHEMA, "id": "deep", "test": "cifar", "run": "run-9",
                                  "events": [{"type": "note", "time": T0, "data": data}]}).encode(), "file:deep.jsonl")

    def check(outputs):
        (dead,) = outputs[DEAD_LETTER.name]
        assert dead["reason"] == f"invalid event [0]: data is nested deeper than {wire.MAX_EVENT_DATA_DEPTH} levels"
        assert json.loads(dead["payload"])["id"] == "deep"
    replay(check, outputs=suite() + [deep])


def test_a_late_point_the_windows_fail_on_is_dead_lettered_alone_on_a_stream(monkeypatch):
    import core.windows

    monkeypatch.setattr(core.windows.TagWindows, "update_emitted", poisoned(
        core.windows.TagWindows.update_emitted, lambda self, point: point.value == 1.5))
    late_config = configs(cifar={"window_config": {"allowed_lateness_seconds": 60, "tags": {
        "loss": {"count": 2, "aggregations": ["mean"]}}}})
    stream = (TestStream().advance_watermark_to(Timestamp.of(T0))
              .add_elements([raw("cifar", "r", "start", events=[started(T0)],
                                 points=[("loss", 1.0, 0, T0 + 1), ("loss", 2.0, 10, T0 + 2)])])
              .advance_watermark_to(Timestamp.of(T0 + 10))
              .add_elements([raw("cifar", "r", "late", points=[("loss", 1.5, 5, T0 + 1.5)])])
              .add_elements([raw("cifar", "r", "end", events=[finished(T0 + 20)])])
              .advance_watermark_to(Timestamp.of(T0 + 1000))
              .advance_watermark_to_infinity())
    with streaming_pipeline() as p:
        outputs = detect(p | stream, GraphSettings(late_config, RunLifecycle(grace_seconds=10, timeout_seconds=600),
                                                   streaming=True))
        assert_that(outputs[DEAD_LETTER.name] | beam.Map(lambda d: (d["reason"], json.loads(d["payload"])["point"])),
                    equal_to([("error in window a point: RuntimeError: injected",
                               {"tag": "loss", "value": 1.5, "step": 5, "time": T0 + 1.5})]), label="dead")
        assert_that(outputs[METRIC_WINDOWS.name] | beam.Map(lambda w: (w["window_index"], w["revision"], w["mean"])),
                    equal_to([(0, 0, 1.5)]), label="windows")


def test_a_tag_whose_windows_fail_is_dropped_from_the_run_with_its_points_dead_lettered(monkeypatch, clean_tables):
    import core.windows

    monkeypatch.setattr(core.windows.TagWindows, "close", poisoned(
        core.windows.TagWindows.close, lambda self: any(p.value == 3.5 for p in self.pending)))

    def check(outputs, full):
        dead = outputs[DEAD_LETTER.name]
        assert {d["reason"] for d in dead} == {"error in windows of loss: RuntimeError: injected"}
        assert sorted(json.loads(d["payload"])["point"]["value"] for d in dead) == [2.0, 2.5, 3.0, 3.5]
        assert outputs[METRIC_WINDOWS.name] == without(full[METRIC_WINDOWS.name], run_id="run-4")
        assert outputs[JOB_HISTORY.name] == full[JOB_HISTORY.name]
    replay(check, outputs=suite(), full=clean_tables)
