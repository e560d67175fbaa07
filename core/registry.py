"""The types that live in a running job's state or cross its shuffles: stable names, schema versions, fields.

State that lives in a running Dataflow job is a file format (``core.encoding``
writes it): a job updated in place (``--update``) reads the state, the side
inputs and the in-flight shuffle data that the old code wrote. So every type
that ends up there is registered here under a stable name of our choosing,
never its module path, with a schema version; the encoding writes its fields
by name.

**Registering a type.** A dataclass (or a named tuple) registers with the
:func:`record` decorator, its fields found by introspection::

    @record("MetricHistory")
    @dataclasses.dataclass
    class MetricHistory: ...

A named tuple that a record holds in place of a bare tuple, whose bytes must stay the bare tuple's
(``core.history.HistoryEntry``: state written before it was named), registers with :func:`plain_tuple`
instead: it is written as a plain tuple, its fields unnamed, and decodes as one; the record holding it
rebuilds it (e.g. in ``__post_init__``).

A class that is neither keeps its state in ``to_state() -> dict`` and
``from_state(dict)`` (a classmethod) and registers the same way; enums
register with :func:`record` too and are written by value. The name is the
type's identity in stored bytes, forever: never rename it, whatever the class
or its module become.

**Changing a type.** Decoding matches fields by name, so

- adding a field with a default needs nothing: old bytes decode with the default;
- removing a field needs nothing: old bytes' value of it is ignored;
- anything else (a rename, a new meaning or type of a field, a new field
  without a default) bumps ``version`` and gives ``upgrades[old]``, a function
  from the old version's fields (a dict) to the next version's. Bytes of a
  newer version than the code knows are refused (``IncompatibleVersion``):
  deploy code that knows it, or drain the job.

``tests/transforms/test_coders.py`` decodes state written by earlier versions
(``tests/fixtures/state_v1``), so a change that breaks old bytes fails there.

Standard library only, like the rest of core: the modules that define records
import this, not the encoding (whose msgpack only the pipeline installs).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, TypeVar

# The core modules that register types: imported by :func:`load_registry` before decoding a name not yet known.
RECORD_MODULES = ("core.aggregation", "core.parse", "core.runs", "core.run_parts", "core.records", "core.triage",
                  "core.history", "core.windows", "core.stalls", "core.window_checks", "core.rank_windows",
                  "core.vocabulary", "core.config_versions")


class EncodingError(ValueError):
    """A value that cannot be encoded, or bytes that cannot be decoded."""


class IncompatibleVersion(EncodingError):
    """Bytes written by a newer schema version of a type than this code knows."""


STATE, DATACLASS, NAMEDTUPLE, ENUM = "state", "dataclass", "namedtuple", "enum"


@dataclasses.dataclass(frozen=True)
class RecordType:
    """One registered type: its stable name, schema version and fields."""
    name: str
    cls: type
    version: int
    kind: str                       # dataclass, namedtuple, state (to_state/from_state) or enum
    fields: Optional[Tuple[str, ...]]  # the fields of a dataclass or named tuple; None otherwise
    upgrades: Mapping[int, Callable[[Dict[str, Any]], Dict[str, Any]]]
    required: Tuple[str, ...] = ()  # fields without a default: bytes must hold them


def _kind_and_fields(cls: type) -> Tuple[str, Optional[Tuple[str, ...]], Tuple[str, ...]]:
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return ENUM, None, ()
    if dataclasses.is_dataclass(cls):
        fields = dataclasses.fields(cls)
        hidden = [f.name for f in fields if not f.init]
        if hidden:
            raise EncodingError(f"{cls.__qualname__}: fields {hidden} are not __init__ arguments; "
                                "give the class to_state/from_state instead")
        required = tuple(f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        return DATACLASS, tuple(f.name for f in fields), required
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        defaults = getattr(cls, "_field_defaults", {})
        names: Tuple[str, ...] = cls._fields
        return NAMEDTUPLE, names, tuple(f for f in names if f not in defaults)
    if callable(getattr(cls, "to_state", None)) and callable(getattr(cls, "from_state", None)):
        return STATE, None, ()
    raise EncodingError(f"{cls.__qualname__}: not a dataclass, named tuple or enum, and no to_state/from_state")


class Registry:
    """Registered types, by class and by stable name."""

    def __init__(self) -> None:
        self.by_class: Dict[type, RecordType] = {}
        self.by_name: Dict[str, RecordType] = {}
        self.plain_tuples: Set[type] = set()  # named tuples written as plain tuples (:func:`plain_tuple`)
        self.decoders: Dict[Any, Any] = {}  # core.encoding's decoders by types table, made again after a change

    def register(self, cls: type, name: str, version: int = 1,
                 upgrades: Optional[Mapping[int, Callable[[Dict[str, Any]], Dict[str, Any]]]] = None,
                 replace: bool = False) -> RecordType:
        """Registers ``cls`` as ``name`` at schema ``version``; ``upgrades[v]`` turns version v's fields into
        version v+1's. ``replace``: the name may already be taken (by an earlier version of the class, in tests)."""
        if version < 1:
            raise EncodingError(f"{name}: versions start at 1")
        known = self.by_name.get(name)
        reloaded = known is not None and (known.cls.__module__, known.cls.__qualname__) == (
            cls.__module__, cls.__qualname__)  # the same class, its module imported again
        if known is not None and not replace and not reloaded and known.cls is not cls:
            raise EncodingError(f"record name {name!r} is taken by {known.cls.__qualname__}")
        if cls in self.by_class and self.by_class[cls].name != name:
            raise EncodingError(f"{cls.__qualname__} is already registered as {self.by_class[cls].name!r}")
        kind, fields, required = _kind_and_fields(cls)
        entry = RecordType(name, cls, version, kind, fields, dict(upgrades or {}), required)
        if known is not None:
            self.by_class.pop(known.cls, None)
        self.by_class[cls] = entry
        self.by_name[name] = entry
        self.decoders.clear()
        return entry

    def copy(self) -> Registry:
        twin = Registry()
        twin.by_class, twin.by_name = dict(self.by_class), dict(self.by_name)
        twin.plain_tuples = set(self.plain_tuples)
        return twin

    def lookup(self, name: str) -> RecordType:
        entry = self.by_name.get(name)
        if entry is None and self is REGISTRY:
            load_registry()
            entry = self.by_name.get(name)
        if entry is None:
            raise EncodingError(f"unknown record type {name!r}: written by a newer version of trainguard?")
        return entry


REGISTRY = Registry()
"""The project's registry: every type that lives in state or crosses a shuffle."""

T = TypeVar("T", bound=type)


def record(name: str, version: int = 1,
           upgrades: Optional[Mapping[int, Callable[[Dict[str, Any]], Dict[str, Any]]]] = None) -> Callable[[T], T]:
    """Class decorator: registers the class in :data:`REGISTRY` under the stable ``name`` (see the module doc)."""
    def register(cls: T) -> T:
        REGISTRY.register(cls, name, version, upgrades)
        return cls
    return register


def plain_tuple(cls: T) -> T:
    """Class decorator for a named tuple written as a plain tuple, with no name, version or fields in the bytes
    (see the module doc): it decodes as a plain tuple, which the record holding it turns back into ``cls``."""
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise EncodingError(f"{cls.__qualname__}: only a named tuple is written as a plain tuple")
    if cls in REGISTRY.by_class:
        raise EncodingError(f"{cls.__qualname__} is already registered as {REGISTRY.by_class[cls].name!r}")
    REGISTRY.plain_tuples.add(cls)
    return cls


def register(cls: type, name: str, version: int = 1) -> None:
    """Registers a class defined outside core (e.g. the wire contract's named tuples) in :data:`REGISTRY`."""
    REGISTRY.register(cls, name, version)


_more_modules: List[str] = []


def also_load(*modules: str) -> None:
    """Names modules above core that register types of their own, for :func:`load_registry` to import too."""
    _more_modules.extend(m for m in modules if m not in _more_modules)


def load_registry(above_core: bool = True) -> Registry:
    """Imports every module that registers types: ``RECORD_MODULES`` and (``above_core``) those of :func:`also_load`."""
    for module in (*RECORD_MODULES, *(_more_modules if above_core else ())):
        importlib.import_module(module)
    return REGISTRY


def registered(registry: Optional[Registry] = None) -> List[RecordType]:
    """Every registered type, by name."""
    chosen = REGISTRY if registry is None else registry
    return [chosen.by_name[name] for name in sorted(chosen.by_name)]
