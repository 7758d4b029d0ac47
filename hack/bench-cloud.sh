#!/usr/bin/env bash
# Runs each cloud evidence kind's whole server-side verification beside its
# cryptographic floor (the signature checks no verifier can skip), in the
# same run, and reports the medians and their ratio:
#   gcp           Verify / 1 RSA-2048 (the identity token's RS256)
#   aws           Verify / 1 RSA-2048 (the identity document's PKCS#7)
#   gce-vtpm      Verify / (2 RSA-2048 of the AK certificate's chain + 1 P-256 quote)
#   aws-nitrotpm  Verify / (5 P-384: the COSE document and its 4-certificate chain
#                 + 1 P-256 quote + 1 RSA-2048 identity document)
# The benchmarks are the packages' own (identity/*/bench_test.go); gce-vtpm's
# needs swtpm (make deps).
set -euo pipefail
out=$(go test -p 1 -run '^$' -bench 'Verify' -benchtime "${BENCHTIME:-2s}" -count "${COUNT:-3}" \
  ./identity/gcp ./identity/aws ./identity/gcevtpm ./identity/nitrotpm)
echo "$out" | grep -E '^(pkg:|Benchmark)'
echo "$out" | awk '
  /^pkg: / { n = split($2, p, "/"); pkg = p[n] }
  /^Benchmark/ { name = $1; sub(/-[0-9]+$/, "", name); k = pkg " " name; v[k, c[k]++] = $3 }
  function median(k,   i, j, t, a, n) {
    n = c[k]; if (n == 0) { printf "no %s in the output\n", k; bad = 1; return 0 }
    for (i = 0; i < n; i++) a[i] = v[k, i]
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int(n / 2)]
  }
  function row(kind, full, floor, what) {
    printf "%-13s verify %9.0f ns/op  floor %9.0f ns/op  ratio %.2fx  (floor: %s)\n", kind, full, floor, full / floor, what
  }
  END {
    row("gcp", median("gcp BenchmarkVerify"), median("gcp BenchmarkRSAVerifyFloor"), "1 RSA-2048")
    row("aws", median("aws BenchmarkVerify"), median("aws BenchmarkRSAVerifyFloor"), "1 RSA-2048")
    row("gce-vtpm", median("gcevtpm BenchmarkVerify"),
      median("gcevtpm BenchmarkRSAVerifyFloor") + median("gcevtpm BenchmarkECDSAP256VerifyFloor"), "2 RSA-2048 + 1 P-256")
    row("aws-nitrotpm", median("nitrotpm BenchmarkVerify"),
      5 * median("nitrotpm BenchmarkECDSAP384VerifyFloor") + median("nitrotpm BenchmarkECDSAP256VerifyFloor") + median("nitrotpm BenchmarkRSAVerifyFloor"),
      "5 P-384 + 1 P-256 + 1 RSA-2048")
    exit bad
  }'
