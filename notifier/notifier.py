"""The notifier: alerts in, digest e-mails out, nothing lost and nothing sent twice.

Life of an alert (all on one thread; the caller passes the time in):

1. :meth:`Notifier.receive` parses the payload. Not an alert: dead-lettered.
   Triaged (muted when raised, or announced again as dismissed or accepted,
   ``core.triage``): it and any copy held are acked, its id joins the sent set
   so that a late copy is not mailed either, and it is out of any digest not
   yet rendered. Already mailed (its id is in the state's sent set): acked and skipped.
   Already held: the new copy is attached to it. Otherwise it joins its run's
   group.
2. :meth:`Notifier.tick` closes the groups whose wait is over. A group becomes
   a digest in the outbox if the daily budget allows it with the summary's
   share kept in reserve; otherwise its alerts are *folded* to wait for the
   day's summary e-mail, which goes out ``summary_wait_seconds`` after the
   first fold (or at the next UTC midnight when even the summary does not fit).
3. The outbox is sent in order. On 202 the ids are recorded as sent and the
   budget is charged, *then* every copy of every alert in the e-mail is acked.
   429/5xx/unreachable: the whole outbox waits (exponential backoff, or the
   server's Retry-After) and the alerts stay unacked. A permanent failure is
   logged as an error and the alerts go to the dead-letter sink, then are acked.

Until step 3 settles an alert, its messages are not acked: a crash or
shutdown (:meth:`Notifier.close` nacks them) makes Pub/Sub deliver them again,
or the file source re-read them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from core.alert_record import AlertRecord, InvalidAlert, parse_alert
from notifier.config import EmailConfig
from notifier.deadletter import DeadLetter
from notifier.grouping import Grouper
from notifier.render import RenderedEmail, render_digest, render_summary
from notifier.sending import ACCEPTED, RETRY, Backoff, SendResult
from notifier.sources import Delivery
from notifier.state import NotifierState, next_utc_midnight, utc_day

_LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass
class HeldAlert:
    """An alert not settled yet, with every delivered copy of it (all acked together)."""
    alert: AlertRecord
    deliveries: List[Delivery]


@dataclasses.dataclass
class Stats:
    """Counters for the exit summary and for tests."""
    received: int = 0
    duplicates: int = 0
    triaged: int = 0  # muted, dismissed or accepted: not mailed
    invalid: int = 0
    emails_sent: int = 0
    summaries_sent: int = 0
    alerts_sent: int = 0
    alerts_folded: int = 0
    dead_lettered: int = 0  # payloads written to the dead-letter sink (refused alerts and invalid payloads)
    send_failures: int = 0

    def line(self) -> str:
        return (f"{self.received} received, {self.duplicates} duplicates skipped, {self.emails_sent} e-mails sent "
                f"({self.summaries_sent} budget summaries) carrying {self.alerts_sent} alerts, "
                f"{self.alerts_folded} folded into summaries, {self.triaged} triaged (muted, dismissed or accepted), "
                f"{self.dead_lettered} dead-lettered, "
                f"{self.invalid} invalid payloads, {self.send_failures} failed attempts")


class Notifier:
    """Groups, dedups, budgets, sends and settles alerts (see the module docstring)."""

    def __init__(self, config: EmailConfig, state: NotifierState, sender, dead_letters,
                 rng: Optional[random.Random] = None):
        self.config = config
        self.state = state
        self.sender = sender
        self.dead_letters = dead_letters
        self.stats = Stats()
        self._held: Dict[str, HeldAlert] = {}
        self._grouper = Grouper(config.group_wait_seconds)
        self._outbox: Deque[RenderedEmail] = collections.deque()
        self._folded: List[AlertRecord] = []
        self._folded_since: Optional[float] = None
        self._backoff = Backoff(config.retry, rng)
        self._blocked_until = 0.0
        self._unwritten: List[Tuple[List[DeadLetter], List[Delivery]]] = []  # dead letters the sink failed to take
        self._sink_backoff = Backoff(config.retry, rng)  # for the dead-letter sink, apart from SendGrid's
        self._sink_blocked_until = 0.0

    # -- intake ---------------------------------------------------------

    def receive(self, delivery: Delivery, now: float) -> None:
        """Take one delivered payload (see the module docstring, step 1)."""
        self.stats.received += 1
        try:
            alert = parse_alert(delivery.payload)
        except InvalidAlert as e:
            self.stats.invalid += 1
            _LOGGER.error("%s is not an alert (%s): dead-lettered to %s", delivery.where, e,
                          self.dead_letters.describe())
            self._dead_letter([(delivery.payload, delivery.attributes, [delivery])], f"invalid alert: {e}", None, now)
            return
        if not alert.state.notifies:
            self._skip_triaged(alert, delivery, now)
            return
        held = self._held.get(alert.alert_id)
        if held is not None:
            held.deliveries.append(delivery)
            self.stats.duplicates += 1
        elif self.state.was_sent(alert.alert_id, now):
            delivery.ack()
            self.stats.duplicates += 1
        else:
            self._held[alert.alert_id] = HeldAlert(alert, [delivery])
            self._grouper.add(alert, now)

    def _skip_triaged(self, alert: AlertRecord, delivery: Delivery, now: float) -> None:
        """A muted, dismissed or accepted alert is not mailed: drop it from what waits, settle every copy."""
        self.stats.triaged += 1
        self.state.mark_sent([alert.alert_id], now)  # a copy arriving later is skipped as already settled
        held = self._held.pop(alert.alert_id, None)
        self._grouper.discard(alert.alert_id)
        self._folded = [a for a in self._folded if a.alert_id != alert.alert_id]
        for copy in (held.deliveries if held else []) + [delivery]:
            copy.ack()
        _LOGGER.info("%s alert %s (%s %s %s) is not mailed", alert.state.value, alert.alert_id, alert.test,
                     alert.run, alert.metric or alert.kind)

    # -- the clock ------------------------------------------------------

    def tick(self, now: float) -> None:
        """Do whatever is due at ``now``: summaries, closing groups, sending."""
        self._retry_dead_letters(now)
        self._maybe_summarize(now, force=False)
        for group in self._grouper.pop_due(now):
            self._admit(group.alerts, now)
        self._send_due(now)

    def flush(self, now: float) -> None:
        """Close every group and summarize folded alerts now (end of input), then send what is allowed."""
        self._retry_dead_letters(now)
        for group in self._grouper.pop_all():
            self._admit(group.alerts, now)
        self._maybe_summarize(now, force=True)
        self._send_due(now)

    def next_wake(self, now: float) -> Optional[float]:
        """When :meth:`tick` next has something to do (None: only when something arrives)."""
        times = [self._grouper.next_due()]
        if self._outbox:
            times.append(max(self._blocked_until, now))
        if self._unwritten:
            times.append(max(self._sink_blocked_until, now))
        if self._folded:
            times.append(self._summary_due_at(now))
        return min((t for t in times if t is not None), default=None)

    @property
    def held_count(self) -> int:
        """Alerts received and not settled yet (grouping, outbox, folded, or waiting for the dead-letter sink)."""
        return len(self._held) + sum(len(letters) for letters, _ in self._unwritten)

    def held_for_budget(self, now: float) -> bool:
        """True when the only work left is folded alerts waiting for tomorrow's budget."""
        return bool(self._folded) and not self._outbox and not len(self._grouper) and not self._can_afford_summary(now)

    def close(self) -> None:
        """Nack every alert still held, so that Pub/Sub delivers it again (to this or another instance)."""
        deliveries = [d for held in self._held.values() for d in held.deliveries]
        deliveries += [d for _, copies in self._unwritten for d in copies]
        for delivery in deliveries:
            delivery.nack()
        if deliveries:
            _LOGGER.info("shutting down with %d alert(s) not settled: released for redelivery", self.held_count)
        self._held.clear()
        self._unwritten.clear()
        self._outbox.clear()
        self._folded.clear()

    # -- budget ---------------------------------------------------------

    def _committed(self, now: float) -> int:
        """Budget units used today plus those of the e-mails waiting in the outbox."""
        return self.state.budget_used(now) + sum(email.cost for email in self._outbox)

    def _can_afford_summary(self, now: float) -> bool:
        return self._committed(now) + len(self.config.recipients) <= self.config.daily_budget

    def _admit(self, alerts: Sequence[AlertRecord], now: float) -> None:
        """A closed group -> a digest in the outbox, or folded alerts if the budget (minus the reserve) is spent."""
        email = render_digest(alerts, self.config)
        reserve = len(self.config.recipients)
        if self._committed(now) + email.cost <= self.config.daily_budget - reserve:
            self._outbox.append(email)
            return
        if self._folded_since is None:
            self._folded_since = now
        self._folded.extend(alerts)
        self.stats.alerts_folded += len(alerts)
        _LOGGER.info("daily e-mail budget (%d) reached: %d alert(s) of %r folded into the summary e-mail",
                     self.config.daily_budget, len(alerts), email.label)

    def _summary_due_at(self, now: float) -> float:
        since = now if self._folded_since is None else self._folded_since
        due = since + self.config.summary_wait_seconds
        if utc_day(since) != utc_day(now):
            due = now
        return due if self._can_afford_summary(now) else max(due, next_utc_midnight(now))

    def _summary_recipients(self, now: float) -> Optional[Tuple[str, ...]]:
        """Everyone the folded alerts are for if the budget allows, else the default recipients, else None."""
        everyone = tuple(dict.fromkeys(r for a in self._folded for r in self.config.recipients_for(a.test)))
        room = self.config.daily_budget - self._committed(now)
        for recipients in (everyone, self.config.recipients):
            if len(recipients) <= room:
                return recipients
        return None

    def _maybe_summarize(self, now: float, force: bool) -> None:
        if not self._folded or (not force and now < self._summary_due_at(now)):
            return
        recipients = self._summary_recipients(now)
        if recipients is None:
            return
        self._outbox.append(render_summary(self._folded, self.config, recipients))
        self._folded, self._folded_since = [], None

    # -- sending --------------------------------------------------------

    def _send_due(self, now: float) -> None:
        while self._outbox and now >= self._blocked_until:
            email = self._outbox[0]
            result = self.sender.send(email)
            if result.outcome == RETRY:
                self._retry_later(email, result, now)
                return
            self._outbox.popleft()
            if result.outcome == ACCEPTED:
                self._backoff.reset()
                self._settle_sent(email, now)
            else:
                self._settle_refused(email, result, now)

    def _retry_later(self, email: RenderedEmail, result: SendResult, now: float) -> None:
        self.stats.send_failures += 1
        delay = self._backoff.next_delay(result.retry_after)
        self._blocked_until = now + delay
        _LOGGER.warning("SendGrid did not take %r (%s); attempt %d failed, retrying in %.1f s with %d e-mail(s) "
                        "waiting; their alerts stay unacknowledged", email.subject, result.detail,
                        self._backoff.failures, delay, len(self._outbox))

    def _take(self, alert_ids: Sequence[str]) -> List[HeldAlert]:
        return [self._held.pop(alert_id) for alert_id in alert_ids if alert_id in self._held]

    def _settle_sent(self, email: RenderedEmail, now: float) -> None:
        """Accepted: remember the ids, charge the budget, then ack every copy of every alert."""
        self.state.mark_sent(email.alert_ids, now)
        self.state.use_budget(email.cost, now)
        for held in self._take(email.alert_ids):
            for delivery in held.deliveries:
                delivery.ack()
        self.stats.emails_sent += 1
        self.stats.summaries_sent += email.kind == "summary"
        self.stats.alerts_sent += len(email.alert_ids)
        _LOGGER.info("sent %r to %d recipient(s) (%d alert(s)) via %s", email.subject, len(email.recipients),
                     len(email.alert_ids), self.sender.describe())

    def _settle_refused(self, email: RenderedEmail, result: SendResult, now: float) -> None:
        """Permanently refused: log it loudly and keep the alerts in the dead-letter sink."""
        self.stats.send_failures += 1
        held = self._take(email.alert_ids)
        _LOGGER.error("SendGrid refused %r for good: %s. Its %d alert(s) are kept in the dead-letter sink %s: %s",
                      email.subject, result.detail, len(held), self.dead_letters.describe(),
                      ", ".join(email.alert_ids))
        entries = [(h.deliveries[0].payload, h.deliveries[0].attributes, h.deliveries) for h in held]
        self._dead_letter(entries, f"sendgrid: {result.detail}", result.status, now)

    def _dead_letter(self, entries: List[Tuple[bytes, Dict[str, str], List[Delivery]]], reason: str,
                     status: Optional[int], now: float) -> bool:
        """Write dead letters, then ack; if even that fails, keep them (unacked) and try again after a backoff."""
        letters = [DeadLetter(payload, dict(attributes), reason, status) for payload, attributes, _ in entries]
        deliveries = [d for _, _, copies in entries for d in copies]
        if self._write_dead_letters(letters, deliveries, now):
            return True
        self._unwritten.append((letters, deliveries))
        return False

    def _write_dead_letters(self, letters: List[DeadLetter], deliveries: List[Delivery], now: float) -> bool:
        try:
            self.dead_letters.write(letters, now)
        except Exception:
            _LOGGER.exception("could not write %d dead letter(s) to %s: keeping them unacknowledged and retrying",
                              len(letters), self.dead_letters.describe())
            self._sink_blocked_until = now + self._sink_backoff.next_delay()
            return False
        for delivery in deliveries:
            delivery.ack()
        self.stats.dead_lettered += len(letters)
        return True

    def _retry_dead_letters(self, now: float) -> None:
        while self._unwritten and now >= self._sink_blocked_until:
            letters, deliveries = self._unwritten[0]
            if not self._write_dead_letters(letters, deliveries, now):
                return
            self._unwritten.pop(0)
            self._sink_backoff.reset()
