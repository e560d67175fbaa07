"""A stateful DoFn driven key by key under Dataflow's watermark-hold rule, which no local runner models.

Dataflow holds a stage's output watermark at the hold of every user timer still pending: an event-time
timer's own time, and a processing-time timer's input timestamp (the element, or the firing timer, it was set
from; Beam's Python SDK sets the same holds, ``bundle_processor.OutputTimer.set``, and cannot opt out:
apache/beam#20705). The local runners hold nothing for user timers, so a stage that holds every check behind
it for a week passes every local test. ``HeldStage`` runs the real DoFn on state stand-ins that keep bytes
between calls (``bench.bench_ordered``), fires its timers as the input watermark and the wall clock pass them,
earliest first, and says where its output watermark stands: the least of the input watermark and the holds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import apache_beam as beam
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, get_dofn_specs
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from bench.bench_ordered import CodedBag, CodedCell, arguments


class HeldTimer:
    """One key's timer: when it fires and what it holds (None: not set)."""

    def __init__(self, domain: str, stage: HeldStage):
        self.domain = domain
        self.stage = stage
        self.fires: Optional[Timestamp] = None
        self.hold: Optional[Timestamp] = None

    def set(self, at) -> None:
        self.fires = Timestamp.of(at)
        self.hold = self.fires if self.domain == TimeDomain.WATERMARK else self.stage.input_timestamp

    def clear(self) -> None:
        self.fires = self.hold = None


class HeldStage:
    """A stateful DoFn's keys, their state and timers, with Dataflow's holds (see the module)."""

    def __init__(self, fn: beam.DoFn):
        self.fn = fn
        self.state_specs, self.timer_specs = get_dofn_specs(fn)
        self.keys: Dict[Any, Tuple[Dict[str, Any], Dict[str, HeldTimer]]] = {}
        self.input_timestamp = Timestamp.of(0)

    def _key(self, key: Any) -> Tuple[Dict[str, Any], Dict[str, HeldTimer]]:
        if key not in self.keys:
            self.keys[key] = (
                {spec.name: CodedBag(spec.coder) if isinstance(spec, BagStateSpec) else CodedCell(spec.coder)
                 for spec in self.state_specs},
                {spec.name: HeldTimer(spec.time_domain, self) for spec in self.timer_specs})
        return self.keys[key]

    def process(self, key: Any, value: Any, timestamp: float) -> List[Any]:
        """One element of ``key`` at event time ``timestamp``: its outputs."""
        cells, timers = self._key(key)
        self.input_timestamp = Timestamp.of(timestamp)
        return list(self.fn.process((key, value), **arguments(self.fn.process, key, cells, timers,
                                                              self.input_timestamp)) or ())

    def advance(self, watermark: float, now: float) -> List[Any]:
        """The input watermark moves to ``watermark`` and the wall clock to ``now``: every timer they pass
        fires, the earliest first (also those set by the firings), as on Dataflow; their outputs."""
        outputs: List[Any] = []
        while True:
            due = [(timer.fires, key, name) for key, (_, timers) in self.keys.items()
                   for name, timer in timers.items() if timer.fires is not None
                   and timer.fires <= Timestamp.of(watermark if timer.domain == TimeDomain.WATERMARK else now)]
            if not due:
                return outputs
            fires, key, name = min(due, key=lambda item: (item[0], repr(item[1]), item[2]))
            cells, timers = self.keys[key]
            timer = timers[name]
            self.input_timestamp = timer.hold  # what a timer set in the callback holds, if in processing time
            timer.clear()
            spec = next(spec for spec in self.timer_specs if spec.name == name)
            method = getattr(self.fn, spec._attached_callback.__name__)
            outputs += list(method(**arguments(method, key, cells, timers, fires)) or ())

    def output_watermark(self, input_watermark: float) -> Timestamp:
        """Where the stage's output watermark stands: held at its pending timers' holds."""
        holds = [timer.hold for _, timers in self.keys.values() for timer in timers.values()
                 if timer.hold is not None]
        return min([Timestamp.of(input_watermark), *holds]) if holds else Timestamp.of(input_watermark)

    def pending(self) -> List[Tuple[Any, str, Timestamp]]:
        return sorted((key, name, timer.fires) for key, (_, timers) in self.keys.items()
                      for name, timer in timers.items() if timer.fires is not None)


END_OF_TIME = float(MAX_TIMESTAMP)
