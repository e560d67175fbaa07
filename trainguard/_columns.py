"""Wire contract v1.1: a message's points as per-tag columns (``"columns"``).

One column holds points of one tag, in order::

    {"tag": "loss", "f32": true, "values": [2.30258512, 2.2991581, 2.29012299],
     "steps": [100, 1, 1], "ms": [1763700000123, 4, 3]}

``steps`` and ``ms`` are delta-encoded integers: each entry is the difference
from the previous one (the first from 0), so a point's step is the running
sum of ``steps`` and its time is the running sum of ``ms`` in milliseconds
since the epoch (``ms / 1000`` seconds). Each delta is an integer from
-(2**63 - 1) to 2**63 - 1 (``MAX_DELTA``), so a reader can sum them in int64.
A ``null`` step is a point without a step (the running sum goes on from the
last step). ``steps`` is left out when no point has one. ``f32: true`` says
every value is a float32 written in at most 9 significant digits (what a
float32 needs to round-trip: the trainer writes its shortest text that reads
back to it where numpy is importable, all 9 otherwise), and the reader rounds
each to the nearest float32: the value a trainer logged from a float32 tensor
(``loss.item()``) comes back bit for bit, in 11 characters or fewer instead of
17 to 19. At 1,000 points per
message a point costs about 17 bytes, against about 70 as a v1 point object.

Validation is v1's, point by point (``wire.parse_point``'s rules on the
rebuilt point): a bad value, step or time rejects its point alone. What
belongs to the column (not an object, a bad tag, unknown keys, lists of
different lengths) rejects the column as one dead letter. Both decode into the
same ``wire.Point`` tuples. Columns are checked vectorized (a type set, a sum,
a running sum, min and max per column) and only a column that fails that is
walked point by point for the reasons.
"""

from __future__ import annotations

import math
import operator
from array import array
from itertools import accumulate
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import wire

COLUMN_FIELDS = frozenset(("tag", "values", "steps", "ms", "f32"))
F32_DIGITS = 9  # significant digits that make every float32 round-trip
MIN_MS = int(wire.MIN_TIME * 1000)
MAX_MS = int(wire.MAX_TIME * 1000)
# The largest |delta| in ``steps`` or ``ms``: the difference of any two valid steps (or times) is within it, so a
# reader can sum a valid column's deltas in int64. A larger delta is a bad point and counts in no running sum,
# which so stays within 10,000 such deltas (a number short enough to print in a reason, unlike a sum of huge ones).
MAX_DELTA = wire.MAX_STEP
_FLOAT, _INT = frozenset((float,)), frozenset((int,))
_NUMBERS = frozenset((float, int))


def raw_columns(obj: Dict[str, Any], schema: str, other_points: int) -> list:
    """The message's ``columns`` list (empty if none); the envelope's rules, raising ``InvalidMessage``."""
    if "columns" not in obj:
        return []
    if schema != wire.SCHEMA_V1_1:
        raise wire.InvalidMessage(f"columns need schema {wire.SCHEMA_V1_1!r}, not {schema!r}")
    columns = wire._optional_list(obj, "columns", wire.MAX_POINTS_PER_MESSAGE)
    total = other_points + sum(len(c["values"]) for c in columns
                               if type(c) is dict and type(c.get("values")) is list)
    if total > wire.MAX_POINTS_PER_MESSAGE:
        raise wire.InvalidMessage(f"points and columns hold {total} points, limit is {wire.MAX_POINTS_PER_MESSAGE}")
    return columns


def parse_columns(columns: list, context: Tuple[str, str, str],
                  rejections: List[wire.Rejection]) -> List[Union[wire.PointColumn, Tuple[wire.Point, ...]]]:
    """The valid points of the columns, in order, as parts of ``wire.MessagePoints``: a ``PointColumn`` for a
    column whose every point is valid, a tuple of the valid points of one that has bad ones; a rejection per bad
    column or point."""
    parts: List[Union[wire.PointColumn, Tuple[wire.Point, ...]]] = []
    for index, raw in enumerate(columns):
        try:
            tag, values, steps, ms, f32 = _column(raw)
        except ValueError as e:
            rejections.append(wire._rejection(f"invalid column [{index}]: {e}", *context, "column", raw))
            continue
        fast = _fast_column(tag, values, steps, ms, f32)
        if fast is not None:
            parts.append(fast)
            continue
        points: List[wire.Point] = []
        _each_point(index, tag, values, steps, ms, f32, context, rejections, points)
        if points:
            parts.append(tuple(points))
    return parts


def _column(raw: Any) -> Tuple[str, list, Optional[list], list, bool]:
    if type(raw) is not dict:
        raise ValueError(f"not an object but {type(raw).__name__}")
    if not raw.keys() <= COLUMN_FIELDS:
        raise ValueError(f"unknown fields {sorted(raw.keys() - COLUMN_FIELDS)}")
    tag = wire.check_name(raw.get("tag"), "tag")
    values, steps, ms, f32 = raw.get("values"), raw.get("steps"), raw.get("ms"), raw.get("f32", False)
    for field, value in (("values", values), ("ms", ms), ("steps", [] if steps is None else steps)):
        if type(value) is not list:
            raise ValueError(f"{field} must be a list, got {type(value).__name__}")
    if not values:
        raise ValueError("a column needs at least one point")
    assert isinstance(ms, list)  # checked above
    if len(ms) != len(values) or (steps is not None and len(steps) != len(values)):
        raise ValueError(f"values, steps and ms must be as long, got {len(values)}, "
                         f"{'-' if steps is None else len(steps)} and {len(ms)}")
    if type(f32) is not bool:
        raise ValueError(f"f32 must be true or false, got {f32!r}")
    return tag, values, steps, ms, f32


def _fast_column(tag: str, values: list, steps: Optional[list], ms: list, f32: bool) -> Optional[wire.PointColumn]:
    """The column's points when all of them are valid (checked in C-speed passes), else None."""
    types = set(map(type, values))
    if types == _FLOAT:
        floats = values
    elif types <= _NUMBERS:
        try:
            floats = list(map(float, values))
        except OverflowError:
            return None
    else:
        return None
    if set(map(type, ms)) != _INT or (steps is not None and set(map(type, steps)) != _INT):
        return None
    return _column_in_range(tag, floats, steps, ms, f32)


def typed_column(tag: str, values: List[float], steps: Optional[List[int]], ms: List[int],
                 f32: bool) -> Optional[wire.PointColumn]:
    """The points of a column whose entries have their types (floats, and integer deltas within ``MAX_DELTA``, as
    ``trainguard._fast_points`` decodes them) when the column and all of its points are valid, else None."""
    try:
        wire.check_name(tag, "tag")
    except ValueError:
        return None
    if not values or len(ms) != len(values) or (steps is not None and len(steps) != len(values)):
        return None
    return _column_in_range(tag, values, steps, ms, f32)


def _column_in_range(tag: str, floats: List[float], steps: Optional[List[int]], ms: List[int],
                     f32: bool) -> Optional[wire.PointColumn]:
    """The points of a column of floats and integer deltas, when every value is finite (a float32, for ``f32``)
    and every time and step in range; else None."""
    if f32:
        floats = array("f", floats).tolist()  # past the float32 range: inf, caught below
    if not math.isfinite(sum(floats)):  # a finite sum means every value is finite (or it overflowed: walk)
        return None
    times = list(accumulate(ms))
    first, last = _least_and_most(times, ms)
    if first < MIN_MS or last >= MAX_MS:
        return None
    absolute = None
    if steps is not None:
        absolute, least, most = _step_sums(steps)
        if least < 0 or most > wire.MAX_STEP:
            return None
    return wire.PointColumn(tag, floats, absolute, [time / 1000 for time in times], first / 1000, last / 1000)


def _step_sums(deltas: List[int]) -> Tuple[List[int], int, int]:
    """The running sums of a column's step deltas, their least and their most: a range where, as a trainer logging
    a tag every step writes them, every delta after the first is 1 (two C-speed calls instead of a sum a point,
    and its ends are known)."""
    first, count = deltas[0], len(deltas)
    if deltas.count(1) - (first == 1) == count - 1:
        return list(range(first, first + count)), first, first + count - 1
    sums = list(accumulate(deltas))
    return (sums, *_least_and_most(sums, deltas))


def _least_and_most(sums: List[int], deltas: List[int]) -> Tuple[int, int]:
    """The least and the most of running ``sums`` of ``deltas``: the first and the last when no delta is negative
    (times and steps go up: one pass over the deltas instead of two over the sums), else a pass each."""
    if min(deltas) >= 0:
        return sums[0], sums[-1]
    return min(sums), max(sums)


def _delta_problem(raw: Any, field: str) -> Optional[str]:
    """What is wrong with one delta of ``steps`` or ``ms`` (``field``), or None: an integer from -MAX_DELTA to
    MAX_DELTA, which counts in its running sum."""
    if type(raw) is not int:
        return f"{field} must be an integer, got {type(raw).__name__}"
    if not -MAX_DELTA <= raw <= MAX_DELTA:
        return f"{field} delta must be an integer from {-MAX_DELTA} to {MAX_DELTA}, got {raw}"
    return None


def _each_point(index: int, tag: str, values: list, steps: Optional[list], ms: list, f32: bool,
                context: Tuple[str, str, str], rejections: List[wire.Rejection], points: List[wire.Point]) -> None:
    """Point by point, with the reason for each bad one (the running sums go on past it; a delta that is not
    an integer from -MAX_DELTA to MAX_DELTA counts in neither)."""
    step_sum = time_sum = 0
    for j, raw_value in enumerate(values):
        raw_step = None if steps is None else steps[j]
        raw_ms = ms[j]
        problem = None
        step: Any = raw_step
        time: Any = raw_ms
        problem = _delta_problem(raw_ms, "ms")
        if problem is None:
            time_sum += raw_ms
            time = time_sum
        if raw_step is not None:
            step_problem = _delta_problem(raw_step, "step")
            if step_problem is None:
                step_sum += raw_step
                step = step_sum
            problem = problem or step_problem
        try:
            value = _value(raw_value, f32)
        except ValueError as e:
            problem = str(e)
        if problem is None and not MIN_MS <= time < MAX_MS:
            problem = f"time {time} ms is not plausible unix milliseconds"
        if problem is None and step is not None and not 0 <= step <= wire.MAX_STEP:
            problem = f"step {step} is out of range"
        if problem is None:
            points.append((tag, value, step, time / 1000))
            continue
        point = {"tag": tag, "value": raw_value, "step": step, "ms": time}
        rejections.append(wire._rejection(f"invalid point [column {index}, {j}]: {problem}", *context,
                                          "point", point))


def _value(raw: Any, f32: bool) -> float:
    value = wire.point_value(raw)
    if f32:
        value = array("f", (value,))[0]
        if not math.isfinite(value):
            raise ValueError("value is out of float32 range")
    return value


# -- writing ------------------------------------------------------------------------


def f32_text(value: float) -> str:
    """A float32 value as the column writes it (9 significant digits; -0.0 keeps its sign)."""
    text = f"{value:.9g}"
    return "-0.0" if text == "-0" else text


def is_float32(values: Sequence[float]) -> bool:
    """Whether every value is exactly a float32 (then ``f32_text`` carries it in 9 digits)."""
    try:
        return array("f", values).tolist() == list(values)
    except (OverflowError, TypeError):
        return False


def deltas(numbers: Sequence[int]) -> List[int]:
    """The first number, then each one's difference from the one before."""
    return [numbers[0], *map(operator.sub, numbers[1:], numbers[:-1])]


def point_columns(points: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Point dicts (``wire.point_dict``, finite values, times to the millisecond) as v1.1 columns: one per
    tag in the order tags first appear, each tag's points in order (the reference ``MessageEncoder`` matches)."""
    by_tag: Dict[str, List[Dict[str, Any]]] = {}
    for point in points:
        by_tag.setdefault(point["tag"], []).append(point)
    columns = []
    for tag, group in by_tag.items():
        values = [float(p["value"]) for p in group]
        column: Dict[str, Any] = {"tag": tag}
        if is_float32(values):
            column["f32"] = True
            values = [float(f32_text(v)) for v in values]
        column["values"] = values
        steps = [p.get("step") for p in group]
        if any(step is not None for step in steps):
            column["steps"] = _step_deltas(steps)
        column["ms"] = deltas([round(p["time"] * 1000) for p in group])
        columns.append(column)
    return columns


def _step_deltas(steps: Sequence[Optional[int]]) -> List[Optional[int]]:
    out: List[Optional[int]] = []
    last = 0
    for step in steps:
        if step is None:
            out.append(None)
        else:
            out.append(step - last)
            last = step
    return out
