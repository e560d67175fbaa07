# Shared by the deployment scripts (run_dataflow.sh, notifier/deploy_cloud_run.sh, dashboard/deploy_cloud_run.sh); sourced, not run.
# The sourcing script sets SCRIPT_NAME (for messages) and DRY_RUN (true/false) before calling these.
# shellcheck shell=bash

# die MESSAGE...: one line on stderr, exit 2 (the exit code of a bad invocation in every trainguard tool).
die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 2; }

# run CMD...: runs it, or with --dry-run prints it (shell-quoted) instead.
run() {
  if [[ $DRY_RUN == true ]]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# exists CMD...: whether a describe command succeeds. With --dry-run it is printed and "fails",
# so that the create command after '||' is printed too.
exists() {
  if [[ $DRY_RUN == true ]]; then
    run "$@"
    return 1
  fi
  "$@" >/dev/null 2>&1
}

# capture VAR DEFAULT CMD...: sets VAR to the output of CMD; with --dry-run, CMD is printed and VAR is DEFAULT.
capture() {
  local var=$1 default=$2 output
  shift 2
  if [[ $DRY_RUN == true ]]; then
    run "$@"
    output=$default
  else
    output=$("$@")
  fi
  printf -v "$var" '%s' "$output"
}

# cloud_run_arguments ARGS...: the Cloud Run deploy scripts' command line: --dry_run (or --dry-run) sets DRY_RUN,
# -h/--help prints the script's header comment; settings are environment variables, so anything else is an error.
cloud_run_arguments() {
  local arg
  for arg in "$@"; do
    case $arg in
      --dry_run|--dry-run) DRY_RUN=true ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      -*) die "unknown option $arg (--dry_run and --help are the only ones; settings are environment variables)" ;;
      *) die "unexpected argument $arg (see --help)" ;;
    esac
  done
}

# cloud_run_settings: the settings both Cloud Run deploy scripts share (PROJECT, REGION, PREFIX), from the
# environment, as run_dataflow.sh reads them; no project is an error.
cloud_run_settings() {
  PROJECT=${TRAINGUARD_PROJECT:-${GOOGLE_CLOUD_PROJECT:-}}
  REGION=${TRAINGUARD_REGION:-us-central1}
  PREFIX=${TRAINGUARD_PREFIX:-trainguard}
  [[ -n $PROJECT ]] || die "no project: set TRAINGUARD_PROJECT"
}

# build_and_push_image DOCKERFILE: builds the image IMAGE from the repository (the current directory) with
# DOCKERFILE and pushes it to the Artifact Registry repository PREFIX in REGION, created if it does not exist.
build_and_push_image() {
  exists gcloud artifacts repositories describe "$PREFIX" --project="$PROJECT" --location="$REGION" \
    || run gcloud artifacts repositories create "$PREFIX" --project="$PROJECT" --location="$REGION" \
         --repository-format=docker
  run gcloud auth configure-docker "$REGION-docker.pkg.dev" --quiet
  run docker build -f "$1" -t "$IMAGE" .
  run docker push "$IMAGE"
}

# comma_joined ARGS...: the arguments joined by commas, as gcloud run deploy --args takes them.
comma_joined() { local IFS=,; echo "$*"; }
