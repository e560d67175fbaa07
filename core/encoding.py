"""The encoding of everything a running job keeps: versioned, schema'd, owned by trainguard, no pickles.

State that lives in a running Dataflow job is a file format: a job updated in
place (``--update``) reads the state, the side inputs and the in-flight
shuffle data that the old code wrote. This module writes them by the stable
names, schema versions and fields of ``core.registry`` (where types register,
and where the rules for changing them are), never as pickles, which name
module paths and class layouts. Decoding takes today's classes: fields added
since take their defaults, fields removed are ignored, older schema versions
go through their upgrades, newer ones are refused.

**The format** (msgpack): ``[FORMAT_VERSION, types, body]``. ``types`` lists,
in order of first use, each type the value holds as ``[name, version,
[field, ...]]`` (``None`` for an enum's fields): field names are written once
per value, not once per record. ``body`` is the value as msgpack: ``None``,
``bool``, ``int``, ``float`` (8 bytes: every bit kept, ``-0.0`` and NaNs
included), ``str``, ``bytes``, ``list`` and ``dict`` (any keys) as themselves;
everything else (a record, a tuple, a set, a deque) as an array led by a mark,
an extension value saying what the array holds (``Ext``), and an int beyond
64 bits as an extension value of its own. It is deterministic: the same
value always gives the same bytes (sets are written sorted; a dict keeps its
order, which is part of its value here, so equal dicts built in different
orders give different bytes).
"""

from __future__ import annotations

import base64
import collections
import enum
import json
import operator
import struct
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import msgpack  # no type information shipped: Any (mypy.ini ignores missing imports)

from core.registry import (  # noqa: F401 - the registry's names, re-exported for the encoding's users
    ENUM,
    REGISTRY,
    STATE,
    EncodingError,
    IncompatibleVersion,
    RecordType,
    Registry,
    also_load,
    load_registry,
    plain_tuple,
    record,
    register,
    registered,
)

FORMAT_VERSION = 1
PACK_BUFFER_BYTES = 4096  # msgpack grows its buffer as needed; its default (256 KiB) is a large allocation per value


class Ext(enum.IntEnum):
    """msgpack extension codes. All but BIGINT are marks: the first item of an array that holds a value
    msgpack has no type for (the mark's data is empty, or a record's type index, big-endian)."""
    RECORD = 1     # [mark(type index), field values in the order of the type's entry]; an enum: [mark, value]
    TUPLE = 2      # [mark, items...]
    SET = 3        # [mark, items..., sorted]
    FROZENSET = 4  # [mark, items..., sorted]
    DEQUE = 5      # [mark, maxlen or None, items...]
    BIGINT = 7     # an int beyond 64 bits, itself: signed big-endian bytes


# -- encoding ----------------------------------------------------------------------------------------------

_SORTABLE = (str, int, bytes)
_TUPLE_MARK = msgpack.ExtType(Ext.TUPLE, b"")
_SET_MARK = msgpack.ExtType(Ext.SET, b"")
_FROZENSET_MARK = msgpack.ExtType(Ext.FROZENSET, b"")
_DEQUE_MARK = msgpack.ExtType(Ext.DEQUE, b"")


def _new_record_mark(index: int) -> Any:
    return msgpack.ExtType(Ext.RECORD, index.to_bytes(max(1, (index.bit_length() + 7) // 8), "big"))


_RECORD_MARKS = tuple(_new_record_mark(index) for index in range(64))  # a value seldom holds more types


def _record_mark(index: int) -> Any:
    return _RECORD_MARKS[index] if index < len(_RECORD_MARKS) else _new_record_mark(index)


def _fields_getter(fields: Tuple[str, ...]) -> Callable[[Any], Tuple[Any, ...]]:
    if not fields:
        return lambda obj: ()
    if len(fields) == 1:
        one = operator.attrgetter(fields[0])
        return lambda obj: (one(obj),)
    return operator.attrgetter(*fields)


class _Encoder:
    """One value's encoding: collects its types' table while msgpack packs it.

    msgpack packs what it has a type for itself and hands everything else to :meth:`default`, which turns it
    into an array led by a mark (an empty-ish extension value, one object per kind or type, never allocated
    per value) for msgpack to pack in turn.

    The packer lives for one :meth:`pack` only: it holds ``self.default``, so an encoder holding its packer
    would be a reference cycle, and every encoding's buffer would wait for the garbage collector's cyclic
    passes (hundreds of them alive at once in a replay: tens of MiB)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.table: List[List[Any]] = []
        self.marks: Dict[type, Any] = {}        # per type met: its record mark
        self.getters: Dict[type, Callable[[Any], Tuple[Any, ...]]] = {}
        self.state_fields: Dict[type, Tuple[str, ...]] = {}

    def pack(self, value: Any) -> bytes:
        packer = msgpack.Packer(default=self.default, use_bin_type=True, strict_types=True,
                                unicode_errors="surrogatepass", buf_size=PACK_BUFFER_BYTES)
        return packer.pack(value)  # type: ignore[no-any-return]

    def encode(self, value: Any) -> bytes:
        body = self.pack(value)
        return msgpack.packb([FORMAT_VERSION, self.table, body], use_bin_type=True)  # type: ignore[no-any-return]

    def mark(self, cls: type, entry: RecordType, fields: Optional[Tuple[str, ...]]) -> Any:
        mark = self.marks.get(cls)
        if mark is None:
            mark = self.marks[cls] = _record_mark(len(self.table))
            self.table.append([entry.name, entry.version, None if fields is None else list(fields)])
        return mark

    def default(self, obj: Any) -> Any:
        """msgpack's hook for every value it has no type for."""
        cls = type(obj)
        if cls is tuple or cls in self.registry.plain_tuples:
            return [_TUPLE_MARK, *obj]
        getter = self.getters.get(cls)
        if getter is not None:  # a dataclass or named tuple met before
            return [self.marks[cls], *getter(obj)]
        entry = self.registry.by_class.get(cls)
        if entry is not None:
            return self.record(obj, cls, entry)
        if cls is int:  # beyond 64 bits
            return msgpack.ExtType(Ext.BIGINT, obj.to_bytes(obj.bit_length() // 8 + 1, "big", signed=True))
        if cls is set or cls is frozenset:
            return [_SET_MARK if cls is set else _FROZENSET_MARK, *self.ordered(obj)]
        if cls is collections.deque:
            return [_DEQUE_MARK, obj.maxlen, *obj]
        raise EncodingError(f"cannot encode a {cls.__module__}.{cls.__qualname__}: register it (core.registry)")

    def record(self, obj: Any, cls: type, entry: RecordType) -> List[Any]:
        if entry.kind == ENUM:
            return [self.mark(cls, entry, None), obj.value]
        if entry.kind == STATE:
            state = obj.to_state()
            names = tuple(state)
            known = self.state_fields.setdefault(cls, names)
            if names != known:
                raise EncodingError(f"{entry.name}: to_state gave fields {names}, earlier {known}")
            return [self.mark(cls, entry, names), *state.values()]
        assert entry.fields is not None
        mark = self.mark(cls, entry, entry.fields)
        getter = self.getters[cls] = _fields_getter(entry.fields)
        return [mark, *getter(obj)]

    def ordered(self, items: Any) -> List[Any]:
        """A set's items in a deterministic order: sorted, by their own encoding where they do not sort."""
        if _totally_ordered(items):
            return sorted(items)
        return sorted(items, key=lambda item: _Encoder(self.registry).pack(item))


def _totally_ordered(items: Any) -> bool:
    """Whether ``sorted`` orders the items the same whatever their iteration order: all str, all int, all
    bytes, all floats but NaN, or tuples of one shape of those."""
    kinds = {type(item) for item in items}
    if len(kinds) != 1:
        return not kinds
    kind = next(iter(kinds))
    if kind in _SORTABLE:
        return True
    if kind is float:
        return all(item == item for item in items)
    if kind is tuple:
        shapes = {tuple(type(x) for x in item) for item in items}
        return len(shapes) == 1 and all(x in _SORTABLE for x in next(iter(shapes)))
    return False


def encode(value: Any, registry: Optional[Registry] = None) -> bytes:
    """``value`` (registered records, and None, bool, int, float, str, bytes, list, tuple, dict, set,
    frozenset, deque of them) as bytes; :class:`EncodingError` for anything else."""
    return _Encoder(REGISTRY if registry is None else registry).encode(value)


# -- decoding ----------------------------------------------------------------------------------------------


def _construct(entry: RecordType, values: Dict[str, Any]) -> Any:
    """An instance from its fields by name: unknown ones ignored, missing ones their default."""
    if entry.kind == STATE:
        return entry.cls.from_state(values)  # type: ignore[attr-defined]
    assert entry.fields is not None
    missing = [name for name in entry.required if name not in values]
    if missing:
        raise EncodingError(f"{entry.name}: stored bytes lack {missing}, which have no default")
    return entry.cls(**{name: values[name] for name in entry.fields if name in values})


def _upgraded(entry: RecordType, stored_version: int, values: Dict[str, Any]) -> Dict[str, Any]:
    for version in range(stored_version, entry.version):
        upgrade = entry.upgrades.get(version)
        if upgrade is None:
            raise EncodingError(f"{entry.name}: no upgrade from schema version {version} to {version + 1}")
        values = upgrade(values)
    return values


def _builder(registry: Registry, stored: Any) -> Callable[[List[Any]], Any]:
    """How to build instances of one entry of a value's types table (``[name, version, fields]``) from
    their array (``[mark, field values...]``)."""
    name, version, fields = stored
    entry = registry.lookup(name)
    if version > entry.version:
        raise IncompatibleVersion(
            f"{name} was written with schema version {version}; this code reads up to version {entry.version}. "
            "Deploy code that knows the newer version (or drain the job before going back).")
    cls = entry.cls
    if entry.kind == ENUM:
        return lambda values: _enum_member(entry, values[1])
    names = tuple(fields)
    if version == entry.version and names == entry.fields:
        return lambda values: cls(*values[1:])  # the same layout as today's: positional, fast
    if version == entry.version:
        return lambda values: _construct(entry, dict(zip(names, values[1:])))
    return lambda values: _construct(entry, _upgraded(entry, version, dict(zip(names, values[1:]))))


def _enum_member(entry: RecordType, value: Any) -> Any:
    try:
        return entry.cls(value)
    except ValueError:
        if isinstance(value, str) and issubclass(entry.cls, str):
            return value  # a member a newer version added: its value still compares equal to it
        raise EncodingError(f"{entry.name} has no member of value {value!r}") from None


def _deque(values: List[Any]) -> Any:
    return collections.deque(values[2:], values[1])


class _Mark:
    """What leads the array of a value msgpack has no type for: how to build that value from the array."""
    __slots__ = ("build",)

    def __init__(self, build: Callable[[List[Any]], Any]):
        self.build = build


_CONTAINER_MARKS = {Ext.TUPLE: _Mark(lambda values: tuple(values[1:])),
                    Ext.SET: _Mark(lambda values: set(values[1:])),
                    Ext.FROZENSET: _Mark(lambda values: frozenset(values[1:])),
                    Ext.DEQUE: _Mark(_deque)}


class _Decoder:
    """How to decode the bodies of values with one types table. Kept by the registry per table
    (``Registry.decoders``) and used again for every value with the same table: a job decodes many values of
    one kind, and making each type's builder is most of a small value's decoding."""

    def __init__(self, registry: Registry, table: Sequence[Any]):
        self.registry = registry
        self.table = table
        self.marks: Dict[bytes, _Mark] = {}

    def ext_hook(self, code: int, data: bytes) -> Any:
        if code == _RECORD:
            mark = self.marks.get(data)
            if mark is None:
                index = int.from_bytes(data, "big")
                if index >= len(self.table):
                    raise EncodingError(f"record type {index} is not in the value's types table")
                mark = self.marks[data] = _Mark(_builder(self.registry, self.table[index]))
            return mark
        if code == _BIGINT:
            return int.from_bytes(data, "big", signed=True)
        container = _CONTAINER_MARKS.get(code)  # type: ignore[call-overload]
        if container is None:
            raise EncodingError(f"unknown extension type {code}: written by a newer version of trainguard?")
        return container

    @staticmethod
    def list_hook(values: List[Any]) -> Any:
        if values and type(values[0]) is _Mark:
            return values[0].build(values)
        return values


_RECORD, _BIGINT = int(Ext.RECORD), int(Ext.BIGINT)
MAX_DECODERS = 256  # types tables a registry keeps decoders for (a job's values have a few dozen)


def _decoder(registry: Registry, table: Any) -> _Decoder:
    """The registry's decoder for values with this types table (a tuple of ``(name, version, fields)``)."""
    try:
        return registry.decoders[table]  # type: ignore[no-any-return]
    except KeyError:
        pass
    except TypeError:  # a table holding a map: no value this module wrote
        raise EncodingError("not an encoded value: its types table is not a list of types") from None
    if len(registry.decoders) >= MAX_DECODERS:
        registry.decoders.clear()
    decoder = registry.decoders[table] = _Decoder(registry, table)
    return decoder


def decode(data: bytes, registry: Optional[Registry] = None) -> Any:
    """The value :func:`encode` wrote, as today's classes: see the module doc for what may have changed since."""
    try:
        outer = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise EncodingError(f"not an encoded value: {error}") from error
    if type(outer) is not tuple or len(outer) != 3 or not isinstance(outer[0], int):
        raise EncodingError("not an encoded value: expected [format, types, body]")
    format_version, table, body = outer
    if format_version > FORMAT_VERSION:
        raise IncompatibleVersion(f"encoding format {format_version} is newer than this code's {FORMAT_VERSION}")
    decoder = _decoder(REGISTRY if registry is None else registry, table)
    return msgpack.unpackb(body, ext_hook=decoder.ext_hook, list_hook=decoder.list_hook, raw=False,
                           strict_map_key=False, use_list=True, unicode_errors="surrogatepass")


def to_text(value: Any) -> str:
    """:func:`encode`'s bytes as ASCII (base64), for a value kept in a text column (an interrupted run's state)."""
    return base64.b64encode(encode(value)).decode("ascii")


def from_text(text: str) -> Any:
    """The value :func:`to_text` wrote; ``EncodingError`` for text that is not one."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as error:
        raise EncodingError(f"not an encoded value: {error}") from error
    return decode(data)


def types_of(data: bytes) -> List[Tuple[str, int, Optional[List[str]]]]:
    """The types table of encoded bytes: (name, version, fields) of each type the value holds."""
    _, table, _ = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    return [(name, version, fields) for name, version, fields in table]


# -- a structural view, for tests and fixtures -------------------------------------------------------------


def describe(value: Any, only: Optional[Mapping[str, Sequence[str]]] = None) -> Any:
    """``value`` as plain JSON data, independent of this encoding: records as ``{"$record": name, field: ...}``
    (only the fields ``only`` names for that record name, where it names any), enums as ``{"$enum": name,
    "value": ...}``, floats by their bits (so NaN equals itself, and -0.0 is not 0.0), every other container
    tagged with its type. Two values with equal descriptions are the same value, bit for bit."""
    entry = REGISTRY.by_class.get(type(value))
    if entry is not None and entry.kind == ENUM:
        return {"$enum": entry.name, "value": describe(value.value, only)}
    if entry is not None:
        fields: Mapping[str, Any]
        if entry.fields is None:
            fields = value.to_state()
        else:
            fields = {name: getattr(value, name) for name in entry.fields}
        names = list(only[entry.name]) if only is not None and entry.name in only else list(fields)
        return {"$record": entry.name, **{name: describe(fields[name], only) for name in names}}
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is int:
        return value
    if kind is float:
        return {"$float": struct.pack(">d", value).hex()}
    if kind is bytes:
        return {"$bytes": value.hex()}
    if kind is list:
        return [describe(item, only) for item in value]
    if kind is tuple or kind in REGISTRY.plain_tuples:
        return {"$tuple": [describe(item, only) for item in value]}
    if kind is set or kind is frozenset:
        items = sorted((describe(item, only) for item in value), key=lambda item: json.dumps(item, sort_keys=True))
        return {"$" + kind.__name__: items}
    if kind is collections.deque:
        return {"$deque": [describe(item, only) for item in value], "maxlen": value.maxlen}
    if kind is dict:
        return {"$dict": [[describe(k, only), describe(v, only)] for k, v in value.items()]}
    raise EncodingError(f"no description of a {kind.__module__}.{kind.__qualname__}")
