"""Fixtures shared by every area of the suite, and how many processes run it."""

import os

from apache_beam.testing.test_stream import TestStream

from pipeline.runners import spare_local_runners
from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401 - fixtures, used by name

TestStream.__test__ = False  # a Beam transform named Test*, not a pytest test class

# The product does this whenever it picks a local runner (pipeline.runners.runner_for); tests that build a runner
# themselves get the same, whichever test ran first in their process.
spare_local_runners()


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): one worker more than there are cores. Part of the suite's time is
    spent waiting, not computing (streaming tests that follow the wall clock, the servers, subprocesses starting),
    which the extra worker fills. On two idle cores (2026-11-26): 2 workers 7 min 14 s without the browser tests
    (which take 36 s on one); 3 workers, with them, 6 min 42 s to 7 min 28 s in five runs; 4 workers 7 min 16 s."""
    return (os.cpu_count() or 1) + 1
