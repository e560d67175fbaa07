"""Command-line options of the trainguard pipeline (on top of Beam's own).

Defaults are not restated here: the run lifecycle's come from ``RunLifecycle``,
the write methods from ``core.vocabulary``, the seed's time bound from ``sinks.seed``, the
configs' refresh period from ``core.config_versions``.
"""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions

from core import locations
from core.config_versions import CONFIG_REFRESH_SECONDS, VALID_FROM_EXAMPLE
from core.runs import BACKFILL_LAG_SECONDS, RunLifecycle
from core.vocabulary import WriteMethod
from sinks.seed import SEED_ATTEMPTS, SEED_RETRY_WAIT_SECONDS, SEED_TIMEOUT_SECONDS

LIFECYCLE_DEFAULTS = RunLifecycle()

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_INPUT = os.path.join(REPO_ROOT, "data", "demo", "*.jsonl")
DEFAULT_CONFIG_DIR = locations.CONFIG_DIR
DEFAULT_REPORT_DIR = locations.REPORT_DIR
PROGRESS_QUIET_SECONDS = 2.0  # the replay's progress shows from this far into it: a short replay prints as before
PROGRESS_LOG_SECONDS = 10.0   # between its lines when stderr is not a terminal (--progress)
REPLAY_GROUP_MIB = 256.0      # input held whole a bounded replay's pipeline run reads at most, about (--replay_group_mib)
REPLAY_GROUP_RUNS = 25_000    # runs a bounded replay's pipeline run takes at most, about (--replay_group_runs)
REPLAY_GROUP_LINES = 1_000_000  # message lines a bounded replay's pipeline run reads at most, about (--replay_group_lines)


class TrainguardOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        source = parser.add_argument_group("input")
        source.add_argument("--input_files", default=None,
                            help="Glob of wire-format .jsonl files to replay (bounded). "
                                 "Default: the bundled demo data, when no other input is given.")
        source.add_argument("--triage_file", default=None,
                            help="JSONL file of triage actions (trainguard-triage) replayed with the input when "
                                 "it exists. Default: the store's own, beside --local_store "
                                 "(trainguard.duckdb: trainguard.triage.jsonl); an empty value reads none.")
        source.add_argument("--reread_files", action="store_true", default=False,
                            help="Read every input file whole. By default a replay does not read again the bytes "
                                 "of a local file that it read into the same store before, unchanged since, with "
                                 "the same configs, run lifecycle options and trainguard version (they add "
                                 "nothing): a log that grew is read from where the last replay stopped.")
        source.add_argument("--replay_group_mib", type=float, default=REPLAY_GROUP_MIB,
                            help="A replay of local files holding more than this many MiB of lines of tests with "
                                 "live windows (a pipeline run holds their points until it windows them; lines "
                                 "without a test count too) reads its tests in groups of about this size, one "
                                 "pipeline run each, so that its memory follows a group, not the whole input "
                                 "(tests share no state: the rows are the same); 0: no limit by size "
                                 "(--replay_group_runs and --replay_group_lines still apply).")
        source.add_argument("--replay_group_runs", type=int, default=REPLAY_GROUP_RUNS,
                            help="A replay of local files holding more runs than this reads its tests in groups of "
                                 "about this many runs, one pipeline run each (a run holds ~10 KB while its group "
                                 "runs); 0: no limit.")
        source.add_argument("--replay_group_lines", type=int, default=REPLAY_GROUP_LINES,
                            help="A replay of local files holding more message lines than this reads its tests in "
                                 "groups of about this many lines, one pipeline run each (a run keeps each "
                                 "message's id, ~190 bytes, while its group runs); 0: no limit.")
        source.add_argument("--config_dir", default=DEFAULT_CONFIG_DIR,
                            help="Directory of per-test JSON configs (and default.json), local or gs://. "
                                 f"<test>@<UTC time>.json (e.g. cifar@{VALID_FROM_EXAMPLE}.json) is a version "
                                 "of the test's config valid from that event time on.")
        source.add_argument("--config_refresh_seconds", type=float, default=CONFIG_REFRESH_SECONDS,
                            help="Streaming: how often (processing time) the running job re-reads --config_dir. "
                                 "A file that fails then keeps its previous version and raises a "
                                 "config_rejected alert.")
        pubsub = parser.add_argument_group(
            "streaming input (with --streaming; the files/DuckDB replay options above do not apply)")
        pubsub.add_argument("--input_subscription", default=None,
                            help="Pub/Sub subscription to read wire messages from: "
                                 "projects/<project>/subscriptions/<name>.")
        pubsub.add_argument("--input_topic", default=None,
                            help="Pub/Sub topic to read from instead, through a temporary subscription "
                                 "(messages published while the job is down are lost): "
                                 "projects/<project>/topics/<name>.")
        pubsub.add_argument("--triage_topic", default=None,
                            help="The topic trainguard-triage publishes this job's triage actions to (the one "
                                 "trainers publish to): the alerts' next_steps commands name it, with this job's "
                                 "--bigquery_project and --bigquery_dataset. Default: --input_topic, if given.")
        pubsub.add_argument("--pubsub_id_attribute", default=None,
                            help="Attribute Dataflow de-duplicates messages on (id_label); only when every "
                                 "publisher sets it. Not supported by the local runner. The pipeline "
                                 "de-duplicates by the payload's id regardless.")
        bigquery = parser.add_argument_group("BigQuery and alerts topic outputs (streaming job)")
        bigquery.add_argument("--bigquery_project", default=None,
                              help="Project of the BigQuery dataset. Default: --project.")
        bigquery.add_argument("--bigquery_dataset", default=None,
                              help="Dataset holding the trainguard tables; it and missing tables are created.")
        bigquery.add_argument("--bigquery_location", default=None,
                              help="Location for the dataset if it has to be created (e.g. US, europe-west1).")
        bigquery.add_argument("--bigquery_endpoint", default=None,
                              help="Another BigQuery API endpoint, e.g. a local emulator "
                                   "(http://127.0.0.1:9050); used with anonymous credentials.")
        bigquery.add_argument("--write_method", default=WriteMethod.STREAMING_INSERTS.value,
                              choices=[method.value for method in WriteMethod],
                              help="How rows reach BigQuery: streaming inserts (portable, the default) or the "
                                   "Storage Write API (Dataflow only: a cross-language transform).")
        bigquery.add_argument("--seed_timeout_seconds", type=float, default=SEED_TIMEOUT_SECONDS,
                              help="Bound on each BigQuery call of the start-up (creating the dataset and tables, "
                                   "each query of the history seed), transient errors retried with backoff within "
                                   "it (the seed's queries run at once). "
                                   "A query that fails or does not answer in time stops the start-up with one line "
                                   "naming its table and the cause.")
        bigquery.add_argument("--seed_attempts", type=int, default=SEED_ATTEMPTS,
                              help="How many times the job's seed step reads the seed (waiting "
                                   f"{SEED_RETRY_WAIT_SECONDS:g} s, then twice that, between tries) before it "
                                   "gives up: on Dataflow it then cancels its job, which could not run without "
                                   "it, and logs the reason; the launch tries the seed's queries first.")
        bigquery.add_argument("--alerts_topic", default=None,
                              help="Pub/Sub topic every alert is published to (projects/<project>/topics/<name>): "
                                   "the alerts file's JSON, with attributes test, run and kind.")
        local = parser.add_argument_group("local outputs")
        local.add_argument("--local_store", default=locations.LOCAL_STORE,
                           help="DuckDB file holding job/metric history, alerts and dead letters.")
        local.add_argument("--alerts_file", default=locations.ALERTS_FILE,
                           help="JSONL file the alerts are appended to (the alerts topic's payload).")
        local.add_argument("--report_dir", default=None,
                           help=f"Where the replay writes its HTML report with pictures (default: {DEFAULT_REPORT_DIR}/ beside "
                                "--local_store); an empty value skips the report.")
        local.add_argument("--progress", dest="progress", action="store_true", default=None,
                           help="Show the replay's progress on stderr (files, messages, points, points/s, elapsed "
                                f"time) also when stderr is not a terminal, as a line every {PROGRESS_LOG_SECONDS:g} s "
                                "(default: on a terminal only, one line rewritten in place; nothing in a replay's "
                                f"first {PROGRESS_QUIET_SECONDS:g} s).")
        local.add_argument("--no_progress", dest="progress", action="store_false", default=None,
                           help="Never show the replay's progress.")
        timing = parser.add_argument_group("event-time behaviour")
        timing.add_argument("--run_grace_seconds", type=float, default=LIFECYCLE_DEFAULTS.grace_seconds,
                            help="Event time after run_finished during which stragglers still count.")
        timing.add_argument("--run_timeout_seconds", type=float, default=LIFECYCLE_DEFAULTS.timeout_seconds,
                            help="Event-time inactivity after which a run without run_finished is "
                                 "finalized as missing.")
        timing.add_argument("--dedup_horizon_seconds", type=float, default=LIFECYCLE_DEFAULTS.dedup_horizon_seconds,
                            help="How long (event time) a message id is remembered for de-duplication.")
        timing.add_argument("--finalized_run_retention_seconds", type=float,
                            default=LIFECYCLE_DEFAULTS.retention_seconds,
                            help="How long (event time) a finalized run is remembered, so that late "
                                 "messages are dead-lettered instead of re-opening it.")
        timing.add_argument("--timer_bucket_seconds", type=float, default=LIFECYCLE_DEFAULTS.timer_bucket_seconds,
                            help="Streaming: the event-time-ordered checks and the live windows act on what "
                                 "the watermark has passed once per bucket of this many seconds of event time, "
                                 "not once per distinct event time (0: once per time). Same results; fewer "
                                 "timer firings, each a state read and write.")
        timing.add_argument("--backfill_lag_seconds", type=float, default=BACKFILL_LAG_SECONDS,
                            help="Streaming: a run whose first message is this much older than the wall clock is "
                                 "a back-fill (old logs sent now): it ends --backfill_quiet_seconds by the wall "
                                 "clock after its latest message instead of on the watermark, which has passed it, "
                                 "and its rows and alerts are marked out_of_order (README: Back-fills).")
        timing.add_argument("--backfill_quiet_seconds", type=float, default=LIFECYCLE_DEFAULTS.backfill_quiet_seconds,
                            help="Streaming: the silence, by the wall clock, after which a back-filled run ends.")


def lifecycle_from(options: TrainguardOptions) -> RunLifecycle:
    """The run lifecycle the options name."""
    return RunLifecycle(grace_seconds=options.run_grace_seconds, timeout_seconds=options.run_timeout_seconds,
                        dedup_horizon_seconds=options.dedup_horizon_seconds,
                        retention_seconds=options.finalized_run_retention_seconds,
                        timer_bucket_seconds=options.timer_bucket_seconds,
                        backfill_lag_seconds=options.backfill_lag_seconds,
                        backfill_quiet_seconds=options.backfill_quiet_seconds)
