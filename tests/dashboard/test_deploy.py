"""dashboard/deploy_cloud_run.sh: shellcheck-clean, and a dry run deploys, behind IAP, arguments the dashboard
accepts (sharing the notifier's gcloud helpers)."""

from __future__ import annotations

import os
import subprocess

from dashboard.cli import parser
from tests.support import REPO_ROOT, deploy_dry_run, shellcheck

SCRIPT = os.path.join(REPO_ROOT, "dashboard", "deploy_cloud_run.sh")
AUDIENCE = "/projects/123/global/backendServices/456"


def test_deploy_script_is_shellcheck_clean():
    result = shellcheck(SCRIPT)
    assert result.returncode == 0, result.stdout


def dry_run(tmp_path, **env):
    """The script's printed commands, with gcloud, bq, docker replaced by stubs that log their calls and fail."""
    return deploy_dry_run(SCRIPT, tmp_path, ("gcloud", "bq", "docker"), "--dry_run", **env)


def test_dry_run_deploys_behind_iap_with_valid_dashboard_arguments(tmp_path):
    result, printed = dry_run(tmp_path, TRAINGUARD_PROJECT="proj", TRAINGUARD_PREFIX="tg", TRAINGUARD_DATASET="ds",
                              DASHBOARD_IAP_AUDIENCE=AUDIENCE)
    assert result.returncode == 0, result.stderr
    lines = [" ".join(c) for c in printed]
    assert "docker build -f dashboard/Dockerfile -t us-central1-docker.pkg.dev/proj/tg/tg-dashboard:latest ." in lines
    assert any(line.startswith("gcloud pubsub topics add-iam-policy-binding tg-metrics") and "pubsub.publisher" in line
               for line in lines)
    assert any(line.startswith("bq add-iam-policy-binding") and "bigquery.dataViewer" in line and "proj:ds" in line
               for line in lines)
    (deploy,) = [c for c in printed if c[:3] == ["gcloud", "run", "deploy"]]
    flags = dict(arg.split("=", 1) for arg in deploy if arg.startswith("--") and "=" in arg)
    assert "--no-allow-unauthenticated" in deploy
    assert flags["--ingress"] == "internal-and-cloud-load-balancing"
    args = parser().parse_args(flags["--args"].split(","))
    assert (args.bigquery_project, args.bigquery_dataset) == ("proj", "ds")
    assert args.topic == "projects/proj/topics/tg-metrics" and args.iap_audience == AUDIENCE
    assert (args.host, args.port) == ("0.0.0.0", 8080)


def test_a_missing_audience_or_project_stops_before_any_command(tmp_path):
    result, printed = dry_run(tmp_path, TRAINGUARD_PROJECT="proj")
    assert result.returncode == 2 and printed == [] and "no IAP audience" in result.stderr
    result, printed = dry_run(tmp_path / "again", DASHBOARD_IAP_AUDIENCE=AUDIENCE)
    assert result.returncode == 2 and printed == [] and "no project" in result.stderr
    result = subprocess.run(["bash", SCRIPT, "--dryrun"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "unknown option --dryrun" in result.stderr
