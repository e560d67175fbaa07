"""A training run's lifecycle: ``run_started`` and ``run_finished`` events.

::

    with trainguard.Run("resnet50-nightly", "2026-11-21.3"):
        train()

publishes ``run_started`` on entry and ``run_finished`` on exit with status
``success``, or ``failure`` when the block raises (``SystemExit`` with code 0
or None counts as success), then flushes the handler for at most
``flush_timeout`` seconds. That wait is the start of the process's one exit
deadline (``lifecycle.exit_deadline``): if it does not deliver everything,
the flushes at interpreter exit get only what is left of it, so an
unreachable Pub/Sub holds the process ``flush_timeout`` once, not once here
and again at exit. The events go to ``handler`` or, by default, to
the configured default handler; a wire handler without a test/run is bound
to this run's.

In a distributed job (torchrun, torchelastic) every worker runs its own
``Run``: ``run_started`` names the worker's ``host`` and ``rank`` (given, or
``$RANK``/``$WORLD_SIZE``; see ``trainguard.distributed``). When the elastic
agent has restarted the workers (``$TORCHELASTIC_RESTART_COUNT`` > 0), an
``elastic_restart`` event ``{"restart_count": n}`` follows ``run_started``,
and ``run_finished`` reports ``num_failures`` = n unless the caller sets it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Optional

from . import distributed, lifecycle, wire
from .handlers import WireHandler
from .metrics import api

_MAX_ERROR_CHARS = 2000
logger = logging.getLogger("trainguard")


class Run:
    """Context manager (or ``start()``/``finish()``) publishing a run's lifecycle events."""

    def __init__(self, test: str, run_id: str, handler: Optional[api.MetricHandler] = None,
                 data: Optional[Dict[str, Any]] = None, flush_timeout: float = 10.0, *,
                 rank: Optional[int] = None, world_size: Optional[int] = None):
        wire.check_name(test, "test")
        wire.check_name(run_id, "run")
        self.test = test
        self.run_id = run_id
        self.data = dict(data or {})
        self.flush_timeout = flush_timeout
        self._rank = distributed.resolve(rank, world_size)  # explicit, else $RANK/$WORLD_SIZE, read once
        self.restart_count = distributed.restart_count()
        """How often torchelastic restarted this job's workers before this attempt ($TORCHELASTIC_RESTART_COUNT)."""
        self.num_failures = self.restart_count
        """Reported in ``run_finished``: the elastic restarts unless set (or passed to ``finish``)."""
        self.status: Optional[str] = None
        self._handler = handler
        self._started_at: Optional[float] = None
        self._lock = threading.Lock()

    @property
    def handler(self) -> api.MetricHandler:
        if self._handler is None:
            self._handler = api.get_handler(None)
        return self._handler

    def start(self) -> Run:
        """Publishes ``run_started`` (once)."""
        with self._lock:
            if self._started_at is not None:
                return self
            handler = self.handler
            bind = getattr(handler, "bind", None)
            if isinstance(handler, WireHandler):
                handler.bind(self.test, self.run_id, *self._rank)  # without a rank of its own, it takes this one
            elif bind is not None:  # another handler's bind(test, run)
                bind(self.test, self.run_id)
            self._started_at = time.time()
        lifecycle.exit_deadline.release()  # a new run: its end gets a full wait again
        data: Dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0]}
        rank = self.rank_of(handler)
        if rank.known:
            data["rank"] = rank.rank
            if rank.world_size is not None:
                data["world_size"] = rank.world_size
        handler.emit_event(wire.RUN_STARTED, {**data, **self.data}, self._started_at)
        if self.restart_count > 0:
            handler.emit_event(wire.ELASTIC_RESTART, {"restart_count": self.restart_count}, self._started_at)
        return self

    def rank_of(self, handler: api.MetricHandler) -> distributed.Rank:
        """This worker's rank: the one given or read at creation, else the handler's."""
        if self._rank.known:
            return self._rank
        rank = getattr(handler, "rank", None)
        if isinstance(rank, int) and not isinstance(rank, bool):
            world_size = getattr(handler, "world_size", None)
            return distributed.Rank(rank, world_size if isinstance(world_size, int) else None)
        return distributed.UNKNOWN

    def finish(self, status: str = wire.STATUS_SUCCESS, **data: Any) -> None:
        """Publishes ``run_finished`` (once) and flushes the handler."""
        if status not in wire.FINISHED_STATUSES:
            raise ValueError(f"status must be one of {wire.FINISHED_STATUSES}, got {status!r}")
        with self._lock:
            if self.status is not None:
                return
            if self._started_at is None:
                raise RuntimeError("Run.finish() before Run.start()")
            self.status = status
        now = time.time()
        handler = self.handler
        event = {"status": status, "num_failures": self.num_failures,
                 "duration_s": round(now - self._started_at, 3), **_dropped_so_far(handler), **data}
        try:
            handler.emit_event(wire.RUN_FINISHED, event, now)
            if handler.flush(lifecycle.exit_deadline.remaining(self.flush_timeout)):
                lifecycle.exit_deadline.release()  # all delivered: the exit wait starts afresh
        except Exception:
            logger.exception("trainguard: could not publish run_finished")

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or (exc_type is SystemExit and exc.code in (0, None)):
            self.finish(wire.STATUS_SUCCESS)
        else:
            error = f"{exc_type.__name__}: {exc}"[:_MAX_ERROR_CHARS]
            self.finish("failure", error=error)


def _dropped_so_far(handler: Any) -> Dict[str, int]:
    """What ``run_finished`` says of what the handler has dropped before the run's end (a loop that logged faster
    than the sink drained, counted as it happens; values the encoder refused or a sink gave up on, counted once
    the background thread got to them): ``points_dropped`` and ``events_dropped`` when not 0, so that the run's
    data (in its alerts and ``job_history``) shows it; nothing from a handler without ``stats()``. The handler's
    summary at exit has the final counts."""
    stats = getattr(handler, "stats", None)
    if not callable(stats):
        return {}
    try:
        counts = stats()
        dropped = {"points_dropped": int(counts.points_dropped), "events_dropped": int(counts.events_dropped)}
    except Exception:  # noqa: BLE001 - a handler's stats never stop the run's end from being published
        return {}
    return {key: value for key, value in dropped.items() if value}
