"""Writing real TensorBoard event files for the shipper tests (tensorboard's own writers)."""

from __future__ import annotations

import os
from typing import Iterable, Optional, Tuple

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary import Writer
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from tests.support import T0


class TF1Writer:
    """Scalars as ``simple_value`` (TF1 / tensorboardX / torch SummaryWriter style)."""

    def __init__(self, logdir: str, suffix: str = ""):
        self.writer = EventFileWriter(logdir, filename_suffix=suffix)
        self.path = self.writer._file_name

    def scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        self.writer.add_event(event_pb2.Event(wall_time=wall_time or T0 + step, step=step, summary=summary))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class TF2Writer(TF1Writer):
    """Scalars as tensors, with plugin metadata only on a tag's first value (TF2 style),
    plus a text summary that must not be taken for a scalar."""

    def __init__(self, logdir: str, suffix: str = ""):
        super().__init__(logdir, suffix)
        self.seen = set()

    def scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(np.float64(value)))
        if tag not in self.seen:
            self.seen.add(tag)
            summary_value.metadata.plugin_data.plugin_name = scalar_metadata.PLUGIN_NAME
        summary = summary_pb2.Summary(value=[summary_value])
        self.writer.add_event(event_pb2.Event(wall_time=wall_time or T0 + step, step=step, summary=summary))

    def text(self, tag: str, text: str, step: int) -> None:
        summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(text))
        summary_value.metadata.plugin_data.plugin_name = text_metadata.PLUGIN_NAME
        summary = summary_pb2.Summary(value=[summary_value])
        self.writer.add_event(event_pb2.Event(wall_time=T0 + step, step=step, summary=summary))


def native_scalars(logdir: str, scalars: Iterable[Tuple[str, float, int]]) -> None:
    """Scalars through ``tensorboard.summary.Writer`` (float32 tensors, metadata every time)."""
    writer = Writer(logdir)
    for tag, value, step in scalars:
        writer.add_scalar(tag, value, step, wall_time=T0 + step)
    writer.close()


def event_files(logdir: str):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(logdir) for f in files if "tfevents" in f)
