#!/usr/bin/env bash
# make attacks: runs every attack and fault test — tests whose name holds
# "Attack" or "Fault" (TPM, GCP, AWS, the MCS's input, HTTP, TLS and
# network attacks; kill -9, an API server outage, rotations under load)
# and the approver's TestDecide (CSR attacks) and TestKeptAKReattestation
# (a cleared TPM re-attesting) — and prints one table of
# attack, expected outcome and result, collected from what the tests
# asserted (internal/attacktable). Extra arguments go to the table
# printer (e.g. -o table.md). Fails if any row or test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -json -count=1 -timeout 20m -run 'Attack|Fault|^TestDecide$|^TestKeptAKReattestation$' ./... | go run ./internal/attacktable/cmd/attacktable "$@"
