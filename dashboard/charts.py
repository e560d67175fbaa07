"""The data of the dashboard's interactive charts, as JSON specs ``static/dashboard.js`` draws with uPlot.

A spec is a dict: ``title``, ``x`` (``time``: seconds since the epoch, or ``step``), axis labels (the y label
carries the unit), ``xs``, the ``value`` series, ``lower``/``upper`` (the bounds band; None where unbounded or
unchecked), the marked points (``out``: out of bounds, ``triaged``: covered by a triage action, ``current``: this
page's run) and per point the ``runs`` and ``steps`` the hover shows. Pure functions: records in, dicts out.
"""

from __future__ import annotations

import math
from typing import AbstractSet, Any, Dict, List, Optional, Sequence

from dashboard.queries import Point
from report.data import Curve


def axis_label(name: str, unit: Optional[str]) -> str:
    return f"{name} ({unit})" if unit else name


def _finite(value: Optional[float]) -> Optional[float]:
    """JSON has no NaN or infinity: None (a gap, or an unbounded side) instead."""
    return float(value) if value is not None and -math.inf < value < math.inf else None


def history_chart(metric: str, points: Sequence[Point], unit: Optional[str] = None, current: Optional[str] = None,
                  triaged: AbstractSet[str] = frozenset()) -> Dict[str, Any]:
    """A metric's history against time: its values, the bounds each was checked against, the out-of-bounds and
    triaged runs marked, and ``current`` (a run) highlighted."""
    spec: Dict[str, Any] = {"title": metric, "x": "time", "xlabel": "run end (UTC)", "ylabel": axis_label(metric, unit)}
    series: Dict[str, List[Any]] = {k: [] for k in ("xs", "value", "lower", "upper", "out", "triaged", "current",
                                                    "runs", "steps")}
    xs, values, lower, upper, out, marked, this, runs, steps = series.values()
    for p in points:  # one pass (a test page charts thousands of points): the same as a comprehension per series
        row = p.row
        value = _finite(row.value)
        xs.append(row.time)
        values.append(value)
        lower.append(_finite(row.lower))
        upper.append(_finite(row.upper))
        is_triaged = row.run in triaged
        out.append(value if row.within is False and not is_triaged else None)
        marked.append(value if is_triaged else None)
        this.append(value if row.run == current else None)
        runs.append(row.run)
        steps.append(p.step)
    return {**spec, **series}


def curve_chart(curve: Curve) -> Dict[str, Any]:
    """One run's curve of a tag (one aggregation of its windows) against the step, with the bounds of the live
    window check where they are known (the alert's stored bound where the window alerted)."""
    values = [_finite(p.value) for p in curve.points]
    label = f"{curve.tag} · {curve.aggregation} per {curve.kind} window"
    return {
        "title": label, "x": "step", "xlabel": "step", "ylabel": axis_label(curve.tag, curve.unit),
        "xs": [p.step for p in curve.points],
        "value": values,
        "lower": [_finite(p.lower) for p in curve.points],
        "upper": [_finite(p.upper) for p in curve.points],
        "out": [v if p.out_of_bounds else None for v, p in zip(values, curve.points)],
        "triaged": [None] * len(values),
        "current": [None] * len(values),
        "runs": [f"window {p.index}" for p in curve.points],
        "steps": [p.step for p in curve.points],
    }


def has_bounds(points: Sequence[Point]) -> bool:
    """Whether any value of the history was checked (the test page charts checked metrics)."""
    return any(p.row.within is not None for p in points)


def by_metric(points: Sequence[Point]) -> Dict[str, List[Point]]:
    grouped: Dict[str, List[Point]] = {}
    for p in points:
        grouped.setdefault(p.row.metric, []).append(p)
    return grouped
