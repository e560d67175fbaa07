"""Publishing wire messages to Google Cloud Pub/Sub.

Uses the official client (``google-cloud-pubsub``), so ``PUBSUB_EMULATOR_HOST``
works as usual. The client is created in the background thread as soon as
the handler starts, before the first batch (looking up credentials may take
seconds, and building the client holds the GIL for 12-18 ms, which would stall
the training thread if it happened mid-training), and its own retries are turned off: retries,
backoff and giving up are the handler's (see ``trainguard.handlers``), so a
Pub/Sub outage costs bounded memory and never blocks training.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, List, Optional, Sequence

from .encoding import EncodedMessage
from .handlers import PublisherConfig, WireHandler

_TOPIC = re.compile(r"^projects/[^/]+/topics/[^/]+$")


def check_topic(topic: str) -> str:
    if not isinstance(topic, str) or not _TOPIC.match(topic):
        raise ValueError(f"topic must look like projects/PROJECT/topics/TOPIC, got {topic!r}")
    return topic


class PubSubTransport:
    """Publishes encoded messages, all of one ``send`` in one Publish request.

    Uses ``google.cloud.pubsub_v1.PublisherClient`` for its emulator and
    credentials handling (its gRPC channel carries them), but neither its
    batching ``publish(topic, data)`` (a thread and a future per batch: about
    1.7 ms of CPU per request on a 2-core machine) nor its GAPIC ``publish``
    (proto-plus wrappers, retry and logging layers: ~0.15 ms of CPU per request
    more): it calls the Publish RPC on the client's channel with plain
    protobuf messages, and raises what GAPIC would (``google.api_core``
    exceptions). A client without a gRPC channel (another transport) is called
    through GAPIC. The handler batches, retries and backs off itself.
    """

    def __init__(self, topic: str, client_factory: Optional[Callable[[], Any]] = None):
        self.topic = check_topic(topic)
        from google.cloud import pubsub_v1  # noqa: F401 - fail at setup if not installed

        self._factory = client_factory or _default_client
        self._client = None
        self._publish: Optional[Callable[[Sequence[EncodedMessage], float], None]] = None
        self._lock = threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def open(self) -> None:
        """Imports the client's modules and creates the client (the handler's thread calls this when it
        starts). If it fails (no credentials yet), ``send`` tries again and reports the error."""
        self._publisher()

    def send(self, messages: Sequence[EncodedMessage], timeout: float) -> List[Optional[BaseException]]:
        try:
            self._publisher()(messages, timeout)
        except Exception as e:  # noqa: BLE001 - e.g. no credentials, UNAVAILABLE: retried by the handler
            return [e] * len(messages)
        return [None] * len(messages)

    def _publisher(self) -> Callable[[Sequence[EncodedMessage], float], None]:
        """``publish(messages, timeout)`` for the client (made on first use)."""
        publish = self._publish
        if publish is None:
            publish = self._publish = _publisher(self.client(), self.topic)
        return publish

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._publish = None
        if client is not None and self._factory is _default_client:
            client.transport.close()  # our own client: release its channel (a given one is the caller's)


def _publisher(client: Any, topic: str) -> Callable[[Sequence[EncodedMessage], float], None]:
    """Publishes with ``client``: the raw Publish RPC on its gRPC channel when it has one, else its GAPIC call."""
    from google.api_core import exceptions, gapic_v1
    from google.pubsub_v1 import types as gapic_types
    from google.pubsub_v1.services.publisher import client as gapic_client
    from google.pubsub_v1.services.publisher.transports.base import DEFAULT_CLIENT_INFO

    channel = getattr(getattr(client, "transport", None), "grpc_channel", None)
    if channel is None:
        def publish_gapic(messages: Sequence[EncodedMessage], timeout: float) -> None:
            request = [gapic_types.PubsubMessage(data=m.payload, attributes=m.attributes) for m in messages]
            gapic_client.PublisherClient.publish(client, topic=topic, messages=request, retry=None,
                                                 timeout=timeout)
        return publish_gapic

    import grpc

    request_pb = gapic_types.PublishRequest.pb()
    message_pb = gapic_types.PubsubMessage.pb()
    call = channel.unary_unary("/google.pubsub.v1.Publisher/Publish",
                               request_serializer=request_pb.SerializeToString,
                               response_deserializer=gapic_types.PublishResponse.pb().FromString)
    # the headers GAPIC sends: who is calling (x-goog-api-client), and the topic for routing
    metadata = (DEFAULT_CLIENT_INFO.to_grpc_metadata(), gapic_v1.routing_header.to_grpc_metadata((("topic", topic),)))

    def publish(messages: Sequence[EncodedMessage], timeout: float) -> None:
        request = request_pb(topic=topic, messages=[message_pb(data=m.payload, attributes=m.attributes)
                                                    for m in messages])
        try:
            call(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise exceptions.from_grpc_error(e) from e  # the exception GAPIC raises (NotFound, ...)
    return publish


def _default_client():
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient()


class PubSubMetricHandler(WireHandler):
    """Publishes metric points and events to a Pub/Sub topic in wire contract v1.

    ``PubSubMetricHandler("projects/p/topics/t", test="resnet50", run="2026-11-21.1")``;
    ``client_factory`` may build a ``PublisherClient`` with custom credentials. ``rank`` and
    ``world_size`` default to ``$RANK``/``$WORLD_SIZE`` (see ``WireHandler``).
    """

    kind = "pubsub"

    def __init__(self, topic: str, test: Optional[str] = None, run: Optional[str] = None,
                 config: Optional[PublisherConfig] = None,
                 client_factory: Optional[Callable[[], Any]] = None, *, rank: Optional[int] = None,
                 world_size: Optional[int] = None):
        self.topic = check_topic(topic)
        super().__init__(PubSubTransport(topic, client_factory), test, run, config,
                         rank=rank, world_size=world_size)
