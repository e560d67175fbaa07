"""Fixtures shared by every area of the suite."""

from apache_beam.testing.test_stream import TestStream

from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401 - fixtures, used by name

TestStream.__test__ = False  # a Beam transform named Test*, not a pytest test class
