"""Fixtures shared by every area of the suite."""

from apache_beam.testing.test_stream import TestStream

from pipeline.runners import remember_dofn_specs, remember_option_views
from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401 - fixtures, used by name

TestStream.__test__ = False  # a Beam transform named Test*, not a pytest test class

# The product does these whenever it picks a local runner (pipeline.runners.runner_for); tests that build a runner
# themselves get the same, whichever test ran first in their process.
remember_dofn_specs()
remember_option_views()
