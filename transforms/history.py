"""The history checks as Beam transforms: RunResult in, rows and alerts out."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core import encoding
from core.history import JobHistory, MetricHistory, apply_metric_triage, check_job, check_metric, history_policy
from core.records import Alert, MetricObservation
from core.runs import RunResult
from core.schema import ALERTS, DEAD_LETTER
from core.triage import TriageItem
from core.window_checks import reaches_run_level_history
from transforms.coders import AnyRecord
from transforms.ordered import ConfiguredMachine, OrderedCheck


class MetricMachine(ConfiguredMachine):
    """The state machine of one (test, metric): ``core.history.check_metric`` per run, triage applied."""
    def initial(self, key):
        return MetricHistory()

    def step(self, history, item):
        config = self.configs.for_test(item.test, item.order[0]).regression_test
        if isinstance(item, TriageItem):
            apply_metric_triage(history, item, history_policy(config, item.metric))
            return
        row, alert = check_metric(history, item, config)
        yield row
        if alert is not None:
            yield beam.pvalue.TaggedOutput(ALERTS.name, alert)


class JobMachine(ConfiguredMachine):
    """The state machine of one test's runs: ``core.history.check_job`` per run."""
    def initial(self, key):
        return JobHistory()

    def step(self, history, run):
        yield from check_job(history, run, self.configs.for_test(run.test, run.finalized_at))


class CheckMetricHistory(OrderedCheck[Tuple[PCollection[RunResult], PCollection[TriageItem]],
                                      Tuple[PCollection[Dict[str, Any]], PCollection[Alert],
                                            PCollection[Dict[str, Any]]]]):
    """(RunResult, TriageItem) -> (metric_history rows with bounds, metric_out_of_bounds alerts, dead letters).

    Keyed by (test, metric); each key sees its runs in the order they ended and
    bounds every value by the history of the earlier successful runs. Accepts
    and dismisses of the metric (``core.triage``) move or widen that history
    at their place in event time; an accept of a run the history does not
    hold (unless the accept says the run is still to come) is a dead letter.
    A replay groups by test, each run's observations in one element, and keys
    them by metric as it steps them: a fourth of the elements for runs of four
    metrics, the same outputs.
    """

    def expand(self, inputs):
        runs, actions = inputs
        configs = self.configs
        metric_actions = actions | "MetricActions" >> beam.Filter(
            lambda action: reaches_run_level_history(action, configs.for_test(action.test, action.time).windows))
        keys_within = None
        if self.streaming:
            observations = runs | "Observations" >> beam.FlatMap(MetricObservation.all_of)
            keyed = ((observations, metric_actions) | "ObservationsAndActions" >> beam.Flatten()
                     | "KeyByMetric" >> beam.Map(lambda o: ((o.test, o.metric), o)).with_output_types(
                         beam.typehints.KV[beam.typehints.Tuple[str, str], AnyRecord]))
        else:  # a replay: a run's observations go together, keyed by test, and are keyed by metric as stepped
            # Each value crosses the Flatten and the shuffle encoded once: a batch runner writes and reads back
            # every input of a Flatten, which would encode and decode it twice.
            by_test = beam.typehints.KV[str, bytes]
            run_observations = runs | "Observations" >> beam.Map(
                lambda run: (run.test, encoding.encode(MetricObservation.all_of(run)))).with_output_types(by_test)
            test_actions = metric_actions | "ActionsByTest" >> beam.Map(
                lambda action: (action.test, encoding.encode(action))).with_output_types(by_test)
            keyed = (run_observations, test_actions) | "ObservationsAndActions" >> beam.Flatten()
            keys_within = _metric_keys
        outputs = self.seeded_in_order(keyed, "CheckInOrder", MetricMachine(self.configs), "metric", "metrics",
                                       ALERTS.name, DEAD_LETTER.name, main="rows", keys_within=keys_within)
        return outputs.rows, outputs[ALERTS.name], outputs[DEAD_LETTER.name]


def _metric_keys(test: str, encoded: bytes) -> Iterable[Tuple[Tuple[str, Optional[str]], Any]]:
    """A replay's (test, a run's observations or a metric's triage action, encoded) -> ((test, metric), item) of
    each."""
    value = encoding.decode(encoded)
    if isinstance(value, TriageItem):
        return (((test, value.metric), value),)
    return (((test, observation.metric), observation) for observation in value)


class CheckJobHistory(OrderedCheck[PCollection[RunResult], Tuple[PCollection[Alert], PCollection[Dict[str, Any]]]]):
    """RunResult -> (run-level alerts: failed or missing job, required metric missing, ...; dead letters).

    Keyed by test, in the order runs ended, so that "alert only after the second
    failure in a row" sees the true previous run.
    """

    def expand(self, runs):
        keyed = runs | "KeyByTest" >> beam.Map(lambda r: (r.test, r)).with_output_types(
            beam.typehints.KV[str, RunResult])
        outputs = self.seeded_in_order(keyed, "CheckInOrder", JobMachine(self.configs), "job", "jobs",
                                       DEAD_LETTER.name, main="alerts")
        return outputs.alerts, outputs[DEAD_LETTER.name]
