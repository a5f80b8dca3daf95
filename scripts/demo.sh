#!/usr/bin/env bash
# A demo campaign end to end on the local defaults: Postgres, Redis, the provider sandbox and two workers.
# Makes sure the services run (installs them if needed), builds, migrates, seeds 10,000 customers, launches
# an SMS campaign, shows its progress until it is done, records the delivery receipts, prints the summary
# and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
ensure_services "${DATABASE_URL:-}" "${REDIS_URL:-}"

USERS=${USERS:-10000}
mkdir -p .demo bin
say "building campaignctl"
go build -o bin/campaignctl ./cmd/campaignctl
ctl=bin/campaignctl

export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/campaignctl?sslmode=disable}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
# Sandbox credentials (the sandbox accepts exactly these); never real ones.
export TWILIO_ACCOUNT_SID=ACdemo00000000000000000000000000
export TWILIO_AUTH_TOKEN=demotoken
export TWILIO_FROM=+905550000000
export TWILIO_RATE=${TWILIO_RATE:-1000}
export SENDER_IDENTITY="Kampanya A.Ş."   # the sender identity every commercial SMS must carry

port=8025
while port_open 127.0.0.1 "$port"; do port=$((port + 1)); done
export TWILIO_BASE_URL="http://127.0.0.1:$port"
# Delivery receipts: the sandbox posts signed status callbacks to `campaignctl webhooks`.
hooks=$((port + 1))
while port_open 127.0.0.1 "$hooks"; do hooks=$((hooks + 1)); done
export TWILIO_STATUS_CALLBACK="http://127.0.0.1:$hooks/twilio/status"
# The receipts are signed for the URL the sandbox calls: a WEBHOOKS_PUBLIC_URL of the shell (a deployment's
# public address) would make webhooks check them against another URL and refuse every one.
unset WEBHOOKS_PUBLIC_URL UNSUBSCRIBE_SECRET

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

say "migrating $(without_password "$DATABASE_URL")"
$ctl migrate
say "seeding $USERS customers, their İYS consents and the code pool 'demo'"
$ctl demo seed --users "$USERS" --pool demo

say "starting the provider sandbox on 127.0.0.1:$port (1% 503 and 0.1% 429 injected) and two workers"
$ctl sandbox --addr "127.0.0.1:$port" --fail-503 0.01 --fail-429 0.001 2>.demo/sandbox.log &
pids+=($!)
wait_port 127.0.0.1 "$port" || { echo "the sandbox did not start; see .demo/sandbox.log" >&2; exit 1; }
$ctl webhooks --addr "127.0.0.1:$hooks" --spool-dir .demo/spool 2>.demo/webhooks.log &
pids+=($!)
wait_port 127.0.0.1 "$hooks" || { echo "the receipts endpoint did not start; see .demo/webhooks.log" >&2; exit 1; }
for i in 1 2; do
  $ctl worker --concurrency 8 2>".demo/worker$i.log" &
  pids+=($!)
done

name="demo-$(date +%Y%m%d-%H%M%S)"
message='Merhaba {{.first_name}}, yaz indirimi kodunuz: {{.code}} - Kampanya A.Ş. Ret için RET yazıp 3338e gönderin.'
# The demo re-seeds the same customers on every run; without --frequency-cap 0 a second run within 24 h
# would (rightly) skip everyone the first run reached.
launch=(launch --name "$name" --channel sms --audience scripts/demo/audience.sql --code-pool demo --message "$message" --frequency-cap 0)
say "dry run"
$ctl "${launch[@]}" --dry-run
say "launch at $TWILIO_RATE SMS segments per second (TWILIO_RATE counts segments, as Twilio does)"
id=$($ctl "${launch[@]}" --yes --json | sed -n 's/^ *"id": *\([0-9]*\),*$/\1/p')
[ -n "$id" ] || { echo "launch did not report a campaign id" >&2; exit 1; }
say "campaign $id: progress"
timeout 600 $ctl status "$id" --watch >/dev/null
say "waiting a moment for the last delivery receipts"
sleep 2
say "summary"
$ctl status "$id"
# What the provider saw: every accepted message, and how many numbers got more than one (must be 0).
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /_sandbox/stats HTTP/1.0\r\nHost: sandbox\r\n\r\n' >&3
echo "sandbox: $(tail -n 1 <&3)"
exec 3<&-
if grep -q bad_signature .demo/webhooks.log; then
  echo "warning: campaignctl webhooks refused receipts for their signature (see .demo/webhooks.log): the delivered count above misses them" >&2
fi
echo
echo "Worker logs: .demo/worker1.log .demo/worker2.log; sandbox log: .demo/sandbox.log; receipts: .demo/webhooks.log"
echo "Inspect later with: bin/campaignctl status $id --json"
