"""Interpreter-exit and fork hooks shared by handlers, stats and samplers.

Objects register a bound method; only weak references are kept, so nothing
here keeps a handler alive. At exit, hooks run by ascending priority (stats
flush their windows before handlers flush to the network).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from typing import Callable, List, Tuple

logger = logging.getLogger("trainguard")

PRIORITY_STATS = 0
PRIORITY_SAMPLERS = 1
PRIORITY_HANDLERS = 2

_lock = threading.Lock()
_exit_hooks: List[Tuple[int, int, weakref.WeakMethod]] = []
_fork_hooks: List[weakref.WeakMethod] = []
_counter = 0


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
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread
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
