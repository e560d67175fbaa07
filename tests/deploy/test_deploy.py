"""run_dataflow.sh (shellcheck, --dry-run, --help) and the demo publisher."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from google.cloud import pubsub_v1

from core.schema import TABLES
from scripts import publish_demo
from tests.deploy.support import SCRIPT, commands, run_script, write_tool
from tests.support import REPO_ROOT, shellcheck
from trainguard import wire

REPO = REPO_ROOT


def test_run_dataflow_sh_is_shellcheck_clean():
    result = shellcheck(SCRIPT)
    assert result.returncode == 0, result.stdout


def test_dry_run_prints_every_command_and_runs_none(tmp_path):
    result, called = run_script(tmp_path, "--dry-run", "--project=proj", "--region", "europe-west1",
                                "--service-account=runner@proj.iam.gserviceaccount.com")
    assert result.returncode == 0, result.stderr
    assert called == ""  # nothing touched the cloud
    printed = commands(result.stdout)
    lines = [" ".join(c) for c in printed]
    # Every resource: describe, then create (a dry run cannot know what exists).
    for describe, create in [
        ("gcloud pubsub topics describe trainguard-metrics", "gcloud pubsub topics create trainguard-metrics"),
        ("gcloud pubsub topics describe trainguard-alerts", "gcloud pubsub topics create trainguard-alerts"),
        ("bq --project_id=proj show --dataset proj:trainguard", "bq --project_id=proj mk --dataset"),
        ("gcloud storage buckets describe gs://proj-trainguard", "gcloud storage buckets create gs://proj-trainguard"),
    ]:
        at = next(i for i, line in enumerate(lines) if line.startswith(describe))
        assert lines[at + 1].startswith(create), (describe, lines[at + 1])
    # The input subscription: described first (for its policies), before anything is created; then created
    # without a dead-letter or retry policy, which Dataflow does not support.
    assert lines[0].startswith("gcloud pubsub subscriptions describe trainguard-metrics-pipeline --project=proj")
    (subscription,) = [c for c in printed if c[:4] == ["gcloud", "pubsub", "subscriptions", "create"]]
    assert subscription[4] == "trainguard-metrics-pipeline" and "--topic=trainguard-metrics" in subscription
    assert not [arg for arg in subscription if "dead-letter" in arg or "delivery-attempts" in arg or "retry" in arg]
    assert not [line for line in lines if "dead-letter" in line or "iam-policy-binding" in line]
    for name, table in TABLES.items():
        make = next(c for c in printed
                    if c[:3] == ["bq", "--project_id=proj", "mk"] and c[-1] == f"proj:trainguard.{name}")
        assert f"--time_partitioning_field={table.time_column}" in make and "--time_partitioning_type=DAY" in make
        assert f"--clustering_fields={','.join(table.cluster_by)}" in make
        schema = next(arg.split("=", 1)[1] for arg in make if arg.startswith("--schema="))
        assert os.path.basename(schema) == f"{name}.json"
    launch = printed[-1]
    assert launch[:3] == [sys.executable, "-m", "pipeline"]
    for option in ["--runner=DataflowRunner", "--streaming", "--project=proj", "--region=europe-west1",
                   "--setup_file=./setup.py", "--enable_streaming_engine", "--max_num_workers=4",
                   "--service_account_email=runner@proj.iam.gserviceaccount.com",
                   "--temp_location=gs://proj-trainguard/temp",
                   "--input_subscription=projects/proj/subscriptions/trainguard-metrics-pipeline",
                   "--alerts_topic=projects/proj/topics/trainguard-alerts", "--bigquery_dataset=trainguard",
                   "--write_method=streaming_inserts",
                   "--triage_topic=projects/proj/topics/trainguard-metrics",
                   "--config_dir=gs://proj-trainguard/trainguard-streaming/configs"]:
        assert option in launch, option
    assert "--update" not in launch


def test_deploy_uploads_the_configs_after_every_check_and_launches_on_the_uploaded_copy(tmp_path):
    result, called = run_script(tmp_path, "--dry-run", "--project=proj", "--job_name=tg-prod")
    assert result.returncode == 0 and called == "", result.stderr
    printed = commands(result.stdout)
    upload = ["gcloud", "storage", "rsync", f"{REPO}/configs", "gs://proj-trainguard/tg-prod/configs",
              "--delete-unmatched-destination-objects", "--project=proj"]
    # the last check (no job of that name running) first: a refused deploy leaves the running job's configs alone
    assert printed[-3][:4] == ["gcloud", "dataflow", "jobs", "list"] and printed[-2] == upload
    assert "--config_dir=gs://proj-trainguard/tg-prod/configs" in printed[-1]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.json").write_text("{}")
    elsewhere, _ = run_script(tmp_path, "--dry-run", "--project=proj", "--config_gcs=gs://configs-bucket/tg",
                              "--config-dir=configs")  # relative to where the script is run
    uploaded = commands(elsewhere.stdout)
    assert uploaded[-2][3:5] == [f"{tmp_path}/configs", "gs://configs-bucket/tg"], elsewhere.stderr
    assert "--config_dir=gs://configs-bucket/tg" in uploaded[-1]


def test_configs_subcommand_checks_and_uploads_the_configs_and_nothing_else(tmp_path):
    result, called = run_script(tmp_path, "configs", "--dry-run", "--project=proj")
    assert result.returncode == 0 and called == "", result.stderr
    assert commands(result.stdout) == [["gcloud", "storage", "rsync", f"{REPO}/configs",
                                        "gs://proj-trainguard/trainguard-streaming/configs",
                                        "--delete-unmatched-destination-objects", "--project=proj"]]


@pytest.mark.parametrize("command", ["deploy", "configs"])
def test_a_bad_config_stops_before_anything_is_created_or_uploaded_naming_file_and_key(tmp_path, command):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "cifar.json").write_text(json.dumps({"regression_test_config": {"alert_for_failed_jobs": "yes"}}))
    result, called = run_script(tmp_path, command, "--dry-run", "--project=proj", f"--config_dir={configs}")
    assert result.returncode == 2 and result.stdout == "" and called == ""
    assert result.stderr.startswith(f"run_dataflow.sh: error: {configs}/cifar.json: "
                                    "regression_test_config.alert_for_failed_jobs: must be true/false")
    assert len(result.stderr.splitlines()) == 1


def test_update_takes_settings_from_the_environment(tmp_path):
    result, called = run_script(tmp_path, "--update", "--dry-run", env={
        "TRAINGUARD_PROJECT": "envproj", "TRAINGUARD_DATASET": "tg", "TRAINGUARD_MAX_WORKERS": "12",
        "TRAINGUARD_JOB_NAME": "tg-prod", "TRAINGUARD_WRITE_METHOD": "streaming_inserts"})
    assert result.returncode == 0, result.stderr
    assert called == ""
    printed = commands(result.stdout)
    assert any(c[:4] == ["gcloud", "dataflow", "jobs", "list"] and "--filter=name=tg-prod" in c for c in printed)
    launch = printed[-1]
    for option in ["--update", "--project=envproj", "--bigquery_dataset=tg", "--max_num_workers=12",
                   "--job_name=tg-prod", "--write_method=streaming_inserts"]:
        assert option in launch, option


def test_bad_invocations_stop_before_any_command(tmp_path):
    for args, problem in [((), "no project"), (("--project=p", "--max-workers=many"), "--max_workers"),
                          (("--project=p", "--write-method=batch"), "--write_method"),
                          (("--project", "--dry-run"), "--project needs a value"),
                          (("--project=p", "--config_gcs=/tmp/configs"), "--config_gcs must be a gs:// URL"),
                          (("--project=p", "--frobnicate"), "unknown option --frobnicate"),
                          (("deploi", "--project=p"), "unknown command deploi")]:
        result, called = run_script(tmp_path, *args, env={"GOOGLE_CLOUD_PROJECT": ""})
        assert result.returncode == 2 and problem in result.stderr, (args, result.stderr)
        assert result.stdout == "" and called == ""


def test_help_explains_every_option(tmp_path):
    result, _ = run_script(tmp_path, "--help")
    assert result.returncode == 0
    script = pathlib.Path(SCRIPT).read_text()
    parsed = set(re.findall(r"^\s+(--[a-z_]+)\)", script, re.M))
    assert parsed >= {"--project", "--update", "--dry_run", "--max_workers", "--service_account"}
    for option in parsed:
        assert option in result.stdout, option
    assert "drain" in result.stdout and "demo" in result.stdout


def test_demo_subcommand_publishes_with_the_demo_script(tmp_path):
    result, called = run_script(tmp_path, "demo", "--dry-run", "--project=proj", "--rate=20")
    assert result.returncode == 0 and called == ""
    assert commands(result.stdout) == [[sys.executable, "scripts/publish_demo.py",
                                        "--topic=projects/proj/topics/trainguard-metrics", "--rate=20"]]


def test_publish_demo_sends_the_demo_workload_with_wire_attributes(pubsub_server, capsys):
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.create_topic(name=pubsub_server.topic_path("metrics")).name
    subscription = subscriber.create_subscription(name=pubsub_server.subscription_path("s"), topic=topic).name
    assert publish_demo.main([f"--topic={topic}", "--start=1795000000", "--run_spacing_seconds=30"]) == 0
    expected = publish_demo.demo_payloads(1795000000, 30, 0.05)
    assert f"published {len(expected)} messages" in capsys.readouterr().out
    published = pubsub_server.published_messages(topic)
    assert sorted(m.data for m in published) == sorted(expected)  # the client batches concurrently
    for message in published:
        body = json.loads(message.data)
        times = [p["time"] for p in body.get("points", [])] + [e["time"] for e in body.get("events", [])]
        assert dict(message.attributes) == {"schema": wire.SCHEMA, "test": body["test"], "run": body["run"],
                                            "ts": str(int(max(times) * 1000)), "id": body["id"]}
    first_start = min(json.loads(p)["events"][0]["time"] for p in expected
                      if '"run_started"' in p.decode())
    assert first_start == 1795000000
    subscriber.delete_subscription(subscription=subscription)


def test_both_spellings_of_a_multi_word_option_are_accepted(tmp_path):
    launches = []
    for spelling in (["--dry_run", "--job_name=tg-a", "--max_workers", "7"],
                     ["--dry-run", "--job-name=tg-a", "--max-workers", "7"]):
        result, called = run_script(tmp_path, "--project=proj", *spelling)
        assert result.returncode == 0 and called == "", result.stderr
        launches.append(commands(result.stdout)[-1])
    assert launches[0] == launches[1]
    assert "--job_name=tg-a" in launches[0] and "--max_num_workers=7" in launches[0]


def test_an_unknown_option_names_it_as_given(tmp_path):
    result, called = run_script(tmp_path, "--project=p", "--job-nmae=x")
    assert result.returncode == 2 and called == ""
    assert result.stderr == "run_dataflow.sh: error: unknown option --job-nmae (see --help)\n"


def test_the_demo_publisher_rejects_an_unknown_option_naming_the_nearest(capsys):
    with pytest.raises(SystemExit) as exit_info:
        publish_demo.main(["--topic=projects/p/topics/t", "--lead-second=5"])
    assert exit_info.value.code == 2
    assert "unknown option --lead-second (did you mean --lead_seconds?)" in capsys.readouterr().err


def test_the_demo_publisher_without_credentials_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "PUBSUB_EMULATOR"))}
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), GCE_METADATA_HOST="127.0.0.1:9",
               NO_GCE_CHECK="True")
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "publish_demo.py"),
                             "--topic=projects/p/topics/t"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "publish_demo.py: error: no Google Cloud credentials: run 'gcloud auth application-default login' or "
        "set GOOGLE_APPLICATION_CREDENTIALS (or point the tool at an emulator)"]


GCLOUD_OF_A_RUNNING_JOB = """#!/bin/sh
echo "gcloud $*" >> "{log}"
case "$*" in
  "pubsub subscriptions describe"*) echo ",," ;;
  "dataflow jobs list"*) echo "2026-11-01_00_00_00-123" ;;
  "dataflow jobs describe"*) echo "{deployed}" ;;
esac
exit 0
"""
LAUNCH_LOGGED = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pipeline" ]; then echo "python $*" >> "{log}"; exit 0; fi
exec {python} "$@"
"""


@pytest.mark.parametrize("deployed, expected", [("2.70.0", "--update_compatibility_version=2.70.0"), (None, None)])
def test_update_asks_for_the_running_jobs_sdk_compatibility_when_it_differs(tmp_path, deployed, expected):
    """A real --update (gcloud, bq and the launch stubbed): the running job is looked up, its Beam SDK version
    read, and the launch gets --update_compatibility_version=<that version> only when it differs from the one
    installed."""
    import apache_beam

    deployed = deployed or apache_beam.__version__
    python = write_tool(tmp_path / "python", "python", LAUNCH_LOGGED.replace("{python}", sys.executable)
                        .replace("{log}", str(tmp_path / "called.log")))
    result, called = run_script(tmp_path, "--update", "--project=proj", "--write_method=streaming_inserts",
                                env={"PYTHON": str(python)},
                                tools={"gcloud": GCLOUD_OF_A_RUNNING_JOB.replace("{deployed}", deployed),
                                       "bq": '#!/bin/sh\necho "bq $*" >> "{log}"\nexit 0\n'})
    assert result.returncode == 0, result.stderr
    calls = called.splitlines()
    assert any(c.startswith("gcloud dataflow jobs describe 2026-11-01_00_00_00-123 --project=proj") for c in calls)
    [launch] = [c.split() for c in calls if c.startswith("python -m pipeline")]
    assert "--update" in launch
    compatibility = [arg for arg in launch if arg.startswith("--update_compatibility_version")]
    assert compatibility == ([expected] if expected else [])
