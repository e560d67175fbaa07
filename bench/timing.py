"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from typing import Any, Callable, Tuple


def best(repeat: int, fn: Callable[[], Any]) -> Tuple[float, Any]:
    """The fastest of ``repeat`` calls of ``fn`` in seconds, and its result (the least disturbed by other work)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result
