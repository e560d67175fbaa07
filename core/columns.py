"""Columns of numbers as compact bytes, every bit kept: what live windows keep in state (``core.windows``).

A run's windows keep points (time, step, value) in Dataflow state, which is
billed by the byte and read and written at every firing. As float64 bytes a
point is 17 bytes or more; most columns are far more regular than that:

- **Integers** (steps, indexes, counts) are written as differences of order 0,
  1 or 2 (a step column that goes up by one has second differences of 0),
  zigzagged, at one fixed width for the column (0, 1, 2, 4 or 8 bytes, packed
  by ``struct``, not a Python loop), with the few that do not fit the width
  written apart as exceptions (their position and value as varints): a jump
  between two tags' points costs its own bytes, not a wider column.
- **Floats** that are decimals of at most ``MAX_DECIMALS`` places (a time in
  milliseconds, a value logged to six significant digits) are written as those
  integers (``k / 10**d`` is the float again: Python's int division is
  correctly rounded, and every value is checked); others as float32 where every
  value is one (``loss.item()`` of a float32 tensor), else as float64.

Pure standard library, like the rest of core. The first byte of a column says
how it is written, so a reader takes any of them.
"""

from __future__ import annotations

import itertools
import math
import operator
import struct
from typing import List, Sequence, Tuple

MAX_DECIMALS = 9
_WIDTHS = ((0, ""), (1, "B"), (2, "H"), (4, "I"), (8, "Q"))
_EXCEPTION_COST = 6  # bytes an exception takes, about: how many a narrower width may leave
_F64, _F32, _DECIMAL = 0, 1, 2


def _varint(number: int, out: bytearray) -> None:
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)


def _read_varint(data: bytes, at: int) -> Tuple[int, int]:
    number, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        number |= (byte & 0x7F) << shift
        if byte < 0x80:
            return number, at
        shift += 7


def _zigzag(numbers: Sequence[int]) -> List[int]:
    return [n << 1 if n >= 0 else (-n << 1) - 1 for n in numbers]


def _unzigzag(numbers: Sequence[int]) -> List[int]:
    return [(n >> 1) ^ -(n & 1) for n in numbers]


def _differences(numbers: Sequence[int]) -> List[int]:
    return list(map(operator.sub, itertools.islice(numbers, 1, None), numbers))


def pack_ints(numbers: Sequence[int], order: int = 1) -> bytes:
    """Integers of any size as bytes: differences of ``order`` (0-2), at one width with exceptions."""
    numbers = list(numbers)
    out = bytearray((order,))
    _varint(len(numbers), out)
    seeds = []
    rest = numbers
    for _ in range(min(order, len(numbers))):
        seeds.append(rest[0])
        rest = _differences(rest)
    for seed in _zigzag(seeds):
        _varint(seed, out)
    coded = _zigzag(rest)
    best = None
    for width, fmt in _WIDTHS:
        limit = 1 << (8 * width)
        misfits = len(coded) - sum(map(limit.__gt__, coded))
        cost = width * len(coded) + misfits * _EXCEPTION_COST
        if best is None or cost < best[0]:
            best = (cost, width, fmt, limit, misfits)
        if not misfits:
            break
    assert best is not None
    _, width, fmt, limit, misfits = best
    out.append(width)
    _varint(misfits, out)
    if misfits:
        last = 0
        for position, number in enumerate(coded):
            if number >= limit:
                _varint(position - last, out)
                _varint(number, out)
                last = position
        coded = [number if number < limit else 0 for number in coded]
    if width:
        out += struct.pack(f"<{len(coded)}{fmt}", *coded)
    return bytes(out)


def unpack_ints(data: bytes) -> List[int]:
    """The integers ``pack_ints`` wrote."""
    return _unpack_ints(data, 0)[0]


def _unpack_ints(data: bytes, at: int) -> Tuple[List[int], int]:
    order = data[at]
    count, at = _read_varint(data, at + 1)
    seeds = []
    for _ in range(min(order, count)):
        seed, at = _read_varint(data, at)
        seeds.append(seed)
    seeds = _unzigzag(seeds)
    width = data[at]
    misfits, at = _read_varint(data, at + 1)
    exceptions = []
    position = 0
    for _ in range(misfits):
        gap, at = _read_varint(data, at)
        number, at = _read_varint(data, at)
        position += gap
        exceptions.append((position, number))
    size = count - len(seeds)
    if width:
        fmt = dict(_WIDTHS)[width]
        coded = list(struct.unpack_from(f"<{size}{fmt}", data, at))
        at += width * size
    else:
        coded = [0] * size
    for position, number in exceptions:
        coded[position] = number
    numbers = _unzigzag(coded)
    for seed in reversed(seeds):
        numbers = list(itertools.accumulate(numbers, initial=seed))
    return numbers, at


def pack_grouped_ints(groups: Sequence[Sequence[int]], order: int = 2) -> bytes:
    """Groups of integers (each a sequence of its own: a tag's points, a window's) as bytes, each group's
    differences of ``order`` taken within it and its first ``order`` values' seeds across the groups (by their
    first differences: tags logged together start alike). ``unpack_grouped_ints`` needs the groups' sizes."""
    seeds: List[List[int]] = [[] for _ in range(order)]
    rest: List[int] = []
    for group in groups:
        tail = list(group)
        for k in range(min(order, len(tail))):
            seeds[k].append(tail[0])
            tail = _differences(tail)
        rest += tail
    return bytes((order,)) + b"".join([pack_ints(column, order=1) for column in seeds] + [pack_ints(rest, order=0)])


def unpack_grouped_ints(data: bytes, sizes: Sequence[int]) -> List[List[int]]:
    """The groups ``pack_grouped_ints`` wrote, of these sizes."""
    if not data:
        return [[] for _ in sizes]
    order, at = data[0], 1
    seeds = []
    for _ in range(order):
        column, at = _unpack_ints(data, at)
        seeds.append(iter(column))
    rest, _ = _unpack_ints(data, at)
    groups, start = [], 0
    for size in sizes:
        depth = min(order, size)
        head = [next(seeds[k]) for k in range(depth)]
        numbers = rest[start:start + size - depth]
        start += size - depth
        for seed in reversed(head):
            numbers = list(itertools.accumulate(numbers, initial=seed))
        groups.append(numbers)
    return groups


def _places_of(value: float) -> int:
    """The fewest decimal places that give back one value, or ``MAX_DECIMALS + 1``."""
    places = 0
    while places <= MAX_DECIMALS and round(value * 10 ** places) / 10 ** places != value:
        places += 1
    return places


def _as_decimals(values: List[float]) -> Tuple[int, List[int]]:
    """(d, the integers k with k / 10**d the values) for the fewest places d up to ``MAX_DECIMALS``; (-1, [])
    where there is none (an infinity, a NaN, -0.0, or more places)."""
    try:
        places = _places_of(values[0])
        while places <= MAX_DECIMALS:
            scale = 10 ** places
            integers = [round(value * scale) for value in values]
            back = list(map(operator.truediv, integers, itertools.repeat(scale)))
            if back == values:
                if 0.0 in values and any(math.copysign(1.0, v) < 0 for v in values if v == 0.0):
                    break  # -0.0 is no integer's quotient
                return places, integers
            # a value needs more places: the values before it fit these, so they fit more too
            misfit = next(i for i, (got, value) in enumerate(zip(back, values)) if got != value)
            places = max(places + 1, _places_of(values[misfit]))
    except (OverflowError, ValueError):  # an infinity, a NaN
        pass
    return -1, []


def _binary_floats(values: List[float]) -> bytes:
    """Float32 where every value is one, else float64, with the mode byte."""
    try:
        single = struct.pack(f"<{len(values)}f", *values)
        if list(struct.unpack(f"<{len(values)}f", single)) == values:
            return bytes((_F32,)) + single
    except OverflowError:
        pass
    return bytes((_F64,)) + struct.pack(f"<{len(values)}d", *values)


def pack_floats(values: Sequence[float], order: int = 1) -> bytes:
    """Floats as bytes, every bit kept: decimal integers (differences of ``order``), float32 or float64."""
    values = [float(value) for value in values]
    if not values:
        return b""
    places, integers = _as_decimals(values)
    decimal = bytes((_DECIMAL, places)) + pack_ints(integers, order) if places >= 0 else None
    if decimal is not None and len(decimal) <= 4 * len(values):
        return decimal
    binary = _binary_floats(values)
    return decimal if decimal is not None and len(decimal) < len(binary) else binary


def unpack_floats(data: bytes) -> List[float]:
    """The floats ``pack_floats`` wrote."""
    if not data:
        return []
    mode = data[0]
    if mode == _DECIMAL:
        scale = 10 ** data[1]
        return list(map(operator.truediv, unpack_ints(data[2:]), itertools.repeat(scale)))
    if mode == _F32:
        return list(struct.unpack(f"<{(len(data) - 1) // 4}f", data[1:]))
    if mode == _F64:
        return list(struct.unpack(f"<{(len(data) - 1) // 8}d", data[1:]))
    raise ValueError(f"unknown float column mode {mode}: written by a newer version of trainguard?")


def pack_grouped_floats(groups: Sequence[Sequence[float]], order: int = 1) -> bytes:
    """Groups of floats as bytes, every bit kept: decimals by ``pack_grouped_ints``, else as ``pack_floats``."""
    values = [float(value) for group in groups for value in group]
    if not values:
        return b""
    places, integers = _as_decimals(values)
    decimal = None
    if places >= 0:
        split, start = [], 0
        for group in groups:
            split.append(integers[start:start + len(group)])
            start += len(group)
        decimal = bytes((_DECIMAL, places)) + pack_grouped_ints(split, order)
        if len(decimal) <= 4 * len(values):
            return decimal
    binary = _binary_floats(values)
    return decimal if decimal is not None and len(decimal) < len(binary) else binary


def unpack_grouped_floats(data: bytes, sizes: Sequence[int]) -> List[List[float]]:
    """The groups ``pack_grouped_floats`` wrote, of these sizes."""
    if data and data[0] == _DECIMAL:
        scale = 10 ** data[1]
        return [list(map(operator.truediv, group, itertools.repeat(scale)))
                for group in unpack_grouped_ints(data[2:], sizes)]
    values = unpack_floats(data)
    groups, start = [], 0
    for size in sizes:
        groups.append(values[start:start + size])
        start += size
    return groups
