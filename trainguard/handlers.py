"""Wire handlers: buffer metric values, send wire messages from a background thread.

``WireHandler`` holds everything shared by the Pub/Sub and JSONL handlers;
subclasses only supply a transport (something with ``send`` and ``close``).

The training thread's cost is one call appending a tuple to a deque (no lock,
no encoding, no I/O); see ``WireHandler.stream_adder``. A daemon thread
batches, encodes and sends. Memory is bounded twice: ``max_buffered_points``
values waiting to be encoded (newer values are dropped and counted when it is
full) and ``max_pending_bytes`` of encoded messages waiting to be delivered
(the oldest are spilled to a JSONL file, if configured, or dropped and
counted). Failed sends are retried with exponential backoff until
``retry_deadline_s``. At interpreter exit the handler flushes for at most
``exit_flush_timeout_s`` and logs one line with what was delivered, dropped
and spilled.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from . import _lifecycle, wire
from ._encoding import EncodedMessage, MessageEncoder
from .metrics.api import MetricData, MetricHandler
from .transports import JsonlTransport, JsonlWriter, Transport

logger = logging.getLogger("trainguard")

ENV_TEST = "TRAINGUARD_TEST"
ENV_RUN = "TRAINGUARD_RUN"
MAX_MESSAGES_PER_SEND = 1000  # Pub/Sub's limit of messages per Publish request


def _snapshot(value: Any) -> Any:
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


def _yield_gil() -> None:
    """Lets a training thread waiting for the GIL have it now.

    The background thread calls this between slices of a few hundred points:
    without it, a thread waiting for the GIL only gets it when the holder
    blocks or after the 5 ms switch interval, which would stall training.
    (``sleep(0)`` releases the GIL but often takes it straight back.)
    """
    time.sleep(0.00002)


@dataclasses.dataclass
class PublisherConfig:
    """Batching, memory and retry settings of a wire handler."""
    max_points_per_message: int = 1000
    """A message is sent once this many points are buffered..."""
    max_latency_ms: float = 1000.0
    """...or once the oldest buffered point is this old."""
    max_buffered_points: int = 100_000
    """Values waiting for the background thread; newer ones are dropped past this."""
    max_buffered_events: int = 10_000
    max_message_bytes: int = 900_000
    max_pending_bytes: int = 64 << 20
    """Encoded messages waiting for delivery; the oldest are spilled or dropped past this."""
    max_send_bytes: int = 1_000_000
    """At most this much (and 1000 messages) goes into one send (one Publish request).
    After a failed send of several messages the limit halves, down to one message,
    and grows back on success: a server refusing large requests still gets everything."""
    send_timeout_s: float = 30.0
    retry_initial_backoff_s: float = 0.5
    retry_max_backoff_s: float = 30.0
    retry_deadline_s: float = 600.0
    """A message still undelivered this long after its first attempt is given up."""
    exit_flush_timeout_s: float = 10.0
    spill_path: Optional[str] = None
    """If set, undeliverable messages are appended here (JSONL, replayable) instead of dropped."""
    max_spill_bytes: int = 1 << 30
    group_prefix: bool = False
    """Tag points ``group/name`` instead of ``name``."""

    def validate(self) -> None:
        if not 1 <= self.max_points_per_message <= wire.MAX_POINTS_PER_MESSAGE:
            raise ValueError(f"max_points_per_message must be 1..{wire.MAX_POINTS_PER_MESSAGE}")
        if not 4096 <= self.max_message_bytes <= wire.MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be 4096..{wire.MAX_MESSAGE_BYTES}")
        for name in ("max_latency_ms", "max_buffered_points", "max_buffered_events", "max_pending_bytes",
                     "send_timeout_s", "retry_initial_backoff_s", "retry_max_backoff_s",
                     "retry_deadline_s", "exit_flush_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


@dataclasses.dataclass
class HandlerStats:
    """Counts since the handler was created."""
    points_delivered: int = 0
    events_delivered: int = 0
    messages_delivered: int = 0
    bytes_delivered: int = 0
    send_failures: int = 0
    points_dropped_buffer_full: int = 0
    events_dropped_buffer_full: int = 0
    points_invalid: int = 0
    points_nonfinite: int = 0
    events_invalid: int = 0
    points_undeliverable: int = 0
    events_undeliverable: int = 0
    points_unsent_at_exit: int = 0
    events_unsent_at_exit: int = 0
    points_spilled: int = 0
    events_spilled: int = 0
    messages_spilled: int = 0

    @property
    def points_dropped(self) -> int:
        return (self.points_dropped_buffer_full + self.points_invalid + self.points_nonfinite
                + self.points_undeliverable + self.points_unsent_at_exit)

    @property
    def events_dropped(self) -> int:
        return (self.events_dropped_buffer_full + self.events_invalid
                + self.events_undeliverable + self.events_unsent_at_exit)


@dataclasses.dataclass
class _Pending:
    message: EncodedMessage
    first_attempt: Optional[float] = None


class WireHandler(MetricHandler):
    """Base of handlers that publish wire-contract messages (see module doc).

    ``test`` and ``run`` name the messages' run; when not given they come from
    ``$TRAINGUARD_TEST``/``$TRAINGUARD_RUN`` or from the first ``Run`` that
    uses this handler. Values logged before the handler knows its run wait in
    the buffer.
    """

    kind = "wire"

    def __init__(self, transport: Transport, test: Optional[str] = None, run: Optional[str] = None,
                 config: Optional[PublisherConfig] = None):
        self.config = config or PublisherConfig()
        self.config.validate()
        self._transport = transport
        self._test: Optional[str] = None
        self._run: Optional[str] = None
        test = test or os.environ.get(ENV_TEST) or None
        run = run or os.environ.get(ENV_RUN) or None
        if (test is None) != (run is None):
            raise ValueError("give both test and run, or neither")
        self._wake = threading.Event()
        if test is not None:
            self.bind(test, run)
        self._points: Deque[Tuple[Any, Any, Any, Any]] = collections.deque()
        self._events: Deque[Dict[str, Any]] = collections.deque()
        self._pending: Deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._holding = False
        self._encoder: Optional[MessageEncoder] = None
        self._spill = JsonlWriter(self.config.spill_path, self.config.max_spill_bytes) \
            if self.config.spill_path else None
        self.stats_lock = threading.Lock()
        self._stats = HandlerStats()
        self._cycle_done = threading.Condition()
        self._flush_requests = 0
        self._stop_deadline: Optional[float] = None
        self._retry_at = 0.0
        self._send_limit = self.config.max_send_bytes
        self._consecutive_failures = 0
        self._last_failure_log = 0.0
        self._closed = False
        self._disabled = False
        self._warned_full = False
        self._warned: set = set()
        self._thread = threading.Thread(target=self._worker, name=f"trainguard-{self.kind}", daemon=True)
        self._thread.start()
        _lifecycle.on_exit(self._close_at_exit, _lifecycle.PRIORITY_HANDLERS)
        _lifecycle.on_fork_child(self._after_fork_in_child)

    # -- identity ------------------------------------------------------------

    @property
    def test(self) -> Optional[str]:
        return self._test

    @property
    def run(self) -> Optional[str]:
        return self._run

    def bind(self, test: str, run: str) -> None:
        """Sets the run this handler publishes for; it cannot change afterwards."""
        wire.check_name(test, "test")
        wire.check_name(run, "run")
        if self._test is None:
            self._test, self._run = test, run
            self._wake.set()
        elif (self._test, self._run) != (test, run):
            raise ValueError(f"handler already publishes for test={self._test!r} run={self._run!r}, "
                             f"not test={test!r} run={run!r}")

    # -- the training thread's side --------------------------------------------

    def stream_adder(self, group_name: str):
        """The fast ``add_value(metric_name, metric_value, step=None)`` for a stream.

        Appends ``(tag, value, step, time.time())`` to the buffer; never blocks,
        never raises, and wakes the background thread once a message is full.
        """
        buf = self._points
        snapshot = _snapshot
        append = buf.append
        cap = self.config.max_buffered_points
        trigger = self.config.max_points_per_message - 1
        wake = self._wake.set
        overflow = self._overflow
        now = time.time

        if self.config.group_prefix:
            def add_value(metric_name, metric_value, step=None):
                n = len(buf)
                if n < cap:
                    if type(metric_value) is not float:
                        metric_value = snapshot(metric_value)
                    append(((group_name, metric_name), metric_value, step, now()))
                    if n == trigger:
                        wake()
                else:
                    overflow()
            return add_value

        def add_value(metric_name, metric_value, step=None):
            n = len(buf)
            if n < cap:
                if type(metric_value) is not float:
                    metric_value = snapshot(metric_value)
                append((metric_name, metric_value, step, now()))
                if n == trigger:
                    wake()
            else:
                overflow()
        return add_value

    def emit(self, metric_data: MetricData) -> None:
        """torchelastic's handler interface (the slower path: a MetricData per value)."""
        try:
            tag = metric_data.name
            if self.config.group_prefix:
                tag = (metric_data.group_name, tag)
            self.add_point(tag, metric_data.value, getattr(metric_data, "step", None), metric_data.timestamp)
        except Exception:  # noqa: BLE001 - never raise into training code
            with self.stats_lock:
                self._stats.points_invalid += 1

    def add_point(self, tag: Any, value: Any, step: Optional[int], timestamp: float) -> None:
        """Buffers one point with an explicit time (seconds since the epoch)."""
        if len(self._points) < self.config.max_buffered_points:
            self._points.append((tag, value if type(value) is float else _snapshot(value), step, timestamp))
            if len(self._points) >= self.config.max_points_per_message:
                self._wake.set()
        else:
            self._overflow()

    def emit_event(self, event_type: str, data: Dict[str, Any], timestamp: float) -> None:
        """Buffers an event; events are sent at once, with the points buffered so far."""
        if self._disabled:
            return
        if len(self._events) < self.config.max_buffered_events:
            self._events.append(wire.event_dict(event_type, timestamp, data))
            self._wake.set()
        else:
            with self.stats_lock:
                self._stats.events_dropped_buffer_full += 1

    def _overflow(self) -> None:
        with self.stats_lock:
            self._stats.points_dropped_buffer_full += 1
            first = not self._warned_full
            self._warned_full = True
        if first and not self._disabled:
            logger.warning("trainguard: %s buffer is full (%d points); dropping new points until the "
                           "background thread catches up", self.kind, self.config.max_buffered_points)

    # -- control -------------------------------------------------------------

    def stats(self) -> HandlerStats:
        """A snapshot of the counters."""
        with self.stats_lock:
            snapshot = dataclasses.replace(self._stats)
        if self._encoder is not None:
            counters = self._encoder.counters
            snapshot.points_invalid += counters.invalid_points
            snapshot.points_nonfinite += counters.nonfinite_points
            snapshot.events_invalid += counters.invalid_events
        return snapshot

    def _drained(self) -> bool:
        return not (self._points or self._events or self._pending or self._holding)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Sends everything buffered now; True if it was all delivered within ``timeout``."""
        if self._disabled:
            return False
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cycle_done:
            self._flush_requests += 1
            try:
                self._wake.set()
                while not self._drained():
                    if not self._thread.is_alive() or self._test is None:
                        return False
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cycle_done.wait(0.1 if remaining is None else min(remaining, 0.1))
                return True
            finally:
                self._flush_requests -= 1

    def close(self, timeout: Optional[float] = None) -> None:
        """Flushes for at most ``timeout`` seconds (default ``exit_flush_timeout_s``),
        stops the background thread, spills or counts what is left, and logs a summary."""
        if self._closed or self._disabled:
            return
        self._closed = True
        timeout = self.config.exit_flush_timeout_s if timeout is None else timeout
        self._stop_deadline = time.monotonic() + timeout
        self._wake.set()
        self._thread.join(timeout + 1.0)
        if self._thread.is_alive():
            logger.warning("trainguard: %s background thread did not stop within %.1fs", self.kind, timeout)
            with self.stats_lock:
                self._stats.points_unsent_at_exit += len(self._points)
                self._stats.events_unsent_at_exit += len(self._events)
        self._log_summary()

    def _close_at_exit(self) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        # The worker thread does not exist in a forked child, and sharing the
        # parent's connection or file is unsafe: the child's handler drops.
        self._disabled = True
        self._closed = True
        self._points.clear()
        self._events.clear()
        self._pending.clear()

    def _log_summary(self) -> None:
        s = self.stats()
        identity = f"test={self._test!r} run={self._run!r}"
        line = (f"trainguard: {self.kind} handler {identity}: delivered {s.points_delivered} points and "
                f"{s.events_delivered} events in {s.messages_delivered} messages ({s.bytes_delivered} bytes); "
                f"dropped {s.points_dropped} points (buffer full {s.points_dropped_buffer_full}, "
                f"invalid {s.points_invalid}, non-finite {s.points_nonfinite}, "
                f"undeliverable {s.points_undeliverable}, unsent at exit {s.points_unsent_at_exit}) "
                f"and {s.events_dropped} events")
        if self._spill is not None:
            line += (f"; spilled {s.messages_spilled} messages ({s.points_spilled} points, "
                     f"{s.events_spilled} events) to {self._spill.path}")
        lossy = s.points_dropped or s.events_dropped or s.messages_spilled
        logger.log(logging.WARNING if lossy else logging.INFO, line)

    # -- the background thread ---------------------------------------------------

    def _worker(self) -> None:
        try:
            while True:
                self._wake.clear()
                stopping = self._stop_deadline is not None
                self._cycle(force=stopping or self._flush_requests > 0)
                with self._cycle_done:
                    self._cycle_done.notify_all()
                if stopping and (self._drained() or self._test is None
                                 or time.monotonic() >= self._stop_deadline):
                    break
                wait = self._wait_time()
                if wait > 0:
                    self._wake.wait(wait)
        except BaseException:
            logger.exception("trainguard: %s background thread failed; further values are dropped", self.kind)
        finally:
            try:
                self._abandon()
            except Exception:
                logger.exception("trainguard: %s could not spill undelivered messages", self.kind)
            try:
                self._transport.close()
            except Exception:
                logger.exception("trainguard: %s transport did not close cleanly", self.kind)
            if self._spill is not None:
                self._spill.close()
            with self._cycle_done:
                self._cycle_done.notify_all()

    def _wait_time(self) -> float:
        now_mono = time.monotonic()
        latency = self.config.max_latency_ms / 1000.0
        if self._stop_deadline is not None:
            return min(max(self._retry_at - now_mono, 0.0), 0.05, max(self._stop_deadline - now_mono, 0.0))
        if self._flush_requests and not self._pending and self._test is not None:
            return 0.0 if (self._points or self._events) else 0.05
        wait = latency / 2
        if self._pending:
            wait = min(wait, max(self._retry_at - now_mono, 0.0))
        if self._points and self._test is not None:
            try:
                due = self._points[0][3] + latency - time.time()
            except (IndexError, TypeError):
                due = 0.0
            wait = min(wait, max(due, 0.0))
        return max(wait, 0.001)

    def _cycle(self, force: bool) -> None:
        if self._test is not None:
            self._encode_ready(force)
        while self._pending and time.monotonic() >= self._retry_at:
            if not self._send_some():
                break

    def _encode_ready(self, force: bool) -> None:
        if self._encoder is None:
            self._encoder = MessageEncoder(self._test, self._run, self.config.max_points_per_message,
                                           self.config.max_message_bytes, self._warn_once)
        points = self._points
        n = len(points)
        due = force or bool(self._events) or n >= self.config.max_points_per_message
        if n and not due:
            try:
                due = points[0][3] + self.config.max_latency_ms / 1000.0 <= time.time()
            except (IndexError, TypeError):
                due = True
        if not due or not (n or self._events):
            return
        self._holding = True
        try:
            popleft = points.popleft
            events = []
            while self._events:
                events.append(self._events.popleft())
            chunk = self.config.max_points_per_message
            for start in range(0, max(n, 1), chunk):  # a backlog is handled a message at a time
                if start:
                    _yield_gil()
                batch = [popleft() for _ in range(min(chunk, n - start))]
                last = start + chunk >= n
                for message in self._encoder.encode(batch, events if last else (), pause=_yield_gil):
                    self._enqueue(message)
        finally:
            self._holding = False

    def _enqueue(self, message: EncodedMessage) -> None:
        limit = self.config.max_pending_bytes
        while self._pending and self._pending_bytes + len(message.payload) > limit:
            self._give_up(self._pending.popleft(), "pending")
        self._pending.append(_Pending(message))
        self._pending_bytes += len(message.payload)

    def _send_some(self) -> bool:
        """Sends the oldest pending messages once; False if any failed."""
        batch: List[_Pending] = []
        size = 0
        for item in self._pending:
            if batch and (size + len(item.message.payload) > self._send_limit
                          or len(batch) >= MAX_MESSAGES_PER_SEND):
                break
            batch.append(item)
            size += len(item.message.payload)
        now = time.monotonic()
        for item in batch:
            if item.first_attempt is None:
                item.first_attempt = now
        timeout = self.config.send_timeout_s
        if self._stop_deadline is not None:
            timeout = max(min(timeout, self._stop_deadline - now), 0.05)
        try:
            results = self._transport.send([item.message for item in batch], timeout)
        except Exception as e:  # noqa: BLE001 - a transport bug must not kill the thread
            results = [e] * len(batch)
        failure: Optional[BaseException] = None
        delivered = set()
        for item, result in zip(batch, results):
            if result is None:
                delivered.add(id(item))
                with self.stats_lock:
                    self._stats.messages_delivered += 1
                    self._stats.points_delivered += item.message.points
                    self._stats.events_delivered += item.message.events
                    self._stats.bytes_delivered += len(item.message.payload)
            else:
                failure = result
        kept: Deque[_Pending] = collections.deque()
        for item in self._pending:
            if id(item) in delivered:
                self._pending_bytes -= len(item.message.payload)
            else:
                kept.append(item)
        self._pending = kept
        if failure is None:
            self._send_limit = min(self._send_limit * 2, self.config.max_send_bytes)
            if self._consecutive_failures:
                logger.info("trainguard: %s delivering again after %d failed attempts",
                            self.kind, self._consecutive_failures)
            self._consecutive_failures = 0
            return True
        if len(batch) > 1:
            self._send_limit = max(self._send_limit // 2, 1)
        self._on_failure(failure)
        return False

    def _on_failure(self, error: BaseException) -> None:
        self._consecutive_failures += 1
        with self.stats_lock:
            self._stats.send_failures += 1
        backoff = min(self.config.retry_initial_backoff_s * 2 ** (self._consecutive_failures - 1),
                      self.config.retry_max_backoff_s)
        now = time.monotonic()
        self._retry_at = now + backoff * random.uniform(0.5, 1.0)
        if self._consecutive_failures == 1 or now - self._last_failure_log > 60:
            self._last_failure_log = now
            logger.warning("trainguard: %s send failed (%d in a row), retrying in %.1fs: %s: %s",
                           self.kind, self._consecutive_failures, backoff,
                           type(error).__name__, str(error)[:300])
        deadline = self.config.retry_deadline_s
        while self._pending and self._pending[0].first_attempt is not None \
                and now - self._pending[0].first_attempt >= deadline:
            item = self._pending.popleft()
            self._pending_bytes -= len(item.message.payload)
            self._give_up(item, "undeliverable")

    def _give_up(self, item: _Pending, why: str) -> None:
        """Spills a message that will not be delivered, or counts it dropped."""
        if why == "pending":
            self._pending_bytes -= len(item.message.payload)
        message = item.message
        if self._spill is not None:
            try:
                self._spill.write([message.payload])
                with self.stats_lock:
                    self._stats.messages_spilled += 1
                    self._stats.points_spilled += message.points
                    self._stats.events_spilled += message.events
                return
            except OSError as e:
                self._warn_once(f"cannot spill to {self._spill.path}: {e}")
        with self.stats_lock:
            if why == "exit":
                self._stats.points_unsent_at_exit += message.points
                self._stats.events_unsent_at_exit += message.events
            else:
                self._stats.points_undeliverable += message.points
                self._stats.events_undeliverable += message.events

    def _abandon(self) -> None:
        """At stop: encode what is still buffered, spill or count all undelivered."""
        if self._disabled:
            return
        if self._test is not None and (self._points or self._events):
            self._encode_ready(force=True)
        while self._pending:
            item = self._pending.popleft()
            self._pending_bytes -= len(item.message.payload)
            self._give_up(item, "exit")
        if self._points or self._events:
            if self._test is None:
                self._warn_once("no test/run was ever set (give them to the handler or use trainguard.Run); "
                                "buffered values are dropped")
            with self.stats_lock:
                self._stats.points_unsent_at_exit += len(self._points)
                self._stats.events_unsent_at_exit += len(self._events)
            self._points.clear()
            self._events.clear()

    def _warn_once(self, message: str) -> None:
        if message not in self._warned and len(self._warned) < 1000:
            self._warned.add(message)
            logger.warning("trainguard: %s", message)


class JsonlMetricHandler(WireHandler):
    """Writes wire messages to a JSONL file (one message per line), for offline replay."""

    kind = "jsonl"

    def __init__(self, path: str, test: Optional[str] = None, run: Optional[str] = None,
                 config: Optional[PublisherConfig] = None):
        self.path = os.fspath(path)
        super().__init__(JsonlTransport(self.path), test, run, config)
