from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401
