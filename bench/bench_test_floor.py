"""The floor of a replay of many small tests: trainguard's own per-test code in a plain loop, with no engine.

A replay of 200,000 one-run tests (issue 34) costs what Beam's runner does per element and shuffle, what the
coders do at each shuffle, what the writes do, and what trainguard's own code does for each test. This script
measures the last alone: it reads the files and steps every message and run through the functions the pipeline's
DoFns call, in one Python loop, without Beam, encoding, staging or a store:

- ``read + parse + summarize + take``: each line parsed (``trainguard.wire.parse_message``), its test's config
  looked up, summarized (``core.parse.summarize``) and taken into its run (``core.runs.RunAccumulator.add``);
- ``run results``: each run finalized and its result made (``RunAccumulator.result``);
- ``checks and rows``: each test's runs in the order they ended, each metric bounded by its history
  (``core.history.check_metric``), each run checked (``core.history.check_job``), its job row made.

What a replay costs a test beyond this is the engine's, the coders' and the writes'. The rows are those the
pipeline writes for the same files (``tests/bench/test_bench_test_floor.py`` compares them with a replay's store),
so the loop does the pipeline's per-test work on these inputs; it leaves out what they do not reach (triage actions,
live windows, dead letters, a seed from a store) and the bookkeeping of which copy of a message counts (a
replay's ``core.run_parts.RunPart``: these inputs hold no copies), which this script counts with the engine's.

Beside the loop, unless ``--no_beside``, two other floors on the same files, each measured once:

- ``Beam's least graph``: what Beam alone costs a test on the replay's runner
  (``pipeline.runners.local_batch_runner``): the files read with ``ReadFromText``, each line decoded with orjson,
  grouped by run, the runs grouped by test and counted. No trainguard code, coder, state or write: the fewest
  steps and shuffles that bring a test's messages together into runs and its runs together for their checks;
- ``the reference loop``: ``bench/plain_loop.py``, the replay benchmark's reference (validation, aggregates, a
  mean ± 4σ check of each final value, the rows written to DuckDB), as a whole process, start-up included.

    python bench/bench_test_floor.py [--tests 10000] [--runs_per_test 1] [--rounds 3] [--workdir bench/out/floor]
                                     [--no_beside]

Prints microseconds a test for each phase (the best of ``--rounds``) and what that gives at 200,000 tests, then
the two floors beside it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_replay import reference_process
from bench.bench_scaling import ONE_RUN_STEPS, Workload, checked_config_dir, generate
from core.config import ConfigSet, load_config_dir
from core.history import JobHistory, MetricHistory, check_job, check_metric
from core.parse import summarize
from core.records import MetricObservation, job_history_row
from core.runs import RunAccumulator, RunLifecycle, RunResult
from trainguard import wire
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

FLEET = 200_000  # the number of one-run tests
PHASES = ("read + parse + summarize + take", "run results", "checks and rows")


@dataclasses.dataclass
class FloorRows:
    """What one pass made: the job and metric rows the pipeline writes, and the alerts it raises."""
    job_rows: List[Dict[str, Any]]
    metric_rows: List[Dict[str, Any]]
    alerts: int


def read_lines(pattern: str) -> List[bytes]:
    lines: List[bytes] = []
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            lines += [line for line in f.read().splitlines() if line.strip()]
    return lines


def take_messages(lines: Sequence[bytes], configs: ConfigSet) -> Dict[Tuple[str, str], RunAccumulator]:
    runs: Dict[Tuple[str, str], RunAccumulator] = {}
    for line in lines:
        message, _ = wire.parse_message(line)
        summary = summarize(message, line, configs.for_test(message.test, message.event_time))
        run = runs.get((message.test, message.run))
        if run is None:
            run = runs[message.test, message.run] = RunAccumulator(message.test, message.run)
        run.add(summary)
    return runs


def run_results(runs: Dict[Tuple[str, str], RunAccumulator], configs: ConfigSet,
                lifecycle: RunLifecycle) -> List[RunResult]:
    return [run.result(configs.for_test(run.test, run.finalize_at(lifecycle)), lifecycle) for run in runs.values()]


def check_runs(results: Sequence[RunResult], configs: ConfigSet) -> FloorRows:
    """Each test's runs in the order they ended (``RunResult.order``), as the pipeline's ordered checks step them."""
    job_histories: Dict[str, JobHistory] = {}
    metric_histories: Dict[Tuple[str, str], MetricHistory] = {}
    rows = FloorRows([], [], 0)
    for result in sorted(results, key=lambda r: (r.test, r.order)):
        config = configs.for_test(result.test, result.finalized_at)
        rows.job_rows.append(job_history_row(result))
        rows.alerts += len(check_job(job_histories.setdefault(result.test, JobHistory()), result, config))
        for observation in MetricObservation.all_of(result):
            history = metric_histories.setdefault((observation.test, observation.metric), MetricHistory())
            row, alert = check_metric(history, observation, config.regression_test)
            rows.metric_rows.append(row)
            rows.alerts += alert is not None
    return rows


def one_pass(lines: Sequence[bytes], configs: ConfigSet) -> Tuple[List[float], int, FloorRows]:
    """(seconds of each phase, tests, rows) of one pass over ``lines``."""
    lifecycle = RunLifecycle()
    started = time.perf_counter()
    runs = take_messages(lines, configs)
    taken = time.perf_counter()
    results = run_results(runs, configs, lifecycle)
    resulted = time.perf_counter()
    rows = check_runs(results, configs)
    checked = time.perf_counter()
    return [taken - started, resulted - taken, checked - resulted], len({test for test, _ in runs}), rows


def beam_least_graph(pattern: str, tests: int) -> float:
    """Seconds of Beam's least graph over the files (the module docstring says what it does), from its
    construction to its end, without the imports; it fails unless it counts ``tests`` tests."""
    import apache_beam as beam
    import orjson
    from apache_beam.testing.util import assert_that, equal_to

    from pipeline.runners import local_batch_runner

    started = time.perf_counter()
    with beam.Pipeline(runner=local_batch_runner()) as pipeline:
        runs = (pipeline
                | "Read" >> beam.io.ReadFromText(pattern)
                | "Decode" >> beam.Map(orjson.loads)
                | "ByRun" >> beam.Map(lambda message: ((message["test"], message["run"]), message["id"]))
                | "GroupByRun" >> beam.GroupByKey()
                | "RunOf" >> beam.MapTuple(lambda test_run, ids: (test_run[0], (test_run[1], len(list(ids))))))
        counted = (runs
                   | "GroupByTest" >> beam.GroupByKey()
                   | "CheckTest" >> beam.MapTuple(lambda test, test_runs: len(list(test_runs)))
                   | "Tests" >> beam.combiners.Count.Globally())
        assert_that(counted, equal_to([tests]))
    return time.perf_counter() - started


def reference_loop(pattern: str, workdir: str, runs: int) -> float:
    """Wall seconds of the reference loop over the files (``bench_replay.reference_process``); a RuntimeError
    unless it stored ``runs`` runs."""
    cost, _, stored_runs = reference_process(pattern, os.path.join(workdir, "reference.duckdb"),
                                             os.path.join(workdir, "reference.log"))
    if stored_runs != runs:
        raise RuntimeError(f"the reference loop stored {stored_runs} runs ({runs} expected)")
    return cost.wall_s


def prepare(workdir: str, workload: Workload) -> Tuple[str, str]:
    """The workload's files (written once, as the scaling benchmark writes them) and a config dir checking every
    metric (the scaling benchmark's): their glob pattern and the config dir."""
    pattern, _ = generate(workdir, workload)
    return pattern, checked_config_dir(workdir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--tests", type=int, default=10_000, help="tests to generate")
    parser.add_argument("--runs_per_test", type=int, default=1)
    parser.add_argument("--steps", type=int, default=ONE_RUN_STEPS, help="steps a run (3 points a step)")
    parser.add_argument("--rounds", type=int, default=3, help="passes; each phase's best is printed")
    parser.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), "out", "floor"))
    parser.add_argument("--no_beside", dest="beside", action="store_false",
                        help="time the loop alone, not Beam's least graph and the reference loop beside it")
    args = parser.parse_args(argv)
    pattern, config_dir = prepare(args.workdir, Workload(args.tests, args.runs_per_test, args.steps))
    configs = load_config_dir(config_dir)
    lines = read_lines(pattern)
    best = [float("inf")] * len(PHASES)
    for _ in range(args.rounds):
        seconds, tests, rows = one_pass(lines, configs)
        best = [min(b, s) for b, s in zip(best, seconds)]
    per_test = [1e6 * s / tests for s in best]
    print(f"{tests:,} tests, {len(lines):,} messages, {len(rows.job_rows):,} runs, {len(rows.metric_rows):,} metric "
          f"rows, {rows.alerts} alerts; trainguard's per-test code in a plain loop, best of {args.rounds}:")
    for phase, micros in zip(PHASES, per_test):
        print(f"  {phase:<34} {micros:8.1f} µs a test")
    total = sum(per_test)
    print(f"  {'all':<34} {total:8.1f} µs a test: {total * FLEET / 1e6:.1f} s for {FLEET:,} such tests, "
          f"before any engine, encoding or write")
    if args.beside:
        print("beside it, on the same files, once each:")
        for floor, seconds in (("Beam's least graph", beam_least_graph(pattern, tests)),
                               ("the reference loop (whole process)",
                                reference_loop(pattern, args.workdir, len(rows.job_rows)))):
            micros = 1e6 * seconds / tests
            print(f"  {floor:<34} {micros:8.1f} µs a test: {micros * FLEET / 1e6:.1f} s for {FLEET:,} such tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
