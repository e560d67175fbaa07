"""The data of the dashboard's interactive charts, as JSON specs ``static/dashboard.js`` draws with uPlot.

A spec is a dict: ``title``, ``x`` (``time``: seconds since the epoch, or ``step``), axis labels (the y label
carries the unit), ``xs``, the ``value`` series, ``lower``/``upper`` (the bounds band; None where unbounded or
unchecked), the marked points (``out``: out of bounds, ``triaged``: covered by a triage action, ``current``: this
page's run) and per point the ``runs`` and ``steps`` the hover shows. Pure functions: records in, dicts out.
"""

from __future__ import annotations

import math
from typing import AbstractSet, Any, Dict, List, Optional, Sequence

from dashboard.queries import Series
from report.data import Curve


def axis_label(name: str, unit: Optional[str]) -> str:
    return f"{name} ({unit})" if unit else name


def _finite_all(values: Sequence[Optional[float]]) -> List[Optional[float]]:
    """The values as floats; JSON has no NaN or infinity: None (a gap, or an unbounded side) instead."""
    return [float(v) if v is not None and -math.inf < v < math.inf else None for v in values]


def history_chart(series: Series, unit: Optional[str] = None, current: Optional[str] = None,
                  triaged: AbstractSet[str] = frozenset()) -> Dict[str, Any]:
    """A metric's history against time: its values, the bounds each was checked against, the out-of-bounds and
    triaged runs marked, and ``current`` (a run) highlighted."""
    values = _finite_all(series.values)
    is_triaged = [run in triaged for run in series.runs]
    return {
        "title": series.metric, "x": "time", "xlabel": "run end (UTC)", "ylabel": axis_label(series.metric, unit),
        "xs": list(series.times), "value": values,
        "lower": _finite_all(series.lower), "upper": _finite_all(series.upper),
        "out": [v if w is False and not t else None for v, w, t in zip(values, series.within, is_triaged)],
        "triaged": [v if t else None for v, t in zip(values, is_triaged)],
        "current": [v if run == current else None for v, run in zip(values, series.runs)],
        "runs": list(series.runs), "steps": list(series.steps),
    }


def curve_chart(curve: Curve) -> Dict[str, Any]:
    """One run's curve of a tag (one aggregation of its windows) against the step, with the bounds of the live
    window check where they are known (the alert's stored bound where the window alerted)."""
    values = _finite_all([p.value for p in curve.points])
    label = f"{curve.tag} · {curve.aggregation} per {curve.kind} window"
    return {
        "title": label, "x": "step", "xlabel": "step", "ylabel": axis_label(curve.tag, curve.unit),
        "xs": [p.step for p in curve.points],
        "value": values,
        "lower": _finite_all([p.lower for p in curve.points]),
        "upper": _finite_all([p.upper for p in curve.points]),
        "out": [v if p.out_of_bounds else None for v, p in zip(values, curve.points)],
        "triaged": [None] * len(values),
        "current": [None] * len(values),
        "runs": [f"window {p.index}" for p in curve.points],
        "steps": [p.step for p in curve.points],
    }
