"""In-process fakes of external services, for tests.

``tests.servers.pubsub.PubSubServer`` speaks the Google Cloud Pub/Sub gRPC API;
``tests.servers.fixtures`` provides pytest fixtures around it.
"""

from tests.servers.pubsub import PubSubServer, SubscriptionStats

__all__ = ["PubSubServer", "SubscriptionStats"]
