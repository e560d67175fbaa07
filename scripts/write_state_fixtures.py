"""Writes the state fixtures: today's encoding of representative state, built by the real state machines.

State that lives in a running job is a file format (``core.encoding``): every
later version of trainguard must read what this one wrote. This script runs
the state machines (run assembly, metric and job history, live windows, window
checks, rank windows, stalls, triage, the ordered stage) on a few inputs and
writes, per case, the encoded state to ``<out>/<case>.bin`` and, once for all
cases, ``<out>/expected.json``: the same values in a plain structural form
(:func:`structure`) that does not depend on the encoding at all.
``tests/core/test_encoding.py`` decodes every ``.bin`` with today's classes and
compares it with ``expected.json``, field by field for the fields the bytes hold.

Fixtures of a version are written once and committed; never regenerate them
(that would hide a break). When the encoding of a type changes (a field added,
a schema version bump), ``tests/transforms/test_coders.py`` finds that today's
encoding is no longer the latest set's, byte for byte: write the next set next
to the old ones, which stay decoded::

    python scripts/write_state_fixtures.py --out tests/fixtures/state_v7
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import os
import struct
import sys
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from core import encoding
from core.config import TestConfig, parse_test_config
from core.encoding import describe
from core.history import (
    HistorySeed,
    JobHistory,
    MetricHistory,
    SeededState,
    apply_metric_triage,
    check_job,
    check_metric,
    history_policy,
)
from core.parse import RawMessage, summarize
from core.rank_windows import RankWindows, add_rank_window
from core.records import Alert, MetricObservation
from core.runs import RunAccumulator, RunLifecycle, RunResult
from core.stalls import StallWatch
from core.triage import AlertLedger, RaisedAlert, TriageItem
from core.vocabulary import AlertKind, AlertState, RunStatus, TriageAction
from core.window_checks import (
    RunEnded,
    WindowHistory,
    WindowTriage,
    live_part,
    near_windows,
    settled_runs,
    step_window_history,
    take_unlogged,
    window_triage_targets,
)
from core.windows import TagWindows, Window, WindowPoint, WindowResult, window_aggregates
from trainguard import wire
from transforms.window_state import ClosedWindows, PackedRunWindows, PointColumns, RunIntake, RunWindows

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                           "state_v1")
T0 = 1763596800.0  # 2025-11-20T00:00:00Z, as the tests' origin
DAY = 86400.0
TEST = "fixture/ünïcode test"

CONFIG = {
    "metric_collection_config": {
        "default_aggregation_strategies": ["final", "max"],
        "time_to_accuracy": {"accuracy_tag": "acc", "accuracy_threshold": 0.25},
        "tag_to_rank_reduction": {"step_time": "mean"},
    },
    "regression_test_config": {
        "metric_success_conditions": {
            "loss_final": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 2},
                           "wait_for_n_points_of_history": 2},
        },
        "rebaseline_after": 2,
        "alert_after_second_test_failure": False,
    },
    "window_config": {
        "allowed_lateness_seconds": 30,
        "stall_seconds": 300,
        "tags": {
            "loss": {"count": 3, "aggregations": ["mean", "max", "p90", "histogram"],
                     "checks": [{"aggregation": "mean", "history": "step_aligned", "history_runs": 3,
                                 "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 2},
                                               "wait_for_n_points_of_history": 1},
                                 "debounce": {"windows": 3, "out_of_bounds": 2}},
                                {"aggregation": "max", "history": "trailing", "trailing_windows": 2,
                                 "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
                                               "wait_for_n_points_of_history": 1}}]},
            "step_time": {"count": 2, "aggregations": ["mean"],
                          "rank_check": {"aggregation": "mean",
                                         "condition": {"comparison": "less",
                                                       "success_threshold": {"mads_from_median": 3}},
                                         "debounce": {"windows": 2, "out_of_bounds": 1}}},
            "throughput": {"time_seconds": 60, "period_seconds": 30, "aggregations": ["mean", "sum"]},
        },
    },
}


def _message(run: str, message_id: str, points: Sequence[tuple] = (), events: Sequence[tuple] = (),
             rank: Optional[int] = None, world_size: Optional[int] = None) -> tuple:
    payload = wire.encode_message(TEST, run, [wire.point_dict(tag, value, time, step) for tag, value, step, time in points],
                                  [wire.event_dict(kind, time, data) for kind, time, data in events],
                                  message_id=message_id, rank=rank, world_size=world_size)
    message, rejections = wire.parse_message(payload)
    assert not rejections, rejections
    return message, payload


def _run_messages(run: str, start: float, losses: Sequence[float], ranks: int = 1) -> List[tuple]:
    messages = []
    for rank in range(ranks):
        points = [("loss", loss + 0.01 * rank, 10 * i, start + i) for i, loss in enumerate(losses)]
        points += [("acc", 0.1 * i, 10 * i, start + i + 0.5) for i in range(len(losses))]
        points += [("step_time", 1.0 + 0.25 * rank + 0.01 * i, 10 * i, start + i + 0.25) for i in range(len(losses))]
        points += [("throughput", 1e300 if i == 1 else -0.0, 10 * i, start + 20 * i) for i in range(len(losses))]
        messages.append(_message(run, f"{run}-{rank}-points", points, rank=rank if ranks > 1 else None,
                                 world_size=ranks if ranks > 1 else None))
        events = [("run_started", start, {"host": f"host-{rank}", "logs": "gs://bucket/lögs", "nested": {
            "list": [1, 2.5, None, True, "x"], "big": 2 ** 70}})]
        events.append(("run_finished", start + len(losses) + 5, {"status": "success", "num_failures": 0}))
        messages.append(_message(run, f"{run}-{rank}-events", events=events, rank=rank if ranks > 1 else None,
                                 world_size=ranks if ranks > 1 else None))
    return messages


def _tag_windows(config: TestConfig, tag: str, points: Sequence[WindowPoint], watermark: float) -> tuple:
    windows = TagWindows(config.windows.tags[tag].spec)
    for point in points:
        windows.add(point)
    return windows, windows.settle(watermark)


def _results(run: str, tag: str, closed: Sequence[Window], aggregations: Sequence[str],
             rank: Optional[int] = None, world_size: Optional[int] = None) -> List[WindowResult]:
    return [WindowResult(TEST, run, tag, w.kind, w.index, w.start_time, w.end_time, w.start_step, w.end_step,
                         len(w.points), w.partial, window_aggregates(w.points, aggregations), rank, world_size,
                         None if rank is None else f"host-{rank}") for w in closed]


def build() -> Dict[str, Any]:
    """Every case: a representative value of each kind of state and shuffled element, from the real machines."""
    config = parse_test_config(CONFIG, "fixture.json")
    lifecycle = RunLifecycle()
    cases: Dict[str, Any] = {}

    # Run assembly: summaries of a distributed run's messages, the accumulator, the result.
    messages = _run_messages("run-0", T0, [1.0, 0.9, 0.8, 0.75], ranks=2)
    summaries = [summarize(message, payload, config) for message, payload in messages]
    cases["raw_message"] = RawMessage(messages[0][1], "file:/data/fixture.jsonl", T0 + 1.5)
    cases["message_summary"] = summaries[0]
    accumulator = RunAccumulator(TEST, "run-0")
    for summary in summaries:
        accumulator.add(summary)
    cases["run_accumulator"] = accumulator
    result = accumulator.result(config, lifecycle)
    cases["run_result"] = result

    # Run-level history: a few runs through check_metric and check_job, an accept waiting for its run.
    results: List[RunResult] = [result]
    for day, losses in enumerate([[1.0, 0.8], [1.0, 0.82], [2.0, 1.9], [2.0, 1.95]], start=1):
        run_accumulator = RunAccumulator(TEST, f"run-{day}")
        for message, payload in _run_messages(f"run-{day}", T0 + day * DAY, losses):
            run_accumulator.add(summarize(message, payload, config))
        results.append(run_accumulator.result(config, lifecycle))
    metric_history, job_history, alerts = MetricHistory(), JobHistory(), []
    observations = []
    for run_result in results:
        alerts += check_job(job_history, run_result, config)
        for observation in MetricObservation.all_of(run_result):
            if observation.metric == "loss_final":
                observations.append(observation)
                _, alert = check_metric(metric_history, observation, config.regression_test)
                alerts += [alert] if alert is not None else []
    accept = TriageItem("action-accept", TEST, TriageAction.ACCEPT.value, T0 + 9 * DAY, "loss_final", "run-9",
                        note="intended", user="someone@example.com", future=True)
    apply_metric_triage(metric_history, accept, history_policy(config.regression_test, "loss_final"))
    cases["metric_observations"] = observations
    cases["metric_history"] = metric_history
    cases["job_history"] = job_history
    cases["alerts"] = alerts + [Alert(AlertKind.RUN_STALLED, TEST, "run-0", "stalled", T0 + 100.0,
                                      details={"silent_since": "x", "stall_seconds": 300.0}, instance=repr(T0))]
    cases["triage_item"] = accept

    # Live windows of one run: a count tag with emitted windows, points still pending, a time tag open.
    loss_points = [WindowPoint(T0 + i, 10 * i, 1.0 / (i + 1)) for i in range(8)]
    loss_windows, closed = _tag_windows(config, "loss", loss_points, T0 + 6.5)
    throughput_windows, _ = _tag_windows(config, "throughput", [WindowPoint(T0 + 20 * i, -1, float(i))
                                                                for i in range(5)], T0 + 45)
    stalls = StallWatch(300.0)
    stalls.add(T0, T0 + 10)
    stalls.add(T0 + 400, T0 + 410)
    stalls.settle(T0 + 500)
    stalls.add(T0 + 900, T0 + 905)
    cases["tag_windows"] = loss_windows
    cases["run_windows"] = RunWindows({"loss": loss_windows, "throughput": throughput_windows}, stalls,
                                       last_time=T0 + 905, finished_time=None, watermark_floor=T0 + 6.5,
                                       scheduled=T0 + 7, rank=0, world_size=2, host="host-0",
                                       started={"accelerator": "v5e"}, started_time=T0)
    cases["window_points_bag"] = [("loss", WindowPoint(T0 + 8, 80, 0.1)), ("loss", WindowPoint(T0 + 9, -1, -0.0))]
    cases["stall_watch"] = stalls
    # As the state keeps them since state_v4: the run's value packed, points and closed windows as columns.
    cases["run_windows_packed"] = PackedRunWindows.of(copy.deepcopy(cases["run_windows"]))
    cases["point_columns"] = PointColumns.of(cases["window_points_bag"] + [
        ("throughput", WindowPoint(T0 + 20, -1, 2.5)), ("loss", WindowPoint(T0 + 10.125, 90, float("nan"))),
        ("loss", WindowPoint(T0 + 11, 2**70, float("inf")))])
    cases["closed_windows"] = ClosedWindows.of([(i + 1, "loss", window) for i, window in enumerate(closed)])
    cases["run_intake"] = RunIntake(T0 + 905, None, 2, "host-0", T0 + 910, [(T0 + 900, T0 + 905)])

    # Window checks: three runs' windows checked and ended, a fourth still open, a dismiss applied.
    loss_config = config.windows.tags["loss"]
    window_history = WindowHistory()
    window_results: List[WindowResult] = []
    for run_index, scale in enumerate([1.0, 1.05, 0.95, 3.0]):
        run = f"run-{run_index}"
        points = [WindowPoint(T0 + run_index * DAY + i, 10 * i, scale / (i + 1)) for i in range(9)]
        _, run_closed = _tag_windows(config, "loss", points, float("inf"))
        run_results = _results(run, "loss", run_closed, loss_config.spec.aggregations)
        window_results += run_results
        for window_result in run_results:
            alerts += step_window_history(window_history, window_result, loss_config, 2)
        if run_index < 3:
            step_window_history(window_history, RunEnded(TEST, run, RunStatus.SUCCESS.value, T0 + run_index * DAY
                                                         + 60, "loss", "count"), loss_config, 2)
    dismiss = TriageItem("action-dismiss", TEST, TriageAction.DISMISS.value, T0 + 4 * DAY, "loss_mean", "run-3",
                         alert_id="0123456789abcdef", alert_kind=AlertKind.WINDOW_OUT_OF_BOUNDS.value,
                         instance="count/1")
    for target in window_triage_targets(dismiss, config.windows):
        step_window_history(window_history, target, loss_config, 2)
    cases["window_results"] = window_results[:4]
    cases["run_ended"] = RunEnded(TEST, "run-0", RunStatus.SUCCESS.value, T0 + 60, "loss", "count")
    cases["window_triage"] = WindowTriage(dismiss, "loss", "count", "mean")
    cases["window_history"] = window_history
    # The same runs on two machine types (``history_by``): a history per type, the fourth run's windows open.
    typed_history = WindowHistory()
    for window_result in window_results:
        machine = "v4" if window_result.run in ("run-1", "run-3") else "v5e"
        step_window_history(typed_history, dataclasses.replace(window_result, segment=f"accelerator={machine}"),
                            loss_config, 2)
    for run_index in range(3):
        step_window_history(typed_history, RunEnded(TEST, f"run-{run_index}", RunStatus.SUCCESS.value,
                                                    T0 + run_index * DAY + 60, "loss", "count"), loss_config, 2)
    cases["window_history_by_type"] = typed_history
    typed_parted = copy.deepcopy(typed_history)
    take_unlogged(typed_parted, True, True)
    cases["window_live_by_type"] = live_part(typed_parted)
    cases["window_settled_by_type"] = settled_runs(typed_parted)
    cases["window_near_by_type"] = {segment: near_windows(part.finished_runs, window_results[-2:], ["mean"])
                                    for segment, part in typed_parted.segments.items()}
    # The same history as the streaming job keeps it, in parts (``transforms.window_checks``): the live part
    # (``<name>_keyed``), the finished runs (``<name>_settled``), their windows near the last run's steps
    # (``<name>_near``) and an entry of the open run's windows (``<name>_log``).
    parted = copy.deepcopy(window_history)
    logged = take_unlogged(parted, True, True)
    cases["window_live"] = live_part(parted)
    cases["window_settled"] = parted.finished_runs
    cases["window_near"] = near_windows(parted.finished_runs, window_results[-2:], ["mean"])
    cases["window_log_entry"] = logged[-1]

    # Rank windows: two ranks' windows of a distributed run, one index combined, one waiting.
    step_config = config.windows.tags["step_time"]
    rank_windows = RankWindows()
    for rank in range(3):
        points = [WindowPoint(T0 + i, 10 * i, 1.0 + 0.5 * rank) for i in range(4 if rank < 2 else 2)]
        _, rank_closed = _tag_windows(config, "step_time", points, float("inf"))
        for window_result in _results("run-0", "step_time", rank_closed, step_config.spec.aggregations, rank, 3):
            add_rank_window(rank_windows, window_result, step_config, "mean")
    cases["rank_windows"] = rank_windows

    # Triage: a test's ledger with a mute and recent alerts; an alert on its way to it.
    ledger = AlertLedger()
    mute = TriageItem("action-mute", TEST, TriageAction.MUTE.value, T0, None, until=T0 + 30 * DAY)
    ledger.apply(mute)
    raised = [RaisedAlert(alert.test, alert.created_at, alert.to_row()) for alert in alerts]
    for alert in raised:
        ledger.raise_alert(alert)
    cases["raised_alert"] = raised[0]
    cases["alert_ledger"] = ledger

    # The start-up seed; its index of stored ids (a side input) and a key's state from it (a keyed element).
    cases["history_seed"] = HistorySeed(
        metrics={(TEST, "loss_final"): metric_history}, jobs={TEST: job_history},
        stored_runs=frozenset({(TEST, "run-0"), (TEST, "run-1"), ("other", "run-0")}),
        windows={(TEST, "loss", "count"): window_history}, stored_actions=frozenset({"action-mute", "action-accept"}),
        ledgers={TEST: ledger})
    cases["stored_index"] = cases["history_seed"].index()
    cases["seeded_state"] = SeededState(window_history)
    # The ordered stage's state of a key is its machine's state (``<name>_keyed``: the histories above) and its
    # bag of pending items (``<name>_pending``: each item on its own, as above).

    # Plain values at the edges of what the encoding must keep.
    cases["edge_values"] = {
        "floats": [0.0, -0.0, float("inf"), float("-inf"), float("nan"), struct.unpack(">d", b"\x7f\xf8\x00\x00\x00"
                   b"\x00\x00\x2a")[0], 5e-324, 1.7976931348623157e308, 0.1],
        "ints": [0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, 2 ** 64, -(2 ** 64) - 1, 2 ** 1100, -(2 ** 1100)],
        "text": ["", "ünïcode ✓", "\ud800 lone surrogate", "\x00"],
        "bytes": [b"", b"\x00\xff raw"],
        "containers": [(), (1,), [()], {(1, "a"): [None, True, False]}, {1: "int key", None: "none key"},
                       {1.5, 2.5}, frozenset({"b", "a"}), collections.deque([1, 2], maxlen=3)],
        "enums": [AlertKind.JOB_FAILED, RunStatus.MISSING, TriageAction.MUTE, AlertState.DISMISSED],
    }
    return cases


def fields_in(data: bytes) -> Dict[str, List[str]]:
    """The fields each record type of encoded bytes holds (their types table)."""
    return {name: list(fields) for name, _, fields in encoding.types_of(data) if fields is not None}


def write(out: str, force: bool = False) -> List[str]:
    cases = build()
    os.makedirs(out, exist_ok=True)
    existing = [name for name in os.listdir(out) if name.endswith(".bin") or name == "expected.json"]
    if existing and not force:
        raise SystemExit(f"{out} already holds fixtures ({len(existing)} files): fixtures of a version are written "
                         "once; write a new version's elsewhere (--out), or --force to overwrite")
    expected = {}
    for name, value in sorted(cases.items()):
        data = encoding.encode(value)
        assert describe(encoding.decode(data)) == describe(value), f"{name} does not round-trip"
        with open(os.path.join(out, f"{name}.bin"), "wb") as f:
            f.write(data)
        expected[name] = describe(value)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, sort_keys=True, ensure_ascii=True)
        f.write("\n")
    return sorted(cases)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="directory to write the fixtures to")
    parser.add_argument("--force", action="store_true", help="overwrite existing fixtures (never for committed ones)")
    args = parser.parse_args(argv)
    names = write(args.out, args.force)
    print(f"wrote {len(names)} state fixtures to {args.out}: {', '.join(names)}")


if __name__ == "__main__":
    main()
