"""Backtest benchmark: ``python -m pipeline.backtest`` over 10,000 stored runs (target: under 10 s).

Writes a DuckDB store straight from Python (no pipeline run: the backtest only reads
tables): 100 tests x 100 daily runs, 5 metrics per run (accuracy final and max, loss,
step time, wall time) with noise, regressions, failed and missing runs; 20 of the
tests have live windows (10 count windows of loss per run) with a step-aligned check.
The alerts table holds what the same configs raise, so the diff is empty, as on a
real store. Then times, each best of ``--repeat``:

- the whole process, ``python -m pipeline.backtest --json`` (start-up, imports, read, checks, output);
- in one process, ``pipeline.backtest.run`` (read + checks), and its phases;
- the import of ``pipeline.backtest`` (against a bare ``python -c pass``).

    python bench/bench_backtest.py [--tests 100] [--runs 100] [--out_dir bench/out/backtest] [--repeat 3]
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core.backtest import StoredHistory, StoredRun, backtest
from core.config import load_config_dir
from core.records import iso_utc, window_row
from core.runs import MetricValue
from core.schema import ALERTS, JOB_HISTORY, METRIC_HISTORY, METRIC_WINDOWS
from core.windows import WindowResult
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 86400.0
T0 = 1763596800.0
WINDOWED_EVERY = 5  # every 5th test has live windows
WINDOWS_PER_RUN = 10

DEFAULT_CONFIG = {
    "metric_collection_config": {"metric_to_aggregation_strategies": {"acc": ["final", "max"],
                                                                      "step_time": ["average"]}},
    "regression_test_config": {
        "metric_success_conditions": {
            "acc_final": {"comparison": "greater", "success_threshold": {"stddevs_from_mean": 4},
                          "wait_for_n_points_of_history": 5},
            "acc_max": {"comparison": "greater", "success_threshold": {"mads_from_median": 5},
                        "wait_for_n_points_of_history": 5},
            "loss_final": {"comparison": "less", "success_threshold": {"false_alert_rate": 0.001}},
            "default": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 5},
                        "wait_for_n_points_of_history": 7}},
        "required_metrics": ["acc_final"]},
}
WINDOW_CONFIG = {"tags": {"loss": {"count": 50, "aggregations": ["mean", "max"], "checks": [
    {"aggregation": "mean", "history": "step_aligned", "history_runs": 5,
     "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 4},
                   "wait_for_n_points_of_history": 3},
     "debounce": {"windows": 3, "out_of_bounds": 2}}]}}}


def write_configs(directory: str, tests: int) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "default.json"), "w") as f:
        json.dump(DEFAULT_CONFIG, f)
    for t in range(0, tests, WINDOWED_EVERY):
        with open(os.path.join(directory, f"bench-test-{t:03d}.json"), "w") as f:
            json.dump({**DEFAULT_CONFIG, "window_config": WINDOW_CONFIG}, f)


def history(tests: int, runs: int, seed: int = 1) -> StoredHistory:
    """Synthetic stored runs and windows: noisy levels, a regression every ~40 runs, ~3% failed, ~1% missing."""
    rng = random.Random(seed)
    stored: List[StoredRun] = []
    windows: List[WindowResult] = []
    for t in range(tests):
        test = f"bench-test-{t:03d}"
        acc, loss, step = rng.uniform(60, 90), rng.uniform(0.5, 2.0), rng.uniform(0.1, 0.5)
        for r in range(runs):
            run = f"{test}-{r:03d}"
            start = T0 + r * DAY + t * 60
            bad = rng.random() < 0.025
            status = "success" if rng.random() > 0.04 else rng.choice(["failure", "timeout", "missing"])
            wall = 3600 * rng.gauss(1.0, 0.01) * (1.3 if bad else 1.0)
            end = start + wall
            a = acc + rng.gauss(0, 0.3) - (5.0 if bad else 0.0)
            lo = loss * rng.gauss(1.0, 0.02) * (1.5 if bad else 1.0)
            metrics = [MetricValue("acc_final", a, 10_000), MetricValue("acc_max", a + abs(rng.gauss(0.5, 0.1)), 9_000),
                       MetricValue("loss_final", lo, 10_000),
                       MetricValue("step_time_average", step * rng.gauss(1.0, 0.01), None)]
            if status != "missing":
                metrics.append(MetricValue("total_wall_time", wall, None))
            events = ()
            stored.append(StoredRun(test, run, status, 0 if status != "missing" else None, start, end,
                                    end + (60 if status != "missing" else 6 * 3600), events, tuple(metrics)))
            if t % WINDOWED_EVERY == 0:
                for w in range(WINDOWS_PER_RUN):
                    mean = lo * (1 + 0.3 * (WINDOWS_PER_RUN - w) / WINDOWS_PER_RUN) * rng.gauss(1.0, 0.01)
                    windows.append(WindowResult(test, run, "loss", "count", w, start + w * 300, start + w * 300 + 290,
                                                w * 1000, w * 1000 + 980, 50, False,
                                                {"mean": mean, "max": mean * 1.2}))
    return StoredHistory(runs=stored, windows=windows)


def rows_of(stored: StoredHistory, configs) -> Dict[str, List[Dict[str, Any]]]:
    """The table rows of the synthetic history; alerts as the same configs raise them."""
    jobs, metrics = [], []
    for run in stored.runs:
        jobs.append({"run_id": run.run, "test_name": run.test, "job_status": run.status,
                     "num_failures": run.num_failures, "start_time": iso_utc(run.start_time),
                     "timestamp": iso_utc(run.end_time), "job_duration_sec": run.end_time - (run.start_time or 0),
                     "processed_at": iso_utc(run.finalized_at), "events": "[]"})
        metrics += [{"run_id": run.run, "test_name": run.test, "metric_name": m.name, "metric_value": m.value,
                     "metric_lower_bound": None, "metric_upper_bound": None, "within_bounds": None,
                     "timestamp": iso_utc(run.end_time), "step": m.step} for m in run.metrics]
    raised = backtest(stored, configs)
    alerts = [facts for diff in raised.diffs for facts in diff.would_fire]
    alert_rows = [{"alert_id": a.alert_id, "kind": a.kind, "test_name": a.test, "run_id": a.run,
                   "metric_name": a.metric, "value": None, "lower_bound": None, "upper_bound": None,
                   "message": "synthetic", "created_at": iso_utc(a.created_at), "details": "{}"} for a in alerts]
    return {JOB_HISTORY.name: jobs, METRIC_HISTORY.name: metrics, METRIC_WINDOWS.name: [
        window_row(w, 0) for w in stored.windows], ALERTS.name: alert_rows}


def build_store(workdir: str, tests: int, runs: int) -> str:
    """The benchmark's store and configs (reused when the store exists)."""
    configs_dir = os.path.join(workdir, "configs")
    store = os.path.join(workdir, f"store-{tests}x{runs}.duckdb")
    write_configs(configs_dir, tests)
    if os.path.exists(store):
        return store
    from sinks.duckdb_store import DuckDBStore  # imports Beam: only to build the store

    started = time.perf_counter()
    tables = rows_of(history(tests, runs), load_config_dir(configs_dir))
    duckdb_store = DuckDBStore(store + ".tmp")
    duckdb_store.ensure_schema()
    from core.schema import TABLES
    for name, rows in tables.items():
        duckdb_store.insert(TABLES[name], rows)
    counts = duckdb_store.counts()
    duckdb_store.close()
    os.replace(store + ".tmp", store)
    print(f"store: {store} built in {time.perf_counter() - started:.1f} s: "
          + ", ".join(f"{name} {n:,}" for name, n in counts.items() if n))
    return store


def timed_process(argv: List[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv=None) -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100, help="per test")
    parser.add_argument("--out_dir", "--workdir", default=os.path.join(REPO, "bench", "out", "backtest"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    store = build_store(args.out_dir, args.tests, args.runs)
    cli = ["--config_dir", os.path.join(args.out_dir, "configs"), "--local_store", store]

    python = [sys.executable, "-c", "pass"]
    bare = min(timed_process(python) for _ in range(args.repeat))
    imported = min(timed_process([sys.executable, "-c", "import pipeline.backtest"]) for _ in range(args.repeat))
    whole = min(timed_process([sys.executable, "-m", "pipeline.backtest", *cli, "--json"])
                for _ in range(args.repeat))
    from pipeline.backtest import run

    phases = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        summary = run(cli)
        phases.append((time.perf_counter() - started, summary["seconds"]))
    in_process, seconds = min(phases, key=lambda p: p[0])
    if summary["changed"] or summary["error_count"]:  # the stored alerts are the configs' own: expect no diff
        print(f"WARNING: {summary['error_count']} check errors, diff empty: {not summary['changed']} (did the "
              f"checks change since the store was built? delete {store} to rebuild it)")
    print(f"backtest of {summary['runs']:,} runs, {summary['values']:,} metric values, {summary['windows']:,} windows "
          f"({sum(d['fired'] for d in summary['diffs']):,} alerts), best of {args.repeat}:")
    print(f"  whole process (python -m pipeline.backtest --json)  {whole:6.2f} s   (target < 10 s)")
    print(f"  in process (pipeline.backtest.run)                 {in_process:6.2f} s   "
          f"read {seconds['read']:.2f} s, checks {seconds['backtest']:.2f} s")
    print(f"  import pipeline.backtest                           {imported - bare:6.2f} s   "
          f"(python -c pass: {bare:.2f} s)")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"runs": summary["runs"], "values": summary["values"], "windows": summary["windows"],
                   "whole_process_s": whole, "in_process_s": in_process, "phases_s": seconds,
                   "import_s": imported - bare}, f, indent=1)


if __name__ == "__main__":
    main()
