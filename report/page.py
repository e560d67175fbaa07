"""The report's ``index.html``: one static page, no scripts and nothing fetched, readable offline.

Every string from the data (test, run and metric names, alert messages, links) is escaped;
file names come from ``data.safe_name`` and links to logs are kept only for http(s) URLs.
"""

from __future__ import annotations

import html
import posixpath
import urllib.parse
from typing import Iterable, List, Optional, Set, Tuple

from core.alert_details import (
    SCALES_NOTE,
    change_text,
    previous_text,
    run_lifecycle_text,
    threshold_text,
    utc_minute,
    with_unit,
)
from report.data import AlertRecord, ReportData, ReportSection, RunPicture, safe_name
from report.source import JobRow

STATUS_FILE = "status.png"
# test, run, metric and message of an alert row are training jobs' own text, any length
CELL_CLASSES = {3: "name", 4: "name", 6: "bounds", 7: "name message"}
COLUMNS = ("time (UTC)", "kind", "state", "test and run", "metric", "value", "bounds", "message")
LIFECYCLE_KINDS = {"job_failed", "run_missing", "run_stalled"}
SPLIT_MESSAGE_KINDS = {"metric_out_of_bounds", "window_out_of_bounds"}  # messages the value and bounds cells repeat
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222;
       overflow-wrap: break-word; }  /* the page width, all of it; a long heading wraps instead of widening it */
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
img { max-width: 100%; border: 1px solid #eee; }
.scroll { overflow-x: auto; max-width: 100%; }  /* a table wider than the window scrolls by itself */
table { border-collapse: collapse; font-size: 90%; width: 100%; }
td, th { border-bottom: 1px solid #eee; padding: .25em .4em; text-align: left; vertical-align: top; }
td.name { overflow-wrap: normal; }
table.alerts td:first-child { white-space: nowrap; }  /* a date and time, not broken at its dashes */
td.message { min-width: 14em; }  /* the one column of prose: room to read it */
td.bounds { min-width: 8em; }
.id { white-space: nowrap; }  /* an identifier never breaks mid-word: the table scrolls instead */
tr:has(+ tr.steps) td { border-bottom: none; }  /* an alert and its next steps read as one */
pre.cmd { margin: 0 0 .2em; white-space: pre; font-size: 90%; }  /* whole commands, to copy as they are */
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


def number(value: Optional[float], missing: str = "") -> str:
    return missing if value is None else f"{value:.6g}"


def web_link(url) -> Optional[str]:
    """``url`` if it is an http(s) URL (never javascript: and the like)."""
    if isinstance(url, str) and urllib.parse.urlparse(url).scheme in ("http", "https"):
        return url
    return None


def ident(text) -> str:
    """An identifier (test, run, metric): one unbreakable piece, so a table never wraps it mid-word."""
    return f'<span class="id">{esc(text)}</span>'


def words_html(text: str) -> str:
    """Prose that names identifiers (runs, metrics, files): it wraps at its spaces only, never at a ``-`` or
    ``/`` inside a word, which a browser would otherwise break at."""
    return " ".join(ident(word) if "-" in word or "/" in word else esc(word) for word in text.split(" "))


def message_html(alert: AlertRecord) -> str:
    """The message, less what the value and bounds cells of the row already say.

    A value alert's message (``core.alert_details.describe``) repeats the value, the bounds and how they were
    computed: the row shows only the rest (change, previous value, window)."""
    if alert.kind not in SPLIT_MESSAGE_KINDS or alert.metric is None or \
            not alert.message.startswith(f"{alert.metric} = "):
        return words_html(alert.message)
    window = alert.details.get("window")
    where = f"{window.get('kind')} window {window.get('index')} (steps {window.get('start_step')}-" \
        f"{window.get('end_step')})" if isinstance(window, dict) else ""
    rest = [part for part in (where, change_text(alert.details), previous_text(alert.details, alert.unit)) if part]
    return "<br>".join(words_html(part) for part in rest) if rest else words_html(alert.message)


def lifecycle_text(alert: AlertRecord, job: Optional[JobRow]) -> str:
    """For a lifecycle alert, what its run's job_history row adds: how long the run ran and when it was last
    heard from (a missing run's end is its last message); "" for other alerts or a run without a row."""
    if alert.kind not in LIFECYCLE_KINDS or job is None:
        return ""
    missing = alert.details.get("ranks_missing")
    return run_lifecycle_text(job.start, job.end, missing if isinstance(missing, list) else (),
                              alert.details.get("best_value"))


def steps_row(alert: AlertRecord) -> str:
    """The alert's next steps under its row, across the table: whole commands in a block, to copy."""
    if not alert.next_steps:
        return ""
    commands = "\n".join(f"<code>{esc(command)}</code>" for command in alert.next_steps)
    return (f'<tr class="steps"><td colspan="{len(COLUMNS)}"><span class="note">next steps:</span>'
            f'<pre class="cmd">{commands}</pre></td></tr>')


def alert_row(alert: AlertRecord, drawn: Set[Tuple[str, str]], job: Optional[JobRow] = None) -> str:
    """One alert as a table row (and its next steps in a row under it); the run links to its picture when
    there is one."""
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
    report = web_link(alert.report_url)
    outside = [f'<a href="{esc(url)}" rel="noopener noreferrer">{label}</a>'
               for label, url in (("logs", logs), ("report", report)) if url]
    logs_html = "<br>" + " ".join(outside) if outside else ""
    note = alert.triage.get("note")
    state = esc(alert.state.value) + (f'<br><span class="note">{esc(note)}</span>' if isinstance(note, str) else "")
    cells = [esc(utc_minute(alert.created_at)) if alert.created_at is not None else '', esc(alert.kind), state,
             f'<a href="{esc(section)}">{ident(alert.test)}</a><br>'  # one column for both: room for the prose
             f'<a href="{esc(run_target)}">{ident(alert.run)}</a>{logs_html}',
             ident(alert.metric) if alert.metric else "", esc(value), bounds_html,
             "<br>".join(part for part in (message_html(alert), words_html(lifecycle_text(alert, job))) if part)]
    return "<tr>" + "".join(f'<td class="{CELL_CLASSES[i]}">{c}</td>' if i in CELL_CLASSES else f"<td>{c}</td>"
                            for i, c in enumerate(cells)) + "</tr>" + steps_row(alert)


def alerts_html(data: ReportData, drawn: Set[Tuple[str, str]]) -> List[str]:
    if not data.alerts:
        return ["<p>No alerts.</p>"]
    lines = ['<div class="scroll"><table class="alerts">', "<tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + "</tr>"]
    rows = [alert_row(alert, drawn, data.jobs.get(alert.group_key)) for alert in data.alerts]
    lines += rows
    lines.append("</table></div>")
    if any("scales" in row for row in rows):
        lines.append(f'<p class="note" id="scales">{esc(SCALES_NOTE)}</p>')
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
            f'{"ended" if picture.status != "running" else "last window"} {esc(utc_minute(picture.end))} UTC'
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
