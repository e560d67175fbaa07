"""Fakes and emulators of external services, for tests.

``tests.servers.pubsub.PubSubServer`` is an in-process server speaking the
Google Cloud Pub/Sub gRPC API; ``tests.servers.bigquery.BigQueryEmulator``
runs the ``bqemulator`` BigQuery emulator in a child process;
``tests.servers.fixtures`` provides pytest fixtures around both.
"""

from tests.servers.bigquery import BigQueryEmulator
from tests.servers.pubsub import PubSubServer, SubscriptionStats

__all__ = ["BigQueryEmulator", "PubSubServer", "SubscriptionStats"]
