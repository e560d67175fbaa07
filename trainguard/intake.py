"""The training thread's side of a wire handler: two bounded buffers and nothing else.

Logging a value costs one append of ``(tag, value, step, time)`` to a deque: no
lock, no encoding, no I/O, never a raise. The handler's background thread takes
the values out (:meth:`Intake.take_points`, :meth:`Intake.take_events`). A full
buffer drops the newest value and counts it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import wire

logger = logging.getLogger("trainguard")

Point = Tuple[Any, Any, Any, Any]  # (tag or (group, name), value, step, unix seconds), validated when encoded


def snapshot(value: Any) -> Any:
    """The value as it is now: a float for numpy scalars, 0-d arrays and tensors
    (which may change in place after being logged; like ``.item()``, reading a
    GPU tensor waits for it). Ints and anything unreadable pass unchanged, for
    the background thread to encode or count as invalid. Never raises."""
    if type(value) is int or isinstance(value, (str, bytes)):
        return value
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - counted as invalid later
        return value


@dataclasses.dataclass
class IntakeCounts:
    points_dropped_buffer_full: int = 0
    events_dropped_buffer_full: int = 0
    points_invalid: int = 0  # emit() given something that is not a MetricData
    points_unsent_at_exit: int = 0
    events_unsent_at_exit: int = 0


class Intake:
    """Points and events waiting for the background thread; ``wake`` is called once a message's worth is in."""

    def __init__(self, max_points: int, max_events: int, points_per_message: int, wake: Callable[[], None],
                 kind: str):
        self.points: Deque[Point] = collections.deque()
        self.events: Deque[Dict[str, Any]] = collections.deque()
        self._max_points = max_points
        self._max_events = max_events
        self._points_per_message = points_per_message
        self._wake = wake
        self._kind = kind
        self._lock = threading.Lock()
        self._counts = IntakeCounts()
        self._warned_full = False
        self.muted = False  # a forked child's handler: no warnings, no events
        self.closed = False  # nothing takes values out any more: what it holds counts as unsent at exit

    def __bool__(self) -> bool:
        return bool(self.points or self.events)

    def counts(self) -> IntakeCounts:
        """The counters; once closed, values still buffered (or logged since) count as unsent at exit."""
        with self._lock:
            counts = dataclasses.replace(self._counts)
            if self.closed:
                counts.points_unsent_at_exit += len(self.points)
                counts.events_unsent_at_exit += len(self.events)
            return counts

    def adder(self, group: str, group_prefix: bool) -> Callable[..., None]:
        """The fast ``add_value(metric_name, metric_value, step=None)`` of a stream (see the module docstring)."""
        buf = self.points
        append = buf.append
        cap = self._max_points
        trigger = self._points_per_message - 1
        wake = self._wake
        overflow = self.overflow
        now = time.time
        read = snapshot

        if group_prefix:
            def add_grouped(metric_name, metric_value, step=None):
                n = len(buf)
                if n < cap:
                    if type(metric_value) is not float:
                        metric_value = read(metric_value)
                    append(((group, metric_name), metric_value, step, now()))
                    if n == trigger:
                        wake()
                else:
                    overflow()
            return add_grouped

        def add_value(metric_name, metric_value, step=None):
            n = len(buf)
            if n < cap:
                if type(metric_value) is not float:
                    metric_value = read(metric_value)
                append((metric_name, metric_value, step, now()))
                if n == trigger:
                    wake()
            else:
                overflow()
        return add_value

    def add_point(self, tag: Any, value: Any, step: Optional[int], timestamp: float) -> None:
        """One point with an explicit time (seconds since the epoch)."""
        if len(self.points) < self._max_points:
            self.points.append((tag, value if type(value) is float else snapshot(value), step, timestamp))
            if len(self.points) >= self._points_per_message:
                self._wake()
        else:
            self.overflow()

    def add_event(self, event_type: str, data: Dict[str, Any], timestamp: float) -> None:
        if self.muted:
            return
        if len(self.events) < self._max_events:
            self.events.append(wire.event_dict(event_type, timestamp, data))
            self._wake()
        else:
            with self._lock:
                self._counts.events_dropped_buffer_full += 1

    def count_invalid(self) -> None:
        with self._lock:
            self._counts.points_invalid += 1

    def overflow(self) -> None:
        with self._lock:
            self._counts.points_dropped_buffer_full += 1
            first = not self._warned_full
            self._warned_full = True
        if first and not self.muted:
            logger.warning("trainguard: %s buffer is full (%d points); dropping new points until the "
                           "background thread catches up", self._kind, self._max_points)

    def oldest_time(self) -> Optional[float]:
        """The time of the oldest buffered point; None when there is none or it is not a number."""
        try:
            oldest = self.points[0][3]
        except IndexError:
            return None
        return oldest if isinstance(oldest, (int, float)) else None

    def take_events(self) -> List[Dict[str, Any]]:
        events = []
        while self.events:
            events.append(self.events.popleft())
        return events

    def take_points(self, n: int) -> List[Point]:
        # starmap calls popleft n times in C: half the cost of a list comprehension
        return list(itertools.starmap(self.points.popleft, itertools.repeat((), n)))

    def drop_all(self, count: bool) -> None:
        """Empties both buffers; with ``count``, what was in them is counted unsent.

        Values are taken out one by one, so one that another thread appends
        meanwhile is either counted here or stays buffered, never lost uncounted.
        """
        points = self._empty(self.points)
        events = self._empty(self.events)
        if count:  # (a forked child does not count: it must not touch a lock the parent may have held)
            with self._lock:
                self._counts.points_unsent_at_exit += points
                self._counts.events_unsent_at_exit += events

    @staticmethod
    def _empty(buffer: Deque[Any]) -> int:
        popleft = buffer.popleft
        taken = 0
        while buffer:
            popleft()
            taken += 1
        return taken
