"""The streaming job: Pub/Sub in; BigQuery and the alerts topic out.

``python -m pipeline --streaming --input_subscription=... --bigquery_dataset=... --alerts_topic=...``
runs the same graph as the local replay (``pipeline.graph.DetectRegressions``)
on ``BundleBasedDirectRunner`` locally or ``--runner=DataflowRunner`` in
production. At start-up it creates the BigQuery dataset and any missing
table, and the job's first step reads the history seed back from those tables,
so a new job continues where the last one stopped. The configs are read at
start-up (a bad one refuses to start) and then re-read by the running job
every ``--config_refresh_seconds`` (``transforms.config_versions``): a file
that fails then keeps its previous version and raises a ``config_rejected``
alert, which joins the other alerts on their way to the table and the topic.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineResult

from core.config_versions import CONFIG_REFRESH_SECONDS, LoadedConfigs
from core.schema import ALERT_UPDATES, ALERTS
from core.vocabulary import WriteMethod
from pipeline.check_configs import print_warnings, unreported_in_store
from pipeline.graph import DetectRegressions, GraphSettings
from pipeline.options import TrainguardOptions, lifecycle_from
from pipeline.runners import runner_for
from sinks.bigquery import (
    BigQueryTarget,
    ReadSeedFromBigQuery,
    SeedPolicy,
    WriteToBigQueryTables,
    check_seed,
    ensure_tables,
)
from sinks.dataflow_job import DataflowJob
from sinks.pubsub import PublishAlerts
from sinks.seed import SEED_ATTEMPTS, SEED_TIMEOUT_SECONDS
from sinks.stores import open_bigquery
from transforms.config_versions import LiveConfigs, WatchConfigs, read_config_dir
from transforms.sources import ReadPubSubMessages


class UsageError(ValueError):
    """Options that cannot make a streaming job; the message says which and why."""


def check_pubsub_names(subscription: Optional[str], topic: Optional[str], alerts_topic: Optional[str],
                       triage_topic: Optional[str] = None) -> None:
    """Beam's own parsing of the Pub/Sub names, as a usage error instead of a traceback from graph construction."""
    from apache_beam.io.gcp.pubsub import parse_subscription, parse_topic

    for option, name, parse in (("--input_subscription", subscription, parse_subscription),
                                ("--input_topic", topic, parse_topic), ("--alerts_topic", alerts_topic, parse_topic),
                                ("--triage_topic", triage_topic, parse_topic)):
        if name is not None:
            try:
                parse(name)
            except ValueError as e:
                raise UsageError(f"{option}={name}: {e} (project ids are 6 to 30 characters)") from None


@dataclasses.dataclass(frozen=True)
class StreamingJobConfig:
    """Everything the streaming job reads from and writes to."""
    subscription: Optional[str]
    topic: Optional[str]
    target: BigQueryTarget
    write_method: str = WriteMethod.STREAMING_INSERTS.value
    alerts_topic: Optional[str] = None
    id_attribute: Optional[str] = None
    seed_timeout_seconds: float = SEED_TIMEOUT_SECONDS
    seed_attempts: int = SEED_ATTEMPTS
    triage_topic: Optional[str] = None
    config_refresh_seconds: float = CONFIG_REFRESH_SECONDS

    @property
    def triage_destination(self) -> Tuple[Tuple[str, str], ...]:
        """Where ``trainguard-triage`` sends actions on this job's alerts, as its options: the topic the job reads
        them from (when known) and the dataset it checks names against."""
        topic = (("--topic", self.triage_topic),) if self.triage_topic else ()
        endpoint = (("--bigquery_endpoint", self.target.endpoint),) if self.target.endpoint else ()
        return (*topic, ("--bigquery_project", self.target.project), ("--bigquery_dataset", self.target.dataset),
                *endpoint)

    @staticmethod
    def from_options(options: PipelineOptions) -> StreamingJobConfig:
        local = options.view_as(TrainguardOptions)
        if not options.view_as(StandardOptions).streaming:
            raise UsageError("reading Pub/Sub needs --streaming")
        if (local.input_subscription is None) == (local.input_topic is None):
            raise UsageError("the streaming job needs exactly one of --input_subscription and --input_topic")
        check_pubsub_names(local.input_subscription, local.input_topic, local.alerts_topic, local.triage_topic)
        if not local.bigquery_dataset:
            raise UsageError("the streaming job writes to BigQuery: --bigquery_dataset is required")
        project = local.bigquery_project or options.view_as(GoogleCloudOptions).project
        if not project:
            raise UsageError("--bigquery_project (or --project) is required")
        if local.pubsub_id_attribute and not is_dataflow(options):
            raise UsageError("--pubsub_id_attribute (id_label) is only supported by DataflowRunner")
        if local.write_method == WriteMethod.STORAGE_WRITE_API and not is_dataflow(options):
            raise UsageError("--write_method=storage_write_api is a cross-language transform: DataflowRunner only")
        if not local.seed_timeout_seconds > 0:
            raise UsageError(f"--seed_timeout_seconds={local.seed_timeout_seconds:g}: must be more than 0")
        if not local.seed_attempts >= 1:
            raise UsageError(f"--seed_attempts={local.seed_attempts}: must be at least 1")
        if not local.config_refresh_seconds > 0:
            raise UsageError(f"--config_refresh_seconds={local.config_refresh_seconds:g}: must be more than 0")
        return StreamingJobConfig(
            subscription=local.input_subscription, topic=local.input_topic,
            target=BigQueryTarget(project, local.bigquery_dataset, local.bigquery_endpoint, local.bigquery_location),
            write_method=local.write_method, alerts_topic=local.alerts_topic,
            id_attribute=local.pubsub_id_attribute, seed_timeout_seconds=local.seed_timeout_seconds,
            seed_attempts=local.seed_attempts, triage_topic=local.triage_topic or local.input_topic,
            config_refresh_seconds=local.config_refresh_seconds)


def is_streaming_job(options: PipelineOptions) -> bool:
    """Whether the options ask for the streaming job rather than a local replay."""
    local = options.view_as(TrainguardOptions)
    return bool(options.view_as(StandardOptions).streaming or local.input_subscription or local.input_topic)


def is_dataflow(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return runner is not None and "dataflow" in (runner if isinstance(runner, str) else type(runner).__name__).lower()


def build_streaming_pipeline(options: PipelineOptions, configs: LoadedConfigs,
                             job: StreamingJobConfig) -> beam.Pipeline:
    """The streaming pipeline: ReadPubSubMessages -> DetectRegressions -> BigQuery (+ alerts topic).

    ``configs`` is the config directory as read at start-up; the stages follow it while the job runs
    (``LiveConfigs``), and ``WatchConfigs`` adds a ``config_rejected`` alert for each version of a file they
    reject.
    """
    pipeline = beam.Pipeline(runner=runner_for(options), options=options)
    live = LiveConfigs(configs, job.config_refresh_seconds)
    lifecycle = lifecycle_from(options.view_as(TrainguardOptions))
    seed = pipeline | "Seed" >> ReadSeedFromBigQuery(job.target, configs.versions.latest, SeedPolicy(
        job.seed_timeout_seconds, job.seed_attempts, stored_horizon_seconds=lifecycle.stored_run_horizon_seconds,
        job=DataflowJob.from_options(options) if is_dataflow(options) else None))
    messages = pipeline | "ReadPubSub" >> ReadPubSubMessages(job.subscription, job.topic, job.id_attribute)
    settings = GraphSettings(live, lifecycle, streaming=True, triage_destination=job.triage_destination)
    outputs = messages | "DetectRegressions" >> DetectRegressions(settings, seed)
    config_alerts = messages | "WatchConfigs" >> WatchConfigs(live)
    alerts = (outputs[ALERTS.name], config_alerts) | "AlertsAndConfigAlerts" >> beam.Flatten()
    {**outputs, ALERTS.name: alerts} | "WriteBigQuery" >> WriteToBigQueryTables(job.target, job.write_method)
    if job.alerts_topic:
        ((alerts, outputs[ALERT_UPDATES]) | "AlertsAndUpdates" >> beam.Flatten()
         | "PublishAlerts" >> PublishAlerts(job.alerts_topic))
    return pipeline


def start_streaming(argv: Optional[List[str]] = None) -> PipelineResult:
    """Creates what BigQuery needs and starts the streaming job; returns without waiting for it.

    Raises ``UsageError`` or ``ConfigError`` (naming the first bad config file) before anything starts.
    """
    options = PipelineOptions(argv)
    job = StreamingJobConfig.from_options(options)
    configs = read_config_dir(options.view_as(TrainguardOptions).config_dir)
    configs.strict()
    ensure_tables(job.target, timeout_seconds=job.seed_timeout_seconds)
    scanned = check_seed(job.target, configs.versions.latest, job.seed_timeout_seconds)
    print(f"trainguard: the history seed's queries and tables answer ({scanned / 1e6:.1f} MB to scan at the "
          "job's start)", flush=True)
    print_warnings(unreported_in_store(configs.versions.latest, open_bigquery(
        job.target.project, job.target.dataset, job.target.endpoint, job.seed_timeout_seconds)), "trainguard")
    return build_streaming_pipeline(options, configs, job).run()


def run(argv: List[str]) -> None:
    """Starts the streaming job; waits for it on a local runner (Ctrl-C stops it), not on Dataflow."""
    result = start_streaming(argv)
    options = PipelineOptions(argv)
    if is_dataflow(options):
        job_id = getattr(result, "job_id", lambda: None)()
        print(f"trainguard: streaming job submitted to Dataflow (job id {job_id}); "
              f"stop it with 'gcloud dataflow jobs drain {job_id}'")
        return
    print("trainguard: streaming job running on the local runner; Ctrl-C stops it", flush=True)
    wait_until_interrupted(result)


def wait_until_interrupted(result) -> None:
    """Waits for a local runner's job; Ctrl-C cancels it."""
    try:
        result.wait_until_finish()
    except KeyboardInterrupt:
        result.cancel()
    except RuntimeError as error:
        if not isinstance(error.__context__, KeyboardInterrupt):
            raise
        # Ctrl-C inside a condition's wait: the lock's release in its `with` then fails ("release unlocked
        # lock"), and that RuntimeError, not the KeyboardInterrupt, comes out of the runner's queue
        result.cancel()
