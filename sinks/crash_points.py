"""Named instants at which the local writers can be killed on purpose, so that tests prove a rerun recovers.

Internal, for tests. ``TRAINGUARD_CRASH_AT=name#n`` sends SIGKILL to this process the ``n``-th time (1 when
``#n`` is left out) it reaches :func:`crash_point` ``(name)``; ``TRAINGUARD_CRASH_TRACE=path`` appends the name
of every instant reached to ``path``, one a line, so that a test can list the instants of a clean run and then
kill a run at each of them (``tests/pipeline/test_kills.py``). A kill, not an exception: nothing of the
process's own clean-up runs, as when the OOM killer or a pre-empted machine ends it. Unset, each call is two
environment look-ups.
"""

from __future__ import annotations

import collections
import os
import signal
from typing import Counter

CRASH_AT_ENV = "TRAINGUARD_CRASH_AT"
CRASH_TRACE_ENV = "TRAINGUARD_CRASH_TRACE"

_reached: Counter[str] = collections.Counter()


def crash_point(name: str) -> None:
    """Records that this process reached instant ``name``; kills it here if ``TRAINGUARD_CRASH_AT`` says so."""
    trace, wanted = os.environ.get(CRASH_TRACE_ENV), os.environ.get(CRASH_AT_ENV)
    if not trace and not wanted:
        return
    _reached[name] += 1
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{name}#{_reached[name]}\n")
    if wanted and wanted in (f"{name}#{_reached[name]}", name if _reached[name] == 1 else None):
        os.kill(os.getpid(), signal.SIGKILL)
