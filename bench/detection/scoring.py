"""One scorer for every detector: its alerts against the suite's truth.

A detector's output is a list of :class:`Alert` (test, run, tag, kind); trainguard's
come from its alerts table, the reference detectors' from their functions. The
scores (:func:`score`), per suite and pooled over suites (:func:`pool`):

- recall per fault kind and size: a one-off fault is caught when the detector
  alerts on its run (any metric); a persistent shift when it alerts on the
  shifted metric's tag within its first :data:`~bench.detection.suite.SHIFT_DEADLINE`
  runs. "recall" pools every fault, crashes and shifts included;
- delay of a shift: the shifted runs up to and including the first alert on
  its tag (1 = its first run), median over the shifts caught in time;
- false alerts per 100 healthy runs per test: every alert (all metrics of a
  test together) on a run with no fault, outside the first
  :data:`~bench.detection.suite.STRETCH` runs of an accepted change or a shift,
  but for a shift's first alert on its tag when that comes after the deadline:
  the shift is there, so that alert is a late detection (counted apart), not a
  false one;
- alerts per accepted change: every alert on those first runs of a change;
- alerts on the constant metric.

:func:`matched` picks, per detector, the operating point whose false-alert
rate is at most :data:`MATCHED_FALSE_ALERTS` (the one with the best recall
among them; else the quietest), so recalls are compared at a like cost.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from bench.detection.suite import (
    CONSTANT,
    ONE_OFF_KINDS,
    SHIFT_DEADLINE,
    SHIFT_KINDS,
    Suite,
    accepted_changes_of,
    shifts_of,
)

MATCHED_FALSE_ALERTS = 1.0  # false alerts per 100 healthy runs per test: the like cost recalls are compared at
KINDS = tuple(k.value for k in ONE_OFF_KINDS + SHIFT_KINDS)


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert of any detector, located in the suite."""
    test: int  #: the test's index in the suite
    run: int  #: the run's index in its test
    tag: Optional[str]  #: the metric's tag (``loss`` for ``loss_final`` and a ``loss_mean`` window); None: the job
    kind: str  #: the detector's word for it (trainguard's alert kind; ``out_of_bounds``, ``change_point``)


@dataclasses.dataclass
class Counts:
    """Additive counts, so that suites pool by adding them up."""
    caught: Dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    faults: Dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    shift_delays: List[int] = dataclasses.field(default_factory=list)  #: of the shifts caught in time
    healthy_runs: int = 0
    false_alerts: int = 0
    accepted_changes: int = 0
    change_alerts: int = 0
    constant_alerts: int = 0
    alerts: int = 0
    late_shift_alerts: int = 0  #: a shift's first alert on its tag after the deadline (neither caught nor false)

    def add(self, other: Counts) -> Counts:
        return Counts({k: self.caught[k] + other.caught[k] for k in KINDS},
                      {k: self.faults[k] + other.faults[k] for k in KINDS},
                      self.shift_delays + other.shift_delays,
                      *(getattr(self, f) + getattr(other, f) for f in (
                          "healthy_runs", "false_alerts", "accepted_changes", "change_alerts", "constant_alerts",
                          "alerts", "late_shift_alerts")))

    @property
    def recall(self) -> Optional[float]:
        faults = sum(self.faults.values())
        return sum(self.caught.values()) / faults if faults else None

    @property
    def false_alerts_per_100(self) -> Optional[float]:
        return 100 * self.false_alerts / self.healthy_runs if self.healthy_runs else None

    @property
    def alerts_per_change(self) -> Optional[float]:
        return self.change_alerts / self.accepted_changes if self.accepted_changes else None

    @property
    def median_shift_delay(self) -> Optional[float]:
        return statistics.median(self.shift_delays) if self.shift_delays else None

    def as_dict(self) -> Dict[str, object]:
        return {"recall": self.recall, "false_alerts_per_100_healthy_runs": self.false_alerts_per_100,
                "alerts_per_accepted_change": self.alerts_per_change,
                "median_shift_delay_runs": self.median_shift_delay, "constant_metric_alerts": self.constant_alerts,
                "caught": dict(self.caught), "faults": dict(self.faults), "shift_delays": list(self.shift_delays),
                "healthy_runs": self.healthy_runs, "false_alerts": self.false_alerts,
                "accepted_changes": self.accepted_changes, "change_alerts": self.change_alerts,
                "alerts": self.alerts, "late_shift_alerts": self.late_shift_alerts}


def score(suite: Suite, alerts: Iterable[Alert]) -> Counts:
    """The counts of one detector on one suite."""
    by_run: Dict[Tuple[int, int], List[Alert]] = {}
    for alert in alerts:
        by_run.setdefault((alert.test, alert.run), []).append(alert)
    counts = Counts()
    late: Set[Tuple[int, int, Optional[str]]] = set()  # (test, run, tag) of each shift's first alert, when late
    for plan in suite.plans:
        t = plan.index
        for run, fault in plan.faults.items():
            counts.faults[fault.kind.value] += 1
            counts.caught[fault.kind.value] += bool(by_run.get((t, run)))
        for shift in shifts_of(plan):
            assert shift.shift is not None
            counts.faults[shift.shift.value] += 1
            delay = next((d + 1 for d, run in enumerate(range(shift.first_run, suite.spec.runs))
                          if any(a.tag == shift.metric.tag for a in by_run.get((t, run), ()))), None)
            if delay is not None and delay <= SHIFT_DEADLINE:
                counts.caught[shift.shift.value] += 1
                counts.shift_delays.append(delay)
            elif delay is not None:  # found after its deadline: a late detection, not a false alert
                late.add((t, shift.first_run + delay - 1, shift.metric.tag))
                counts.late_shift_alerts += 1
        for change in accepted_changes_of(plan):
            counts.accepted_changes += 1
            counts.change_alerts += sum(len(by_run.get((t, run), ())) for run in change.stretch)
        for run in range(suite.spec.runs):
            here = by_run.get((t, run), ())
            counts.alerts += len(here)
            counts.constant_alerts += sum(1 for a in here if a.tag == CONSTANT.tag)
            if plan.is_healthy(run):
                counts.healthy_runs += 1
                counts.false_alerts += sum(1 for a in here if (t, run, a.tag) not in late)
    return counts


def pool(counts: Iterable[Counts]) -> Counts:
    total = Counts()
    for c in counts:
        total = total.add(c)
    return total


@dataclasses.dataclass(frozen=True)
class Row:
    """A detector at one operating point, with its pooled counts."""
    detector: str  #: the family, e.g. "median ± k·MAD"
    point: str  #: the operating point, e.g. "k=6"
    counts: Counts
    default: bool = False  #: trainguard's shipped setting


def matched(rows: Sequence[Row], limit: float = MATCHED_FALSE_ALERTS) -> List[Row]:
    """Per detector, its best recall among the points with at most ``limit`` false alerts (else its quietest)."""
    out = []
    for detector in dict.fromkeys(r.detector for r in rows):
        mine = [r for r in rows if r.detector == detector]
        within = [r for r in mine if (r.counts.false_alerts_per_100 or 0.0) <= limit]
        if within:
            out.append(max(within, key=lambda r: (r.counts.recall or 0.0, -(r.counts.false_alerts_per_100 or 0.0))))
        else:
            out.append(min(mine, key=lambda r: r.counts.false_alerts_per_100 or 0.0))
    return out


def _fraction(caught: int, faults: int) -> str:
    return f"{caught}/{faults}" if faults else "–"


def _number(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


COLUMNS = ("recall", "false alerts / 100 healthy runs") + tuple(k.value for k in ONE_OFF_KINDS) + (
    "shift 1σ ≤ 5 runs", "shift 2σ ≤ 5 runs", "shift delay (runs, median)", "alerts / accepted change",
    "alerts on constant")


def cells(counts: Counts) -> List[str]:
    return ([_number(counts.recall), _number(counts.false_alerts_per_100)]
            + [_fraction(counts.caught[k.value], counts.faults[k.value]) for k in ONE_OFF_KINDS]
            + [_fraction(counts.caught[k.value], counts.faults[k.value]) for k in SHIFT_KINDS]
            + [_number(counts.median_shift_delay, 1), _number(counts.alerts_per_change), str(counts.constant_alerts)])


def markdown_table(rows: Sequence[Row], title: str) -> str:
    head = [title] + list(COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        name = f"{row.detector}, {row.point}" + (" (default)" if row.default else "")
        lines.append("| " + " | ".join([name] + cells(row.counts)) + " |")
    return "\n".join(lines)


def rows_as_dicts(rows: Sequence[Row]) -> List[Mapping[str, object]]:
    return [{"detector": r.detector, "point": r.point, "default": r.default, **r.counts.as_dict()} for r in rows]
