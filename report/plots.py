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
import io
import math
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from matplotlib import dates as mdates
from matplotlib import rc_context
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from report.data import (
    DAY_SECONDS,
    GRID_STATES,
    NO_RUN,
    OUT_OF_BOUNDS,
    BoundLines,
    Curve,
    MetricPanel,
    ReportSection,
    RunPicture,
    StatusGrid,
    bound_lines,
    check_text,
    run_title,
    short_label,
    step_range,
    time_range,
    value_range,
)

DPI = 80
PNG_OPTIONS = {"compress_level": 1}  # a quarter of zlib's default work for files about a fifth larger
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
TRIAGED = "#757575"  # grey: a value someone accepted or dismissed is no open alert
STATE_COLORS = {NO_RUN: "#f0f0f0", "success": "#4caf50", OUT_OF_BOUNDS: "#ffb300", "failure": "#d32f2f",
                "timeout": "#8e24aa", "missing": "#757575", "running": "#42a5f5"}
STATE_LABELS = {NO_RUN: "no run", OUT_OF_BOUNDS: "metrics out of bounds"}


@contextlib.contextmanager
def style() -> Iterator[None]:
    """The report's matplotlib settings, for drawing and saving figures (entering it copies every setting)."""
    with rc_context(STYLE):  # type: ignore[arg-type]  # matplotlib types keys as the literal names
        yield


def new_figure(width: float, height: float) -> Figure:
    """A figure on its own Agg canvas."""
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def save(figure: Figure, path: str) -> None:
    figure.savefig(path, dpi=DPI, pil_kwargs=PNG_OPTIONS)


def warm_up() -> None:
    """Loads what the first figure would otherwise load (fonts, the text layout engine), in a worker that
    starts before there is anything to draw."""
    figure = new_figure(2, 1)
    with style():
        ax = figure.add_subplot()
        ax.set_title("warm-up", loc="left")
        ax.plot([0, 1], [0, 1], marker="o")
        figure.savefig(io.BytesIO(), dpi=DPI, format="png", pil_kwargs=PNG_OPTIONS)


def margins(figure: Figure, top: float, bottom: float, left: float = 0.7, right: float = 0.25,
            hspace: float = 0.45, wspace: float = 0.2) -> None:
    """Fixed margins in inches (cheaper than a layout engine, which draws the figure twice); the top one is
    set again by :func:`titles` once the title and the legend are measured."""
    width, height = figure.get_size_inches()
    figure.subplots_adjust(top=1 - top / height, bottom=bottom / height, left=left / width,
                           right=1 - right / width, hspace=hspace, wspace=wspace)


def state_label(state: str) -> str:
    return STATE_LABELS.get(state, state)


def clear_data(figure: Figure) -> None:
    """Removes what the last drawing put on a layout: data artists, titles and legends (the suptitle is set
    again by :func:`titles`)."""
    for ax in figure.axes:
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
        for loc in ("left", "right"):
            ax.set_title("", loc=loc)
    for legend in list(figure.legends):
        legend.remove()


TITLE_TOP = 0.1          # inches from the figure's top edge to the title's
HEADER_GAP = 0.06        # inches between the title and the legend
AXES_TITLE_ROOM = 0.32   # inches above the top panels for their titles (one line)
EDGE = 0.1               # inches kept free at the figure's left and right edges


def titles(figure: Figure, title: str, handles: List, color: str = "black",
           axes_title_room: float = AXES_TITLE_ROOM) -> None:
    """The figure's title at the top, the legend under it and the panels under both, stacked in inches from
    the measured sizes of the title and the legend, so that none overlaps another whatever the figure's height,
    the number of title lines or of legend entries (legend columns are dropped until it fits the width)."""
    width, height = figure.get_size_inches()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas's
    text = figure.suptitle(title, x=EDGE / width, y=1 - TITLE_TOP / height, ha="left", va="top", color=color)
    text.set_text(fitted(title, text.get_fontproperties(), (width - 2 * EDGE) * figure.dpi, renderer))
    below_title = TITLE_TOP + text.get_window_extent(renderer).height / figure.dpi + HEADER_GAP
    legend_height = 0.0
    for columns in range(len(handles), 0, -1):
        legend = figure.legend(handles=handles, loc="upper left", ncols=columns, frameon=False, borderaxespad=0,
                               bbox_to_anchor=(EDGE / width, 1 - below_title / height))
        extent = legend.get_window_extent(renderer)
        legend_height = extent.height / figure.dpi
        if extent.width / figure.dpi <= width - 2 * EDGE or columns == 1:
            break
        legend.remove()
    figure.subplots_adjust(top=1 - (below_title + legend_height + axes_title_room) / height)


def fitted(text: str, font: FontProperties, width: float, renderer) -> str:
    """``text`` with each line cut with "…" to at most ``width`` pixels in ``font``: names are data, and a
    number of characters does not say how wide they are drawn."""
    lines = []
    for line in text.split("\n"):
        drawn = renderer.get_text_width_height_descent(line, font, ismath=False)[0]
        if drawn > width:
            keep = int(len(line) * width / drawn)
            while keep > 0 and renderer.get_text_width_height_descent(
                    line[:keep].rstrip() + "\u2026", font, ismath=False)[0] > width:
                keep -= 1
            line = line[:keep].rstrip() + "\u2026"
        lines.append(line)
    return "\n".join(lines)


def has_values(line: Sequence[float]) -> bool:
    """Whether a line has anything to draw (drawing an all-NaN line still costs)."""
    return any(not math.isnan(v) for v in line)


# --------------------------------------------------------------------------
# Metric history
# --------------------------------------------------------------------------


def axis_unit(unit: Optional[str]) -> str:
    """A y-axis label: the unit, or that the config gives none (``metric_units``), never a bare number line."""
    return f"value ({unit})" if unit else "value (no unit in metric_units)"


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
            ax.set_xlabel("run end (UTC)", fontsize=8)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    axes[0].xaxis.set_major_locator(locator)  # shared by every panel
    axes[0].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    margins(figure, top=0.95, bottom=0.6, left=0.95)  # room for the axis labels
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
    draw_bounds(ax, x, bound_lines(points))
    ax.plot(x, [p.value for p in points], color=VALUE, linewidth=1, marker="o", markersize=3)
    bad = [(xi, p) for xi, p in zip(x, points) if p.status != "success"]
    if bad:
        ax.scatter([xi for xi, _ in bad], [p.value for _, p in bad], s=30, zorder=3, facecolors="white",
                   edgecolors=[STATE_COLORS.get(p.status, "black") for _, p in bad], linewidths=1.2)
    out = [(xi, p.value) for xi, p in zip(x, points) if p.out_of_bounds and not p.triage]
    if out:
        ax.plot(*zip(*out), linestyle="none", marker="X", markersize=8, color=ALERT, zorder=4)
    triaged = [(xi, p.value) for xi, p in zip(x, points) if p.triage]
    if triaged:  # looked at and accepted or dismissed: no longer an open alert
        ax.plot(*zip(*triaged), linestyle="none", marker="s", markersize=7, markerfacecolor="none",
                markeredgecolor=TRIAGED, markeredgewidth=1.5, zorder=4)
    for status in ("failure", "timeout", "missing"):
        times = [i.time / DAY_SECONDS for i in section.incidents if i.status == status]
        if times:
            ax.vlines(times, 0, 1, transform=ax.get_xaxis_transform(), colors=STATE_COLORS[status],
                      linestyles=":", linewidth=1.3)
    ax.set_ylim(*value_range(panel))
    ax.set_ylabel(axis_unit(panel.unit), fontsize=8)
    ax.set_title(short_label(panel.metric, 70), loc="left", color=ALERT if panel.latest_out_of_bounds else "black")
    if panel.latest_out_of_bounds:
        ax.set_title("latest value out of bounds", loc="right", color=ALERT, fontsize=8)


def draw_bounds(ax, x: Sequence[float], bounds: BoundLines) -> None:
    """Bounds point by point: a shaded band where both sides exist, a dashed line where one does."""
    if has_values(bounds.band_lower):
        ax.fill_between(x, bounds.band_lower, bounds.band_upper, color=BAND, alpha=0.18, linewidth=0)
        for line in (bounds.band_lower, bounds.band_upper):
            ax.plot(x, line, color=BAND, linewidth=0.8, marker="_", markersize=6)
    for line in (bounds.lower_only, bounds.upper_only):
        if has_values(line):
            ax.plot(x, line, color=BAND, linewidth=1.1, linestyle="--", marker="_", markersize=6,
                    zorder=2.5)  # over the values: a bound equal to them (a constant metric) stays visible


def history_legend(section: ReportSection) -> List:
    """Legend entries for what the figure shows."""
    points = [p for panel in section.panels for p in panel.points]
    handles: List[Artist] = [Line2D([], [], color=VALUE, marker="o", markersize=3, label="value")]
    if any(p.lower is not None and p.upper is not None for p in points):
        handles.append(Patch(color=BAND, alpha=0.3, label="bounds (both sides)"))
    if any((p.lower is None) != (p.upper is None) for p in points):
        handles.append(Line2D([], [], color=BAND, linestyle="--", label="bound (one side)"))
    if any(p.out_of_bounds and not p.triage for p in points):
        handles.append(Line2D([], [], color=ALERT, marker="X", linestyle="none", label="out of bounds"))
    if any(p.triage for p in points):
        handles.append(Line2D([], [], color=TRIAGED, marker="s", markerfacecolor="none", linestyle="none",
                              label="triaged (accepted or dismissed)"))
    for status in sorted({i.status for i in section.incidents}):
        handles.append(Line2D([], [], color=STATE_COLORS.get(status, "black"), linestyle=":",
                              label=f"{status} run"))
    return handles


# --------------------------------------------------------------------------
# Per-run curves
# --------------------------------------------------------------------------


RUN_AXES_TITLE_ROOM = 0.45  # a run panel's right title has two lines: the aggregation, then the check


def run_layout(count: int) -> Figure:
    """``count`` panels stacked on a shared step axis."""
    figure = new_figure(10, 1.2 + 2.3 * max(1, count))
    axes = figure.subplots(max(1, count), 1, sharex=True, squeeze=False).ravel()
    axes[-1].set_xlabel("training step")
    margins(figure, top=1.1, bottom=0.5, left=0.95, hspace=0.5)
    return figure


def draw_run(figure: Figure, picture: RunPicture) -> Figure:
    clear_data(figure)
    for ax, curve in zip(figure.axes, picture.curves):
        curve_panel(ax, curve)
    figure.axes[0].set_xlim(*step_range(picture))
    bad = picture.status != "success" or picture.alert_count or any(c.out_of_bounds for c in picture.curves)
    color = STATE_COLORS.get(picture.status, ALERT) if picture.status != "success" else ALERT if bad else "black"
    titles(figure, run_title(picture), run_legend(picture), color=color, axes_title_room=RUN_AXES_TITLE_ROOM)
    return figure


def run_figure(picture: RunPicture) -> Figure:
    """One panel per curve of the run (``picture.curves`` order), against the training step."""
    return draw_run(run_layout(len(picture.curves)), picture)


def run_legend(picture: RunPicture) -> List:
    """Legend entries for what the figure shows; a tag without a live window check says it has no bounds."""
    points = [p for c in picture.curves for p in c.points]
    handles: List[Artist] = [Line2D([], [], color=VALUE, marker="o", markersize=3,
                                     label="this run (value of each window)")]
    if any(p.lower is not None and p.upper is not None for p in points):
        handles.append(Patch(color=BAND, alpha=0.3, label="between the bounds of the live window check"))
    if any((p.lower is None) != (p.upper is None) for p in points):
        handles.append(Line2D([], [], color=BAND, linestyle="--", label="bound of the live window check"))
    if any(p.bound and p.bound.centre is not None for p in points):
        handles.append(Line2D([], [], color=BAND, linestyle=":", label="centre of its history"))
    if any(p.bound and p.bound.stored for p in points):
        handles.append(Line2D([], [], color=BAND, marker="D", markersize=4, linestyle="none",
                              label="bound stored with the alert"))
    if any(p.out_of_bounds for p in points):
        handles.append(Line2D([], [], color=ALERT, marker="X", linestyle="none", label="window out of bounds"))
    if any(c.alert_spans for c in picture.curves):
        handles.append(Patch(color=ALERT, alpha=0.2, label="alert window"))
    unchecked = sorted({c.tag for c in picture.curves if c.check is None and not any(p.bound for p in c.points)})
    if unchecked:
        handles.append(Line2D([], [], linestyle="none", label=short_label(
            f"no window check, no bounds: {', '.join(unchecked)}", 90)))
    return handles


def curve_panel(ax, curve: Curve) -> None:
    """The run's windows against the bounds their live check used, out-of-bounds windows marked, alert
    windows shaded; the right title says which aggregation and which check (or that there is none)."""
    points = curve.points
    x = [p.step for p in points]
    nan = math.nan
    draw_bounds(ax, x, bound_lines(points))
    centre = [p.bound.centre if p.bound and p.bound.centre is not None else nan for p in points]
    if has_values(centre):
        ax.plot(x, centre, color=BAND, linewidth=0.8, linestyle=":")
    stored = [(xi, v) for xi, p in zip(x, points) if p.bound and p.bound.stored
              for v in (p.bound.lower, p.bound.upper) if v is not None]
    if stored:
        ax.plot(*zip(*stored), linestyle="none", marker="D", markersize=4, color=BAND, zorder=3)
    ax.plot(x, [p.value for p in points], color=VALUE, linewidth=1.2, marker="o", markersize=3)
    out = [(xi, p.value) for xi, p in zip(x, points) if p.out_of_bounds]
    if out:
        ax.plot(*zip(*out), linestyle="none", marker="X", markersize=8, color=ALERT, zorder=4)
    for start, end in curve.alert_spans:
        if start == end:
            ax.axvline(start, color=ALERT, alpha=0.5, linewidth=3)
        else:
            ax.axvspan(start, end, color=ALERT, alpha=0.18, linewidth=0)
    ax.set_ylim(*(curve.limits or (0.0, 1.0)))
    ax.set_ylabel(axis_unit(curve.unit), fontsize=8)
    bad = bool(curve.alert_spans or curve.out_of_bounds)
    ax.set_title(short_label(curve.tag, 50), loc="left", color=ALERT if bad else "black")
    check = short_label(check_text(curve), 75)
    out_text = f", {curve.out_of_bounds} out of bounds" if curve.out_of_bounds else ""
    ax.set_title(f"{curve.aggregation} of {curve.kind} windows{out_text}\n{check}", loc="right", fontsize=8,
                 color=ALERT if curve.out_of_bounds else "black")


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
    figure.suptitle("Latest run per day (UTC)", x=EDGE / figure.get_figwidth(),
                    y=1 - TITLE_TOP / figure.get_figheight(), ha="left", va="top")
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

    def figure(self, kind: str, data) -> Figure:
        """The figure of a ``history``, ``run`` or ``status`` task."""
        if kind == "history":
            return draw_history(self._layout(kind, len(data.panels), history_layout), data)
        if kind == "run":
            return draw_run(self._layout(kind, len(data.curves), run_layout), data)
        return status_figure(data)


def panel_titles(figure: Figure) -> List[str]:
    """The left titles of the figure's panels, in order (what tests and the manifest look at)."""
    return [ax.get_title(loc="left") for ax in figure.axes]


def render_batch(tasks: Sequence[tuple]) -> List[List[str]]:
    """Draws and saves each (kind, data, path) task in the report's style; returns the panel titles."""
    figures = Figures()
    results = []
    with style():
        for kind, data, path in tasks:
            figure = figures.figure(kind, data)
            save(figure, path)
            results.append(panel_titles(figure))
    return results
