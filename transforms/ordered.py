"""A keyed stage that applies a pure state machine to its items in event-time order.

History checks must see a test's runs in the order they ended, not the order
their results happen to arrive in (a bounded replay finalizes every run at
once; a streaming job may finish two runs in one bundle). Items wait in state
until the watermark passes their event time, then are fed to the machine in
``item.order`` order. Thus the result is the same for any input order.
"""

from __future__ import annotations

import bisect
import copy
import pickle
from typing import Any, Dict, Iterable, List, Protocol

import apache_beam as beam
from apache_beam.transforms.core import SIDE_INPUT_PREFIX
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from core.records import dead_letter_row, failure_reason, record_payload
from core.registry import record
from core.runs import TIMER_BUCKET_SECONDS
from core.schema import DEAD_LETTER
from transforms.coders import RecordCoder


class StateMachine(Protocol):
    def initial(self, key: Any, seed: Any) -> Any:
        """The state of ``key`` before its first item (from the start-up seed)."""

    def step(self, state: Any, item: Any) -> Iterable[Any]:
        """Applies one item to ``state`` (mutating it) and yields outputs."""


class ConfiguredMachine:
    """Base of the state machines that look up each test's config."""

    def __init__(self, configs):
        self.configs = configs


class OrderedCheck(beam.PTransform):
    """Base of the composites that run a ``ConfiguredMachine`` in event-time order: its settings, once.

    ``seed`` is the singleton side input of the start-up ``HistorySeed``;
    ``streaming`` says whether input is unbounded and ``timer_bucket_seconds`` how
    coarse its timers are (see ``in_event_time_order``).
    """

    def __init__(self, configs, seed, streaming: bool = True, timer_bucket_seconds: float = TIMER_BUCKET_SECONDS):
        super().__init__()
        self.configs = configs
        self.seed = seed
        self.streaming = streaming
        self.timer_bucket_seconds = timer_bucket_seconds

    def in_order(self, machine: StateMachine, name: str) -> beam.DoFn:
        """``in_event_time_order`` of ``machine`` with this composite's settings."""
        return in_event_time_order(machine, name, self.streaming, self.timer_bucket_seconds)


def _order(item):
    return item.order


def _due(item) -> Timestamp:
    return Timestamp.of(item.order[0])


_LATEST_TIMER = GlobalWindow().max_timestamp()


def bucket_end(seconds: float, bucket_seconds: float) -> Timestamp:
    """When a watermark timer for something due at ``seconds`` fires: the end of its bucket, the first multiple
    of ``bucket_seconds`` at or after it (``core.runs.RunLifecycle.timer_bucket_seconds``; 0: the first whole
    microsecond at or after it).

    Never before ``seconds``, as a float too: a firing takes what is due at or before ``float(fired_at)``, so
    ``Timestamp.of(seconds)``, which truncates below a microsecond, would fire just before a time such as
    ``T + 0.2 + 0.7 * 2`` (...2.6000000000001) and leave it pending, due at the time just fired: the settle
    timer of its windows would then fire again at that same time, forever."""
    due = Timestamp.of(seconds)
    bucket_micros = max(1, round(bucket_seconds * 1_000_000))
    micros = -(-due.micros // bucket_micros) * bucket_micros
    while float(Timestamp(micros=micros)) < seconds:
        micros += bucket_micros
    end = Timestamp(micros=micros)
    return end if end <= _LATEST_TIMER else max(due, _LATEST_TIMER)


@record("OrderedKeyState")
class _Keyed:
    """All that one key keeps: the machine's state and its items waiting for the watermark."""

    def __init__(self, machine_state: Any):
        self.machine_state = machine_state
        self.pending: list = []          # sorted by ``order``
        self.scheduled: Timestamp = None  # when the flush timer is set to fire

    def to_state(self) -> Dict[str, Any]:
        """What the key's state keeps (``core.encoding``: a file format, fields by name)."""
        return {"machine_state": self.machine_state, "pending": self.pending,
                "scheduled_micros": None if self.scheduled is None else self.scheduled.micros}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> _Keyed:
        keyed = cls(state["machine_state"])
        keyed.pending = state.get("pending", [])
        micros = state.get("scheduled_micros")
        keyed.scheduled = None if micros is None else Timestamp(micros=micros)
        return keyed


class KeyedParDo(beam.ParDo):
    """``beam.ParDo`` of a stateful DoFn with side inputs, whose timers get the key coder of its main input.

    Beam (2.77) takes "the main input" of a stateful ParDo to be any of its
    inputs that is not a side input *object*; it compares input tags with
    side-input objects, so the pick is the first of a set of tags, in hash-seed
    order: often the side input. Its timers then got a key coder from the
    seed's type (the fallback coder, or an error now that the seed has a coder
    of its own) instead of the key's. This keeps the side inputs out of that
    pick. The label stays ``ParDo(...)``: step names are what ``--update`` maps.
    """

    def default_label(self) -> str:
        return f"ParDo({self.fn.default_label()})"

    def _get_key_and_window_coder(self, named_inputs):
        if named_inputs is not None:
            named_inputs = {tag: pcoll for tag, pcoll in named_inputs.items()
                            if not tag.startswith(SIDE_INPUT_PREFIX)}
        return super()._get_key_and_window_coder(named_inputs)


def in_event_time_order(machine: StateMachine, name: str, streaming: bool = True,
                        timer_bucket_seconds: float = TIMER_BUCKET_SECONDS) -> beam.DoFn:
    """A DoFn: (key, item) -> whatever ``machine.step`` yields, per key in event-time order.

    Items need an ``order`` tuple whose first field is their event time in
    seconds. The ``seed`` side input is passed to ``machine.initial``.

    A key's state and pending items are one state value, read and written whole
    (one value encoded by ``transforms.coders.RecordCoder``, not one state
    operation per item): a bounded replay buffers a test's whole history in it
    before the first timer fires.

    With bounded input (``streaming=False``) every item has arrived before any
    timer fires (FnApiRunner runs a stage's timers once its input is done), so
    the first firing feeds all pending items, in order, instead of one firing
    per distinct event time, each re-reading the key's state.

    With unbounded input the timer is set at the earliest pending item's due
    time rounded up to its bucket of ``timer_bucket_seconds`` (``bucket_end``;
    0: the due time itself, to the microsecond). A firing at time T feeds every pending item due at
    or before T, in order, and sets the timer at the next pending item's
    bucket: one firing per bucket the watermark passes, not one per distinct
    event time. The outputs are the same: an item is fed once the watermark
    has passed its bucket's end, so after it has passed the item itself, and
    every item due before it has been fed first.

    Each instance gets its own state and timer names: FnApiRunner confuses the
    timers of two stateful DoFns that share a timer name when it fuses them
    into one stage (one loses its output, or the timers fail to decode).

    A step that raises leaves the key's state as it was before that item (the
    step runs on the state, which is restored from a snapshot taken before it),
    and the item goes to the ``dead_letter`` output with the exception as the
    reason: one bad item never stops the key, let alone the stage.
    """
    keyed_spec = ReadModifyWriteStateSpec(f"{name}_keyed", RecordCoder())
    flush_spec = TimerSpec(f"{name}_flush", TimeDomain.WATERMARK)

    class InEventTimeOrderFn(beam.DoFn):
        def process(self, element, seed,
                    keyed_state=beam.DoFn.StateParam(keyed_spec),
                    flush=beam.DoFn.TimerParam(flush_spec)):
            key, item = element
            keyed = keyed_state.read()
            if keyed is None:
                keyed = _Keyed(copy.deepcopy(machine.initial(key, seed)))
            bisect.insort(keyed.pending, item, key=_order)
            due = fires_at(item)
            if keyed.scheduled is None or due < keyed.scheduled:
                flush.set(due)
                keyed.scheduled = due
            keyed_state.write(keyed)

        @on_timer(flush_spec)
        def on_flush(self, fired_at=beam.DoFn.TimestampParam,
                     keyed_state=beam.DoFn.StateParam(keyed_spec),
                     flush=beam.DoFn.TimerParam(flush_spec)):
            keyed = keyed_state.read()
            if keyed is None:  # the runner fired a timer for a key whose state is gone
                return
            ready = 0
            while ready < len(keyed.pending) and (not streaming or _due(keyed.pending[ready]) <= fired_at):
                yield from _step_or_dead_letter(keyed, keyed.pending[ready])
                ready += 1
            del keyed.pending[:ready]
            keyed.scheduled = fires_at(keyed.pending[0]) if keyed.pending else None
            if keyed.scheduled is not None:
                flush.set(keyed.scheduled)
            keyed_state.write(keyed)

    def fires_at(item: Any) -> Timestamp:
        return bucket_end(item.order[0], timer_bucket_seconds) if streaming else _due(item)

    def _step_or_dead_letter(keyed: _Keyed, item: Any) -> List[Any]:
        snapshot = pickle.dumps(keyed.machine_state, pickle.HIGHEST_PROTOCOL)
        try:
            return list(machine.step(keyed.machine_state, item))
        except Exception as error:  # noqa: BLE001 - any failure on one item is that item's, not the stage's
            keyed.machine_state = pickle.loads(snapshot)
            return [beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                failure_reason(f"{name} check", error), record_payload(item), f"stage:{name}", item.order[0]))]

    InEventTimeOrderFn.__name__ = InEventTimeOrderFn.__qualname__ = f"InEventTimeOrder[{name}]"
    return InEventTimeOrderFn()
