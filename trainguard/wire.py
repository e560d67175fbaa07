"""Wire contract v1: the one message format between trainers and the pipeline.

A message (one Pub/Sub message, or one line of a ``.jsonl`` replay file) is a
UTF-8 JSON object::

    {"schema": "trainguard/v1", "id": "...", "test": "...", "run": "...",
     "points": [{"tag": "loss", "value": 0.1, "step": 10, "time": 1763700000.25}],
     "events": [{"type": "run_finished", "time": 1763703590.0,
                 "data": {"status": "success", "num_failures": 0}}]}

Minor version 1.1 (``"schema": "trainguard/v1.1"``, ``SCHEMA_V1_1``) is v1
plus ``columns``: a tag's points as columns of values, step deltas and
millisecond time deltas, about 17 bytes a point instead of about 70 (see
``point_columns``). Both decode into the same ``Point`` tuples.

This module is shared by both sides and imports nothing outside the standard
library, so trainers can install it without Apache Beam. ``encode_message``
builds messages; ``parse_message`` validates one payload and splits it into the
good part and per-item rejections, so that one bad point never costs the rest
of its message.
"""

from __future__ import annotations

import collections.abc
import itertools
import json
import math
import operator
import uuid

try:  # 3x faster decoding where available (it comes with apache-beam); the stdlib is the fallback
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - trainer installs without orjson
    _fast_loads = None  # type: ignore[assignment]
try:  # the common shape of a message in one compiled pass, where the pipeline installed msgspec
    from trainguard import _fast_points
except ImportError:  # pragma: no cover - trainer installs without msgspec
    _fast_points = None  # type: ignore[assignment]
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

SCHEMA = "trainguard/v1"
SCHEMA_V1_1 = "trainguard/v1.1"  # v1 plus "columns" (see point_columns); a v1 pipeline dead-letters it
SCHEMAS = (SCHEMA, SCHEMA_V1_1)

RUN_STARTED = "run_started"
RUN_FINISHED = "run_finished"
ELASTIC_RESTART = "elastic_restart"  # data {"restart_count": n}: torchelastic restarted the workers n times
STATUS_SUCCESS, STATUS_FAILURE, STATUS_TIMEOUT = "success", "failure", "timeout"
FINISHED_STATUSES = (STATUS_SUCCESS, STATUS_FAILURE, STATUS_TIMEOUT)

# Pub/Sub message attributes set by publishers. ``ts`` is the message's event
# time (the latest point or event time in it) in milliseconds since the epoch:
# the pipeline's watermark follows it, so it must describe the data, not the
# moment of publishing (a shipper back-filling old logs sends old ``ts``).
ATTR_SCHEMA = "schema"
ATTR_TEST = "test"
ATTR_RUN = "run"
ATTR_TS = "ts"
ATTR_ID = "id"  # the message id again, for Dataflow's de-duplication (--pubsub_id_attribute=id)

# Sizes past which input is "absurd" and dead-lettered rather than processed.
MAX_MESSAGE_BYTES = 1 << 20
MAX_POINTS_PER_MESSAGE = 10_000
MAX_EVENTS_PER_MESSAGE = 100
MAX_NAME_CHARS = 256
MAX_EVENT_DATA_BYTES = 16 << 10
MAX_EVENT_DATA_DEPTH = 32  # objects and lists inside event data; deeper nesting is dead-lettered
# Event times must be plausible unix seconds: after 2000-01-01, before 2200.
MIN_TIME = 946684800.0
MAX_TIME = 7258118400.0
MAX_STEP = (1 << 63) - 1  # the store's BIGINT
MAX_WORLD_SIZE = 1 << 20  # workers of one run
# num_failures and restart_count: job_history.num_failures is a BIGINT, but 2**31 restarts is no real job, and a
# count that fits 32 bits fits every reader of the table (an INT32, a JavaScript number) exactly.
MAX_FAILURES = (1 << 31) - 1


# A point is a plain tuple (tag, value, step, time): a million of them per replay
# are built and compared, and plain tuples are several times cheaper than named ones.
Point = Tuple[str, float, Optional[int], float]
POINT_TIME = operator.itemgetter(3)  # a Point's time


class PointColumn(NamedTuple):
    """The points of one v1.1 column, every one valid, kept as the lists they came in (see ``MessagePoints``)."""
    tag: str
    values: List[float]
    steps: Optional[List[int]]  # None: no point has a step
    times: List[float]
    first: float  # the earliest of ``times``
    last: float  # the latest

    def points(self) -> Iterator[Point]:
        return zip(itertools.repeat(self.tag), self.values,
                   itertools.repeat(None) if self.steps is None else self.steps, self.times)


class MessagePoints(collections.abc.Sequence):
    """A message's valid points in the parts they came in: tuples of ``Point`` and ``PointColumn``s, so that a
    reader of whole columns (``core.parse.summarize``) builds no tuple per point. As a sequence it is the tuple of
    its points, in order (made when first asked for), and it equals that tuple."""
    __slots__ = ("parts", "_points", "_time_range")

    def __init__(self, parts: Iterable[Any]):
        self.parts: Tuple[Any, ...] = tuple(parts)  # each a non-empty tuple of Point or a PointColumn
        self._points: Optional[Tuple[Point, ...]] = None
        self._time_range: Optional[Tuple[float, float]] = None

    @staticmethod
    def of_points(points: Tuple[Point, ...], time_range: Optional[Tuple[float, float]]) -> MessagePoints:
        """Single points, their time range known."""
        made = MessagePoints((points,))
        made._points, made._time_range = points, time_range
        return made

    def as_tuple(self) -> Tuple[Point, ...]:
        if self._points is None:
            self._points = tuple(itertools.chain.from_iterable(
                part.points() if isinstance(part, PointColumn) else part for part in self.parts))
        return self._points

    def __len__(self) -> int:
        return sum(len(part.values) if isinstance(part, PointColumn) else len(part) for part in self.parts)

    def __bool__(self) -> bool:
        return bool(self.parts)  # (every part holds a point)

    def __getitem__(self, index):
        return self.as_tuple()[index]

    def __iter__(self) -> Iterator[Point]:
        return iter(self.as_tuple())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessagePoints):
            return self.as_tuple() == other.as_tuple()
        if isinstance(other, tuple):
            return self.as_tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __reduce__(self):
        return MessagePoints, (self.parts,)

    def time_range(self) -> Optional[Tuple[float, float]]:
        """(earliest, latest) time of the points; None for none."""
        if self._time_range is None and self.parts:
            spans = [(part.first, part.last) if isinstance(part, PointColumn) else time_range(part)
                     for part in self.parts]
            self._time_range = min(low for low, _ in spans), max(high for _, high in spans)  # type: ignore[misc]
        return self._time_range


def point_parts(points: Sequence[Point]) -> Tuple[Any, ...]:
    """The parts of a message's points (``MessagePoints.parts``); plain points are one part."""
    return points.parts if isinstance(points, MessagePoints) else (points,)


def time_range(points: Sequence[Point]) -> Optional[Tuple[float, float]]:
    """(earliest, latest) time of a message's points; None for none."""
    if isinstance(points, MessagePoints):
        return points.time_range()
    if not points:
        return None
    times = list(map(POINT_TIME, points))
    return min(times), max(times)


class Event(NamedTuple):
    type: str
    time: float
    data: Dict[str, Any]


TRIAGE_ACCEPT, TRIAGE_DISMISS, TRIAGE_MUTE = "accept", "dismiss", "mute"
TRIAGE_ACTIONS = (TRIAGE_ACCEPT, TRIAGE_DISMISS, TRIAGE_MUTE)
MAX_NOTE_CHARS = 2000
_TRIAGE_FIELDS = {  # field -> the actions that take it (all others must leave it out)
    "action": TRIAGE_ACTIONS, "time": TRIAGE_ACTIONS, "note": TRIAGE_ACTIONS, "user": TRIAGE_ACTIONS,
    "metric": TRIAGE_ACTIONS, "run": (TRIAGE_ACCEPT, TRIAGE_DISMISS),
    "alert_id": (TRIAGE_DISMISS,), "alert_kind": (TRIAGE_DISMISS,), "instance": (TRIAGE_DISMISS,),
    "until": (TRIAGE_MUTE,), "future": (TRIAGE_ACCEPT,),
}
_TRIAGE_REQUIRED = {TRIAGE_ACCEPT: ("metric", "run"), TRIAGE_DISMISS: ("alert_id", "alert_kind", "run"),
                    TRIAGE_MUTE: ("until",)}


class Triage(NamedTuple):
    """A user's word on alerts and baselines (a control message; see ``parse_message``).

    ``accept``: ``metric`` of the test moved on purpose from ``run`` on (its baseline restarts there; ``future``:
    ``run`` is still going or still to come, so the pipeline waits for it instead of refusing a run it has not seen);
    ``dismiss``: alert ``alert_id`` (of ``alert_kind``, on ``run``, ``metric``, ``instance``) was a false
    positive (its value joins the history as normal); ``mute``: the test's alerts (of ``metric`` only, if
    given) from ``time`` until ``until`` are recorded as muted and not sent.
    """
    action: str
    time: float
    metric: Optional[str] = None
    run: Optional[str] = None
    alert_id: Optional[str] = None
    alert_kind: Optional[str] = None
    instance: Optional[str] = None
    until: Optional[float] = None
    note: str = ""
    user: str = ""
    future: bool = False


class Message(NamedTuple):
    """A validated message: only well-formed points and events remain.

    A control message carries ``triage`` instead, with no points or events
    (and ``run`` empty unless the action names one).
    """
    id: str
    test: str
    run: str
    points: Sequence[Point]  # a tuple, or the ``MessagePoints`` of a message with columns
    events: Tuple[Event, ...]
    triage: Optional[Triage] = None
    rank: Optional[int] = None        # the worker that sent it (RANK); None: not said (a single process)
    world_size: Optional[int] = None  # how many workers the run has (WORLD_SIZE); None: not said

    @property
    def event_time(self) -> float:
        """The latest point or event time: the message's place in event time."""
        if self.triage is not None:
            return self.triage.time
        span = time_range(self.points)
        if span is not None and not self.events:
            return span[1]
        return max(itertools.chain(() if span is None else (span[1],), (e.time for e in self.events)))


class Rejection(NamedTuple):
    """One rejected item: why, and the raw JSON of what was rejected (None: only the whole message holds it)."""
    reason: str
    payload: Optional[str]


class InvalidMessage(ValueError):
    """The payload as a whole is unusable; ``str(error)`` is the reason."""


def parse_message(payload: bytes) -> Tuple[Message, List[Rejection]]:
    """Validates one raw payload.

    Returns the message with its valid points and events, plus one rejection
    per invalid point or event. Raises ``InvalidMessage`` when the message
    itself is unusable (not JSON, wrong schema, bad envelope fields, too big,
    or nothing valid left in it).
    """
    if len(payload) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"message is {len(payload)} bytes, limit is {MAX_MESSAGE_BYTES}")
    fast = fast_decode(payload) if _fast_points is not None else None
    if fast is not None:
        return parse_message_object(*fast)
    return parse_message_object(decode_json(payload), None)


def fast_decode(payload: bytes) -> Optional[Tuple[Dict[str, Any], Sequence[Point]]]:
    """The envelope and points of a message of points or v1.1 columns whose every point is valid (see
    ``_fast_points``): the points with their time range, found on the way, kept, or each column kept whole
    (``MessagePoints``)."""
    decoded = _fast_points.decode(payload, MAX_NAME_CHARS, MIN_TIME, MAX_TIME, MAX_STEP, MAX_POINTS_PER_MESSAGE,
                                  SCHEMA_V1_1)
    if decoded is None:
        return None
    envelope, points, span, columns = decoded
    if columns:
        parts = [_columns.typed_column(c.tag, c.values, c.steps, c.ms, c.f32) for c in columns]
        if None in parts:
            return None  # a point out of range, or a bad column: the general path says which
        return envelope, MessagePoints(parts)
    return envelope, MessagePoints.of_points(tuple(points), span) if points else ()


def parse_message_object(obj: Any, valid_points: Optional[Sequence[Point]]) -> Tuple[Message, List[Rejection]]:
    """``parse_message`` of the decoded payload; ``valid_points``: its points, already checked."""
    if not isinstance(obj, dict):
        raise InvalidMessage(f"not a JSON object but {type(obj).__name__}")
    schema = obj.get("schema")
    if schema not in SCHEMAS:
        raise InvalidMessage(f"schema is {schema!r}, expected {SCHEMA!r} or {SCHEMA_V1_1!r}")
    message_id = _require_name(obj, "id")
    test = _require_name(obj, "test")
    if "triage" in obj:
        return _parse_control(obj, message_id, test), []
    run = _require_name(obj, "run")
    rank, world_size = _parse_rank(obj)
    raw_points = _optional_list(obj, "points", MAX_POINTS_PER_MESSAGE)
    raw_events = _optional_list(obj, "events", MAX_EVENTS_PER_MESSAGE)
    raw_columns = _raw_columns(obj, schema, len(raw_points))

    rejections: List[Rejection] = []
    context = (message_id, test, run)
    all_points: Sequence[Point] = (valid_points if valid_points is not None
                                   else tuple(_parse_each(raw_points, parse_point, "point", context, rejections)))
    if raw_columns:
        all_points = MessagePoints([*([tuple(all_points)] if all_points else []),
                                    *_parse_columns(raw_columns, context, rejections)])
    events: List[Event] = _parse_each(raw_events, _parse_event, "event", context, rejections)
    if not all_points and not events and not rejections:
        raise InvalidMessage("message carries no points and no events")
    return Message(message_id, test, run, all_points, tuple(events), None, rank, world_size), rejections


def _parse_rank(obj: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    """The optional ``rank`` and ``world_size`` of a message from one worker of a distributed run."""
    rank, world_size = obj.get("rank"), obj.get("world_size")
    for field, value, low in (("rank", rank, 0), ("world_size", world_size, 1)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not low <= value <= MAX_WORLD_SIZE):
            raise InvalidMessage(f"{field} must be an integer from {low} to {MAX_WORLD_SIZE}, got {value!r}")
    if world_size is not None and rank is None:
        raise InvalidMessage("world_size needs rank")
    if world_size is not None and rank is not None and rank >= world_size:
        raise InvalidMessage(f"rank {rank} is not below world_size {world_size}")
    return rank, world_size


def _parse_control(obj: Dict[str, Any], message_id: str, test: str) -> Message:
    """A control message: ``{"schema", "id", "test", "triage": {...}}`` and nothing else."""
    extra = sorted(set(obj) - {"schema", "id", "test", "triage"})
    if extra:
        raise InvalidMessage(f"a triage message carries only schema, id, test and triage, not {extra}")
    raw = obj["triage"]
    if not isinstance(raw, dict):
        raise InvalidMessage(f"triage must be an object, got {type(raw).__name__}")
    action = raw.get("action")
    if action not in TRIAGE_ACTIONS:
        raise InvalidMessage(f"triage.action must be one of {list(TRIAGE_ACTIONS)}, got {action!r}")
    unknown = sorted(k for k in raw if action not in _TRIAGE_FIELDS.get(k, ()))
    if unknown:
        raise InvalidMessage(f"triage {action} does not take {unknown}")
    for field in _TRIAGE_REQUIRED[action]:
        if raw.get(field) is None:
            raise InvalidMessage(f"triage {action} needs {field!r}")
    try:
        fields: Dict[str, Any] = {"action": action, "time": _check_time(raw.get("time"))}
        for field in ("metric", "run", "alert_id", "alert_kind", "instance", "user"):
            if raw.get(field) is not None:
                fields[field] = check_name(raw[field], f"triage.{field}")
        if raw.get("until") is not None:
            fields["until"] = _check_time(raw["until"])
            if fields["until"] <= fields["time"]:
                raise ValueError("triage.until must be after triage.time")
        note = raw.get("note", "")
        if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
            raise ValueError(f"triage.note must be a string of at most {MAX_NOTE_CHARS} characters")
        fields["note"] = note
        future = raw.get("future", False)
        if not isinstance(future, bool):
            raise ValueError(f"triage.future must be true or false, got {future!r}")
        fields["future"] = future
    except ValueError as e:
        raise InvalidMessage(str(e)) from None
    triage = Triage(**fields)
    return Message(message_id, test, triage.run or "", (), (), triage)


def encode_triage(test: str, triage: Triage, message_id: Optional[str] = None) -> bytes:
    """One control message as compact UTF-8 JSON bytes (fields left at their defaults are left out)."""
    body = {k: v for k, v in triage._asdict().items() if v is not None and v != "" and v is not False}
    message = {"schema": SCHEMA, "id": message_id or new_message_id(), "test": test, "triage": body}
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _parse_each(raws: list, parse, kind: str, context: Tuple[str, str, str], rejections: List[Rejection]) -> list:
    """Parses every item; each invalid one becomes a rejection instead."""
    parsed = []
    for index, raw in enumerate(raws):
        try:
            parsed.append(parse(raw))
        except ValueError as e:
            rejections.append(_rejection(f"invalid {kind} [{index}]: {e}", *context, kind, raw))
    return parsed


def decode_json(payload: bytes) -> Any:
    """Strict UTF-8 JSON; NaN and Infinity literals decode (and are rejected per point later)."""
    if _fast_loads is not None:
        try:
            return _fast_loads(payload)
        except ValueError:
            pass  # not strict JSON: let the stdlib decode NaN literals or explain the error
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidMessage(f"not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidMessage(f"not JSON: {e}") from None



def _rejection(reason: str, message_id: str, test: str, run: str, kind: str, raw: Any) -> Rejection:
    context = {"id": message_id, "test": test, "run": run, kind: raw}
    try:
        return Rejection(reason, json.dumps(context, sort_keys=True, default=repr))
    except RecursionError:  # too deep to re-encode: the whole message's payload stands for it
        return Rejection(reason, None)


def nesting_depth(value: Any, limit: int) -> int:
    """How deep objects and lists nest in a decoded JSON value (a scalar: 0), counted without
    recursion; stops counting past ``limit``."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _require_name(obj: Dict[str, Any], field: str) -> str:
    value = obj.get(field)
    if value is None:
        raise InvalidMessage(f"missing field {field!r}")
    try:
        return check_name(value, field)
    except ValueError as e:
        raise InvalidMessage(str(e)) from None


def check_name(value: Any, field: str) -> str:
    """A name (test, run, id, tag, event type): a short non-empty printable string."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{field} must have 1 to {MAX_NAME_CHARS} characters, got {len(value)}")
    if not value.isprintable():
        raise ValueError(f"{field} contains control characters")
    return value


def _optional_list(obj: Dict[str, Any], field: str, limit: int) -> list:
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidMessage(f"{field} must be a list, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidMessage(f"{field} has {len(value)} items, limit is {limit}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_time(value: Any) -> float:
    """A plausible time as a float. The range is checked before ``float()``: an int compares with a float
    exactly at any size, while ``float()`` of an int past 1.8e308 raises OverflowError, which is no ValueError
    and would dead-letter the whole message instead of this one item."""
    if not _is_number(value):
        raise ValueError(f"time must be a number, got {type(value).__name__}")
    if not MIN_TIME <= value < MAX_TIME:  # also rejects NaN
        raise ValueError(f"time {value!r} is not plausible unix seconds")
    return float(value)


_POINT_FIELDS = frozenset(("tag", "value", "step", "time"))


def point_value(raw: Any) -> float:
    """A point's value as a finite float (an integer widened); ValueError saying what is wrong with it."""
    kind = type(raw)
    if kind is int:
        try:
            value = float(raw)
        except OverflowError:
            raise ValueError("value is out of float range") from None
    elif kind is float:
        value = raw
    else:
        raise ValueError(f"value must be a number, got {kind.__name__}")
    if not math.isfinite(value):
        raise ValueError(f"value is {value}")
    return value


def parse_point(raw: Any) -> Point:
    # The hot loop of the pipeline (one call per point): plain type checks on the
    # common shapes first, the detailed diagnosis only for what fails them.
    if type(raw) is not dict:
        raise ValueError(f"not an object but {type(raw).__name__}")
    tag, value, time, step = raw.get("tag"), raw.get("value"), raw.get("time"), raw.get("step")
    if type(tag) is not str or not 0 < len(tag) <= MAX_NAME_CHARS or not tag.isprintable():
        tag = check_name(tag, "tag")
    if type(value) is not float or not math.isfinite(value):
        value = point_value(value)
    if type(time) is not float or not MIN_TIME <= time < MAX_TIME:
        time = _check_time(time)
    if step is not None and (type(step) is not int or not 0 <= step <= MAX_STEP):
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"step must be an integer, got {type(step).__name__}")
        raise ValueError(f"step {step} is out of range")
    if len(raw) > 3 and not raw.keys() <= _POINT_FIELDS:
        raise ValueError(f"unknown fields {sorted(raw.keys() - _POINT_FIELDS)}")
    return (tag, value, step, time)


def _parse_event(raw: Any) -> Event:
    if not isinstance(raw, dict):
        raise ValueError(f"not an object but {type(raw).__name__}")
    event_type = check_name(raw.get("type"), "type")
    time = _check_time(raw.get("time"))
    data = raw.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"data must be an object, got {type(data).__name__}")
    if nesting_depth(data, MAX_EVENT_DATA_DEPTH) > MAX_EVENT_DATA_DEPTH:
        raise ValueError(f"data is nested deeper than {MAX_EVENT_DATA_DEPTH} levels")
    if data and len(json.dumps(data)) > MAX_EVENT_DATA_BYTES:  # (an empty object is 2 bytes)
        raise ValueError(f"data is larger than {MAX_EVENT_DATA_BYTES} bytes")
    if event_type == RUN_FINISHED:
        status = data.get("status")
        if status not in FINISHED_STATUSES:
            raise ValueError(f"run_finished status must be one of {list(FINISHED_STATUSES)}, got {status!r}")
        _check_count(data.get("num_failures", 0), "num_failures")
    elif event_type == ELASTIC_RESTART and "restart_count" in data:
        _check_count(data["restart_count"], "restart_count")
    return Event(event_type, time, data)


def _check_count(value: Any, field: str) -> int:
    """A count of failures or restarts, from 0 to ``MAX_FAILURES``: the run's ``num_failures`` is the largest of
    them, so one past the store's column would fail the run's row (and, in a replay, the whole replay)."""
    if type(value) is not int or not 0 <= value <= MAX_FAILURES:
        raise ValueError(f"{field} must be an integer from 0 to {MAX_FAILURES}, got {value!r}")
    return value


def new_message_id() -> str:
    return uuid.uuid4().hex


def point_dict(tag: str, value: float, time: float, step: Optional[int] = None) -> Dict[str, Any]:
    point: Dict[str, Any] = {"tag": tag, "value": value, "time": time}
    if step is not None:
        point["step"] = step
    return point


def event_dict(event_type: str, time: float, data: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"type": event_type, "time": time, "data": dict(data or {})}


def encode_message(test: str, run: str, points: Sequence[Dict[str, Any]] = (),
                   events: Sequence[Dict[str, Any]] = (), message_id: Optional[str] = None,
                   rank: Optional[int] = None, world_size: Optional[int] = None, schema: str = SCHEMA) -> bytes:
    """One wire message as compact UTF-8 JSON bytes (points/events as dicts; rank and world_size when known).

    With ``schema=SCHEMA_V1_1`` the points travel as ``columns`` (``point_columns``; times in whole milliseconds).
    """
    if schema not in SCHEMAS:
        raise ValueError(f"schema must be one of {SCHEMAS}, got {schema!r}")
    message: Dict[str, Any] = {"schema": schema, "id": message_id or new_message_id(),
                               "test": test, "run": run}
    if rank is not None:
        message["rank"] = rank
    if world_size is not None:
        message["world_size"] = world_size
    if points and schema == SCHEMA_V1_1:
        message["columns"] = point_columns(points)
    elif points:
        message["points"] = list(points)
    if events:
        message["events"] = list(events)
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")


def event_time_millis(points: Iterable[Dict[str, Any]], events: Iterable[Dict[str, Any]]) -> int:
    """The ``ts`` attribute for a message holding these points and events."""
    times = [p["time"] for p in points] + [e["time"] for e in events]
    return int(max(times) * 1000)


def message_attributes(test: str, run: str, ts_millis: int, message_id: str,
                       schema: str = SCHEMA) -> Dict[str, str]:
    """Pub/Sub attributes every publisher sets on a wire message (``schema``: the payload's)."""
    return {ATTR_SCHEMA: schema, ATTR_TEST: test, ATTR_RUN: run, ATTR_TS: str(ts_millis), ATTR_ID: message_id}


def point_columns(points: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Point dicts as v1.1 ``columns`` (see ``trainguard._columns``): one per tag, in the order tags appear."""
    return _columns.point_columns(points)


def _raw_columns(obj: Dict[str, Any], schema: str, other_points: int) -> list:
    return _columns.raw_columns(obj, schema, other_points)


def _parse_columns(columns: list, context: Tuple[str, str, str], rejections: List[Rejection]) -> List[Any]:
    return _columns.parse_columns(columns, context, rejections)


# The v1.1 columns live in a module of their own, which uses this one's helpers (hence imported last).
from . import _columns  # noqa: E402
