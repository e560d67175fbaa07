"""The training thread's side of a wire handler: two bounded buffers and nothing else.

Logging a value costs one ``extend`` of a list by ``(tag, value, step, time)``:
no lock, no encoding, no I/O, never a raise. The list is flat (four entries a
point, see :data:`FIELDS`) rather than a deque of tuples: a tuple per point
that lives until the background thread takes it is a container the cyclic
garbage collector tracks, promotes and walks again and again (about 0.1 us a
point at 100,000 points/s); the flat list holds only the values themselves,
and the background thread slices whole columns out of what it takes (the
values are ``taken[1::4]``) at C speed. The handler's background thread takes the values out
(:meth:`Intake.take_points`, :meth:`Intake.take_events`). A full buffer drops
the newest value and counts it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import wire

logger = logging.getLogger("trainguard")

Point = Tuple[Any, Any, Any, Any]  # (tag or (group, name), value, step, unix seconds), validated when encoded
FIELDS = 4
"""Entries a point takes in ``Intake.points``: tag (or ``(group, name)``), value, step, unix seconds."""
OVERFLOW_WARN_INTERVAL_S = 60.0  # while points are dropped for a full buffer, a warning at most this often


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
    """Points and events waiting for the background thread; ``wake`` is called once ``points_per_wake`` points
    are in (the handler's ``PublisherConfig.messages_per_wake`` messages' worth)."""

    def __init__(self, max_points: int, max_events: int, points_per_wake: int, wake: Callable[[], None],
                 kind: str):
        # Flat: tag, value, step, time, tag, value, ... after ``_base`` placeholders. Only ever extended by
        # whole points (one C call, atomic under the GIL) and emptied from the front, so it always holds whole
        # points. The placeholders are never taken: a list emptied to (nearly) nothing shrinks its allocation,
        # and then grows back realloc by realloc, ~40 of them a message, copying up to 30 KB each (+0.1 us a
        # point on the training thread, and a p99 twice as long). Two wakes' worth of placeholders keep the
        # list over half its allocation, so it never shrinks, and the list is made with room for a wake's worth
        # and an eighth more, so that it does not grow either while the background thread keeps up (nor before
        # the first wake: growing a list costs the training thread page faults too). 400 KB at 4 messages of
        # 1,000 points a wake (100 KB at one).
        batch = FIELDS * min(points_per_wake, max_points)
        self._base = 2 * batch
        self.points: List[Any] = [None] * (self._base + batch + batch // 8 + FIELDS)
        del self.points[self._base:]  # (within half the allocation: the list keeps it)
        self.events: Deque[Dict[str, Any]] = collections.deque()
        self._max_points = max_points
        self._max_events = max_events
        self._points_per_wake = points_per_wake
        self._wake = wake
        self._kind = kind
        self._lock = threading.Lock()
        self._counts = IntakeCounts()
        self._warned_full_at: Optional[float] = None  # time.monotonic() of the last buffer-full warning
        self.all_floats = True
        """Whether every point logged so far had a float value and a float time (the adder's common case: its
        times are ``time.time()``'s), so that the encoder need not check their types again. It turns False for
        good before the first other point enters ``points``: read after ``take_points``, it holds for the points
        taken."""
        self.muted = False  # a forked child's handler: no warnings, no events
        self.closed = False  # nothing takes values out any more: what it holds counts as unsent at exit

    def __bool__(self) -> bool:
        return len(self.points) > self._base or bool(self.events)

    def counts(self) -> IntakeCounts:
        """The counters; once closed, values still buffered (or logged since) count as unsent at exit."""
        with self._lock:
            counts = dataclasses.replace(self._counts)
            if self.closed:
                counts.points_unsent_at_exit += self.point_count()
                counts.events_unsent_at_exit += len(self.events)
            return counts

    def point_count(self) -> int:
        """Points buffered now (``points`` holds ``FIELDS`` entries each, after the placeholders)."""
        return (len(self.points) - self._base) // FIELDS

    def adder(self, group: str, group_prefix: bool) -> Callable[..., None]:
        """The fast ``add_value(metric_name, metric_value, step=None)`` of a stream (see the module docstring)."""
        buf = self.points
        append = buf.extend  # of a 4-tuple: built and freed at once, never seen by the garbage collector
        cap = self._base + self._max_points * FIELDS  # len(buf): the placeholders, then FIELDS a point
        trigger = self._base + (self._points_per_wake - 1) * FIELDS
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
                        if type(metric_value) is not float:
                            self.all_floats = False
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
                    if type(metric_value) is not float:
                        self.all_floats = False
                append((metric_name, metric_value, step, now()))
                if n == trigger:
                    wake()
            else:
                overflow()
        return add_value

    def add_point(self, tag: Any, value: Any, step: Optional[int], timestamp: float) -> None:
        """One point with an explicit time (seconds since the epoch)."""
        if len(self.points) < self._base + self._max_points * FIELDS:
            if type(value) is not float:
                value = snapshot(value)
            if type(value) is not float or type(timestamp) is not float:
                self.all_floats = False
            self.points.extend((tag, value, step, timestamp))
            if len(self.points) >= self._base + self._points_per_wake * FIELDS:
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
        """Counts a point dropped for a full buffer; warns at the first and then at most once a
        ``OVERFLOW_WARN_INTERVAL_S`` while the loop keeps logging faster than the sink drains, with the total."""
        with self._lock:
            self._counts.points_dropped_buffer_full += 1
            dropped = self._counts.points_dropped_buffer_full
            now = time.monotonic()
            due = self._warned_full_at is None or now - self._warned_full_at >= OVERFLOW_WARN_INTERVAL_S
            if due:
                self._warned_full_at = now
        if due and not self.muted:
            logger.warning("trainguard: %s buffer is full (%d points); dropping new points until the "
                           "background thread catches up (%d dropped so far)", self._kind, self._max_points, dropped)

    def oldest_time(self) -> Optional[float]:
        """The time of the oldest buffered point; None when there is none or it is not a number."""
        try:
            oldest = self.points[self._base + 3]
        except IndexError:
            return None
        return oldest if isinstance(oldest, (int, float)) else None

    def take_events(self) -> List[Dict[str, Any]]:
        events = []
        while self.events:
            events.append(self.events.popleft())
        return events

    def take_points(self, n: int) -> List[Any]:
        """The oldest ``n`` points, flat (``FIELDS`` entries each), taken out. Training threads only extend
        the list meanwhile, at its end: the slice and the ``del`` see the same oldest ``n`` points."""
        end = self._base + n * FIELDS
        points = self.points[self._base:end]
        del self.points[self._base:end]
        return points

    def drop_all(self, count: bool) -> None:
        """Empties both buffers; with ``count``, what was in them is counted unsent.

        Points are taken out as many as there are at one moment, events one by one, so a value that
        another thread adds meanwhile is either counted here or stays buffered, never lost uncounted.
        """
        points = self._empty_points()
        events = self._empty(self.events)
        if count:  # (a forked child does not count: it must not touch a lock the parent may have held)
            with self._lock:
                self._counts.points_unsent_at_exit += points
                self._counts.events_unsent_at_exit += events

    def _empty_points(self) -> int:
        taken = len(self.points)  # whole points (see __init__); ones appended from here on stay
        del self.points[self._base:taken]
        return (taken - self._base) // FIELDS

    @staticmethod
    def _empty(buffer: Deque[Any]) -> int:
        popleft = buffer.popleft
        taken = 0
        while buffer:
            popleft()
            taken += 1
        return taken
