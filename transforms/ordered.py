"""A keyed stage that applies a pure state machine to its items in event-time order.

History checks must see a test's runs in the order they ended, not the order
their results happen to arrive in (a bounded replay finalizes every run at
once; a streaming job may finish two runs in one bundle). Items wait in state
until the watermark passes their event time, then are fed to the machine in
``item.order`` order. Thus the result is the same for any input order.

A key's history from earlier invocations (the start-up ``HistorySeed``) reaches
it in a stream as one more element of the key, a ``core.history.SeededState``,
not as a side input that every worker reads whole (``WithSeeds``). A bounded
replay, one local group of tests at a time, looks each key's up in an index of
the seed instead (``OrderedCheck.seeded_in_order``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
    runtime_checkable,
)

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.coders import VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from core import encoding
from core.history import HistorySeed, SeededState
from core.records import dead_letter_row, failure_reason, record_payload
from core.runs import TIMER_BUCKET_SECONDS
from core.schema import DEAD_LETTER
from transforms.coders import AnyRecord, RecordCoder, outputs_any


class StateMachine(Protocol):
    """What ``in_event_time_order`` runs per key: a pure state machine over the key's items."""

    def initial(self, key: Any) -> Any:
        """The state of ``key`` before its first item when the seed has none for it."""

    def step(self, state: Any, item: Any) -> Iterable[Any]:
        """Applies one item to ``state`` (mutating it) and yields outputs. Deterministic: the same state and item
        give the same state (a failure rebuilds the state by stepping earlier items again)."""

    def forget_at(self, state: Any) -> Optional[float]:
        """The event time from which a key whose items are all stepped may lose its state (None: never). A
        machine keyed per run gives one, so that a streaming job does not keep a state per run forever."""


class ApartCells(NamedTuple):
    """The cells where a ``KeepsApart`` machine keeps parts of its state, besides ``<name>_keyed``: Beam's state
    handles (``read``, ``write``/``add``, ``clear``), what each holds the machine's to say."""
    settled: Any  # ``<name>_settled``, a value: what changes seldom (e.g. the history of finished runs)
    near: Any     # ``<name>_near``, a value: a small view of ``settled``, enough for most items
    log: Any      # ``<name>_log``, a bag: what only grows between the items that change ``settled``


@runtime_checkable
class KeepsApart(Protocol):
    """A machine whose state lives in ``<name>_keyed`` and the ``ApartCells``, so that a firing reads and writes
    only the parts its items need, not the whole state (``in_event_time_order``)."""

    def load(self, key: Any, stored: Any, items: List[Any], cells: ApartCells) -> Tuple[Any, Any]:
        """The state to step ``items`` on, from ``stored`` (the ``<name>_keyed`` value, None for a new key) and
        the cells they need; and what ``store`` is to know of what was read. ``stored`` may be a whole state
        written before the machine kept parts apart: ``store`` then moves it into its parts."""

    def store(self, state: Any, loaded: Any, cells: ApartCells) -> Any:
        """Writes the parts of ``state`` kept apart that stepping may have changed; returns what
        ``<name>_keyed`` keeps."""


class ConfiguredMachine:
    """Base of the state machines that look up each test's config. Their keys live as long as the job (a test,
    a metric): they forget nothing, unless a machine keyed per run says when (``forget_at``)."""

    def __init__(self, configs):
        self.configs = configs

    def forget_at(self, state: Any) -> Optional[float]:
        return None


KeysWithin = Callable[[Any, Any], Iterable[Tuple[Any, Any]]]
"""(a grouped key, one of its values) -> (the machine's key, an item) of each item the value holds."""

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


class OrderedCheck(beam.PTransform[InputT, OutputT]):
    """Base of the composites that run a ``ConfiguredMachine`` in event-time order: its settings, once.

    ``seed`` is the one-element PCollection of the start-up ``HistorySeed`` (None: no history);
    ``streaming`` says whether input is unbounded and ``timer_bucket_seconds`` how
    coarse its timers are (see ``in_event_time_order``).
    """

    def __init__(self, configs, seed: Optional[beam.PCollection] = None, streaming: bool = True,
                 timer_bucket_seconds: float = TIMER_BUCKET_SECONDS):
        super().__init__()
        self.configs = configs
        self.seed = seed
        self.streaming = streaming
        self.timer_bucket_seconds = timer_bucket_seconds

    def in_order(self, machine: StateMachine, name: str, seeds: Optional[beam.pvalue.AsSingleton] = None,
                 keys_within: Optional[KeysWithin] = None) -> Union[beam.ParDo, GroupedInOrder]:
        """``machine`` applied per key in event-time order with this composite's settings: a ``ParDo`` of
        ``in_event_time_order`` on unbounded input, ``GroupedInOrder`` on bounded input (the same outputs), with
        its ``seeds`` and ``keys_within``, which only a grouped stage takes."""
        if not self.streaming:
            return GroupedInOrder(OrderedStage(machine, name, self.streaming, self.timer_bucket_seconds),
                                  seeds=seeds, keys_within=keys_within)
        assert seeds is None and keys_within is None, "a stream joins seeds as elements and keys each item"
        return beam.ParDo(in_event_time_order(machine, name, self.streaming, self.timer_bucket_seconds))

    def seeded_in_order(self, keyed: PCollection, label: str, machine: StateMachine, name: str, field: str,
                        *tags: str, main: str, keys_within: Optional[KeysWithin] = None) -> Any:
        """(key, item) -> ``machine``'s outputs per key in event-time order (``with_outputs(*tags, main=main)``),
        each key starting from its state in the seed's ``field`` (e.g. ``metrics``), if any.

        A stream joins each key's seed to it as one more element (``"WithSeeds"``, then ``label``: the step names a
        running job's state is updated by). A replay's grouped stage (``label``) looks its keys up instead in an
        index of the field's states, each encoded on its own (``encoded_states``, a side input), and decodes the
        states of the keys it has items for, once: joined as elements, every state crossed a ``Flatten`` and the
        ``GroupByKey``, encoded and decoded at each (a third of a nightly replay of many one-run tests).
        ``keys_within`` (a replay's only, ``GroupedInOrder``) says the machine's keys and items within each of
        ``keyed``'s values, where a replay groups several keys' items under one key."""
        seeds = None
        if self.streaming:
            keyed = keyed | "WithSeeds" >> WithSeeds(self.seed, field)
        elif self.seed is not None:
            seeds = beam.pvalue.AsSingleton(self.seed | "SeedIndex" >> beam.Map(encoded_states, field)
                                            .with_output_types(AnyRecord))
        return keyed | label >> self.in_order(machine, name, seeds, keys_within).with_outputs(*tags, main=main)


def encoded_states(seed: HistorySeed, field: str) -> Dict[Any, bytes]:
    """The seed's ``field`` (key -> state) with each state encoded on its own (``core.encoding``): what a grouped
    stage looks its keys up in, decoding only the states of the keys it steps."""
    return {key: encoding.encode(state) for key, state in getattr(seed, field).items()}


def seeded_states(seed: HistorySeed, field: str) -> Iterable[Tuple[Any, SeededState]]:
    """The seed -> (key, ``SeededState``) elements of one check: those of its ``field`` (key -> state)."""
    for key, state in getattr(seed, field).items():
        yield key, SeededState(state)


class WithSeeds(beam.PTransform[PCollection[Tuple[Any, Any]], PCollection[Tuple[Any, Any]]]):
    """(key, item) -> the same, and (key, ``SeededState``) for each key of ``seed``'s ``field`` (key -> state).

    ``seed`` is the one-element PCollection of the start-up ``HistorySeed``
    (None: no history, the items alone). Each key's state from it joins the
    key's items as one more element, which ``in_event_time_order`` makes the
    key's state: a worker holds the history of the keys it owns, instead of
    every worker reading the whole seed as a side input, which grows with the
    history. It arrives before any of the key's timers fire: the seed is
    bounded, so the stage's watermark stays at the start of time until the
    seed has been read.

    A bounded replay looks its keys' states up instead (``OrderedCheck.seeded_in_order``).
    """

    def __init__(self, seed: Optional[beam.PCollection], field: str):
        super().__init__()
        self.seed = seed
        self.field = field

    def expand(self, items):
        if self.seed is None:
            return items
        keyed = items.element_type  # the seeds' keys must be encoded as the items' are
        seeds = self.seed | "Seeds" >> beam.FlatMap(seeded_states, self.field).with_output_types(keyed)
        return (items, seeds) | "ItemsAndSeeds" >> beam.Flatten().with_output_types(keyed)


def _order(item):
    return item.order


def at_time(output: Any, timestamp: Timestamp) -> Any:
    """An output of a DoFn (tagged or not) at ``timestamp``: where a grouped replay stage gives what a timer
    firing at that time gives in a stream."""
    if isinstance(output, beam.pvalue.TaggedOutput):
        return beam.pvalue.TaggedOutput(output.tag, TimestampedValue(output.value, timestamp))
    return TimestampedValue(output, timestamp)


def _due(item) -> Timestamp:
    return Timestamp.of(item.order[0])


_LATEST_TIMER = GlobalWindow().max_timestamp()
IDLE = MAX_TIMESTAMP.micros
"""The ``scheduled`` cell of a key whose flush timer is not set: later than any timer, so any item moves it."""


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


@dataclasses.dataclass(frozen=True)
class KeyCells:
    """One key's state and timer handles in ``in_event_time_order`` (Beam's, or a test's stand-ins)."""
    keyed: Any                            # ``<name>_keyed``: the machine's state (the rest, with ``apart``)
    pending: Any                          # ``<name>_pending``: a bag of the items waiting for the watermark
    scheduled: Any                        # ``<name>_scheduled``: when ``flush`` fires, in µs (``IDLE``: not set)
    flush: Any                            # ``<name>_flush``: the watermark timer
    apart: Optional[ApartCells] = None    # a ``KeepsApart`` machine's other cells


class OrderedStage:
    """What the DoFn of ``in_event_time_order`` does with a key's cells, as plain methods: an item in
    (:meth:`take`), a seed in (:meth:`install_seed`), a timer firing (:meth:`flush`)."""

    def __init__(self, machine: StateMachine, name: str, streaming: bool, timer_bucket_seconds: float):
        self.machine = machine
        self.name = name
        self.streaming = streaming
        self.timer_bucket_seconds = timer_bucket_seconds

    def take(self, item: Any, cells: KeyCells) -> None:
        """Adds ``item`` to the key's bag and moves its timer earlier if the item is due first. Reads only
        ``<name>_scheduled``: never the pending items nor the machine's state."""
        known = cells.scheduled.read()
        scheduled = IDLE if known is None else known
        cells.pending.add(item)
        due = self.fires_at(item)
        if due.micros < scheduled:
            cells.flush.set(due)
            scheduled = due.micros
        if scheduled != known:
            cells.scheduled.write(scheduled)

    def install_seed(self, key: Any, seeded: SeededState, cells: KeyCells) -> List[Any]:
        """Makes the seed's state the key's, unless the key has one already (it cannot have stepped anything
        while the seed holds the watermark back; a state kept across ``--update`` wins): then the seed is a
        dead letter, and the key goes on with its own state."""
        if cells.keyed.read() is not None:
            return [self._seed_refused(key, seeded)]
        cells.keyed.write(copy.deepcopy(seeded.state))  # the seed's object may be shared: never change it
        return []

    def _seed_refused(self, key: Any, seeded: SeededState) -> beam.pvalue.TaggedOutput:
        return beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
            f"seed of {self.name} check not applied: the key already has a state, which it keeps",
            record_payload({"key": key, "state": type(seeded.state).__name__}), f"stage:{self.name}", None))

    def step_group(self, key: Any, values: Iterable[Any], seed: Optional[bytes] = None) -> Iterable[Any]:
        """A bounded input's key all at once (``GroupedInOrder``): its seed, if any, then every item in order,
        with the outputs the firing of ``flush`` gives it, at the time that firing has (its earliest item's).
        ``seed`` is the key's state encoded (``core.encoding``), where an index of the seed holds it. A second
        seed of the key (a ``SeededState`` among ``values`` beside it or another) is refused as
        ``install_seed`` refuses it, at the seed's time (the start of time: the seed is read before any input)."""
        seeded: Optional[Callable[[], Any]] = None if seed is None else functools.partial(encoding.decode, seed)
        items, refused = [], []
        for value in values:
            if not isinstance(value, SeededState):
                items.append(value)
            elif seeded is None:
                seeded = functools.partial(copy.deepcopy, value.state)  # (never change a seed: it may be shared)
            else:
                refused.append(self._seed_refused(key, value))
        for output in refused:
            yield at_time(output, MIN_TIMESTAMP)
        if not items:
            return
        items.sort(key=_order)  # stable: items of equal order stay in arrival order
        fired_at = min(map(self.fires_at, items))
        first_state = seeded if seeded is not None else (lambda: self.machine.initial(key))
        _, outputs = self.step_all(first_state(), items, first_state)
        for output in outputs:
            yield at_time(output, fired_at)

    def flush(self, key: Any, fired_at: Timestamp, cells: KeyCells) -> Iterable[Any]:
        """A firing of the key's timer at ``fired_at``: steps what is due, sets the timer for the rest; with
        nothing pending, forgets the key if its time has come."""
        stored = cells.keyed.read()
        items = list(cells.pending.read())
        if not items:  # nothing pending: the key is to be forgotten, or its state is gone or was never set
            self._forget_or_wait(stored, fired_at, cells)
            return
        items.sort(key=_order)  # stable: items of equal order stay in arrival order
        ready = len(items) if not self.streaming else next(
            (i for i, item in enumerate(items) if _due(item) > fired_at), len(items))
        state = stored
        if ready:
            state, loaded = self._load(key, stored, items[:ready], cells.apart)
            state, outputs = self.step_all(state, items[:ready])
            yield from outputs
            cells.keyed.write(state if cells.apart is None
                              else cast(KeepsApart, self.machine).store(state, loaded, cells.apart))
            cells.pending.clear()
            for item in items[ready:]:
                cells.pending.add(item)
        scheduled = self.fires_at(items[ready]) if ready < len(items) else self.forget_timer(state)
        if scheduled is not None:
            cells.flush.set(scheduled)
        cells.scheduled.write(IDLE if scheduled is None else scheduled.micros)

    def _forget_or_wait(self, stored: Any, fired_at: Timestamp, cells: KeyCells) -> None:
        forget = self.forget_timer(stored)
        if forget is not None and forget <= fired_at:
            for cell in (cells.keyed, cells.pending, cells.scheduled, *(cells.apart or ())):
                cell.clear()
        elif forget is not None:  # an earlier timer fired late (a runner's order): keep the later one
            cells.flush.set(forget)
            cells.scheduled.write(forget.micros)

    def _load(self, key: Any, stored: Any, items: List[Any], apart: Optional[ApartCells]) -> Tuple[Any, Any]:
        """The state to step ``items`` on, and what the machine's ``store`` is to know of it (None: one cell)."""
        if apart is not None:
            return cast(KeepsApart, self.machine).load(key, stored, items, apart)
        return (self.machine.initial(key) if stored is None else stored), None

    def fires_at(self, item: Any) -> Timestamp:
        return bucket_end(item.order[0], self.timer_bucket_seconds) if self.streaming else _due(item)

    def forget_timer(self, state: Any) -> Optional[Timestamp]:
        """When the timer fires to forget a key with nothing pending (None: it is kept; a bounded replay
        forgets nothing, its state ends with it)."""
        at = None if not self.streaming or state is None else self.machine.forget_at(state)
        return None if at is None else bucket_end(at, self.timer_bucket_seconds)

    def step_all(self, state: Any, items: List[Any],
                 state_before: Optional[Callable[[], Any]] = None) -> Tuple[Any, List[Any]]:
        """Steps ``items`` in their order; returns the state and the outputs. An item whose step raises is a
        dead letter and leaves the state as if it had not been there: rebuilt from the snapshot taken before
        the first step by stepping again the items that succeeded since (then snapshot again).
        ``state_before`` makes that first snapshot again instead (a copy of ``state`` as it is now): a key
        stepped from its seed or its initial state need not encode a state that a failure seldom reads."""
        outputs: List[Any] = []
        if not items:
            return state, outputs
        since: List[Any] = []
        snapshot = None if state_before is not None else encoding.encode(state)
        for item in items:
            try:
                outputs += list(self.machine.step(state, item))
            except Exception as error:  # noqa: BLE001 - any failure on one item is that item's, not the stage's
                if snapshot is None:
                    assert state_before is not None
                    state = state_before()
                else:
                    state = encoding.decode(snapshot)
                for done in since:
                    list(self.machine.step(state, done))
                snapshot, since = encoding.encode(state), []
                outputs.append(beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                    failure_reason(f"{self.name} check", error), record_payload(item), f"stage:{self.name}",
                    item.order[0])))
            else:
                since.append(item)
        return state, outputs


def in_event_time_order(machine: StateMachine, name: str, streaming: bool = True,
                        timer_bucket_seconds: float = TIMER_BUCKET_SECONDS) -> beam.DoFn:
    """A DoFn: (key, item or ``SeededState``) -> whatever ``machine.step`` yields, per key in event-time order.

    Items need an ``order`` tuple whose first field is their event time in
    seconds. A ``SeededState`` element is the key's state from the start-up
    seed (see ``WithSeeds``); a key without one starts from
    ``machine.initial(key)``.

    A key keeps, under names of its instance (``name``; ``KeyCells``):

    - ``<name>_keyed``: the machine's state (``transforms.coders.RecordCoder``);
    - ``<name>_pending``: a bag of the items waiting for the watermark, in arrival order;
    - ``<name>_scheduled``: when the ``<name>_flush`` watermark timer fires, in
      microseconds, or ``IDLE`` when it is not set;
    - for a machine that keeps parts of its state apart (``KeepsApart``: ``load`` and ``store``), the
      ``ApartCells`` ``<name>_settled``, ``<name>_near`` and ``<name>_log`` too, and only the rest of its
      state in ``<name>_keyed``: a firing reads the parts its due items need and writes those they change
      (``transforms.window_checks``: the history of finished runs is written when a run ends, not at every
      firing). Other machines have no such cells.

    An item costs the same however many are pending: ``process`` appends it to
    the bag and reads only ``<name>_scheduled``, to move the timer earlier if
    the item is due first; it never reads the pending items nor the machine's
    state. A firing reads the bag and the state once, sorts the items by
    ``order``, steps those due, writes the state once, and puts back the
    items not yet due.

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

    A step that raises leaves the key's state as it was before that item, and
    the item goes to the ``dead_letter`` output with the exception as the
    reason: one bad item never stops the key, let alone the stage. A firing
    takes one snapshot of the state (``core.encoding``) before its first step,
    not a copy per item; a failure rebuilds the state from it by stepping again
    the items that succeeded since (their outputs are not repeated).

    In a streaming job, once a key has nothing pending and the machine's
    ``forget_at`` gives a time, the flush timer is set at that time's bucket,
    and its firing clears the key's state, bag and timer cell, so a job that
    runs for months holds no state of runs that ended long ago
    (``tests/transforms/test_state_released.py``). An item arriving before then
    is stepped as usual and moves the time; one arriving after it meets a new
    key. A timer that fires with nothing pending and nothing to forget (its
    key's state gone, or never set) does nothing.
    """
    stage = OrderedStage(machine, name, streaming, timer_bucket_seconds)
    keyed_spec = ReadModifyWriteStateSpec(f"{name}_keyed", RecordCoder())
    pending_spec = BagStateSpec(f"{name}_pending", RecordCoder())
    scheduled_spec = ReadModifyWriteStateSpec(f"{name}_scheduled", VarIntCoder())
    flush_spec = TimerSpec(f"{name}_flush", TimeDomain.WATERMARK)
    settled_spec = ReadModifyWriteStateSpec(f"{name}_settled", RecordCoder())
    near_spec = ReadModifyWriteStateSpec(f"{name}_near", RecordCoder())
    log_spec = BagStateSpec(f"{name}_log", RecordCoder())

    # Beam finds a DoFn's state and timers in its methods' default arguments, so the class is made here, with this
    # instance's names; it only hands the cells to ``stage``.
    @outputs_any
    class InEventTimeOrderFn(beam.DoFn):
        def process(self, element,
                    keyed=beam.DoFn.StateParam(keyed_spec),
                    pending=beam.DoFn.StateParam(pending_spec),
                    scheduled=beam.DoFn.StateParam(scheduled_spec),
                    flush=beam.DoFn.TimerParam(flush_spec)):
            key, item = element
            cells = KeyCells(keyed, pending, scheduled, flush)
            if isinstance(item, SeededState):
                yield from stage.install_seed(key, item, cells)
            else:
                stage.take(item, cells)

        if not isinstance(machine, KeepsApart):
            @on_timer(flush_spec)
            def on_flush(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                         keyed=beam.DoFn.StateParam(keyed_spec),
                         pending=beam.DoFn.StateParam(pending_spec),
                         scheduled=beam.DoFn.StateParam(scheduled_spec),
                         flush=beam.DoFn.TimerParam(flush_spec)):
                return stage.flush(key, fired_at, KeyCells(keyed, pending, scheduled, flush))
        else:
            @on_timer(flush_spec)
            def on_flush(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                         keyed=beam.DoFn.StateParam(keyed_spec),
                         pending=beam.DoFn.StateParam(pending_spec),
                         scheduled=beam.DoFn.StateParam(scheduled_spec),
                         flush=beam.DoFn.TimerParam(flush_spec),
                         settled=beam.DoFn.StateParam(settled_spec),
                         near=beam.DoFn.StateParam(near_spec),
                         log=beam.DoFn.StateParam(log_spec)):
                return stage.flush(key, fired_at, KeyCells(keyed, pending, scheduled, flush,
                                                           ApartCells(settled, near, log)))

    InEventTimeOrderFn.__name__ = InEventTimeOrderFn.__qualname__ = f"InEventTimeOrder[{name}]"
    return InEventTimeOrderFn()


class GroupedInOrder(beam.PTransform):
    """(key, item or ``SeededState``) -> what ``in_event_time_order`` gives for the same bounded input, without
    state or timers: a ``GroupByKey``, then each key's items stepped at once (``OrderedStage.step_group``).

    On bounded input the stateful DoFn adds each item to a bag, and one timer firing per key, once the input is
    read, steps them all; here the shuffle brings a key's items together instead, so a replay of many small
    keys (tests of one run each) pays no state reads, commits or timers per key. The outputs, tags and
    timestamps are the same. ``with_outputs`` as ``ParDo.with_outputs``. ``seeds``, a side input of key ->
    encoded state (``encoded_states``), seeds the keys it holds as a ``SeededState`` element would. With
    ``keys_within``, a grouped key's values hold the items of several of the machine's keys (a test's runs,
    each with its metrics), each stepped as if it had been keyed on its own: fewer, larger elements for Beam
    to carry."""

    def __init__(self, stage: OrderedStage, tags: Sequence[str] = (), main: Optional[str] = None,
                 seeds: Optional[beam.pvalue.AsSingleton] = None, keys_within: Optional[KeysWithin] = None):
        super().__init__()
        self.stage = stage
        self.tags = tuple(tags)
        self.main = main
        self.seeds = seeds
        self.keys_within = keys_within

    def with_outputs(self, *tags: str, main: Optional[str] = None) -> GroupedInOrder:
        return GroupedInOrder(self.stage, tags, main, self.seeds, self.keys_within)

    def expand(self, items):
        fn = StepGroupsFn(self.stage, self.keys_within)
        step = beam.ParDo(fn) if self.seeds is None else beam.ParDo(fn, self.seeds)
        return (items | "GroupByKey" >> beam.GroupByKey()
                | "StepInOrder" >> (step.with_outputs(*self.tags, main=self.main) if self.tags else step))


@outputs_any
class StepGroupsFn(beam.DoFn):
    """(key, its values) -> ``OrderedStage.step_group`` of them (of each machine key's, with ``keys_within``),
    seeded from ``seeds`` (key -> encoded state)."""

    def __init__(self, stage: OrderedStage, keys_within: Optional[KeysWithin] = None):
        super().__init__()
        self.stage = stage
        self.keys_within = keys_within

    def process(self, element, seeds=None):  # seeds: key -> its encoded state
        key, values = element
        groups: Iterable[Tuple[Any, Iterable[Any]]] = ((key, values),)
        if self.keys_within is not None:
            by_key: Dict[Any, List[Any]] = {}
            for value in values:
                for inner, item in self.keys_within(key, value):
                    by_key.setdefault(inner, []).append(item)
            groups = by_key.items()
        for inner, items in groups:
            yield from self.stage.step_group(inner, items, None if seeds is None else seeds.get(inner))
