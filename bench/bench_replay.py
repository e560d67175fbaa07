"""Replay benchmark: a whole ``python -m pipeline`` process against a whole plain-Python process on the same files.

Generates >= 1,000,000 points (100 points per message) of synthetic daily runs, once as v1 point objects and once
as v1.1 columns (the same points and messages), and times, each as a whole process (start-up included; wall time,
CPU and peak memory from ``os.wait4``):

- the reference, ``bench/plain_loop.py``: a plain single-process Python loop doing the replay's work on the same
  files (parse with orjson, validate by the wire contract's rules, skip redeliveries, aggregate per (test, run,
  tag), check each test's runs, write job and metric rows into DuckDB);
- ``python -m pipeline`` replaying the files into a fresh DuckDB store, as a user runs it (the report included);
- the same with ``--report_dir=`` (no report), with live windows (count windows of 100 points, checked
  step-aligned) on every tag, and on one message (what start-up alone costs).

Prints each with its ratio to the reference of its input (``speed`` = reference time / time: 1.0x is as fast).

    python bench/bench_replay.py [--points 1000000] [--schemas v1,v1.1] [--rows all|no_report] [--out_dir ...]
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import sys
from typing import List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.timing import ProcessCost, run_process
from pipeline.demo import synthetic_plans, write_lines
from pipeline.main import checked_argv
from pipeline.options import DEFAULT_CONFIG_DIR
from trainguard import wire
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGS_PER_STEP = 3
WINDOWED_CONFIG = {
    "//": "Live windows on every tag, each checked against the same steps of the last 5 runs.",
    "window_config": {"allowed_lateness_seconds": 60, "stall_seconds": 600, "tags": {
        tag: {"count": 100, "aggregations": ["mean", "min", "max", "p90"], "checks": [{
            "aggregation": "mean", "condition": {"comparison": "less_or_equal" if tag == "loss" else "greater_or_equal",
                                                 "success_threshold": {"stddevs_from_mean": 6},
                                                 "wait_for_n_points_of_history": 3}}]}
        for tag in ("loss", "Accuracy/test", "throughput/examples_per_sec")}}}


SCHEMAS = {"v1": wire.SCHEMA, "v1.1": wire.SCHEMA_V1_1}
PLAIN_LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_loop.py")


def generate(workdir: str, points: int, tests: int = 20, runs_per_test: int = 25, schema: str = wire.SCHEMA) -> str:
    per_run = math.ceil(points / (tests * runs_per_test))
    steps_per_run = math.ceil(per_run / TAGS_PER_STEP)
    plans = list(synthetic_plans(tests, runs_per_test, steps=steps_per_run - 1, step_every=1))
    os.makedirs(workdir, exist_ok=True)
    for t in range(tests):
        write_lines(os.path.join(workdir, f"input-{t:03d}.jsonl"),
                    [p for p in plans if p.test == f"bench-test-{t:03d}"], points_per_message=100, schema=schema)
    return os.path.join(workdir, "input-*.jsonl")


def reference_process(pattern: str, store: str, log_path: str) -> Tuple[ProcessCost, int, int]:
    """``bench/plain_loop.py`` over the files as a whole process, into a fresh ``store``: its cost and the points
    and runs it stored; a RuntimeError if it found a bad point (the benchmarks' inputs have none)."""
    if os.path.exists(store):
        os.remove(store)  # (the loop adds to a store's tables)
    cost = run_process([sys.executable, PLAIN_LOOP, pattern, store], log_path)
    points, runs, _, _, bad_points = map(int, cost.output.split())
    if bad_points:
        raise RuntimeError(f"the reference loop found {bad_points} bad points:\n{cost.output}")
    return cost, points, runs


def replay_process(out_dir: str, name: str, pattern: str, config_dir: str, *options: str) -> ProcessCost:
    store = os.path.join(out_dir, name + ".duckdb")
    return run_process([sys.executable, "-m", "pipeline", f"--input_files={pattern}", f"--config_dir={config_dir}",
                        f"--local_store={store}", f"--alerts_file={os.path.join(out_dir, name + '-alerts.jsonl')}",
                        f"--report_dir={os.path.join(out_dir, name + '-report')}", "--no_progress", *options],
                       os.path.join(out_dir, name + ".log"), cwd=REPO)


def show(label: str, cost: ProcessCost, points: int, reference: ProcessCost) -> None:
    print(f"{label:48}{cost.wall_s:7.2f}s{cost.cpu_s:7.2f}s{cost.peak_rss_mib:6.0f}MiB"
          f"{points / cost.wall_s:>12,.0f}{reference.wall_s / cost.wall_s:7.2f}x")


def summary_count(output: str, name: str) -> int:
    return int(re.search(rf"{name}\s+(\d+)", output).group(1))  # type: ignore[union-attr]


def main(argv: Optional[List[str]] = None) -> None:
    parser = StrictArgumentParser(description=__doc__.replace("``", ""), epilog=DASHES_NOTE)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--schemas", default="v1,v1.1", help="the inputs' wire contracts, comma-separated")
    parser.add_argument("--rows", choices=("all", "no_report"), default="all",
                        help="no_report: the reference and --report_dir= only (for large --points)")
    parser.add_argument("--out_dir", "--workdir", default=os.path.join(os.path.dirname(__file__), "out", "replay"))
    parser.add_argument("--extra", nargs="*", default=[], help="extra pipeline options")
    args, pipeline_args = parser.parse_known_args(argv)
    args.extra = checked_argv(args.extra + pipeline_args)  # Beam would ignore a mistyped option
    schemas = args.schemas.split(",")
    if not set(schemas) <= set(SCHEMAS):
        parser.error(f"--schemas: each of {sorted(SCHEMAS)}, got {args.schemas!r}")
    shutil.rmtree(args.out_dir, ignore_errors=True)
    windowed_configs = os.path.join(args.out_dir, "configs-windowed")
    os.makedirs(windowed_configs)
    with open(os.path.join(windowed_configs, "default.json"), "w") as f:
        json.dump(WINDOWED_CONFIG, f)
    print(f"{'':48}{'wall':>8}{'CPU':>8}{'peak':>9}{'points/s':>12}{'speed':>8}")
    for schema in schemas:
        out_dir = os.path.join(args.out_dir, schema)
        pattern = generate(out_dir, args.points, schema=SCHEMAS[schema])
        messages = 0
        for path in glob.glob(pattern):
            with open(path, "rb") as lines:
                messages += sum(1 for _ in lines)
        one_message = os.path.join(out_dir, "one", "input.jsonl")
        os.makedirs(os.path.dirname(one_message))
        with open(sorted(glob.glob(pattern))[0], "rb") as first, open(one_message, "wb") as out:
            out.write(first.readline())

        reference, points, runs = reference_process(pattern, os.path.join(out_dir, "reference.duckdb"),
                                                    os.path.join(out_dir, "reference.log"))
        print(f"{schema} input: {points:,} points in {messages:,} messages of {runs:,} runs; whole processes, "
              "start-up included")

        show(f"plain Python loop, same work ({schema}; reference)", reference, points, reference)
        rows = [("python -m pipeline (report included)", "pipeline", DEFAULT_CONFIG_DIR, pattern, ()),
                ("python -m pipeline --report_dir=", "no-report", DEFAULT_CONFIG_DIR, pattern, ("--report_dir=",)),
                ("live windows on every tag (report included)", "windows", windowed_configs, pattern, ()),
                ("start-up: one message, --report_dir=", "one", DEFAULT_CONFIG_DIR, one_message, ("--report_dir=",))]
        if args.rows == "no_report":
            rows = rows[1:2]
        for label, name, config_dir, source, options in rows:
            cost = replay_process(out_dir, name, source, config_dir, *args.extra, *options)
            if source == pattern:
                assert summary_count(cost.output, "messages read") == messages, cost.output
                assert summary_count(cost.output, "runs finalized") == runs, cost.output
            show(label, cost, points, reference)


if __name__ == "__main__":
    main()
