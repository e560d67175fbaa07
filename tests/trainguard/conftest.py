"""Fixtures for the trainer-side tests."""

from __future__ import annotations

import pytest

from tests.trainguard.support import Handlers
from trainguard.metrics import api


@pytest.fixture(autouse=True)
def fresh_metrics_config():
    """Every test starts with nothing configured and no warnings remembered."""
    api._reset_for_tests()
    yield
    api._reset_for_tests()


@pytest.fixture
def handlers():
    """Creates wire handlers and closes them after the test."""
    made = Handlers()
    yield made
    made.close_all()
