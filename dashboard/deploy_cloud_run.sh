#!/usr/bin/env bash
# Deploys the dashboard (dashboard/) to Cloud Run, reachable only through Identity-Aware Proxy; see README.md.
#
#   TRAINGUARD_PROJECT=my-project DASHBOARD_IAP_AUDIENCE=/projects/N/global/backendServices/ID \
#     dashboard/deploy_cloud_run.sh [--dry_run]
#
# Creates what is missing ("describe || create"): the Artifact Registry repository and the IAM bindings that let
# the service account read the BigQuery dataset run_dataflow.sh writes and publish triage actions to the
# pipeline's input topic (PREFIX-metrics); then builds dashboard/Dockerfile, pushes it and deploys the service
# with ingress from the load balancer only (IAP sits on it). The dashboard refuses any request without IAP's
# signed header for DASHBOARD_IAP_AUDIENCE.
#
# Settings (environment variables; defaults in brackets):
#   TRAINGUARD_PROJECT         project [GOOGLE_CLOUD_PROJECT]
#   TRAINGUARD_REGION          Cloud Run and Artifact Registry region [us-central1]
#   TRAINGUARD_PREFIX          prefix of the resource names, as for run_dataflow.sh [trainguard]
#   TRAINGUARD_DATASET         BigQuery dataset, as for run_dataflow.sh [trainguard]
#   DASHBOARD_IAP_AUDIENCE     the IAP audience of the backend service (required)
#   DASHBOARD_SERVICE_ACCOUNT  existing service account to run as [PREFIX-dashboard@PROJECT.iam.gserviceaccount.com]
#   DASHBOARD_IMAGE            image [REGION-docker.pkg.dev/PROJECT/PREFIX/PREFIX-dashboard:latest]
# --dry_run (or --dry-run) prints every command instead of running it; -h, --help prints this.
set -euo pipefail

SCRIPT_NAME=deploy_cloud_run.sh
DRY_RUN=false
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gcloud_helpers.sh
source "$REPO/scripts/gcloud_helpers.sh"
cloud_run_arguments "$@"

cloud_run_settings
DATASET=${TRAINGUARD_DATASET:-trainguard}
AUDIENCE=${DASHBOARD_IAP_AUDIENCE:-}
[[ -n $AUDIENCE ]] || die "no IAP audience: set DASHBOARD_IAP_AUDIENCE (/projects/NUMBER/global/backendServices/ID)"
SERVICE_ACCOUNT=${DASHBOARD_SERVICE_ACCOUNT:-$PREFIX-dashboard@$PROJECT.iam.gserviceaccount.com}
IMAGE=${DASHBOARD_IMAGE:-$REGION-docker.pkg.dev/$PROJECT/$PREFIX/$PREFIX-dashboard:latest}

SERVICE=$PREFIX-dashboard
METRICS_TOPIC=$PREFIX-metrics

grant_access() {
  local member=serviceAccount:$SERVICE_ACCOUNT
  run gcloud projects add-iam-policy-binding "$PROJECT" --member="$member" --role=roles/bigquery.jobUser \
    --condition=None
  run bq add-iam-policy-binding --member="$member" --role=roles/bigquery.dataViewer "$PROJECT:$DATASET"
  run gcloud pubsub topics add-iam-policy-binding "$METRICS_TOPIC" --project="$PROJECT" \
    --member="$member" --role=roles/pubsub.publisher
}

# Cloud Run sets $PORT (8080); the container listens on every interface there, and only the load balancer
# (with IAP) may reach it.
deploy() {
  local args=(
    --host=0.0.0.0
    --port=8080
    "--bigquery_project=$PROJECT"
    "--bigquery_dataset=$DATASET"
    "--topic=projects/$PROJECT/topics/$METRICS_TOPIC"
    "--iap_audience=$AUDIENCE"
  )
  run gcloud run deploy "$SERVICE" --project="$PROJECT" --region="$REGION" --image="$IMAGE" \
    --service-account="$SERVICE_ACCOUNT" --ingress=internal-and-cloud-load-balancing --no-allow-unauthenticated \
    --port=8080 --min-instances=0 --max-instances=4 --args="$(comma_joined "${args[@]}")"
}

cd "$REPO"
grant_access
build_and_push_image dashboard/Dockerfile
deploy
