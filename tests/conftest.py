from tests.servers.fixtures import pubsub_server  # noqa: F401
