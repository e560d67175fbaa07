"""``python -m pipeline [options]``: the streaming job with a Pub/Sub input, else a bounded replay.

Without options it replays the bundled demo data into ``trainguard.duckdb`` and
``alerts.jsonl`` and prints a short summary (``pipeline/replay.py``). With
``--streaming`` and a Pub/Sub input it runs the streaming job instead
(``pipeline/streaming.py``). This module only dispatches, after checking the
command line: Beam's ``PipelineOptions`` accept any option and drop the unknown
ones, so a typo (``--alerts_fle``) would silently write to the default; here an
option that neither trainguard nor Beam knows exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import List, Optional

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from core.config import ConfigError
from pipeline import replay, streaming
from pipeline.options import TrainguardOptions
from sinks.local_outputs import OutputUnusable
from sinks.seed import SeedReadError
from trainguard.cli import (
    DASHES_NOTE,
    RUNTIME_ERROR,
    USAGE_ERROR,
    HelpFormatter,
    StrictArgumentParser,
    canonical_argv,
    cloud_failure,
    fail,
    unknown_option_message,
)

PROG = "python -m pipeline"
DESCRIPTION = ("Without options: replays the bundled demo data into trainguard.duckdb and alerts.jsonl, prints a "
               "summary and writes the HTML report. With --streaming and a Pub/Sub input: runs the streaming job "
               "(BigQuery and the alerts topic out).")
EPILOG = ("Beam's pipeline options are accepted too, e.g. --runner, --project, --region, --temp_location, "
          "--streaming, --setup_file; see run_dataflow.sh --help for a Dataflow deployment. An option that "
          "neither trainguard nor Beam knows is an error. " + DASHES_NOTE)
# Runners whose options Beam registers only when their module is imported.
_RUNNER_OPTION_MODULES = ("apache_beam.runners.dataflow.dataflow_runner", "apache_beam.runners.portability.flink_runner",
                          "apache_beam.runners.portability.spark_runner")


def all_options_parser() -> argparse.ArgumentParser:
    """A parser of every option Beam and trainguard know: each ``PipelineOptions`` subclass registers its own.

    As ``PipelineOptions.get_all_options`` builds it, plus the runner modules' options.
    """
    for module in _RUNNER_OPTION_MODULES:
        with contextlib.suppress(ImportError):  # a runner's extra that is not installed: its options are unknown
            __import__(module)
    parser = _BeamArgumentParser(prog=PROG, usage=f"{PROG} [options]  (--help lists them)", allow_abbrev=False)
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser


def checked_argv(argv: List[str]) -> List[str]:
    """``argv`` with dashed spellings of known options underscored; SystemExit(2) on an unknown option."""
    parser = all_options_parser()
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    argv = canonical_argv(argv, known)
    _, unknown = parser.parse_known_args(argv)
    if unknown:
        options = [u for u in unknown if u.startswith("-")]
        parser.error(unknown_option_message(options[0], known) if options
                     else f"unexpected argument {unknown[0]!r} (see --help)")
    return argv


def print_help() -> None:
    """trainguard's own options, with their defaults (Beam's PipelineOptions would print an empty help)."""
    parser = StrictArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    TrainguardOptions._add_argparse_args(parser)
    parser.print_help()


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print_help()
        return 0
    argv = checked_argv(argv)
    try:
        if streaming.is_streaming_job(PipelineOptions(argv)):
            streaming.run(argv)
        else:
            replay.run_and_report(argv)
    except (ConfigError, FileNotFoundError, IsADirectoryError, PermissionError, streaming.UsageError,
            OutputUnusable) as e:
        return fail("trainguard", str(e), USAGE_ERROR)
    except SeedReadError as e:
        return fail("trainguard", str(e), RUNTIME_ERROR)
    except Exception as e:
        line = cloud_failure(e)
        if line is None:
            raise
        return fail("trainguard", line, RUNTIME_ERROR)
    return 0
