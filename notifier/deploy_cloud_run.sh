#!/usr/bin/env bash
# Deploys the e-mail notifier (notifier) to Cloud Run as one always-on instance; see docs/email.md.
#
#   TRAINGUARD_PROJECT=my-project EMAIL_CONFIG=email.json notifier/deploy_cloud_run.sh [--dry_run]
#
# Creates what is missing ("describe || create"): the subscription PREFIX-alerts-email on the alerts topic
# that run_dataflow.sh creates (PREFIX-alerts), the dead-letter topic PREFIX-alerts-email-dead-letter with
# PREFIX-alerts-email-dead-letter-hold (keeps refused alerts 7 days), the Artifact Registry repository,
# the secret PREFIX-email-config holding EMAIL_CONFIG (a new version on every deploy) and the IAM
# bindings; then builds notifier/Dockerfile, pushes it and deploys the service.
#
# Settings (environment variables; defaults in brackets):
#   TRAINGUARD_PROJECT      project [GOOGLE_CLOUD_PROJECT]
#   TRAINGUARD_REGION       Cloud Run and Artifact Registry region [us-central1]
#   TRAINGUARD_PREFIX       prefix of the resource names, as for run_dataflow.sh [trainguard]
#   EMAIL_CONFIG            the notifier's config JSON (required; see notifier/example-config.json)
#   EMAIL_KEY_SECRET        existing Secret Manager secret with the SendGrid API key [sendgrid-api-key]
#   EMAIL_SERVICE_ACCOUNT   existing service account to run as [PREFIX-email@PROJECT.iam.gserviceaccount.com]
#   EMAIL_IMAGE             image [REGION-docker.pkg.dev/PROJECT/PREFIX/PREFIX-email:latest]
# --dry_run (or --dry-run) prints every command instead of running it; -h, --help prints this.
set -euo pipefail

SCRIPT_NAME=deploy_cloud_run.sh
DRY_RUN=false
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gcloud_helpers.sh
source "$REPO/scripts/gcloud_helpers.sh"
cloud_run_arguments "$@"

cloud_run_settings
CONFIG=${EMAIL_CONFIG:-}
KEY_SECRET=${EMAIL_KEY_SECRET:-sendgrid-api-key}
[[ -n $CONFIG ]] || die "no config: set EMAIL_CONFIG to the notifier's config file (e.g. notifier/example-config.json)"
[[ -f $CONFIG ]] || die "EMAIL_CONFIG=$CONFIG: no such file"
SERVICE_ACCOUNT=${EMAIL_SERVICE_ACCOUNT:-$PREFIX-email@$PROJECT.iam.gserviceaccount.com}
IMAGE=${EMAIL_IMAGE:-$REGION-docker.pkg.dev/$PROJECT/$PREFIX/$PREFIX-email:latest}

SERVICE=$PREFIX-email
ALERTS_TOPIC=$PREFIX-alerts
SUBSCRIPTION=$PREFIX-alerts-email
DEAD_LETTER_TOPIC=$PREFIX-alerts-email-dead-letter
DEAD_LETTER_HOLD=$PREFIX-alerts-email-dead-letter-hold
CONFIG_SECRET=$PREFIX-email-config

ensure_pubsub() {
  exists gcloud pubsub subscriptions describe "$SUBSCRIPTION" --project="$PROJECT" \
    || run gcloud pubsub subscriptions create "$SUBSCRIPTION" --project="$PROJECT" --topic="$ALERTS_TOPIC" \
         --ack-deadline=60 --message-retention-duration=7d --expiration-period=never
  exists gcloud pubsub topics describe "$DEAD_LETTER_TOPIC" --project="$PROJECT" \
    || run gcloud pubsub topics create "$DEAD_LETTER_TOPIC" --project="$PROJECT"
  exists gcloud pubsub subscriptions describe "$DEAD_LETTER_HOLD" --project="$PROJECT" \
    || run gcloud pubsub subscriptions create "$DEAD_LETTER_HOLD" --project="$PROJECT" \
         --topic="$DEAD_LETTER_TOPIC" --message-retention-duration=7d --expiration-period=never
}

ensure_config_secret() {
  if exists gcloud secrets describe "$CONFIG_SECRET" --project="$PROJECT"; then
    run gcloud secrets versions add "$CONFIG_SECRET" --project="$PROJECT" --data-file="$CONFIG"
  else
    run gcloud secrets create "$CONFIG_SECRET" --project="$PROJECT" --replication-policy=automatic \
      --data-file="$CONFIG"
  fi
}

grant_access() {
  local member=serviceAccount:$SERVICE_ACCOUNT secret
  run gcloud pubsub subscriptions add-iam-policy-binding "$SUBSCRIPTION" --project="$PROJECT" \
    --member="$member" --role=roles/pubsub.subscriber
  run gcloud pubsub topics add-iam-policy-binding "$DEAD_LETTER_TOPIC" --project="$PROJECT" \
    --member="$member" --role=roles/pubsub.publisher
  for secret in "$KEY_SECRET" "$CONFIG_SECRET"; do
    run gcloud secrets add-iam-policy-binding "$secret" --project="$PROJECT" \
      --member="$member" --role=roles/secretmanager.secretAccessor
  done
}

# No CPU throttling and exactly one instance: a streaming pull needs CPU between requests, and a single
# instance keeps a single state (sent ids, budget). The notifier answers health checks on $PORT.
deploy() {
  local args=(
    --config=/config/email.json
    "--subscription=projects/$PROJECT/subscriptions/$SUBSCRIPTION"
    "--dead_letter_topic=projects/$PROJECT/topics/$DEAD_LETTER_TOPIC"
    "--sendgrid_key_secret=projects/$PROJECT/secrets/$KEY_SECRET"
    --state=/state/email-state.sqlite
  )
  run gcloud run deploy "$SERVICE" --project="$PROJECT" --region="$REGION" --image="$IMAGE" \
    --service-account="$SERVICE_ACCOUNT" --no-allow-unauthenticated --ingress=internal \
    --no-cpu-throttling --min-instances=1 --max-instances=1 \
    --set-secrets="/config/email.json=$CONFIG_SECRET:latest" --args="$(comma_joined "${args[@]}")"
}

cd "$REPO"
ensure_pubsub
ensure_config_secret
grant_access
build_and_push_image notifier/Dockerfile
deploy
