"""The notifier's HTML e-mails in headless Chromium: hostile names stay text, nothing is wider than 1280 px.

The e-mails are real ones: the demo replay's alerts file, with hostile alerts appended, rendered by the
dry run of docs/email.md (``python -m notifier --config notifier/example-config.json --alerts_file
alerts.jsonl --dry_run --once``) in a directory of the test's own.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import subprocess
import sys
from typing import Dict, List

import pytest

from tests.browser.support import (
    FLAG_MESSAGE,
    FLAG_METRIC,
    FLAG_RUN,
    FLAG_TEST,
    LONG_RUN,
    LONG_TEST,
    NARROW,
    WIDE,
    broken_images,
    event_handler_attributes,
    fits,
    injected,
    links,
    open_page,
    overflow,
    screenshot,
    shows,
    sticking_out,
    table_columns,
    tag_counts,
)
from tests.notifier.support import alert
from tests.notifier.support import payload as alert_line
from tests.notifier.test_render import ALLOWED_TAGS, HOSTILE_METRIC, HOSTILE_RUN, HOSTILE_TEST
from tests.support import REPO_ROOT

EXAMPLE_CONFIG = str(pathlib.Path(REPO_ROOT, "notifier", "example-config.json"))
BROWSER_TAGS = {"tbody"}  # the one element the HTML parser adds itself (around table rows)


def hostile_alerts():
    """Alerts whose test, run, metric, message and logs link are hostile, or too long for a line."""
    flagged = alert(test=FLAG_TEST, run=FLAG_RUN, metric=FLAG_METRIC, logs_link="javascript:alert(document.cookie)")
    return [
        alert(test=HOSTILE_TEST, run=HOSTILE_RUN, metric=HOSTILE_METRIC, logs_link="javascript:alert(1)"),
        dataclasses.replace(flagged, message=FLAG_MESSAGE),
        alert(kind="job_failed", test=FLAG_TEST, run=FLAG_RUN, status="failure"),
        alert(test=LONG_TEST, run=LONG_RUN, metric=LONG_RUN, logs_link=f"https://logs.example/{LONG_RUN}",
              compared_runs=[LONG_RUN] * 3),
    ]


@pytest.fixture(scope="module")
def emails(demo_replay, tmp_path_factory) -> Dict[str, pathlib.Path]:
    """The dry run's e-mails: subject -> HTML file."""
    _, demo_alerts = demo_replay
    root = tmp_path_factory.mktemp("email")
    shutil.copy(demo_alerts, root / "alerts.jsonl")
    with open(root / "alerts.jsonl", "ab") as f:
        f.writelines(alert_line(a) + b"\n" for a in hostile_alerts())
    subprocess.run([sys.executable, "-m", "notifier", "--config", EXAMPLE_CONFIG, "--alerts_file", "alerts.jsonl",
                    "--dry_run", "--once"], cwd=root, check=True, timeout=300)  # as docs/email.md runs it
    rendered = {}
    for page in sorted((root / "email-dry-run").glob("*.html")):
        headers = page.with_suffix(".txt").read_text(encoding="utf-8").splitlines()
        subject, = [line[len("Subject: "):] for line in headers if line.startswith("Subject: ")]
        rendered[subject] = page
    return rendered


def pages(emails, *names: str) -> List[pathlib.Path]:
    """The e-mails whose subject names every one of ``names`` (as the subject shows it: one line)."""
    return [page for subject, page in emails.items() if all(" ".join(n.split())[:40] in subject for n in names)]


def test_every_e_mail_of_the_dry_run_loads_fits_and_links_only_to_the_web(browser, emails, artifacts):
    assert len(emails) >= 4  # a digest per run: the demo's runs with alerts, and the hostile ones
    for subject, page in emails.items():
        open_page(browser, page)
        screenshot(browser, artifacts / f"email-{page.stem[:40]}.png")
        assert broken_images(browser) == [], subject
        assert all(link["resolved"].startswith(("https://", "http://")) for link in links(browser)), subject
        assert fits(browser), (subject, overflow(browser))
        assert injected(browser) == [], subject


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_every_e_mail_reads_at_600_px_and_1400_px(browser, emails, artifacts, width):
    """At most 5 columns and nothing sticking out at the width mail clients render at, and on a desktop."""
    for subject, page in emails.items():
        open_page(browser, page, width)
        screenshot(browser, artifacts / f"email-{page.stem[:40]}-{width}px.png", width)
        assert all(columns <= 5 for columns in table_columns(browser)), (subject, table_columns(browser))
        assert fits(browser, width), (subject, overflow(browser))
        assert sticking_out(browser) == [], subject


def test_every_e_mail_links_the_runs_report(browser, emails):
    """The example config's ``report_url_pattern`` gives every alert a report link (the demo's tests set none)."""
    for subject, page in emails.items():
        open_page(browser, page)
        labels = browser.execute_script("return Array.from(document.links).map(a => a.textContent)")
        assert "report" in labels, subject


HOSTILE_EMAILS = {  # id -> (names in the subject, texts the e-mail must show)
    "render-test-names": ((HOSTILE_TEST, HOSTILE_RUN), (HOSTILE_TEST, HOSTILE_RUN, HOSTILE_METRIC, "javascript:alert(1)")),
    "flag-names": ((FLAG_TEST, FLAG_RUN),
                   (FLAG_TEST, FLAG_RUN, FLAG_METRIC, FLAG_MESSAGE, "javascript:alert(document.cookie)")),
    "long-names": ((LONG_TEST,), (LONG_TEST, LONG_RUN)),
}


@pytest.mark.parametrize("which", HOSTILE_EMAILS)
def test_hostile_names_in_an_e_mail_show_as_text_and_inject_nothing(browser, emails, artifacts, which):
    names, texts = HOSTILE_EMAILS[which]
    page, = pages(emails, *names)
    open_page(browser, page)
    screenshot(browser, artifacts / f"email-hostile-{which}.png")
    for text in texts:
        assert shows(browser, text), text
    assert injected(browser) == []
    assert set(tag_counts(browser)) <= ALLOWED_TAGS | BROWSER_TAGS
    assert event_handler_attributes(browser) == []
    assert fits(browser), overflow(browser)
