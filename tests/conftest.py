"""Fixtures shared by every area of the suite, and how many processes run it."""

import os

from apache_beam.testing.test_stream import TestStream

from pipeline.runners import pickle_dofns_once, read_arguments_from_code, remember_dofn_specs, remember_option_views
from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401 - fixtures, used by name

TestStream.__test__ = False  # a Beam transform named Test*, not a pytest test class

# The product does these whenever it picks a local runner (pipeline.runners.runner_for); tests that build a runner
# themselves get the same, whichever test ran first in their process.
remember_dofn_specs()
remember_option_views()
pickle_dofns_once()
read_arguments_from_code()


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): one worker more than there are cores. Part of the suite's time is
    spent waiting, not computing (streaming tests that follow the wall clock, the servers, subprocesses starting),
    which the extra worker fills. On two idle cores (2026-11-26): 2 workers 7 min 14 s without the browser tests
    (which take 36 s on one); 3 workers, with them, 6 min 42 s to 7 min 28 s in four runs; 4 workers 7 min 16 s."""
    return (os.cpu_count() or 1) + 1
