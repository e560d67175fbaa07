"""Triage as Beam transforms: control messages in; triage rows, alert states and re-announced alerts out.

The rules are Beam-free in ``core.triage``; the checks apply accepts and
dismisses to their own histories (``transforms.history``, ``transforms.window_checks``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core.alert_details import finish_alert
from core.records import Alert
from core.schema import ALERT_UPDATES, DEAD_LETTER
from core.triage import AlertLedger, RaisedAlert, TriageItem
from transforms.coders import AnyRecord
from transforms.ordered import ConfiguredMachine, OrderedCheck


class SkipStoredActions(beam.PTransform[PCollection[TriageItem], PCollection[TriageItem]]):
    """TriageItem -> the same, less the actions the store already holds (re-running the same files).

    ``stored`` is the singleton side input of the start-up ``core.history.StoredIndex``
    (the seed's histories already include the stored actions).
    """

    def __init__(self, stored):
        super().__init__()
        self.stored = stored

    def expand(self, actions):
        return actions | "NotStored" >> beam.Filter(lambda action, stored: action.id not in stored.stored_actions,
                                                    self.stored)


class LedgerMachine(ConfiguredMachine):
    """The state machine of one test's alert ledger: raised alerts and triage actions, in event time."""
    def initial(self, key) -> AlertLedger:
        return AlertLedger()

    def step(self, ledger: AlertLedger, item: Any) -> Iterable[Any]:
        if isinstance(item, TriageItem):
            for row in ledger.apply(item):
                yield beam.pvalue.TaggedOutput(ALERT_UPDATES, row)
        else:
            yield ledger.raise_alert(item)


class TriageAlerts(OrderedCheck[Tuple[PCollection[Alert], PCollection[TriageItem]],
                                 Tuple[PCollection[Dict[str, Any]], PCollection[Dict[str, Any]],
                                       PCollection[Dict[str, Any]]]]):
    """(Alert, TriageItem) -> (alert rows, re-announced alert rows, dead letters).

    Keyed by test, in event-time order: an alert raised while a mute covers it
    is written with ``details.triage`` saying so (the notifier does not send
    it); a dismiss or an accept re-announces the recent alerts whose state it
    changes, marked with the new state, for the alerts file and topic (the
    ``alerts`` table keeps each alert as raised; the ``triage`` table says
    what happened to it). Every alert is finished here first
    (``core.alert_details.finish_alert``: unit, report link, next steps, which
    point at ``destination``, the (option, value) pairs of where this job's
    triage actions go).
    """

    def __init__(self, *args, destination: Tuple[Tuple[str, str], ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.destination = destination

    def expand(self, inputs):
        alerts, actions = inputs
        configs = self.configs
        destination = self.destination

        def raised_row(alert: Alert) -> RaisedAlert:
            # unit, report link, next steps and the worded message, by the config valid at the alert's event time
            finished = finish_alert(alert, configs.for_test(alert.test, alert.created_at), destination)
            return RaisedAlert(alert.test, alert.created_at, finished.to_row())

        raised = alerts | "Raised" >> beam.Map(raised_row)
        keyed = ((raised, actions) | "AlertsAndActions" >> beam.Flatten()
                 | "KeyByTest" >> beam.Map(lambda item: (item.test, item)).with_output_types(
                     beam.typehints.KV[str, AnyRecord]))
        outputs = self.seeded_in_order(keyed, "InOrder", LedgerMachine(self.configs), "triage", "ledgers",
                                       ALERT_UPDATES, DEAD_LETTER.name, main="alerts")
        return outputs.alerts, outputs[ALERT_UPDATES], outputs[DEAD_LETTER.name]
