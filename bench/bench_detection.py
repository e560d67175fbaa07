"""Detection benchmark: trainguard against reference detectors on a synthetic fleet it has never seen.

A generator of its own (``bench/detection/suite.py``) writes suites the way
real training fleets behave: 12 tests x 60 daily runs, every noise term
Student t(3) (or normal: ``--noise``), one test drifting, one on two kinds of
hardware, two accepted changes per test, a 1σ or 2σ shift that stays, and
one-off faults after a 12-run warm-up (accuracy 2σ / 3σ / 6σ lower, loss
divergence and step time x1.15 / x1.6 from mid-run, crashes), with a constant
metric. trainguard runs for real: the suite's wire-format lines replayed
through the pipeline (``pipeline.replay``, FnApiRunner, a fresh DuckDB store)
with the issue's config at three false-alert budgets (``false_alerts_per_100_runs``), live windows
included, and a baseline of step time per machine type (``history_by``: every run's ``run_started``
says its type; ``--history_by=`` for one history); the alerts and stored bounds are read back from the store.
A second trainguard row runs the same configs with each metric's ``noise`` set where
``trainguard-backtest --suggest_noise`` says so, measured on another suite of the same fleet (seed + 1000:
last month's runs), as a user would set it from their stored history. The
reference detectors (median ± k·MAD, mean ± k·σ, change points by ruptures at
each run; three operating points each) see the same runs' run-level values.
One scorer counts every detector's alerts (``bench/detection/scoring.py``).

    python bench/bench_detection.py [--seeds 1,2,3] [--noise t3|normal|both] [--tests 12] [--runs 60]
        [--jobs 2] [--workdir bench/out/detection] [--history_by accelerator] [--json]

Prints per noise family, pooled over the seeds: the table (every detector at
every operating point), the matched comparison (each detector at its best
point with at most 1 false alert per 100 healthy runs per test), how far
trainguard's stored bounds lie from the true centre in σ of the noise, and how
many mid-run faults it alerted live. ``--json`` prints all of it, per seed too,
as one JSON object. The change-point detector needs ``ruptures`` (the
``bench`` extra: ``pip install -e '.[bench]'``); without it its rows are left
out, with a note. ``--jobs`` suites run at once, each in its own process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.detection import anchors, harness, scoring, trainguard_path
from bench.detection.suite import NOISE_FAMILIES, SuiteSpec
from trainguard.cli import DASHES_NOTE, StrictArgumentParser, comma_separated, comma_separated_ints


def main(argv: Optional[List[str]] = None) -> int:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--seeds", type=comma_separated_ints, default=[1, 2, 3],
                        help="comma-separated seeds, one suite each")
    parser.add_argument("--noise", choices=(*NOISE_FAMILIES, "both"), default="both", help="noise family")
    parser.add_argument("--tests", type=int, default=12, help="tests per suite")
    parser.add_argument("--runs", type=int, default=60, help="runs per test")
    parser.add_argument("--jobs", type=int, default=2, help="suites evaluated at once, each in its own process")
    parser.add_argument("--workdir", default="bench/out/detection", help="where the suites' inputs and stores go")
    parser.add_argument("--history_by", type=comma_separated, default=list(trainguard_path.HISTORY_BY),
                        help="trainguard's history_by on step time: each machine type the runs report keeps "
                             "its own baseline (--history_by= for one history, as the reference detectors have)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args(argv)
    started = time.monotonic()
    families = NOISE_FAMILIES if args.noise == "both" else (args.noise,)
    specs = [SuiteSpec(tests=args.tests, runs=args.runs, seed=seed, noise=noise)
             for noise in families for seed in args.seeds]
    with_change_points = anchors.change_points_available()
    results = harness.evaluate_all(specs, args.workdir, trainguard_path.BUDGETS, with_change_points,
                                   args.jobs, args.history_by)
    reports = harness.report(results)
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({"tests": args.tests, "runs": args.runs, "seeds": args.seeds, "history_by": args.history_by,
                          "seconds": seconds,
                          "suite_seconds": [{"noise": r.spec.noise, "seed": r.spec.seed, **r.seconds} for r in results],
                          "change_points": with_change_points, "families": harness.as_json(reports)}, indent=1))
        return 0
    for family in reports:
        title = (f"{family.noise} noise, seeds {','.join(map(str, family.seeds))}: "
                 f"{args.tests} tests x {args.runs} runs each")
        print(f"## {title}\n")
        print(scoring.markdown_table(family.rows, "detector, operating point") + "\n")
        print(scoring.markdown_table(family.matched, f"at most {scoring.MATCHED_FALSE_ALERTS:g} false alert "
                                                     "/ 100 healthy runs (or the quietest point)") + "\n")
        print(harness.per_seed_table(family) + "\n")
        print(harness.distances_table(family) + "\n")
        print(harness.live_line(family) + "\n")
    if not with_change_points:
        print("note: ruptures is not installed (pip install -e '.[bench]'): no change-point rows\n")
    replay = sum(r.seconds["trainguard"] for r in results)
    anchor = sum(r.seconds["anchors"] for r in results)
    cpu = sum(r.seconds.get("cpu", 0.0) for r in results)
    print(f"{len(results)} suite(s) in {seconds:.0f} s with {args.jobs} job(s); summed over suites: trainguard's "
          f"replays {replay:.0f} s, the reference detectors {anchor:.0f} s (wall), CPU {cpu:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
