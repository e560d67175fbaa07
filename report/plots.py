"""The report's figures: matplotlib on the Agg canvas, without pyplot (no global figure state).

Each ``*_figure`` function turns one of ``data.py``'s dataclasses into a ``Figure`` whose axes are
the panels, in order (tests inspect them); :func:`save` writes it as a PNG. Names from the data
are never parsed as mathtext (``text.parse_math`` is off while drawing and saving).

Speed: a layout (figure, axes, margins) is built once per shape and reused by the next figure of
the same shape (:class:`Figures`): creating axes and their ticks is about 40% of a small figure.
A figure is drawn the same way on a fresh and on a reused layout: every data artist, title and
legend is replaced and every limit set explicitly.
"""

from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from matplotlib import dates as mdates
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from report.data import (
    DAY_SECONDS,
    GRID_STATES,
    NO_RUN,
    OUT_OF_BOUNDS,
    Curve,
    MetricPanel,
    ReportSection,
    RunPicture,
    StatusGrid,
    bound_lines,
    short_label,
    step_range,
    time_range,
    value_range,
)

DPI = 80
STYLE = {
    "text.parse_math": False,           # a "$" in a test or metric name is text, not TeX
    "axes.titley": 1.0,                 # a fixed title position: "auto" measures every axis at each draw
    "axes.formatter.useoffset": False,  # 74.51 reads better than 0.01 + 7.45e1
    "font.size": 8, "axes.titlesize": 9, "figure.titlesize": 11,
    "axes.spines.top": False, "axes.spines.right": False,
}
VALUE = "#1f4e9c"
BAND = "#2e9d5b"
ALERT = "#d32f2f"
STATE_COLORS = {NO_RUN: "#f0f0f0", "success": "#4caf50", OUT_OF_BOUNDS: "#ffb300", "failure": "#d32f2f",
                "timeout": "#8e24aa", "missing": "#757575", "running": "#42a5f5"}
STATE_LABELS = {NO_RUN: "no run", OUT_OF_BOUNDS: "metrics out of bounds"}


@contextlib.contextmanager
def style() -> Iterator[None]:
    """The report's matplotlib settings, for drawing and saving figures (entering it copies every setting)."""
    with rc_context(STYLE):
        yield


def new_figure(width: float, height: float) -> Figure:
    """A figure on its own Agg canvas."""
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def save(figure: Figure, path: str) -> None:
    figure.savefig(path, dpi=DPI)


def margins(figure: Figure, top: float, bottom: float, left: float = 0.7, right: float = 0.25,
            hspace: float = 0.45, wspace: float = 0.2) -> None:
    """Fixed margins in inches (cheaper than a layout engine, which draws the figure twice)."""
    width, height = figure.get_size_inches()
    figure.subplots_adjust(top=1 - top / height, bottom=bottom / height, left=left / width,
                           right=1 - right / width, hspace=hspace, wspace=wspace)


def state_label(state: str) -> str:
    return STATE_LABELS.get(state, state)


def clear_data(figure: Figure) -> None:
    """Removes what the last drawing put on a layout: data artists, titles and legends."""
    for ax in figure.axes:
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
        for loc in ("left", "right"):
            ax.set_title("", loc=loc)
    for legend in list(figure.legends):
        legend.remove()


def titles(figure: Figure, title: str, handles: List, color: str = "black") -> None:
    """The figure's title, and one row of legend entries under it."""
    figure.suptitle(title, x=0.01, ha="left", color=color)
    figure.legend(handles=handles, loc="upper left", ncols=len(handles), frameon=False,
                  bbox_to_anchor=(0.0, 1 - 0.3 / figure.get_figheight()))


def has_values(line: Sequence[float]) -> bool:
    """Whether a line has anything to draw (drawing an all-NaN line still costs)."""
    return any(not math.isnan(v) for v in line)


# --------------------------------------------------------------------------
# Metric history
# --------------------------------------------------------------------------


def history_layout(count: int) -> Figure:
    """Panels for ``count`` metrics sharing the date axis: one column up to 2, then two."""
    columns = 1 if count <= 2 else 2
    rows = max(1, math.ceil(count / columns))
    figure = new_figure(11, 1.1 + 2.1 * rows)
    axes = figure.subplots(rows, columns, sharex=True, squeeze=False).ravel()
    for ax in axes[count:]:
        figure.delaxes(ax)
    for index, ax in enumerate(axes[:count]):
        if index + columns >= count:  # the lowest panel of its column shows the dates
            ax.xaxis.set_tick_params(labelbottom=True)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    axes[0].xaxis.set_major_locator(locator)  # shared by every panel
    axes[0].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    margins(figure, top=0.95, bottom=0.45)
    return figure


def draw_history(figure: Figure, section: ReportSection) -> Figure:
    clear_data(figure)
    for ax, panel in zip(figure.axes, section.panels):
        history_panel(ax, panel, section)
    start, end = time_range(section)
    figure.axes[0].set_xlim(start / DAY_SECONDS, end / DAY_SECONDS)  # matplotlib dates: days since 1970
    titles(figure, f"{short_label(section.test, 90)}: metric history (x = run end, UTC)", history_legend(section))
    return figure


def history_figure(section: ReportSection) -> Figure:
    """One panel per metric of the test (``section.panels`` order), over run end time."""
    return draw_history(history_layout(len(section.panels)), section)


def history_panel(ax, panel: MetricPanel, section: ReportSection) -> None:
    """Values, bounds (band where both sides exist, dashed where one), out-of-bounds points, bad runs."""
    points = panel.points
    x = [p.time / DAY_SECONDS for p in points]
    bounds = bound_lines(points)
    if has_values(bounds.band_lower):
        ax.fill_between(x, bounds.band_lower, bounds.band_upper, color=BAND, alpha=0.18, linewidth=0)
        for line in (bounds.band_lower, bounds.band_upper):
            ax.plot(x, line, color=BAND, linewidth=0.8, marker="_", markersize=6)
    for line in (bounds.lower_only, bounds.upper_only):
        if has_values(line):
            ax.plot(x, line, color=BAND, linewidth=1.1, linestyle="--", marker="_", markersize=6,
                    zorder=2.5)  # over the values: a bound equal to them (a constant metric) stays visible
    ax.plot(x, [p.value for p in points], color=VALUE, linewidth=1, marker="o", markersize=3)
    bad = [(xi, p) for xi, p in zip(x, points) if p.status != "success"]
    if bad:
        ax.scatter([xi for xi, _ in bad], [p.value for _, p in bad], s=30, zorder=3, facecolors="white",
                   edgecolors=[STATE_COLORS.get(p.status, "black") for _, p in bad], linewidths=1.2)
    out = [(xi, p.value) for xi, p in zip(x, points) if p.out_of_bounds]
    if out:
        ax.plot(*zip(*out), linestyle="none", marker="X", markersize=8, color=ALERT, zorder=4)
    for status in ("failure", "timeout", "missing"):
        times = [i.time / DAY_SECONDS for i in section.incidents if i.status == status]
        if times:
            ax.vlines(times, 0, 1, transform=ax.get_xaxis_transform(), colors=STATE_COLORS[status],
                      linestyles=":", linewidth=1.3)
    ax.set_ylim(*value_range(panel))
    ax.set_title(short_label(panel.metric, 70), loc="left", color=ALERT if panel.latest_out_of_bounds else "black")
    if panel.latest_out_of_bounds:
        ax.set_title("latest value out of bounds", loc="right", color=ALERT, fontsize=8)


def history_legend(section: ReportSection) -> List:
    """Legend entries for what the figure shows."""
    points = [p for panel in section.panels for p in panel.points]
    handles = [Line2D([], [], color=VALUE, marker="o", markersize=3, label="value")]
    if any(p.lower is not None and p.upper is not None for p in points):
        handles.append(Patch(color=BAND, alpha=0.3, label="bounds (both sides)"))
    if any((p.lower is None) != (p.upper is None) for p in points):
        handles.append(Line2D([], [], color=BAND, linestyle="--", label="bound (one side)"))
    if any(p.out_of_bounds for p in points):
        handles.append(Line2D([], [], color=ALERT, marker="X", linestyle="none", label="out of bounds"))
    for status in sorted({i.status for i in section.incidents}):
        handles.append(Line2D([], [], color=STATE_COLORS.get(status, "black"), linestyle=":",
                              label=f"{status} run"))
    return handles


# --------------------------------------------------------------------------
# Per-run curves
# --------------------------------------------------------------------------


def run_layout(count: int) -> Figure:
    """``count`` panels stacked on a shared step axis."""
    figure = new_figure(10, 1.0 + 2.3 * max(1, count))
    axes = figure.subplots(max(1, count), 1, sharex=True, squeeze=False).ravel()
    axes[-1].set_xlabel("step")
    margins(figure, top=0.95, bottom=0.45, left=0.8)
    return figure


def draw_run(figure: Figure, picture: RunPicture, band_stddevs: float) -> Figure:
    clear_data(figure)
    for ax, curve in zip(figure.axes, picture.curves):
        curve_panel(ax, curve)
    figure.axes[0].set_xlim(*step_range(picture))
    titles(figure, f"{short_label(picture.test, 60)} / run {short_label(picture.run, 60)}: "
                   f"{state_label(picture.status)}", run_legend(picture, band_stddevs),
           color="black" if picture.status == "success" else STATE_COLORS.get(picture.status, "black"))
    return figure


def run_figure(picture: RunPicture, band_stddevs: float) -> Figure:
    """One panel per curve of the run (``picture.curves`` order), against the training step."""
    return draw_run(run_layout(len(picture.curves)), picture, band_stddevs)


def run_legend(picture: RunPicture, band_stddevs: float) -> List:
    handles = [Line2D([], [], color=VALUE, marker="o", markersize=3, label="this run (value of each window)")]
    if any(p.band for c in picture.curves for p in c.points):
        handles.append(Patch(color=BAND, alpha=0.3, label=f"earlier successful runs at the same steps: "
                                                          f"mean ± {band_stddevs:g}·std"))
    if any(c.alert_spans for c in picture.curves):
        handles.append(Patch(color=ALERT, alpha=0.2, label="alert window"))
    return handles


def curve_panel(ax, curve: Curve) -> None:
    """The run's windows, the band where earlier runs give one, the alert windows shaded."""
    x = [p.step for p in curve.points]
    nan = math.nan
    if any(p.band for p in curve.points):
        ax.fill_between(x, [p.band.lower if p.band else nan for p in curve.points],
                        [p.band.upper if p.band else nan for p in curve.points], color=BAND, alpha=0.25,
                        linewidth=0)
        ax.plot(x, [p.band.mean if p.band else nan for p in curve.points], color=BAND, linewidth=0.8,
                linestyle="--")
    ax.plot(x, [p.value for p in curve.points], color=VALUE, linewidth=1.2, marker="o", markersize=3)
    for start, end in curve.alert_spans:
        if start == end:
            ax.axvline(start, color=ALERT, alpha=0.5, linewidth=3)
        else:
            ax.axvspan(start, end, color=ALERT, alpha=0.18, linewidth=0)
    ax.set_ylim(*(curve.limits or (0.0, 1.0)))
    ax.set_title(short_label(curve.tag, 70), loc="left", color=ALERT if curve.alert_spans else "black")
    ax.set_title(f"{curve.aggregation} of {curve.kind} windows", loc="right", fontsize=8)


# --------------------------------------------------------------------------
# Status grid
# --------------------------------------------------------------------------


def status_figure(grid: StatusGrid) -> Figure:
    """tests x days, colored by the state of each day's latest run."""
    label_chars = max([len(short_label(t, 40)) for t in grid.tests] + [10])
    left = 0.3 + 0.065 * label_chars
    figure = new_figure(min(max(7.0, left + 0.5 + 0.28 * len(grid.days)), 24), 1.6 + 0.26 * max(1, len(grid.tests)))
    ax = figure.subplots()
    if grid.days and grid.tests:
        codes = [[GRID_STATES.index(state) for state in row] for row in grid.states]
        ax.imshow(codes, cmap=ListedColormap([STATE_COLORS[s] for s in GRID_STATES]), vmin=-0.5,
                  vmax=len(GRID_STATES) - 0.5, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(grid.tests)), [short_label(t, 40) for t in grid.tests])
        every = max(1, math.ceil(len(grid.days) / 15))
        ticks = list(range(0, len(grid.days), every))
        ax.set_xticks(ticks, [mdates.num2date(grid.days[i]).strftime("%m-%d") for i in ticks])
        ax.set_xticks([i - 0.5 for i in range(1, len(grid.days))], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, len(grid.tests))], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
    figure.suptitle("Latest run per day (UTC)", x=0.01, ha="left")
    figure.legend(handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#bbbbbb", label=state_label(s))
                           for s in GRID_STATES], loc="lower left", ncols=len(GRID_STATES), frameon=False)
    margins(figure, top=0.45, bottom=0.75, left=left, right=0.3)
    return figure


# --------------------------------------------------------------------------
# Rendering many figures
# --------------------------------------------------------------------------


class Figures:
    """Builds figures, reusing the layout of the previous figure of the same kind and panel count."""

    def __init__(self):
        self._layouts: Dict[Tuple[str, int], Figure] = {}

    def _layout(self, kind: str, count: int, make) -> Figure:
        if (kind, count) not in self._layouts:
            self._layouts[(kind, count)] = make(count)
        return self._layouts[(kind, count)]

    def figure(self, kind: str, data, band_stddevs: Optional[float] = None) -> Figure:
        """The figure of a ``history``, ``run`` or ``status`` task."""
        if kind == "history":
            return draw_history(self._layout(kind, len(data.panels), history_layout), data)
        if kind == "run":
            return draw_run(self._layout(kind, len(data.curves), run_layout), data, band_stddevs)
        return status_figure(data)


def panel_titles(figure: Figure) -> List[str]:
    """The left titles of the figure's panels, in order (what tests and the manifest look at)."""
    return [ax.get_title(loc="left") for ax in figure.axes]


def render_batch(tasks: Sequence[tuple]) -> List[List[str]]:
    """Draws and saves each (kind, data, path, k) task in the report's style; returns the panel titles."""
    figures = Figures()
    results = []
    with style():
        for kind, data, path, band_stddevs in tasks:
            figure = figures.figure(kind, data, band_stddevs)
            save(figure, path)
            results.append(panel_titles(figure))
    return results
