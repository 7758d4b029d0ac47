#!/usr/bin/env bash
# make fuzz: runs every Go fuzz target in the module, one after the other,
# for FUZZTIME each (default 30s), and prints one line per target: package,
# target, execs, new corpus entries (and the corpus size), result.
#
#   FUZZTIME=3m make fuzz              longer runs
#   FUZZ='FuzzBootState|FuzzTPM' make fuzz   only targets matching a regexp
#   FUZZPARALLEL=1 make fuzz           one fuzzing worker (a loaded machine)
#   FUZZMINIMIZETIME=60s make fuzz     time to minimize each new input
#                                      (default 5s: the seeds are real event
#                                      logs and configs of tens of KB, and
#                                      minimizing each new one for go test's
#                                      default 60s leaves no time to fuzz)
#   FUZZKEEP=1 make fuzz               copy what each run found into
#                                      testdata/fuzz/<Target>/ (at most
#                                      FUZZKEEPMAX entries, default 20)
#
# Seeds are each target's f.Add calls and testdata/fuzz/<Target>/; a failing
# input is written there by go test (commit it with the fix). Exits non-zero
# if any target failed; every target runs regardless.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-30s}
only=${FUZZ:-.}
keepmax=${FUZZKEEPMAX:-20}
par=(-fuzzminimizetime "${FUZZMINIMIZETIME:-5s}")
if [[ -n "${FUZZPARALLEL:-}" ]]; then
  par+=(-parallel "$FUZZPARALLEL")
fi
module=$(go list -m)
cache=$(go env GOCACHE)/fuzz
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

# Packages with fuzz targets, found from the sources (listing every
# package's tests would build them all).
mapfile -t dirs < <(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)

summary=()
failed=0
for dir in "${dirs[@]}"; do
  pkg=$(cd "$dir" && go list .)
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' | grep -E "$only" || true); do
    log="$logdir/${target}.log"
    echo "== $pkg $target ($t)"
    start=$SECONDS
    if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "${par[@]}" "$pkg" >"$log" 2>&1; then
      result=ok
    else
      result=FAIL
      failed=1
      grep -E -- '--- FAIL|Failing input|panic:|fuzz_test.go|_test.go:[0-9]+' "$log" | head -20 || true
    fi
    last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -1 || true)
    execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
    new=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
    total=$(sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p' <<<"$last")
    if [[ "$result" == FAIL ]]; then
      in=$(sed -nE 's/.*Failing input written to (.*)/\1/p' "$log" | head -1)
      [[ -n "$in" ]] && result="FAIL ($dir/$in)"
    fi
    if [[ -n "${FUZZKEEP:-}" && -d "$cache/$pkg/$target" ]]; then
      mkdir -p "$dir/testdata/fuzz/$target"
      # The smallest entries found, by name: go test reads them as seeds.
      find "$cache/$pkg/$target" -type f -size -64k -printf '%s %p\n' | sort -n | head -"$keepmax" |
        while read -r _ f; do cp -n "$f" "$dir/testdata/fuzz/$target/"; done
    fi
    line=$(printf '%-36s %-22s %5ss  execs %-10s new %-5s corpus %-6s %s' \
      "${pkg#"$module"/}" "$target" "$((SECONDS - start))" "${execs:-?}" "${new:-?}" "${total:-?}" "$result")
    echo "$line"
    summary+=("$line")
  done
done
echo
echo "== fuzz summary (FUZZTIME=$t)"
printf '%s\n' "${summary[@]}"
exit "$failed"
