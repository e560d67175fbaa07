"""The Beam coder of the project's records: ``core.encoding``'s versioned format, never pickles.

Every state cell and every element that crosses a shuffle (a ``GroupByKey``, a
stateful ``DoFn``'s input, a side input) outlives the code that wrote it: a
job updated with ``--update`` reads it with the new code. :class:`RecordCoder`
writes them in ``core.encoding``'s format (stable names, schema versions,
fields by name), so they survive refactors: a moved module, a renamed class,
an added field.

- State specs take ``RecordCoder()`` instead of ``PickleCoder()``.
- Every registered record type is registered with Beam's coder registry
  (:func:`register_record_coders`, run on import), so a PCollection typed
  with one (``KV[str, RunResult]``, ``beam.Create([seed])`` of a
  ``HistorySeed``) gets ``RecordCoder``.
- A keyed PCollection whose values are several record types is typed
  ``KV[..., AnyRecord]``: Beam's type checks treat :data:`AnyRecord` as ``Any``,
  its coder registry gives it ``RecordCoder``.

Keys stay Beam's own deterministic coders (tuples of ``str`` and ``int``).
The coder itself is pickled into the job graph, as every Python coder is: by
its class's path, ``transforms.coders.RecordCoder``, with no fields. Keep the
class at that path (or leave an alias there).

``tests/transforms/test_coders.py`` reads the replay's and the streaming job's
pipeline protos and fails, naming the step, wherever a state spec, a keyed or
grouped input or a side input would be encoded by a pickling coder.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.typehints import typehints

from core import encoding
from core.registry import also_load, load_registry

# Modules above core that register state types of their own (``core.encoding.also_load``).
TRANSFORM_RECORD_MODULES = ("transforms.windows", "transforms.window_state", "transforms.ordered")


class RecordCoder(beam.coders.Coder):
    """Any value made of registered records and plain data, in ``core.encoding``'s format."""

    def encode(self, value: Any) -> bytes:
        return encoding.encode(value)

    def decode(self, encoded: bytes) -> Any:
        return encoding.decode(encoded)

    def is_deterministic(self) -> bool:
        # The same value always gives the same bytes (sets sorted). A dict's order is part of its value:
        # equal dicts built in different orders differ, so no record holding a dict should be a key.
        return True

    def to_type_hint(self):
        return AnyRecord

    @classmethod
    def from_type_hint(cls, unused_typehint, unused_registry):
        return cls()

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return "RecordCoder"


class _AnyRecordConstraint(typehints.AnyTypeConstraint):
    """A value of any registered record type: ``Any`` to Beam's type checks, ``RecordCoder`` to its registry."""

    def __repr__(self) -> str:
        return "AnyRecord"


AnyRecord = _AnyRecordConstraint()


def register_record_coders() -> None:
    """Registers ``RecordCoder`` with Beam for every record type of core (those that cross shuffles) and for
    ``AnyRecord``. (The state types of transforms' own modules need no Beam registration: state specs name
    their coder.)"""
    for entry in load_registry(above_core=False).by_class.values():
        beam.coders.registry.register_coder(entry.cls, RecordCoder)
    beam.coders.registry.register_coder(_AnyRecordConstraint, RecordCoder)


def outputs_any(dofn_class):
    """Declares a DoFn's outputs ``Any``: what Beam finds anyway, by reading the bytecode of its methods, for
    a DoFn that emits several kinds of record (or tagged ones). Declared, every graph built skips that
    inference: 5 to 20 ms per DoFn, a tenth of a small replay's CPU. The coders are the same."""
    return beam.typehints.with_output_types(Any)(dofn_class)


also_load(*TRANSFORM_RECORD_MODULES)
register_record_coders()

