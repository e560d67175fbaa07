"""The outbox: encoded messages waiting for delivery, sent in batches, retried, given up on.

It is the one owner of the pending queue and of its size in bytes: messages
enter through :meth:`Outbox.add` and leave through a delivery or through
:meth:`Outbox._give_up`, which spills them to a JSONL file (when configured) or
counts them dropped, with the reason why. The handler's background thread
calls it; its counters are read from other threads. Everything that moves a
message happens under ``lock`` (the handler's), never the send itself: a
closing handler whose thread is stuck in a send can :meth:`Outbox.seal` it,
giving up everything pending, the batch in flight included, so that every
point is counted exactly once (the stuck thread finds it sealed and counts
nothing more).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import random
import threading
import time
from typing import Any, Deque, List, Optional

from .encoding import EncodedMessage
from .transports import JsonlWriter, Transport

logger = logging.getLogger("trainguard")

MAX_MESSAGES_PER_SEND = 1000  # Pub/Sub's limit of messages per Publish request
MESSAGES_PER_SEND = 10  # lingering messages go out once this many full messages' worth of points is pending
MIN_SEND_TIMEOUT_S = 0.05  # while stopping, a send still gets this long even past the stop deadline
BACKOFF_JITTER = (0.5, 1.0)  # each backoff is stretched by a random factor in this range (no thundering herd)
FAILURE_LOG_INTERVAL_S = 60.0  # a failing transport logs at most one line per interval after the first


class GiveUp(enum.Enum):
    """Why a message leaves the outbox undelivered."""
    OVERFLOW = "overflow"            # the outbox was full (max_pending_bytes): the oldest goes first
    UNDELIVERABLE = "undeliverable"  # still failing retry_deadline_s after its first attempt
    EXIT = "exit"                    # still pending when the handler stopped


@dataclasses.dataclass
class OutboxCounts:
    """What the outbox delivered, spilled and dropped, in points, events and messages."""
    points_delivered: int = 0
    events_delivered: int = 0
    messages_delivered: int = 0
    bytes_delivered: int = 0
    send_failures: int = 0
    points_undeliverable: int = 0
    events_undeliverable: int = 0
    points_unsent_at_exit: int = 0
    events_unsent_at_exit: int = 0
    points_spilled: int = 0
    events_spilled: int = 0
    messages_spilled: int = 0


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Limits of the outbox (from ``PublisherConfig``)."""
    max_pending_bytes: int
    max_send_bytes: int
    send_timeout_s: float
    initial_backoff_s: float
    max_backoff_s: float
    deadline_s: float


@dataclasses.dataclass
class _Pending:
    message: EncodedMessage
    first_attempt: Optional[float] = None  # time.monotonic() of the first send that carried it


class Outbox:
    """Pending messages, delivered oldest first through ``transport``.

    A send carries at most ``max_send_bytes`` and 1000 messages. After a failed
    send of several messages the limit halves (down to one message) and grows
    back on success, so a server refusing large requests still gets everything.

    A message may linger: it is queued with the time it must be sent by, and
    waits until then for others to share its request, unless the pending
    messages hold ``MESSAGES_PER_SEND`` times ``points_per_message`` points, or
    a request's bytes, already (then everything pending goes).
    """

    def __init__(self, transport: Transport, policy: RetryPolicy, spill: Optional[JsonlWriter], kind: str,
                 warn_once, lock: Any = None, points_per_message: int = 1000):
        self._transport = transport
        self._policy = policy
        self._spill = spill
        self._kind = kind
        self._warn_once = warn_once
        self._pending: Deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._send_limit = policy.max_send_bytes
        self._consecutive_failures = 0
        self._last_failure_log = 0.0
        self.retry_at = 0.0  # time.monotonic() before which no send is tried
        self.send_at = 0.0  # time.monotonic() when the earliest pending message must be sent (lingering)
        self._pending_points = 0
        self._points_per_send = max(points_per_message * MESSAGES_PER_SEND, 1)
        self._lock = lock if lock is not None else threading.RLock()
        self._counts = OutboxCounts()
        self.sending = False  # a send is in flight (the background thread is waiting for the transport)
        self.sealed = False  # given up by a closing thread: nothing more is queued, sent or counted

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def spill_path(self) -> Optional[str]:
        return None if self._spill is None else self._spill.path

    def counts(self) -> OutboxCounts:
        with self._lock:
            return dataclasses.replace(self._counts)

    def open(self) -> None:
        """Lets the transport connect before the first send (see ``Transport.open``); failures wait for it."""
        open_transport = getattr(self._transport, "open", None)
        if open_transport is None:
            return
        try:
            open_transport()
        except Exception as e:  # noqa: BLE001 - the first send tries again and reports it
            logger.debug("trainguard: %s transport did not open: %s", self._kind, e)

    def add(self, message: EncodedMessage, send_by: float = 0.0) -> None:
        """Queues a message to be sent by ``send_by`` (``time.monotonic()``; 0: at once); past
        ``max_pending_bytes`` the oldest are given up to make room."""
        size = len(message.payload)
        with self._lock:
            if self.sealed:  # too late to queue: it is lost, and counted so
                self._give_up(_Pending(message), GiveUp.EXIT)
                return
            while self._pending and self._pending_bytes + size > self._policy.max_pending_bytes:
                self._give_up(self._pop_oldest(), GiveUp.OVERFLOW)
            if not self._pending or send_by < self.send_at:
                self.send_at = send_by
            self._pending.append(_Pending(message))
            self._pending_bytes += size
            self._pending_points += message.points

    def send_due(self, stop_deadline: Optional[float], force: bool = False) -> None:
        """Sends batches while messages are pending and no backoff is running: at once when ``force``d (or
        stopping), else once the earliest pending message must go or a send's worth is pending."""
        while self._pending and time.monotonic() >= self.retry_at:
            if not (force or stop_deadline is not None or self._due()):
                break
            if not self._send_batch(stop_deadline):
                break

    def _due(self) -> bool:
        return (time.monotonic() >= self.send_at or self._pending_points >= self._points_per_send
                or self._pending_bytes >= self._send_limit)

    def give_up_all(self) -> None:
        """At stop: everything still pending is spilled or counted unsent."""
        with self._lock:
            while self._pending:
                self._give_up(self._pop_oldest(), GiveUp.EXIT)

    def seal(self) -> None:
        """Called by a closing thread when the background thread did not stop in
        time: everything pending, the batch in flight included, is spilled or
        counted unsent at exit now, and whatever the background thread does
        later (a late delivery, a failure) changes no count."""
        with self._lock:
            self.give_up_all()
            self.sealed = True

    def forget_after_fork(self, lock: Any) -> None:
        """In a forked child: forgets everything pending without counting it, and
        takes a fresh ``lock`` (the parent's thread may have held the old one at the fork)."""
        self._lock = lock
        self._pending = collections.deque()
        self._pending_bytes = 0
        self._pending_points = 0

    def close(self) -> None:
        try:
            self._transport.close()
        except Exception:
            logger.exception("trainguard: %s transport did not close cleanly", self._kind)
        if self._spill is not None:
            self._spill.close()

    # -- one send -----------------------------------------------------------------

    def _next_batch(self) -> List[_Pending]:
        batch: List[_Pending] = []
        size = 0
        for item in self._pending:
            if batch and (size + len(item.message.payload) > self._send_limit or len(batch) >= MAX_MESSAGES_PER_SEND):
                break
            batch.append(item)
            size += len(item.message.payload)
        return batch

    def _send_batch(self, stop_deadline: Optional[float]) -> bool:
        """Sends the oldest pending messages once; False if any failed (or the outbox was sealed)."""
        with self._lock:
            if self.sealed:
                return False
            batch = self._next_batch()
            now = time.monotonic()
            for item in batch:
                if item.first_attempt is None:
                    item.first_attempt = now
            self.sending = True
        timeout = self._policy.send_timeout_s
        if stop_deadline is not None:
            timeout = max(min(timeout, stop_deadline - now), MIN_SEND_TIMEOUT_S)
        try:
            results = self._transport.send([item.message for item in batch], timeout)
        except Exception as e:  # noqa: BLE001 - a transport bug must not kill the thread
            results = [e] * len(batch)
        finally:
            self.sending = False
        with self._lock:
            if self.sealed:  # the closing thread has counted this batch already
                return False
            delivered = {id(item) for item, result in zip(batch, results) if result is None}
            failure = next((result for result in results if result is not None), None)
            self._remove_delivered(delivered)
            if failure is None:
                self._on_success()
                return True
            if len(batch) > 1:
                self._send_limit = max(self._send_limit // 2, 1)
            self._on_failure(failure)
            return False

    def _remove_delivered(self, delivered: set) -> None:
        kept: Deque[_Pending] = collections.deque()
        with self._lock:
            for item in self._pending:
                if id(item) not in delivered:
                    kept.append(item)
                    continue
                message = item.message
                self._pending_bytes -= len(message.payload)
                self._pending_points -= message.points
                self._counts.messages_delivered += 1
                self._counts.points_delivered += message.points
                self._counts.events_delivered += message.events
                self._counts.bytes_delivered += len(message.payload)
        self._pending = kept

    def _on_success(self) -> None:
        self._send_limit = min(self._send_limit * 2, self._policy.max_send_bytes)
        if self._consecutive_failures:
            logger.info("trainguard: %s delivering again after %d failed attempts",
                        self._kind, self._consecutive_failures)
        self._consecutive_failures = 0

    def _on_failure(self, error: BaseException) -> None:
        self._consecutive_failures += 1
        with self._lock:
            self._counts.send_failures += 1
        backoff = min(self._policy.initial_backoff_s * 2 ** (self._consecutive_failures - 1),
                      self._policy.max_backoff_s)
        now = time.monotonic()
        self.retry_at = now + backoff * random.uniform(*BACKOFF_JITTER)
        if self._consecutive_failures == 1 or now - self._last_failure_log > FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            logger.warning("trainguard: %s send failed (%d in a row), retrying in %.1fs: %s: %s",
                           self._kind, self._consecutive_failures, backoff, type(error).__name__, str(error)[:300])
        while self._pending and self._pending[0].first_attempt is not None \
                and now - self._pending[0].first_attempt >= self._policy.deadline_s:
            self._give_up(self._pop_oldest(), GiveUp.UNDELIVERABLE)

    # -- leaving undelivered -------------------------------------------------------

    def _pop_oldest(self) -> _Pending:
        item = self._pending.popleft()
        self._pending_bytes -= len(item.message.payload)
        self._pending_points -= item.message.points
        return item

    def _give_up(self, item: _Pending, why: GiveUp) -> None:
        """Spills a message that will not be delivered, or counts it dropped."""
        message = item.message
        if self._spill is not None:
            try:
                self._spill.write([message.payload])
            except OSError as e:
                self._warn_once(f"cannot spill to {self._spill.path}: {e}")
            else:
                with self._lock:
                    self._counts.messages_spilled += 1
                    self._counts.points_spilled += message.points
                    self._counts.events_spilled += message.events
                return
        with self._lock:
            if why is GiveUp.EXIT:
                self._counts.points_unsent_at_exit += message.points
                self._counts.events_unsent_at_exit += message.events
            else:
                self._counts.points_undeliverable += message.points
                self._counts.events_undeliverable += message.events
