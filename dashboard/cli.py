"""``trainguard-dashboard`` (``python -m dashboard``): serve the dashboard of a store.

::

    trainguard-dashboard --local_store=trainguard.duckdb
    trainguard-dashboard --bigquery_project=P --bigquery_dataset=D --topic=projects/P/topics/T --iap_audience=AUD

It listens on 127.0.0.1:8050 unless ``--host``/``--port`` say otherwise. Triage actions go where
``trainguard-triage`` sends them: the store's triage file locally, the pipeline's input topic with ``--topic``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import List, Optional, Union

from core import locations
from core.config import load_config_dir
from core.locations import triage_file_for
from sinks.stores import add_store_options, environment_note, from_environment
from trainguard.cli import DASHES_NOTE, USAGE_ERROR, StrictArgumentParser, cloud_failure, fail

PROG = "trainguard-dashboard"
ARGV_ENV = "TRAINGUARD_DASHBOARD_ARGV"  # the options, for --workers processes
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def parser() -> argparse.ArgumentParser:
    p = StrictArgumentParser(prog=PROG, epilog=DASHES_NOTE,
                             description="A web dashboard of a trainguard store: alerts, tests, runs and dead "
                                         "letters, with interactive charts and one-click triage.")
    source = p.add_argument_group("source (a DuckDB store, or a BigQuery dataset when --bigquery_dataset is set)")
    add_store_options(source)
    source.add_argument("--config_dir", default=locations.CONFIG_DIR,
                        help="directory of the per-test JSON configs the pipeline runs with: the live window checks "
                             "whose bounds a run's curves are drawn against (none there: only the bounds alerts "
                             "stored)")
    triage = p.add_argument_group("where triage actions go")
    triage.add_argument("--triage_file", default=None,
                        help="local JSONL file of triage actions (default: the store's own, beside --local_store)")
    triage.add_argument("--topic", default=from_environment("topic"),
                        help="publish triage actions to this Pub/Sub topic (the pipeline's input) instead"
                             + environment_note("topic"))
    triage.add_argument("--user", default=None, help="who local actions are from (default: the login name); "
                                                     "behind IAP, the verified user")
    serve = p.add_argument_group("serving")
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (loopback: this machine only)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes serving requests (each with its own read-only connection)")
    serve.add_argument("--iap_audience", default=None,
                       help="refuse requests without a valid Identity-Aware Proxy assertion for this audience "
                            "(/projects/NUMBER/global/backendServices/ID or /projects/NUMBER/apps/PROJECT)")
    serve.add_argument("--iap_certs_url", default=None, help="where IAP's public keys are (default: Google's)")
    return p


def settings_from(args: argparse.Namespace):
    """The app's settings from the options; FileNotFoundError for a missing store."""
    from dashboard.app import Settings
    from dashboard.security import IAP_CERTS_URL, IapVerifier
    from dashboard.store import BigQuerySource, DuckDBSource
    from dashboard.triage import ActionSink

    source: Union[BigQuerySource, DuckDBSource]
    if args.bigquery_dataset:
        source = BigQuerySource(args.bigquery_project, args.bigquery_dataset, args.bigquery_endpoint,
                                args.bigquery_timeout_seconds)
        sink = ActionSink(topic=args.topic)
    else:
        source = DuckDBSource(args.local_store)
        sink = ActionSink(topic=args.topic) if args.topic else ActionSink(
            path=args.triage_file or triage_file_for(args.local_store))
    iap = IapVerifier(args.iap_audience, args.iap_certs_url or IAP_CERTS_URL) if args.iap_audience else None
    configs = load_config_dir(args.config_dir) if os.path.isdir(args.config_dir) else None
    return Settings(source, sink, user=args.user if args.user is not None else _login(), iap=iap, configs=configs)


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container): actions carry none
        return os.environ.get("USER", "")


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if not 0 < args.port < 65536:
        return fail(PROG, f"--port={args.port} is not a port", USAGE_ERROR)
    if args.workers < 1:
        return fail(PROG, f"--workers={args.workers}: at least 1", USAGE_ERROR)
    try:
        settings = settings_from(args)
    except (FileNotFoundError, ValueError) as e:  # a missing store; a config that does not load (ConfigError)
        return fail(PROG, str(e))
    except Exception as e:  # noqa: BLE001 - a cloud failure: one line, not a traceback
        return fail(PROG, cloud_failure(e) or f"{type(e).__name__}: {e}")
    import uvicorn

    from dashboard.app import create_app

    print(f"{PROG}: serving {settings.source.label} on http://{args.host}:{args.port}/ (Ctrl-C stops it)",
          file=sys.stderr, flush=True)
    if args.workers > 1:  # each worker process builds its app from the same options
        os.environ[ARGV_ENV] = json.dumps(list(sys.argv[1:] if argv is None else argv))
        uvicorn.run("dashboard.cli:app_from_environment", factory=True, workers=args.workers, host=args.host,
                    port=args.port, log_level="warning", proxy_headers=False)
    else:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning", proxy_headers=False)
    return 0


def app_from_environment():
    """The app of a worker process (``--workers``): built from the options the command was given."""
    from dashboard.app import create_app

    return create_app(settings_from(parser().parse_args(json.loads(os.environ[ARGV_ENV]))))


if __name__ == "__main__":
    sys.exit(main())
