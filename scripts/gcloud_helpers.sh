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
