"""Step-aligned history lookups: the step index of ``core.window_checks`` against the scan it replaced.

A window-check key (``core.window_checks.WindowHistory``) compares each window of a running run with the window
overlapping the most of its steps in each earlier successful run. That lookup used to scan all of a run's
windows; ``FinishedRun.most_overlapping`` bisects a step index of them, built on a run's first lookup after
its state was decoded. This builds ``--runs`` finished runs of ``--windows`` count windows (default 5 x 20,000,
the size the "Dataflow readiness" issue measured), checks ``--lookups`` windows of a new run spread over the
steps against them with both, asserts they find the same history, and prints the time per checked window of
each (the best of ``--repeat``), and what building the index costs (once per run and decoded state).

    python bench/bench_window_history.py [--runs 5] [--windows 20000] [--lookups 200] [--repeat 3]
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.timing import best
from core.window_checks import FinishedRun, step_aligned_history, window_overlap
from core.windows import WindowResult
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

T0 = 1763596800.0


def finished_runs(runs: int, windows: int, seed: int = 1) -> List[FinishedRun]:
    """``runs`` finished runs of ``windows`` count windows of 100 steps (mean), as the state coder bench builds."""
    rng = random.Random(seed)
    finished = []
    for r in range(runs):
        run = f"run-{r:04d}"
        results = [WindowResult("pt-cifar-tpu-v3-8", run, "loss", "count", i, T0 + r * 86400 + i * 3.0,
                                T0 + r * 86400 + i * 3.0 + 2.9, i * 100, i * 100 + 99, 100, False,
                                {"mean": 2.0 * 0.9999 ** i + rng.gauss(0, 0.01)}) for i in range(windows)]
        finished.append(FinishedRun(run, results, {"mean": frozenset({17, 4242})} if r == 2 else {}))
    return finished


def scanned_history(window: WindowResult, runs: Sequence[FinishedRun], aggregation: str,
                    limit: Optional[int] = None) -> Tuple[List[float], List[str]]:
    """The reference: ``core.window_checks.step_aligned_history`` as it was, scanning every window of every run."""
    values: List[float] = []
    compared: List[str] = []
    for finished in reversed(runs):
        if limit is not None and len(values) >= limit:
            break
        overlapping = [w for w in finished.windows if window_overlap(w, window) >= 0]
        if overlapping:
            best = max(overlapping, key=lambda w: (window_overlap(w, window), -w.index))
            value = best.values.get(aggregation)
            if value is not None and best.index not in finished.excluded.get(aggregation, ()):
                values.append(value)
                compared.append(finished.run)
    return values[::-1], compared[::-1]


def fresh(runs: List[FinishedRun]) -> List[FinishedRun]:
    """The runs as a decoded state has them: no step index yet."""
    return [dataclasses.replace(f) for f in runs]


def main(argv=None) -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--windows", type=int, default=20000)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    runs = finished_runs(args.runs, args.windows)
    stride = max(1, args.windows // args.lookups)
    queries = [WindowResult("pt-cifar-tpu-v3-8", "new", "loss", "count", i, 0.0, 1.0, i * 100 + 7, i * 100 + 106,
                            100, False, {"mean": 1.0}) for i in range(0, args.windows, stride)][:args.lookups]

    def lookups(history: Callable[..., Tuple[List[float], List[str]]], of: List[FinishedRun]) -> List[Any]:
        return [history(q, of, "mean") for q in queries]

    scan_s, expected = best(args.repeat, lambda: lookups(scanned_history, runs))
    indexed = fresh(runs)
    lookups(step_aligned_history, indexed)  # builds the index of every run
    index_s, found = best(args.repeat, lambda: lookups(step_aligned_history, indexed))
    assert found == expected, "the step index found another history than the scan"
    build_s, _ = best(args.repeat, lambda: step_aligned_history(queries[0], fresh(runs), "mean"))
    per = len(queries)
    print(f"step-aligned history of one window, {args.runs} runs x {args.windows:,} windows, "
          f"{per} windows checked, best of {args.repeat}")
    print("| lookup | per window checked | all checked windows |")
    print("|---|---:|---:|")
    print(f"| scan of every window (before) | {scan_s / per * 1e3:,.3f} ms | {scan_s * 1e3:,.1f} ms |")
    print(f"| step index (after) | {index_s / per * 1e6:,.1f} µs | {index_s * 1e3:,.3f} ms |")
    print(f"| building the step index of the {args.runs} runs (first lookup after a decode) | "
          f"{build_s * 1e3:,.2f} ms | |")
    print(f"speed-up per lookup: {scan_s / index_s:,.0f}x")


if __name__ == "__main__":
    main()
