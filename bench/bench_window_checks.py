"""Live window checks: what checking one window costs, with the runs' offsets taken off and without.

A step-aligned window check (``core.window_checks.check_window``) compares each window of a running run with the
same steps of the last ``history_runs`` successful runs; since it allows for where each run stands
(``RUN_OFFSET_WINDOWS``), it computes a second pair of bounds, on the values with their runs' offsets taken off.
This checks ``--runs`` runs of ``--windows`` count windows each (step time around 3 s, runs 2% apart, windows
1.6%, a ``false_alert_rate`` check against the last 20 runs, as the detection benchmark's), ending each, then
times checking the windows of ``--timed`` more runs on copies of that state, with the offsets and without
(``RUN_OFFSET_MIN`` out of reach), and prints the time per window of each (the best of ``--repeat``).

    python bench/bench_window_checks.py [--runs 30] [--windows 100] [--timed 5] [--repeat 3]
"""

from __future__ import annotations

import copy
import os
import random
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.timing import best
from core import window_checks
from core.config import SuccessCondition, TagWindowConfig, WindowCheck
from core.vocabulary import RunStatus
from core.window_checks import RunEnded, WindowHistory, check_window, end_run
from core.windows import WindowResult, WindowSpec
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

T0 = 1763596800.0
CONFIG = TagWindowConfig(WindowSpec(count=10), (WindowCheck(
    aggregation="mean", condition=SuccessCondition("less", false_alert_rate=0.002, wait_for_n_points_of_history=10),
    history_runs=20, debounce_windows=3, debounce_out_of_bounds=2),))


def run_windows(run: int, windows: int, rng: random.Random) -> List[WindowResult]:
    """One run's count windows of 10 steps: step time around 3 s, the run 2% off at random, each window 1.6%."""
    name, effect = f"run-{run:04d}", rng.gauss(0, 0.02)
    return [WindowResult("bench", name, "step_time", "count", i, T0 + run * 86400 + i, T0 + run * 86400 + i + 1,
                         i * 10, i * 10 + 9, 10, False, {"mean": 3.0 * (1 + effect + rng.gauss(0, 0.016))})
            for i in range(windows)]


def check_runs(state: WindowHistory, runs: List[List[WindowResult]]) -> int:
    """Checks and ends each run in turn; returns how many alerts they raised."""
    alerts = 0
    for windows in runs:
        alerts += sum(len(check_window(state, window, CONFIG)) for window in windows)
        end_run(state, RunEnded("bench", windows[0].run, RunStatus.SUCCESS, windows[-1].end_time + 60, "step_time",
                                "count"), CONFIG, 3)
    return alerts


def main(argv=None) -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--runs", type=int, default=30, help="runs checked before the timed ones")
    parser.add_argument("--windows", type=int, default=100, help="count windows a run")
    parser.add_argument("--timed", type=int, default=5, help="runs whose windows are timed")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rng = random.Random(1)
    state = WindowHistory()
    check_runs(state, [run_windows(r, args.windows, rng) for r in range(args.runs)])
    timed = [run_windows(args.runs + r, args.windows, rng) for r in range(args.timed)]
    per = args.timed * args.windows
    with_s, with_alerts = best(args.repeat, lambda: check_runs(copy.deepcopy(state), timed))
    reach = window_checks.RUN_OFFSET_MIN
    window_checks.RUN_OFFSET_MIN = sys.maxsize  # no run ever has this many windows before the one judged
    try:
        without_s, without_alerts = best(args.repeat, lambda: check_runs(copy.deepcopy(state), timed))
    finally:
        window_checks.RUN_OFFSET_MIN = reach
    copy_s, _ = best(args.repeat, lambda: copy.deepcopy(state))
    print(f"step-aligned window checks against the last 20 of {args.runs} runs, {args.timed} runs x "
          f"{args.windows} windows timed, best of {args.repeat} (a copy of the state, {copy_s * 1e3:,.1f} ms, "
          "taken off)")
    print("| window check | per window | alerts |")
    print("|---|---:|---:|")
    print(f"| with the runs' offsets taken off | {(with_s - copy_s) / per * 1e6:,.0f} µs | {with_alerts} |")
    print(f"| without (before) | {(without_s - copy_s) / per * 1e6:,.0f} µs | {without_alerts} |")


if __name__ == "__main__":
    main()
