"""Every timer of every stateful DoFn, fired for a key whose state is already cleared or was never set, is a no-op.

A runner may fire a timer after the state it was set with is gone (Dataflow fires timers in its own order, a drain
fires them all, a state expiry may come first), or for a key it restored without state. Each callback here gets
empty state cells (stand-ins of Beam's state API that keep bytes between calls, ``bench.bench_ordered``), must not
raise, and must emit nothing and write no state.
"""

from __future__ import annotations

import importlib
import pkgutil

import apache_beam as beam
import pytest
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, get_dofn_specs
from apache_beam.utils.timestamp import Timestamp

import transforms
from bench.bench_ordered import CodedBag, CodedCell, Timer, arguments
from core.runs import RunLifecycle
from tests.support import T0
from tests.transforms.support import configs, stateful_dofns

STATEFUL_DOFNS = stateful_dofns(configs(), RunLifecycle(backfill_lag_seconds=900.0))


@pytest.mark.parametrize("name", sorted(STATEFUL_DOFNS))
def test_every_timer_fired_without_state_does_nothing(name):
    fn, key = STATEFUL_DOFNS[name]
    state_specs, timer_specs = get_dofn_specs(fn)
    assert timer_specs, f"{name} has no timers: it does not belong here"
    for timer_spec in timer_specs:
        cells = {spec.name: CodedBag(spec.coder) if isinstance(spec, BagStateSpec) else CodedCell(spec.coder)
                 for spec in state_specs}
        timers = {spec.name: Timer() for spec in timer_specs}
        method = getattr(fn, timer_spec._attached_callback.__name__)
        outputs = list(method(**arguments(method, key, cells, timers, Timestamp.of(T0 + 3600))) or ())
        assert outputs == [], (name, timer_spec.name)
        assert all(cell.data in (None, []) for cell in cells.values()), (name, timer_spec.name)


def has_timers(cls) -> bool:
    return any(isinstance(value, TimerSpec) for klass in cls.__mro__ for value in vars(klass).values())


def test_every_stateful_dofn_in_transforms_is_covered():
    """A new DoFn with timers in transforms/ must join ``tests.transforms.support.stateful_dofns`` (the ordered
    stage's class is made per machine by ``in_event_time_order``, with its timer spec inside), and so the drain
    of ``tests/transforms/test_drains.py``."""
    covered = {type(fn) for fn, _ in STATEFUL_DOFNS.values()}
    with_timers = set()
    for module_info in pkgutil.iter_modules(transforms.__path__):
        module = importlib.import_module(f"transforms.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, beam.DoFn) and has_timers(value):
                with_timers.add(value)
    assert with_timers and with_timers <= covered, with_timers - covered


@pytest.mark.parametrize("name", sorted(STATEFUL_DOFNS))
def test_no_stateful_dofn_sets_a_processing_time_timer(name):
    """Dataflow holds a stage's output watermark at a pending processing-time timer's input timestamp: a timer
    of an old element (a back-fill) would hold every stage after it, all alerts, for as long as it is pending
    (``tests/transforms/held_watermarks.py``). Every wait is an event-time timer."""
    _, timer_specs = get_dofn_specs(STATEFUL_DOFNS[name][0])
    assert {spec.time_domain for spec in timer_specs} == {TimeDomain.WATERMARK}, name
