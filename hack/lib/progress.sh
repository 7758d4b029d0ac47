# shellcheck shell=bash
# with_progress LABEL COMMAND [ARG...]: runs COMMAND (a program or a shell
# function) and, while it runs, says on stderr every
# NODEPROOF_PROGRESS_EVERY seconds (default 30) that LABEL is still going
# and for how long. For the long quiet steps of a first run: go build of
# kube-apiserver, and go vet / go test compiling Kubernetes' client
# libraries, print nothing for minutes. Returns COMMAND's status.
with_progress() {
  local label=$1 every=${NODEPROOF_PROGRESS_EVERY:-30} t0 ticker status=0
  shift
  t0=$(date +%s)
  (
    while sleep "$every"; do
      echo "[$label: still running, $(($(date +%s) - t0))s so far]" >&2
    done
  ) &
  ticker=$!
  "$@" || status=$?
  kill "$ticker" 2>/dev/null
  wait "$ticker" 2>/dev/null
  return "$status"
}
