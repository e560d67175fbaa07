"""Reading scalars out of TensorBoard event files that are still being written.

``RecordTail`` reads complete TFRecords from a byte offset (tensorboard's own
readers keep the offset in memory only, and their TF-less stub cannot start
from one, which a resumable shipper needs). Records are checked with the
TFRecord masked CRC-32C (``google_crc32c`` when installed, else tensorboard's
pure-Python one) and parsed with tensorboard's ``Event`` proto.

``ScalarReader`` turns events into points using tensorboard's compat layer
(``data_compat.migrate_value``), so both encodings count: TF1-style
``simple_value`` and TF2/``tensorboard.summary`` scalar tensors, whose
plugin metadata comes only with a tag's first value in a run (the reader
remembers, and the shipper persists, what each tag is).
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from tensorboard import data_compat
from tensorboard.compat.proto import event_pb2, summary_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

logger = logging.getLogger("trainguard")

SCALAR = "scalar"
OTHER = "other"

try:
    import google_crc32c

    def masked_crc32c(data: bytes) -> int:
        x = google_crc32c.value(data)
        return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF
except ImportError:  # pragma: no cover - depends on the environment
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # type: ignore


class CorruptRecord(IOError):
    """A record's length header fails its CRC: the rest of the file cannot be framed."""


class RecordTail:
    """Yields ``(record, end_offset)`` for the complete records of a file from ``offset``.

    Stops quietly at a partial record at the end (the writer is mid-write);
    the next ``read`` from the returned offset picks it up once complete.
    A complete record whose data fails its CRC is skipped with a warning.
    """

    def __init__(self, path: str):
        self.path = path

    def read(self, offset: int, max_records: int) -> Iterator[Tuple[bytes, int]]:
        with open(self.path, "rb") as f:
            f.seek(offset)
            for _ in range(max_records):
                header = f.read(12)
                if len(header) < 12:
                    return
                length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
                if masked_crc32c(length_bytes) != length_crc:
                    raise CorruptRecord(f"{self.path}: bad length CRC at offset {offset}")
                (length,) = struct.unpack("<Q", length_bytes)
                body = f.read(length + 4)
                if len(body) < length + 4:
                    return
                data = body[:length]
                end = offset + 12 + length + 4
                if masked_crc32c(data) != struct.unpack("<I", body[length:])[0]:
                    logger.warning("trainguard: %s: skipping record with bad data CRC at offset %d",
                                   self.path, offset)
                else:
                    yield data, end
                offset = end


def _tensor_scalar(tensor) -> Optional[float]:
    """The value of a one-element numeric tensor, or None.

    float32/float16 values keep their shortest decimal form (0.1, not
    0.10000000149011612), which is what was logged and is shorter on the wire.
    """
    if tensor.dtype == types_pb2.DT_FLOAT and len(tensor.float_val) == 1 and not tensor.tensor_content:
        return _short_float(np.float32(tensor.float_val[0]))
    if tensor.dtype in (types_pb2.DT_STRING, types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT):
        return None
    try:
        array = tensor_util.make_ndarray(tensor)
    except Exception:  # noqa: BLE001 - unknown dtypes and the like
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    scalar = array.reshape(())[()]
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:
        return _short_float(scalar)
    return float(scalar)


def _short_float(scalar: np.floating) -> float:
    """A float32/float16 as the shortest decimal that reads back the same."""
    return float(str(scalar))


class ScalarReader:
    """Scalar points of events, for one run directory (tags keep their kind across files)."""

    def __init__(self, kinds: Optional[Dict[str, str]] = None):
        self.kinds: Dict[str, str] = kinds if kinds is not None else {}

    def points(self, record: bytes) -> List[Tuple[str, float, int, float]]:
        """``(tag, value, step, wall_time)`` for each scalar in one serialized Event."""
        event = event_pb2.Event.FromString(record)
        if event.WhichOneof("what") != "summary":
            return []
        points = []
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                # What data_compat.migrate_value makes a scalar tensor of, read directly (10x faster).
                kind: Optional[str] = self.kinds.setdefault(value.tag, SCALAR)
                if kind == SCALAR:
                    points.append((value.tag, _short_float(np.float32(value.simple_value)), event.step,
                                   event.wall_time))
                continue
            value = data_compat.migrate_value(value)
            kind = self.kinds.get(value.tag)
            if kind is None:
                metadata = value.metadata
                is_scalar = (metadata.data_class == summary_pb2.DATA_CLASS_SCALAR
                             or metadata.plugin_data.plugin_name == scalar_metadata.PLUGIN_NAME)
                kind = self.kinds[value.tag] = SCALAR if is_scalar else OTHER
            if kind != SCALAR or value.WhichOneof("value") != "tensor":
                continue
            number = _tensor_scalar(value.tensor)
            if number is not None:
                points.append((value.tag, number, event.step, event.wall_time))
        return points


def first_wall_time(path: str) -> Optional[float]:
    """The wall time of a file's first event (the writer's start), if readable."""
    try:
        for record, _ in RecordTail(path).read(0, 1):
            return event_pb2.Event.FromString(record).wall_time or None
    except (OSError, CorruptRecord, ValueError):
        return None
    return None


def is_event_file(name: str) -> bool:
    return "tfevents" in name and not name.endswith((".tmp", ".partial"))


def find_event_files(logdir: str) -> List[Tuple[str, str]]:
    """``(run, path)`` for every event file under ``logdir``; run is the relative
    directory with ``/`` separators, ``""`` for files directly in ``logdir``."""
    found: List[Tuple[str, str]] = []
    for directory, subdirs, files in os.walk(logdir):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        rel = os.path.relpath(directory, logdir)
        run = "" if rel == "." else rel.replace(os.sep, "/")
        found.extend((run, os.path.join(directory, name)) for name in sorted(files) if is_event_file(name))
    return found
