"""Per-run grouping in wall-clock time, like Alertmanager's ``group_wait``.

The first alert of a run opens its group; the group closes ``wait_seconds``
later (on the notifier's clock) with every alert of that run that arrived
meanwhile, and becomes one digest. An alert of the run arriving after its group
closed opens a new group (and so a follow-up digest).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Hashable, List, Optional

from core.alert_record import AlertRecord


@dataclasses.dataclass
class Group:
    """The alerts of one run collected so far."""
    key: Hashable
    due_at: float
    alerts: List[AlertRecord] = dataclasses.field(default_factory=list)


class Grouper:
    """Open groups by key; :meth:`pop_due` hands out the ones whose wait is over."""

    def __init__(self, wait_seconds: float):
        self.wait_seconds = wait_seconds
        self._groups: Dict[Hashable, Group] = {}

    def add(self, alert: AlertRecord, now: float) -> None:
        group = self._groups.get(alert.group_key)
        if group is None:
            group = self._groups[alert.group_key] = Group(alert.group_key, now + self.wait_seconds)
        group.alerts.append(alert)

    def discard(self, alert_id: str) -> None:
        """Takes an alert out of its open group (a group left empty closes without a digest)."""
        for key, group in list(self._groups.items()):
            group.alerts = [a for a in group.alerts if a.alert_id != alert_id]
            if not group.alerts:
                del self._groups[key]

    def next_due(self) -> Optional[float]:
        return min((g.due_at for g in self._groups.values()), default=None)

    def pop_due(self, now: float) -> List[Group]:
        """Remove and return the groups due at ``now``, oldest first."""
        due = sorted((g for g in self._groups.values() if g.due_at <= now), key=lambda g: g.due_at)
        for group in due:
            del self._groups[group.key]
        return due

    def pop_all(self) -> List[Group]:
        """Remove and return every open group (end of a bounded run)."""
        return self.pop_due(float("inf"))

    def __len__(self) -> int:
        return len(self._groups)
