"""Silences in a run: a pure state machine fed message time spans and watermark advances."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Set, Tuple

from core.registry import record


@record("StallWatch")
@dataclasses.dataclass
class StallWatch:
    """Finds silences of at least ``stall_seconds`` between a run's messages, each once.

    A silence is a gap between the time spans of consecutive messages (in event
    time), found when the watermark passes the message that ends it, or while
    it lasts (``ongoing``). Content-based, so a replay finds the same stalls as
    the live stream did.
    """
    stall_seconds: float
    pending: List[Tuple[float, float]] = dataclasses.field(default_factory=list)  # (first, last) spans
    frontier: Optional[float] = None   # latest time of the spans already settled
    alerted: Set[float] = dataclasses.field(default_factory=set)  # gap starts

    def add(self, first: float, last: float) -> None:
        self.pending.append((first, last))

    def next_due(self) -> Optional[float]:
        return min(first for first, _ in self.pending) if self.pending else None

    def settle(self, watermark: float) -> List[float]:
        """Gap starts of the silences that the spans up to ``watermark`` end."""
        ready = sorted(span for span in self.pending if span[0] <= watermark)
        self.pending = [span for span in self.pending if span[0] > watermark]
        gaps = []
        for first, last in ready:
            if self.frontier is not None and first - self.frontier >= self.stall_seconds:
                gaps += self._new(self.frontier)
            self.frontier = last if self.frontier is None else max(self.frontier, last)
        return gaps

    def ongoing(self, now: float, last_activity: float) -> List[float]:
        """The silence since ``last_activity``, if it has lasted ``stall_seconds`` by ``now``."""
        return self._new(last_activity) if now - last_activity >= self.stall_seconds else []

    def _new(self, gap_start: float) -> List[float]:
        if gap_start in self.alerted:
            return []
        self.alerted.add(gap_start)
        return [gap_start]
