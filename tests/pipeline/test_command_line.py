"""``python -m pipeline``'s command line: Beam's options and trainguard's, nothing else; one line on failure."""

import os
import subprocess
import sys

import pytest

from pipeline.main import checked_argv, main
from tests.support import REPO_ROOT


def without_credentials(tmp_path):
    """An environment in which Google's libraries find no credentials (and no gcloud configuration)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "PUBSUB_EMULATOR"))}
    return dict(env, HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), GCE_METADATA_HOST="127.0.0.1:9",
                NO_GCE_CHECK="True", PYTHONPATH=REPO_ROOT)


@pytest.mark.parametrize("option, nearest", [("--alerts_fle=x.jsonl", "--alerts_file"),
                                             ("--local_stor=other.duckdb", "--local_store"),
                                             ("--bogus_flag=1", None)])
def test_an_unknown_option_exits_2_before_anything_is_written(tmp_path, monkeypatch, capsys, option, nearest):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([option])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown option {option.split('=')[0]}" in err
    assert (f"did you mean {nearest}?" in err) if nearest else "did you mean" not in err
    assert os.listdir(tmp_path) == []


def test_beam_options_pass_and_dashed_spellings_become_underscores():
    argv = ["--runner=DirectRunner", "--project", "p", "--region=europe-west1", "--temp_location=gs://b/t",
            "--streaming", "--setup_file=./setup.py", "--alerts-file=x.jsonl", "--local-store", "s.duckdb",
            "--max-num-workers=3", "--job_name=j"]
    assert checked_argv(argv) == ["--runner=DirectRunner", "--project", "p", "--region=europe-west1",
                                  "--temp_location=gs://b/t", "--streaming", "--setup_file=./setup.py",
                                  "--alerts_file=x.jsonl", "--local_store", "s.duckdb", "--max_num_workers=3",
                                  "--job_name=j"]


def test_a_dashed_option_reaches_the_replay(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--input_files=" + os.path.join(REPO_ROOT, "data", "demo", "*.jsonl"),
                 "--alerts-file=x.jsonl", "--local-store=other.duckdb", "--report-dir="]) == 0
    assert sorted(os.listdir(tmp_path)) == ["other.duckdb", "other.duckdb.lock", "x.jsonl"]
    assert "store: other.duckdb   alerts: x.jsonl" in capsys.readouterr().out


def test_help_shows_defaults_without_markup(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "(default: alerts.jsonl)" in text and "(default: trainguard.duckdb)" in text
    assert "``" not in text and "--runner" in text and "--alerts-file for" not in text


def test_missing_credentials_end_the_streaming_job_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "--streaming", "--input_topic=projects/my-project/topics/trainguard",
         "--bigquery_dataset=d", "--project=my-project"],
        cwd=tmp_path, env=without_credentials(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "trainguard: error: no Google Cloud credentials: run 'gcloud auth application-default login' or set "
        "GOOGLE_APPLICATION_CREDENTIALS (or point the tool at an emulator)"]
