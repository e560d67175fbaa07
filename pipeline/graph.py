"""The trainguard graph: raw messages in; history rows, alerts and dead letters out.

The same graph runs as a bounded replay of files (FnApiRunner) and as a
streaming job on Pub/Sub (BundleBasedDirectRunner locally, Dataflow in
production): every stateful step is keyed and driven by event-time timers, so
no step needs to see all input at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Optional, Tuple

import apache_beam as beam
from apache_beam import PCollection

from core.config import Configs
from core.history import HistorySeed, StoredIndex
from core.parse import RawMessage
from core.records import job_history_row, rank_metric_rows
from core.runs import RunLifecycle
from core.schema import (
    ALERT_UPDATES,
    ALERTS,
    DEAD_LETTER,
    JOB_HISTORY,
    METRIC_HISTORY,
    METRIC_WINDOWS,
    RANK_METRICS,
    TRIAGE,
)
from core.triage import TriageItem
from transforms.history import CheckJobHistory, CheckMetricHistory
from transforms.parse import DeduplicateMessages, ParseMessages, SummarizeMessages
from transforms.runs import AssembleRuns, SkipStoredRuns
from transforms.triage import SkipStoredActions, TriageAlerts
from transforms.windows import LiveWindows


@dataclasses.dataclass(frozen=True)
class GraphSettings:
    """What the graph is built from: the per-test configs, the run lifecycle, and whether input is unbounded."""
    configs: Configs
    lifecycle: RunLifecycle = RunLifecycle()
    streaming: bool = False  # unbounded input: live windows settle as the watermark advances
    progress_id: Optional[str] = None  # a transforms.progress counter of messages and points read (the replay's)
    # (option, value) pairs of where triage actions for this job's alerts go, in their next_steps commands
    triage_destination: Tuple[Tuple[str, str], ...] = ()
    # The seed's per-key fields that hold anything (``HistorySeed.held``), where the graph is built with the seed in
    # hand (a replay reads it first); None: any may (a streaming job reads its seed as it starts).
    seed_holds: Optional[FrozenSet[str]] = None
    # Whether a bounded input may have live windows: None where the configs alone say (``Configs.any_live_windows``);
    # a replay that surveyed its lines says False where none of their tests has any (``pipeline.replay``).
    live_windows: Optional[bool] = None

    def windowed(self) -> bool:
        """Whether the graph builds ``LiveWindows``: a streaming job always does, its configs and input may change."""
        if self.streaming:
            return True
        return self.configs.any_live_windows() if self.live_windows is None else self.live_windows


class KeepRecordedTests(beam.PTransform[PCollection[Dict[str, Any]], PCollection[Dict[str, Any]]]):
    """Drops history rows of tests configured with ``write_to_bigquery: false``."""

    def __init__(self, configs: Configs):
        super().__init__()
        self.configs = configs

    def expand(self, rows):
        configs = self.configs
        return rows | "WrittenTests" >> beam.Filter(lambda row: configs.for_test(row["test_name"]).metric_collection.write_to_bigquery)


class DetectRegressions(beam.PTransform[PCollection[RawMessage], Dict[str, PCollection[Dict[str, Any]]]]):
    """RawMessage -> dict of PCollections keyed by output table name, plus ``alert_updates``.

    ``job_history`` and ``metric_history`` hold row dicts of finalized runs
    (``job_history`` also, in a streaming job, those of runs its drain cut
    short, status ``interrupted``), ``metric_windows`` rows of live windows (tests with a ``window_config``),
    ``alerts`` alert row dicts (also the alerts topic's payload), ``triage``
    the users' triage actions (control messages), and ``dead_letter`` rows for
    every input that could not be used. ``alert_updates`` (not a table) are
    alert rows announced again because a triage action changed their state:
    they go to the alerts file and topic only.
    ``seed`` is a one-element PCollection with the ``HistorySeed`` of earlier
    invocations, so that history continues across restarts. Its histories
    reach their keys as elements (each check's ``Seeds``); only the
    ``StoredIndex`` of stored runs and actions is a side input.
    """

    def __init__(self, settings: GraphSettings, seed: beam.PCollection):
        super().__init__()
        self.settings = settings
        self.seed = seed

    def may_hold(self, field: str) -> bool:
        """Whether the seed's ``field`` may hold anything: False only where the settings know it holds nothing."""
        held = self.settings.seed_holds
        return held is None or field in held

    def seed_of(self, field: str) -> Optional[beam.PCollection]:
        """The seed, for a stage that joins only its ``field`` to its keys; None where the settings know that field
        holds nothing. Joining an empty seed is a Flatten of the stage's items with nothing, through which a batch
        runner copies every item (encoded and decoded once more: a third of a replay of many one-run tests)."""
        return self.seed if self.may_hold(field) else None

    def expand(self, raw_messages):
        settings = self.settings
        seed = self.seed
        stored = beam.pvalue.AsSingleton(
            seed | "StoredIndex" >> beam.Map(HistorySeed.index).with_output_types(StoredIndex))
        messages, triage_messages, bad_input = raw_messages | "Parse" >> ParseMessages(settings.progress_id)
        actions, different_actions = triage_messages | "DeduplicateTriage" >> DeduplicateMessages(
            settings.lifecycle.dedup_horizon_seconds, forget=settings.streaming)
        actions = actions | "SkipStoredActions" >> SkipStoredActions(stored)
        summarized, unsummarized = messages | "Summarize" >> SummarizeMessages(settings.configs)
        # Streaming: messages of stored runs are dead letters, and runs a drain cuts short are stored as
        # interrupted (job_history only), to be resumed from the seed by the next job. A bounded replay
        # de-duplicates as it assembles runs (AssembleRunPartsFn) and windows (LiveWindows).
        different_copies = [different_actions]
        if settings.streaming:
            summarized, different_messages = summarized | "Deduplicate" >> DeduplicateMessages(
                settings.lifecycle.dedup_horizon_seconds)
            different_copies.append(different_messages)
        stored_run_messages = []
        if self.may_hold("stored_runs"):
            summaries, stored_run_message_rows = summarized | "SkipStoredRuns" >> SkipStoredRuns(
                stored, dead_letter=settings.streaming)
            stored_run_messages.append(stored_run_message_rows)
        else:  # a replay into a store that holds no run: nothing to skip, and no side input to ask a message
            summaries = summarized
        runs, late_messages, interrupted = summaries | "AssembleRuns" >> AssembleRuns(
            settings.configs, settings.lifecycle, self.seed_of("open_runs"), interruptions=settings.streaming,
            backfills=settings.streaming, bounded=not settings.streaming)
        # Only a drain interrupts runs (interruptions=settings.streaming): a replay's run ends are its runs, with
        # no Flatten with an empty output for a batch runner to copy each run through (so in LiveWindows).
        ended = (runs, interrupted) | "EndedAndInterrupted" >> beam.Flatten() if settings.streaming else runs
        bucket = settings.lifecycle.timer_bucket_seconds
        metric_rows, metric_alerts, failed_metrics = (runs, actions) | "CheckMetrics" >> CheckMetricHistory(
            settings.configs, self.seed_of("metrics"), settings.streaming, bucket)
        run_alerts, failed_runs = runs | "CheckRuns" >> CheckJobHistory(
            settings.configs, self.seed_of("jobs"), settings.streaming, bucket)
        if settings.windowed():
            window_rows, window_alerts, late_points = (
                (summaries, runs, interrupted, actions) | "LiveWindows" >> LiveWindows(
                    settings.configs, settings.lifecycle, self.seed_of("windows"), settings.streaming,
                    deduplicate=not settings.streaming))
            raised = (run_alerts, metric_alerts, window_alerts) | "AllAlerts" >> beam.Flatten()
        else:  # a replay whose configs or tests have no live windows: their ~8 stages would start and find nothing
            window_rows = late_points = runs | "NoLiveWindows" >> beam.FlatMap(lambda run: ())
            raised = (run_alerts, metric_alerts) | "AllAlerts" >> beam.Flatten()
        alert_rows, alert_updates, failed_alerts = (raised, actions) | "Triage" >> TriageAlerts(
            settings.configs, self.seed_of("ledgers"), settings.streaming, bucket,
            destination=settings.triage_destination)
        return {
            JOB_HISTORY.name: (ended
                               | "JobRows" >> beam.Map(job_history_row)
                               | "RecordedJobs" >> KeepRecordedTests(settings.configs)),
            METRIC_HISTORY.name: metric_rows | "RecordedMetrics" >> KeepRecordedTests(settings.configs),
            RANK_METRICS.name: (runs | "RankRows" >> beam.FlatMap(rank_metric_rows)
                                | "RecordedRanks" >> KeepRecordedTests(settings.configs)),
            METRIC_WINDOWS.name: window_rows | "RecordedWindows" >> KeepRecordedTests(settings.configs),
            ALERTS.name: alert_rows,
            ALERT_UPDATES: alert_updates,
            TRIAGE.name: actions | "TriageRows" >> beam.Map(TriageItem.to_row),
            DEAD_LETTER.name: ((bad_input, unsummarized, *different_copies, *stored_run_messages, late_messages,
                                late_points, failed_metrics, failed_runs, failed_alerts)
                               | "AllDeadLetters" >> beam.Flatten()),
        }
