"""State coder benchmark: the project's ``RecordCoder`` against the ``PickleCoder`` it replaced.

The largest state of the pipeline is a window-check key's history (``core.window_checks.WindowHistory``,
the machine state the ordered stage keeps for that key, ``transforms.ordered``): the step-aligned windows of the last
successful runs. This builds it for ``--runs`` runs of ``--windows`` windows each (default 5 x 20,000, the
size the "Dataflow readiness" issue measured), plus a few everyday values (a run's accumulator, a message
summary, a metric history), and prints, per value, the encoded size and the best of ``--repeat``
encode and decode times of both coders.

    python bench/bench_state_coders.py [--runs 5] [--windows 20000] [--repeat 5]
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from apache_beam.coders import PickleCoder

from bench.timing import best
from core.history import HistoryEntry, MetricHistory
from core.window_checks import FinishedRun, WindowHistory
from core.windows import WindowResult
from scripts.write_state_fixtures import build
from trainguard.cli import DASHES_NOTE, StrictArgumentParser
from transforms.coders import RecordCoder

T0 = 1763596800.0


def window_history(runs: int, windows: int, seed: int = 1) -> WindowHistory:
    """A (test, tag, kind)'s history: ``runs`` finished runs of ``windows`` count windows (mean, min, max)."""
    rng = random.Random(seed)
    history = WindowHistory()
    for r in range(runs):
        run = f"run-{r:04d}"
        results = []
        for i in range(windows):
            mean = 2.0 * 0.9999 ** i + rng.gauss(0, 0.01)
            results.append(WindowResult("pt-cifar-tpu-v3-8", run, "loss", "count", i, T0 + r * 86400 + i * 3.0,
                                        T0 + r * 86400 + i * 3.0 + 2.9, i * 100, i * 100 + 99, 100, False,
                                        {"mean": mean, "min": mean - abs(rng.gauss(0, 0.05)),
                                         "max": mean + abs(rng.gauss(0, 0.05))}))
        history.finished_runs.append(FinishedRun(run, results, {"mean": frozenset({17, 4242})} if r == 2 else {}))
    return history


def measure(name: str, value: Any, repeat: int) -> List[str]:
    rows = []
    for coder in (PickleCoder(), RecordCoder()):
        encode_s, data = best(repeat, lambda coder=coder: coder.encode(value))
        decode_s, _ = best(repeat, lambda coder=coder, data=data: coder.decode(data))
        rows.append(f"| {name} | {type(coder).__name__} | {len(data):,} | {encode_s * 1000:,.3f} | "
                    f"{decode_s * 1000:,.3f} |")
    return rows


def main(argv=None) -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--windows", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    history = window_history(args.runs, args.windows)
    fixtures = build()
    values = [
        (f"window-check history, {args.runs} runs x {args.windows:,} windows (ordered-stage state)", history),
        ("run accumulator, 2 ranks (fixture)", fixtures["run_accumulator"]),
        ("message summary (fixture; crosses a shuffle)", fixtures["message_summary"]),
        ("metric history, 30 points",
         MetricHistory([HistoryEntry(f"run-{i}", 0.9 + i / 1000, True) for i in range(30)])),
    ]
    print("| value | coder | bytes | encode ms | decode ms |")
    print("|---|---|---:|---:|---:|")
    for name, value in values:
        for row in measure(name, value, args.repeat):
            print(row)


if __name__ == "__main__":
    main()
