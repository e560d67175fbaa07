"""Replay benchmark: points per second through the whole pipeline vs plain Python.

Generates >= 1,000,000 points (100 points per message) of synthetic daily runs,
replays them with ``python -m pipeline`` semantics on FnApiRunner into a fresh
DuckDB store, and times a single-process plain-Python reference that computes
the same per-run aggregates (final, min, max, average per tag) from the same
files. Prints both rates and their ratio.

    python bench/bench_replay.py [--points 1000000] [--workdir bench/out]
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.demo import synthetic_plans, write_lines  # noqa: E402
from pipeline.main import run  # noqa: E402
from trainguard.wire import decode_json  # noqa: E402  (the pipeline's decoder, for a fair comparison)

TAGS_PER_STEP = 3


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), "out", "replay"))
    parser.add_argument("--extra", nargs="*", default=[], help="extra pipeline options")
    args, pipeline_args = parser.parse_known_args()
    args.extra += pipeline_args
    shutil.rmtree(args.workdir, ignore_errors=True)
    pattern = generate(args.workdir, args.points)
    messages = sum(1 for path in glob.glob(pattern) for _ in open(path, "rb"))

    started = time.perf_counter()
    points, results = reference(pattern)
    reference_seconds = time.perf_counter() - started

    store = os.path.join(args.workdir, "bench.duckdb")
    started = time.perf_counter()
    summary = run([f"--input_files={pattern}", f"--local_store={store}",
                   f"--alerts_file={os.path.join(args.workdir, 'alerts.jsonl')}", *args.extra])
    pipeline_seconds = time.perf_counter() - started

    assert summary.counters["messages_read"] == messages, summary.counters
    assert summary.rows_added["job_history"] == len({k[:2] for k in results})
    print(f"input: {points:,} points in {messages:,} messages, {len(results):,} (test, run, tag) aggregates")
    print(f"plain Python reference: {reference_seconds:6.2f} s  {points / reference_seconds:>12,.0f} points/s")
    print(f"pipeline (FnApiRunner): {pipeline_seconds:6.2f} s  {points / pipeline_seconds:>12,.0f} points/s"
          f"  (incl. start-up and writing {sum(summary.rows_added.values()):,} rows)")
    print(f"pipeline / reference time: {pipeline_seconds / reference_seconds:.2f}x")


if __name__ == "__main__":
    main()
