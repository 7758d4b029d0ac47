#!/usr/bin/env bash
# make attacks: runs every attack test (tests whose name holds "Attack":
# TPM, GCP, AWS, the MCS's input, HTTP and network attacks, the approver's
# CSR attacks) and prints one table of attack, expected refusal and
# result, collected from what the tests asserted (internal/attacktable).
# Extra arguments go to the table printer (e.g. -o table.md).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -json -count=1 -timeout 20m -run 'Attack' ./... | go run ./internal/attacktable/cmd/attacktable "$@"
