"""notifier/deploy_cloud_run.sh: shellcheck-clean, and a dry run deploys arguments the notifier accepts."""

from __future__ import annotations

import os
import subprocess

from notifier.cli import parse_options
from tests.support import REPO_ROOT, deploy_dry_run, shellcheck

REPO = REPO_ROOT
SCRIPT = os.path.join(REPO, "notifier", "deploy_cloud_run.sh")
EXAMPLE_CONFIG = os.path.join(REPO, "notifier", "example-config.json")


def test_deploy_script_is_shellcheck_clean():
    result = shellcheck(SCRIPT)
    assert result.returncode == 0, result.stdout


def dry_run(tmp_path, **env):
    """The script's printed commands, with gcloud, docker replaced by stubs that log their calls and fail."""
    return deploy_dry_run(SCRIPT, tmp_path, ("gcloud", "docker"), "--dry-run", **env)


def test_dry_run_deploys_one_always_on_instance_with_valid_notifier_arguments(tmp_path):
    result, printed = dry_run(tmp_path, TRAINGUARD_PROJECT="proj", TRAINGUARD_PREFIX="tg", EMAIL_CONFIG=EXAMPLE_CONFIG)
    assert result.returncode == 0, result.stderr
    lines = [" ".join(c) for c in printed]
    assert any(line.startswith("gcloud pubsub subscriptions create tg-alerts-email --project=proj "
                               "--topic=tg-alerts") for line in lines)
    assert "docker build -f notifier/Dockerfile -t us-central1-docker.pkg.dev/proj/tg/tg-email:latest ." in lines
    (deploy,) = [c for c in printed if c[:3] == ["gcloud", "run", "deploy"]]
    flags = dict(arg.split("=", 1) for arg in deploy if arg.startswith("--") and "=" in arg)
    assert {"--no-cpu-throttling", "--no-allow-unauthenticated"} <= set(deploy)
    assert (flags["--min-instances"], flags["--max-instances"]) == ("1", "1")
    options = parse_options(flags["--args"].split(","), environ={"PORT": "8080"})
    assert options.subscription == "projects/proj/subscriptions/tg-alerts-email"
    assert options.dead_letter_topic == "projects/proj/topics/tg-alerts-email-dead-letter"
    assert options.sendgrid_key_secret == "projects/proj/secrets/sendgrid-api-key"
    assert flags["--set-secrets"] == f"{options.config}=tg-email-config:latest"
    assert options.health_port == 8080 and options.state_path.startswith("/state/")


def test_missing_config_is_an_error(tmp_path):
    result, printed = dry_run(tmp_path, TRAINGUARD_PROJECT="proj")
    assert result.returncode == 2 and printed == []
    assert "no config: set EMAIL_CONFIG" in result.stderr
    result, printed = dry_run(tmp_path / "again", TRAINGUARD_PROJECT="proj", EMAIL_CONFIG="nowhere.json")
    assert result.returncode == 2 and printed == []
    assert "EMAIL_CONFIG=nowhere.json: no such file" in result.stderr


def test_an_unknown_option_of_the_deploy_script_exits_2_in_one_line(tmp_path):
    for option in ("--dry_run", "--dry-run"):  # both spellings are known
        result = subprocess.run(["bash", SCRIPT, option, "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    result = subprocess.run(["bash", SCRIPT, "--dryrun"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("deploy_cloud_run.sh: error: unknown option --dryrun") and \
        result.stderr.count("\n") == 1
