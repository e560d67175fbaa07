"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence, Tuple


def best(repeat: int, fn: Callable[[], Any]) -> Tuple[float, Any]:
    """The fastest of ``repeat`` calls of ``fn`` in seconds, and its result (the least disturbed by other work)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


@dataclasses.dataclass(frozen=True)
class ProcessCost:
    """One whole process: wall time, CPU and peak resident memory (its own, from ``os.wait4``), and its output."""
    wall_s: float
    user_s: float
    sys_s: float
    peak_rss_mib: float
    output: str

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


# Runs the measured process and reports its own rusage. A child's peak RSS counts what it shared with its parent
# before exec, so the measured process is started by this small process, not by a benchmark that imported Beam.
_LAUNCHER = """
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"code": os.waitstatus_to_exitcode(status), "user": usage.ru_utime, "sys": usage.ru_stime,
               "maxrss_kib": usage.ru_maxrss}, f)
"""


def run_process(argv: Sequence[str], log_path: str, cwd: Optional[str] = None) -> ProcessCost:
    """Runs ``argv`` to its end with its output in ``log_path``; RuntimeError with the output's end if it fails."""
    usage_path = log_path + ".rusage.json"
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", _LAUNCHER, usage_path, *argv], cwd=cwd, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
        wall = time.perf_counter() - started
    with open(log_path, errors="replace") as f:
        output = f.read()
    with open(usage_path) as f:
        usage = json.load(f)
    if usage["code"] != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... exited {usage['code']}:\n{output[-3000:]}")
    return ProcessCost(wall, usage["user"], usage["sys"], usage["maxrss_kib"] / 1024, output)
