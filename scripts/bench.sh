#!/usr/bin/env bash
# Benchmarks (not tests) of the bulk operations against the local Postgres and Redis:
#   codes generate   --codes N      (default 1,000,000; target ≤ 15 s)
#   iys import       --consents N   (default 1,700,000 rows; target ≤ 20 s)
#   launch --dry-run and launch     --customers N (default 1,000,000 with 75% eligible; target ≤ 20 s, ≤ 200 MB)
# and the send scenarios (scripts/bench/send.sh), each against `campaignctl sandbox` with real workers:
#   SMS end to end                  --sms N (default 200,000), --workers W (2) × --concurrency C (16):
#                                   ≥ 15,800 msg/s (listmonk's on this machine kind), never below 12,000, and
#                                   ≥ 0.45 of the loopback HTTP ceiling measured in the same run; 0 duplicates;
#                                   ≤ 70 µs of CPU a message for workers, Postgres and Redis together; worker
#                                   peak RSS ≤ 100 MB; Redis ≤ 160 B per planned recipient
#   e-mail end to end               --email N (default 200,000): ≥ 50,000 msg/s
#   SMS with 20 ms provider latency --latency-n N (default 32,000) over W × --latency-concurrency (32):
#                                   ≥ 0.9 of W × concurrency / 20 ms (limited by --concurrency only)
#   rate kept                       --rate R (default 2,000/s) for --rate-seconds S (15) over 3 workers:
#                                   no whole second above 1.1 R, a mean of whole seconds ≥ 0.95 R
# and the pushback scenarios (scripts/bench/pushback.sh): sporadic 503s and 429s against the no-fault run,
# a hidden provider limit with no cap, a 20 s outage in the middle of a campaign.
# --only launch or --only send runs one half. The launch half is timed with /usr/bin/time -v (wall time and
# the peak RSS of the campaignctl process). The script
# prints a table and appends a dated section with the machine and the figures to docs/benchmarks.md.
#
# It uses a database of its own (BENCH_DB, default campaignctl_bench: dropped and re-created at the start,
# dropped at the end unless --keep) and a Redis DB number of its own (BENCH_REDIS_DB, default 14), leased
# like the tests lease theirs (key campaignctl:testdb:<n> in DB 0) so a parallel test run never shares it;
# only that DB is ever flushed. The launch benchmark's campaign is never sent (the send half cancels it).
#
# usage: scripts/bench.sh [--only launch|send] [--customers N] [--consents N] [--codes N] [--sms N] [--email N]
#                         [--latency-n N] [--rate R] [--rate-seconds S] [--workers W] [--concurrency C]
#                         [--latency-concurrency C] [--keep] [--no-record] [--explain] [--launch-timeout SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

usage() {
  cat >&2 <<'EOF'
usage: scripts/bench.sh [options]
  --only launch|send    run only the launch benchmarks, or only the send scenarios (default: both)
  --sms N               recipients of the SMS throughput scenario (default 200000)
  --email N             recipients of the e-mail throughput scenario (default 200000)
  --latency-n N         recipients of the 20 ms latency scenario (default 32000: one batch per worker slot)
  --rate R              the cap of the rate-kept scenario in messages/s (default 2000)
  --rate-seconds S      how long the rate-kept scenario runs at its cap (default 15)
  --workers W           worker processes of the throughput and latency scenarios (default 2)
  --concurrency C       --concurrency of each worker (default 16)
  --latency-concurrency C  --concurrency of each worker with 20 ms latency (default 32)
  --scenarios LIST      the send scenarios to run, of sms,email,latency,rate,faults,hidden,outage (default: all)
  --compare REV         instead of the send scenarios: the SMS scenario for this checkout and for git revision
                        REV (built from it; it must share this checkout's migrations), alternating, each run
                        with --sms recipients on the same sandbox; medians of CPU per message by process
  --rounds K            runs of each side with --compare or --peer (default 3)
  --peer CMD            instead of the send scenarios: the SMS scenario and another sender, alternating, each
                        run with --sms recipients against the same sandbox binary (its POST /postback, one JSON
                        message a request); medians of rate and of CPU a message. CMD is run as
                        `CMD prepare N DB URL` (set up N recipients, one message each to URL, in database DB of
                        the same Postgres server, which bench.sh creates and drops; not measured), `CMD send N
                        URL` (send them and return when done: measured) and `CMD stop` (stop, and print the peak RSS in MB). The
                        peer's CPU is the machine's (/proc/stat) less the sandbox's, Postgres's and Redis's
  --profile             take 10 s CPU profiles of the first worker and of the sandbox in each send scenario
                        (kept in the work directory)
  --send-timeout S      give up on a send scenario after S seconds (default 600)
  --customers N         customers in the launch audience (env BENCH_CUSTOMERS, default 1000000; at most 9999999)
  --consents N          rows in the consent CSV for `iys import` (env BENCH_CONSENTS, default 1700000)
  --codes N             codes for `codes generate` (env BENCH_CODES, default 1000000)
  --keep                keep the benchmark database and Redis DB afterwards (and the work directory)
  --no-record           print the table but do not append it to docs/benchmarks.md
  --explain             log the plans of the launch's slow statements (auto_explain, ANALYZE) into the work
                        directory, which is kept; the timings are inflated by the instrumentation and not recorded
  --launch-timeout S    give up on a launch after S seconds (env BENCH_LAUNCH_TIMEOUT, default 900)
environment: BENCH_DB (default campaignctl_bench), BENCH_REDIS_DB (preferred Redis DB, default 14)
EOF
}

CUSTOMERS=${BENCH_CUSTOMERS:-1000000}
CONSENTS=${BENCH_CONSENTS:-1700000}
CODES=${BENCH_CODES:-1000000}
LAUNCH_TIMEOUT=${BENCH_LAUNCH_TIMEOUT:-900}
ONLY="" SMS_N=200000 EMAIL_N=200000 LAT_N=32000 RATE_R=2000 RATE_SECS=15 SEND_WORKERS=2 SEND_CONC=16 LAT_CONC=32
SEND_TIMEOUT=600 PROFILE=0 SCENARIOS=sms,email,latency,rate,faults,hidden,outage
PUSHBACK_N=94000 # recipients of the pushback scenarios (scripts/bench/pushback.sh)
KEEP=0 KEEP_WORK=0 RECORD=1 EXPLAIN=0 COMPARE_REV="" COMPARE_ROUNDS=3 PEER_CMD=""
while [ $# -gt 0 ]; do
  case "$1" in
    --customers) CUSTOMERS=${2:?--customers needs a number}; shift 2 ;;
    --customers=*) CUSTOMERS=${1#*=}; shift ;;
    --consents) CONSENTS=${2:?--consents needs a number}; shift 2 ;;
    --consents=*) CONSENTS=${1#*=}; shift ;;
    --codes) CODES=${2:?--codes needs a number}; shift 2 ;;
    --codes=*) CODES=${1#*=}; shift ;;
    --launch-timeout) LAUNCH_TIMEOUT=${2:?--launch-timeout needs seconds}; shift 2 ;;
    --launch-timeout=*) LAUNCH_TIMEOUT=${1#*=}; shift ;;
    --only) ONLY=${2:?--only needs launch or send}; shift 2 ;;
    --only=*) ONLY=${1#*=}; shift ;;
    --sms) SMS_N=${2:?--sms needs a number}; shift 2 ;;
    --email) EMAIL_N=${2:?--email needs a number}; shift 2 ;;
    --latency-n) LAT_N=${2:?--latency-n needs a number}; shift 2 ;;
    --rate) RATE_R=${2:?--rate needs messages per second}; shift 2 ;;
    --rate-seconds) RATE_SECS=${2:?--rate-seconds needs seconds}; shift 2 ;;
    --workers) SEND_WORKERS=${2:?--workers needs a number}; shift 2 ;;
    --concurrency) SEND_CONC=${2:?--concurrency needs a number}; shift 2 ;;
    --latency-concurrency) LAT_CONC=${2:?--latency-concurrency needs a number}; shift 2 ;;
    --send-timeout) SEND_TIMEOUT=${2:?--send-timeout needs seconds}; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    --compare) COMPARE_REV=${2:?--compare needs a git revision}; ONLY=send; shift 2 ;;
    --peer) PEER_CMD=${2:?--peer needs a command}; ONLY=send; shift 2 ;;
    --rounds) COMPARE_ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
    --scenarios) SCENARIOS=${2:?--scenarios needs a list}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --no-record) RECORD=0; shift ;;
    --explain) EXPLAIN=1; RECORD=0; KEEP_WORK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage; exit 2 ;;
  esac
done
case "$ONLY" in ""|launch|send) ;; *) echo "--only takes launch or send, got '$ONLY'" >&2; exit 2 ;; esac
for s in ${SCENARIOS//,/ }; do
  case "$s" in sms|email|latency|rate|faults|hidden|outage) ;; *) echo "--scenarios: unknown scenario '$s' (give a list of sms,email,latency,rate,faults,hidden,outage)" >&2; exit 2 ;; esac
done
for v in CUSTOMERS CONSENTS CODES LAUNCH_TIMEOUT SMS_N EMAIL_N LAT_N RATE_R RATE_SECS SEND_WORKERS SEND_CONC LAT_CONC SEND_TIMEOUT COMPARE_ROUNDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "${v,,} must be a positive whole number, got '${!v}'" >&2; exit 2; }
done
[ "$CUSTOMERS" -le 9999999 ] || { echo "--customers is at most 9999999 (phones are +90532 followed by 7 digits)" >&2; exit 2; }
[ -z "$COMPARE_REV" ] || [ -z "$PEER_CMD" ] || { echo "--compare and --peer: give one of them" >&2; exit 2; }
if [ -n "$PEER_CMD" ]; then
  command -v "${PEER_CMD%% *}" >/dev/null ||
    { echo "--peer: '${PEER_CMD%% *}' is not a command here (give the path of an executable)" >&2; exit 2; }
  need=$((SMS_N * COMPARE_ROUNDS))
  [ "$need" -le $((CUSTOMERS * 3 / 4)) ] ||
    { echo "--peer needs $need customers with consent ($COMPARE_ROUNDS rounds × --sms $SMS_N): raise --customers to $((need * 4 / 3 + 4)) or lower --sms/--rounds" >&2; exit 2; }
elif [ -n "$COMPARE_REV" ]; then
  git rev-parse --verify --quiet "$COMPARE_REV^{commit}" >/dev/null ||
    { echo "--compare: '$COMPARE_REV' is not a git revision here (a commit, a tag or a branch)" >&2; exit 2; }
  need=$((SMS_N * COMPARE_ROUNDS * 2))
  [ "$need" -le $((CUSTOMERS * 3 / 4)) ] ||
    { echo "--compare needs $need customers with consent ($COMPARE_ROUNDS rounds × 2 × --sms $SMS_N): raise --customers to $((need * 4 / 3 + 4)) or lower --sms/--rounds" >&2; exit 2; }
elif [ "$ONLY" != launch ]; then
  # Each SMS scenario sends to its own range of the customers, in this order (scripts/bench/send.sh): the
  # last one selected says how many are needed. The ranges of sms, latency and rate are where they are
  # whichever run; the pushback scenarios' (30,000, 24,000 and 40,000: PUSHBACK_N) follow one another.
  need=0 end=0
  for sc in sms:$SMS_N latency:$LAT_N rate:$((RATE_R * RATE_SECS)) faults:30000 hidden:24000 outage:40000; do
    if [[ ",$SCENARIOS," == *",${sc%%:*},"* ]]; then
      end=$((end + ${sc#*:}))
      need=$end
    elif [[ ${sc%%:*} == sms || ${sc%%:*} == latency || ${sc%%:*} == rate ]]; then
      end=$((end + ${sc#*:}))
    fi
  done
  [ "$need" -le $((CUSTOMERS * 3 / 4)) ] ||
    { echo "the SMS scenarios selected need $need customers with consent: raise --customers to $((need * 4 / 3 + 4)) or lower --sms/--latency-n/--rate" >&2; exit 2; }
  emails=$(( CUSTOMERS < CONSENTS - CUSTOMERS ? CUSTOMERS : CONSENTS - CUSTOMERS ))
  [[ ",$SCENARIOS," != *,email,* ]] || [ "$EMAIL_N" -le $((emails * 4 / 5)) ] ||
    { echo "the e-mail scenario needs $EMAIL_N e-mail consents; the consent CSV has $((emails * 4 / 5)) usable: raise --consents or lower --email" >&2; exit 2; }
fi

BENCH_DB=${BENCH_DB:-campaignctl_bench}
case "$BENCH_DB" in
  *bench*) ;;
  *) echo "BENCH_DB=$BENCH_DB: the name must contain 'bench' (the database is dropped)" >&2; exit 2 ;;
esac
[[ $BENCH_DB =~ ^[a-z0-9_]+$ ]] || { echo "BENCH_DB must be lower-case letters, digits and _" >&2; exit 2; }

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
ensure_services
command -v psql >/dev/null || { say "installing the Postgres client with apt"; apt_install postgresql-client; }
command -v redis-cli >/dev/null || { say "installing redis-cli with apt"; apt_install redis-tools; }
[ -x /usr/bin/time ] || { say "installing GNU time with apt"; apt_install time; }
command -v jq >/dev/null || { say "installing jq with apt"; apt_install jq; }
command -v curl >/dev/null || { say "installing curl with apt"; apt_install curl; }

PG_BASE="postgres://postgres@$PGHOST_ADDR:$PGPORT_NUM"
export DATABASE_URL="$PG_BASE/$BENCH_DB?sslmode=disable"
unset AUDIENCE_DATABASE_URL
export PGCLIENTENCODING=UTF8
psql_admin() { psql -X -q -v ON_ERROR_STOP=1 "$PG_BASE/postgres?sslmode=disable" "$@"; }
psql_bench() { psql -X -q -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT_NUM" "$@"; }

work=$(mktemp -d /tmp/campaignctl-bench.XXXXXX)
lease_key="" lease_owner="bench-$$-$RANDOM$RANDOM" REDIS_DB=""

drop_db() {
  psql_admin -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" 2>/dev/null ||
    psql_admin -c "DROP DATABASE IF EXISTS $BENCH_DB"
}
release_lease() {
  [ -n "$lease_key" ] || return 0
  rcli -n 0 EVAL "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0" \
    1 "$lease_key" "$lease_owner" >/dev/null || true
}
cleanup() {
  local rc=$?
  if [ "$KEEP" = 1 ]; then
    say "kept: database $BENCH_DB, Redis DB $REDIS_DB (its lease expires by itself), work directory $work"
  else
    drop_db >/dev/null 2>&1 || echo "could not drop database $BENCH_DB" >&2
    if [ -n "$PEER_CMD" ]; then
      $PEER_CMD stop >/dev/null 2>&1 || true
      psql_admin -c "DROP DATABASE IF EXISTS ${BENCH_DB}_peer WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    if [ -n "$REDIS_DB" ]; then rcli -n "$REDIS_DB" FLUSHDB >/dev/null 2>&1 || true; fi
    release_lease
    if [ "$KEEP_WORK" = 1 ]; then say "kept the work directory $work"; else rm -rf "$work"; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A Redis DB of our own, leased as internal/testredis leases them, so a concurrent `go test` never gets it.
for db in "${BENCH_REDIS_DB:-14}" 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1; do
  if [ "$(rcli -n 0 SET "campaignctl:testdb:$db" "$lease_owner" NX EX 3600)" = OK ]; then
    lease_key="campaignctl:testdb:$db" REDIS_DB=$db
    break
  fi
done
[ -n "$REDIS_DB" ] || { echo "no free Redis DB (1-15): every one is leased by a test run; try again later" >&2; exit 1; }
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT_NUM/$REDIS_DB"
rcli -n "$REDIS_DB" FLUSHDB >/dev/null

say "building campaignctl"
mkdir -p bin
go build -o bin/campaignctl ./cmd/campaignctl
# Run a private copy, so that another session rebuilding bin/campaignctl cannot swap it mid-benchmark.
cp bin/campaignctl "$work/campaignctl"
ctl="$work/campaignctl"
if [ -n "$COMPARE_REV" ]; then
  rev_commit=$(git rev-parse --short "$COMPARE_REV^{commit}")
  say "building campaignctl at $COMPARE_REV ($rev_commit)"
  mkdir -p "$work/rev-src"
  git archive --format=tar "$rev_commit" | tar -x -C "$work/rev-src"
  (cd "$work/rev-src" && go build -o "$work/campaignctl-rev" ./cmd/campaignctl)
  rm -rf "$work/rev-src"
  rev_ctl="$work/campaignctl-rev"
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain -- . ':!docs' ':!scripts' 2>/dev/null | wc -l)
[ "$dirty" -eq 0 ] || commit="$commit + uncommitted changes to $dirty files"

say "fresh database $BENCH_DB, Redis DB $REDIS_DB"
drop_db
"$ctl" migrate >/dev/null

# ---------------------------------------------------------------------------------------------------------
# Measuring. Each row: operation|size|seconds|peak RSS MB|target|met?
rows=() setup=() notes=() said=()  # said: printed, not recorded (paths of this run's work directory)

secs_of() { # "h:mm:ss" or "m:ss.ss" -> seconds
  awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.2f", s }' <<<"$1"
}
# measure NAME -- command...: runs it under /usr/bin/time -v; stdout to $work/NAME.out, stderr to
# $work/NAME.err; sets m_rc, m_secs, m_mb (peak RSS of the process in MB), m_cpu (user+sys seconds).
measure() {
  local name=$1; shift; [ "$1" = -- ] && shift
  rcli -n 0 EXPIRE "$lease_key" 3600 >/dev/null || true   # keep the Redis DB lease for the next step
  if /usr/bin/time -v -o "$work/$name.time" "$@" >"$work/$name.out" 2>"$work/$name.err"; then m_rc=0; else m_rc=$?; fi
  m_secs=$(secs_of "$(sed -n 's/.*Elapsed (wall clock) time.*: //p' "$work/$name.time")")
  m_mb=$(awk '/Maximum resident set size/ { printf "%.0f", $NF / 1024 }' "$work/$name.time")
  m_cpu=$(awk '/User time|System time/ { s += $NF } END { printf "%.1f", s }' "$work/$name.time")
}
# verdict SECS MB MAX_SECS MAX_MB: "yes" or "no (...)" against the target
verdict() {
  local why=()
  awk -v a="$1" -v b="$3" 'BEGIN { exit !(a <= b) }' || why+=("time")
  if [ -n "$4" ]; then awk -v a="$2" -v b="$4" 'BEGIN { exit !(a <= b) }' || why+=("RSS"); fi
  if [ ${#why[@]} -eq 0 ]; then echo yes; else echo "no (${why[*]})"; fi
}
fmt_n() { sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' <<<"$1"; }
fail_tail() { echo "--- $1 failed (exit $m_rc); last lines of its stderr:" >&2; tail -n 5 "$work/$1.err" >&2; }

# (a) codes generate
if [ "$ONLY" != send ]; then
say "codes generate --pool bench --count $CODES"
measure codes -- "$ctl" codes generate --pool bench --count "$CODES"
if [ "$m_rc" -ne 0 ]; then fail_tail codes; met="failed (exit $m_rc)"
elif [ "$CODES" -eq 1000000 ]; then met=$(verdict "$m_secs" "$m_mb" 15 ""); else met="n/a (target is for 1,000,000)"; fi
rows+=("codes generate|$(fmt_n "$CODES") codes|$m_secs|$m_mb|≤ 15 s|$met")
[ "$m_rc" -ne 0 ] || grep -q "^pool bench: $CODES new codes" "$work/codes.out" ||
  notes+=("codes generate reported: $(head -n 1 "$work/codes.out")")
fi

# (b) iys import of a generated CSV
say "writing a consent CSV of $CONSENTS rows"
t0=$EPOCHREALTIME
psql_bench -v customers="$CUSTOMERS" -v consents="$CONSENTS" -f scripts/bench/consents.sql >"$work/consents.csv"
setup+=("consent CSV ($(fmt_n "$CONSENTS") rows, $(du -m "$work/consents.csv" | cut -f1) MB) written by psql COPY in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s")
say "iys import ($CONSENTS rows)"
measure iys -- "$ctl" iys import "$work/consents.csv"
if [ "$m_rc" -ne 0 ]; then fail_tail iys; met="failed (exit $m_rc)"
elif [ "$CONSENTS" -eq 1700000 ]; then met=$(verdict "$m_secs" "$m_mb" 20 ""); else met="n/a (target is for 1,700,000)"; fi
[ "$ONLY" = send ] && [ "$m_rc" -eq 0 ] || rows+=("iys import|$(fmt_n "$CONSENTS") rows|$m_secs|$m_mb|≤ 20 s|$met")
[ "$m_rc" -ne 0 ] || grep -q "^imported $CONSENTS consent rows" "$work/iys.out" ||
  notes+=("iys import reported: $(head -n 1 "$work/iys.out")")

# (c) the launch: customers, consents as imported above, the code pool from (a)
matched=$(( CUSTOMERS < CONSENTS ? CUSTOMERS : CONSENTS ))     # customers with a MESAJ consent row
expect_eligible=$(( matched - matched / 4 ))
say "creating customers ($CUSTOMERS rows)"
t0=$EPOCHREALTIME
psql_bench -v customers="$CUSTOMERS" -f scripts/bench/customers.sql
setup+=("customers table ($(fmt_n "$CUSTOMERS") rows) created with SQL in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s")
if [ "$ONLY" != send ]; then
# The pool is new and holds the CODES codes made above, all free; the launch needs one per eligible recipient.
if [ "$CODES" -lt "$expect_eligible" ]; then
  say "topping the pool up by $((expect_eligible - CODES)) codes for the launch (not timed)"
  "$ctl" codes generate --pool bench --count $((expect_eligible - CODES)) >/dev/null 2>&1
fi
# Settle the database before the timed launch: statistics, and the import's dirty pages written out.
psql_bench -c "VACUUM ANALYZE" -c "CHECKPOINT"

if [ "$EXPLAIN" = 1 ]; then
  logfile=$(psql_admin -Atc "SELECT coalesce(pg_current_logfile(), '')")
  if [ -n "$logfile" ] && [ "${logfile#/}" = "$logfile" ]; then logfile="$(psql_admin -Atc 'SHOW data_directory')/$logfile"; fi
  if [ -z "$logfile" ]; then
    logfile=$(ls -t /var/log/postgresql/postgresql-*.log 2>/dev/null | head -n 1 || true)
  fi
  log_offset=$( [ -n "$logfile" ] && [ -r "$logfile" ] && stat -c %s "$logfile" || echo 0)
  psql_admin -c "ALTER DATABASE $BENCH_DB SET session_preload_libraries = 'auto_explain'" \
    -c "ALTER DATABASE $BENCH_DB SET auto_explain.log_min_duration = '500ms'" \
    -c "ALTER DATABASE $BENCH_DB SET auto_explain.log_analyze = on" \
    -c "ALTER DATABASE $BENCH_DB SET auto_explain.log_buffers = on" \
    -c "ALTER DATABASE $BENCH_DB SET auto_explain.log_nested_statements = on"
fi

name="bench-$(date +%Y%m%d-%H%M%S)"
# A commercial SMS carries the sender's identity and a RET instruction (the launch checks both).
export SENDER_IDENTITY="Kampanya A.Ş."
message='Merhaba {{.first_name}}, kodunuz {{.code}} - Kampanya A.Ş. RET yazıp 3338e gönderin'
launch_row() { # NAME LABEL
  local met
  if [ "$m_rc" -eq 124 ]; then met="timed out after $LAUNCH_TIMEOUT s"
  elif [ "$m_rc" -ne 0 ]; then fail_tail "$1"; met="failed (exit $m_rc)"
  elif [ "$CUSTOMERS" -eq 1000000 ]; then met=$(verdict "$m_secs" "$m_mb" 20 200); else met="n/a (target is for 1,000,000)"; fi
  rows+=("$2|$(fmt_n "$CUSTOMERS") customers, $(fmt_n "$expect_eligible") eligible|$m_secs|$m_mb|≤ 20 s, ≤ 200 MB|$met")
  # Where the planner's time goes, when it logs its steps (--log-level debug, "plan step" records).
  local steps
  steps=$(jq -rR 'fromjson? | select(.msg == "plan step") | "\(.step) \(.ms / 1000) s"' "$work/$1.err" 2>/dev/null | paste -sd ';' - | sed 's/;/; /g' || true)
  [ -z "$steps" ] || notes+=("$2, planner steps: $steps")
  if [ "$m_rc" -eq 0 ]; then
    local got_e got_a
    got_e=$(jq -r '.eligible' "$work/$1.out" 2>/dev/null || echo '?')
    got_a=$(jq -r '.audience' "$work/$1.out" 2>/dev/null || echo '?')
    [ "$got_e" = "$expect_eligible" ] && [ "$got_a" = "$CUSTOMERS" ] ||
      notes+=("$2: audience $got_a (expected $CUSTOMERS), eligible $got_e (expected $expect_eligible)")
  fi
}

say "launch --dry-run ($CUSTOMERS customers, $expect_eligible eligible)"
measure dryrun -- timeout "$LAUNCH_TIMEOUT" "$ctl" --log-level debug launch --name "$name" --channel sms \
  --audience scripts/bench/audience.sql --message "$message" --code-pool bench --dry-run --json
launch_row dryrun "launch --dry-run"
# (These checks read the engine's tables, whose layout may change: a failed query is only noted.)
written=$(psql_bench -Atc "SELECT (SELECT count(*) FROM campaigns) + (SELECT count(*) FROM campaign_recipients)" 2>/dev/null || echo '?')
[ "$written" = 0 ] || notes+=("launch --dry-run: $written campaign/recipient rows found afterwards (expected 0)")

say "launch ($CUSTOMERS customers, $expect_eligible eligible)"
measure launch -- timeout "$LAUNCH_TIMEOUT" "$ctl" --log-level debug launch --name "$name" --channel sms \
  --audience scripts/bench/audience.sql --message "$message" --code-pool bench --yes --json
launch_row launch "launch"
if [ "$m_rc" -eq 0 ]; then
  id=$(jq -r '.id' "$work/launch.out")
  read -r planned reserved batches < <( (psql_bench -Atc "SELECT count(*), count(DISTINCT code),
      (SELECT count(*) FROM campaign_batches WHERE campaign_id = $id) FROM campaign_recipients WHERE campaign_id = $id" 2>/dev/null ||
      echo '?|?|?') | tr '|' ' ')
  enqueued=$(jq -r '.enqueued' "$work/launch.out")
  checks="launch checks: $(fmt_n "$planned") recipients planned with $(fmt_n "$reserved") distinct codes, $(fmt_n "$batches") batches, $(fmt_n "$enqueued") tasks enqueued"
  excluded=$(jq -r '.excluded | to_entries | map("\(.key) \(.value)") | join(", ")' "$work/launch.out")
  [ -z "$excluded" ] || checks="$checks; excluded: $excluded"
  notes+=("$checks")
  if [ "$planned" != "$expect_eligible" ] || [ "$reserved" != "$expect_eligible" ] || [ "$enqueued" != "$batches" ]; then
    notes+=("launch: UNEXPECTED counts (expected $expect_eligible recipients and codes, every batch enqueued)")
  fi
fi

if [ "$EXPLAIN" = 1 ]; then
  psql_admin -c "ALTER DATABASE $BENCH_DB RESET ALL" >/dev/null
  if [ -n "${logfile:-}" ] && [ -r "$logfile" ]; then
    tail -c +"$((log_offset + 1))" "$logfile" >"$work/explain.log"
    say "statements of the launches slower than 500 ms, with their plans: $work/explain.log"
    # Each slow statement: its duration and the first line of its text that is not a comment.
    awk '/ LOG:  duration: [0-9.]+ ms  plan:/ { match($0, /duration: [0-9.]+ ms/); d = substr($0, RSTART + 10, RLENGTH - 10); want = 1; next }
         want && /^\t/ { t = $0; sub(/^\t(Query Text:)?[ \t]*/, "", t)
                         if (t != "" && t !~ /^--/) { printf "  %12s  %s\n", d, substr(t, 1, 120); want = 0 } }' \
      "$work/explain.log" >&2 || true
  else
    echo "cannot read the Postgres log ($logfile); no plans to show" >&2
  fi
fi
fi # the launch half

if [ -n "$PEER_CMD" ]; then
  . scripts/bench/send.sh
  run_peer
elif [ -n "$COMPARE_REV" ]; then
  . scripts/bench/send.sh
  run_compare
elif [ "$ONLY" != launch ]; then
  . scripts/bench/send.sh
  run_send_scenarios
fi

# ---------------------------------------------------------------------------------------------------------
# The table, and the machine.
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
cores=$(nproc)
mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
datadir=$(psql_admin -Atc "SHOW data_directory" 2>/dev/null || echo /)
[ -d "$datadir" ] || datadir=/
disk_dev=$(df --output=source "$datadir" | tail -n 1)
disk="$(df -h --output=size "$datadir" | tail -n 1 | tr -d ' ') $(df --output=fstype "$datadir" | tail -n 1) on $disk_dev"
rota=$(lsblk -ndo ROTA "$disk_dev" 2>/dev/null | tr -d ' ' || true)
case "$rota" in 0) disk="$disk (non-rotational)" ;; 1) disk="$disk (reported rotational; virtual disks often are)" ;; esac
pgver=$(psql_admin -Atc "SHOW server_version" | cut -d' ' -f1)
pgconf=$(psql_admin -Atc "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings
  WHERE name IN ('shared_buffers', 'work_mem', 'maintenance_work_mem', 'max_wal_size', 'synchronous_commit', 'fsync')")
redisver=$(rcli INFO server | sed -n 's/^redis_version:\([^\r]*\).*/\1/p')
gover=$(go version | awk '{ print $3 }')
load=$(cut -d' ' -f1-3 /proc/loadavg)

table() {
  echo "| operation | size | seconds | peak RSS MB | target | met? |"
  echo "| --- | --- | ---: | ---: | --- | --- |"
  local r
  for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
}
echo
table | sed 's/^| //; s/ |$//' | column -t -s '|' -o ' | '
echo
for s in "${setup[@]}"; do echo "setup: $s"; done
for n in "${notes[@]}"; do echo "note: $n"; done
for n in "${said[@]}"; do echo "$n"; done
echo "commit $commit; $cpu, $cores cores, $mem; Postgres $pgver, Redis $redisver, $gover; load average $load_start at the start, $load at the end"

if [ "$RECORD" = 1 ]; then
  doc=docs/benchmarks.md
  mkdir -p docs
  [ -f "$doc" ] || printf '# Benchmarks\n' >"$doc"
  {
    echo
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
    echo
    echo "- CPU: $cpu, $cores cores ($(uname -m), Linux $(uname -r))"
    echo "- memory: $mem; disk: $disk"
    echo "- Postgres $pgver ($pgconf), Redis $redisver, $gover"
    echo "- load average (1, 5, 15 min) at the start: $load_start; at the end: $load"
    echo
    table
    echo
    for s in "${setup[@]}"; do echo "- setup: $s"; done
    for n in "${notes[@]}"; do echo "- $n"; done
  } >>"$doc"
  say "appended to $doc"
fi
