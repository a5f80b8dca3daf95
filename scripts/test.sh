#!/usr/bin/env bash
# The whole test suite against real local Postgres and Redis (installed and started if missing).
# Extra arguments go to `go test`, e.g. scripts/test.sh -run TestEndToEnd ./cmd/...
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_services

if [ $# -eq 0 ]; then set -- ./...; fi
say "go test -race $*"
go test -race -timeout 20m "$@"
