"""Raw payloads and what the pipeline keeps of each message: pure Python, no Beam.

A payload (``RawMessage``) is validated against the wire contract
(``trainguard.wire``) into a ``ParsedMessage``, then reduced under its test's
config to a ``MessageSummary``: per-tag partial aggregates, so that points never
cross a shuffle.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, NamedTuple, Optional, Tuple

from core.aggregation import NO_STEP, TagAggregate
from core.config import TestConfig, ranks_matter
from core.registry import record, register
from trainguard import wire


@record("RawMessage")
@dataclasses.dataclass(frozen=True)
class RawMessage:
    """One payload as it arrived: a Pub/Sub message's data or a line of a replay file."""
    payload: bytes
    source: str                  # e.g. "file:data/a.jsonl" or "pubsub:projects/p/subscriptions/s"
    received_at: Optional[float] = None  # publish time, where the source knows one


class ParsedMessage(NamedTuple):
    message: wire.Message
    payload: bytes  # the raw bytes it came from


register(wire.Event, "WireEvent")  # a run's events, as messages carry them


@record("MessageSummary")
@dataclasses.dataclass
class MessageSummary:
    """One validated message reduced to what its run needs: per-tag partial aggregates.

    Summaries, not points, cross the pipeline's shuffles; the raw payload rides
    along so that a message arriving after its run was finalized can still be
    dead-lettered intact.
    """
    id: str
    test: str
    run: str
    tags: Dict[str, TagAggregate]
    events: Tuple[wire.Event, ...]
    first_time: float
    last_time: float
    payload: bytes
    window_points: Tuple[wire.Point, ...] = ()  # points of tags with live windows configured
    rank: Optional[int] = None        # the worker that sent it; None: not said (counts as rank 0)
    world_size: Optional[int] = None


def summarize(message: wire.Message, payload: bytes, config: TestConfig) -> MessageSummary:
    collection = config.metric_collection
    ignored = collection.tags_to_ignore
    by_tag: Dict[str, Tuple[List[float], List[float], List[int]]] = {}
    for tag, value, step, time in message.points:
        columns = by_tag.get(tag)
        if columns is None:
            if tag in ignored:
                continue
            by_tag[tag] = columns = ([], [], [])
        columns[0].append(value)
        columns[1].append(time)
        columns[2].append(NO_STEP if step is None else step)
    tags = {}
    tta = collection.time_to_accuracy
    for tag, (values, times, steps) in by_tag.items():
        aggregate = tags[tag] = TagAggregate.of_batch(values, times, steps)
        if tta is not None and tag == tta.accuracy_tag:
            reached = [(t, s) for v, t, s in zip(values, times, steps) if v >= tta.accuracy_threshold]
            if reached:
                aggregate.first_reach = min(reached)
    times = [p[3] for p in message.points] + [e.time for e in message.events]
    windowed = config.windows.tags
    # Live windows follow rank 0 (a message without a rank counts as rank 0's), but for the tags whose
    # windows need every rank (a reduction across ranks, or a straggler check): see README "Distributed jobs".
    window_points = tuple(p for p in message.points if p[0] in windowed
                          and (not message.rank or ranks_matter(config, p[0]))) if windowed else ()
    return MessageSummary(message.id, message.test, message.run, tags, message.events,
                          min(times), max(times), payload, window_points, message.rank, message.world_size)
