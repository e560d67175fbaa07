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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from core.alert_details import change_text, number, previous_text, threshold_text, with_unit
from core.alert_record import NAME_MAX_CHARS, AlertRecord, alert_problems, by_kind, one_line
from core.records import iso_utc
from notifier.config import EmailConfig

SUBJECT_MAX_CHARS = 200
_NAME_MAX_CHARS = NAME_MAX_CHARS  # of a test, run or metric name inside a subject
_COMPARED_RUNS_SHOWN = 5
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
    if alert.kind in ("job_failed", "run_missing") and alert.status:
        facts.append(f"status {alert.status}")
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


def safe_url(url: Optional[str]) -> Optional[str]:
    """``url`` if it is an absolute http(s) URL without whitespace or control characters, else None."""
    if not isinstance(url, str) or any(unicodedata.category(c)[0] in "CZ" for c in url):
        return None
    parts = urllib.parse.urlsplit(url)
    return url if parts.scheme.lower() in ("http", "https") and parts.netloc else None


def alert_links(alert: AlertRecord, config: EmailConfig) -> List[Tuple[str, str]]:
    """(label, URL) pairs: the run's logs link and report page when present, then the configured templates."""
    links = [("logs", alert.logs_link)] if alert.logs_link else []
    links += [("report", alert.report_url)] if alert.report_url else []
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
_STYLE_TABLE = "border-collapse:collapse;font-size:14px"
_STYLE_CELL = "border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top"
# Metric, details and links are the jobs' own text, any length, maybe without a space: these cells may break
# them anywhere, so a long name narrows its column instead of widening the e-mail past the screen.
_STYLE_NAME_CELL = _STYLE_CELL + ";overflow-wrap:anywhere"
_NAME_COLUMNS = {1, 5, 6, 7}
_COLUMNS = ("Alert", "Metric", "Value", "Bounds", "History", "Details", "Links", "Next steps")


def _html_link(label: str, url: str) -> str:
    safe = safe_url(url)
    if safe is None:
        return f"{_E(label)}: {_E(url)} (not a web link)"
    return f'<a href="{_E(safe)}">{_E(label)}</a>'


def _html_row(alert: AlertRecord, config: EmailConfig) -> str:
    details = "<br>".join(_E(fact) for fact in [alert.message, *extra_facts(alert)] if fact)
    links = " · ".join(_html_link(label, url) for label, url in alert_links(alert, config))
    value = "<br>".join(_E(part) for part in (value_text(alert), change_text(alert.details)) if part)
    bounds = "<br>".join(_E(part) for part in (bounds_text(alert), how_text(alert)) if part)
    history = "<br>".join(_E(part) for part in (history_text(alert), previous_text(alert.details, alert.unit))
                          if part)
    steps = "<br>".join(f"<code>{_E(command)}</code>" for command in alert.next_steps)
    escaped = [_E(alert.kind), _E(alert.metric or ""), value, bounds, history, details, links, steps]
    return "<tr>" + "".join(f'<td style="{_STYLE_NAME_CELL if i in _NAME_COLUMNS else _STYLE_CELL}">{c}</td>'
                            for i, c in enumerate(escaped)) + "</tr>"


def html_table(alerts: Sequence[AlertRecord], config: EmailConfig) -> str:
    header = "".join(f'<th style="{_STYLE_CELL}">{c}</th>' for c in _COLUMNS)
    rows = "\n".join(_html_row(a, config) for a in alerts)
    return f'<table style="{_STYLE_TABLE}">\n<tr>{header}</tr>\n{rows}\n</table>'


def _html_footer(alerts: Sequence[AlertRecord]) -> str:
    ids = ", ".join(_E(a.alert_id) for a in alerts)
    raised = [iso_utc(t) for t in sorted({a.created_at for a in alerts if a.created_at is not None})]
    when = f" · raised {_E(raised[0])}" + (f" to {_E(raised[-1])}" if len(raised) > 1 else "") if raised else ""
    return f'<p style="color:#888;font-size:12px">alert ids: {ids}{when}</p>'


def html_section(alerts: Sequence[AlertRecord], config: EmailConfig, heading_level: int) -> str:
    """Heading (test and run), the alert table and a footer with ids: the HTML of one run's alerts."""
    first = alerts[0]
    tag = f"h{heading_level}"
    heading = f"<{tag}>Test {_E(first.test)} · run {_E(first.run)}</{tag}>"
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
    how = f"bounds from {how_text(alert)}" if how_text(alert) and how_text(alert) not in alert.message else ""
    change = "; ".join(part for part in (change_text(alert.details), previous_text(alert.details, alert.unit))
                       if part and part not in alert.message)
    lines = [title] + [f"   {fact}" for fact in [measured, how, change, alert.message, *extra_facts(alert)] if fact]
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
    intro = f"trainguard raised {_plural(len(alerts), 'alert')} for test {first.test}, run {first.run}."
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
