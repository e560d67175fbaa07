"""The notifier's JSON configuration file (see ``example-config.json`` and docs/email.md).

Loading is strict, like the per-test configs: an unknown key, a value of the
wrong type or an address that is not one stops start-up with a
:class:`ConfigError` naming the file and the key. Keys named ``"//"`` are
comments and may appear in any object.
"""

from __future__ import annotations

import dataclasses
import email.utils
import fnmatch
from typing import Any, Mapping, Optional, Tuple

from core.config import RegressionTestConfig, checked_report_url_pattern
from core.strict_json import ConfigError, StrictReader, read_json_file

__all__ = ["ConfigError", "EmailConfig", "RetryConfig", "TestOverride", "config_from_mapping", "load_config",
           "parse_config"]

@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Backoff between attempts while SendGrid answers 429/5xx or cannot be reached.

    Delays grow from ``initial_seconds`` by ``multiplier`` up to ``max_seconds``,
    each stretched by a random factor in ``[1, 1 + jitter]``; a ``Retry-After``
    header wins when SendGrid sends one. There is no attempt limit: alerts wait
    (unacknowledged) until SendGrid accepts them.
    """
    initial_seconds: float = 2.0
    multiplier: float = 2.0
    max_seconds: float = 300.0
    jitter: float = 0.1


@dataclasses.dataclass(frozen=True)
class TestOverride:
    """Recipients and/or sender for the tests matching ``pattern`` (a name or an fnmatch glob)."""
    pattern: str
    recipients: Optional[Tuple[str, ...]] = None
    sender: Optional[str] = None

    def matches(self, test: str) -> bool:
        return fnmatch.fnmatchcase(test, self.pattern)


@dataclasses.dataclass(frozen=True)
class EmailConfig:
    """Everything the notifier reads from its configuration file."""
    sender: str
    recipients: Tuple[str, ...]
    per_test: Tuple[TestOverride, ...] = ()
    group_wait_seconds: float = 60.0
    daily_budget: int = 100
    summary_wait_seconds: float = 1800.0
    subject_prefix: str = "[trainguard]"
    links: Tuple[Tuple[str, str], ...] = ()  # (label, URL template with {test}, {run}, {metric}, {alert_id})
    # The run's page of the report, for alerts whose details carry no report_url (their test's pipeline
    # config sets no report_url_pattern, or an older pipeline wrote them); same placeholders and quoting.
    report_url_pattern: Optional[str] = None
    max_sent_ids: int = 100_000
    sent_ids_max_age_days: float = 30.0
    retry: RetryConfig = RetryConfig()
    source: str = "<config>"

    def override_for(self, test: str) -> Optional[TestOverride]:
        """The override of ``test``: an exact name first, else the first matching glob in file order."""
        for override in self.per_test:
            if override.pattern == test:
                return override
        return next((o for o in self.per_test if o.matches(test)), None)

    def recipients_for(self, test: str) -> Tuple[str, ...]:
        override = self.override_for(test)
        return override.recipients if override and override.recipients else self.recipients

    def sender_for(self, test: str) -> str:
        override = self.override_for(test)
        return override.sender if override and override.sender else self.sender

    def report_url(self, test: str, run: str) -> Optional[str]:
        """The run's report page from ``report_url_pattern``, quoted as the pipeline quotes it; None without one."""
        return RegressionTestConfig(report_url_pattern=self.report_url_pattern).report_url(test, run)


_TOP_KEYS = {"sender", "recipients", "per_test", "group_wait_seconds", "daily_budget", "summary_wait_seconds",
             "subject_prefix", "links", "report_url_pattern", "remember_sent_ids", "retry"}


class _Reader(StrictReader):
    """The shared strict reader, plus e-mail addresses."""

    def address(self, raw: Any, key: str) -> str:
        """An e-mail address, optionally with a display name (``Name <a@b.example>``)."""
        text = self.string(raw, key)
        _, addr = email.utils.parseaddr(text)
        local, _, domain = addr.rpartition("@")
        if not local or "." not in domain or any(c.isspace() for c in addr):
            self.fail(key, f"must be an e-mail address, got {raw!r}")
        return text

    def addresses(self, raw: Any, key: str) -> Tuple[str, ...]:
        if not isinstance(raw, list) or not raw:
            self.fail(key, f"must be a non-empty list of e-mail addresses, got {raw!r}")
        return tuple(dict.fromkeys(self.address(item, f"{key}[{i}]") for i, item in enumerate(raw)))


def parse_config(raw: Any, source: str = "<config>") -> EmailConfig:
    """Validate the decoded JSON of a configuration file."""
    reader = _Reader(source)
    top = reader.object(raw, "", _TOP_KEYS, required=("sender", "recipients"))
    recipients = reader.addresses(top["recipients"], "recipients")
    budget = reader.integer(top.get("daily_budget", 100), "daily_budget", minimum=1)
    if budget < len(recipients):
        reader.fail("daily_budget", f"must be at least the number of default recipients ({len(recipients)}): "
                                          "SendGrid counts every recipient, and the budget summary goes to them")
    remember = reader.object(top.get("remember_sent_ids", {}), "remember_sent_ids", {"max_ids", "max_age_days"})
    return EmailConfig(
        sender=reader.address(top["sender"], "sender"),
        recipients=recipients,
        per_test=_parse_overrides(reader, top.get("per_test", {})),
        group_wait_seconds=reader.number(top.get("group_wait_seconds", 60.0), "group_wait_seconds", minimum=0),
        daily_budget=budget,
        summary_wait_seconds=reader.number(top.get("summary_wait_seconds", 1800.0), "summary_wait_seconds", minimum=0),
        subject_prefix=_subject_prefix(reader, top.get("subject_prefix", "[trainguard]")),
        links=_parse_links(reader, top.get("links", {})),
        # checked as the pipeline's per-test key is: an http(s) URL with {test} and {run} only
        report_url_pattern=None if top.get("report_url_pattern") is None else checked_report_url_pattern(
            reader, top["report_url_pattern"], "report_url_pattern"),
        max_sent_ids=reader.integer(remember.get("max_ids", 100_000), "remember_sent_ids.max_ids", minimum=1),
        sent_ids_max_age_days=reader.number(remember.get("max_age_days", 30.0), "remember_sent_ids.max_age_days", minimum=0),
        retry=_parse_retry(reader, top.get("retry", {})),
        source=source,
    )


def _subject_prefix(reader: _Reader, raw: Any) -> str:
    if not isinstance(raw, str) or any(c in raw for c in "\r\n"):
        reader.fail("subject_prefix", f"must be a one-line string, got {raw!r}")
    return raw


def _parse_overrides(reader: _Reader, raw: Any) -> Tuple[TestOverride, ...]:
    overrides = []
    for pattern, value in reader.object(raw, "per_test").items():
        key = f"per_test.{pattern}"
        obj = reader.object(value, key, {"recipients", "sender"})
        if not obj:
            reader.fail(key, "must set recipients and/or sender")
        recipients = reader.addresses(obj["recipients"], f"{key}.recipients") if "recipients" in obj else None
        sender = reader.address(obj["sender"], f"{key}.sender") if "sender" in obj else None
        overrides.append(TestOverride(pattern, recipients, sender))
    return tuple(overrides)


def _parse_links(reader: _Reader, raw: Any) -> Tuple[Tuple[str, str], ...]:
    links = []
    for label, template in reader.object(raw, "links").items():
        key = f"links.{label}"
        template = reader.string(template, key)
        if not template.startswith(("https://", "http://")):
            reader.fail(key, f"must be an http(s) URL template, got {template!r}")
        try:
            template.format(test="", run="", metric="", alert_id="")
        except (KeyError, IndexError, ValueError) as e:
            raise reader.error(key, f"may only use {{test}}, {{run}}, {{metric}} and {{alert_id}}: {e!r}") from None
        links.append((label, template))
    return tuple(links)


def _parse_retry(reader: _Reader, raw: Any) -> RetryConfig:
    fields = {f.name: f.default for f in dataclasses.fields(RetryConfig)}
    obj = reader.object(raw, "retry", fields)
    values = {name: reader.number(obj.get(name, default), f"retry.{name}", minimum=0) for name, default in fields.items()}
    if values["multiplier"] < 1:
        reader.fail("retry.multiplier", f"must be >= 1, got {values['multiplier']!r}")
    if values["initial_seconds"] > values["max_seconds"]:
        reader.fail("retry.initial_seconds", "must not exceed retry.max_seconds")
    return RetryConfig(**values)


def load_config(path: str) -> EmailConfig:
    """Read and validate the configuration file at ``path``."""
    return parse_config(read_json_file(path), path)


def config_from_mapping(values: Mapping[str, Any]) -> EmailConfig:
    """A config from a dict (tests, embedding), validated like a file."""
    return parse_config(dict(values), "<mapping>")
