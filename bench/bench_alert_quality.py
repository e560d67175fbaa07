"""Alert-quality benchmark: does trainguard alert on regressions, and only on them?

A generator of its own writes a synthetic suite in the wire format: several
daily tests, each run a noisy training curve (loss, Accuracy/test, step_time,
and a constant ``epochs``), half the tests with normal noise and half with
heavy-tailed noise (Student t, 3 degrees of freedom, scaled to the same
standard deviation). About 20% of the runs (after a first stretch of healthy
runs) carry one injected fault: a final-accuracy drop, a loss divergence or a
step-time slowdown that starts part-way through the run, or a crash. Half the
tests get a persistent accepted change (loss 1.5x, or step time 1.25x, for
good). The lines are shuffled, then replayed through the pipeline
(``pipeline.replay``, FnApiRunner, a fresh DuckDB store) with the config of
the issue's goals: ``false_alert_rate`` 0.0005 on 4 metrics per test,
``rebaseline_after`` 3, step-aligned count windows of 10 points with a 2-of-3
debounce on loss and step time.

Scores, from the alerts the replay wrote:

- recall: injected faults with at least one alert on their run;
- false alerts per 100 healthy runs: every alert on a run with no fault and
  outside the stretch of an accepted change (all metrics of a test together);
- alerts per accepted change: every alert on the runs from the change's first
  run to ``rebaseline_after`` + 2 runs after it (no faults are injected there);
- alerts on the constant metric;
- in-run: divergence and slowdown faults alerted by a live window before the
  run ended, and the median delay from the fault's onset to that alert as a
  share of the run left after the onset.

    python bench/bench_alert_quality.py [--tests 8] [--runs 60] [--seed 1] [--workdir bench/out/alert-quality] [--json]

The figures are recorded in the README (Benchmarks). Nothing here is timed.

Changes (2026-11-23), and why:

- A point per step (``STEP_EVERY`` 1, was 2). A run had 101 points a tag, so
  10-point windows cut it into 10 windows, and a 2-of-3 debounce cannot alert
  before the end of the window after the one the fault starts in: even if that
  first window always counted, the median delay would be 28% of the run left
  after the onset (onsets at 30-70% of the run), above the 25% goal whatever the
  check does. Trainers commonly log every step, and a real run is longer than
  10 windows; with 201 points (20 windows) the same debounce's floor is 14%
  (24% if the window the fault starts in never counts). The curves, the noise
  per point, the faults (6-point accuracy drop, divergence exp(5·progress past
  the onset), 35% slowdown, crash) and their onsets are unchanged, in progress
  of the run.
- The window checks compare with the same steps of the last 20 successful runs
  (``history_runs`` 20, was 10): a sensible choice for a daily test, where a
  month of history is at hand; with 10 the cutoff was calibrated for 10 values
  (wide) for the whole life of the test.
- The scores and their definitions are unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import statistics
import sys
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.replay import run as replay
from trainguard import wire
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

DAY = 86400.0
START = 1767225600.0  # 2026-01-01T00:00:00Z
STEPS = 200
STEP_EVERY = 1  # a point per step: 201 points a tag per run, 20 windows of 10 (was 2: 10 windows; see the docstring)
STEP_SECONDS = 3.0
HEALTHY_PREFIX = 10  # no fault before this run: the checks need a history first
FAULT_SHARE = 0.20
FAULT_KINDS = ("accuracy_drop", "divergence", "slowdown", "crash")
LIVE_FAULTS = ("divergence", "slowdown")  # the faults a live window should catch before the run ends
REBASELINE_AFTER = 3
CHANGE_SPAN = REBASELINE_AFTER + 3  # runs from a change's first run on that score as "the change"
EPOCHS = 90.0
HISTORY_BUCKETS = (("10-19", 0, 20), ("20-39", 20, 40), ("40+", 40, math.inf))  # recall by runs before the fault

FALSE_ALERT_RATE = 0.0005
WINDOW_HISTORY_RUNS = 20  # the same steps in the last 20 successful runs (was 10; see the docstring)
WINDOW_CHECK = {"count": 10, "aggregations": ["mean"], "checks": [{
    "aggregation": "mean", "history": "step_aligned", "history_runs": WINDOW_HISTORY_RUNS,
    "condition": {"comparison": "less", "success_threshold": {"false_alert_rate": FALSE_ALERT_RATE}},
    "debounce": {"windows": 3, "out_of_bounds": 2}}]}
CONFIG = {
    "//": "The alert-quality goals' config: false_alert_rate on 4 metrics, rebaseline_after 3, live windows.",
    "metric_collection_config": {"default_aggregation_strategies": ["final"],
                                 "metric_to_aggregation_strategies": {"step_time": ["average"]}},
    "regression_test_config": {
        "alert_after_second_test_failure": False, "rebaseline_after": REBASELINE_AFTER,
        "metric_success_conditions": {
            metric: {"comparison": comparison, "success_threshold": {"false_alert_rate": FALSE_ALERT_RATE}}
            for metric, comparison in (("loss_final", "less"), ("Accuracy/test_final", "greater"),
                                       ("step_time_average", "less"), ("epochs_final", "less"))}},
    "window_config": {"tags": {"loss": WINDOW_CHECK, "step_time": WINDOW_CHECK}},
}


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    onset: float  # share of the run's steps after which it shows


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    test: str
    run: str
    index: int
    start: float
    heavy_tails: bool
    loss_level: float = 1.0       # an accepted change multiplies these for good
    step_time_level: float = 1.0
    fault: Optional[Fault] = None
    in_change: bool = False       # one of the first CHANGE_SPAN runs at a new level

    @property
    def steps(self) -> int:
        return int(STEPS * self.fault.onset) if self.fault and self.fault.kind == "crash" else STEPS

    def time_at(self, step: int) -> float:
        return self.start + 5.0 + sum(self.step_seconds(s) for s in range(0, step, STEP_EVERY)) * STEP_EVERY

    def step_seconds(self, step: int) -> float:
        slow = 1.35 if self.fault and self.fault.kind == "slowdown" and step >= self.fault.onset * STEPS else 1.0
        return STEP_SECONDS * self.step_time_level * slow

    @property
    def end(self) -> float:
        return self.time_at(self.steps) + 10.0


def plan_suite(tests: int, runs: int, seed: int) -> List[PlannedRun]:
    rng = random.Random(seed)
    plans = []
    for t in range(tests):
        test = f"quality-{t:02d}"
        change_at = rng.randrange(runs // 3, 2 * runs // 3) if t % 2 == 0 else None
        change_kind = "loss" if t % 4 == 0 else "step_time"
        for i in range(runs):
            changed = change_at is not None and i >= change_at
            in_change = change_at is not None and change_at <= i < change_at + CHANGE_SPAN
            fault = None
            if i >= HEALTHY_PREFIX and not in_change and rng.random() < FAULT_SHARE:
                fault = Fault(rng.choice(FAULT_KINDS), rng.uniform(0.3, 0.7))
            plans.append(PlannedRun(
                test, f"{test}-{i:03d}", i, START + i * DAY, heavy_tails=t % 4 in (1, 2),
                loss_level=1.5 if changed and change_kind == "loss" else 1.0,
                step_time_level=1.25 if changed and change_kind == "step_time" else 1.0,
                fault=fault, in_change=in_change))
    return plans


def _noise(rng: random.Random, heavy_tails: bool) -> float:
    """Zero mean, unit variance: normal, or Student t with 3 degrees of freedom over sqrt(3)."""
    if not heavy_tails:
        return rng.gauss(0, 1)
    chi2 = sum(rng.gauss(0, 1) ** 2 for _ in range(3))
    return rng.gauss(0, 1) / math.sqrt(chi2 / 3) / math.sqrt(3)


def curves(plan: PlannedRun, rng: random.Random, step: int) -> Dict[str, float]:
    progress = step / STEPS
    fault = plan.fault
    past_onset = max(0.0, progress - fault.onset) if fault else 0.0
    loss = (2.3 * math.exp(-3 * progress) + 0.1) * plan.loss_level * (1 + 0.02 * _noise(rng, plan.heavy_tails))
    if fault and fault.kind == "divergence":
        loss *= math.exp(5 * past_onset)
    accuracy = 76.0 * (1 - math.exp(-4 * progress)) + 0.3 * _noise(rng, plan.heavy_tails)
    if fault and fault.kind == "accuracy_drop":
        accuracy -= 6.0 * min(1.0, past_onset / 0.1)
    return {"loss": loss, "Accuracy/test": accuracy,
            "step_time": plan.step_seconds(step) * (1 + 0.02 * _noise(rng, plan.heavy_tails))}


def messages(plan: PlannedRun, seed: int) -> List[bytes]:
    rng = random.Random(f"{seed}/{plan.run}")
    points = []
    for step in range(0, plan.steps + 1, STEP_EVERY):
        time = plan.time_at(step)
        points += [wire.point_dict(tag, round(value, 6), round(time, 3), step)
                   for tag, value in curves(plan, rng, step).items()]
    points.append(wire.point_dict("epochs", EPOCHS, round(plan.time_at(plan.steps), 3), plan.steps))
    status = "failure" if plan.fault and plan.fault.kind == "crash" else "success"
    out = [wire.encode_message(plan.test, plan.run, events=[wire.event_dict(wire.RUN_STARTED, plan.start)],
                               message_id=f"{plan.run}/start")]
    for index in range(0, len(points), 50):
        out.append(wire.encode_message(plan.test, plan.run, points[index:index + 50],
                                       message_id=f"{plan.run}/{index}"))
    out.append(wire.encode_message(plan.test, plan.run, events=[wire.event_dict(
        wire.RUN_FINISHED, plan.end, {"status": status})], message_id=f"{plan.run}/end"))
    return out


def write_suite(workdir: str, plans: Sequence[PlannedRun], seed: int) -> str:
    lines = [m for plan in plans for m in messages(plan, seed)]
    random.Random(seed).shuffle(lines)  # results must not depend on arrival order
    os.makedirs(os.path.join(workdir, "configs"), exist_ok=True)
    with open(os.path.join(workdir, "configs", "default.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
    path = os.path.join(workdir, "suite.jsonl")
    with open(path, "wb") as f:
        f.writelines(line + b"\n" for line in lines)
    return path


def score(plans: Sequence[PlannedRun], alerts: Sequence[dict]) -> Dict[str, object]:
    by_run: Dict[str, List[dict]] = {}
    for alert in alerts:
        by_run.setdefault(alert["run_id"], []).append(alert)
    faults = [p for p in plans if p.fault]
    healthy = [p for p in plans if not p.fault and not p.in_change]
    change_firsts = [p for p in plans if p.in_change and (p.index == 0 or not _in_change_before(plans, p))]
    detected = [p for p in faults if by_run.get(p.run)]
    live = [p for p in faults if p.fault.kind in LIVE_FAULTS]
    delays = []
    for plan in live:
        onset = plan.time_at(int(plan.fault.onset * STEPS))
        windows = [a for a in by_run.get(plan.run, []) if a["kind"] == "window_out_of_bounds"
                   and _epoch(a["created_at"]) < plan.end]
        if windows:
            first = min(_epoch(a["created_at"]) for a in windows)
            delays.append(max(0.0, first - onset) / (plan.end - onset))
    change_alerts = [len(by_run.get(p.run, [])) for p in plans if p.in_change]
    false_alerts = sum(len(by_run.get(p.run, [])) for p in healthy)
    missed = sorted(f"{p.run} ({p.fault.kind}, {'t3' if p.heavy_tails else 'normal'})"
                    for p in faults if not by_run.get(p.run))
    return {
        "runs": len(plans), "faults": len(faults), "healthy_runs": len(healthy),
        "accepted_changes": len(change_firsts), "alerts": len(alerts),
        "recall": len(detected) / len(faults) if faults else None,
        "recall_by_kind": {kind: _share([p for p in faults if p.fault.kind == kind], by_run)
                           for kind in FAULT_KINDS},
        "recall_by_history": {label: _share([p for p in faults if low <= p.index < high], by_run)
                              for label, low, high in HISTORY_BUCKETS},
        "false_alerts_per_100_healthy_runs": 100 * false_alerts / len(healthy) if healthy else None,
        "alerts_per_accepted_change": sum(change_alerts) / len(change_firsts) if change_firsts else None,
        "constant_metric_alerts": sum(1 for a in alerts if a.get("metric_name") == "epochs_final"),
        "in_run_alerted": len(delays) / len(live) if live else None,
        "in_run_median_delay": statistics.median(delays) if delays else None,
        "missed": missed,
        "alert_kinds": _kinds(alerts),
    }


def _in_change_before(plans: Sequence[PlannedRun], plan: PlannedRun) -> bool:
    return any(p.test == plan.test and p.index == plan.index - 1 and p.in_change for p in plans)


def _share(plans: Sequence[PlannedRun], by_run: Dict[str, List[dict]]) -> Optional[float]:
    return sum(1 for p in plans if by_run.get(p.run)) / len(plans) if plans else None


def _kinds(alerts: Sequence[dict]) -> Dict[str, int]:
    kinds: Dict[str, int] = {}
    for alert in alerts:
        kinds[alert["kind"]] = kinds.get(alert["kind"], 0) + 1
    return dict(sorted(kinds.items()))


def _epoch(text: str) -> float:
    from core.alert_record import epoch_seconds
    return epoch_seconds(text)


def read_alerts(path: str) -> List[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def print_scores(scores: Dict[str, object]) -> None:
    def pct(value) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    print(f"runs {scores['runs']}, injected faults {scores['faults']}, healthy runs {scores['healthy_runs']}, "
          f"accepted changes {scores['accepted_changes']}, alerts {scores['alerts']} {scores['alert_kinds']}")
    print(f"  recall                           {pct(scores['recall'])}  "
          + ", ".join(f"{k} {pct(v)}" for k, v in scores["recall_by_kind"].items()))
    print("  recall by runs of history before the fault: "
          + ", ".join(f"{k} {pct(v)}" for k, v in scores["recall_by_history"].items()))
    print(f"  false alerts per 100 healthy runs {scores['false_alerts_per_100_healthy_runs']:.2f}")
    print(f"  alerts per accepted change       {scores['alerts_per_accepted_change']:.2f}"
          f"  (rebaseline_after {REBASELINE_AFTER}: goal <= {REBASELINE_AFTER + 1})")
    print(f"  alerts on the constant metric    {scores['constant_metric_alerts']}")
    delay = scores["in_run_median_delay"]
    print(f"  in-run: divergence and slowdown alerted live {pct(scores['in_run_alerted'])}, median delay "
          f"{'n/a' if delay is None else f'{100 * delay:.0f}%'} of the run left after the onset")
    if scores["missed"]:
        print(f"  missed: {', '.join(scores['missed'])}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--tests", type=int, default=8, help="daily tests in the suite")
    parser.add_argument("--runs", type=int, default=60, help="runs per test")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generator and the shuffle")
    parser.add_argument("--workdir", default="bench/out/alert-quality", help="where the suite and store go")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    plans = plan_suite(args.tests, args.runs, args.seed)
    suite = write_suite(args.workdir, plans, args.seed)
    alerts_path = os.path.join(args.workdir, "alerts.jsonl")
    replay([f"--input_files={suite}", f"--config_dir={os.path.join(args.workdir, 'configs')}",
            f"--local_store={os.path.join(args.workdir, 'store.duckdb')}", f"--alerts_file={alerts_path}"])
    scores = score(plans, read_alerts(alerts_path))
    if args.json:
        print(json.dumps(scores, indent=1))
    else:
        print_scores(scores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
