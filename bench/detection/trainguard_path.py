"""trainguard on the suite: the real pipeline on the generated wire-format lines, read back from its store.

Every operating point is the issue's config at one false-alert budget
(``false_alerts_per_100_runs``, which the config splits over its checks, run-level
and live; :func:`config`). One replay takes all of
a suite's operating points at once, each as its own copy of every test
(``det03-op1``, with a config file of its own): tests share no state, so this
is the same as one replay per point, without paying the replay's fixed cost
per point. The replay is ``pipeline.replay.run`` on FnApiRunner into a fresh
DuckDB store, as ``python -m pipeline`` runs it; the alerts and the stored
bounds are read back from the store (:func:`run_trainguard`).

A stored bound is judged by its distance from the true centre of a healthy run
(:func:`~bench.detection.suite.bound_centre`: the level, for the bimodal test's
step time the slow mode) in σ of the true noise, positive on the side the
check lets through; the bounds of runs in a change's or shift's first runs,
judged against the old level, are left out (:func:`bound_distances`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from types import MappingProxyType
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from bench.detection.scoring import Alert
from bench.detection.suite import (
    ACCURACY,
    CONSTANT,
    EPOCHS,
    METRICS,
    REBASELINE_AFTER,
    STEP_TIME,
    RunRecord,
    Suite,
    bound_centre,
)
from trainguard import wire

BUDGETS = (1.0, 3.0, 0.3)  # false_alerts_per_100_runs: the first is the default; the others its operating curve
DEFAULT_BUDGET = BUDGETS[0]
WAIT = 10  # the wait_for_n_points_of_history
MIN_EFFECT_REL = 0.005
POINTS_PER_MESSAGE = 100
LIVE_TAGS = ("loss", "step_time")  # live count windows, checked step-aligned
WINDOW_RUNS = 20  # the same steps of the last 20 successful runs (as bench_alert_quality)
HISTORY_BY = ("accelerator",)  # every run's run_started says its machine type (SLOW_TYPE on the bimodal test's slow runs)
FAST_TYPE, SLOW_TYPE = "v5e", "v4"


NoiseByMetric = Mapping[str, str]
"""A test's measured ``noise`` per run-level metric (``core.noise_evidence``); absent: the default."""


def config(budget: float, history_by: Sequence[str] = HISTORY_BY,
           noise: NoiseByMetric = MappingProxyType({})) -> Dict[str, object]:
    """The issue's config at one false-alert budget: 4 run-level metrics, live windows on loss and step time,
    every check's threshold the budget's share (no ``success_threshold``), and step time, which depends on the
    machine, with a baseline per value of the runs' ``history_by`` keys (the machine type their
    ``run_started`` reports; none: one history), its run-level value and its live windows alike. ``noise``:
    the ``noise`` of the metrics that set one."""
    condition = {"min_effect_rel": MIN_EFFECT_REL}
    window = {"count": 10, "aggregations": ["mean"], "checks": [{
        "aggregation": "mean", "history": "step_aligned", "history_runs": WINDOW_RUNS,
        "condition": {"comparison": "less", **condition}, "debounce": {"windows": 3, "out_of_bounds": 2}}]}
    return {
        "//": f"bench/bench_detection.py: the issue's config at {budget:g} false alerts per 100 runs",
        "metric_collection_config": {"default_aggregation_strategies": ["final"],
                                     "metric_to_aggregation_strategies": {"step_time": ["average"]}},
        "regression_test_config": {
            "alert_after_second_test_failure": False, "rebaseline_after": REBASELINE_AFTER,
            "false_alerts_per_100_runs": budget,
            "metric_success_conditions": {
                m.name: {"comparison": m.comparison, "wait_for_n_points_of_history": WAIT, **condition,
                         **({"history_by": list(history_by)} if m is STEP_TIME else {}),
                         **({"noise": noise[m.name]} if m.name in noise else {})}
                for m in METRICS}},
        "window_config": {"tags": {tag: {**window, **({"history_by": list(history_by)}
                                                      if tag == STEP_TIME.tag else {})} for tag in LIVE_TAGS}},
    }


def replay_test_name(test: str, point: int) -> str:
    return f"{test}-op{point}"


def messages(run: RunRecord, test: str, accelerator: str = FAST_TYPE) -> Iterator[bytes]:
    """One run's wire-format lines under a test name: its start (with its machine type), its points 100 a
    message, its end."""
    run_id = f"{test}-{run.index:03d}"
    yield wire.encode_message(test, run_id, events=[wire.event_dict(wire.RUN_STARTED, run.start,
                                                                    {"accelerator": accelerator})],
                              message_id=f"{run_id}/start")
    times = run.times.tolist()
    on_eval = dict(zip(run.accuracy_steps.tolist(), run.accuracy.tolist()))
    points: List[Dict[str, object]] = []
    for step, time, loss, step_time in zip(run.steps.tolist(), times, run.loss.tolist(), run.step_time.tolist()):
        points.append({"tag": "loss", "value": loss, "time": time, "step": step})
        points.append({"tag": "step_time", "value": step_time, "time": time, "step": step})
        if step in on_eval:
            points.append({"tag": ACCURACY.tag, "value": on_eval[step], "time": time, "step": step})
    points.append({"tag": CONSTANT.tag, "value": run.values.get(CONSTANT.name, EPOCHS), "time": times[-1],
                   "step": int(run.steps[-1])})
    for index in range(0, len(points), POINTS_PER_MESSAGE):
        yield wire.encode_message(test, run_id, points[index:index + POINTS_PER_MESSAGE],
                                  message_id=f"{run_id}/{index}")
    status = wire.STATUS_SUCCESS if run.succeeded else wire.STATUS_FAILURE
    yield wire.encode_message(test, run_id, events=[wire.event_dict(wire.RUN_FINISHED, run.end, {"status": status})],
                              message_id=f"{run_id}/end")


def write_inputs(workdir: str, suite: Suite, budgets: Sequence[float], history_by: Sequence[str] = HISTORY_BY,
                 noise: Mapping[str, NoiseByMetric] = MappingProxyType({})) -> Tuple[str, str]:
    """The suite's lines for every operating point and a config file per test copy: (input file, config dir).
    ``noise``: per test (its plan's name), the measured noise of its metrics."""
    configs = os.path.join(workdir, "configs")
    os.makedirs(configs, exist_ok=True)
    path = os.path.join(workdir, "suite.jsonl")
    with open(path, "wb") as f:
        for point, budget in enumerate(budgets):
            for plan, runs in zip(suite.plans, suite.runs):
                test = replay_test_name(plan.name, point)
                with open(os.path.join(configs, f"{test}.json"), "w") as c:
                    json.dump(config(budget, history_by, noise.get(plan.name, {})), c, indent=1)
                for run in runs:
                    accelerator = SLOW_TYPE if run.index in plan.slow_runs else FAST_TYPE
                    f.writelines(line + b"\n" for line in messages(run, test, accelerator))
    return path, configs


@dataclasses.dataclass(frozen=True)
class StoredBound:
    test: int
    run: int
    metric: str
    lower: Optional[float]
    upper: Optional[float]


@dataclasses.dataclass(frozen=True)
class TrainguardResult:
    """What one replay of a suite gave, per operating point (index into the budgets)."""
    alerts: Dict[int, List[Alert]]
    bounds: Dict[int, List[StoredBound]]
    live: Dict[int, List[Alert]]  #: the window alerts raised before their run ended
    seconds: float


def run_trainguard(suite: Suite, workdir: str, budgets: Sequence[float] = BUDGETS,
                   history_by: Sequence[str] = HISTORY_BY,
                   noise: Mapping[str, NoiseByMetric] = MappingProxyType({})) -> TrainguardResult:
    """Replays the suite at every budget into a fresh store under ``workdir`` and reads what it wrote."""
    import duckdb

    from pipeline.replay import run as replay

    shutil.rmtree(workdir, ignore_errors=True)
    path, configs = write_inputs(workdir, suite, budgets, history_by, noise)
    store = os.path.join(workdir, "store.duckdb")
    summary = replay([f"--input_files={path}", f"--config_dir={configs}", f"--local_store={store}",
                      f"--alerts_file={os.path.join(workdir, 'alerts.jsonl')}", "--no_progress"])
    names = {replay_test_name(p.name, point): (point, p.index) for point in range(len(budgets)) for p in suite.plans}
    ends = {(p.index, r.index): r.end for p, runs in zip(suite.plans, suite.runs) for r in runs}
    alerts: Dict[int, List[Alert]] = {point: [] for point in range(len(budgets))}
    live: Dict[int, List[Alert]] = {point: [] for point in range(len(budgets))}
    bounds: Dict[int, List[StoredBound]] = {point: [] for point in range(len(budgets))}
    with duckdb.connect(store, read_only=True) as db:
        for test, run_id, metric, kind, created in db.execute(
                "SELECT test_name, run_id, metric_name, kind, epoch(created_at) FROM alerts").fetchall():
            point, t = names[test]
            alert = Alert(t, _run_index(run_id), _tag(metric), kind)
            alerts[point].append(alert)
            if kind == "window_out_of_bounds" and created < ends[(t, alert.run)]:
                live[point].append(alert)
        for test, run_id, metric, lower, upper in db.execute(
                "SELECT test_name, run_id, metric_name, metric_lower_bound, metric_upper_bound FROM metric_history "
                "WHERE within_bounds IS NOT NULL").fetchall():
            point, t = names[test]
            bounds[point].append(StoredBound(t, _run_index(run_id), metric, lower, upper))
    return TrainguardResult(alerts, bounds, live, summary.seconds)


def measure_noise(suite: Suite, workdir: str, history_by: Sequence[str] = HISTORY_BY) -> Dict[str, NoiseByMetric]:
    """What ``trainguard-backtest --suggest_noise`` says of ``suite`` replayed at the default budget: per test
    (its plan's name), the metrics whose noise the fleet's history suggests is normal. The benchmark measures
    it on another suite of the same fleet (last month's runs), as a user would on their stored history."""
    from pipeline.backtest import run as backtest

    run_trainguard(suite, workdir, (DEFAULT_BUDGET,), history_by)
    report = backtest([f"--config_dir={os.path.join(workdir, 'configs')}",
                       f"--local_store={os.path.join(workdir, 'store.duckdb')}", "--suggest_noise"])
    found: Dict[str, Dict[str, str]] = {}
    for check in report["checks"]:
        if check["suggested"] != "heavy_tailed":
            found.setdefault(check["test"].rsplit("-op", 1)[0], {})[check["metric"]] = check["suggested"]
    return found


def _run_index(run_id: str) -> int:
    return int(run_id.rsplit("-", 1)[1])


def _tag(metric: Optional[str]) -> Optional[str]:
    """``loss_final`` and the window's ``loss_mean`` are both the tag ``loss``."""
    return metric.rsplit("_", 1)[0] if metric else None


def bound_distances(suite: Suite, bounds: Sequence[StoredBound]) -> Dict[str, List[float]]:
    """Per metric: each stored bound's distance from the true centre, in σ of the noise (see the docstring)."""
    by_name = {m.name: m for m in METRICS}
    distances: Dict[str, List[float]] = {m.name: [] for m in METRICS if m is not CONSTANT}
    for b in bounds:
        metric = by_name.get(b.metric)
        plan = suite.plans[b.test]
        if metric is None or metric is CONSTANT or plan.in_stretch(b.run):
            continue
        bound = b.upper if metric.worse > 0 else b.lower
        if bound is None:
            continue
        centre, sigma = bound_centre(plan, b.run, metric)
        distances[metric.name].append((bound - centre) * metric.worse / sigma)
    return distances


def summarize_distances(distances: Dict[str, List[float]]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per metric: how many bounds, their median, p90 and max distance, and the share beyond 12σ."""
    return {name: _summary(values) for name, values in distances.items()}


def _summary(values: Sequence[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None, "beyond_12": None}
    array = np.asarray(values)
    return {"n": len(values), "median": float(np.median(array)), "p90": float(np.percentile(array, 90)),
            "max": float(array.max()), "beyond_12": float(np.mean(array > 12))}

