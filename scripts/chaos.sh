#!/usr/bin/env bash
# The chaos proof of crash-safe delivery: a campaign of 20,000 recipients (--recipients N or
# CHAOS_RECIPIENTS to change it) sent by three workers that are SIGKILLed again and again, through a
# provider sandbox answering 5% 503 and 2% 429, with the test's private Redis frozen for 3 s and then
# emptied followed by `campaignctl resume`. It proves, from the provider's side: nobody got two messages,
# everyone not delivered is reported `unknown`, unknown stays within 1%, every recipient ends in a
# terminal state, and nothing was sent while Redis was unreachable. The suite runs the same test at 1,500.
# The shared Redis on 127.0.0.1:6379 is never flushed: the test starts a redis-server of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/chaos.sh [--recipients N]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --recipients) [ $# -ge 2 ] || usage; CHAOS_RECIPIENTS=$2; shift 2 ;;
    --recipients=*) CHAOS_RECIPIENTS=${1#*=}; shift ;;
    -h|--help) usage ;;
    *) echo "unknown option: $1" >&2; usage ;;
  esac
done
case "${CHAOS_RECIPIENTS:-20000}" in
  ''|*[!0-9]*) echo "--recipients must be a number, got '${CHAOS_RECIPIENTS}'" >&2; exit 2 ;;
esac

. scripts/services.sh
ensure_services
if ! command -v redis-server >/dev/null && [ ! -x /usr/bin/redis-server ]; then
  say "installing redis-server (the chaos test runs a private one)"
  apt_install redis-server
fi

export CHAOS_RECIPIENTS=${CHAOS_RECIPIENTS:-20000}
say "chaos test with $CHAOS_RECIPIENTS recipients"
go test -count=1 -run '^TestChaos$' -v -timeout 30m ./cmd/campaignctl
