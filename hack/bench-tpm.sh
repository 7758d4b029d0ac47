#!/usr/bin/env bash
# Runs BenchmarkTPMAttestation (full server-side verification of one TPM
# attestation, and the cryptographic floor it cannot avoid, in the same run)
# and reports the median of each and their ratio. Target: ratio <= 2.
set -euo pipefail
out=$(go test ./attest/tpm/ -run '^$' -bench 'TPMAttestation' -benchtime "${BENCHTIME:-3000x}" -count "${COUNT:-5}")
echo "$out" | grep '^Benchmark'
echo "$out" | awk '
  /TPMAttestation\/full/  { full[nf++] = $3 }
  /TPMAttestation\/floor/ { floor[nl++] = $3 }
  function median(a, n,   i, j, t) {
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int(n / 2)]
  }
  END {
    f = median(full, nf); l = median(floor, nl)
    printf "median full %.0f ns/op, floor %.0f ns/op, ratio %.2fx (target <= 2x)\n", f, l, f / l
  }'
