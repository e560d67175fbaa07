"""Report benchmark: ``python -m report`` over 50 tests x 100 runs.

Builds (once, cached in the work directory) a DuckDB store by replaying synthetic daily runs
through the pipeline: every test configured like ``configs/pt-cifar-tpu-v3-8.json`` (stddev
bounds, live windows on accuracy and throughput), with regressions, failures, timeouts and
runs that never finish scattered over the tests. Then times the report on it, per phase
(read, prepare, draw, write), in one process and in two (``--jobs``), and writes them to
``results.json`` in the work directory.

    python bench/bench_report.py [--tests 50] [--runs 100] [--out_dir bench/out/report] [--repeat N] [--all_runs]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.demo import daily_runs, write_lines
from pipeline.options import DEFAULT_CONFIG_DIR
from pipeline.replay import run as replay
from report.cli import run as report
from trainguard.cli import DASHES_NOTE, StrictArgumentParser


def story(test_index: int, runs: int) -> dict:
    """Per-day overrides: a few regressions, failures and unfinished runs, different per test."""
    overrides = {}
    if test_index % 5 == 0:
        overrides[f"day_{runs - 1}"] = {"accuracy_drop": 4.0}
    if test_index % 7 == 0:
        overrides[f"day_{runs // 2}"] = {"status": "failure"}
        overrides[f"day_{runs // 2 + 1}"] = {"status": "timeout"}
    if test_index % 11 == 0:
        overrides[f"day_{runs - 2}"] = {"slowdown": 1.3}
        overrides[f"day_{runs - 3}"] = {"status": None}
    return overrides


def build_store(workdir: str, tests: int, runs: int) -> str:
    """The store of the benchmark (reused when it exists)."""
    store = os.path.join(workdir, f"store-{tests}x{runs}.duckdb")
    if os.path.exists(store):
        return store
    os.makedirs(os.path.join(workdir, "configs"), exist_ok=True)
    shutil.copy(os.path.join(DEFAULT_CONFIG_DIR, "pt-cifar-tpu-v3-8.json"),
                os.path.join(workdir, "configs", "default.json"))
    for t in range(tests):
        name = f"bench-test-{t:03d}"
        write_lines(os.path.join(workdir, f"input-{t:03d}.jsonl"), daily_runs(name, runs, **story(t, runs)),
                    points_per_message=100)
    started = time.perf_counter()
    summary = replay([f"--input_files={os.path.join(workdir, 'input-*.jsonl')}",
                      f"--config_dir={os.path.join(workdir, 'configs')}", f"--local_store={store}",
                      f"--alerts_file={os.path.join(workdir, 'alerts.jsonl')}"])
    print(f"store: {store} built in {time.perf_counter() - started:.1f} s "
          f"({', '.join(f'{t} {n:,}' for t, n in summary.rows_added.items())})")
    return store


def measure(label: str, argv: list, repeat: int) -> dict:
    """The fastest of ``repeat`` reports (the machine is shared: the minimum is the least disturbed)."""
    result = min((report(argv) for _ in range(repeat)), key=lambda r: r.seconds)
    timings = ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in result.timings.items())
    print(f"{label:34} {result.seconds:6.2f} s  {len(result.figures):5} figures  ({timings})")
    return {"label": label, "seconds": round(result.seconds, 2), "figures": len(result.figures),
            "timings": {k: round(v, 2) for k, v in result.timings.items()}}


def main() -> None:
    parser = StrictArgumentParser(description=__doc__.replace("``", ""), epilog=DASHES_NOTE)
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out_dir", "--workdir", default=os.path.join(os.path.dirname(__file__), "out", "report"))
    parser.add_argument("--all_runs", action="store_true", help="also time a picture of every run (slow)")
    parser.add_argument("--repeat", type=int, default=1, help="report the fastest of this many runs")
    args = parser.parse_args()
    store = build_store(args.out_dir, args.tests, args.runs)
    out = os.path.join(args.out_dir, "html")
    common = [f"--local_store={store}", f"--out_dir={out}", "--no_progress",
              f"--config_dir={os.path.join(args.out_dir, 'configs')}"]  # the checks the store was built with
    results = [measure("5 runs/test, --jobs=1", common + ["--jobs=1"], args.repeat),
               measure("5 runs/test, --jobs=2", common + ["--jobs=2"], args.repeat)]
    if args.all_runs:
        results.append(measure("every run (--runs_per_test=0), --jobs=2",
                               common + ["--runs_per_test=0", "--jobs=2"], 1))
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"tests": args.tests, "runs": args.runs, "results": results}, f, indent=1)
    print(f"report: {os.path.join(out, 'index.html')}")


if __name__ == "__main__":
    main()
