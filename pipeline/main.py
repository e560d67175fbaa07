"""``python -m pipeline [options]``: the streaming job with a Pub/Sub input, else a bounded replay.

Without options it replays the bundled demo data into ``trainguard.duckdb`` and
``alerts.jsonl`` and prints a short summary (``pipeline/replay.py``). With
``--streaming`` and a Pub/Sub input it runs the streaming job instead
(``pipeline/streaming.py``). This module only dispatches.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from apache_beam.options.pipeline_options import PipelineOptions

from core.config import ConfigError
from pipeline import replay, streaming
from pipeline.options import TrainguardOptions


def print_help() -> None:
    """trainguard's own options (Beam's PipelineOptions would print an empty help)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline", description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="Beam's pipeline options are accepted too, e.g. --runner, --project, --region, --temp_location, "
               "--streaming; see run_dataflow.sh --help for a Dataflow deployment.")
    TrainguardOptions._add_argparse_args(parser)
    parser.print_help()


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print_help()
        return 0
    try:
        if streaming.is_streaming_job(PipelineOptions(argv)):
            streaming.run(argv)
        else:
            replay.run_and_report(argv)
    except (ConfigError, FileNotFoundError, streaming.UsageError) as e:
        print(f"trainguard: error: {e}", file=sys.stderr)
        return 2
    return 0
