#!/usr/bin/env bash
# The whole test suite against real local Postgres and Redis (installed and started if missing).
# Extra arguments go to `go test`, e.g. scripts/test.sh -run TestEndToEnd ./cmd/...
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
# The servers the tests use: TEST_DATABASE_URL (a superuser's URL; default postgres://postgres@127.0.0.1:5432)
# and TEST_REDIS_ADDR (host:port; default 127.0.0.1:6379).
ensure_services "${TEST_DATABASE_URL:-}" "${TEST_REDIS_ADDR:-}"
# The chaos test runs a private redis-server of its own (it freezes and empties it).
if ! command -v redis-server >/dev/null && [ ! -x /usr/bin/redis-server ]; then
  say "installing redis-server for the chaos test"
  apt_install redis-server
fi
# The Postgres crash tests run a private server of their own (internal/testpg: initdb, pg_ctl, postgres).
if ! [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  say "installing the PostgreSQL server programs for the crash tests"
  apt_install postgresql
fi
# The UI test loads `campaignctl ui` in headless Chromium (it skips without it).
# Tests of a package run TEST_PARALLEL at a time (default 4; go test's own default is the number of cores):
# most of them wait on timers, leases and other processes, and two at a time left a two-core machine
# half idle.
if ! command -v chromium >/dev/null && [ ! -x /usr/bin/chromium ]; then
  say "installing chromium for the UI test"
  apt_install chromium
fi

if [ $# -eq 0 ]; then set -- ./...; fi
parallel=${TEST_PARALLEL:-4}
say "go test -race -parallel $parallel $*"
go test -race -timeout 20m -parallel "$parallel" "$@"
