"""Where alerts come from: the Pub/Sub alerts subscription, or the local alerts JSONL file.

Both hand out :class:`Delivery` objects. The notifier calls ``ack()`` once the
alert is safe (in an accepted e-mail, or dead-lettered) and ``nack()`` to have
it delivered again (on shutdown, or when even the dead-letter sink failed).

* :class:`PubSubSource`: streaming pull with flow control; ``ack``/``nack``
  are the message's own. While the notifier holds a message (grouping wait,
  SendGrid down, budget), the client keeps extending its lease up to
  ``max_lease_seconds``; after that Pub/Sub redelivers it and the notifier
  attaches the copy to the alert it already holds.
* :class:`FileSource`: tails a JSONL file. Only complete lines are read. The
  offset in the state file advances over a line only when it and every line
  before it were acked, so a restart resumes exactly where nothing is lost
  (already mailed alerts on re-read lines are skipped by the sent-ids set).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import threading
from typing import Callable, Dict, List, Optional

from notifier.state import NotifierState

_LOGGER = logging.getLogger(__name__)


class SourceError(RuntimeError):
    """The source cannot deliver any more (e.g. the subscription does not exist)."""


@dataclasses.dataclass(eq=False)
class Delivery:
    """One received payload and how to settle it."""
    payload: bytes
    attributes: Dict[str, str]
    ack: Callable[[], None]
    nack: Callable[[], None]
    where: str = ""  # for log messages: "pubsub message 123", "alerts.jsonl:4096"


# --------------------------------------------------------------------------
# Local file
# --------------------------------------------------------------------------


def _line_payload(line: bytes) -> bytes:
    """The alert payload of a line: the line itself, or the ``alert`` of a dead-letter file record."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if isinstance(record, dict) and "alert_id" not in record and isinstance(record.get("alert"), dict):
        return json.dumps(record["alert"], sort_keys=True, separators=(",", ":")).encode("utf-8")
    return line


class _LineLedger:
    """Lines handed out and not yet acked, in file order; the committed offset is the end of the acked prefix."""

    def __init__(self, committed: int):
        self.committed = committed
        self._open: Dict[int, int] = {}  # start -> end, insertion = file order
        self._acked: set = set()

    def open(self, start: int, end: int) -> None:
        self._open[start] = end

    def ack(self, start: int) -> bool:
        """Mark a line done; True when the committed offset moved."""
        if start not in self._open:
            return False
        self._acked.add(start)
        moved = False
        while self._open:
            first = next(iter(self._open))
            if first not in self._acked:
                break
            self.committed = self._open.pop(first)
            self._acked.discard(first)
            moved = True
        return moved


class FileSource:
    """Tails ``path`` (the pipeline's ``--alerts_file``) from the offset saved in ``state``."""

    def __init__(self, path: str, state: NotifierState, chunk_bytes: int = 1 << 20):
        self.path = path
        self.state = state
        self.chunk_bytes = chunk_bytes
        self._ledger = _LineLedger(state.file_offset(path))
        self._read_to = self._ledger.committed
        self._retry: List[Delivery] = []
        self._wake = threading.Event()

    def describe(self) -> str:
        return f"file {self.path} (from byte {self._ledger.committed})"

    def _settle(self, ledger: _LineLedger, start: int) -> None:
        if ledger is self._ledger and ledger.ack(start):
            self.state.set_file_offset(self.path, ledger.committed)

    def _delivery(self, line: bytes, start: int, end: int) -> Delivery:
        ledger = self._ledger
        ledger.open(start, end)
        delivery = Delivery(_line_payload(line), {}, lambda: self._settle(ledger, start), lambda: None,
                            f"{self.path}:{start}")
        delivery.nack = lambda: self._retry.append(delivery)
        return delivery

    def _restart_if_truncated(self) -> None:
        size = os.path.getsize(self.path)
        if size < self._read_to:
            _LOGGER.warning("%s shrank below byte %d: reading it again from the start "
                            "(alerts already mailed are skipped)", self.path, self._read_to)
            self._ledger = _LineLedger(0)
            self._read_to = 0
            self.state.set_file_offset(self.path, 0)

    def _complete_lines(self) -> bytes:
        """The bytes after the last line read, up to the last newline (a partial last line waits)."""
        chunks = []
        with open(self.path, "rb") as f:
            f.seek(self._read_to)
            while True:
                chunk = f.read(self.chunk_bytes)
                chunks.append(chunk)
                if len(chunk) < self.chunk_bytes or b"\n" in chunk:
                    break
        data = b"".join(chunks)
        return data[: data.rfind(b"\n") + 1]

    def read_available(self) -> List[Delivery]:
        """Every complete line after the last one read (blank lines are settled at once)."""
        deliveries, self._retry = self._retry, []
        if not os.path.exists(self.path):
            return deliveries
        self._restart_if_truncated()
        complete = self._complete_lines()
        position = self._read_to
        for raw in complete.splitlines(keepends=True):
            start, position = position, position + len(raw)
            delivery = self._delivery(raw.strip(), start, position)
            if raw.strip():
                deliveries.append(delivery)
            else:
                delivery.ack()
        self._read_to = position
        return deliveries

    def poll(self, timeout: float) -> List[Delivery]:
        """New deliveries; waits up to ``timeout`` seconds (or until :meth:`wakeup`) when there are none."""
        deliveries = self.read_available()
        if not deliveries and timeout > 0:
            self._wake.wait(timeout)
            self._wake.clear()
        return deliveries

    def wakeup(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self.wakeup()


# --------------------------------------------------------------------------
# Pub/Sub
# --------------------------------------------------------------------------

_WAKEUP = object()
_NACK_BATCH = 1000


class PubSubSource:
    """Streaming pull from ``subscription`` (``projects/<p>/subscriptions/<s>``) with flow control.

    Acks go through the streaming pull's dispatcher. Nacks are sent as unary
    ``ModifyAckDeadline(0)`` calls, and at shutdown only after the stream is
    cancelled: a nack sent while the stream is open would hand the message
    straight back to this (closing) subscriber, which would then sit on it
    until its ack deadline ran out instead of letting another instance have it.
    """

    def __init__(self, subscription: str, max_messages: int = 1000, max_lease_seconds: float = 4 * 3600.0,
                 subscriber=None):
        from google.cloud import pubsub_v1  # imported only on this path

        self.subscription = subscription
        self._owns_subscriber = subscriber is None
        self._subscriber = subscriber or pubsub_v1.SubscriberClient()
        self._flow_control = pubsub_v1.types.FlowControl(max_messages=max_messages,
                                                         max_lease_duration=int(max_lease_seconds))
        self._queue: queue.Queue = queue.Queue()
        self._nacks: List[str] = []
        self._future = None

    def describe(self) -> str:
        return f"subscription {self.subscription}"

    def _on_message(self, message) -> None:
        self._queue.put(Delivery(message.data, dict(message.attributes), message.ack,
                                 lambda: self._nacks.append(message.ack_id), f"pubsub message {message.message_id}"))

    def start(self) -> PubSubSource:
        self._future = self._subscriber.subscribe(self.subscription, callback=self._on_message,
                                                  flow_control=self._flow_control)
        return self

    def _check_stream(self) -> None:
        """Raise the streaming pull's error if it ended for good (e.g. the subscription does not exist)."""
        if self._future is not None and self._future.done():
            error = self._future.exception()
            raise SourceError(f"the streaming pull of {self.subscription} ended: {error or 'cancelled'}")

    def _drain(self, timeout: float) -> List[Delivery]:
        items = []
        try:
            items.append(self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait())
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return [item for item in items if item is not _WAKEUP]

    def _send_nacks(self) -> None:
        """Release nacked messages for immediate redelivery (best effort: otherwise their deadline runs out)."""
        while self._nacks:
            batch, self._nacks = self._nacks[:_NACK_BATCH], self._nacks[_NACK_BATCH:]
            try:
                self._subscriber.modify_ack_deadline(
                    request={"subscription": self.subscription, "ack_ids": batch, "ack_deadline_seconds": 0})
            except Exception as e:  # noqa: BLE001 - e.g. expired ack ids: redelivery happens anyway
                _LOGGER.warning("could not nack %d message(s) (%s); Pub/Sub redelivers them when their ack "
                                "deadline runs out", len(batch), e)

    def poll(self, timeout: float) -> List[Delivery]:
        """Messages received so far; waits up to ``timeout`` seconds for the first one."""
        self._check_stream()
        self._send_nacks()
        return self._drain(timeout)

    def wakeup(self) -> None:
        self._queue.put(_WAKEUP)

    def close(self, timeout: Optional[float] = 30.0) -> None:
        """Stop pulling, then nack what was nacked or received and never handed out."""
        if self._future is not None:
            self._future.cancel()
            with contextlib.suppress(Exception):  # cancelled or already failed: either way it is over
                self._future.result(timeout=timeout)
            self._future = None
        for delivery in self._drain(0):
            delivery.nack()
        self._send_nacks()
        if self._owns_subscriber:
            self._subscriber.close()
