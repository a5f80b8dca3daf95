#!/usr/bin/env bash
# The chaos proof of crash-safe delivery: a campaign of 20,000 recipients (--recipients N or
# CHAOS_RECIPIENTS to change it) sent by three workers that are SIGKILLed again and again, through a
# provider sandbox answering 5% 503 and 2% 429, with the test's private Redis frozen for 3 s and then
# emptied followed by `campaignctl resume`. It proves, from the provider's side: nobody got two messages,
# everyone not delivered is reported `unknown`, unknown stays within 1%, every recipient ends in a
# terminal state, and nothing was sent while Redis was unreachable. The suite runs the same test at 1,500.
#
# --schedule random applies instead a random order of faults drawn from a seed (--seed N, repeatable, or
# --seeds A-B; without either, one seed drawn now): worker kills, Redis frozen for 1-4 s or emptied (then
# resumed), the test database's Postgres backends terminated, provider faults (5xx, 429, held answers,
# resets) switched on and off, receipts off or early or late, `resume` and `resume --resend-unknown`.
# The schedule is a pure function of the seed and is printed first; a failing seed gives it again.
# Seeds run one after another; with more than one, each one's output goes to a log file
# (CHAOS_LOG_DIR, default /tmp/campaignctl-chaos) and a table of the results is printed at the end.
# The shared Redis on 127.0.0.1:6379 is never flushed: the test starts a redis-server of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: scripts/chaos.sh [--recipients N] [--schedule fixed|random [--seed N]... [--seeds A-B]]" >&2
  exit 2
}
schedule=fixed
seeds=()
number() { case "$2" in ''|*[!0-9]*) echo "$1 must be a number, got '$2'" >&2; exit 2 ;; esac; }
while [ $# -gt 0 ]; do
  case "$1" in
    --recipients) [ $# -ge 2 ] || usage; CHAOS_RECIPIENTS=$2; shift 2 ;;
    --recipients=*) CHAOS_RECIPIENTS=${1#*=}; shift ;;
    --schedule) [ $# -ge 2 ] || usage; schedule=$2; shift 2 ;;
    --schedule=*) schedule=${1#*=}; shift ;;
    --seed) [ $# -ge 2 ] || usage; number --seed "$2"; seeds+=("$2"); shift 2 ;;
    --seed=*) number --seed "${1#*=}"; seeds+=("${1#*=}"); shift ;;
    --seeds|--seeds=*)
      if [ "$1" = --seeds ]; then [ $# -ge 2 ] || usage; range=$2; shift 2; else range=${1#*=}; shift; fi
      from=${range%-*}; to=${range#*-}
      number "--seeds' first" "$from"; number "--seeds' last" "$to"
      [ "$from" -le "$to" ] || { echo "--seeds $range: give A-B with A <= B" >&2; exit 2; }
      for ((s = from; s <= to; s++)); do seeds+=("$s"); done ;;
    -h|--help) usage ;;
    *) echo "unknown option: $1" >&2; usage ;;
  esac
done
number --recipients "${CHAOS_RECIPIENTS:-20000}"
case "$schedule" in
  fixed) [ ${#seeds[@]} -eq 0 ] || { echo "--seed and --seeds go with --schedule random" >&2; exit 2; } ;;
  random) [ ${#seeds[@]} -gt 0 ] || seeds=($(( (RANDOM << 15 | RANDOM) % 1000000 ))) ;;
  *) echo "--schedule $schedule: give fixed (the default) or random" >&2; exit 2 ;;
esac

. scripts/services.sh
ensure_services
if ! command -v redis-server >/dev/null && [ ! -x /usr/bin/redis-server ]; then
  say "installing redis-server (the chaos test runs a private one)"
  apt_install redis-server
fi

export CHAOS_RECIPIENTS=${CHAOS_RECIPIENTS:-20000}
if [ "$schedule" = fixed ]; then
  say "chaos test with $CHAOS_RECIPIENTS recipients"
  exec go test -count=1 -run '^TestChaos$' -v -timeout 30m ./cmd/campaignctl
fi

logs=${CHAOS_LOG_DIR:-/tmp/campaignctl-chaos}
mkdir -p "$logs"
results=()
failed=0
for seed in "${seeds[@]}"; do
  log="$logs/seed-$seed-$CHAOS_RECIPIENTS.log"
  say "chaos schedule: seed $seed, $CHAOS_RECIPIENTS recipients (log: $log)"
  start=$(date +%s)
  run=(env CHAOS_SCHEDULE=random CHAOS_SEED="$seed" go test -count=1 -run '^TestChaosSchedule$' -v -timeout 30m ./cmd/campaignctl)
  if [ ${#seeds[@]} -eq 1 ]; then
    if "${run[@]}" 2>&1 | tee "$log"; then verdict=PASS; else verdict=FAIL; fi
  else
    if "${run[@]}" >"$log" 2>&1; then verdict=PASS; else verdict=FAIL; fi
  fi
  took=$(( $(date +%s) - start ))
  [ "$verdict" = PASS ] || failed=$((failed + 1))
  summary=$(grep -o 'chaos summary: .*' "$log" | tail -n 1 | sed 's/^chaos summary: //' || true)
  results+=("$(printf '%-8s %-5s %4ss  %s' "$seed" "$verdict" "$took" "${summary:-no summary (see the log)}")")
  say "seed $seed: $verdict in ${took}s"
done

echo
printf '%-8s %-5s %5s  %s\n' seed result time summary
for r in "${results[@]}"; do echo "$r"; done
echo "logs in $logs; reproduce a seed with: scripts/chaos.sh --schedule random --seed N --recipients $CHAOS_RECIPIENTS"
[ "$failed" -eq 0 ]
