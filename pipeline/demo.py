"""Deterministic synthetic training runs in the wire format, for the demo and the benchmarks.

``python -m pipeline.demo --out data/demo`` regenerates the bundled demo data:
four daily tests, each with a story (a regression, failures, a run that never
finishes) and a few malformed lines, so that every kind of output appears.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
from typing import Dict, Iterator, List, Optional, Sequence

from trainguard import wire

DAY = 86400.0
DEMO_START = 1763596800.0  # 2025-11-20T00:00:00Z


@dataclasses.dataclass(frozen=True)
class RunPlan:
    test: str
    run: str
    start: float
    status: Optional[str] = "success"  # None: the run never sends run_finished
    accuracy_drop: float = 0.0          # subtracted from the accuracy curve
    slowdown: float = 1.0               # multiplies step time, divides throughput
    steps: int = 2000
    step_every: int = 20
    step_seconds: float = 0.5
    logs_link: Optional[str] = None


def _curves(plan: RunPlan, rng: random.Random, step: int) -> Dict[str, float]:
    progress = step / plan.steps
    accuracy = 76.0 * (1 - math.exp(-4 * progress)) - plan.accuracy_drop + rng.gauss(0, 0.15)
    return {
        "loss": 2.3 * math.exp(-3 * progress) + 0.05 + abs(rng.gauss(0, 0.002)),
        "Accuracy/test": accuracy,
        "throughput/examples_per_sec": 1200.0 / plan.slowdown + rng.gauss(0, 8),
    }


def run_messages(plan: RunPlan, points_per_message: int = 100, seed: int = 0,
                 schema: str = wire.SCHEMA) -> List[bytes]:
    """The wire messages of one run, in publishing order (``schema``: v1 point objects, or v1.1 columns)."""
    rng = random.Random(f"{seed}/{plan.test}/{plan.run}")
    started = wire.event_dict(wire.RUN_STARTED, plan.start,
                              {"logs_link": plan.logs_link} if plan.logs_link else {})
    points = []
    for step in range(0, plan.steps + 1, plan.step_every):
        time = plan.start + 5.0 + step * plan.step_seconds * plan.slowdown
        for tag, value in _curves(plan, rng, step).items():
            points.append(wire.point_dict(tag, round(value, 6), round(time, 3), step))
    batches = [points[i:i + points_per_message] for i in range(0, len(points), points_per_message)]
    messages = []
    for index, batch in enumerate(batches):
        events = [started] if index == 0 else []
        messages.append(wire.encode_message(plan.test, plan.run, batch, events,
                                            message_id=f"{plan.test}/{plan.run}/{index}", schema=schema))
    if plan.status is not None:
        end = points[-1]["time"] + 10.0
        finished = wire.event_dict(wire.RUN_FINISHED, end, {"status": plan.status, "num_failures": 0})
        messages.append(wire.encode_message(plan.test, plan.run, events=[finished],
                                            message_id=f"{plan.test}/{plan.run}/finished"))
    return messages


def daily_runs(test: str, days: int, start: float = DEMO_START, **overrides_by_day) -> List[RunPlan]:
    """One run per day; ``day_N=dict(...)`` overrides the plan of day N (0-based)."""
    plans = []
    for day in range(days):
        fields = dict(overrides_by_day.get(f"day_{day}", {}))
        plans.append(RunPlan(test=test, run=f"{test}-{day:03d}", start=start + day * DAY, **fields))
    return plans


def demo_plans() -> Dict[str, List[RunPlan]]:
    return {
        # Stddev bounds with a warm-up: accuracy drops on the last two days.
        "pt-cifar-tpu-v3-8": daily_runs("pt-cifar-tpu-v3-8", 12,
                                        day_10={"accuracy_drop": 4.0}, day_11={"accuracy_drop": 4.5,
                                                                               "logs_link": "https://logs.example/cifar/11"}),
        # Fixed thresholds: day 7 is twice as slow; day 8 never finishes.
        "tf-bert-squad-v100": daily_runs("tf-bert-squad-v100", 9, day_7={"slowdown": 2.0}, day_8={"status": None}),
        # Failures only: the second failure in a row alerts.
        "jax-resnet50-failures-only": daily_runs("jax-resnet50-failures-only", 8,
                                                 day_4={"status": "failure"}, day_5={"status": "timeout"}),
        # Record only: nothing alerts, even the failure.
        "pt-llama-record-only": daily_runs("pt-llama-record-only", 6, day_3={"status": "failure"}),
    }


MALFORMED_LINES = [
    b'{"schema": "trainguard/v1", "id": "bad-1", "test": "pt-cifar-tpu-v3-8"',
    b'{"schema": "trainguard/v0", "id": "bad-2", "test": "t", "run": "r", "points": []}',
    json.dumps({"schema": wire.SCHEMA, "id": "bad-3", "test": "pt-cifar-tpu-v3-8", "run": "pt-cifar-tpu-v3-8-011",
                "points": [{"tag": "loss", "value": "NaN", "time": DEMO_START + 11 * DAY + 60, "step": 1}]}).encode(),
]


def write_demo(out_dir: str, points_per_message: int = 100) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for test, plans in demo_plans().items():
        path = os.path.join(out_dir, f"{test}.jsonl")
        lines = [m for plan in plans for m in run_messages(plan, points_per_message)]
        if test == "pt-cifar-tpu-v3-8":
            lines = lines + MALFORMED_LINES + lines[:3]  # and three redelivered duplicates
        with open(path, "wb") as f:
            f.writelines(line + b"\n" for line in lines)
        paths.append(path)
    return paths


def synthetic_plans(tests: int, runs_per_test: int, steps: int, step_every: int) -> Iterator[RunPlan]:
    """A large regular workload for benchmarks."""
    for t in range(tests):
        yield from daily_runs(f"bench-test-{t:03d}", runs_per_test,
                              **{f"day_{d}": {"steps": steps, "step_every": step_every}  # type: ignore[arg-type]
                                 for d in range(runs_per_test)})  # day_N keywords only, never start


def write_lines(path: str, plans: Sequence[RunPlan], points_per_message: int, schema: str = wire.SCHEMA) -> int:
    count = 0
    with open(path, "wb") as f:
        for plan in plans:
            for message in run_messages(plan, points_per_message, schema=schema):
                f.write(message + b"\n")
                count += 1
    return count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data/demo")
    args = parser.parse_args(argv)
    for path in write_demo(args.out):
        print(path)


if __name__ == "__main__":
    main()
