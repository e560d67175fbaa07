"""Interpreter-exit and fork hooks shared by handlers, stats and samplers.

Objects register a bound method; only weak references are kept, so nothing
here keeps a handler alive. At exit, hooks run by ascending priority (stats
flush their windows before handlers flush to the network).

:data:`exit_deadline` is the one bound on waiting for delivery on the way
out: ``Run``'s flush at the end of the block and every handler's flush at
interpreter exit draw on it, so an unreachable Pub/Sub costs the process one
``exit_flush_timeout_s`` (10 s), not one per flush or per handler.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Callable, List, Optional, Tuple

logger = logging.getLogger("trainguard")

PRIORITY_STATS = 0
PRIORITY_SAMPLERS = 1
PRIORITY_HANDLERS = 2

_lock = threading.Lock()
_exit_hooks: List[Tuple[int, int, weakref.WeakMethod]] = []
_fork_hooks: List[weakref.WeakMethod] = []
_counter = 0


class ExitDeadline:
    """One deadline shared by the waits on the way out of the process.

    The first wait fixes it at its own timeout from now; later waits get what
    is left of it (or their own timeout, if shorter). A wait that delivered
    everything calls :meth:`release`, and so does a new ``Run``: the next wait
    starts a fresh deadline. Only waits that did not finish (an unreachable
    endpoint) therefore use it up, and the exit hooks never release it, so
    ``Run`` plus interpreter exit plus any number of handlers wait at most one
    timeout in total.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._deadline: Optional[float] = None
        self._lock = threading.Lock()

    def remaining(self, timeout: float) -> float:
        """Seconds the next wait may take: ``timeout``, capped by what is left of the shared deadline."""
        with self._lock:
            now = self.clock()
            if self._deadline is None:
                self._deadline = now + timeout
                return timeout
            return max(min(self._deadline - now, timeout), 0.0)

    def release(self) -> None:
        """Forgets the deadline: the next wait starts a new one."""
        with self._lock:
            self._deadline = None


exit_deadline = ExitDeadline()
"""The process's exit deadline (see ``ExitDeadline``)."""


def on_exit(method: Callable[[], None], priority: int) -> None:
    """Calls the bound ``method`` at interpreter exit, if its object still lives."""
    global _counter
    with _lock:
        _counter += 1
        _exit_hooks.append((priority, _counter, weakref.WeakMethod(method)))


def on_fork_child(method: Callable[[], None]) -> None:
    """Calls the bound ``method`` in a forked child process."""
    with _lock:
        _fork_hooks.append(weakref.WeakMethod(method))


def _run_exit_hooks() -> None:
    with _lock:
        hooks = sorted(_exit_hooks, key=lambda hook: hook[:2])
        _exit_hooks.clear()
    for _, _, ref in hooks:
        method = ref()
        if method is None:
            continue
        try:
            method()
        except Exception:
            logger.exception("trainguard: exit hook %r failed", method)


def _after_fork_child() -> None:
    global _lock, exit_deadline
    _lock = threading.Lock()  # the parent's may have been held by another thread
    exit_deadline = ExitDeadline()
    hooks = list(_fork_hooks)
    _fork_hooks.clear()
    _exit_hooks.clear()
    for ref in hooks:
        method = ref()
        if method is not None:
            with contextlib.suppress(Exception):  # exit must go on whatever one hook does
                method()


atexit.register(_run_exit_hooks)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
