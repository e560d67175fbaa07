"""run_dataflow.sh's checks before it creates anything: Java for the Storage Write API, and an input
subscription without a dead-letter or retry policy (Dataflow does not support them)."""

from __future__ import annotations

import pathlib
import sys

import pytest

from tests.deploy.support import SCRIPT, commands, fake_java, run_script
from tests.support import REPO_ROOT

STORAGE_WRITE = "--write_method=storage_write_api"
NO_JAVA = ("run_dataflow.sh: error: --write_method=storage_write_api needs Java 11+ on this machine for Beam's "
           "expansion service, and there is no java on the PATH: install a JDK (java on the PATH, or JAVA_HOME), "
           "or pass --write_method=streaming_inserts\n")


def launch(result):
    printed = commands(result.stdout)
    return printed[-1] if printed and printed[-1][:3] == [sys.executable, "-m", "pipeline"] else None


@pytest.mark.parametrize("version", [
    'openjdk version "17.0.9" 2023-10-17',
    'openjdk version "11" 2018-09-25',
    'openjdk version "11.0.22" 2024-01-16',
    'Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "21-ea" 2023-09-19',
    'java version "25" 2025-09-16 LTS',
])
def test_java_11_or_newer_launches_with_the_storage_write_api(tmp_path, version):
    result, called = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, java=version + "\n")
    assert result.returncode == 0 and called == "", result.stderr
    assert "--write_method=storage_write_api" in launch(result)


@pytest.mark.parametrize(("version", "problem"), [
    ('java version "1.8.0_392"', "the java on the PATH is Java 8:"),
    ('openjdk version "10.0.2" 2018-07-17', "the java on the PATH is Java 10:"),
    ("Error: could not find libjava.so", "'java -version' names no version:"),
])
def test_an_old_or_unreadable_java_stops_before_anything_with_one_line_naming_the_fix(tmp_path, version, problem):
    result, called = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, java=version + "\n")
    assert result.returncode == 2 and called == "" and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert problem in line and line.endswith("or pass --write_method=streaming_inserts"), line


def test_no_java_stops_before_anything_is_created_with_one_line_naming_the_fix(tmp_path):
    for dry_run in (["--dry_run"], []):
        result, called = run_script(tmp_path, *dry_run, "--project=proj", STORAGE_WRITE, java=None)
        assert (result.returncode, result.stderr, result.stdout, called) == (2, NO_JAVA, "", ""), dry_run


def test_a_java_that_does_not_run_is_refused(tmp_path):
    fake_java(tmp_path / "broken", "Segmentation fault\n", exit_code=134)
    result, called = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, java=None,
                                env={"JAVA_HOME": str(tmp_path / "broken" / "..")})
    assert result.returncode == 2 and called == ""
    # JAVA_HOME/bin/java does not exist: Beam would not fall back to the PATH, and neither does the check.
    assert f"there is no java at {tmp_path}/broken/../bin/java (JAVA_HOME)" in result.stderr
    java_home = tmp_path / "jdk"
    fake_java(java_home / "bin", "Segmentation fault\n", exit_code=134)
    result, _ = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, java=None, env={"JAVA_HOME": str(java_home)})
    assert result.returncode == 2 and f"'{java_home}/bin/java -version' fails:" in result.stderr


def test_java_is_looked_for_where_beam_looks_java_home_first(tmp_path):
    java_home = tmp_path / "jdk"
    fake_java(java_home / "bin", 'openjdk version "21.0.2" 2024-01-16\n')
    result, called = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, java=None, env={"JAVA_HOME": str(java_home)})
    assert result.returncode == 0 and called == "", result.stderr
    # An old JDK in JAVA_HOME is the one Beam would run, whatever the PATH has.
    fake_java(java_home / "bin", 'java version "1.8.0_392"\n')
    result, _ = run_script(tmp_path, "--dry_run", "--project=proj", STORAGE_WRITE, env={"JAVA_HOME": str(java_home)})
    assert result.returncode == 2 and f"the java at {java_home}/bin/java (JAVA_HOME) is Java 8:" in result.stderr


def test_the_default_streaming_inserts_and_the_demo_need_no_java(tmp_path):
    """The default write method is streaming inserts: the graph whose step names are pinned for --update."""
    for given in ([], ["--write_method=streaming_inserts"]):
        result, called = run_script(tmp_path, "--dry_run", "--project=proj", *given, java=None)
        assert result.returncode == 0 and called == "", result.stderr
        assert "--write_method=streaming_inserts" in launch(result)
    result, called = run_script(tmp_path, "demo", "--dry_run", "--project=proj", java=None)
    assert result.returncode == 0 and called == "", result.stderr


# A gcloud that answers the input subscription's describe with the given policies (as the script's
# csv[no-heading] format prints them: dead-letter topic, minimum and maximum backoff) and fails all else.
POLICY_GCLOUD = """#!/bin/sh
echo "gcloud $*" >> "{log}"
case "$*" in
  "pubsub subscriptions describe trainguard-metrics-pipeline "*) echo '%s'; exit 0 ;;
esac
exit 1
"""


@pytest.mark.parametrize(("policies", "problem", "fix"), [
    ("projects/proj/topics/trainguard-metrics-dead-letter,,",
     "has a dead-letter policy (projects/proj/topics/trainguard-metrics-dead-letter)", "--clear-dead-letter-policy"),
    (",10s,600s", "has a retry policy (exponential backoff)", "--clear-retry-policy"),
])
def test_an_input_subscription_with_a_dead_letter_or_retry_policy_is_refused_before_anything(
        tmp_path, policies, problem, fix):
    result, called = run_script(tmp_path, "--project=proj", tools={"gcloud": POLICY_GCLOUD % policies})
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"run_dataflow.sh: error: subscription trainguard-metrics-pipeline {problem}: "
                           "Dataflow does not support it"), line
    assert line.endswith(f"gcloud pubsub subscriptions update trainguard-metrics-pipeline --project=proj {fix}")
    (describe,) = called.splitlines()  # the only call: nothing was enabled or created
    assert describe.startswith("gcloud pubsub subscriptions describe trainguard-metrics-pipeline --project=proj "
                               "--format=csv[no-heading](deadLetterPolicy.deadLetterTopic,")


def test_an_existing_input_subscription_without_policies_is_used_as_it_is(tmp_path):
    """A full (not dry) run against fakes that all succeed: the subscription is not created again."""
    succeeding = '#!/bin/sh\necho "{tool} $*" >> "{{log}}"\n{extra}exit 0\n'
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$1 $2" != "-m pipeline" ] || echo "python $*" >> "{tmp_path}/called.log"\n')
    python.chmod(0o755)
    describe = '[ "$1 $2 $3" != "pubsub subscriptions describe" ] || { echo ",,"; exit 0; }\n'
    result, called = run_script(tmp_path, "--project=proj", env={"PYTHON": str(python)}, tools={
        "gcloud": succeeding.format(tool="gcloud", extra=describe), "bq": succeeding.format(tool="bq", extra="")})
    assert result.returncode == 0, result.stderr
    lines = called.splitlines()
    assert lines[0].startswith("gcloud pubsub subscriptions describe trainguard-metrics-pipeline --project=proj")
    assert not [line for line in lines if "subscriptions create" in line or " create " in line or " mk " in line]
    assert lines[-1].startswith("python -m pipeline --runner=DataflowRunner")


def test_help_and_readme_say_what_the_checks_need_and_how_to_fix_it(tmp_path):
    result, _ = run_script(tmp_path, "--help", java=None)
    assert result.returncode == 0
    for text in ("Java 11+", "--write_method=streaming_inserts", "Maven Central", "~/.apache_beam/cache/jars",
                 "dead-letter or retry policy"):
        assert text in result.stdout, text
    readme = pathlib.Path(REPO_ROOT, "README.md").read_text()
    section = readme[readme.index("## Production: streaming from Pub/Sub to BigQuery on Dataflow"):]
    section = section[:section.index("\n## ")]
    for text in ("Java 11", "--write_method=streaming_inserts", "dead-letter",
                 "https://cloud.google.com/dataflow/docs/concepts/streaming-with-cloud-pubsub"):
        assert text in section, text
    assert pathlib.Path(SCRIPT).exists()


def test_an_update_through_the_storage_write_api_is_refused_unless_asked_for_unchecked(tmp_path):
    """Its Java-expanded steps are not among the pinned step names, so such an --update could break the running
    job's state unchecked: refused in one line before any command, and launched with --unchecked_update."""
    result, called = run_script(tmp_path, "--update", "--dry_run", "--project=proj", STORAGE_WRITE, java="17\n")
    assert result.returncode != 0 and result.stdout == "" and called == ""
    assert len(result.stderr.splitlines()) == 1 and "pass --unchecked_update to update anyway" in result.stderr
    result, called = run_script(tmp_path, "--update", "--dry_run", "--project=proj", STORAGE_WRITE,
                                "--unchecked_update", java='openjdk version "17.0.9" 2023-10-17\n')
    assert result.returncode == 0 and called == "", result.stderr
    assert "--update" in launch(result) and STORAGE_WRITE in launch(result)
    result, _ = run_script(tmp_path, "--update", "--dry_run", "--project=proj", "--write_method=streaming_inserts")
    assert result.returncode == 0, result.stderr  # the pinned graph needs no such flag
