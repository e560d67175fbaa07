"""Command-line options of the trainguard pipeline (on top of Beam's own)."""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_INPUT = os.path.join(REPO_ROOT, "data", "demo", "*.jsonl")
DEFAULT_CONFIG_DIR = os.path.join(REPO_ROOT, "configs")


class TrainguardOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        source = parser.add_argument_group("input")
        source.add_argument("--input_files", default=None,
                            help="Glob of wire-format .jsonl files to replay (bounded). "
                                 "Default: the bundled demo data, when no other input is given.")
        source.add_argument("--config_dir", default=DEFAULT_CONFIG_DIR,
                            help="Directory of per-test JSON configs (and default.json).")
        local = parser.add_argument_group("local outputs")
        local.add_argument("--local_store", default="trainguard.duckdb",
                           help="DuckDB file holding job/metric history, alerts and dead letters.")
        local.add_argument("--alerts_file", default="alerts.jsonl",
                           help="JSONL file the alerts are appended to (the alerts topic's payload).")
        timing = parser.add_argument_group("event-time behaviour")
        timing.add_argument("--run_grace_seconds", type=float, default=60.0,
                            help="Event time after run_finished during which stragglers still count.")
        timing.add_argument("--run_timeout_seconds", type=float, default=6 * 3600.0,
                            help="Event-time inactivity after which a run without run_finished is "
                                 "finalized as missing.")
        timing.add_argument("--dedup_horizon_seconds", type=float, default=24 * 3600.0,
                            help="How long (event time) a message id is remembered for de-duplication.")
        timing.add_argument("--finalized_run_retention_seconds", type=float, default=7 * 24 * 3600.0,
                            help="How long (event time) a finalized run is remembered, so that late "
                                 "messages are dead-lettered instead of re-opening it.")
