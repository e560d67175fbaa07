"""Senders: SendGrid's official client, or ``--dry-run`` files; and the retry policy.

A send has one of three outcomes: ``accepted`` (HTTP 202: SendGrid took the
e-mail), ``retry`` (429, 408, 5xx, or SendGrid could not be reached: try again
later) or ``permanent`` (any other answer, e.g. 400/401/403, or an e-mail the
client refuses to build: retrying cannot help, the alerts are dead-lettered).
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import os
import random
import re
import time
import urllib.error
from typing import Optional

import sendgrid
from python_http_client import exceptions as http_errors
from sendgrid.helpers.mail import Mail

from notifier.api_key import Secret
from notifier.config import RetryConfig
from notifier.render import RenderedEmail

DEFAULT_HOST = "https://api.sendgrid.com"
ACCEPTED, RETRY, PERMANENT = "accepted", "retry", "permanent"
_DETAIL_MAX_CHARS = 500

# python_http_client logs request headers, the API key among them, at DEBUG.
# Whatever the root logger's level, that logger never goes below INFO.
logging.getLogger("python_http_client").setLevel(logging.INFO)


@dataclasses.dataclass(frozen=True)
class SendResult:
    outcome: str  # ACCEPTED, RETRY or PERMANENT
    status: Optional[int] = None
    detail: str = ""
    retry_after: Optional[float] = None  # seconds, when the server said how long to wait

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED


def classify_status(status: int) -> str:
    if status == 202:
        return ACCEPTED
    if status in (408, 429) or status >= 500:
        return RETRY
    return PERMANENT


_PERMANENT_HINTS = {
    400: "SendGrid rejected the request (bad sender, recipient or content)",
    401: "SendGrid rejected the API key (check $SENDGRID_API_KEY or --sendgrid-key-secret)",
    403: "the API key lacks the Mail Send permission, or the sender is not verified",
    413: "the e-mail is too large",
}


def _retry_after(headers) -> Optional[float]:
    """Seconds to wait from ``Retry-After`` (seconds) or SendGrid's ``X-RateLimit-Reset`` (unix time)."""
    if headers is None:
        return None
    value = headers.get("Retry-After")
    if value is not None and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
        return float(value)
    reset = headers.get("X-RateLimit-Reset")
    if reset is not None and re.fullmatch(r"\s*\d+\s*", reset):
        return max(0.0, float(reset) - time.time())
    return None


def _body_text(body) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    return text[:_DETAIL_MAX_CHARS]


def result_of_http_error(error: http_errors.HTTPError) -> SendResult:
    status = int(error.status_code)
    outcome = classify_status(status)
    hint = _PERMANENT_HINTS.get(status, "")
    detail = "; ".join(part for part in (f"HTTP {status} {error.reason}", hint, _body_text(error.body)) if part)
    return SendResult(outcome, status, detail, _retry_after(error.headers) if outcome == RETRY else None)


def build_mail(email: RenderedEmail) -> Mail:
    return Mail(from_email=email.sender, to_emails=list(email.recipients), subject=email.subject,
                plain_text_content=email.text, html_content=email.html)


class SendGridSender:
    """Sends with ``sendgrid.SendGridAPIClient`` at ``host`` (the EU host, or a test server)."""

    def __init__(self, api_key: Secret, host: str = DEFAULT_HOST, timeout_seconds: float = 30.0):
        self.host = host
        self._client = sendgrid.SendGridAPIClient(api_key.reveal(), host=host)
        self._client.client.timeout = timeout_seconds  # the client has no timeout by default

    def describe(self) -> str:
        return f"SendGrid at {self.host}"

    def send(self, email: RenderedEmail) -> SendResult:
        try:
            mail = build_mail(email)
        except Exception as e:  # noqa: BLE001 - whatever the client refuses is permanent
            return SendResult(PERMANENT, None, f"the e-mail could not be built: {type(e).__name__}: {e}")
        try:
            response = self._client.send(mail)
        except http_errors.HTTPError as e:
            return result_of_http_error(e)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # incl. timeouts
            return SendResult(RETRY, None, f"SendGrid unreachable: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - unknown client failure: keep the alerts, do not loop forever
            return SendResult(PERMANENT, None, f"unexpected client error: {type(e).__name__}: {e}")
        status = int(response.status_code)
        outcome = classify_status(status)
        detail = f"HTTP {status}" + ("" if outcome == ACCEPTED else f" (expected 202); {_body_text(response.body)}")
        return SendResult(outcome, status, detail)


class DryRunSender:
    """``--dry-run``: writes each e-mail to ``<dir>/<nnnn>-<label>.html`` (the HTML body) and ``.txt``.

    The ``.txt`` file starts with From/To/Subject lines, then the plain-text
    alternative. Every e-mail counts as accepted.
    """

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._count = sum(1 for name in os.listdir(directory) if name.endswith(".html"))

    def describe(self) -> str:
        return f"dry run: e-mails rendered to {self.directory}/"

    def send(self, email: RenderedEmail) -> SendResult:
        self._count += 1
        stem = os.path.join(self.directory, f"{self._count:04d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', email.label)[:80]}")
        with open(stem + ".html", "w", encoding="utf-8") as f:
            f.write(email.html)
        headers = f"From: {email.sender}\nTo: {', '.join(email.recipients)}\nSubject: {email.subject}\n\n"
        with open(stem + ".txt", "w", encoding="utf-8") as f:
            f.write(headers + email.text)
        return SendResult(ACCEPTED, 202, f"written to {stem}.html")


class Backoff:
    """Delays between attempts after consecutive retryable failures (see RetryConfig)."""

    def __init__(self, config: RetryConfig, rng: Optional[random.Random] = None):
        self.config = config
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self, retry_after: Optional[float] = None) -> float:
        """Count one more failure; the seconds to wait before the next attempt."""
        self.failures += 1
        if retry_after is not None:
            return min(retry_after, self.config.max_seconds)
        delay = min(self.config.initial_seconds * self.config.multiplier ** (self.failures - 1),
                    self.config.max_seconds)
        return delay * (1.0 + self.config.jitter * self._rng.random())

    def reset(self) -> None:
        self.failures = 0
