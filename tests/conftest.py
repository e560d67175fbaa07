"""Fixtures shared by every area of the suite, and how many processes run it."""

import os
import sys

import pytest
from apache_beam.testing.test_stream import TestStream

from pipeline.runners import spare_local_runners
from tests.servers.fixtures import bigquery_emulator, pubsub_server  # noqa: F401 - fixtures, used by name

TestStream.__test__ = False  # a Beam transform named Test*, not a pytest test class

# The product does this whenever it picks a local runner (pipeline.runners.runner_for); tests that build a runner
# themselves get the same, whichever test ran first in their process.
spare_local_runners()

# Bytecode caches, even where PYTHONDONTWRITEBYTECODE is set (as container images often do): the suite starts some
# 150 interpreters on the same sources, and each worker collects (and rewrites the asserts of) every test module.
# Compiling all of that again each time cost about a tenth of the suite's CPU.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): one worker more than there are cores. Part of the suite's time is
    spent waiting, not computing (streaming tests that follow the wall clock, the servers, subprocesses starting),
    which the extra worker fills. On two idle cores (2026-11-26, before the work stealing and the bytecode caches):
    2 workers 7 min 14 s without the browser tests (which take 36 s on one); 3 workers, with them, 6 min 42 s to
    7 min 28 s in five runs; 4 workers 7 min 16 s."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With workers, they steal work from each other (``worksteal``) instead of xdist's default ``load``, which
    queues chunks of tests on each worker ahead of time and so ended the suite with one worker running a queued
    chunk alone for half a minute."""
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(items):
    """Tests marked ``long`` first, the order otherwise kept: started last, one of them kept a worker busy alone
    for up to a minute after the others had finished."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True, scope="session")
def _pipeline_temp_dirs_removed():
    """Removes the local temp dir of every Beam pipeline this process built and did not run: ``beam.Pipeline()``
    makes one (``beam-pipeline-temp*``) and only ``run()`` removes it, so each test that builds a graph to look at
    it left an empty directory in the temp dir (some 250 a suite). Only this process's, once its tests are over."""
    import shutil

    import apache_beam as beam

    made = []
    original_init = beam.Pipeline.__init__

    def init_and_note(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        made.append(getattr(self, "local_tempdir", None))

    beam.Pipeline.__init__ = init_and_note
    try:
        yield
    finally:
        beam.Pipeline.__init__ = original_init
        for path in made:
            if path:
                shutil.rmtree(path, ignore_errors=True)
