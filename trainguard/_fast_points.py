"""The common shape of a message, decoded and validated in one compiled pass (msgspec).

Most messages are v1 points or v1.1 columns and nothing else, every point
valid. For those, :func:`decode` gives the envelope fields and the points as
``wire.Point`` tuples, or the columns as msgspec read them, their types
checked by msgspec's typed decoder (the ranges of the columns' values, times
and steps are ``wire.fast_decode``'s), instead of one Python call per point.
Anything else (events, a control message, an unknown key, one point that is
not plainly valid, text msgspec reads differently) gives None, and
``wire.parse_message`` takes its general path, which also says what is wrong
with each bad point.
So a message's result never depends on which path read it
(tests/trainguard/test_fast_points.py compares the two on random and hostile
payloads).

Optional: the pipeline installs msgspec; a trainer install does without.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

import msgspec

_MAX_INT64 = (1 << 63) - 1  # integers both JSON readers of the general path keep as ints (orjson: to 2**64 - 1)
_Delta = Annotated[int, msgspec.Meta(ge=-_MAX_INT64, le=_MAX_INT64)]  # a v1.1 column's step or ms delta


class _Point(msgspec.Struct, forbid_unknown_fields=True, gc=False):  # atoms only: no cycles to find
    tag: str
    value: float
    time: float
    step: Optional[int] = None


class Column(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A v1.1 column whose every entry has its type: a ``null`` step, a value that is not a number, a delta that
    is not an integer from -(2**63 - 1) to 2**63 - 1 fail the decoding (the general path says which point)."""
    tag: str
    values: List[float]  # (a JSON integer is read as the nearest float, as the general path's float() does)
    ms: List[_Delta]
    steps: Optional[List[_Delta]] = None
    f32: bool = False


class _Message(msgspec.Struct, forbid_unknown_fields=True):
    """The envelope as ``dict.get`` would read it (a missing field is None), each field typed as a valid
    message holds it.

    A value of another type fails the decoding, and the general path says what is wrong with it in its own
    words (orjson reads an integer past 64 bits as a float where msgspec reads an int: a reason quoting either
    would differ). So does an unknown key: msgspec would skip it and its value unread, their UTF-8 and their
    JSON unchecked, where the general path finds a byte that is not UTF-8 and dead-letters the whole line.
    """
    schema: Optional[str] = None
    id: Optional[str] = None
    test: Optional[str] = None
    run: Optional[str] = None
    rank: Optional[Annotated[int, msgspec.Meta(ge=0, le=_MAX_INT64)]] = None
    world_size: Optional[Annotated[int, msgspec.Meta(ge=0, le=_MAX_INT64)]] = None
    points: Optional[List[_Point]] = None
    events: Any = None
    columns: Union[List[Column], None, msgspec.UnsetType] = msgspec.UNSET
    triage: Any = msgspec.UNSET


_DECODER = msgspec.json.Decoder(_Message)


def decode(payload: bytes, max_name_chars: int, min_time: float, max_time: float, max_step: int, max_points: int,
           columns_schema: str) -> Optional[Tuple[Dict[str, Any], List[Tuple[str, float, Optional[int], float]],
                                                 Optional[Tuple[float, float]], List[Column]]]:
    """(envelope fields, valid points, their earliest and latest time or None, columns) of a message of points
    whose every point is valid, or of ``columns_schema`` columns whose every entry has its type, at most
    ``max_points`` in all; else None."""
    try:
        message = _DECODER.decode(payload)
    except (msgspec.MsgspecError, ValueError):  # ValueError: invalid UTF-8
        return None
    if (message.events is not None and message.events != []) or message.triage is not msgspec.UNSET:
        return None
    columns: List[Column] = []
    if message.columns is not msgspec.UNSET:
        columns = message.columns or []
        if not columns or message.points or message.schema != columns_schema \
                or sum(len(column.values) for column in columns) > max_points:
            return None
    points = [(p.tag, p.value, p.step, p.time) for p in message.points or ()]
    span = None
    if points:
        tags, values, steps, times = zip(*points)
        for tag in set(tags):
            if not 0 < len(tag) <= max_name_chars or not tag.isprintable():
                return None
        try:
            if not math.isfinite(math.fsum(values)):  # a NaN or infinity (or an overflowing sum: the general path)
                return None
        except OverflowError:
            return None
        span = min(times), max(times)
        if not (min_time <= span[0] and span[1] < max_time):
            return None
        if None in steps:
            steps = tuple(s for s in steps if s is not None)
        if steps and (min(steps) < 0 or max(steps) > max_step):  # msgspec took no bool for an int
            return None
    envelope = {"schema": message.schema, "id": message.id, "test": message.test, "run": message.run,
                "rank": message.rank, "world_size": message.world_size, "points": points}
    return envelope, points, span, columns
