"""Columns of numbers as compact bytes, every bit kept: what live windows keep in state (``transforms.window_state``).

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
  value is one (``loss.item()`` of a float32 tensor: by the differences of their
  bits, ordered as the values are, where that is smaller), else as float64.

The first byte of a column says how it is written, so a reader takes any of
them. Columns of more than ``FAST_SIZE`` numbers that fit 60 bits go through
numpy (``_fast_*``: the bytes are the same, a test compares them); others, and
numbers of any size, through plain Python.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import struct
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

MAX_DECIMALS = 9
_WIDTHS = ((0, ""), (1, "B"), (2, "H"), (4, "I"), (8, "Q"))
_FORMATS = dict(_WIDTHS)
_EXCEPTION_COST = 6  # bytes an exception takes, about: how many a narrower width may leave
_F64, _F32, _DECIMAL, _F32_BITS = 0, 1, 2, 3
FAST_SIZE = 200          # numpy pays from about this many numbers (measured: 20-35 µs a call against ~0.15 µs a number)
_FAST_LIMIT = 1 << 60    # numbers within this go through int64 arrays without overflowing a difference
_EXACT = float(1 << 53)  # integers within this are exact as float64
_U64 = 1 << 64


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


def zigzag_varints(data: bytes) -> List[int]:
    """Integers written as zigzag varints one after the other (``PointColumns`` version 1's steps)."""
    numbers, at = [], 0
    while at < len(data):
        number, at = _read_varint(data, at)
        numbers.append(number)
    return _unzigzag(numbers)


def _zigzag(numbers: Sequence[int]) -> List[int]:
    return [n << 1 if n >= 0 else (-n << 1) - 1 for n in numbers]


def _unzigzag(numbers: Sequence[int]) -> List[int]:
    return [(n >> 1) ^ -(n & 1) for n in numbers]


def _differences(numbers: Sequence[int]) -> List[int]:
    return list(map(operator.sub, itertools.islice(numbers, 1, None), numbers))


def _int64(numbers: Any) -> Optional[np.ndarray]:
    """The numbers as an int64 array where numpy pays and none is beyond ``_FAST_LIMIT``, else None."""
    if len(numbers) < FAST_SIZE:
        return None
    if isinstance(numbers, np.ndarray):
        array = numbers.astype(np.int64, copy=False)
    else:
        try:
            array = np.array(numbers, dtype=np.int64)
        except OverflowError:
            return None
    if array.size and (int(array.max()) >= _FAST_LIMIT or int(array.min()) <= -_FAST_LIMIT):
        return None
    return array


def _fast_zigzag(array: np.ndarray) -> np.ndarray:
    return ((array << 1) ^ (array >> 63)).view(np.uint64)


def pack_ints(numbers: Union[Sequence[int], np.ndarray], order: int = 1) -> bytes:
    """Integers of any size as bytes: differences of ``order`` (0-2), at one width with exceptions."""
    array = _int64(numbers)
    levels, rest = _grouped_differences(array if array is not None else [int(n) for n in numbers],
                                        [len(numbers)], order)
    seeds = [int(level[0]) for level in levels if len(level)]
    coded = _fast_zigzag(rest) if isinstance(rest, np.ndarray) else _zigzag(rest)
    out = bytearray((order,))
    _varint(len(numbers), out)
    for seed in _zigzag(seeds):
        _varint(seed, out)
    _pack_coded(coded, out)
    return bytes(out)


def _pack_coded(coded: Union[List[int], np.ndarray], out: bytearray) -> None:
    """Zigzagged differences at the width that costs least, the misfits apart."""
    if isinstance(coded, np.ndarray):  # uint64: every one fits 8 bytes
        array = coded
        width, limit = _width(len(array), lambda limit: int(np.count_nonzero(array >= limit)) if limit < _U64 else 0)
        misfit = array >= limit if limit < _U64 else np.zeros(len(array), dtype=bool)
        positions = np.flatnonzero(misfit)
        _pack_misfits(width, positions.tolist(), array[positions].tolist(), out)
        if width:
            out += np.where(misfit, np.uint64(0), array).astype(f"<u{width}").tobytes()
        return
    numbers = coded
    ordered = sorted(numbers)
    width, limit = _width(len(numbers), lambda limit: len(ordered) - bisect.bisect_left(ordered, limit))
    if ordered and ordered[-1] >= limit:
        misfits = [i for i, number in enumerate(numbers) if number >= limit]
        _pack_misfits(width, misfits, [numbers[i] for i in misfits], out)
        numbers = [n if n < limit else 0 for n in numbers]
    else:
        _pack_misfits(width, [], [], out)
    if width:
        out += struct.pack(f"<{len(numbers)}{_FORMATS[width]}", *numbers)


def _width(count: int, misfits_at: Callable[[int], int]) -> Tuple[int, int]:
    """(the width in bytes that costs least, the limit of a number written at it), given how many numbers do
    not fit below a limit; each misfit costs ``_EXCEPTION_COST``."""
    best = None
    for width, _ in _WIDTHS:
        limit = 1 << (8 * width)
        misfits = misfits_at(limit)
        cost = width * count + misfits * _EXCEPTION_COST
        if best is None or cost < best[0]:
            best = (cost, width, limit)
        if not misfits:
            break
    assert best is not None
    return best[1], best[2]


def _pack_misfits(width: int, positions: List[int], numbers: List[int], out: bytearray) -> None:
    out.append(width)
    _varint(len(positions), out)
    last = 0
    for position, number in zip(positions, numbers):
        _varint(position - last, out)
        _varint(number, out)
        last = position


def unpack_ints(data: bytes) -> List[int]:
    """The integers ``pack_ints`` wrote."""
    numbers = _unpack_ints(data, 0)[0]
    return numbers.tolist() if isinstance(numbers, np.ndarray) else numbers


def _unpack_ints(data: bytes, at: int) -> Tuple[Union[List[int], np.ndarray], int]:
    """(the integers, where they end): an int64 array where numpy pays and they fit, else a list."""
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
    fast = (size >= FAST_SIZE and width <= 4 and all(abs(seed) < _FAST_LIMIT for seed in seeds)
            and all(number < _FAST_LIMIT for _, number in exceptions))
    if fast:
        packed = np.frombuffer(data, dtype=f"<u{width}", count=size, offset=at).astype(np.int64) if width else (
            np.zeros(size, dtype=np.int64))
        at += width * size
        for position, number in exceptions:
            packed[position] = number
        array = (packed >> 1) ^ -(packed & 1)
        for seed in reversed(seeds):
            array = np.concatenate((np.array([seed], dtype=np.int64), array)).cumsum()
        return array, at
    if width:
        coded = list(struct.unpack_from(f"<{size}{_FORMATS[width]}", data, at))
        at += width * size
    else:
        coded = [0] * size
    for position, number in exceptions:
        coded[position] = number
    return _undifferenced(seeds, _unzigzag(coded)), at


def _undifferenced(seeds: Sequence[int], differences: List[int]) -> List[int]:
    """The numbers whose differences of order ``len(seeds)`` these are, ``seeds`` their first differences' first
    values (``_grouped_differences`` of one group, undone)."""
    for seed in reversed(seeds):
        differences = list(itertools.accumulate(differences, initial=seed))
    return differences


def split(values: Sequence[Any], sizes: Sequence[int]) -> List[Sequence[Any]]:
    """``values`` cut into consecutive groups of these sizes."""
    groups, start = [], 0
    for size in sizes:
        groups.append(values[start:start + size])
        start += size
    return groups


def _grouped_differences(values: Any, sizes: Sequence[int], order: int) -> Tuple[List[Any], Any]:
    """(per level k < ``order``, the k-th differences' first value of each group long enough; every group's
    differences of ``order`` within it, group after group)."""
    seeds = []
    if isinstance(values, np.ndarray) and len(values) < FAST_SIZE:
        values = values.tolist()
    if isinstance(values, np.ndarray):
        counts = np.asarray(sizes, dtype=np.int64)
        for _ in range(order):
            ends = np.cumsum(counts)
            filled = counts > 0
            seeds.append(values[(ends - counts)[filled]])
            keep = np.ones(max(len(values) - 1, 0), dtype=bool)
            inner = ends[filled]
            keep[inner[inner < len(values)] - 1] = False
            values = np.diff(values)[keep] if len(values) else values
            counts = np.maximum(counts - 1, 0)
        return seeds, values
    groups = split(list(values), sizes)
    levels: List[List[int]] = [[] for _ in range(order)]
    rest: List[int] = []
    for tail in groups:
        for k in range(min(order, len(tail))):
            levels[k].append(tail[0])
            tail = _differences(tail)
        rest += tail
    return levels, rest


def pack_grouped_ints(values: Union[Sequence[int], np.ndarray], sizes: Sequence[int], order: int = 2) -> bytes:
    """Groups of integers, one after the other (a tag's points, a window's: ``sizes`` says how many each), as
    bytes: each group's differences of ``order`` taken within it, and its first ``order`` values' seeds across
    the groups by their first differences (tags logged together start alike)."""
    array = _int64(values)
    seeds, rest = _grouped_differences(array if array is not None else values, sizes, order)
    return bytes((order,)) + b"".join([pack_ints(column, order=1) for column in seeds] + [pack_ints(rest, order=0)])


def unpack_grouped_ints(data: bytes, sizes: Optional[Sequence[int]] = None) -> List[int]:
    """The integers ``pack_grouped_ints`` wrote, one after the other, for groups of these sizes (None: one)."""
    numbers = _unpack_grouped_ints(data, sizes)
    return numbers.tolist() if isinstance(numbers, np.ndarray) else numbers


def _unpack_grouped_ints(data: bytes, sizes: Optional[Sequence[int]]) -> Union[List[int], np.ndarray]:
    """``unpack_grouped_ints``, as an int64 array where numpy pays and they fit."""
    if not data:
        return []
    order, at = data[0], 1
    seeds = []
    for _ in range(order):
        column, at = _unpack_ints(data, at)
        seeds.append(column)
    rest, _ = _unpack_ints(data, at)
    if sizes is None:
        sizes = [len(rest) + sum(len(column) for column in seeds)]
    if isinstance(rest, np.ndarray) and all(isinstance(column, np.ndarray) or all(
            abs(seed) < _FAST_LIMIT for seed in column) for column in seeds):
        return _fast_ungroup([np.asarray(column, dtype=np.int64) for column in seeds], rest, sizes)
    heads = [iter(column) for column in seeds]
    numbers: List[int] = []
    start = 0
    for size in sizes:
        depth = min(order, size)
        head = [int(next(heads[k])) for k in range(depth)]
        numbers += _undifferenced(head, [int(n) for n in rest[start:start + size - depth]])
        start += size - depth
    return numbers


def _fast_ungroup(seeds: List[np.ndarray], rest: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """``unpack_grouped_ints`` in numpy: each level's groups rebuilt at once, their seed put before them."""
    levels = [list(sizes)]
    for _ in seeds:
        levels.append([max(size - 1, 0) for size in levels[-1]])
    values = rest
    for k in reversed(range(len(seeds))):
        outer = levels[k]
        filled = np.asarray(outer) > 0
        # each filled group: its seed, then its inner values; the group's running sum gives the outer values
        starts = (np.cumsum(outer, dtype=np.int64) - outer)[filled]
        merged = np.zeros(int(sum(outer)), dtype=np.int64)
        is_seed = np.zeros(len(merged), dtype=bool)
        is_seed[starts] = True
        merged[is_seed] = seeds[k]
        merged[~is_seed] = values
        totals = np.cumsum(merged)
        base = np.repeat(totals[starts] - merged[starts], np.asarray(outer)[filled])
        values = totals - base  # an int64 sum may wrap around: the differences are right all the same
    return values


def _places_of(value: float) -> int:
    """The fewest decimal places that give back one value, or ``MAX_DECIMALS + 1``."""
    places = 0
    while places <= MAX_DECIMALS and round(value * 10 ** places) / 10 ** places != value:
        places += 1
    return places


def _as_decimals(values: List[float]) -> Tuple[int, Union[List[int], np.ndarray]]:
    """(d, the integers k with k / 10**d the values) for the fewest places d up to ``MAX_DECIMALS``; (-1, [])
    where there is none (an infinity, a NaN, -0.0, or more places)."""
    if len(values) >= FAST_SIZE:
        found = _fast_as_decimals(np.asarray(values, dtype=np.float64))
        if found is not None:
            return found
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


def _fast_as_decimals(array: np.ndarray) -> Optional[Tuple[int, Union[List[int], np.ndarray]]]:
    """``_as_decimals`` in numpy, or None where the integers are too large for it: those within 2**53 are exact
    as float64, and dividing two exact float64 values is correctly rounded, as Python's int division is."""
    if not np.isfinite(array).all() or np.signbit(array[array == 0]).any():
        return -1, []
    places = _places_of(float(array[0]))
    while places <= MAX_DECIMALS:
        scale = float(10 ** places)
        integers = np.rint(array * scale)
        if np.abs(integers).max() >= _EXACT:
            return None
        misfits = np.flatnonzero(integers / scale != array)
        if not len(misfits):
            return places, integers.astype(np.int64)
        places = max(places + 1, _places_of(float(array[misfits[0]])))
    return -1, []


def _binary_floats(values: Union[List[float], np.ndarray]) -> bytes:
    """Float32 where every value is one (as is, or its bits' differences where those are smaller: values of
    one metric close to each other), else float64; with the mode byte."""
    array = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        single = array.astype("<f4")
    if np.array_equal(single.astype(np.float64), array):
        bits = single.view("<u4").astype(np.int64)
        keys = np.where(bits < 0x8000_0000, bits, 0x7FFF_FFFF - bits)
        differences = bytes((_F32_BITS,)) + pack_ints(keys if len(keys) >= FAST_SIZE else keys.tolist(), order=1)
        raw = single.tobytes()
        return differences if len(differences) < len(raw) else bytes((_F32,)) + raw
    return bytes((_F64,)) + array.astype("<f8").tobytes()


def float64_column(values: Sequence[float]) -> bytes:
    """Floats as float64 bytes, as ``pack_floats`` writes those it cannot make smaller: quick to write and read."""
    return bytes((_F64,)) + struct.pack(f"<{len(values)}d", *values) if len(values) else b""


def pack_floats(values: Sequence[float], order: int = 1) -> bytes:
    """Floats as bytes, every bit kept: decimal integers (differences of ``order``), float32 or float64."""
    return pack_grouped_floats(values, [len(values)], order)


def unpack_floats(data: bytes) -> List[float]:
    """The floats ``pack_floats`` wrote."""
    return unpack_grouped_floats(data, None)


def pack_grouped_floats(values: Sequence[float], sizes: Sequence[int], order: int = 1) -> bytes:
    """Groups of floats, one after the other (``pack_grouped_ints``), as bytes, every bit kept: decimal integers
    by ``pack_grouped_ints``, float32 (its bits' differences or as is) or float64."""
    if not len(values):
        return b""
    column: Union[List[float], np.ndarray]
    if len(values) >= FAST_SIZE:
        column = np.asarray(values, dtype=np.float64)
        found = _fast_as_decimals(column)
        places, integers = found if found is not None else _as_decimals(column.tolist())
    else:
        column = [float(value) for value in values]
        places, integers = _as_decimals(column)
    decimal = None
    if places >= 0:
        decimal = bytes((_DECIMAL, places)) + pack_grouped_ints(integers, sizes, order)
        if len(decimal) <= 4 * len(column):
            return decimal
    binary = _binary_floats(column)
    return decimal if decimal is not None and len(decimal) < len(binary) else binary


def unpack_grouped_floats(data: bytes, sizes: Optional[Sequence[int]]) -> List[float]:
    """The floats ``pack_grouped_floats`` (or ``pack_floats``: ``sizes`` None) wrote, one after the other."""
    if not data:
        return []
    mode = data[0]
    if mode == _DECIMAL:
        scale = 10 ** data[1]
        integers = _unpack_grouped_ints(data[2:], sizes)
        if isinstance(integers, np.ndarray) and (not len(integers) or np.abs(integers).max() < _EXACT):
            return (integers.astype(np.float64) / float(scale)).tolist()
        return list(map(operator.truediv, (int(k) for k in integers), itertools.repeat(scale)))
    if mode == _F32:
        return np.frombuffer(data, dtype="<f4", offset=1).astype(np.float64).tolist()
    if mode == _F32_BITS:
        keys = np.asarray(_unpack_ints(data, 1)[0], dtype=np.int64)
        bits = np.where(keys >= 0, keys, 0x7FFF_FFFF - keys).astype("<u4")
        return bits.view("<f4").astype(np.float64).tolist()
    if mode == _F64:
        return np.frombuffer(data, dtype="<f8", offset=1).tolist()
    raise ValueError(f"unknown float column mode {mode}: written by a newer version of trainguard?")
