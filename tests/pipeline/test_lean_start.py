"""``python -m pipeline`` imports without Beam's cloud clients where its command line reaches no cloud service
(``pipeline/lean_start.py``): the same rows, the clients absent, every import where a command line may need one,
and a fallback to every import where Beam cannot do without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.lean_start import FULL_IMPORTS_VARIABLE, LEFT_OUT, LOCAL_OPTIONS, reaches_no_cloud
from pipeline.options import TrainguardOptions
from tests.pipeline.test_replay import cifar_lines, table_contents
from tests.pipeline.test_replay_groups import messy_input
from tests.support import REPO_ROOT
from trainguard.cli import StrictArgumentParser

CLOUD_GROUPS = ("streaming input", "BigQuery")  # how the titles of TrainguardOptions' groups of cloud options start
BEAM_LOCAL_OPTIONS = {"runner", "direct_num_workers", "direct_running_mode"}


def environment(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != FULL_IMPORTS_VARIABLE}
    env.update(extra)
    return env


def run_python(code: str, *argv: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, env=environment(**env))


# What the child prints: the packages of LEFT_OUT it imported, and whether it was started again.
REPORT_IMPORTS = (
    "import json, os, sys\n"
    "from pipeline.lean_start import LEFT_OUT\n"
    "present = sorted({p for p in LEFT_OUT for m in list(sys.modules) if m == p or m.startswith(p + '.')})\n"
    f"print(json.dumps({{'present': present, 'again': os.environ.get({FULL_IMPORTS_VARIABLE!r})}}))\n")


def imports_of(argv, packages=LEFT_OUT, **env) -> dict:
    code = ("import sys\nfrom pipeline.lean_start import import_main\n"
            f"main = import_main(sys.argv[1:], {tuple(packages)!r})\n" + REPORT_IMPORTS)
    done = run_python(code, *argv, **env)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()  # once: a process started again prints only in its second life
    return {"stderr": done.stderr, **json.loads(line)}


@pytest.mark.parametrize("argv, lean", [
    ([], True),
    (["--input_files=data/demo/*.jsonl", "--local_store=s.duckdb", "--alerts_file=a.jsonl", "--report_dir="], True),
    (["--local-store=s.duckdb", "--no_progress", "--help"], True),
    (["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"], True),
    (["--runner=apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner"], True),
    (["--runner=DataflowRunner"], False),
    (["--runner", "FnApiRunner"], False),  # (the value as its own argument is not read: every import)
    (["--input_files=gs://bucket/logs/*.jsonl"], False),
    (["--config_dir=s3://bucket/configs"], False),
    (["--streaming"], False),
    (["--input_subscription=projects/p/subscriptions/s"], False),
    (["--bigquery_dataset=d", "--bigquery_project=p"], False),
    (["--alerts_topic=projects/p/topics/a"], False),
    (["--project=p"], False),
    (["--temp_location=/tmp/x"], False),
    (["--no_such_option"], False),
])
def test_a_command_line_reaches_no_cloud_when_each_option_is_local_and_no_value_is_remote(argv, lean):
    assert reaches_no_cloud(argv, environ={}) is lean
    assert not reaches_no_cloud(argv, environ={FULL_IMPORTS_VARIABLE: "1"})


def test_every_option_of_the_replay_is_local_but_those_of_its_cloud_groups():
    parser = StrictArgumentParser()
    TrainguardOptions._add_argparse_args(parser)
    local, cloud = set(), set()
    for group in parser._action_groups:
        names = {o[2:] for action in group._group_actions for o in action.option_strings if o.startswith("--")}
        (cloud if group.title.startswith(CLOUD_GROUPS) else local).update(names)
    assert cloud >= {"input_subscription", "bigquery_dataset", "alerts_topic"}
    assert (local - {"help"}) | BEAM_LOCAL_OPTIONS == LOCAL_OPTIONS


def test_a_local_replay_imports_none_of_the_clients_and_says_nothing_of_them():
    lean = imports_of(["--input_files=x.jsonl", "--report_dir="])
    assert lean["present"] == [] and lean["again"] is None
    assert lean["stderr"] == ""  # Beam's warnings about the file systems and clients it did not find: not shown
    full = imports_of(["--input_files=gs://bucket/x.jsonl"])
    assert {"google.cloud.storage", "google.cloud.bigquery", "google.cloud.pubsub", "google.auth"} <= set(
        full["present"])


def test_a_client_imported_after_the_start_is_imported_as_usual():
    code = ("import sys\nfrom pipeline.lean_start import import_main\nimport_main([])\n"
            "from google.cloud import bigquery, pubsub_v1\nprint(bigquery.Client.__name__, pubsub_v1.__name__)")
    done = run_python(code)
    assert done.returncode == 0 and done.stdout.split() == ["Client", "google.cloud.pubsub_v1"], done.stderr


def test_a_start_that_cannot_do_without_a_package_left_out_starts_again_with_every_import():
    """yaml stands for a client a Beam release would import without its guard: Beam cannot be imported
    without it, so the process is started again as it was, with every import."""
    again = imports_of([], packages=(*LEFT_OUT, "yaml"))
    assert again["again"] == "1" and "google.cloud.storage" in again["present"]


def test_a_local_replay_writes_what_a_replay_with_every_import_writes(tmp_path):
    path = messy_input(tmp_path, "first", cifar_lines()[:4])
    for name, env in (("lean", {}), ("full", {FULL_IMPORTS_VARIABLE: "1"})):
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", f"--input_files={path}", f"--config_dir={REPO_ROOT}/configs",
             f"--local_store={tmp_path / name}.duckdb", f"--alerts_file={tmp_path / name}.jsonl", "--report_dir=",
             "--no_progress"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=environment(**env))
        assert done.returncode == 0, done.stderr
    assert table_contents(tmp_path / "lean.duckdb") == table_contents(tmp_path / "full.duckdb")
    assert (tmp_path / "lean.jsonl").read_text() == (tmp_path / "full.jsonl").read_text()
    assert len(table_contents(tmp_path / "lean.duckdb")["dead_letter"]) >= 5
