"""The report's ``index.html``: one static page, no scripts and nothing fetched, readable offline.

Every string from the data (test, run and metric names, alert messages, links) is escaped;
file names come from ``data.safe_name`` and links to logs are kept only for http(s) URLs.
"""

from __future__ import annotations

import datetime
import html
import posixpath
import urllib.parse
from typing import Iterable, List, Optional, Set, Tuple

from core.alert_details import threshold_text, with_unit
from report.data import AlertRecord, ReportData, ReportSection, RunPicture, safe_name

STATUS_FILE = "status.png"
NAME_CELLS = {3, 4, 5, 8, 9}  # test, run, metric, message, next steps of an alert row: training jobs' own text, any length
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1200px;
       overflow-wrap: break-word; }  /* a long name without spaces wraps instead of widening the page */
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
img { max-width: 100%; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 90%; }
td, th { border-bottom: 1px solid #eee; padding: .25em .5em; text-align: left; vertical-align: top; }
td.name { overflow-wrap: anywhere; }  /* names may have no spaces: let the table shrink them, not the page grow */
.meta, figcaption, .note { color: #555; font-size: 90%; }
.bad { color: #c62828; font-weight: 600; }
nav a { margin-right: .8em; display: inline-block; max-width: 100%; }
figure { margin: 1em 0; }
"""


def history_file(test: str) -> str:
    """Where a test's metric history figure goes, relative to the report directory."""
    return posixpath.join(safe_name(test), "history.png")


def run_file(test: str, run: str) -> str:
    """Where a run's picture goes, relative to the report directory."""
    return posixpath.join(safe_name(test), f"run-{safe_name(run)}.png")


def esc(text) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def href(path: str) -> str:
    """A relative link to a file of the report (already safe names; quoted anyway)."""
    return esc(urllib.parse.quote(path))


def utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def number(value: Optional[float], missing: str = "") -> str:
    return missing if value is None else f"{value:.6g}"


def web_link(url) -> Optional[str]:
    """``url`` if it is an http(s) URL (never javascript: and the like)."""
    if isinstance(url, str) and urllib.parse.urlparse(url).scheme in ("http", "https"):
        return url
    return None


def alert_row(alert: AlertRecord, drawn: Set[Tuple[str, str]]) -> str:
    """One alert as a table row; the run links to its picture when there is one."""
    section = f"#t-{safe_name(alert.test)}"
    run_target = f"#r-{safe_name(alert.test)}-{safe_name(alert.run)}" if (alert.test, alert.run) in drawn \
        else section
    bounds = "" if alert.lower_bound is None and alert.upper_bound is None else \
        f"({number(alert.lower_bound, '-inf')}, {number(alert.upper_bound, '+inf')})" + \
        (f" {alert.unit}" if alert.unit else "")
    how = threshold_text(alert.kind, alert.details, alert.lower_bound, alert.upper_bound, alert.unit)
    bounds_html = esc(bounds) + (f'<br><span class="note">{esc(how)}</span>' if how else "")
    value = "" if alert.value is None else with_unit(alert.value, alert.unit)
    run_data = alert.details.get("run_data")
    logs = web_link(run_data.get("logs_link")) if isinstance(run_data, dict) else None
    logs_html = f' <a href="{esc(logs)}" rel="noopener noreferrer">logs</a>' if logs else ""
    report = web_link(alert.report_url)
    logs_html += f' <a href="{esc(report)}" rel="noopener noreferrer">report</a>' if report else ""
    steps = "<br>".join(f"<code>{esc(command)}</code>" for command in alert.next_steps)
    note = alert.triage.get("note")
    state = esc(alert.state.value) + (f'<br><span class="note">{esc(note)}</span>' if isinstance(note, str) else "")
    cells = [esc(utc(alert.created_at)) if alert.created_at is not None else '', esc(alert.kind), state,
             f'<a href="{esc(section)}">{esc(alert.test)}</a>',
             f'<a href="{esc(run_target)}">{esc(alert.run)}</a>{logs_html}', esc(alert.metric or ""),
             esc(value), bounds_html, esc(alert.message), steps]
    return "<tr>" + "".join(f'<td class="name">{c}</td>' if i in NAME_CELLS else f"<td>{c}</td>"
                            for i, c in enumerate(cells)) + "</tr>"


def alerts_html(data: ReportData, drawn: Set[Tuple[str, str]]) -> List[str]:
    if not data.alerts:
        return ["<p>No alerts.</p>"]
    lines = ["<table>", "<tr><th>time (UTC)</th><th>kind</th><th>state</th><th>test</th><th>run</th><th>metric</th>"
                        "<th>value</th><th>bounds</th><th>message</th><th>next steps</th></tr>"]
    lines += [alert_row(alert, drawn) for alert in data.alerts]
    lines.append("</table>")
    if data.alerts_left_out:
        lines.append(f'<p class="note">{data.alerts_left_out} older alerts not shown (--max_alerts).</p>')
    return lines


def curves_note(section: ReportSection) -> List[str]:
    """What the per-run pictures show, and which tags have no bounds and which metrics no curve."""
    if not section.windowed_tags:
        return ['<p class="note">This test has no live windows (<code>window_config</code>), '
                'so there are no per-run curves: its metrics have run-level values only (above).</p>']
    lines = [f'<p class="note">Per-run curves for the tags with live windows: '
             f'{esc(", ".join(section.windowed_tags))}. Bounds: what the live window check of the tag compared '
             f'each window with: the bounds stored with its alert where a window alerted, else the check replayed '
             f'over the stored windows with its configuration (<code>--config_dir</code>): its rule, its '
             f'aggregation, and only the earlier successful runs it counted, without their out-of-bounds windows. '
             f'Red crosses: windows out of those bounds; red shading: alert windows.</p>']
    if section.unchecked_tags:
        lines.append(f'<p class="note">No window check in the configs, so no bounds (but those stored with their '
                     f'alerts, if any): {esc(", ".join(section.unchecked_tags))}.</p>')
    if section.curveless_metrics:
        lines.append(f'<p class="note">No per-run curve (their tags have no live windows): '
                     f'{esc(", ".join(section.curveless_metrics))}.</p>')
    lines += [f'<p class="note">{esc(note)}</p>' for note in section.notes]
    return lines


def picture_html(picture: RunPicture) -> str:
    anchor = f"r-{safe_name(picture.test)}-{safe_name(picture.run)}"
    status = picture.status if picture.status == "success" else f'<span class="bad">{esc(picture.status)}</span>'
    problems = (f': <span class="bad">{esc("; ".join(picture.problems))}</span>' if picture.problems else "")
    alerts = f", {picture.alert_count} alert{'' if picture.alert_count == 1 else 's'}" if picture.alert_count else ""
    return (f'<figure id="{esc(anchor)}"><img loading="lazy" src="{href(run_file(picture.test, picture.run))}" '
            f'alt="{esc(f"curves of run {picture.run}")}"><figcaption>run {esc(picture.run)}: {status}, '
            f'{"ended" if picture.status != "running" else "last window"} {esc(utc(picture.end))} UTC'
            f'{alerts}{problems}</figcaption></figure>')


def section_html(section: ReportSection) -> List[str]:
    """A test: its metric history, then its runs' pictures (latest first)."""
    lines = [f'<section id="t-{esc(section.slug)}">', f"<h2>{esc(section.test)}</h2>"]
    if section.panels:
        lines.append(f'<img loading="lazy" src="{href(history_file(section.test))}" '
                     f'alt="{esc(f"metric history of {section.test}")}">')
    else:
        lines.append('<p class="note">No metric history.</p>')
    lines += curves_note(section)
    lines += [picture_html(p) for p in section.pictures]
    lines.append("</section>")
    return lines


def index_html(data: ReportData, source: str) -> str:
    """The whole page."""
    drawn = {(p.test, p.run) for s in data.sections for p in s.pictures}
    nav = " ".join(f'<a href="#t-{esc(s.slug)}">{esc(s.test)}</a>' for s in data.sections)
    lines = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>trainguard report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>trainguard report</h1>",
             f'<p class="meta">Source: {esc(source)}. {len(data.sections)} tests, {data.run_count} runs.</p>',
             f"<nav>{nav}</nav>", "<h2>Status</h2>",
             f'<img src="{href(STATUS_FILE)}" alt="status grid: the latest run of each test and day">',
             "<h2>Alerts (latest first)</h2>", *alerts_html(data, drawn)]
    for section in data.sections:
        lines += section_html(section)
    lines.append("</body></html>")
    return "\n".join(lines) + "\n"


def figure_files(data: ReportData) -> Iterable[Tuple[str, object, str]]:
    """(kind, data, relative path) of every figure of the report, status grid first."""
    yield "status", data.grid, STATUS_FILE
    for section in data.sections:
        if section.panels:
            yield "history", section, history_file(section.test)
    for section in data.sections:
        for picture in section.pictures:
            yield "run", picture, run_file(picture.test, picture.run)
