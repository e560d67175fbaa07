"""Wire handlers: buffer metric values, send wire messages from a background thread.

``WireHandler`` holds everything shared by the Pub/Sub and JSONL handlers;
subclasses only supply a transport (something with ``send`` and ``close``).

The training thread's cost is one call extending a list by a point's four
entries (no lock, no encoding, no I/O); see ``WireHandler.stream_adder``. A daemon thread
batches, encodes and sends (at high rates several messages per send, see
``PublisherConfig.linger_ms``). Memory is bounded twice: ``max_buffered_points``
values waiting to be encoded (newer values are dropped and counted when it is
full) and ``max_pending_bytes`` of encoded messages waiting to be delivered
(the oldest are spilled to a JSONL file, if configured, or dropped and
counted). Failed sends are retried with exponential backoff until
``retry_deadline_s``. At interpreter exit the handler flushes for at most
``exit_flush_timeout_s``, shared with ``Run``'s flush and every other handler
(``lifecycle.exit_deadline``), and logs one line with what was delivered,
dropped and spilled. The counts are exact on every way out: each value
logged is delivered, dropped or spilled, including the batch in flight when
a stuck send outlives the wait (see ``WireHandler.close``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any, Dict, Optional

from . import distributed, lifecycle, wire
from .encoding import MessageEncoder
from .intake import Intake
from .metrics.api import MetricData, MetricHandler
from .outbox import Outbox, RetryPolicy
from .transports import JsonlTransport, JsonlWriter, Transport

logger = logging.getLogger("trainguard")

ENV_TEST = "TRAINGUARD_TEST"
ENV_RUN = "TRAINGUARD_RUN"
GIL_YIELD_S = 0.00002  # see _yield_gil
MIN_WAIT_S = 0.001  # the background thread never spins: it sleeps at least this long between cycles
POLL_S = 0.05  # while stopping or flushing, how often the background thread looks again
FLUSH_WAIT_SLICE_S = 0.1  # flush() wakes this often to see whether the thread died
JOIN_GRACE_S = 1.0  # close() waits this long past its timeout for a thread that is winding down, not sending
MAX_DISTINCT_WARNINGS = 1000  # warnings are logged once each; this bounds the memory of which were


def _yield_gil() -> None:
    """Lets a training thread waiting for the GIL have it now.

    The background thread calls this between slices of a few hundred points:
    without it, a thread waiting for the GIL only gets it when the holder
    blocks or after the 5 ms switch interval, which would stall training.
    (``sleep(0)`` releases the GIL but often takes it straight back.)
    """
    time.sleep(GIL_YIELD_S)


@dataclasses.dataclass
class PublisherConfig:
    """Batching, memory and retry settings of a wire handler."""
    max_points_per_message: int = 1000
    """Messages are made once ``messages_per_wake`` times this many points are buffered (and sent within
    ``linger_ms``)..."""
    max_latency_ms: float = 1000.0
    """...or once the oldest buffered point is this old."""
    linger_ms: float = 100.0
    """A full message waits this long (never past its oldest point's ``max_latency_ms``) for more to share its
    Publish request, up to ``outbox.MESSAGES_PER_SEND`` (10) messages' worth of points: at 100,000 points/s,
    10 messages a request, a tenth of the requests and of their CPU. 0 sends each full message at once."""
    messages_per_wake: int = 4
    """The background thread is woken once this many full messages' worth of points are buffered (at most half
    of ``max_buffered_points``; one with ``linger_ms=0``), and encodes them back to back; ``max_latency_ms`` and
    events still wake it for fewer. Encoding just after a wake-up costs about twice what it costs warm: at
    100,000 points/s, 4 messages a wake took 0.41-0.47 us of the background thread's CPU a point against
    0.51-0.63 at 1 (README, Benchmarks). 1 encodes each message as soon as it is full. The training thread's
    buffer is allocated by the wake: 400 KB at 4 messages of 1,000 points, 100 KB at 1."""
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
    schema: str = wire.SCHEMA_V1_1
    """The wire contract's version to send: v1.1 carries points as columns (about 17 bytes a point instead of
    about 70, and a fifth of the CPU to encode); ``wire.SCHEMA`` (``"trainguard/v1"``) sends v1 point objects,
    for a pipeline older than v1.1 (which dead-letters v1.1 messages)."""

    def points_per_wake(self) -> int:
        """Buffered points that wake the background thread: ``messages_per_wake`` full messages, at most half of
        ``max_buffered_points`` (a buffer that fills before its wake would drop points until the latency timer),
        and never fewer than a message; one message with ``linger_ms=0`` (nothing held back)."""
        message = self.max_points_per_message
        if self.linger_ms == 0:
            return message
        return max(message, min(message * self.messages_per_wake, self.max_buffered_points // 2))

    def validate(self) -> None:
        if not 1 <= self.max_points_per_message <= wire.MAX_POINTS_PER_MESSAGE:
            raise ValueError(f"max_points_per_message must be 1..{wire.MAX_POINTS_PER_MESSAGE}")
        if not 4096 <= self.max_message_bytes <= wire.MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be 4096..{wire.MAX_MESSAGE_BYTES}")
        if self.schema not in wire.SCHEMAS:
            raise ValueError(f"schema must be one of {list(wire.SCHEMAS)}, got {self.schema!r}")
        for name in ("max_latency_ms", "max_buffered_points", "max_buffered_events", "max_pending_bytes",
                     "send_timeout_s", "retry_initial_backoff_s", "retry_max_backoff_s",
                     "retry_deadline_s", "exit_flush_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not (type(self.messages_per_wake) is int and self.messages_per_wake >= 1):
            raise ValueError(f"messages_per_wake must be an integer of 1 or more, got {self.messages_per_wake!r}")
        if not self.linger_ms >= 0:
            raise ValueError(f"linger_ms must be 0 or more, got {self.linger_ms!r}")


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


class WireHandler(MetricHandler):
    """Base of handlers that publish wire-contract messages (see module doc).

    Three parts, each with one job: the :class:`~trainguard.intake.Intake`
    (the training thread's buffers), the encoder, and the
    :class:`~trainguard.outbox.Outbox` (delivery). This class owns the
    background thread that moves values from the first to the last, and the
    handler's lifecycle: bind, flush, close, fork.

    ``test`` and ``run`` name the messages' run; when not given they come from
    ``$TRAINGUARD_TEST``/``$TRAINGUARD_RUN`` or from the first ``Run`` that
    uses this handler. Values logged before the handler knows its run wait in
    the buffer.

    ``rank`` and ``world_size`` name the worker of a distributed job; when
    not given they come from ``$RANK``/``$WORLD_SIZE`` (torchrun,
    torchelastic; see ``trainguard.distributed``) or, for a handler that has
    neither them nor its run yet, from the first ``Run``. Every message
    carries them when known. They are fixed per handler, so the encoder
    writes them once into its message envelope: logging costs nothing more.
    """

    kind = "wire"

    def __init__(self, transport: Transport, test: Optional[str] = None, run: Optional[str] = None,
                 config: Optional[PublisherConfig] = None, *, rank: Optional[int] = None,
                 world_size: Optional[int] = None):
        self.config = config or PublisherConfig()
        self.config.validate()
        self._test: Optional[str] = None
        self._run: Optional[str] = None
        self._rank = distributed.resolve(rank, world_size)  # explicit, else $RANK/$WORLD_SIZE, read once
        test = test or os.environ.get(ENV_TEST) or None
        run = run or os.environ.get(ENV_RUN) or None
        if (test is None) != (run is None):
            raise ValueError("give both test and run, or neither")
        self._wake = threading.Event()
        # Held while values move between intake, encoder and outbox (never while sending), so that
        # close() can take over the accounting from a thread that does not stop (see _seal).
        self._handover = threading.RLock()
        if test is not None and run is not None:
            self.bind(test, run)
        config = self.config
        self._latency_s = config.max_latency_ms / 1000.0
        self._linger_s = min(config.linger_ms, config.max_latency_ms) / 1000.0
        self.intake = Intake(config.max_buffered_points, config.max_buffered_events, config.points_per_wake(),
                             self._wake.set, self.kind)
        spill = JsonlWriter(config.spill_path, config.max_spill_bytes) if config.spill_path else None
        self.outbox = Outbox(transport, RetryPolicy(
            max_pending_bytes=config.max_pending_bytes, max_send_bytes=config.max_send_bytes,
            send_timeout_s=config.send_timeout_s, initial_backoff_s=config.retry_initial_backoff_s,
            max_backoff_s=config.retry_max_backoff_s, deadline_s=config.retry_deadline_s), spill, self.kind,
            self._warn_once, self._handover, config.max_points_per_message)
        self._encoder: Optional[MessageEncoder] = None
        self._encoding = False  # values taken from the intake and not in the outbox yet
        self._cycle_done = threading.Condition()
        self._flush_requests = 0
        self._stop_deadline: Optional[float] = None
        self._closed = False
        self._disabled = False
        self._warned: set = set()
        self._thread = threading.Thread(target=self._worker, name=f"trainguard-{self.kind}", daemon=True)
        self._thread.start()
        lifecycle.on_exit(self._close_at_exit, lifecycle.PRIORITY_HANDLERS)
        lifecycle.on_fork_child(self._after_fork_in_child)

    # -- identity ------------------------------------------------------------

    @property
    def test(self) -> Optional[str]:
        return self._test

    @property
    def run(self) -> Optional[str]:
        return self._run

    @property
    def rank(self) -> Optional[int]:
        return self._rank.rank

    @property
    def world_size(self) -> Optional[int]:
        return self._rank.world_size

    def bind(self, test: str, run: str, rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        """Sets the run this handler publishes for; it cannot change afterwards.

        A ``rank``/``world_size`` given here is taken when the handler is not
        bound yet and knows no rank of its own; one that contradicts the
        handler's known rank is refused, as another run is.
        """
        wire.check_name(test, "test")
        wire.check_name(run, "run")
        offered = distributed.check_rank(rank, world_size)
        if self._rank.known and offered.known and offered != self._rank:
            raise ValueError(f"handler already publishes for rank={self._rank.rank} "
                             f"world_size={self._rank.world_size}, not rank={offered.rank} "
                             f"world_size={offered.world_size}")
        if self._test is None:
            if not self._rank.known:
                self._rank = offered
            self._run = run
            self._test = test  # last: the background thread starts encoding once it sees a test
            self._wake.set()
        elif (self._test, self._run) != (test, run):
            raise ValueError(f"handler already publishes for test={self._test!r} run={self._run!r}, "
                             f"not test={test!r} run={run!r}")
        elif offered.known and not self._rank.known:
            self._warn_once(f"handler was created for test={test!r} run={run!r} without a rank; its messages "
                            f"go without rank={offered.rank} (give rank to the handler, or test and run to Run only)")

    # -- the training thread's side --------------------------------------------

    def stream_adder(self, group_name: str):
        """The fast ``add_value(metric_name, metric_value, step=None)`` for a stream (see ``Intake.adder``)."""
        return self.intake.adder(group_name, self.config.group_prefix)

    def emit(self, metric_data: MetricData) -> None:
        """torchelastic's handler interface (the slower path: a MetricData per value)."""
        try:
            tag = metric_data.name
            if self.config.group_prefix:
                tag = (metric_data.group_name, tag)
            self.intake.add_point(tag, metric_data.value, getattr(metric_data, "step", None), metric_data.timestamp)
        except Exception:  # noqa: BLE001 - never raise into training code
            self.intake.count_invalid()

    def add_point(self, tag: Any, value: Any, step: Optional[int], timestamp: float) -> None:
        """Buffers one point with an explicit time (seconds since the epoch)."""
        self.intake.add_point(tag, value, step, timestamp)

    def emit_event(self, event_type: str, data: Dict[str, Any], timestamp: float) -> None:
        """Buffers an event; events are sent at once, with the points buffered so far."""
        self.intake.add_event(event_type, data, timestamp)

    # -- control -------------------------------------------------------------

    def stats(self) -> HandlerStats:
        """A snapshot of the counters."""
        stats = HandlerStats()
        for part in (self.intake.counts(), self.outbox.counts()):
            for field in dataclasses.fields(part):
                setattr(stats, field.name, getattr(stats, field.name) + getattr(part, field.name))
        if self._encoder is not None:
            counters = self._encoder.counters
            stats.points_invalid += counters.invalid_points
            stats.points_nonfinite += counters.nonfinite_points
            stats.events_invalid += counters.invalid_events
        return stats

    def _drained(self) -> bool:
        return not (self.intake or self.outbox or self._encoding)

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
                    self._cycle_done.wait(FLUSH_WAIT_SLICE_S if remaining is None
                                          else min(remaining, FLUSH_WAIT_SLICE_S))
                return True
            finally:
                self._flush_requests -= 1

    def close(self, timeout: Optional[float] = None) -> None:
        """Flushes for at most ``timeout`` seconds (default ``exit_flush_timeout_s``),
        stops the background thread, spills or counts what is left, and logs a summary.

        A thread still winding down (encoding the last values, spilling) gets
        ``JOIN_GRACE_S`` more. One still waiting for a send (an endpoint that
        accepts and never answers) is left behind: everything it holds, the
        batch in flight included, is spilled or counted unsent at exit at once.
        Values logged after ``close`` count as unsent at exit too.
        """
        if self._closed or self._disabled:
            return
        self._closed = True
        timeout = self.config.exit_flush_timeout_s if timeout is None else max(timeout, 0.0)
        self.intake.closed = True
        self._stop_deadline = time.monotonic() + timeout
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive() and not self.outbox.sending:
            self._thread.join(JOIN_GRACE_S)
        if self._thread.is_alive():
            logger.warning("trainguard: %s background thread did not stop within %.1fs; what it holds counts "
                           "as unsent", self.kind, timeout)
            self._seal()
        self._log_summary()

    def _close_at_exit(self) -> None:
        """At interpreter exit: closes within what is left of the process's one exit deadline."""
        self.close(lifecycle.exit_deadline.remaining(self.config.exit_flush_timeout_s))

    def _seal(self) -> None:
        """Takes the accounting over from a background thread that did not stop:
        it cannot move a value once this holds the hand-over lock, and finds
        the outbox sealed when it comes back."""
        with self._handover:
            self.outbox.seal()

    def _after_fork_in_child(self) -> None:
        # The worker thread does not exist in a forked child, and sharing the
        # parent's connection or file is unsafe: the child's handler drops.
        self._disabled = True
        self._closed = True
        self.intake.muted = True
        self.intake.drop_all(count=False)
        self._handover = threading.RLock()  # the parent's thread may have held it at the fork
        self.outbox.forget_after_fork(self._handover)

    def _log_summary(self) -> None:
        s = self.stats()
        identity = f"test={self._test!r} run={self._run!r}"
        if self._rank.known:
            identity += f" rank={self._rank.rank}"
        line = (f"trainguard: {self.kind} handler {identity}: delivered {s.points_delivered} points and "
                f"{s.events_delivered} events in {s.messages_delivered} messages ({s.bytes_delivered} bytes); "
                f"dropped {s.points_dropped} points (buffer full {s.points_dropped_buffer_full}, "
                f"invalid {s.points_invalid}, non-finite {s.points_nonfinite}, "
                f"undeliverable {s.points_undeliverable}, unsent at exit {s.points_unsent_at_exit}) "
                f"and {s.events_dropped} events")
        if self.outbox.spill_path is not None:
            line += (f"; spilled {s.messages_spilled} messages ({s.points_spilled} points, "
                     f"{s.events_spilled} events) to {self.outbox.spill_path}")
        lossy = s.points_dropped or s.events_dropped or s.messages_spilled
        logger.log(logging.WARNING if lossy else logging.INFO, line)

    # -- the background thread ---------------------------------------------------

    def _worker(self) -> None:
        try:
            # Connect now, before the first batch: creating a Pub/Sub client holds the GIL for
            # 12-18 ms, which would otherwise stall the training thread's next add_value.
            self.outbox.open()
            while True:
                self._wake.clear()
                deadline = self._stop_deadline
                self._cycle(force=deadline is not None or self._flush_requests > 0)
                with self._cycle_done:
                    self._cycle_done.notify_all()
                if self.outbox.sealed or (deadline is not None and (self._drained() or self._test is None
                                                                    or time.monotonic() >= deadline)):
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
            self.outbox.close()
            with self._cycle_done:
                self._cycle_done.notify_all()

    def _points_due_in(self) -> float:
        """Seconds until the oldest buffered point has waited ``max_latency_ms`` (0: now)."""
        oldest = self.intake.oldest_time()
        if oldest is None:
            return 0.0
        return oldest + self._latency_s - time.time()

    def _wait_time(self) -> float:
        now = time.monotonic()
        if self._stop_deadline is not None:
            return min(max(self.outbox.retry_at - now, 0.0), POLL_S, max(self._stop_deadline - now, 0.0))
        if self._flush_requests and not self.outbox and self._test is not None:
            return 0.0 if self.intake else POLL_S
        wait = self._latency_s / 2
        if self.outbox:
            wait = min(wait, max(self.outbox.retry_at - now, self.outbox.send_at - now, 0.0))
        if self.intake.point_count() and self._test is not None:
            wait = min(wait, max(self._points_due_in(), 0.0))
        return max(wait, MIN_WAIT_S)

    def _cycle(self, force: bool) -> None:
        if self._test is not None:
            self._encode_ready(force)
        self.outbox.send_due(self._stop_deadline, force)

    def _encode_ready(self, force: bool) -> None:
        """Moves what is due from the intake into the outbox: a full message, any event, or points past latency.

        A message goes out at once if it holds an event, or points past ``max_latency_ms``, or when forced;
        a full message may linger in the outbox (``linger_ms``, never past its oldest point's latency) for
        others to share its Publish request."""
        intake = self.intake
        n = intake.point_count()
        if not (n or intake.events):
            return
        due_in = self._points_due_in() if n else 0.0
        urgent = force or bool(intake.events) or due_in <= 0
        if not urgent:
            n -= n % self.config.max_points_per_message  # full messages only: the rest waits for more
            if not n:
                return
        send_by = time.monotonic() + (0.0 if urgent else min(self._linger_s, due_in))
        if self._encoder is None:
            assert self._test is not None and self._run is not None  # bound before anything is taken in
            self._encoder = MessageEncoder(self._test, self._run, self.config.max_points_per_message,
                                           self.config.max_message_bytes, self._warn_once,
                                           self._rank.rank, self._rank.world_size, self.config.schema)
        self._encoding = True
        try:
            chunk = self.config.max_points_per_message
            for start in range(0, max(n, 1), chunk):  # a backlog is handled a message at a time
                if start:
                    _yield_gil()
                last = start + chunk >= n
                with self._handover:  # values leave the intake and enter the outbox as one step
                    if self.outbox.sealed:
                        return
                    # Events travel with the last points, taken first: every point logged before them is in
                    # the intake by then and goes with them (those logged while this encoded included), so
                    # none is left behind a send that may hang.
                    events = intake.take_events() if last else ()
                    batch = intake.take_points(intake.point_count() if events else min(chunk, n - start))
                    floats = intake.all_floats  # (read after the take: true of every point taken)
                    for message in self._encoder.encode_flat(batch, events, pause=_yield_gil, floats=floats):
                        self.outbox.add(message, 0.0 if events else send_by)
        finally:
            self._encoding = False

    def _abandon(self) -> None:
        """At stop: encode what is still buffered, spill or count all undelivered."""
        if self._disabled or self.outbox.sealed:  # sealed: close() has counted everything
            return
        if self._test is not None and self.intake:
            self._encode_ready(force=True)
        self.outbox.give_up_all()
        if self.intake:
            if self._test is None:
                self._warn_once("no test/run was ever set (give them to the handler or use trainguard.Run); "
                                "buffered values are dropped")
            self.intake.drop_all(count=True)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned and len(self._warned) < MAX_DISTINCT_WARNINGS:
            self._warned.add(message)
            logger.warning("trainguard: %s", message)


class JsonlMetricHandler(WireHandler):
    """Writes wire messages to a JSONL file (one message per line), for offline replay."""

    kind = "jsonl"

    def __init__(self, path: str, test: Optional[str] = None, run: Optional[str] = None,
                 config: Optional[PublisherConfig] = None, *, rank: Optional[int] = None,
                 world_size: Optional[int] = None):
        self.path = os.fspath(path)
        super().__init__(JsonlTransport(self.path), test, run, config, rank=rank, world_size=world_size)
