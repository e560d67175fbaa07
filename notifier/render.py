"""E-mail rendering: subject, HTML body and plain-text alternative.

Everything that comes from an alert (test and run ids, metric names, messages,
links) is user-controlled: training jobs choose their names and lifecycle data.
The HTML body escapes every such string with :func:`html.escape`, only
``http``/``https`` links become ``href`` attributes, and the subject is one
line without control characters (SendGrid rejects line breaks in subjects).
"""

from __future__ import annotations

import dataclasses
import html
import unicodedata
import urllib.parse
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from core.alert_details import (
    SCALES_NOTE,
    change_text,
    number,
    previous_text,
    run_lifecycle_text,
    threshold_text,
    with_unit,
)
from core.alert_record import NAME_MAX_CHARS, AlertRecord, alert_problems, by_kind, one_line
from core.records import iso_utc
from notifier.config import EmailConfig

SUBJECT_MAX_CHARS = 200
_NAME_MAX_CHARS = NAME_MAX_CHARS  # of a test, run or metric name inside a subject
_COMPARED_RUNS_SHOWN = 5
SPLIT_MESSAGE_KINDS = {"metric_out_of_bounds", "window_out_of_bounds"}  # messages the value and bounds cells repeat
CONFIG_FIX = ("fix the file and upload the config directory again (run_dataflow.sh configs): the job re-reads it "
              "every few minutes")


@dataclasses.dataclass(frozen=True)
class RenderedEmail:
    """One e-mail, ready for the sender: addresses, subject, both bodies, the alerts it carries."""
    sender: str
    recipients: Tuple[str, ...]
    subject: str
    html: str
    text: str
    alert_ids: Tuple[str, ...]
    label: str  # short file-name-friendly description ("<test>-<run>" or "summary")
    kind: str = "digest"  # or "summary"

    @property
    def cost(self) -> int:
        """Units of the daily budget it uses: SendGrid counts every recipient."""
        return len(self.recipients)


# --------------------------------------------------------------------------
# Small formatting helpers
# --------------------------------------------------------------------------


def bounds_text(alert: AlertRecord) -> str:
    """``(lower, upper)`` with open ends as ∓inf, plus the comparison when known; "" without bounds."""
    if alert.lower_bound is None and alert.upper_bound is None:
        return ""
    low = "-inf" if alert.lower_bound is None else number(alert.lower_bound)
    high = "+inf" if alert.upper_bound is None else number(alert.upper_bound)
    comparison = alert.details.get("comparison")
    suffix = f" [{comparison}]" if isinstance(comparison, str) else ""
    return f"({low}, {high})" + (f" {alert.unit}" if alert.unit else "") + suffix


def value_text(alert: AlertRecord) -> str:
    return "" if alert.value is None else with_unit(alert.value, alert.unit)


def how_text(alert: AlertRecord) -> str:
    """How the bounds were computed ("median 74.6 − 5 × robust scale 0.3 from 20 earlier runs"), "" if unknown."""
    return threshold_text(alert.kind, alert.details, alert.lower_bound, alert.upper_bound, alert.unit)


def history_text(alert: AlertRecord) -> str:
    size = alert.history_size
    return "" if size is None else f"{size} earlier value{'s' if size != 1 else ''}"


def extra_facts(alert: AlertRecord) -> List[str]:
    """Kind-specific facts: the job status, the window, the compared runs, how to fix a rejected config."""
    facts = []
    if alert.kind in ("job_failed", "run_missing") and alert.status and f"status {alert.status}" not in alert.message:
        facts.append(f"status {alert.status}")
    facts += lifecycle_facts(alert)
    if alert.kind == "config_rejected":
        facts.append(CONFIG_FIX)
    window = alert.window
    if window:
        partial = ", partial" if window.get("partial") else ""
        facts.append(f"{window.get('kind', '')} window {window.get('index', '?')} "
                     f"(steps {window.get('start_step', '?')}-{window.get('end_step', '?')}{partial})")
    runs = alert.details.get("compared_runs")
    if isinstance(runs, list) and runs:
        shown = ", ".join(map(str, runs[:_COMPARED_RUNS_SHOWN]))
        more = f" and {len(runs) - _COMPARED_RUNS_SHOWN} more" if len(runs) > _COMPARED_RUNS_SHOWN else ""
        facts.append(f"compared with runs {shown}{more}")
    return facts


def lifecycle_facts(alert: AlertRecord) -> List[str]:
    """What a lifecycle alert's details say about how the run went, beyond its message: how long it ran, when
    it was last heard from, the best accuracy reached, the ranks that never finished (``core.history.run_facts``),
    and the failures and restarts its jobs reported."""
    if alert.kind not in ("job_failed", "run_missing", "run_stalled"):
        return []
    details = alert.details
    started, heard, missing = details.get("started_at"), details.get("last_heard_at"), details.get("ranks_missing")
    facts = [run_lifecycle_text(_seconds(started), _seconds(heard),
                                [r for r in missing if isinstance(r, int)] if isinstance(missing, list) else [],
                                details.get("best_value"))]
    run_data = details.get("run_data")
    failures = run_data.get("num_failures") if isinstance(run_data, dict) else None
    if isinstance(failures, int) and not isinstance(failures, bool) and failures > 0:
        facts.append(f"{failures} failure{'s' if failures != 1 else ''} or restart{'s' if failures != 1 else ''} "
                     f"reported")
    return [fact for fact in facts if fact]


def _seconds(value: Any) -> Optional[float]:
    """A time from an alert's details (user-reachable JSON: anything), or None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def message_shown(alert: AlertRecord) -> str:
    """The message, or "" when the value, bounds and history cells already say all of it.

    A value alert's message (``core.alert_details.describe``) is its value, bounds, how they were computed,
    change and previous value, and window: each has a cell or a fact of its own in the e-mail."""
    if alert.kind in SPLIT_MESSAGE_KINDS and alert.metric and alert.message.startswith(f"{alert.metric} = "):
        return ""
    return alert.message


def report_link(alert: AlertRecord, config: EmailConfig) -> Optional[str]:
    """The run's report page: the one the pipeline wrote in the alert, else the notifier's pattern."""
    return alert.report_url or config.report_url(alert.test, alert.run)


def safe_url(url: Optional[str]) -> Optional[str]:
    """``url`` if it is an absolute http(s) URL without whitespace or control characters, else None."""
    if not isinstance(url, str) or any(unicodedata.category(c)[0] in "CZ" for c in url):
        return None
    parts = urllib.parse.urlsplit(url)
    return url if parts.scheme.lower() in ("http", "https") and parts.netloc else None


def alert_links(alert: AlertRecord, config: EmailConfig) -> List[Tuple[str, str]]:
    """(label, URL) pairs: the run's logs link and report page when present, then the configured templates."""
    links = [("logs", alert.logs_link)] if alert.logs_link else []
    report = report_link(alert, config)
    links += [("report", report)] if report else []
    fields = {"test": alert.test, "run": alert.run, "metric": alert.metric or "", "alert_id": alert.alert_id}
    quoted = {k: urllib.parse.quote(v, safe="") for k, v in fields.items()}
    links += [(label, template.format(**quoted)) for label, template in config.links]
    return links


# --------------------------------------------------------------------------
# Subjects
# --------------------------------------------------------------------------


def digest_subject(alerts: Sequence[AlertRecord], config: EmailConfig) -> str:
    """``[trainguard] <test> run <run>: <what went wrong>``."""
    first = alerts[0]
    problems = "; ".join(alert_problems(alerts))
    subject = (f"{config.subject_prefix} {one_line(first.test, _NAME_MAX_CHARS)} "
               f"run {one_line(first.run, _NAME_MAX_CHARS)}: {problems}")
    return one_line(subject, SUBJECT_MAX_CHARS)


def summary_subject(alerts: Sequence[AlertRecord], config: EmailConfig) -> str:
    runs = {a.group_key for a in alerts}
    tests = {a.test for a in alerts}
    subject = (f"{config.subject_prefix} daily e-mail budget reached: {len(alerts)} alert"
               f"{'s' if len(alerts) != 1 else ''} from {len(runs)} run{'s' if len(runs) != 1 else ''} "
               f"of {len(tests)} test{'s' if len(tests) != 1 else ''}")
    return one_line(subject, SUBJECT_MAX_CHARS)


# --------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------

_E = html.escape
_STYLE_TABLE = "border-collapse:collapse;font-size:14px;width:100%"
_STYLE_CELL = "border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top"
# Metric, details and links are the jobs' own text, any length, maybe without a space: these cells may break
# them anywhere, so a long name narrows its column instead of widening the e-mail past the screen.
_STYLE_NAME_CELL = _STYLE_CELL + ";overflow-wrap:anywhere"
_STYLE_WIDE_CELL = _STYLE_NAME_CELL + ";background:#fafafa"
_STYLE_TITLE_CELL = _STYLE_NAME_CELL + ";font-weight:bold;background:#f0f0f0"
_STYLE_WORD = "white-space:nowrap"
_WORD_MAX_CHARS = 40  # a longer word cannot stay whole at 600 px: the cell may break it anywhere
_STYLE_CODE = "display:block;font-family:monospace;font-size:13px"  # one whole command a line, to copy
_STYLE_NOTE = "color:#555;font-size:12px"
# Three columns fit the 600 px mail clients render at: an alert's kind and metric head it in a row across the
# table, and the long parts (what it says, its links and its next steps) go in a row of their own under it.
_COLUMNS = ("Value", "Bounds", "History")


def _html_link(label: str, url: str) -> str:
    safe = safe_url(url)
    if safe is None:
        return f"{_E(label)}: {_E(url)} (not a web link)"
    return f'<a href="{_E(safe)}">{_E(label)}</a>'


def _words(text: str) -> str:
    """Escaped ``text`` that wraps at its spaces only: a word with a ``-`` or ``/`` (a run id, a metric, an
    option) is kept whole, where a browser would break it after the dash."""
    return " ".join(f'<span style="{_STYLE_WORD}">{_E(word)}</span>'
                    if ("-" in word or "/" in word) and len(word) <= _WORD_MAX_CHARS else _E(word)
                    for word in text.split(" "))


def _lines(*parts: str) -> str:
    return "<br>".join(_words(part) for part in parts if part)


def _html_wide_row(alert: AlertRecord, config: EmailConfig) -> str:
    """The row under an alert: what it says, its links and its next steps; "" when it has none."""
    details = _lines(message_shown(alert), *extra_facts(alert))
    links = " · ".join(_html_link(label, url) for label, url in alert_links(alert, config))
    steps = "".join(f'<code style="{_STYLE_CODE}">{_words(command)}</code>' for command in alert.next_steps)
    parts = [details, f"Links: {links}" if links else "",
             f'<span style="{_STYLE_NOTE}">Next steps:</span>{steps}' if steps else ""]
    content = "<br>".join(part for part in parts if part)
    return f'<tr><td colspan="{len(_COLUMNS)}" style="{_STYLE_WIDE_CELL}">{content}</td></tr>' if content else ""


def _numbers(alert: AlertRecord) -> Tuple[str, str, str]:
    """The HTML of an alert's value, bounds and history cells (all "" for a lifecycle alert)."""
    return (_lines(value_text(alert), change_text(alert.details)), _lines(bounds_text(alert), how_text(alert)),
            _lines(history_text(alert), previous_text(alert.details, alert.unit)))


def _html_row(alert: AlertRecord, config: EmailConfig) -> str:
    """An alert: a title row (kind and metric), its numbers if it has any, and the row of the rest."""
    title = _E(alert.kind) + (f" · {_E(alert.metric)}" if alert.metric else "")
    rows = [f'<tr><td colspan="{len(_COLUMNS)}" style="{_STYLE_TITLE_CELL}">{title}</td></tr>']
    numbers = _numbers(alert)
    if any(numbers):  # a lifecycle alert has none: no row of empty cells
        rows.append("<tr>" + "".join(f'<td style="{_STYLE_CELL}">{c}</td>' for c in numbers) + "</tr>")
    return "".join(rows) + _html_wide_row(alert, config)


def html_table(alerts: Sequence[AlertRecord], config: EmailConfig) -> str:
    header = "".join(f'<th style="{_STYLE_CELL}">{c}</th>' for c in _COLUMNS)
    header = f"<tr>{header}</tr>\n" if any(any(_numbers(a)) for a in alerts) else ""  # none: no empty columns
    rows = "\n".join(_html_row(a, config) for a in alerts)
    note = f'\n<p style="{_STYLE_NOTE}">{_E(SCALES_NOTE)}</p>' if _says_scales(alerts) else ""
    return f'<table style="{_STYLE_TABLE}">\n{header}{rows}\n</table>{note}'


def _says_scales(alerts: Sequence[AlertRecord]) -> bool:
    """Whether an alert gives its change in scales: then the e-mail says what a scale is."""
    return any("scales" in change_text(a.details) or "scales" in a.message for a in alerts)


def _html_footer(alerts: Sequence[AlertRecord]) -> str:
    ids = ", ".join(_E(a.alert_id) for a in alerts)
    raised = [iso_utc(t) for t in sorted({a.created_at for a in alerts if a.created_at is not None})]
    when = f" · {_words(f'raised {raised[0]}' + (f' to {raised[-1]}' if len(raised) > 1 else ''))}" if raised else ""
    return f'<p style="color:#888;font-size:12px">alert ids: {ids}{when}</p>'


def html_section(alerts: Sequence[AlertRecord], config: EmailConfig, heading_level: int) -> str:
    """Heading (test and run), the alert table and a footer with ids: the HTML of one run's alerts."""
    first = alerts[0]
    tag = f"h{heading_level}"
    heading = f"<{tag}>Test {_words(first.test)} · run {_words(first.run)}</{tag}>"
    return "\n".join([heading, html_table(alerts, config), _html_footer(alerts)])


def html_document(subject: str, intro: str, sections: Iterable[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>' + _E(subject) + "</title></head>",
        '<body style="font-family:Arial,Helvetica,sans-serif;color:#222;overflow-wrap:break-word">',
        f"<p>{_E(intro)}</p>",
        *sections,
        '<p style="color:#888;font-size:12px">Sent by trainguard.</p>',
        "</body></html>",
        "",
    ])


def _text_alert(index: int, alert: AlertRecord, config: EmailConfig) -> List[str]:
    title = f"{index}. {alert.kind}" + (f": {alert.metric}" if alert.metric else "")
    measured = ", ".join(part for part in (
        f"value {value_text(alert)}" if alert.value is not None else "",
        f"bounds {bounds_text(alert)}" if bounds_text(alert) else "",
        f"history {history_text(alert)}" if history_text(alert) else "") if part)
    # what the message does not already say (a message of an older writer says none of it)
    message = message_shown(alert)
    how = f"bounds from {how_text(alert)}" if how_text(alert) and how_text(alert) not in message else ""
    change = "; ".join(part for part in (change_text(alert.details), previous_text(alert.details, alert.unit))
                       if part and part not in message)
    lines = [title] + [f"   {fact}" for fact in [measured, how, change, message, *extra_facts(alert)] if fact]
    lines += [f"   {label}: {url}" for label, url in alert_links(alert, config)]
    if alert.next_steps:
        lines += ["   next steps (see README, After an alert):"] + [f"     $ {command}" for command in alert.next_steps]
    lines.append(f"   alert {alert.alert_id}" + (f", raised {iso_utc(alert.created_at)}" if alert.created_at is not None else ""))
    return lines


def text_section(alerts: Sequence[AlertRecord], config: EmailConfig) -> str:
    first = alerts[0]
    lines = [f"Test {first.test}, run {first.run}", ""]
    for index, alert in enumerate(alerts, 1):
        lines += _text_alert(index, alert, config) + [""]
    if _says_scales(alerts):
        lines += [SCALES_NOTE, ""]
    return "\n".join(lines)


def text_document(intro: str, sections: Iterable[str]) -> str:
    return "\n".join([intro, "", *sections, "-- ", "Sent by trainguard.", ""])


# --------------------------------------------------------------------------
# Digests and summaries
# --------------------------------------------------------------------------


def _ordered(alerts: Iterable[AlertRecord]) -> List[AlertRecord]:
    return [a for group in by_kind(alerts).values() for a in group]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def render_digest(alerts: Sequence[AlertRecord], config: EmailConfig) -> RenderedEmail:
    """The digest of one run's alerts (all of the same test and run)."""
    alerts = _ordered(alerts)
    first = alerts[0]
    subject = digest_subject(alerts, config)
    intro = f"trainguard raised {_plural(len(alerts), 'alert')}."  # the heading under it names the test and run
    return RenderedEmail(
        sender=config.sender_for(first.test), recipients=config.recipients_for(first.test), subject=subject,
        html=html_document(subject, intro, [html_section(alerts, config, 2)]),
        text=text_document(intro, [text_section(alerts, config)]),
        alert_ids=tuple(a.alert_id for a in alerts), label=f"{first.test}-{first.run}")


def render_summary(alerts: Sequence[AlertRecord], config: EmailConfig,
                   recipients: Sequence[str]) -> RenderedEmail:
    """One e-mail carrying every alert folded because the daily budget ran out, grouped by run."""
    runs: Dict[Tuple[str, str], List[AlertRecord]] = {}
    for alert in sorted(alerts, key=lambda a: (a.test, a.run)):
        runs.setdefault(alert.group_key, []).append(alert)
    groups = [_ordered(group) for group in runs.values()]
    subject = summary_subject(alerts, config)
    intro = (f"The daily e-mail budget ({config.daily_budget}) is used up, so the "
             f"{_plural(len(alerts), 'alert')} of {_plural(len(groups), 'run')} below come in one summary.")
    return RenderedEmail(
        sender=config.sender, recipients=tuple(recipients), subject=subject,
        html=html_document(subject, intro, [html_section(g, config, 3) for g in groups]),
        text=text_document(intro, [text_section(g, config) for g in groups]),
        alert_ids=tuple(a.alert_id for g in groups for a in g), label="summary", kind="summary")
