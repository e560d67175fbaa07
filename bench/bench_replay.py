"""Replay benchmark: points per second through the whole pipeline vs plain Python.

Generates >= 1,000,000 points (100 points per message) of synthetic daily runs,
replays them with ``python -m pipeline`` semantics on FnApiRunner into a fresh
DuckDB store, and times a single-process plain-Python reference that computes
the same per-run aggregates (final, min, max, average per tag) from the same
files. The pipeline runs twice: with the run-level checks only, and with live
windows (count windows of 100 points, checked step-aligned) on every tag.
Prints the rates and their ratio to the reference.

    python bench/bench_replay.py [--points 1000000] [--out_dir bench/out]
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.demo import synthetic_plans, write_lines
from pipeline.main import checked_argv
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.replay import run
from trainguard.cli import DASHES_NOTE, StrictArgumentParser
from trainguard.wire import decode_json

TAGS_PER_STEP = 3
WINDOWED_CONFIG = {
    "//": "Live windows on every tag, each checked against the same steps of the last 5 runs.",
    "window_config": {"allowed_lateness_seconds": 60, "stall_seconds": 600, "tags": {
        tag: {"count": 100, "aggregations": ["mean", "min", "max", "p90"], "checks": [{
            "aggregation": "mean", "condition": {"comparison": "less_or_equal" if tag == "loss" else "greater_or_equal",
                                                 "success_threshold": {"stddevs_from_mean": 6},
                                                 "wait_for_n_points_of_history": 3}}]}
        for tag in ("loss", "Accuracy/test", "throughput/examples_per_sec")}}}


def generate(workdir: str, points: int, tests: int = 20, runs_per_test: int = 25) -> str:
    per_run = math.ceil(points / (tests * runs_per_test))
    steps_per_run = math.ceil(per_run / TAGS_PER_STEP)
    plans = list(synthetic_plans(tests, runs_per_test, steps=steps_per_run - 1, step_every=1))
    os.makedirs(workdir, exist_ok=True)
    for t in range(tests):
        write_lines(os.path.join(workdir, f"input-{t:03d}.jsonl"),
                    [p for p in plans if p.test == f"bench-test-{t:03d}"], points_per_message=100)
    return os.path.join(workdir, "input-*.jsonl")


def reference(pattern: str):
    """Plain single-process Python: per (test, run, tag) final/min/max/average (no validation, no dedup)."""
    aggregates = {}
    points = 0
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            for line in f:
                message = decode_json(line)
                key = (message["test"], message["run"])
                for p in message.get("points", ()):
                    points += 1
                    value, moment = p["value"], (p["time"], p.get("step", -1))
                    tag_key = key + (p["tag"],)
                    a = aggregates.get(tag_key)
                    if a is None:
                        aggregates[tag_key] = [moment, value, value, value, [value]]
                    else:
                        if moment > a[0]:
                            a[0], a[1] = moment, value
                        a[2] = min(a[2], value)
                        a[3] = max(a[3], value)
                        a[4].append(value)
    results = {k: (a[1], a[2], a[3], math.fsum(a[4]) / len(a[4])) for k, a in aggregates.items()}
    return points, results


def main() -> None:
    parser = StrictArgumentParser(description=__doc__.replace("``", ""), epilog=DASHES_NOTE)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--out_dir", "--workdir", default=os.path.join(os.path.dirname(__file__), "out", "replay"))
    parser.add_argument("--extra", nargs="*", default=[], help="extra pipeline options")
    args, pipeline_args = parser.parse_known_args()
    args.extra = checked_argv(args.extra + pipeline_args)  # Beam would ignore a mistyped option
    shutil.rmtree(args.out_dir, ignore_errors=True)
    pattern = generate(args.out_dir, args.points)
    messages = 0
    for path in glob.glob(pattern):
        with open(path, "rb") as lines:
            messages += sum(1 for _ in lines)

    started = time.perf_counter()
    points, results = reference(pattern)
    reference_seconds = time.perf_counter() - started

    print(f"input: {points:,} points in {messages:,} messages, {len(results):,} (test, run, tag) aggregates")
    print(f"plain Python reference: {reference_seconds:6.2f} s  {points / reference_seconds:>12,.0f} points/s")
    windowed_configs = os.path.join(args.out_dir, "configs-windowed")
    os.makedirs(windowed_configs)
    with open(os.path.join(windowed_configs, "default.json"), "w") as f:
        json.dump(WINDOWED_CONFIG, f)
    for label, config_dir in (("run-level only", DEFAULT_CONFIG_DIR), ("windows on every tag", windowed_configs)):
        name = label.split()[0]
        started = time.perf_counter()
        summary = run([f"--input_files={pattern}", f"--config_dir={config_dir}",
                       f"--local_store={os.path.join(args.out_dir, name + '.duckdb')}",
                       f"--alerts_file={os.path.join(args.out_dir, name + '-alerts.jsonl')}", *args.extra])
        seconds = time.perf_counter() - started
        assert summary.counters["messages_read"] == messages, summary.counters
        assert summary.rows_added["job_history"] == len({k[:2] for k in results})
        print(f"pipeline, {label + ':':22}{seconds:6.2f} s  {points / seconds:>12,.0f} points/s  "
              f"{seconds / reference_seconds:5.2f}x the reference  (incl. start-up; "
              f"{sum(summary.rows_added.values()):,} rows written)")


if __name__ == "__main__":
    main()
