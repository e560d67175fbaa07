"""A keyed stage that applies a pure state machine to its items in event-time order.

History checks must see a test's runs in the order they ended, not the order
their results happen to arrive in (a bounded replay finalizes every run at
once; a streaming job may finish two runs in one bundle). Items wait in a bag
until the watermark passes their event time, then are fed to the machine in
``item.order`` order. Thus the result is the same for any input order.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Protocol

import apache_beam as beam
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp


class StateMachine(Protocol):
    def initial(self, key: Any, seed: Any) -> Any:
        """The state of ``key`` before its first item (from the start-up seed)."""

    def step(self, state: Any, item: Any) -> Iterable[Any]:
        """Applies one item to ``state`` (mutating it) and yields outputs."""


def _due(item) -> Timestamp:
    return Timestamp.of(item.order[0])


def in_event_time_order(machine: StateMachine, name: str) -> beam.DoFn:
    """A DoFn: (key, item) -> whatever ``machine.step`` yields, per key in event-time order.

    Items need an ``order`` tuple whose first field is their event time in
    seconds. The ``seed`` side input is passed to ``machine.initial``.

    Each instance gets its own state and timer names: FnApiRunner confuses the
    timers of two stateful DoFns that share a timer name when it fuses them
    into one stage (one loses its output, or the timers fail to decode).
    """
    pending_spec = BagStateSpec(f"{name}_pending", PickleCoder())
    state_spec = ReadModifyWriteStateSpec(f"{name}_state", PickleCoder())
    next_flush_spec = ReadModifyWriteStateSpec(f"{name}_next_flush", PickleCoder())
    flush_spec = TimerSpec(f"{name}_flush", TimeDomain.WATERMARK)

    class InEventTimeOrderFn(beam.DoFn):
        def process(self, element, seed,
                    pending=beam.DoFn.StateParam(pending_spec),
                    state=beam.DoFn.StateParam(state_spec),
                    next_flush=beam.DoFn.StateParam(next_flush_spec),
                    flush=beam.DoFn.TimerParam(flush_spec)):
            key, item = element
            if state.read() is None:
                state.write(copy.deepcopy(machine.initial(key, seed)))
            pending.add(item)
            due = _due(item)
            scheduled = next_flush.read()
            if scheduled is None or due < scheduled:
                flush.set(due)
                next_flush.write(due)

        @on_timer(flush_spec)
        def on_flush(self, fired_at=beam.DoFn.TimestampParam,
                     pending=beam.DoFn.StateParam(pending_spec),
                     state=beam.DoFn.StateParam(state_spec),
                     next_flush=beam.DoFn.StateParam(next_flush_spec),
                     flush=beam.DoFn.TimerParam(flush_spec)):
            items = sorted(pending.read(), key=lambda i: i.order)
            ready = [i for i in items if _due(i) <= fired_at]
            waiting = [i for i in items if _due(i) > fired_at]
            machine_state = state.read()
            for item in ready:
                yield from machine.step(machine_state, item)
            state.write(machine_state)
            pending.clear()
            for item in waiting:
                pending.add(item)
            if waiting:
                due = _due(waiting[0])
                flush.set(due)
                next_flush.write(due)
            else:
                next_flush.clear()

    InEventTimeOrderFn.__name__ = InEventTimeOrderFn.__qualname__ = f"InEventTimeOrder[{name}]"
    return InEventTimeOrderFn()
