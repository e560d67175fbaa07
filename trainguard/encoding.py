"""Background-side encoding of buffered values into wire messages.

Publishers buffer points as plain tuples ``(tag, value, step, time)``; this
module validates them against the wire contract and packs them into compact
messages. It writes the JSON by hand rather than through
``wire.encode_message`` because building point dicts and ``json.dumps`` cost
~2.1 us per point on the 2-core project machine, against ~1.1 us here: tag
prefixes are encoded once per tag, times are written to the millisecond and
reused while they do not change, and the common case (known tag, float value,
int step) is inlined. The output is the same JSON object
``wire.encode_message`` would build, and ``ts`` comes from
``wire.event_time_millis`` (tests/trainguard/test_encoding.py checks both).

With ``schema=wire.SCHEMA_V1_1`` it writes v1.1 ``columns`` instead
(``trainguard._columns``): a training loop's batch (the same tags in the same
order every step) is split into columns by slicing, any other batch is
grouped by tag in one Python loop, and everything else is done a column at a
time in C-speed passes (type counts, a sum for finiteness, ``array('f')`` for
float32 values, %-formatting or, where orjson or msgspec is importable, it
for the number lists). A training loop's times go up, so their range is two
ends and, at the rates where the CPU matters (several points a millisecond),
each column's milliseconds are written from where they change, found by
bisection, rather than a product, a truncation and a difference a point;
columns with the same steps (every tag logged once a step) share their text.
About 0.12-0.15 us a point with orjson for the 100,000 points/s load of
bench/bench_publisher.py (0.3 us with %-formatting alone) against 1.1 us for
v1 on the project machine, and about 17 bytes a point instead of about 70.
Float32 values (``loss.item()`` of a float32 tensor) go in their shortest
float32 text through numpy and orjson (``float32_writer``), or to 9 digits by
%-formatting without them, at three times the CPU: the same float32. The
output is the JSON object ``wire.encode_message(..., schema=wire.SCHEMA_V1_1)``
builds. ``encode_flat`` takes the points as the handler's intake holds them
(flat, four entries a point) and slices the columns out without a tuple per
point.
"""

from __future__ import annotations

import json
import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from itertools import repeat
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from . import _columns, wire


def compiled_writer() -> Optional[Callable[[Any], bytes]]:
    """A compiled writer of JSON number lists, where one is importable (see ``_Column.json``): orjson, else msgspec
    (the pipeline's install has it). Neither is a dependency of the trainer: without them %-formatting writes the
    same points."""
    try:
        from orjson import dumps
        return dumps
    except ImportError:
        pass
    try:
        from msgspec.json import encode
        return encode
    except ImportError:
        return None


compiled_dumps = compiled_writer()  # (tests swap it for another writer, or None)


def float32_writer() -> Optional[Callable[[Any], str]]:
    """A writer of float32 values (an ``array('f')``) where numpy and orjson are importable: orjson writes each
    value in its shortest text that reads back to it as a float32 (``3.91`` where %-formatting to 9 digits writes
    ``3.91000009``), at a third of the CPU, the check included. None where either is missing (%-formatting then)."""
    try:
        from numpy import float32, frombuffer
        from orjson import OPT_SERIALIZE_NUMPY, dumps
    except ImportError:
        return None

    def write(values: Any) -> str:
        return dumps(frombuffer(values, dtype=float32), option=OPT_SERIALIZE_NUMPY).decode()  # type: ignore[no-any-return]
    return write


float32_dumps = float32_writer()  # (tests swap it for None)

NONFINITE_EVENT = "nonfinite_value"
"""Event sent the first time a tag gets a NaN or infinite value (the wire cannot carry it)."""

MIN_MS = int(wire.MIN_TIME * 1000)
MAX_MS = int(wire.MAX_TIME * 1000)
_EXACT_INT = 1 << 53


def millis_text(ms: int) -> str:
    """Whole milliseconds as the wire's seconds text: 1763596800123 -> "1763596800.123"."""
    seconds, millis = divmod(ms, 1000)
    return f"{seconds}.{millis:03d}"


class EncodedMessage(NamedTuple):
    """One wire message ready to send, with its Pub/Sub attributes."""
    payload: bytes
    attributes: Dict[str, str]
    points: int
    events: int


class _Invalid(ValueError):
    pass


def wire_tag(tag: Any) -> Any:
    """The tag as points carry it: ``(group, name)`` from a handler with
    ``group_prefix`` becomes ``"group/name"``; anything else is unchanged."""
    if type(tag) is tuple and len(tag) == 2 and all(isinstance(part, str) for part in tag):
        return f"{tag[0]}/{tag[1]}"
    return tag


def _value_json(value: Any) -> str:
    kind = type(value)
    if kind is float:
        if value - value == 0.0:  # finite
            return float.__repr__(value)
        raise ArithmeticError(value)
    if kind is int:
        if -_EXACT_INT <= value <= _EXACT_INT:
            return int.__repr__(value)
    elif isinstance(value, (str, bytes, bytearray)):
        raise _Invalid(f"value must be a number, got {kind.__name__}")
    try:
        number = float(value)  # numpy scalars, 0-d tensors, bool, Decimal, big ints
    except (TypeError, ValueError, OverflowError) as e:
        raise _Invalid(f"value {value!r} is not a finite number ({e})") from None
    if not math.isfinite(number):
        raise ArithmeticError(number)
    return float.__repr__(number)


def _step_json(step: Any) -> str:
    if type(step) is not int:
        try:
            step = operator.index(step)
        except TypeError:
            raise _Invalid(f"step must be an integer, got {type(step).__name__}") from None
    if not 0 <= step <= wire.MAX_STEP:
        raise _Invalid(f"step {step} is out of range")
    return int.__repr__(step)


def sanitize_event_data(data: Any) -> Dict[str, Any]:
    """Event data as strict JSON: non-finite floats and unknown types become strings."""

    def clean(obj: Any, depth: int) -> Any:
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else repr(obj)
        if depth > 20:
            return repr(obj)
        if isinstance(obj, dict):
            return {str(k): clean(v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v, depth + 1) for v in obj]
        item = getattr(obj, "item", None)  # numpy / torch scalars
        if callable(item):
            try:
                return clean(item(), depth + 1)
            except Exception:  # noqa: BLE001 - anything odd becomes its repr
                pass
        return repr(obj)

    return clean(dict(data or {}), 0)


class Counters:
    """What the encoder refused, by reason."""
    __slots__ = ("invalid_points", "nonfinite_points", "invalid_events")

    def __init__(self) -> None:
        self.invalid_points = 0
        self.nonfinite_points = 0
        self.invalid_events = 0


class MessageEncoder:
    """Packs points and events into wire messages of bounded count and size.

    Not thread-safe: one encoder belongs to one background thread.
    """

    def __init__(self, test: str, run: str, max_points: int = 1000,
                 max_bytes: int = 900_000, on_warning: Optional[Callable[[str], None]] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None, schema: str = wire.SCHEMA):
        if schema not in wire.SCHEMAS:
            raise ValueError(f"schema must be one of {wire.SCHEMAS}, got {schema!r}")
        wire.check_name(test, "test")
        wire.check_name(run, "run")
        wire._parse_rank({"rank": rank, "world_size": world_size})  # the contract's rule; raises a ValueError
        if not 1 <= max_points <= wire.MAX_POINTS_PER_MESSAGE:
            raise ValueError(f"max_points must be 1..{wire.MAX_POINTS_PER_MESSAGE}, got {max_points}")
        if not 4096 <= max_bytes <= wire.MAX_MESSAGE_BYTES:
            raise ValueError(f"max_bytes must be 4096..{wire.MAX_MESSAGE_BYTES}, got {max_bytes}")
        self.test, self.run = test, run
        self.rank, self.world_size = rank, world_size
        self.max_points, self.max_bytes = max_points, max_bytes
        self.schema = schema
        self._head = f'{{"schema":{json.dumps(schema)},"id":'
        # Everything fixed per handler is encoded once here, rank and world_size included.
        self._envelope = f',"test":{json.dumps(test)},"run":{json.dumps(run)}'
        if rank is not None:
            self._envelope += f',"rank":{rank:d}'
        if world_size is not None:
            self._envelope += f',"world_size":{world_size:d}'
        self._tag_prefix: Dict[str, Optional[str]] = {}
        self._column_head: Dict[Any, Optional[str]] = {}
        self._round: Tuple[Sequence[Any], List[str]] = ([], [])  # the tags of a periodic batch's round, their heads
        self._last_ms = -1
        self._last_time = ""
        self._nonfinite_tags: set = set()
        self._warned_tags: set = set()
        self._warn = on_warning or (lambda message: None)
        self.counters = Counters()

    # -- points ------------------------------------------------------------

    def _prefix(self, tag: Any) -> Optional[str]:
        try:
            return self._tag_prefix[tag]
        except (KeyError, TypeError):
            pass
        name = wire_tag(tag)
        try:
            wire.check_name(name, "tag")
            prefix = f'{{"tag":{json.dumps(name)},"value":'
        except ValueError as e:
            self._warn(f"dropping points with invalid tag {tag!r:.100}: {e}")
            prefix = None
        try:
            if len(self._tag_prefix) < 100_000:
                self._tag_prefix[tag] = prefix
        except TypeError:  # unhashable tag
            pass
        return prefix

    def point_json(self, tag: Any, value: Any, step: Any, time: Any,
                   pending_events: Optional[List[Dict[str, Any]]] = None) -> Tuple[Optional[str], int]:
        """One point's JSON and its time in milliseconds, or (None, 0) if refused."""
        prefix = self._prefix(tag)
        if prefix is None:
            self.counters.invalid_points += 1
            return None, 0
        try:
            value_json = _value_json(value)
            if type(time) is not float and (isinstance(time, bool) or not isinstance(time, (int, float))):
                raise _Invalid(f"time must be a number, got {type(time).__name__}")
            if time - time != 0:  # NaN or infinite: refused as invalid (not as a non-finite value)
                raise _Invalid(f"time {time!r} is not plausible unix seconds")
            ms = int(time * 1000)
            if ms != self._last_ms:
                if not MIN_MS <= ms < MAX_MS:
                    raise _Invalid(f"time {time!r} is not plausible unix seconds")
                self._last_ms = ms
                self._last_time = millis_text(ms)
            if step is None:
                return f'{prefix}{value_json},"time":{self._last_time}}}', ms
            return f'{prefix}{value_json},"time":{self._last_time},"step":{_step_json(step)}}}', ms
        except ArithmeticError as e:
            self.counters.nonfinite_points += 1
            if tag not in self._nonfinite_tags and pending_events is not None:
                self._nonfinite_tags.add(tag)
                data = {"tag": wire_tag(tag), "value": repr(e.args[0] if e.args else value)}
                if isinstance(step, int) and 0 <= step <= wire.MAX_STEP:
                    data["step"] = step
                event_time = time if isinstance(time, (int, float)) else 0.0
                pending_events.append(wire.event_dict(NONFINITE_EVENT, float(event_time), data))
        except (_Invalid, TypeError, ValueError, OverflowError) as e:
            self.counters.invalid_points += 1
            if tag not in self._warned_tags and len(self._warned_tags) < 1000:
                self._warned_tags.add(tag)
                self._warn(f"dropping invalid point {tag!r}={value!r:.100} step={step!r:.50} "
                           f"(further ones of this tag are only counted): {e}")
        return None, 0

    # -- events ------------------------------------------------------------

    def event_json(self, event: Dict[str, Any]) -> Optional[str]:
        """One event's JSON (validated as the pipeline will), or None if refused."""
        try:
            wire.check_name(event["type"], "event type")
            time = float(event["time"])
            if not wire.MIN_TIME <= time < wire.MAX_TIME:
                raise ValueError(f"time {time!r} is not plausible unix seconds")
            time = int(time * 1000) / 1000  # to the millisecond, like points
            data = sanitize_event_data(event.get("data"))
            encoded = json.dumps(wire.event_dict(event["type"], time, data),
                                 separators=(",", ":"), allow_nan=False)
            if len(json.dumps(data)) > wire.MAX_EVENT_DATA_BYTES:
                raise ValueError(f"data is larger than {wire.MAX_EVENT_DATA_BYTES} bytes")
            if event["type"] == wire.RUN_FINISHED and data.get("status") not in wire.FINISHED_STATUSES:
                raise ValueError(f"run_finished status {data.get('status')!r} is not one of {wire.FINISHED_STATUSES}")
            return encoded
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            self.counters.invalid_events += 1
            self._warn(f"dropping invalid event {event!r:.200}: {e}")
            return None

    # -- messages ----------------------------------------------------------

    def encode(self, points: Sequence[Sequence[Any]], events: Sequence[Dict[str, Any]] = (),
               next_id: Callable[[], str] = wire.new_message_id,
               pause: Optional[Callable[[], None]] = None, pause_every: int = 256) -> List[EncodedMessage]:
        """Wire messages holding the valid ones of ``points`` (tuples of tag,
        value, step, time) and ``events`` (``wire.event_dict`` dicts).

        ``pause`` is called after every ``pause_every`` points: a background
        thread passes a short sleep there, so it never holds the GIL for long.
        (A training loop's v1.1 batch, written in C-speed passes at a fraction
        of the cost a point, pauses after ``_VECTORIZED_PAUSE_FACTOR`` times as
        many: a sleep costs 15-25 us of CPU on the project machine.)
        """
        events = list(events)
        if self.schema == wire.SCHEMA_V1_1:
            tags, values, steps, times = map(list, zip(*points)) if points else ([], [], [], [])
            return self._encode_columns(tags, values, steps, times, events, next_id, pause, pause_every)
        point_parts: List[str] = []
        point_ms: List[int] = []
        if pause is None:
            self._encode_points(points, point_parts, point_ms, events)
        else:
            for start in range(0, len(points), pause_every):
                if start:
                    pause()
                self._encode_points(points[start:start + pause_every], point_parts, point_ms, events)
        event_parts = [(part, int(float(e["time"]) * 1000) / 1000) for e in events
                       for part in (self.event_json(e),) if part is not None]
        return self._pack(point_parts, point_ms, event_parts, next_id)

    def encode_flat(self, points: Sequence[Any], events: Sequence[Dict[str, Any]] = (),
                    next_id: Callable[[], str] = wire.new_message_id,
                    pause: Optional[Callable[[], None]] = None, pause_every: int = 256,
                    floats: bool = False) -> List[EncodedMessage]:
        """``encode`` of points given flat, as ``Intake.take_points`` gives them: ``[tag, value, step, time,
        tag, value, step, time, ...]`` (v1.1 takes the columns as slices, without a tuple per point).

        ``floats``: every value and every time is known to be a ``float`` (``Intake.all_floats``), so their
        types are not checked again (their values are). The same messages either way."""
        if len(points) % 4:
            raise ValueError(f"flat points need 4 entries each, got {len(points)}")
        if self.schema == wire.SCHEMA_V1_1:
            return self._encode_columns(points[0::4], points[1::4], points[2::4], points[3::4], list(events),
                                        next_id, pause, pause_every, floats)
        return self.encode(list(zip(*[iter(points)] * 4)), events, next_id, pause, pause_every)

    def _encode_points(self, points: Iterable[Sequence[Any]], point_parts: List[str], point_ms: List[int],
                       events: List[Dict[str, Any]]) -> None:
        add_part, add_ms = point_parts.append, point_ms.append
        prefixes = self._tag_prefix
        last_ms, last_time = self._last_ms, self._last_time
        float_repr = float.__repr__
        max_step = wire.MAX_STEP
        for tag, value, step, time in points:
            # The common case inline (a known tag, a finite float, a float time,
            # no step or a plain int one); everything else via point_json.
            prefix = prefixes.get(tag) if type(tag) is str else None
            if (prefix is not None and type(value) is float and value - value == 0.0 and type(time) is float
                    and time - time == 0.0 and (step is None or (type(step) is int and 0 <= step <= max_step))):
                ms = int(time * 1000)
                if ms != last_ms and MIN_MS <= ms < MAX_MS:
                    last_ms, last_time = ms, millis_text(ms)
                if ms == last_ms:
                    if step is None:
                        add_part(f'{prefix}{float_repr(value)},"time":{last_time}}}')
                    else:
                        add_part(f'{prefix}{float_repr(value)},"time":{last_time},"step":{step}}}')
                    add_ms(ms)
                    continue
            self._last_ms, self._last_time = last_ms, last_time
            part, ms = self.point_json(tag, value, step, time, events)
            last_ms, last_time = self._last_ms, self._last_time
            if part is not None:
                add_part(part)
                add_ms(ms)
        self._last_ms, self._last_time = last_ms, last_time

    def _pack(self, point_parts: List[str], point_ms: List[int],
              event_parts: List[Tuple[str, float]], next_id: Callable[[], str]) -> List[EncodedMessage]:
        budget = self.max_bytes - len(self._head) - len(self._envelope) - 120
        # Point ranges: max_points each, split further where they exceed the byte budget.
        ranges: List[Tuple[int, int]] = []
        for start in range(0, len(point_parts), self.max_points):
            end = min(start + self.max_points, len(point_parts))
            if sum(map(len, point_parts[start:end])) + (end - start) <= budget:
                ranges.append((start, end))
                continue
            size, first = 0, start
            for index in range(start, end):
                length = len(point_parts[index]) + 1
                if index > first and size + length > budget:
                    ranges.append((first, index))
                    size, first = 0, index
                size += length
            ranges.append((first, end))
        messages: List[EncodedMessage] = []
        e = 0
        for index, (start, end) in enumerate(ranges):
            e_end = e
            if index == len(ranges) - 1:  # events travel with the last points
                size = sum(map(len, point_parts[start:end])) + (end - start)
                e_end = self._events_fitting(event_parts, e, size, budget)
            ms = point_ms[start:end]
            messages.append(self._message("points", point_parts[start:end], end - start, max(ms) if ms else None,
                                          event_parts[e:e_end], next_id()))
            e = e_end
        while e < len(event_parts):
            e_end = self._events_fitting(event_parts, e, 0, budget)
            messages.append(self._message("points", [], 0, None, event_parts[e:e_end], next_id()))
            e = e_end
        return messages

    @staticmethod
    def _events_fitting(event_parts: List[Tuple[str, float]], first: int, size: int, budget: int) -> int:
        end = first
        while (end < len(event_parts) and end - first < wire.MAX_EVENTS_PER_MESSAGE
               and (size == 0 or size + len(event_parts[end][0]) + 1 <= budget)):
            size += len(event_parts[end][0]) + 1
            end += 1
        return end

    def _message(self, field: str, parts: List[str], points: int, latest_ms: Optional[int],
                 events: List[Tuple[str, float]], message_id: str) -> EncodedMessage:
        """One message of ``parts`` (point objects, or columns) under ``field``, and ``events``; ``latest_ms``:
        the latest point time, None without points."""
        text = [self._head, json.dumps(message_id), self._envelope]
        if parts:
            text += [f',"{field}":[', ",".join(parts), "]"]
        if events:
            text += [',"events":[', ",".join(part for part, _ in events), "]"]
        text.append("}")
        times = [{"time": latest_ms / 1000}] if latest_ms is not None else []
        ts = wire.event_time_millis(times, [{"time": t} for _, t in events])
        return EncodedMessage("".join(text).encode("utf-8"),
                              wire.message_attributes(self.test, self.run, ts, message_id, self.schema),
                              points, len(events))

    # -- v1.1 columns ------------------------------------------------------------

    def _encode_columns(self, tags: Sequence[Any], values: Sequence[Any], steps: Sequence[Any],
                        times: Sequence[Any], events: List[Dict[str, Any]], next_id: Callable[[], str],
                        pause: Optional[Callable[[], None]], pause_every: int,
                        floats: bool = False) -> List[EncodedMessage]:
        columns = self._periodic_columns(tags, values, steps, times, floats)
        if columns is None:
            columns = self._grouped_columns(list(zip(tags, values, steps, times)), events, pause, pause_every)
        elif pause is not None and len(tags) > _VECTORIZED_PAUSE_FACTOR * pause_every:
            pause()
        event_parts = [(part, int(float(e["time"]) * 1000) / 1000) for e in events
                       for part in (self.event_json(e),) if part is not None]
        return self._pack_columns(columns, event_parts, next_id)

    def _periodic_columns(self, tags: Sequence[Any], values: Sequence[Any], steps: Sequence[Any],
                          times: Sequence[Any], floats: bool = False) -> Optional[List[_Column]]:
        """The columns of a batch (given as its columns) as a training loop logs it, in C-speed passes over the
        whole batch, or None for anything else: the same tags in the same order every step, float values all
        finite, float times, steps all ints or all None. Each tag's column is then a slice (``values[k::period]``),
        its times in milliseconds (``_column_millis``) and steps (shared by the columns when they are the same,
        as when every step logs every tag once) written from where they change."""
        if not tags:
            return []
        try:
            period = tags.index(tags[0], 1) if tags[0] in tags[1:] else len(tags)
            round_tags = tags[:period]
            if tags[period:] != tags[:-period] or len(set(round_tags)) != period:
                return None
            same_round = round_tags == self._round[0]  # (the tags of the batch before, as a training loop logs)
        except (TypeError, ValueError):  # an unhashable tag, a tag whose == raises
            return None
        stepped = _plain_types(values, steps, times, floats)
        if stepped is None:
            return None
        if same_round:
            heads = self._round[1]
        else:
            found = [self._column_head_of(tag) for tag in round_tags]
            if None in found:
                return None
            heads = [head for head in found if head is not None]
            self._round = round_tags, heads
        millis = _column_millis(times, period)
        if millis is None:
            return None
        step_columns: List[Optional[_Steps]] = [None] * period
        if stepped:
            first = steps[0::period]
            if len(steps) % period == 0 and all(steps[k::period] == first for k in range(1, period)):
                ordered = sorted(first)  # (all ints: equal columns hold the same steps)
                step_columns = [_Steps(first, True)] * period
            else:
                ordered = sorted(steps)
                step_columns = [_Steps(steps[k::period], True) for k in range(period)]
            if ordered[0] < 0 or ordered[-1] > wire.MAX_STEP:
                return None
        return [_Column(head, values[k::period], step_columns[k], millis[k])
                for k, head in enumerate(heads)]

    def _grouped_columns(self, points: Sequence[Sequence[Any]], events: List[Dict[str, Any]],
                         pause: Optional[Callable[[], None]], pause_every: int) -> List[_Column]:
        """Any batch: points grouped by tag in a Python loop, then each tag's checked as a column."""
        groups: Dict[Any, List[Sequence[Any]]] = {}
        for start in range(0, len(points), pause_every):
            if start and pause is not None:
                pause()
            for point in points[start:start + pause_every]:
                try:
                    groups[point[0]].append(point)
                except KeyError:
                    groups[point[0]] = [point]
                except (TypeError, ValueError):  # an unhashable tag, a tag whose == raises: refused (and warned about) by the slow path
                    self.point_json(*point)
        if pause is not None and len(points) > pause_every:
            pause()
        return [column for tag, group in groups.items()
                for column in (self._column(tag, group, events),) if column is not None]

    def _column_head_of(self, tag: Any) -> Optional[str]:
        try:
            return self._column_head[tag]
        except KeyError:
            pass
        head = None
        if self._prefix(tag) is not None:  # a valid tag (warned about once otherwise)
            head = f'{{"tag":{json.dumps(wire_tag(tag))},'
        if len(self._column_head) < 100_000:
            self._column_head[tag] = head
        return head

    def _column(self, tag: Any, group: List[Sequence[Any]],
                events: List[Dict[str, Any]]) -> Optional[_Column]:
        """One tag's valid points as columns (values, steps or None, times in ms), the common case in C-speed
        passes, anything else point by point."""
        head = self._column_head_of(tag)
        if head is None:
            self.counters.invalid_points += len(group)
            return None
        _, values, steps, times = zip(*group)
        checked = _plainly_valid(values, steps, times)
        if checked is not None:
            ms, stepped = checked
            return _Column(head, values, _Steps(steps, True) if stepped else None, _Millis(ms))
        kept_values: List[float] = []
        kept_steps: List[Optional[int]] = []
        kept_ms: List[int] = []
        for point in group:
            numbers = self._point_numbers(*point, events)  # type: ignore[call-arg]  # (tag, value, step, time)
            if numbers is not None:
                kept_values.append(numbers[0])
                kept_steps.append(numbers[1])
                kept_ms.append(numbers[2])
        if not kept_values:
            return None
        kept = _Steps(kept_steps, None not in kept_steps) if any(s is not None for s in kept_steps) else None
        return _Column(head, kept_values, kept, _Millis(kept_ms))

    def _point_numbers(self, tag: Any, value: Any, step: Any, time: Any,
                       pending_events: List[Dict[str, Any]]) -> Optional[Tuple[float, Optional[int], int]]:
        """One point as (value, step, ms), validated as ``point_json`` does; None if refused (and counted)."""
        try:
            _value_json(value)  # the same refusals as v1
            number = float(value)
            if type(time) is not float and (isinstance(time, bool) or not isinstance(time, (int, float))):
                raise _Invalid(f"time must be a number, got {type(time).__name__}")
            ms = int(time * 1000)
            if not MIN_MS <= ms < MAX_MS:
                raise _Invalid(f"time {time!r} is not plausible unix seconds")
            return number, None if step is None else int(_step_json(step)), ms
        except (ArithmeticError, _Invalid, TypeError, ValueError, OverflowError):
            self.point_json(tag, value, step, time, pending_events)  # counts and reports it as v1 does
            return None

    def _pack_columns(self, columns: List[_Column], event_parts: List[Tuple[str, float]],
                      next_id: Callable[[], str]) -> List[EncodedMessage]:
        budget = self.max_bytes - len(self._head) - len(self._envelope) - 120
        messages: List[EncodedMessage] = []
        limit = self.max_points
        column, offset = 0, 0
        while column < len(columns):
            parts: List[str] = []
            count, latest = 0, 0
            c, o = column, offset
            while c < len(columns) and count < limit:
                part, taken, last_ms = columns[c].json(o, limit - count)
                parts.append(part)
                count += taken
                latest = max(latest, last_ms)
                o += taken
                if o == len(columns[c].values):
                    c, o = c + 1, 0
            size = sum(map(len, parts)) + len(parts)
            if size > budget and count > 1:
                limit = max(count // 2, 1)  # too big: the same points again, fewer at a time
                continue
            column, offset = c, o
            e_end = self._events_fitting(event_parts, 0, size, budget) if column == len(columns) else 0
            messages.append(self._message("columns", parts, count, latest, event_parts[:e_end], next_id()))
            event_parts = event_parts[e_end:]
            limit = min(limit * 2, self.max_points)
        while event_parts:
            e_end = self._events_fitting(event_parts, 0, 0, budget)
            messages.append(self._message("columns", [], 0, None, event_parts[:e_end], next_id()))
            event_parts = event_parts[e_end:]
        return messages


_NONE_TYPE = type(None)
_VECTORIZED_PAUSE_FACTOR = 4
"""A periodic batch is written at about 0.13-0.25 us a point, against 0.45 us grouped by tag and 0.8-1.1 us for v1
(the project machine): it pauses (once, between its columns and its messages) only past this many times
``pause_every`` points, so that a full message of 1,000 points holds the GIL about as long (0.1-0.25 ms) as
``pause_every`` points do on the other paths."""


def _all_of(kind: type, items: Sequence[Any]) -> bool:
    """Whether every item's type is exactly ``kind`` (list.count compares by identity first: half the cost of a set
    of the types)."""
    return [*map(type, items)].count(kind) == len(items)


def _plain_types(values: Sequence[Any], steps: Sequence[Any], times: Sequence[Any], floats: bool = False
                 ) -> Optional[bool]:
    """Whether every point has a step, of columns whose values and times are finite floats and steps all ints or
    all None (checked in C-speed passes over whole columns; ``floats``: values and times known to be floats, so
    only their sums are taken); None for any other columns (then each point is checked on its own)."""
    stepped = _all_of(int, steps)
    try:
        if ((floats or _all_of(float, values) and _all_of(float, times)) and math.isfinite(sum(values))
                and math.isfinite(sum(times)) and (stepped or _all_of(_NONE_TYPE, steps))):
            return stepped
    except TypeError:  # (not floats after all: the point-by-point path says which)
        pass
    return None


def _plainly_valid(values: Sequence[Any], steps: Sequence[Any], times: Sequence[Any]
                   ) -> Optional[Tuple[List[int], bool]]:
    """(times in ms, whether every point has a step) of columns whose every point is plainly valid, checked in
    C-speed passes over whole columns: float values all finite, float times within the contract's range, steps
    all ints within range or all None. None otherwise (then each point is checked on its own)."""
    stepped = _plain_types(values, steps, times)
    if stepped is None:
        return None
    ms = _millis(times)
    if ms is None or min(ms) < MIN_MS or max(ms) >= MAX_MS:
        return None
    if stepped and (min(steps) < 0 or max(steps) > wire.MAX_STEP):
        return None
    return ms, stepped


def _millis(times: Sequence[float]) -> Optional[List[int]]:
    """``int(time * 1000)`` of every time (floats), as v1 computes it; None if one is NaN or infinite.
    (``float.__trunc__`` is what ``int`` calls on a float, and ``t * 1000.0 == 1000.0 * t`` exactly: a third
    cheaper than ``map(int, ...)``.)"""
    try:
        return list(map(float.__trunc__, map(operator.mul, times, repeat(1000.0))))
    except (ValueError, OverflowError):  # NaN, infinity: the point-by-point path refuses them
        return None


def _column_millis(times: Sequence[float], period: int) -> Optional[List[Any]]:
    """The times (finite floats) of each of ``period`` interleaved columns (``times[k::period]``) in milliseconds,
    ``int(time * 1000)`` as v1 computes it: a ``_Millis`` or ``_RunMillis`` a column; None if a time is outside
    the contract's range.

    Times in order (one training thread's) go up within each column too, so the two ends are their range. When
    they also hold few distinct milliseconds (several points a millisecond: the rates where the CPU matters)
    a bisection finds where each millisecond starts, and each column is written from where it changes
    (``_run_millis``) instead of a product, a truncation and a difference a point."""
    n = len(times)
    ordered = sorted(times) == times  # (sorting floats already in order: a comparison a point, at C speed)
    if ordered:
        first, last = float.__trunc__(times[0] * 1000.0), float.__trunc__(times[-1] * 1000.0)
        if first < MIN_MS or last >= MAX_MS:
            return None
        if (last - first) * POINTS_PER_BISECTION <= n:
            columns = _run_millis(times, first, last, period)
            if columns is not None:
                return columns
    ms = _millis(times)
    if ms is None or (not ordered and (min(ms) < MIN_MS or max(ms) >= MAX_MS)):
        return None
    return [_Millis(ms[k::period]) for k in range(period)]


POINTS_PER_BISECTION = 8
"""Finding where a millisecond starts (``first_time_of``, ``bisect``) costs about what 6 points' product,
truncation and difference (and writing them) do: runs are looked for when the times span at most one millisecond
for every this many points."""


def first_time_of(ms: int) -> float:
    """The smallest float ``time`` whose ``int(time * 1000)`` is ``ms`` or more (for ``ms`` > 0)."""
    time = ms / 1000
    while time * 1000.0 >= ms:  # (a few ulps away at most: the product rounds)
        time = math.nextafter(time, 0.0)
    while time * 1000.0 < ms:
        time = math.nextafter(time, math.inf)
    return time


def _run_millis(times: Sequence[float], first: int, last: int, period: int) -> Optional[List[_RunMillis]]:
    """``_column_millis`` of times in order, from ``first`` to ``last`` ms: the runs of equal milliseconds found by
    bisection, then each column's changes from them; None where that would cost more than a pass a point."""
    n = len(times)
    starts, run_ms = [0], [first]
    start, ms = 0, first
    while ms < last:
        start = bisect_left(times, first_time_of(ms + 1), start + 1, n)
        ms = float.__trunc__(times[start] * 1000.0)
        starts.append(start)
        run_ms.append(ms)
    # Column k's first point in a run starting at ``start`` is its point (start - k + period - 1) // period: the
    # same for columns between two of the runs' remainders (start % period), so those share one writer (all of
    # them when every millisecond starts with a round of the tags, as when a step logs its values within one).
    bounds = [0, *sorted({start % period for start in starts} - {0}), period]
    if 2 * (len(bounds) - 1) * len(starts) > n:  # a Python step a run and a column: more than a pass a point
        return None
    columns: List[_RunMillis] = []
    for k, next_k in zip(bounds, bounds[1:]):
        at, values = [0], [first]
        for start, ms in zip(starts, run_ms):
            position = (start - k + period - 1) // period  # (0: the run holds the column's first point)
            if position == at[-1]:  # (a run before the column's first point, or shorter than a round)
                values[-1] = ms
            else:
                at.append(position)
                values.append(ms)
        columns += [_RunMillis(at, values)] * (next_k - k)
    return columns


class _Millis:
    """A column's times in milliseconds, written as deltas (``_columns.deltas``) a slice at a time."""
    __slots__ = ("ms",)

    def __init__(self, ms: Sequence[int]):
        self.ms = ms

    def text(self, start: int, end: int) -> Tuple[str, int]:
        """The ``,"ms":[...]`` of points ``start`` to ``end``, and the latest of their times."""
        ms = self.ms[start:end]
        return f',"ms":{_int_list_json(_columns.deltas(ms))}', max(ms)


def _int_list_json(numbers: List[int]) -> str:
    """A JSON array of ints: the compiled writer's where there is one, else one %-format over them all."""
    dumps = compiled_dumps
    if dumps is not None:
        return dumps(numbers).decode()  # type: ignore[no-any-return]
    return f'[{("%d," * len(numbers))[:-1] % tuple(numbers)}]'


class _RunMillis:
    """A column's times in milliseconds, in order and with few distinct: ``ms[i]`` from its point ``at[i]`` on
    (``at[0]`` is 0). Writes the deltas ``_Millis`` writes, zeros but where they change, from the changes; each
    slice once (columns may share one)."""
    __slots__ = ("at", "ms", "_texts")

    def __init__(self, at: List[int], ms: List[int]):
        self.at, self.ms = at, ms
        self._texts: Dict[Tuple[int, int], Tuple[str, int]] = {}

    def text(self, start: int, end: int) -> Tuple[str, int]:
        try:
            return self._texts[start, end]
        except KeyError:
            pass
        at, ms = self.at, self.ms
        current = bisect_right(at, start) - 1  # the change in effect at ``start``
        last = ms[current]
        parts = [',"ms":[', str(last)]
        position = start
        for i in range(current + 1, len(at)):
            change = at[i]
            if change >= end:
                break
            parts += (",0" * (change - position - 1), f",{ms[i] - last}")
            last, position = ms[i], change
        parts += (",0" * (end - 1 - position), "]")
        written = self._texts[start, end] = "".join(parts), last
        return written


class _Steps:
    """A column's steps (ints, or None where a point has none), written as deltas a slice at a time. Columns with
    the same steps (a training loop logging each tag once a step) share one, which writes each slice once."""
    __slots__ = ("steps", "every_step", "_texts")

    def __init__(self, steps: Sequence[Optional[int]], every_step: bool):
        """``every_step``: whether every point has a step (else ``steps`` holds None where one has none)."""
        self.steps, self.every_step = steps, every_step
        self._texts: Dict[Tuple[int, int], str] = {}

    def text(self, start: int, end: int) -> str:
        """The ``,"steps":[...]`` of points ``start`` to ``end`` ("" if none of them has a step)."""
        try:
            return self._texts[start, end]
        except KeyError:
            pass
        steps = self.steps[start:end]
        text = ""
        if self.every_step or None not in steps:
            text = f',"steps":{_int_list_json(_columns.deltas(steps))}'  # type: ignore[arg-type]
        elif steps.count(None) < end - start:  # (a slice without any step leaves them out)
            text = f',"steps":[{",".join("null" if s is None else str(s) for s in _columns._step_deltas(steps))}]'
        self._texts[start, end] = text
        return text


def _float_list_json(values: List[float]) -> Tuple[str, bool]:
    """Finite floats as a JSON array, and whether they are written as float32 (every one of them is exactly a
    float32: ``"f32": true``)."""
    n = len(values)
    # every value a float32? (array('f') turns one past its range into inf, which differs; one value first:
    # float64 values rarely pass it)
    middle = values[n >> 1]
    if array("f", (middle,))[0] == middle:
        narrow = array("f", values)
        if narrow.tolist() == values:
            if float32_dumps is not None:
                return float32_dumps(narrow), True
            # One %-format over the whole slice is a third cheaper than a str.join over map(format, values).
            text = ("%.9g," * n)[:-1] % tuple(values)
            if 0.0 in values:  # "-0" would read back as 0
                text = ",".join(map(_columns.f32_text, values))
            return f"[{text}]", True
    dumps = compiled_dumps
    if dumps is not None:
        return dumps(values).decode(), False  # type: ignore[no-any-return]
    return f'[{("%r," * n)[:-1] % tuple(values)}]', False


class _Column:
    """One tag's valid points, validated and in order, written a slice at a time."""
    __slots__ = ("head", "values", "steps", "ms")

    def __init__(self, head: str, values: Sequence[float], steps: Optional[_Steps], ms: Any):
        """``steps``: None when no point has one; ``ms``: a ``_Millis`` or ``_RunMillis``."""
        self.head, self.values, self.steps, self.ms = head, values, steps, ms

    def json(self, start: int, most: int) -> Tuple[str, int, int]:
        """The column object of points ``start`` to at most ``start + most``: (JSON, points, latest ms).

        With a compiled writer importable (orjson, else msgspec: ``compiled_writer``), it writes the lists of
        integers (steps, ms) and of float64 values (a tenth of the cost): the same integers, and each float's
        shortest round-trip text, which is ``repr``'s except for some exponents (``0.00001`` for ``1e-05``,
        ``2.5e-7`` for ``2.5e-07``), so the same points decoded (tests/trainguard/test_columns.py compares
        each writer with %-formatting). float32 values are written to 9 digits by %-formatting, or in their
        shortest float32 text by orjson from a numpy array (``float32_writer``): the same float32 either way.
        """
        values = self.values
        end = len(values)
        if start or start + most < end:
            end = min(start + most, end)
            values = values[start:end]
        text, f32 = _float_list_json(values if type(values) is list else list(values))
        head = f'{self.head}"f32":true,"values":{text}' if f32 else f'{self.head}"values":{text}'
        steps = "" if self.steps is None else self.steps.text(start, end)
        ms, latest = self.ms.text(start, end)
        return f"{head}{steps}{ms}}}", end - start, latest
