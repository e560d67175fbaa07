"""An in-process fake of Google Cloud Pub/Sub that speaks the real gRPC API.

:class:`PubSubServer` starts a gRPC server on ``127.0.0.1`` (free port) that
implements the ``google.pubsub.v1.Publisher`` and ``google.pubsub.v1.Subscriber``
services well enough for the *unmodified* ``google.cloud.pubsub_v1`` clients and
Beam's ``ReadFromPubSub`` / ``WriteToPubSub`` to run against it once
``PUBSUB_EMULATOR_HOST`` points at :attr:`PubSubServer.host`::

    with PubSubServer() as server:
        os.environ["PUBSUB_EMULATOR_HOST"] = server.host
        publisher = pubsub_v1.PublisherClient()
        ...

Semantics follow real Pub/Sub where tests can observe them:

* at-least-once delivery: a message that is not acked within its ack deadline
  is redelivered under a new ack id; ``ModifyAckDeadline(0)`` (nack) requeues
  it immediately;
* only messages published *after* a subscription exists reach it;
* dead-letter policies forward a message to the dead-letter topic once it has
  been delivered ``max_delivery_attempts`` times and is nacked or expires;
  ``delivery_attempt`` is only set when such a policy exists;
* NOT_FOUND / ALREADY_EXISTS / INVALID_ARGUMENT status codes, which the clients
  raise as ``google.api_core.exceptions.NotFound`` etc.;
* StreamingPull honours the client's ``max_outstanding_messages`` /
  ``max_outstanding_bytes``. When the server stops, open streams end with
  CANCELLED, a status the subscriber client treats as final: a forgotten
  ``subscribe()`` future fails with ``google.api_core.exceptions.Cancelled``
  and its threads exit, instead of reconnecting to a dead port forever (as
  UNAVAILABLE, the status of a real front end dropping a stream, would cause).

Deliberate deviations, to keep tests fast: ack deadlines and
``max_delivery_attempts`` below the production minimums (10 s / 5) are
accepted, and ``Pull`` without ``return_immediately`` waits at most
``pull_wait_seconds`` before returning an empty response. Not implemented
(the server answers UNIMPLEMENTED): snapshots, Seek, DetachSubscription,
schemas, push delivery, filters, exactly-once delivery, ordered delivery.

Fault injection (see the ``PubSubServer`` methods): :meth:`duplicate_next`,
:meth:`configure_faults` (duplicate probability, delivery delay, reordering,
seed) and :meth:`redeliver_all_unacked`. Random decisions come from one
``random.Random`` seeded by ``seed``, so a given sequence of deliveries is
reproducible.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import random
import re
import threading
import time
import types
from collections.abc import Iterator
from concurrent import futures
from typing import Any, Callable, NamedTuple

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as pubsub_types

_LOGGER = logging.getLogger(__name__)

DEFAULT_PROJECT = "test-project"
DEFAULT_ACK_DEADLINE_SECONDS = 10
MAX_ACK_DEADLINE_SECONDS = 600
DEFAULT_MAX_DELIVERY_ATTEMPTS = 5
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
DELETED_TOPIC = "_deleted-topic_"
"""What a subscription's ``topic`` becomes when its topic is deleted."""

_TICK_SECONDS = 0.05
"""How often waiting RPCs and the housekeeper re-check deadlines and delays."""

_MAX_STREAM_BATCH = 1000
"""Upper bound on messages in one StreamingPullResponse."""

_TOPIC_NAME = re.compile(r"^projects/[^/]+/topics/[^/]+$")
_SUBSCRIPTION_NAME = re.compile(r"^projects/[^/]+/subscriptions/[^/]+$")
_PROJECT_NAME = re.compile(r"^projects/[^/]+$")

_INSTANCE_IDS = itertools.count(1)

# Raw protobuf classes behind google.pubsub_v1's proto-plus wrappers. The server
# works on raw messages: they are mutable in place and (de)serialize fastest.
_PB = types.SimpleNamespace(
    Empty=empty_pb2.Empty,
    **{
        name: getattr(pubsub_types, name).pb()
        for name in (
            "AcknowledgeRequest",
            "DeleteSubscriptionRequest",
            "DeleteTopicRequest",
            "GetSubscriptionRequest",
            "GetTopicRequest",
            "ListSubscriptionsRequest",
            "ListSubscriptionsResponse",
            "ListTopicSubscriptionsRequest",
            "ListTopicSubscriptionsResponse",
            "ListTopicsRequest",
            "ListTopicsResponse",
            "ModifyAckDeadlineRequest",
            "PublishRequest",
            "PublishResponse",
            "PubsubMessage",
            "PullRequest",
            "PullResponse",
            "ReceivedMessage",
            "StreamingPullRequest",
            "StreamingPullResponse",
            "Subscription",
            "Topic",
            "UpdateSubscriptionRequest",
            "UpdateTopicRequest",
        )
    },
)


# --------------------------------------------------------------------------
# Errors and small helpers
# --------------------------------------------------------------------------


class _RpcError(Exception):
    """A failure to report to the client as a gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _invalid(details: str) -> _RpcError:
    return _RpcError(grpc.StatusCode.INVALID_ARGUMENT, details)


def _check_name(name: str, pattern: re.Pattern, kind: str) -> None:
    """Reject resource names that are not ``projects/P/<kind>s/ID``."""
    if not pattern.match(name):
        raise _invalid(f"Invalid {kind} name: {name!r}")


def _check_ack_deadline(seconds: int, *, allow_zero: bool = False) -> None:
    """Reject ack deadlines outside ``[1, 600]`` (``0`` only where it means nack)."""
    low = 0 if allow_zero else 1
    if not low <= seconds <= MAX_ACK_DEADLINE_SECONDS:
        raise _invalid(f"Invalid ack deadline: {seconds}s (must be {low}..{MAX_ACK_DEADLINE_SECONDS})")


def _copy(message):
    """A deep copy of a protobuf message."""
    clone = type(message)()
    clone.CopyFrom(message)
    return clone


def _apply_update(target, patch, update_mask) -> None:
    """Copy the fields named by ``update_mask`` from ``patch`` into ``target``."""
    if not update_mask.paths:
        raise _invalid("update_mask must name at least one field")
    if not update_mask.IsValidForDescriptor(target.DESCRIPTOR):
        raise _invalid(f"Invalid update_mask: {list(update_mask.paths)}")
    update_mask.MergeMessage(patch, target, replace_message_field=True, replace_repeated_field=True)


def _paginate(items: list, page_size: int, page_token: str) -> tuple[list, str]:
    """One page of ``items`` and the token of the next page ("" on the last)."""
    try:
        start = int(page_token) if page_token else 0
    except ValueError:
        raise _invalid(f"Invalid page token: {page_token!r}") from None
    end = start + page_size if page_size > 0 else len(items)
    return items[start:end], (str(end) if end < len(items) else "")


def _short_id(name: str) -> str:
    """``projects/p/topics/t`` -> ``t``."""
    return name.rsplit("/", 1)[-1]


def _project_id(name: str) -> str:
    """``projects/p/topics/t`` -> ``p``."""
    return name.split("/")[1]


# --------------------------------------------------------------------------
# Broker state
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SubscriptionStats:
    """A snapshot of one subscription's delivery counters.

    ``delivered`` counts every delivery (redeliveries and injected duplicates
    included); ``expired`` counts ack deadlines that ran out (including those
    forced by :meth:`PubSubServer.redeliver_all_unacked`); ``backlog`` is the
    number of message copies waiting to be delivered and ``outstanding`` the
    number delivered but not yet acked, nacked or expired.
    """

    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    expired: int = 0
    dead_lettered: int = 0
    backlog: int = 0
    outstanding: int = 0


@dataclasses.dataclass(eq=False)
class _Pending:
    """One copy of a message in a subscription: waiting, or leased to a client."""

    message: Any  # PubsubMessage pb, shared between subscriptions: never mutated
    attempts: int = 0  # deliveries of this copy so far
    ready_at: float = 0.0  # time.monotonic() from which it may be delivered
    is_duplicate: bool = False  # injected copy; never duplicated again

    @functools.cached_property
    def size(self) -> int:
        return self.message.ByteSize()


@dataclasses.dataclass(eq=False)
class _Lease:
    """A delivered, not yet acknowledged message copy."""

    entry: _Pending
    deadline: float  # time.monotonic() after which it is redelivered
    stream: _Stream | None = None  # StreamingPull call that received it


class _Stream:
    """Server-side state of one StreamingPull call.

    Counters are only touched under the broker lock; ``close()`` only sets an
    event, so gRPC may call it from any thread.
    """

    def __init__(self, subscription: str, request, message_ordering: bool) -> None:
        self.subscription = subscription
        self.ack_deadline = request.stream_ack_deadline_seconds
        self.max_messages = request.max_outstanding_messages
        self.max_bytes = request.max_outstanding_bytes
        self.message_ordering = message_ordering
        self.outstanding_messages = 0
        self.outstanding_bytes = 0
        self.error: _RpcError | None = None
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Stop delivering on this stream (client went away or stopped sending)."""
        self._closed.set()

    def fail(self, error: _RpcError) -> None:
        """End the stream with ``error`` as its status."""
        self.error = error
        self.close()

    def has_capacity(self) -> bool:
        """Whether the client's flow control allows one more message."""
        if self.max_messages > 0 and self.outstanding_messages >= self.max_messages:
            return False
        return not (self.max_bytes > 0 and self.outstanding_bytes >= self.max_bytes)

    def track(self, lease: _Lease, sign: int) -> None:
        """Count a lease in (+1) or out (-1) of this stream's outstanding totals."""
        self.outstanding_messages += sign
        self.outstanding_bytes += sign * lease.entry.size


class _TopicState:
    def __init__(self, config) -> None:
        self.config = config  # Topic pb
        self.subscriptions: set[str] = set()
        self.published: list = []  # PubsubMessage pbs, for inspection


class _SubscriptionState:
    def __init__(self, config) -> None:
        self.config = config  # Subscription pb
        self.backlog: collections.deque[_Pending] = collections.deque()
        self.leases: dict[str, _Lease] = {}
        self.counters: collections.Counter[str] = collections.Counter()

    @property
    def max_delivery_attempts(self) -> int | None:
        """The dead-letter threshold, or None without a dead-letter policy."""
        policy = self.config.dead_letter_policy
        return policy.max_delivery_attempts if policy.dead_letter_topic else None

    def stats(self) -> SubscriptionStats:
        return SubscriptionStats(**self.counters, backlog=len(self.backlog), outstanding=len(self.leases))


def _normalize_subscription(config) -> None:
    """Validate a Subscription pb and fill in the defaults the service applies."""
    if config.ack_deadline_seconds == 0:
        config.ack_deadline_seconds = DEFAULT_ACK_DEADLINE_SECONDS
    _check_ack_deadline(config.ack_deadline_seconds)
    if not config.HasField("message_retention_duration"):
        config.message_retention_duration.FromSeconds(DEFAULT_RETENTION_SECONDS)
    policy = config.dead_letter_policy
    if policy.dead_letter_topic:
        _check_name(policy.dead_letter_topic, _TOPIC_NAME, "dead-letter topic")
        if policy.max_delivery_attempts < 0:
            raise _invalid("max_delivery_attempts must not be negative")
        policy.max_delivery_attempts = policy.max_delivery_attempts or DEFAULT_MAX_DELIVERY_ATTEMPTS
    config.state = pubsub_types.Subscription.State.ACTIVE


@dataclasses.dataclass
class _Faults:
    """Currently injected faults (see PubSubServer.configure_faults)."""

    duplicate_probability: float = 0.0
    delivery_delay: float = 0.0
    reorder: bool = False
    duplicates_pending: int = 0  # set by duplicate_next()


class _Broker:
    """Topics, subscriptions and message delivery; independent of gRPC.

    Every method is thread-safe: all state is guarded by one condition
    variable, which is notified whenever a waiting Pull/StreamingPull may be
    able to make progress.
    """

    def __init__(self, seed: int) -> None:
        self._cond = threading.Condition()
        self._topics: dict[str, _TopicState] = {}
        self._subscriptions: dict[str, _SubscriptionState] = {}
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)
        self._faults = _Faults()
        self._rng = random.Random(seed)
        self._stopping = False

    # -- lookups --------------------------------------------------------

    def _topic(self, name: str) -> _TopicState:
        _check_name(name, _TOPIC_NAME, "topic")
        try:
            return self._topics[name]
        except KeyError:
            raise _RpcError(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={_short_id(name)}).") from None

    def _subscription(self, name: str) -> _SubscriptionState:
        _check_name(name, _SUBSCRIPTION_NAME, "subscription")
        try:
            return self._subscriptions[name]
        except KeyError:
            raise _RpcError(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={_short_id(name)}).") from None

    def _check_dead_letter_topic(self, config) -> None:
        dead_letter_topic = config.dead_letter_policy.dead_letter_topic
        if dead_letter_topic:
            self._topic(dead_letter_topic)

    # -- topics ---------------------------------------------------------

    def create_topic(self, topic):
        _check_name(topic.name, _TOPIC_NAME, "topic")
        with self._cond:
            if topic.name in self._topics:
                raise _RpcError(grpc.StatusCode.ALREADY_EXISTS, "Topic already exists")
            self._topics[topic.name] = _TopicState(_copy(topic))
            return _copy(topic)

    def get_topic(self, name: str):
        with self._cond:
            return _copy(self._topic(name).config)

    def update_topic(self, patch, update_mask):
        with self._cond:
            state = self._topic(patch.name)
            updated = _copy(state.config)
            _apply_update(updated, patch, update_mask)
            if updated.name != state.config.name:
                raise _invalid("A topic cannot be renamed")
            state.config = updated
            return _copy(updated)

    def delete_topic(self, name: str) -> None:
        with self._cond:
            state = self._topic(name)
            del self._topics[name]
            for subscription in state.subscriptions:
                self._subscriptions[subscription].config.topic = DELETED_TOPIC

    def list_topics(self, project: str) -> list:
        _check_name(project, _PROJECT_NAME, "project")
        with self._cond:
            return [_copy(self._topics[name].config) for name in sorted(self._topics) if name.startswith(project + "/")]

    def list_topic_subscriptions(self, topic: str) -> list[str]:
        with self._cond:
            return sorted(self._topic(topic).subscriptions)

    def publish(self, topic_name: str, messages) -> list[str]:
        """Store ``messages`` and queue them for every current subscription."""
        if not messages:
            raise _invalid("The request must contain at least one message")
        for message in messages:
            if not message.data and not message.attributes:
                raise _invalid("A message must have data or attributes")
        with self._cond:
            topic = self._topic(topic_name)
            message_ids = [self._append_message(topic, message) for message in messages]
            self._cond.notify_all()
            return message_ids

    def _append_message(self, topic: _TopicState, message) -> str:
        stored = _copy(message)
        stored.message_id = str(next(self._message_ids))
        stored.publish_time.GetCurrentTime()
        topic.published.append(stored)
        ready_at = time.monotonic() + self._faults.delivery_delay
        for subscription in topic.subscriptions:
            self._subscriptions[subscription].backlog.append(_Pending(stored, ready_at=ready_at))
        return stored.message_id

    # -- subscriptions --------------------------------------------------

    def create_subscription(self, subscription):
        _check_name(subscription.name, _SUBSCRIPTION_NAME, "subscription")
        config = _copy(subscription)
        _normalize_subscription(config)
        with self._cond:
            if config.name in self._subscriptions:
                raise _RpcError(grpc.StatusCode.ALREADY_EXISTS, "Subscription already exists")
            topic = self._topic(config.topic)
            self._check_dead_letter_topic(config)
            self._subscriptions[config.name] = _SubscriptionState(config)
            topic.subscriptions.add(config.name)
            return _copy(config)

    def get_subscription(self, name: str):
        with self._cond:
            return _copy(self._subscription(name).config)

    def update_subscription(self, patch, update_mask):
        with self._cond:
            state = self._subscription(patch.name)
            updated = _copy(state.config)
            _apply_update(updated, patch, update_mask)
            if (updated.name, updated.topic) != (state.config.name, state.config.topic):
                raise _invalid("A subscription's name and topic cannot be changed")
            _normalize_subscription(updated)
            self._check_dead_letter_topic(updated)
            state.config = updated
            return _copy(updated)

    def delete_subscription(self, name: str) -> None:
        with self._cond:
            state = self._subscription(name)
            del self._subscriptions[name]
            topic = self._topics.get(state.config.topic)
            if topic is not None:
                topic.subscriptions.discard(name)
            self._cond.notify_all()  # streams on it end with NOT_FOUND

    def list_subscriptions(self, project: str) -> list:
        _check_name(project, _PROJECT_NAME, "project")
        with self._cond:
            return [
                _copy(self._subscriptions[name].config)
                for name in sorted(self._subscriptions)
                if name.startswith(project + "/")
            ]

    # -- acknowledgement ------------------------------------------------

    def acknowledge(self, subscription: str, ack_ids) -> None:
        """Ack leased messages; unknown or expired ack ids are ignored."""
        with self._cond:
            state = self._subscription(subscription)
            for ack_id in ack_ids:
                if self._release(state, ack_id) is not None:
                    state.counters["acked"] += 1
            self._cond.notify_all()  # frees flow-control capacity

    def modify_ack_deadline(self, subscription: str, ack_ids, seconds: int) -> None:
        """Extend leases by ``seconds`` from now; ``0`` nacks (redeliver now)."""
        _check_ack_deadline(seconds, allow_zero=True)
        with self._cond:
            state = self._subscription(subscription)
            now = time.monotonic()
            if seconds == 0:
                self._requeue(state, ack_ids, now, "nacked")
                return
            for ack_id in ack_ids:
                lease = state.leases.get(ack_id)
                if lease is not None:
                    lease.deadline = now + seconds

    def _release(self, state: _SubscriptionState, ack_id: str) -> _Lease | None:
        """Remove a lease (if it still exists) and its flow-control accounting."""
        lease = state.leases.pop(ack_id, None)
        if lease is not None and lease.stream is not None:
            lease.stream.track(lease, -1)
        return lease

    def _requeue(self, state: _SubscriptionState, ack_ids, now: float, reason: str) -> int:
        """Take leases back for redelivery (or dead-lettering); count them under ``reason``."""
        requeued = 0
        for ack_id in ack_ids:
            lease = self._release(state, ack_id)
            if lease is None:
                continue
            state.counters[reason] += 1
            requeued += 1
            if not self._dead_letter_if_exhausted(state, lease.entry):
                lease.entry.ready_at = now + self._faults.delivery_delay
                state.backlog.appendleft(lease.entry)
        if requeued:
            self._cond.notify_all()
        return requeued

    def _dead_letter_if_exhausted(self, state: _SubscriptionState, entry: _Pending) -> bool:
        """Forward ``entry`` to the dead-letter topic if it used up its attempts."""
        max_attempts = state.max_delivery_attempts
        if max_attempts is None or entry.attempts < max_attempts:
            return False
        topic_name = state.config.dead_letter_policy.dead_letter_topic
        topic = self._topics.get(topic_name)
        if topic is None:
            _LOGGER.warning("Dead-letter topic %s does not exist; redelivering instead", topic_name)
            return False
        forwarded = _PB.PubsubMessage(
            data=entry.message.data,
            attributes=entry.message.attributes,
            ordering_key=entry.message.ordering_key,
        )
        subscription = state.config.name
        forwarded.attributes.update(
            {
                "CloudPubSubDeadLetterSourceDeliveryCount": str(entry.attempts),
                "CloudPubSubDeadLetterSourceSubscription": _short_id(subscription),
                "CloudPubSubDeadLetterSourceSubscriptionProject": _project_id(subscription),
                "CloudPubSubDeadLetterSourceTopicPublishTime": entry.message.publish_time.ToJsonString(),
            }
        )
        self._append_message(topic, forwarded)
        state.counters["dead_lettered"] += 1
        return True

    def expire_leases(self) -> None:
        """Requeue every lease whose ack deadline has passed."""
        with self._cond:
            now = time.monotonic()
            for state in list(self._subscriptions.values()):
                expired = [ack_id for ack_id, lease in state.leases.items() if lease.deadline <= now]
                self._requeue(state, expired, now, "expired")

    # -- delivery -------------------------------------------------------

    def pull(self, subscription: str, max_messages: int, wait_seconds: float, is_active: Callable[[], bool]) -> list:
        """Lease up to ``max_messages``, waiting up to ``wait_seconds`` for the first."""
        if max_messages <= 0:
            raise _invalid("max_messages must be positive")
        give_up_at = time.monotonic() + wait_seconds
        with self._cond:
            while True:
                state = self._subscription(subscription)
                batch = self._lease_ready(state, max_messages, state.config.ack_deadline_seconds)
                remaining = give_up_at - time.monotonic()
                if batch or remaining <= 0 or self._stopping or not is_active():
                    return batch
                self._cond.wait(min(remaining, _TICK_SECONDS))

    def open_stream(self, request) -> _Stream:
        """Start a StreamingPull from its first request."""
        if not request.subscription:
            raise _invalid("The first StreamingPullRequest must name a subscription")
        _check_ack_deadline(request.stream_ack_deadline_seconds)
        with self._cond:
            config = self._subscription(request.subscription).config
            stream = _Stream(request.subscription, request, config.enable_message_ordering)
            self.apply_stream_request(stream, request)
            return stream

    def apply_stream_request(self, stream: _Stream, request) -> None:
        """Apply the acks, modacks and deadline changes carried by a stream request."""
        ack_ids, seconds = request.modify_deadline_ack_ids, request.modify_deadline_seconds
        if len(ack_ids) != len(seconds):
            raise _invalid("modify_deadline_ack_ids and modify_deadline_seconds differ in length")
        with self._cond:
            if request.stream_ack_deadline_seconds:
                _check_ack_deadline(request.stream_ack_deadline_seconds)
                stream.ack_deadline = request.stream_ack_deadline_seconds
            if request.ack_ids:
                self.acknowledge(stream.subscription, request.ack_ids)
            for ack_id, deadline in zip(ack_ids, seconds):
                self.modify_ack_deadline(stream.subscription, [ack_id], deadline)

    def next_stream_batch(self, stream: _Stream) -> list | None:
        """Block until messages can be sent on ``stream``; None once it is closed."""
        with self._cond:
            while True:
                if stream.error is not None:
                    raise stream.error
                if stream.closed:
                    return None
                if self._stopping:
                    raise _RpcError(grpc.StatusCode.CANCELLED, "The Pub/Sub test server is shutting down")
                state = self._subscription(stream.subscription)
                batch = self._lease_ready(state, _MAX_STREAM_BATCH, stream.ack_deadline, stream)
                if batch:
                    return batch
                self._cond.wait(_TICK_SECONDS)

    def _lease_ready(
        self, state: _SubscriptionState, limit: int, ack_deadline: int, stream: _Stream | None = None
    ) -> list:
        """Lease up to ``limit`` deliverable messages as ReceivedMessage pbs."""
        now = time.monotonic()
        batch = []
        while len(batch) < limit and (stream is None or stream.has_capacity()):
            entry = self._take_ready(state, now)
            if entry is None:
                break
            batch.append(self._deliver(state, entry, now + ack_deadline, stream))
        return batch

    def _take_ready(self, state: _SubscriptionState, now: float) -> _Pending | None:
        """Remove the next deliverable copy from the backlog (a random one when reordering)."""
        ready = (index for index, entry in enumerate(state.backlog) if entry.ready_at <= now)
        if self._faults.reorder:
            candidates = list(ready)
            index = self._rng.choice(candidates) if candidates else None
        else:
            index = next(ready, None)
        if index is None:
            return None
        entry = state.backlog[index]
        del state.backlog[index]
        return entry

    def _deliver(self, state: _SubscriptionState, entry: _Pending, deadline: float, stream: _Stream | None):
        """Lease ``entry`` under a fresh ack id, injecting a duplicate if due."""
        entry.attempts += 1
        ack_id = f"ack-{next(self._ack_ids)}"
        lease = _Lease(entry, deadline, stream)
        state.leases[ack_id] = lease
        if stream is not None:
            stream.track(lease, +1)
        state.counters["delivered"] += 1
        if not entry.is_duplicate and self._should_duplicate():
            copy = _Pending(entry.message, attempts=entry.attempts - 1, is_duplicate=True)
            state.backlog.appendleft(copy)
        received = _PB.ReceivedMessage(ack_id=ack_id, message=entry.message)
        if state.max_delivery_attempts is not None:
            received.delivery_attempt = entry.attempts
        return received

    def _should_duplicate(self) -> bool:
        if self._faults.duplicates_pending > 0:
            self._faults.duplicates_pending -= 1
            return True
        probability = self._faults.duplicate_probability
        return probability > 0 and self._rng.random() < probability

    # -- fault injection ------------------------------------------------

    def configure_faults(self, *, duplicate_probability=None, delivery_delay=None, reorder=None, seed=None) -> None:
        if duplicate_probability is not None and not 0.0 <= duplicate_probability <= 1.0:
            raise ValueError("duplicate_probability must be within [0, 1]")
        if delivery_delay is not None and delivery_delay < 0:
            raise ValueError("delivery_delay must not be negative")
        with self._cond:
            if duplicate_probability is not None:
                self._faults.duplicate_probability = duplicate_probability
            if delivery_delay is not None:
                self._faults.delivery_delay = delivery_delay
            if reorder is not None:
                self._faults.reorder = reorder
            if seed is not None:
                self._rng.seed(seed)

    def duplicate_next(self, count: int) -> None:
        if count < 0:
            raise ValueError("count must not be negative")
        with self._cond:
            self._faults.duplicates_pending += count

    def reset_faults(self) -> None:
        with self._cond:
            self._faults = _Faults()

    def redeliver_all_unacked(self, subscription: str | None) -> int:
        with self._cond:
            names = list(self._subscriptions) if subscription is None else [subscription]
            now = time.monotonic()
            return sum(
                self._requeue(self._subscriptions[name], list(self._subscriptions[name].leases), now, "expired")
                for name in names
            )

    # -- inspection -----------------------------------------------------

    def published_messages(self, topic: str) -> list:
        with self._cond:
            return [_copy(message) for message in self._topics[topic].published]

    def wait_for_published(self, topic: str, count: int, timeout: float) -> list:
        give_up_at = time.monotonic() + timeout
        with self._cond:
            while len(self._topics[topic].published) < count:
                remaining = give_up_at - time.monotonic()
                if remaining <= 0:
                    have = len(self._topics[topic].published)
                    raise TimeoutError(f"{topic}: {have} of {count} messages published after {timeout}s")
                self._cond.wait(remaining)
            return self.published_messages(topic)

    def subscription_stats(self, subscription: str) -> SubscriptionStats:
        with self._cond:
            return self._subscriptions[subscription].stats()

    def shutdown(self) -> None:
        """Make waiting and future Pulls return and StreamingPulls end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()


# --------------------------------------------------------------------------
# gRPC services
# --------------------------------------------------------------------------


class _Rpc(NamedTuple):
    request: type
    response: type
    streaming: bool = False


class _PublisherServicer:
    """``google.pubsub.v1.Publisher`` on top of a :class:`_Broker`."""

    SERVICE = "google.pubsub.v1.Publisher"
    RPCS = {
        "CreateTopic": _Rpc(_PB.Topic, _PB.Topic),
        "UpdateTopic": _Rpc(_PB.UpdateTopicRequest, _PB.Topic),
        "Publish": _Rpc(_PB.PublishRequest, _PB.PublishResponse),
        "GetTopic": _Rpc(_PB.GetTopicRequest, _PB.Topic),
        "ListTopics": _Rpc(_PB.ListTopicsRequest, _PB.ListTopicsResponse),
        "ListTopicSubscriptions": _Rpc(_PB.ListTopicSubscriptionsRequest, _PB.ListTopicSubscriptionsResponse),
        "DeleteTopic": _Rpc(_PB.DeleteTopicRequest, _PB.Empty),
    }

    def __init__(self, broker: _Broker) -> None:
        self._broker = broker

    def CreateTopic(self, request, context):  # noqa: N802 (gRPC method names)
        return self._broker.create_topic(request)

    def UpdateTopic(self, request, context):  # noqa: N802
        return self._broker.update_topic(request.topic, request.update_mask)

    def Publish(self, request, context):  # noqa: N802
        return _PB.PublishResponse(message_ids=self._broker.publish(request.topic, request.messages))

    def GetTopic(self, request, context):  # noqa: N802
        return self._broker.get_topic(request.topic)

    def ListTopics(self, request, context):  # noqa: N802
        topics = self._broker.list_topics(request.project)
        page, token = _paginate(topics, request.page_size, request.page_token)
        return _PB.ListTopicsResponse(topics=page, next_page_token=token)

    def ListTopicSubscriptions(self, request, context):  # noqa: N802
        names = self._broker.list_topic_subscriptions(request.topic)
        page, token = _paginate(names, request.page_size, request.page_token)
        return _PB.ListTopicSubscriptionsResponse(subscriptions=page, next_page_token=token)

    def DeleteTopic(self, request, context):  # noqa: N802
        self._broker.delete_topic(request.topic)
        return _PB.Empty()


class _SubscriberServicer:
    """``google.pubsub.v1.Subscriber`` on top of a :class:`_Broker`."""

    SERVICE = "google.pubsub.v1.Subscriber"
    RPCS = {
        "CreateSubscription": _Rpc(_PB.Subscription, _PB.Subscription),
        "GetSubscription": _Rpc(_PB.GetSubscriptionRequest, _PB.Subscription),
        "UpdateSubscription": _Rpc(_PB.UpdateSubscriptionRequest, _PB.Subscription),
        "ListSubscriptions": _Rpc(_PB.ListSubscriptionsRequest, _PB.ListSubscriptionsResponse),
        "DeleteSubscription": _Rpc(_PB.DeleteSubscriptionRequest, _PB.Empty),
        "ModifyAckDeadline": _Rpc(_PB.ModifyAckDeadlineRequest, _PB.Empty),
        "Acknowledge": _Rpc(_PB.AcknowledgeRequest, _PB.Empty),
        "Pull": _Rpc(_PB.PullRequest, _PB.PullResponse),
        "StreamingPull": _Rpc(_PB.StreamingPullRequest, _PB.StreamingPullResponse, streaming=True),
    }

    def __init__(self, broker: _Broker, readers: _StreamReaders, pull_wait_seconds: float) -> None:
        self._broker = broker
        self._readers = readers
        self._pull_wait_seconds = pull_wait_seconds

    def CreateSubscription(self, request, context):  # noqa: N802
        return self._broker.create_subscription(request)

    def GetSubscription(self, request, context):  # noqa: N802
        return self._broker.get_subscription(request.subscription)

    def UpdateSubscription(self, request, context):  # noqa: N802
        return self._broker.update_subscription(request.subscription, request.update_mask)

    def ListSubscriptions(self, request, context):  # noqa: N802
        subscriptions = self._broker.list_subscriptions(request.project)
        page, token = _paginate(subscriptions, request.page_size, request.page_token)
        return _PB.ListSubscriptionsResponse(subscriptions=page, next_page_token=token)

    def DeleteSubscription(self, request, context):  # noqa: N802
        self._broker.delete_subscription(request.subscription)
        return _PB.Empty()

    def ModifyAckDeadline(self, request, context):  # noqa: N802
        self._broker.modify_ack_deadline(request.subscription, request.ack_ids, request.ack_deadline_seconds)
        return _PB.Empty()

    def Acknowledge(self, request, context):  # noqa: N802
        self._broker.acknowledge(request.subscription, request.ack_ids)
        return _PB.Empty()

    def Pull(self, request, context):  # noqa: N802
        wait_seconds = 0.0 if request.return_immediately else self._pull_wait_seconds
        batch = self._broker.pull(request.subscription, request.max_messages, wait_seconds, context.is_active)
        return _PB.PullResponse(received_messages=batch)

    def StreamingPull(self, request_iterator, context) -> Iterator:  # noqa: N802
        """Push message batches; a reader thread applies the client's later requests."""
        try:
            first = next(request_iterator)
        except (StopIteration, grpc.RpcError):
            return  # the client went away before saying anything
        stream = self._broker.open_stream(first)
        context.add_callback(stream.close)
        self._readers.start(request_iterator, stream)
        properties = _PB.StreamingPullResponse.SubscriptionProperties(
            exactly_once_delivery_enabled=False,
            message_ordering_enabled=stream.message_ordering,
        )
        try:
            while (batch := self._broker.next_stream_batch(stream)) is not None:
                yield _PB.StreamingPullResponse(received_messages=batch, subscription_properties=properties)
        finally:
            stream.close()


class _StreamReaders:
    """Threads that consume StreamingPull request streams after the first request."""

    def __init__(self, broker: _Broker, name_prefix: str) -> None:
        self._broker = broker
        self._name_prefix = name_prefix
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._names = itertools.count(1)

    def start(self, request_iterator, stream: _Stream) -> None:
        thread = threading.Thread(
            target=self._consume,
            args=(request_iterator, stream),
            name=f"{self._name_prefix}-stream-{next(self._names)}",
            daemon=True,
        )
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            self._threads.add(thread)
        thread.start()

    def _consume(self, request_iterator, stream: _Stream) -> None:
        try:
            for request in request_iterator:
                self._broker.apply_stream_request(stream, request)
        except grpc.RpcError:
            pass  # the call was cancelled or the server stopped
        except _RpcError as error:
            stream.fail(error)
        finally:
            stream.close()

    def join(self, timeout: float) -> None:
        """Wait for all readers to finish (they do once their call has ended).

        A reader stays in the set until it is joined here or pruned dead by
        :meth:`start`: one that removed itself on its way out could still be
        alive when this returns.
        """
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)
            if thread.is_alive():
                _LOGGER.warning("StreamingPull reader %s did not stop", thread.name)


def _unary_handler(method: Callable, rpc: _Rpc) -> grpc.RpcMethodHandler:
    """Wrap a servicer method, turning :class:`_RpcError` into a gRPC status."""

    @functools.wraps(method)
    def handle(request, context):
        try:
            return method(request, context)
        except _RpcError as error:
            context.abort(error.code, error.details)

    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=rpc.request.FromString, response_serializer=rpc.response.SerializeToString
    )


def _stream_handler(method: Callable, rpc: _Rpc) -> grpc.RpcMethodHandler:
    """Like :func:`_unary_handler`, for a bidirectional-streaming method."""

    @functools.wraps(method)
    def handle(request_iterator, context):
        try:
            yield from method(request_iterator, context)
        except _RpcError as error:
            context.abort(error.code, error.details)

    return grpc.stream_stream_rpc_method_handler(
        handle, request_deserializer=rpc.request.FromString, response_serializer=rpc.response.SerializeToString
    )


def _generic_handler(servicer) -> grpc.GenericRpcHandler:
    """Register every RPC listed in ``servicer.RPCS`` under ``servicer.SERVICE``."""
    handlers = {
        name: (_stream_handler if rpc.streaming else _unary_handler)(getattr(servicer, name), rpc)
        for name, rpc in servicer.RPCS.items()
    }
    return grpc.method_handlers_generic_handler(servicer.SERVICE, handlers)


class _Housekeeper:
    """A thread that periodically expires ack deadlines."""

    def __init__(self, broker: _Broker, name: str) -> None:
        self._broker = broker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(_TICK_SECONDS):
            self._broker.expire_leases()


# --------------------------------------------------------------------------
# Public server
# --------------------------------------------------------------------------


class PubSubServer:
    """An in-process Pub/Sub server for tests (see the module docstring).

    Args:
        project: Default project for :meth:`topic_path` / :meth:`subscription_path`
            (any project is accepted in requests).
        bind_host: Interface to listen on.
        port: Port to listen on; ``0`` picks a free one.
        seed: Seed of the random generator used by injected faults.
        pull_wait_seconds: Longest time a ``Pull`` without ``return_immediately``
            waits for a message before returning an empty response.
        max_workers: Size of the gRPC thread pool; every open StreamingPull
            and waiting Pull occupies one worker.

    Methods that take a topic or subscription accept either a full resource
    name or a bare id in :attr:`project`. The server can be started once.
    """

    def __init__(
        self,
        project: str = DEFAULT_PROJECT,
        *,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        pull_wait_seconds: float = 0.5,
        max_workers: int = 32,
    ) -> None:
        self.project = project
        self.port: int | None = None
        self._bind_host = bind_host
        self._requested_port = port
        self._max_workers = max_workers
        self._name_prefix = f"pubsub-server-{next(_INSTANCE_IDS)}"
        self._broker = _Broker(seed)
        self._readers = _StreamReaders(self._broker, self._name_prefix)
        self._subscriber = _SubscriberServicer(self._broker, self._readers, pull_wait_seconds)
        self._publisher = _PublisherServicer(self._broker)
        self._housekeeper = _Housekeeper(self._broker, f"{self._name_prefix}-housekeeper")
        self._executor: futures.ThreadPoolExecutor | None = None
        self._grpc_server: grpc.Server | None = None
        self._stopped = False

    # -- lifecycle ------------------------------------------------------

    @property
    def host(self) -> str:
        """``"HOST:PORT"`` to put in ``PUBSUB_EMULATOR_HOST``."""
        if self.port is None:
            raise RuntimeError("The server is not started")
        return f"{self._bind_host}:{self.port}"

    @property
    def thread_name_prefix(self) -> str:
        """Prefix of the names of all threads this server starts itself."""
        return self._name_prefix

    def start(self) -> PubSubServer:
        """Bind the port and start serving; returns ``self``."""
        if self._grpc_server is not None or self._stopped:
            raise RuntimeError("A PubSubServer can only be started once")
        self._executor = futures.ThreadPoolExecutor(self._max_workers, thread_name_prefix=f"{self._name_prefix}-rpc")
        self._grpc_server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        self._grpc_server.add_generic_rpc_handlers(
            (_generic_handler(self._publisher), _generic_handler(self._subscriber))
        )
        self.port = self._grpc_server.add_insecure_port(f"{self._bind_host}:{self._requested_port}")
        self._grpc_server.start()
        self._housekeeper.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving and join every thread the server started (idempotent).

        Open StreamingPull calls end with CANCELLED and waiting Pulls return
        at once; calls still running after ``grace`` seconds are cancelled.
        Clients should have sent their acks before: the client retries an ack
        that fails with UNAVAILABLE, which delays its shutdown.
        """
        if self._grpc_server is None or self._stopped:
            return
        self._stopped = True
        self._broker.shutdown()
        self._grpc_server.stop(grace).wait()
        self._readers.join(timeout=grace + 5)
        self._housekeeper.stop()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> PubSubServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- names ----------------------------------------------------------

    def topic_path(self, topic: str) -> str:
        """``projects/<project>/topics/<topic>`` (full names pass through)."""
        return topic if "/" in topic else f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, subscription: str) -> str:
        """``projects/<project>/subscriptions/<subscription>`` (full names pass through)."""
        return subscription if "/" in subscription else f"projects/{self.project}/subscriptions/{subscription}"

    # -- fault injection ------------------------------------------------

    def duplicate_next(self, count: int = 1) -> None:
        """Deliver each of the next ``count`` delivered messages twice.

        The duplicate has the same ``message_id`` but its own ack id and is
        delivered right after the original (in the same batch if it fits);
        acking one copy does not ack the other.
        """
        self._broker.duplicate_next(count)

    def configure_faults(
        self,
        *,
        duplicate_probability: float | None = None,
        delivery_delay: float | None = None,
        reorder: bool | None = None,
        seed: int | None = None,
    ) -> None:
        """Change injected faults; arguments left as None keep their value.

        Args:
            duplicate_probability: Chance that a delivery is duplicated (as in
                :meth:`duplicate_next`).
            delivery_delay: Seconds a published or requeued message waits
                before it may be delivered.
            reorder: Deliver a random ready message instead of the oldest one.
            seed: Re-seed the random generator, to replay the same decisions.
        """
        self._broker.configure_faults(
            duplicate_probability=duplicate_probability, delivery_delay=delivery_delay, reorder=reorder, seed=seed
        )

    def reset_faults(self) -> None:
        """Remove every injected fault (the random generator is not re-seeded)."""
        self._broker.reset_faults()

    def redeliver_all_unacked(self, subscription: str | None = None) -> int:
        """Expire every outstanding lease now (of one subscription, or all).

        Returns the number of leases expired. Dead-letter policies apply as
        for a normal expiry.
        """
        name = None if subscription is None else self.subscription_path(subscription)
        return self._broker.redeliver_all_unacked(name)

    # -- inspection -----------------------------------------------------

    def published_messages(self, topic: str) -> list[pubsub_types.PubsubMessage]:
        """Every message published to ``topic`` so far, in publish order."""
        return self._wrap_messages(self._broker.published_messages(self.topic_path(topic)))

    def wait_for_published(self, topic: str, count: int, timeout: float = 10.0) -> list[pubsub_types.PubsubMessage]:
        """Block until ``topic`` has at least ``count`` messages; return them all.

        Raises:
            TimeoutError: fewer than ``count`` messages after ``timeout`` seconds.
        """
        return self._wrap_messages(self._broker.wait_for_published(self.topic_path(topic), count, timeout))

    def subscription_stats(self, subscription: str) -> SubscriptionStats:
        """Delivery counters of ``subscription`` (see :class:`SubscriptionStats`)."""
        return self._broker.subscription_stats(self.subscription_path(subscription))

    @staticmethod
    def _wrap_messages(messages: list) -> list[pubsub_types.PubsubMessage]:
        return [pubsub_types.PubsubMessage.wrap(message) for message in messages]
