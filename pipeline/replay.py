"""The bounded replay: wire-format files in; the local DuckDB store and the alerts JSONL file out.

``python -m pipeline`` without a streaming input runs :func:`run` on the bundled
demo data (or ``--input_files``) on ``FnApiRunner``, prints a short summary and
writes the HTML report. The graph is ``pipeline.graph.DetectRegressions``, the
same one the streaming job (``pipeline/streaming.py``) runs.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shlex
import time
from typing import Dict, List, Optional

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from core.config import load_config_dir
from core.schema import ALERT_UPDATES, ALERTS, TABLES
from pipeline import IMPORTED_AT
from pipeline.graph import DetectRegressions, GraphSettings
from pipeline.options import DEFAULT_REPORT_DIR, DEMO_INPUT, TrainguardOptions, lifecycle_from
from pipeline.runners import runner_for
from sinks.alerts_file import AppendAlertsToFile
from sinks.duckdb_store import DuckDBStore, WriteToDuckDB
from transforms.sources import ReadReplayFiles

EXAMPLE_EMAIL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notifier",
                                    "example-config.json")
COUNTERS = ("messages_read", "messages_of_stored_runs", "runs_finalized")


class WriteLocal(beam.PTransform):
    """The graph's outputs -> the DuckDB store; alerts, and alerts announced again, also -> the alerts JSONL file."""

    def __init__(self, store_path: str, alerts_file: str):
        super().__init__()
        self.store_path = store_path
        self.alerts_file = alerts_file

    def expand(self, outputs: Dict[str, beam.PCollection]):
        for name, rows in outputs.items():
            if name in TABLES:
                rows | f"Store_{name}" >> WriteToDuckDB(self.store_path, TABLES[name])
        ((outputs[ALERTS.name], outputs[ALERT_UPDATES]) | "AlertsAndUpdates" >> beam.Flatten()
         | "AlertsFile" >> AppendAlertsToFile(self.alerts_file))
        return beam.pvalue.PDone(outputs[ALERTS.name].pipeline)


@dataclasses.dataclass
class ReplaySummary:
    input_files: List[str]
    counters: Dict[str, int]
    rows_added: Dict[str, int]
    alerts_by_kind: Dict[str, int]
    seconds: float
    store: str
    alerts_file: str

    def render(self) -> str:
        c, rows = self.counters, self.rows_added
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.alerts_by_kind.items())) or "none"
        return "\n".join([
            f"trainguard: replayed {len(self.input_files)} file(s) in {self.seconds:.1f} s",
            f"  messages read     {c['messages_read']:>8}  (of runs already in the store: "
            f"{c['messages_of_stored_runs']})",
            f"  runs finalized    {c['runs_finalized']:>8}",
            "  rows written      " + ", ".join(f"{t} +{n}" for t, n in rows.items()),
            f"  alerts raised     {rows['alerts']:>8}  ({kinds})",
            f"  dead letters      {rows['dead_letter']:>8}",
            f"  store: {self.store}   alerts: {self.alerts_file}",
        ])


def _alert_kinds(store: DuckDBStore) -> Dict[str, int]:
    return dict(store.query("SELECT kind, count(*) FROM alerts GROUP BY kind"))


def run(argv: Optional[List[str]] = None) -> ReplaySummary:
    """Replays wire-format files through the pipeline into the local store."""
    options = PipelineOptions(argv)
    local = options.view_as(TrainguardOptions)
    pattern = local.input_files or DEMO_INPUT
    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"--input_files={pattern!r} matches no file")
    patterns = [pattern]
    if local.triage_file and os.path.isfile(local.triage_file) and os.path.abspath(local.triage_file) not in map(
            os.path.abspath, files):
        patterns.append(local.triage_file)
        files.append(local.triage_file)
    configs = load_config_dir(local.config_dir)
    store = DuckDBStore(local.local_store)
    store.ensure_schema()
    counts_before, kinds_before = store.counts(), _alert_kinds(store)
    seed = store.read_seed(configs)
    store.close()  # the pipeline's sinks open their own connections

    started = time.monotonic()
    pipeline = beam.Pipeline(runner=runner_for(options), options=options)
    outputs = (pipeline
               | "ReadFiles" >> ReadReplayFiles(patterns)
               | "DetectRegressions" >> DetectRegressions(
                   GraphSettings(configs, lifecycle_from(local), options.view_as(StandardOptions).streaming),
                   pipeline | "Seed" >> beam.Create([seed])))
    outputs | "WriteLocal" >> WriteLocal(local.local_store, local.alerts_file)
    result = pipeline.run()
    result.wait_until_finish()

    counters = {name: 0 for name in COUNTERS}
    for counter in result.metrics().query(MetricsFilter().with_namespace("trainguard"))["counters"]:
        if counter.key.metric.name in counters:
            counters[counter.key.metric.name] += counter.committed or 0
    counts_after, kinds_after = store.counts(), _alert_kinds(store)
    return ReplaySummary(
        input_files=files, counters=counters,
        rows_added={t: counts_after[t] - counts_before[t] for t in counts_after},
        alerts_by_kind={k: n - kinds_before.get(k, 0) for k, n in kinds_after.items() if n > kinds_before.get(k, 0)},
        seconds=time.monotonic() - started, store=local.local_store, alerts_file=local.alerts_file)


def run_and_report(argv: List[str]) -> None:
    """Runs the replay, prints its summary, then writes the HTML report unless ``--report_dir=`` is empty,
    and says what to do next."""
    summary = run(argv)
    print(summary.render())
    report_dir = PipelineOptions(argv).view_as(TrainguardOptions).report_dir
    if report_dir is None:
        report_dir = os.path.join(os.path.dirname(summary.store), DEFAULT_REPORT_DIR)
    report = _write_report(summary.store, report_dir) if report_dir else None
    if report is not None:
        print(f"  report: {report}")
    print(f"  total {time.monotonic() - IMPORTED_AT:.1f} s, start-up and report included")
    print(next_steps(summary, report))


def next_steps(summary: ReplaySummary, report: Optional[str]) -> str:
    """The commands worth running after a replay, spelled for its own files."""
    store, alerts = shlex.quote(summary.store), shlex.quote(summary.alerts_file)
    lines = ["next:"]
    if report and report.endswith(".html"):
        lines.append(f"  python -m webbrowser -t {shlex.quote(report)}   # the pictures and the alert list")
    lines += [
        f"  trainguard-triage list --state open --local_store={store}   # accept, dismiss or mute what fired",
        f"  python -m notifier --config {shlex.quote(os.path.relpath(EXAMPLE_EMAIL_CONFIG))} --alerts_file={alerts} "
        "--dry_run --once   # the e-mails, rendered to files",
    ]
    if summary.rows_added.get("dead_letter"):
        query = (f"import duckdb; duckdb.connect({json.dumps(summary.store)}, read_only=True)"
                 '.sql("SELECT reason, source, payload FROM dead_letter").show()')
        lines.append(f"  python -c {shlex.quote(query)}   # the dead letters: why, and the raw payload")
    return "\n".join(lines)


def _write_report(store: str, report_dir: str) -> str:
    try:
        from report import write_report  # the report is a tool of its own, with its own extra
        return write_report(store, report_dir)
    except ImportError as e:  # an install without the report extra
        return f"skipped ({e})"
