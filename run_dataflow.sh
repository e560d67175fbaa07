#!/usr/bin/env bash
# Deploys the trainguard streaming job to Dataflow; see --help.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ./run_dataflow.sh [deploy] [options]     create what is missing, then launch (or --update) the job
       ./run_dataflow.sh configs [options]      upload the configs to the running job (no redeploy)
       ./run_dataflow.sh demo [options]         publish the demo workload to the metrics topic

deploy first checks, before it creates anything:
  - that every file in CONFIG_DIR is a valid config (python -m pipeline.check_configs);
  - with --write_method=storage_write_api, that Java 11+ runs on this machine (see below);
  - that the subscription PREFIX-metrics-pipeline, if it exists, has no dead-letter or retry policy:
    Dataflow does not support them (it acks a message only once its work is committed, and extends
    the ack deadline itself); messages the job cannot use go to its own dead_letter table instead.
then creates, idempotently ("describe || create"), everything the job needs:
  - the Dataflow, Pub/Sub, BigQuery and Cloud Storage APIs (enabled)
  - Pub/Sub topics PREFIX-metrics (trainers publish here) and PREFIX-alerts (every alert), and the
    subscription PREFIX-metrics-pipeline on PREFIX-metrics (the job's input)
  - the BigQuery dataset and its tables (explicit schemas from core/schema.py, partitioned by day
    on their time column, clustered by test_name; dead_letter by source)
  - the bucket gs://BUCKET for Dataflow's temp and staging files
then makes CONFIG_GCS a copy of CONFIG_DIR (gcloud storage rsync: files not in CONFIG_DIR are deleted
there) and launches the streaming job from setup.py: python -m pipeline
--runner=DataflowRunner --streaming --config_dir=CONFIG_GCS with Streaming Engine, streaming inserts
for BigQuery (the graph whose step names tests/pipeline/step_names.txt pins for --update) and autoscaling
up to MAX_WORKERS. Before it submits the job, that launch tries the history
seed (a dry run of each of its queries and a read of one row of each table) and stops with one line if
the seed cannot be read; in the job, a seed that still cannot be read after 3 tries cancels the job.

configs checks CONFIG_DIR the same way and uploads it, and nothing else: the running job re-reads
CONFIG_GCS every 5 minutes (--config_refresh_seconds of python -m pipeline), so a config change needs no
--update. A file the job cannot use keeps its previous version and raises a config_rejected alert.
A version valid from an event time on is a file <test>@<UTC time>.json, e.g.
pt-cifar-tpu-v3-8@20261120T100000Z.json: elements from that time on use it, in the job and in any replay.

Options (each also settable as an environment variable, in brackets; --name=value or --name value;
multi-word options may also be spelled with dashes, --job-name for --job_name):
  --project ID              Google Cloud project [TRAINGUARD_PROJECT, else GOOGLE_CLOUD_PROJECT]
  --region REGION           Dataflow region, bucket and dataset location [TRAINGUARD_REGION] (us-central1)
  --dataset NAME            BigQuery dataset [TRAINGUARD_DATASET] (trainguard)
  --bucket NAME             bucket for temp/staging files [TRAINGUARD_BUCKET] (PROJECT-trainguard)
  --prefix NAME             prefix of the Pub/Sub topic/subscription names [TRAINGUARD_PREFIX] (trainguard)
  --job_name NAME           Dataflow job name [TRAINGUARD_JOB_NAME] (PREFIX-streaming)
  --service_account EMAIL   worker service account [TRAINGUARD_SERVICE_ACCOUNT] (the default compute one)
  --max_workers N           autoscaling limit [TRAINGUARD_MAX_WORKERS] (4)
  --machine_type TYPE       worker machine type [TRAINGUARD_MACHINE_TYPE] (n2-standard-2)
  --write_method METHOD     streaming_inserts or storage_write_api [TRAINGUARD_WRITE_METHOD] (streaming_inserts)
  --config_dir DIR          per-test configs, checked and uploaded [TRAINGUARD_CONFIG_DIR] (configs/ here)
  --config_gcs URL          where the job reads the configs [TRAINGUARD_CONFIG_GCS]
                            (gs://BUCKET/JOB_NAME/configs)
  --id_attribute NAME       Pub/Sub attribute for Dataflow's de-duplication (id_label), only when every
                            publisher sets it [TRAINGUARD_ID_ATTRIBUTE] (id; empty: off)
  --python PATH             interpreter with the pipeline installed [PYTHON] (.venv/bin/python here if it
                            exists, else python3)
  --update                  replace the running job of the same name in place (Dataflow --update):
                            in-flight runs, de-duplication ids and history state carry over. Needed to
                            roll out new code without losing state (new configs need only the
                            configs command). Steps renamed since the running job are mapped by
                            pipeline/transform_name_mapping.json (passed as --transform_name_mapping
                            when it is not empty); when the running job has another Beam SDK version
                            than the one installed, --update_compatibility_version=<its version>.
  --unchecked_update        with --update and --write_method=storage_write_api: update although that graph's
                            Java-expanded steps are not checked against the pinned step names (without it,
                            such an --update is refused) (off)
  --dry_run                 print every command instead of running it (only the schema files are
                            written, to a temporary directory; the config and Java checks still run)
  -h, --help                this help
demo options: --rate N (messages per second) and any of the above.

Stopping: 'gcloud dataflow jobs drain JOB_ID --region REGION' finishes in-flight work and stops reading:
runs that ended are finalized, open runs are stored as 'interrupted' (no alert), and keyed state is
discarded; the next job seeds its history from BigQuery and resumes the interrupted runs. 'cancel'
stops at once and loses in-flight messages' work and open runs (Pub/Sub redelivers unacked messages).

Java: the Storage Write API (--write_method=storage_write_api: exactly-once, and cheaper than streaming
inserts beyond its free 2 TiB a month; its Java-expanded steps are not among the pinned step names) is a
cross-language transform that Beam expands on the machine running this script with a Java expansion service. Beam runs $JAVA_HOME/bin/java if JAVA_HOME is set, else
java from the PATH; deploy checks that one for Java 11+ and, without it, stops with an error before
creating anything: install a JDK, or pass --write_method=streaming_inserts (no Java needed). On the
first launch Beam downloads the expansion service jar from Maven Central into ~/.apache_beam/cache/jars;
to launch without internet access, put the jar there beforehand.
EOF
}

SCRIPT_NAME=run_dataflow.sh
DRY_RUN=false
REPO=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gcloud_helpers.sh
source "$REPO/scripts/gcloud_helpers.sh"

COMMAND=deploy
if [[ $# -gt 0 && $1 != -* ]]; then
  COMMAND=$1
  shift
fi

PROJECT=${TRAINGUARD_PROJECT:-${GOOGLE_CLOUD_PROJECT:-}}
REGION=${TRAINGUARD_REGION:-us-central1}
DATASET=${TRAINGUARD_DATASET:-trainguard}
BUCKET=${TRAINGUARD_BUCKET:-}
PREFIX=${TRAINGUARD_PREFIX:-trainguard}
JOB_NAME=${TRAINGUARD_JOB_NAME:-}
SERVICE_ACCOUNT=${TRAINGUARD_SERVICE_ACCOUNT:-}
MAX_WORKERS=${TRAINGUARD_MAX_WORKERS:-4}
MACHINE_TYPE=${TRAINGUARD_MACHINE_TYPE:-n2-standard-2}
WRITE_METHOD=${TRAINGUARD_WRITE_METHOD:-streaming_inserts}
CONFIG_DIR=${TRAINGUARD_CONFIG_DIR:-$REPO/configs}
CONFIG_GCS=${TRAINGUARD_CONFIG_GCS:-}
ID_ATTRIBUTE=${TRAINGUARD_ID_ATTRIBUTE-id}
DEFAULT_PYTHON=python3
[[ ! -x $REPO/.venv/bin/python ]] || DEFAULT_PYTHON=$REPO/.venv/bin/python
PYTHON=${PYTHON:-$DEFAULT_PYTHON}
UPDATE=false
UNCHECKED_UPDATE=false
RATE=

while [[ $# -gt 0 ]]; do
  option=$1
  value=
  if [[ $option == --*=* ]]; then
    value=${option#*=}
    option=${option%%=*}
  elif [[ $# -gt 1 ]]; then
    value=$2
  fi
  given=$option
  if [[ $option == --?* ]]; then  # --job-name is --job_name: one spelling in the case below
    name=${option#--}
    option=--${name//-/_}
  fi
  takes_value=true
  case $option in
    --project) PROJECT=$value ;;
    --region) REGION=$value ;;
    --dataset) DATASET=$value ;;
    --bucket) BUCKET=$value ;;
    --prefix) PREFIX=$value ;;
    --job_name) JOB_NAME=$value ;;
    --service_account) SERVICE_ACCOUNT=$value ;;
    --max_workers) MAX_WORKERS=$value ;;
    --machine_type) MACHINE_TYPE=$value ;;
    --write_method) WRITE_METHOD=$value ;;
    --config_dir) CONFIG_DIR=$value ;;
    --config_gcs) CONFIG_GCS=$value ;;
    --id_attribute) ID_ATTRIBUTE=$value ;;
    --python) PYTHON=$value ;;
    --rate) RATE=$value ;;
    --update) UPDATE=true; takes_value=false ;;
    --unchecked_update) UNCHECKED_UPDATE=true; takes_value=false ;;
    --dry_run) DRY_RUN=true; takes_value=false ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $given (see --help)" ;;
  esac
  if [[ $takes_value == true ]]; then
    [[ -n $value ]] || die "$given needs a value"
    if [[ $1 != *=* ]]; then
      [[ $value != -* ]] || die "$given needs a value"
      shift
    fi
  fi
  shift
done

[[ -n $PROJECT ]] || die "no project: pass --project or set TRAINGUARD_PROJECT"
[[ $WRITE_METHOD == storage_write_api || $WRITE_METHOD == streaming_inserts ]] \
  || die "--write_method must be storage_write_api or streaming_inserts, not $WRITE_METHOD"
[[ $MAX_WORKERS =~ ^[1-9][0-9]*$ ]] || die "--max_workers must be a positive integer, not $MAX_WORKERS"
[[ $UPDATE == false || $WRITE_METHOD == streaming_inserts || $UNCHECKED_UPDATE == true ]] \
  || die "an --update with --write_method=storage_write_api is not checked against the running job's graph (Java \
expands its steps at launch; tests/pipeline/step_names.txt pins the streaming_inserts graph): pass \
--unchecked_update to update anyway, or drain the job and deploy it again"
BUCKET=${BUCKET:-$PROJECT-trainguard}
JOB_NAME=${JOB_NAME:-$PREFIX-streaming}
CONFIG_GCS=${CONFIG_GCS:-gs://$BUCKET/$JOB_NAME/configs}
[[ $CONFIG_GCS == gs://?* ]] || die "--config_gcs must be a gs:// URL, not $CONFIG_GCS"
[[ $CONFIG_DIR == /* ]] || CONFIG_DIR=$PWD/$CONFIG_DIR
cd "$REPO"

METRICS_TOPIC=$PREFIX-metrics
ALERTS_TOPIC=$PREFIX-alerts
SUBSCRIPTION=$PREFIX-metrics-pipeline
SUBSCRIPTION_EXISTS=false
JAVA_FIX="install a JDK (java on the PATH, or JAVA_HOME), or pass --write_method=streaming_inserts"

# The Storage Write API's expansion service runs on this machine: needs Java 11+, found where Beam looks
# (JAVA_HOME/bin/java if JAVA_HOME is set, else java on the PATH). Checked in dry runs too: it runs nothing remote.
check_java() {
  local java=java where="on the PATH" output major
  if [[ -n ${JAVA_HOME:-} ]]; then
    java=$JAVA_HOME/bin/java
    where="at $java (JAVA_HOME)"
  fi
  local needs="--write_method=storage_write_api needs Java 11+ on this machine for Beam's expansion service"
  command -v "$java" >/dev/null 2>&1 || die "$needs, and there is no java $where: $JAVA_FIX"
  output=$("$java" -version 2>&1) || die "$needs, and '$java -version' fails: $JAVA_FIX"
  [[ $output =~ version\ \"([0-9]+)(\.([0-9]+))? ]] \
    || die "$needs, and '$java -version' names no version: $JAVA_FIX"
  major=${BASH_REMATCH[1]}
  if [[ $major == 1 ]]; then  # "1.8.0_392" is Java 8
    major=${BASH_REMATCH[3]:-1}
  fi
  ((major >= 11)) || die "$needs, and the java $where is Java $major: $JAVA_FIX"
}

# Dataflow does not support a dead-letter or retry (exponential backoff) policy on a subscription it reads:
# it acks a message only after committing its work and extends the deadline itself. Refuses an existing input
# subscription that has one; a missing one is created without (ensure_pubsub).
check_input_subscription() {
  local describe=(gcloud pubsub subscriptions describe "$SUBSCRIPTION" --project="$PROJECT"
                  '--format=csv[no-heading](deadLetterPolicy.deadLetterTopic,retryPolicy.minimumBackoff,retryPolicy.maximumBackoff)')
  if [[ $DRY_RUN == true ]]; then
    run "${describe[@]}"
    return
  fi
  local policies dead_letter_topic min_backoff max_backoff
  policies=$("${describe[@]}" 2>/dev/null) || return 0  # not there (yet): created below
  SUBSCRIPTION_EXISTS=true
  IFS=, read -r dead_letter_topic min_backoff max_backoff <<<"$policies" || true
  local dataflow="Dataflow does not support it (the job dead-letters bad messages itself)"
  [[ -z $dead_letter_topic ]] || die "subscription $SUBSCRIPTION has a dead-letter policy ($dead_letter_topic): $dataflow;" \
    "remove it: gcloud pubsub subscriptions update $SUBSCRIPTION --project=$PROJECT --clear-dead-letter-policy"
  [[ -z $min_backoff$max_backoff ]] || die "subscription $SUBSCRIPTION has a retry policy (exponential backoff): $dataflow;" \
    "remove it: gcloud pubsub subscriptions update $SUBSCRIPTION --project=$PROJECT --clear-retry-policy"
}

# The configs are checked as the job checks them at launch, before anything is created or uploaded: a file
# the running job could not use never reaches it. Runs in dry runs too: it reads only the local directory.
check_configs() {
  local problem
  problem=$("$PYTHON" -m pipeline.check_configs --config_dir="$CONFIG_DIR" 2>&1 >/dev/null) \
    || die "${problem#python -m pipeline.check_configs: error: }"
}

# CONFIG_GCS becomes a copy of CONFIG_DIR (files gone from it are deleted): the running job re-reads it.
upload_configs() {
  run gcloud storage rsync "$CONFIG_DIR" "$CONFIG_GCS" --delete-unmatched-destination-objects --project="$PROJECT"
}

enable_apis() {
  run gcloud services enable dataflow.googleapis.com pubsub.googleapis.com bigquery.googleapis.com \
    storage.googleapis.com --project="$PROJECT"
}

# The input subscription has no dead-letter or retry policy (see check_input_subscription).
ensure_pubsub() {
  local topic
  for topic in "$METRICS_TOPIC" "$ALERTS_TOPIC"; do
    exists gcloud pubsub topics describe "$topic" --project="$PROJECT" \
      || run gcloud pubsub topics create "$topic" --project="$PROJECT"
  done
  [[ $SUBSCRIPTION_EXISTS == true ]] \
    || run gcloud pubsub subscriptions create "$SUBSCRIPTION" --project="$PROJECT" --topic="$METRICS_TOPIC" \
         --ack-deadline=60 --message-retention-duration=7d
}

ensure_bigquery() {
  exists bq --project_id="$PROJECT" show --dataset "$PROJECT:$DATASET" \
    || run bq --project_id="$PROJECT" mk --dataset --location="$REGION" \
         --description="trainguard: job and metric history, alerts, dead letters" "$PROJECT:$DATASET"
  # One schema file per table, and "name time_column cluster,columns" lines, from core/schema.py.
  local name time_column clustering
  SCHEMA_DIR=$(mktemp -d)
  trap 'rm -rf "$SCHEMA_DIR"' EXIT
  "$PYTHON" -m sinks.bigquery_schema --schema_dir="$SCHEMA_DIR" > "$SCHEMA_DIR/tables.txt"
  while read -r name time_column clustering; do
    exists bq --project_id="$PROJECT" show "$PROJECT:$DATASET.$name" \
      || run bq --project_id="$PROJECT" mk --table --schema="$SCHEMA_DIR/$name.json" \
           --time_partitioning_type=DAY --time_partitioning_field="$time_column" \
           --clustering_fields="$clustering" --description="trainguard $name" "$PROJECT:$DATASET.$name"
  done < "$SCHEMA_DIR/tables.txt"
}

ensure_bucket() {
  exists gcloud storage buckets describe "gs://$BUCKET" --project="$PROJECT" \
    || run gcloud storage buckets create "gs://$BUCKET" --project="$PROJECT" --location="$REGION" \
         --uniform-bucket-level-access
}

# Refuses to start a second job of the same name, or to update one that is not running.
check_running_job() {
  local query=(gcloud dataflow jobs list --project="$PROJECT" --region="$REGION" --status=active
               --filter="name=$JOB_NAME" --format='value(id)')
  if [[ $DRY_RUN == true ]]; then
    run "${query[@]}"
    return
  fi
  local running
  running=$("${query[@]}")
  RUNNING_JOB_ID=$running
  if [[ $UPDATE == true && -z $running ]]; then
    die "no running job named $JOB_NAME to --update"
  elif [[ $UPDATE == false && -n $running ]]; then
    die "job $JOB_NAME is already running ($running): use --update to replace it, or drain it first"
  fi
}

launch() {
  local args=(
    "$PYTHON" -m pipeline
    --runner=DataflowRunner --streaming
    --project="$PROJECT" --region="$REGION" --job_name="$JOB_NAME"
    --temp_location="gs://$BUCKET/temp" --staging_location="gs://$BUCKET/staging"
    --setup_file=./setup.py
    --enable_streaming_engine
    --autoscaling_algorithm=THROUGHPUT_BASED --max_num_workers="$MAX_WORKERS"
    --worker_machine_type="$MACHINE_TYPE"
    --input_subscription="projects/$PROJECT/subscriptions/$SUBSCRIPTION"
    --triage_topic="projects/$PROJECT/topics/$METRICS_TOPIC"
    --alerts_topic="projects/$PROJECT/topics/$ALERTS_TOPIC"
    --bigquery_project="$PROJECT" --bigquery_dataset="$DATASET" --bigquery_location="$REGION"
    --write_method="$WRITE_METHOD"
    --config_dir="$CONFIG_GCS"
  )
  [[ -z $SERVICE_ACCOUNT ]] || args+=(--service_account_email="$SERVICE_ACCOUNT")
  [[ -z $ID_ATTRIBUTE ]] || args+=(--pubsub_id_attribute="$ID_ATTRIBUTE")
  if [[ $UPDATE == true ]]; then
    args+=(--update)
    local mapping deployed
    mapping=$(tr -d '\n' < pipeline/transform_name_mapping.json)
    [[ $mapping == "{}" ]] || args+=(--transform_name_mapping="$mapping")
    # The running job's Beam SDK version: when --update changes it, Beam is asked to expand the graph as that
    # version did (--update_compatibility_version), so that Beam's own steps match what is deployed.
    capture deployed "" gcloud dataflow jobs describe "${RUNNING_JOB_ID:-RUNNING_JOB_ID}" --project="$PROJECT" \
      --region="$REGION" --format='value(jobMetadata.sdkVersion.version)'
    [[ -z $deployed || $deployed == "$("$PYTHON" -c 'import apache_beam; print(apache_beam.__version__)')" ]] \
      || args+=(--update_compatibility_version="$deployed")
  fi
  run "${args[@]}"
}

deploy() {
  check_configs
  [[ $WRITE_METHOD != storage_write_api ]] || check_java
  check_input_subscription
  enable_apis
  ensure_pubsub
  ensure_bigquery
  ensure_bucket
  check_running_job
  upload_configs  # after the checks: a refused deploy leaves the running job's configs as they were
  launch
}

configs() {
  check_configs
  upload_configs
}

demo() {
  local args=("$PYTHON" scripts/publish_demo.py --topic="projects/$PROJECT/topics/$METRICS_TOPIC")
  [[ -z $RATE ]] || args+=(--rate="$RATE")
  run "${args[@]}"
}

case $COMMAND in
  deploy) deploy ;;
  configs) configs ;;
  demo) demo ;;
  *) die "unknown command $COMMAND (deploy, configs or demo; see --help)" ;;
esac
