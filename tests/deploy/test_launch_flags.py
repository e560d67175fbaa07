"""Every flag run_dataflow.sh passes is one its tool knows.

The pipeline's flags go through the parser ``python -m pipeline`` itself checks them with (Beam's options, the
Dataflow runner's and trainguard's: ``pipeline.main.checked_argv``), so a misspelled or unknown flag, or a value
of the wrong type, fails here and not at launch. The gcloud and bq flags are checked against the lists below,
taken from their reference pages: only the flags the script uses.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Tuple

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions, WorkerOptions

from pipeline.main import all_options_parser, checked_argv
from pipeline.options import TrainguardOptions
from pipeline.streaming import StreamingJobConfig
from tests.deploy.support import commands, run_script

# Every way of calling the script that changes the launch command.
# (A project id has 6 to 30 characters: Beam's Pub/Sub name parsing refuses a shorter one.)
INVOCATIONS = [
    ("--project=tg-project",),
    ("--project=tg-project", "--region=europe-west1", "--service_account=runner@tg-project.iam.gserviceaccount.com",
     "--max_workers=9", "--machine_type=n2-standard-4", "--job_name=tg-prod", "--dataset=tg", "--bucket=b-tg"),
    ("--project=tg-project", "--update", "--write_method=streaming_inserts"),
]


def launch_command(tmp_path, *args: str) -> List[str]:
    result, called = run_script(tmp_path, "--dry_run", *args)
    assert result.returncode == 0 and called == "", result.stderr
    launch = commands(result.stdout)[-1]
    assert launch[:3] == [sys.executable, "-m", "pipeline"]
    return launch[3:]


@pytest.mark.parametrize("args", INVOCATIONS, ids=["defaults", "every-setting", "update-streaming-inserts"])
def test_every_pipeline_flag_is_known_to_the_parser_python_m_pipeline_uses(tmp_path, args):
    argv = launch_command(tmp_path, *args)
    parser = all_options_parser()
    for flag in argv:
        assert flag.startswith("--"), flag  # no positional arguments
        assert flag.split("=", 1)[0] in parser._option_string_actions, f"{flag}: unknown to Beam and trainguard"
    assert checked_argv(argv) == argv  # what python -m pipeline accepts, spelled as the parser spells it
    parser.parse_args(argv)  # strict: types and choices too (argparse exits on a bad value)
    options = PipelineOptions(argv)
    job = StreamingJobConfig.from_options(options)  # the streaming job's own checks, without the cloud
    assert options.view_as(StandardOptions).runner == "DataflowRunner" and options.view_as(StandardOptions).streaming
    assert options.view_as(GoogleCloudOptions).project == "tg-project"
    assert options.view_as(WorkerOptions).max_num_workers == int(dict(a.split("=", 1) for a in args if "=" in a)
                                                                 .get("--max_workers", "4"))
    assert job.subscription == "projects/tg-project/subscriptions/trainguard-metrics-pipeline"
    assert options.view_as(TrainguardOptions).write_method in ("storage_write_api", "streaming_inserts")


def test_a_misspelled_or_mistyped_pipeline_flag_would_fail_the_check(tmp_path, capsys):
    argv = launch_command(tmp_path, "--project=tg-project")
    for bad in ("--max_num_worker=3", "--input_subscriptions=projects/p/subscriptions/s", "--enable_streaming_engin"):
        with pytest.raises(SystemExit) as exit_info:
            checked_argv([*argv, bad])
        assert exit_info.value.code == 2, bad
    with pytest.raises(SystemExit):
        all_options_parser().parse_args([*argv, "--max_num_workers=many"])
    capsys.readouterr()


# The flags of each gcloud/bq command the script runs (or tells the user to run), from the reference pages
# (cloud.google.com/sdk/gcloud/reference/..., cloud.google.com/bigquery/docs/reference/bq-cli-reference).
GCLOUD_WIDE = {"--project", "--format", "--quiet"}
GCLOUD_FLAGS: Dict[Tuple[str, ...], set] = {
    ("services", "enable"): set(),
    ("pubsub", "topics", "describe"): set(),
    ("pubsub", "topics", "create"): set(),
    ("pubsub", "subscriptions", "describe"): set(),
    ("pubsub", "subscriptions", "create"): {"--topic", "--ack-deadline", "--message-retention-duration"},
    ("pubsub", "subscriptions", "update"): {"--clear-dead-letter-policy", "--clear-retry-policy"},
    ("storage", "buckets", "describe"): set(),
    ("storage", "buckets", "create"): {"--location", "--uniform-bucket-level-access"},
    ("dataflow", "jobs", "list"): {"--region", "--status", "--filter"},
    ("dataflow", "jobs", "describe"): {"--region", "--full"},
    ("storage", "rsync"): {"--delete-unmatched-destination-objects"},
}
BQ_GLOBAL = {"--project_id"}
BQ_FLAGS: Dict[str, set] = {
    "show": {"--dataset"},
    "mk": {"--dataset", "--table", "--location", "--description", "--schema", "--time_partitioning_type",
           "--time_partitioning_field", "--clustering_fields"},
}


def unknown_cloud_flags(command: List[str]) -> List[str]:
    """The flags of a gcloud or bq command that the lists above do not give it."""
    flags = [word.split("=", 1)[0] for word in command[1:] if word.startswith("--")]
    words = [word for word in command[1:] if not word.startswith("-")]
    if command[0] == "gcloud":
        group = next((key for key in GCLOUD_FLAGS if tuple(words[:len(key)]) == key), None)
        assert group is not None, f"a gcloud command the test does not know: {command}"
        return [flag for flag in flags if flag not in GCLOUD_WIDE | GCLOUD_FLAGS[group]]
    assert command[0] == "bq", command
    verb = words[0]
    return [flag for flag in flags if flag not in BQ_GLOBAL | BQ_FLAGS[verb]]


@pytest.mark.parametrize("args", INVOCATIONS, ids=["defaults", "every-setting", "update-streaming-inserts"])
def test_every_gcloud_and_bq_flag_is_one_the_command_takes(tmp_path, args):
    result, _ = run_script(tmp_path, "--dry_run", *args)
    assert result.returncode == 0, result.stderr
    cloud = [c for c in commands(result.stdout) if c[0] in ("gcloud", "bq")]
    assert len(cloud) > 10
    for command in cloud:
        assert unknown_cloud_flags(command) == [], command


def test_the_flag_lists_catch_a_misspelling():
    assert unknown_cloud_flags(["gcloud", "pubsub", "subscriptions", "create", "s", "--ack_deadline=60"]) \
        == ["--ack_deadline"]
    assert unknown_cloud_flags(["bq", "--project_id=p", "mk", "--table", "--time-partitioning-type=DAY", "p:d.t"]) \
        == ["--time-partitioning-type"]
