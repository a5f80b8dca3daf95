# Send scenarios of scripts/bench.sh (sourced by it; uses its ctl, work, rcli, psql_bench, measure rows,
# notes and fmt_n). Each scenario starts `campaignctl sandbox` (no latency, no cap unless said), launches a
# campaign with no worker running, then starts the workers and times the campaign from the first to the
# last acceptance at the sandbox. It records:
#   - the throughput over that span, and the duplicates the sandbox saw (must be 0);
#   - each worker's peak RSS (VmHWM, read before it is stopped);
#   - Redis memory: the highest used_memory seen (sampled every 200 ms) less the figure before the launch,
#     per planned recipient.
# Scenarios use disjoint ranges of the customers table, so no frequency cap and no claim of one touches
# another.

free_port() {
  local p=$1
  while port_open 127.0.0.1 "$p"; do p=$((p + 1)); done
  echo "$p"
}

redis_used() { rcli INFO memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p'; }

sandbox_get() { # PATH: GET from the running sandbox
  curl -fsS "http://127.0.0.1:$sb_port$1"
}

# sandbox_peek PATH: GET from the running sandbox with bash alone (no process started: the polling loop
# runs while the machine is measured); prints the answer, headers included, or nothing.
sandbox_peek() {
  local answer=""
  { exec 3<>"/dev/tcp/127.0.0.1/$sb_port"; } 2>/dev/null || return 0
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
  IFS= read -r -d '' answer <&3 || true
  exec 3<&-
  printf '%s' "$answer"
}

# start_sandbox ARGS...: starts the sandbox on a free port; sets sb_pid, sb_port.
start_sandbox() {
  sb_port=$(free_port 18025)
  "$ctl" sandbox --addr "127.0.0.1:$sb_port" "$@" 2>"$work/sandbox.$sb_port.err" &
  sb_pid=$!
  wait_port 127.0.0.1 "$sb_port" || { echo "the sandbox did not start; see $work/sandbox.$sb_port.err" >&2; return 1; }
}

# pg_postmaster: the pid of the benchmark server's postmaster (the parent of its checkpointer); empty when
# it cannot be told (then every local server's processes are counted).
pg_postmaster() {
  local ck
  ck=$(psql_bench -Atc "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'" 2>/dev/null) || return 0
  [ -n "$ck" ] && awk '{ sub(/^.*\) /, ""); print $2 }' "/proc/$ck/stat" 2>/dev/null || true
}
bench_pm=$(pg_postmaster) # read once here: bench_pg_pids runs in subshells

# bench_pg_pids: the Postgres processes that work for the benchmark: the server's own (postmaster, WAL
# writer, checkpointer, background writer, autovacuum launcher) and the backends and autovacuum workers of
# BENCH_DB, not those of other databases on a shared server (a test run's would inflate the figures).
# Only the processes of the server DATABASE_URL names: another cluster on the machine is not counted.
bench_pg_pids() {
  local p cmd pp
  for p in $(pgrep -x postgres); do
    if [ -n "$bench_pm" ] && [ "$p" != "$bench_pm" ]; then
      pp=$(awk '{ sub(/^.*\) /, ""); print $2 }' "/proc/$p/stat" 2>/dev/null) || continue
      [ "$pp" = "$bench_pm" ] || continue
    fi
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
      *" $BENCH_DB "* | *" $BENCH_DB") echo "$p" ;;
      *"/bin/postgres "* | *": checkpointer"* | *": background writer"* | *": walwriter"* | \
        *": autovacuum launcher"* | *": logical replication launcher"* | *": archiver"*) echo "$p" ;;
    esac
  done
}

# pg_kind_ticks: "pid kind ticks" of each of bench_pg_pids by what it does (backend, autovacuum worker,
# WAL writer, checkpointer, background writer, postmaster), and "reaped exited ticks": the CPU of the
# postmaster's children that have exited (an autovacuum worker that finished its table, a backend that
# disconnected), which no live process carries any more.
pg_kind_ticks() {
  local p cmd kind
  for p in $(bench_pg_pids); do
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
      *"autovacuum worker"*) kind=autovacuum ;;
      *": walwriter"*) kind=walwriter ;;
      *": checkpointer"*) kind=checkpointer ;;
      *": background writer"*) kind=bgwriter ;;
      *": autovacuum launcher"* | *": logical replication launcher"* | *": archiver"*) kind=other ;;
      *"/bin/postgres "*)
        kind=postmaster
        awk '{ sub(/^.*\) /, ""); print "reaped exited", $14 + $15 }' "/proc/$p/stat" 2>/dev/null || true ;;
      *) kind=backends ;;
    esac
    awk -v p="$p" -v k="$kind" '{ sub(/^.*\) /, ""); print p, k, $12 + $13 }' "/proc/$p/stat" 2>/dev/null || true
  done
}
# pg_kinds BEFORE_FILE: Postgres CPU seconds since BEFORE_FILE (pg_kind_ticks) by kind of process.
pg_kinds() {
  pg_kind_ticks | awk -v hz="$(getconf CLK_TCK)" 'NR == FNR { b[$1] = $3; next }
    { d[$2] += $3 - b[$1] } END { s = ""; for (k in d) s = s sprintf("%s%s %.2f", s == "" ? "" : ", ", k, d[k] / hz); print s }' "$1" -
}

# pg_db_stats: the benchmark database's counters (pg_stat_database), one line: commits, blocks read, blocks
# hit, rows returned, fetched, inserted, updated; then the server's (pg_stat_bgwriter, pg_stat_wal): buffers
# written by backends themselves (to make room: shared_buffers too small for what is being written), by the
# background writer, by checkpoints, WAL bytes and full-page images. pg_db_delta BEFORE_FILE N: what they
# grew by since, per N.
pg_db_stats() {
  psql_bench -Atc "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1 || true
  psql_bench -AtF' ' -c "SELECT d.xact_commit, d.blks_read, d.blks_hit, d.tup_returned, d.tup_fetched, d.tup_inserted, d.tup_updated,
      b.buffers_backend, b.buffers_clean, b.buffers_checkpoint, w.wal_bytes, w.wal_fpi
    FROM pg_stat_database d, pg_stat_bgwriter b, pg_stat_wal w WHERE d.datname = current_database()"
}
pg_db_delta() {
  # Backends report their counters at most once a second: wait for the last ones.
  sleep 1.2
  pg_db_stats | awk -v n="$2" 'NR == FNR { for (i = 1; i <= NF; i++) b[i] = $i; next }
    { if (n <= 0) n = 1; printf "commits %.2f, blocks read %.2f, hit %.1f, rows returned %.1f, fetched %.1f, inserted %.2f, updated %.2f; buffers written by backends %.3f, the background writer %.3f, checkpoints %.3f; WAL %.0f B, full-page images %.3f",
        ($1 - b[1]) / n, ($2 - b[2]) / n, ($3 - b[3]) / n, ($4 - b[4]) / n, ($5 - b[5]) / n, ($6 - b[6]) / n, ($7 - b[7]) / n,
        ($8 - b[8]) / n, ($9 - b[9]) / n, ($10 - b[10]) / n, ($11 - b[11]) / n, ($12 - b[12]) / n }' "$1" -
}

# machine_ticks: the machine's busy CPU ticks (user, nice, system, irq, softirq of /proc/stat), all cores.
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
# machine_used BEFORE: the machine's busy CPU seconds since machine_ticks printed BEFORE.
machine_used() { awk -v b="$1" -v a="$(machine_ticks)" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (a - b) / hz }'; }

# cpu_ticks PID...: "pid ticks" (user + system, in clock ticks) of each process still alive.
cpu_ticks() {
  local p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && awk -v p="$p" '{ sub(/^.*\) /, ""); print p, $12 + $13 }' "/proc/$p/stat" 2>/dev/null
  done
  return 0
}
# cpu_used BEFORE_FILE PIDS...: CPU seconds the processes used since BEFORE_FILE was written (a process
# that started since counts from zero).
cpu_used() {
  local before=$1; shift
  cpu_ticks "$@" | awk -v hz="$(getconf CLK_TCK)" 'NR == FNR { b[$1] = $2; next } { s += $2 - b[$1] } END { printf "%.2f", s / hz }' "$before" -
}

stop_pids() {
  local p
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# audience_sql FILE CHANNEL OFFSET N: N eligible customers from the OFFSET-th eligible one on.
# SMS: customers whose k % 4 <> 0 (MESAJ ONAY in consents.sql). E-mail: k % 5 <> 0 (EPOSTA ONAY on
# musteri<k>@example.com, which exists for k <= consents - customers).
audience_sql() {
  local file=$1 channel=$2 offset=$3 n=$4
  if [ "$channel" = sms ]; then
    cat >"$file" <<EOF
SELECT user_id, phone, first_name FROM customers
WHERE substr(user_id, 2)::int % 4 <> 0
ORDER BY user_id OFFSET $offset LIMIT $n
EOF
  else
    cat >"$file" <<EOF
SELECT user_id, 'musteri' || substr(user_id, 2)::int || '@example.com' AS email, first_name FROM customers
WHERE substr(user_id, 2)::int % 5 <> 0
ORDER BY user_id OFFSET $offset LIMIT $n
EOF
  fi
}

# accept_span STATS_JSON: "seconds rate" from the sandbox's first to its last acceptance (/_sandbox/stats).
accept_span() {
  jq -r '((.last_accepted_at | sub("\\.[0-9]+"; "") | fromdateiso8601) as $l0 |
      (.first_accepted_at | sub("\\.[0-9]+"; "") | fromdateiso8601) as $f0 |
      def frac(t): (t | capture("\\.(?<f>[0-9]+)").f // "0" | ("0." + .) | tonumber);
      ($l0 + frac(.last_accepted_at)) - ($f0 + frac(.first_accepted_at))) as $span |
      "\($span) \(if $span > 0 then .accepted / $span else 0 end)"' <<<"$1"
}

# send_scenario NAME CHANNEL OFFSET N WORKERS CONCURRENCY RATE SANDBOX_ARGS...
# RATE is the provider cap (TWILIO_RATE / SENDGRID_RATE; 0 = none). Sets s_ok, s_rate, s_secs, s_dups,
# s_rss (max worker VmHWM MB), s_redis (bytes per planned recipient), s_planned, s_sent, s_id, and writes
# the sandbox's timeline to $work/NAME.timeline.json. SEND_DURING names a function run in the background
# from the start of the workers (it may act on the sandbox at $sb_port). SEND_MESSAGE replaces the SMS text
# (the default is two UCS-2 segments: under TWILIO_RATE, which counts segments, half as many messages go).
send_scenario() {
  local name=$1 channel=$2 offset=$3 n=$4 workers=$5 conc=$6 rate=$7; shift 7
  s_ok=0 s_rate=0 s_secs=0 s_dups='?' s_rss=0 s_redis=0 s_planned=0 s_sent=0
  audience_sql "$work/$name.sql" "$channel" "$offset" "$n"
  local sb_extra=()
  if [ "${PROFILE:-0}" = 1 ]; then sb_extra=(--pprof-addr "127.0.0.1:$(free_port 16160)"); fi
  start_sandbox "$@" "${sb_extra[@]}" || return 1
  if [ ${#sb_extra[@]} -gt 0 ]; then
    (sleep 3; curl -fsS -o "$work/$name.sandbox.pprof" "http://${sb_extra[1]}/debug/pprof/profile?seconds=10" 2>/dev/null || true) &
  fi
  # The workers are configured as for receipts in production: each SMS carries its status callback (the
  # webhooks' public address, naming the message's campaign and user) and each e-mail its custom_args. The
  # sandbox posts callbacks only to loopback hosts, so none is delivered: the run measures the sends.
  local env=(SENDER_IDENTITY="Kampanya A.Ş."
    TWILIO_ACCOUNT_SID=ACbench0000000000000000000000000 TWILIO_AUTH_TOKEN=benchtoken TWILIO_FROM=+905550000000
    TWILIO_BASE_URL="http://127.0.0.1:$sb_port" TWILIO_RATE="$rate" TWILIO_STATUS_CALLBACK=https://hooks.example.com/twilio/status
    SENDGRID_API_KEY=SG.bench-key SENDGRID_FROM=kampanya@example.com SENDGRID_BASE_URL="http://127.0.0.1:$sb_port"
    SENDGRID_RATE="$rate"
    WEBHOOKS_PUBLIC_URL=https://hooks.example.com UNSUBSCRIBE_SECRET=bench-unsubscribe-secret-0123456789)
  local args=(launch --name "$name-$(date +%H%M%S)" --channel "$channel" --audience "$work/$name.sql" --code-pool send --yes --json)
  if [ "$channel" = sms ]; then
    # The default in a variable: a "}" of the template inside ${SEND_MESSAGE:-...} would end the expansion.
    local msg='Merhaba {{.first_name}}, kodunuz {{.code}} - Kampanya A.Ş. RET yazıp 3338e gönderin'
    args+=(--message "${SEND_MESSAGE:-$msg}")
  else
    printf '<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b></p>' >"$work/$name.html"
    args+=(--subject '{{.first_name}}, size özel bir kod' --message 'Merhaba {{.first_name}}, kodunuz {{.code}}' --html "$work/$name.html")
  fi
  # Each scenario starts with no pace learned by the one before (a provider's pace outlives a campaign).
  rcli -n "$REDIS_DB" --scan --pattern 'pace:*' | while read -r k; do rcli -n "$REDIS_DB" DEL "$k" >/dev/null; done
  local base
  base=$(redis_used)
  if ! env "${env[@]}" "${run_ctl:-$ctl}" "${args[@]}" >"$work/$name.launch.out" 2>"$work/$name.launch.err"; then
    echo "--- $name: launch failed; last lines of its stderr:" >&2; tail -n 5 "$work/$name.launch.err" >&2
    stop_pids "$sb_pid"; return 1
  fi
  local id
  id=$(jq -r '.id' "$work/$name.launch.out")
  s_planned=$(jq -r '.eligible' "$work/$name.launch.out")

  local pg_pids redis_pid
  pg_pids=$(bench_pg_pids | tr '\n' ' ')
  redis_pid=$(pgrep -x redis-server | tr '\n' ' ' || true)
  cpu_ticks $pg_pids >"$work/$name.cpu.pg"
  pg_kind_ticks >"$work/$name.cpu.pgkinds"
  pg_db_stats >"$work/$name.pgstat"
  cpu_ticks $redis_pid >"$work/$name.cpu.redis"
  cpu_ticks "$sb_pid" >"$work/$name.cpu.sandbox"
  local m_before
  m_before=$(machine_ticks)
  local wpids=() i
  for i in $(seq 1 "$workers"); do
    local extra=()
    if [ "$i" = 1 ] && [ "${PROFILE:-0}" = 1 ]; then extra=(--pprof-addr "127.0.0.1:$(free_port 16060)"); fi
    env "${env[@]}" "${run_ctl:-$ctl}" worker --concurrency "$conc" "${extra[@]}" 2>"$work/$name.worker$i.err" &
    wpids+=($!)
    if [ ${#extra[@]} -gt 0 ]; then
      # A CPU profile of the first worker, from its second second on, for up to 10 s.
      (sleep 2; curl -fsS -o "$work/$name.worker1.pprof" "http://${extra[1]}/debug/pprof/profile?seconds=10" 2>/dev/null || true) &
    fi
  done
  local t_start=$EPOCHREALTIME
  local during_pid=""
  if [ -n "${SEND_DURING:-}" ]; then
    # Something the scenario does to the provider while the campaign runs (an outage, say).
    "$SEND_DURING" &
    during_pid=$!
  fi
  # The harness must not take the cores it measures: one long-lived redis-cli samples the memory every
  # 200 ms (an awk keeps the highest), and the loop below asks the sandbox once a second with bash alone,
  # reads the count with a bash pattern, and asks Postgres only once everyone is accepted or every 5 s.
  # (Forking redis-cli, curl, jq and sed five times a second took 10-15 % of the two cores; a curl a
  # second, 1.5 %.)
  local peak_file="$work/$name.redis.peak"
  (rcli -r -1 -i 0.2 INFO memory 2>/dev/null |
    awk -F: '/^used_memory:/ { v = $2 + 0; if (v > m) { m = v; print m > f; close(f) } }' f="$peak_file") 2>/dev/null &
  local sampler=$!
  local peak=$base used deadline=$((SECONDS + SEND_TIMEOUT)) accepted=0 state="" polls=0 st
  local busy_from="" busy_to="" busy_t0="" busy_t1=""
  while [ $SECONDS -lt $deadline ]; do
    sleep 1
    st=$(sandbox_peek /_sandbox/stats)
    [[ $st =~ \"accepted\":[[:space:]]*([0-9]+) ]] && accepted=${BASH_REMATCH[1]}
    polls=$((polls + 1))
    # The machine's CPU from the first poll that sees acceptances to the one that sees them all: whether
    # the run was bound by the cores (all busy) or by waits (some idle).
    if [ "$accepted" -gt 0 ] && [ -z "$busy_from" ]; then busy_from=$(machine_ticks) busy_t0=$EPOCHREALTIME; fi
    if [ "$accepted" -ge "$s_planned" ] && [ -z "$busy_to" ]; then busy_to=$(machine_ticks) busy_t1=$EPOCHREALTIME; fi
    # Once everyone is accepted, or every few seconds (a campaign may complete with recipients failed).
    if [ "$accepted" -ge "$s_planned" ] || [ $((polls % 5)) = 0 ]; then
      state=$(psql_bench -Atc "SELECT state FROM campaigns WHERE id = $id")
      [ "$state" = completed ] && break
    fi
  done
  [ -z "$during_pid" ] || wait "$during_pid" 2>/dev/null || true
  pkill -P "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  used=$(cat "$peak_file" 2>/dev/null || echo 0); [ "${used:-0}" -le "$peak" ] || peak=$used
  s_id=$id
  used=$(redis_used); [ "${used:-0}" -le "$peak" ] || peak=$used
  echo "0 0" >"$work/$name.cpu.none"
  s_pg=$(cpu_used "$work/$name.cpu.pg" $(bench_pg_pids)) s_rd=$(cpu_used "$work/$name.cpu.redis" $redis_pid)
  s_wk=$(cpu_used "$work/$name.cpu.none" "${wpids[@]}") s_sb=$(cpu_used "$work/$name.cpu.sandbox" "$sb_pid")
  # Everything the machine ran but the sandbox: the engine and whatever else ran meanwhile (run_peer).
  s_machine=$(machine_used "$m_before")
  notes+=("$name: Postgres CPU by process (s): $(pg_kinds "$work/$name.cpu.pgkinds"); a planned recipient: $(pg_db_delta "$work/$name.pgstat" "$s_planned")")
  s_cpu="postgres $s_pg s, redis $s_rd s, workers $s_wk s, sandbox $s_sb s over $(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
  # CPU a planned recipient, µs: "postgres redis workers sandbox" (run_compare reads them too).
  s_us=$(awk -v n="$s_planned" -v pg="$s_pg" -v rd="$s_rd" -v wk="$s_wk" -v sb="$s_sb" \
    'BEGIN { if (n > 0) printf "%.1f %.1f %.1f %.1f", pg * 1e6 / n, rd * 1e6 / n, wk * 1e6 / n, sb * 1e6 / n; else print "0 0 0 0" }')
  notes+=("$name: CPU used while the workers ran: $s_cpu; $(awk -v u="$s_us" 'BEGIN { split(u, v, " ")
    printf "µs a planned recipient: postgres %.0f, redis %.0f, workers %.0f (all in %.0f), sandbox %.0f", v[1], v[2], v[3], v[1] + v[2] + v[3], v[4] }')")
  if [ -n "$busy_to" ]; then
    # Whole polls a second apart: read only over a span of two seconds or more.
    local busy
    busy=$(awk -v a="$busy_from" -v b="$busy_to" -v t0="$busy_t0" -v t1="$busy_t1" -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" \
      'BEGIN { if (t1 - t0 >= 2) printf "%.0f %% of %d cores over %.1f s", (b - a) / hz / (t1 - t0) / n * 100, n, t1 - t0 }')
    [ -z "$busy" ] || notes+=("$name: the machine was busy $busy, from the first poll that saw acceptances to the one that saw them all (everything it ran, the sandbox too)")
  fi
  for i in "${!wpids[@]}"; do
    local hwm
    hwm=$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/${wpids[$i]}/status" 2>/dev/null || echo 0)
    [ "${hwm:-0}" -le "$s_rss" ] || s_rss=$hwm
  done
  stop_pids "${wpids[@]}"
  local prof
  for prof in worker1 sandbox; do
    if [ -s "$work/$name.$prof.pprof" ]; then
      mkdir -p "$work/profiles"; cp "$work/$name.$prof.pprof" "$work/profiles/"
      said+=("$name: CPU profile of the $prof: $work/profiles/$name.$prof.pprof (go tool pprof -top bin/campaignctl FILE)")
      KEEP_WORK=1
    fi
  done
  local st
  st=$(sandbox_get /_sandbox/stats)
  echo "$st" >"$work/$name.stats.json"
  if [ -n "${SEND_HISTOGRAM:-}" ]; then
    # Acceptances per whole second (unix seconds), for the rate-kept scenario.
    sandbox_get /_sandbox/messages | jq -r '.[].at | sub("\\.[0-9]+"; "") | fromdateiso8601' | sort | uniq -c |
      awk '{ print $2, $1 }' >"$work/$name.seconds"
  fi
  # Per second, what became of the provider requests (the pushback scenarios read it).
  sandbox_get "/_sandbox/timeline?api=${SEND_TIMELINE_API:-twilio,sendgrid}" >"$work/$name.timeline.json" || true
  stop_pids "$sb_pid"
  s_dups=$(jq -r '.duplicates' <<<"$st")
  s_sent=$(psql_bench -Atc "SELECT count(*) FROM campaign_recipients WHERE campaign_id = $id AND status = 'sent'")
  read -r s_secs s_rate < <(accept_span "$st")
  s_redis=$(awk -v p="$peak" -v b="$base" -v n="$s_planned" 'BEGIN { if (n > 0) printf "%.0f", (p - b) / n; else print 0 }')
  if [ "$state" != completed ]; then
    notes+=("$name: campaign $id not completed within $SEND_TIMEOUT s ($accepted of $s_planned accepted); worker logs in $work")
    KEEP_WORK=1
    return 1
  fi
  [ "$s_sent" = "$s_planned" ] || notes+=("$name: $s_sent of $s_planned recipients sent")
  s_ok=1
}

fmt_rate() { awk -v r="$1" 'BEGIN { printf "%.0f", r }' | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# settle_db: VACUUM ANALYZE and CHECKPOINT the benchmark database before the send scenarios (not timed).
# The setup has just written millions of rows (the consent import and its history, the customers, the codes,
# the launch benchmark's recipients): left alone, autovacuum reads them during the first scenario, and its
# CPU would be counted as the send's and take a share of the two cores from it. The send's own autovacuum
# (of the rows the scenario updates) still runs and is counted.
settle_db() {
  local t0=$EPOCHREALTIME
  psql_bench -qc "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
  setup+=("database settled before the send scenarios (VACUUM ANALYZE, CHECKPOINT) in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s, so that the setup's autovacuum does not run during them")
}

run_send_scenarios() {
  say "send scenarios: codes for them (not timed)"
  local total=$((SMS_N + EMAIL_N + LAT_N + RATE_R * RATE_SECS + PUSHBACK_N))
  "$ctl" codes generate --pool send --count "$total" >/dev/null
  # The launch benchmark's campaign is not sent: its tasks go, and it is cancelled in Postgres.
  rcli -n "$REDIS_DB" FLUSHDB >/dev/null
  psql_bench -qc "UPDATE campaigns SET state = 'cancelled'" >/dev/null
  settle_db

  say "loopback HTTP ceiling (one process, 32 connections, 5 s)"
  go build -o "$work/loopback" ./scripts/bench/loopback
  local ceiling
  ceiling=$("$work/loopback" -duration 5s -concurrency 32 | cut -d' ' -f1)
  setup+=("loopback HTTP ceiling: $(fmt_rate "$ceiling") requests/s (client and server in one process, 32 keep-alive connections, Twilio-shaped form POST and JSON 201)")

  local off_sms=0
  if want sms; then
  say "SMS: $SMS_N recipients, $SEND_WORKERS workers × --concurrency $SEND_CONC, no cap, no latency"
  if send_scenario sms sms "$off_sms" "$SMS_N" "$SEND_WORKERS" "$SEND_CONC" 0; then
    # The targets: at least listmonk's rate on this machine kind (15,800 msg/s, the faster of its
    # configurations side by side), never below 12,000, and at least 0.45 of the loopback ceiling measured
    # in the same run; 0 duplicates. The CPU a message all in (workers, Postgres and Redis): at most 70 µs.
    local met="no" need ratio allin
    need=$(awk -v c="$ceiling" 'BEGIN { print 0.45 * c }')
    ratio=$(awk -v r="$s_rate" -v c="$ceiling" 'BEGIN { printf "%.2f", r / c }')
    allin=$(awk -v u="$s_us" 'BEGIN { split(u, v, " "); printf "%.0f", v[1] + v[2] + v[3] }')
    if ge "$s_rate" 15800 && ge "$s_rate" "$need" && [ "$s_dups" = 0 ]; then met="yes"
    elif ge "$s_rate" 12000 && ge "$s_rate" "$need" && [ "$s_dups" = 0 ]; then met="above the floor, below listmonk's"; fi
    rows+=("SMS end to end ($SEND_WORKERS workers × $SEND_CONC)|$(fmt_n "$s_planned") recipients|$(printf %.2f "$s_secs")|$s_rss|≥ 15,800 msg/s (listmonk's here), never < 12,000; ≥ 0.45 of the loopback ceiling; 0 duplicates|$met: $(fmt_rate "$s_rate") msg/s ($ratio of the loopback ceiling; 0.45 = $(fmt_rate "$need")), $s_dups duplicates")
    rows+=("CPU an SMS, all in (workers, Postgres, Redis)|$(fmt_n "$s_planned") recipients|—|—|≤ 70 µs|$(if [ "$allin" -le 70 ]; then echo yes; else echo no; fi): $allin µs ($(awk -v u="$s_us" 'BEGIN { split(u, v, " "); printf "workers %.0f, Postgres %.0f, Redis %.0f; the sandbox %.0f besides", v[3], v[1], v[2], v[4] }'))")
    rows+=("worker RSS at full speed (SMS)|$SEND_WORKERS workers|—|$s_rss|≤ 100 MB each|$(if [ "$s_rss" -le 100 ]; then echo yes; else echo no; fi)")
    rows+=("Redis memory per planned recipient (SMS)|$(fmt_n "$s_planned") recipients|—|—|≤ 160 B|$(if [ "$s_redis" -le 160 ]; then echo yes; else echo no; fi): $s_redis B")
  else
    rows+=("SMS end to end|$(fmt_n "$SMS_N") recipients|—|—|≥ 15,800 msg/s, ≥ 0.45 of the loopback ceiling|failed (see notes)")
  fi
  fi

  if want email; then
  say "e-mail: $EMAIL_N recipients, $SEND_WORKERS workers × --concurrency $SEND_CONC, no cap, no latency"
  if send_scenario email email 0 "$EMAIL_N" "$SEND_WORKERS" "$SEND_CONC" 0; then
    local met="no"
    if ge "$s_rate" 50000 && [ "$s_dups" = 0 ]; then met="yes"; fi
    local reqs
    reqs=$(jq -r '.requests' "$work/email.stats.json")
    rows+=("e-mail end to end ($SEND_WORKERS workers × $SEND_CONC)|$(fmt_n "$s_planned") recipients, $(fmt_n "$reqs") requests|$(printf %.2f "$s_secs")|$s_rss|≥ 50,000 msg/s, 0 duplicates|$met: $(fmt_rate "$s_rate") msg/s, $s_dups duplicates")
  else
    rows+=("e-mail end to end|$(fmt_n "$EMAIL_N") recipients|—|—|≥ 50,000 msg/s|failed (see notes)")
  fi
  fi

  local off_lat=$((off_sms + SMS_N))
  local lat_ms=20 ideal
  ideal=$(awk -v w="$SEND_WORKERS" -v c="$LAT_CONC" -v l="$lat_ms" 'BEGIN { print w * c * 1000 / l }')
  if want latency; then
  say "SMS with ${lat_ms} ms provider latency: $LAT_N recipients, $SEND_WORKERS workers × --concurrency $LAT_CONC"
  if send_scenario latency sms "$off_lat" "$LAT_N" "$SEND_WORKERS" "$LAT_CONC" 0 --latency "${lat_ms}ms"; then
    local ratio met
    ratio=$(awk -v r="$s_rate" -v i="$ideal" 'BEGIN { printf "%.2f", r / i }')
    met=$(if ge "$ratio" 0.9 && [ "$s_dups" = 0 ]; then echo yes; else echo no; fi)
    rows+=("SMS, ${lat_ms} ms provider latency ($SEND_WORKERS workers × $LAT_CONC)|$(fmt_n "$s_planned") recipients|$(printf %.2f "$s_secs")|$s_rss|≥ 0.9 of workers × concurrency / latency = $(fmt_rate "$ideal") msg/s|$met: $(fmt_rate "$s_rate") msg/s ($ratio)")
  else
    rows+=("SMS, ${lat_ms} ms latency|$(fmt_n "$LAT_N") recipients|—|—|limited by --concurrency|failed (see notes)")
  fi
  fi

  local off_rate=$((off_lat + LAT_N)) rn=$((RATE_R * RATE_SECS))
  if want rate; then
  say "SMS at a cap of $RATE_R/s over 3 workers: $rn recipients"
  # One segment a message (UCS-2, under 70 characters): the cap is R messages a second for the campaign
  # and R segments for Twilio (TWILIO_RATE counts segments), the same only when each message is one.
  if SEND_HISTOGRAM=1 SEND_MESSAGE='Kampanya A.Ş.: {{.first_name}}, kodunuz {{.code}}. RET yazıp 3338e gönderin' \
    send_scenario rate sms "$off_rate" "$rn" 3 "$SEND_CONC" "$RATE_R"; then
    # Whole seconds only: the first and last are partial.
    local max mean
    read -r max mean < <(sed '1d;$d' "$work/rate.seconds" |
      awk '{ n++; s += $2; if ($2 > m) m = $2 } END { printf "%d %.0f\n", m, n ? s / n : 0 }')
    local met=no
    if awk -v m="$max" -v a="$mean" -v r="$RATE_R" 'BEGIN { exit !(m <= 1.1 * r && a >= 0.95 * r) }' && [ "$s_dups" = 0 ]; then met=yes; fi
    rows+=("rate kept: cap R = $RATE_R/s over 3 workers|$(fmt_n "$s_planned") recipients|$(printf %.2f "$s_secs")|$s_rss|no second > 1.1 R, mean ≥ 0.95 R|$met: busiest second $max, mean of whole seconds $mean")
    notes+=("rate kept, acceptances per second: $(awk '{ print $2 }' "$work/rate.seconds" | paste -sd ' ' -)")
  else
    rows+=("rate kept|$(fmt_n "$rn") recipients|—|—|≤ 1.1 R, ≥ 0.95 R|failed (see notes)")
  fi
  fi

  . scripts/bench/pushback.sh
  run_pushback_scenarios $((off_rate + rn))
}

# want NAME: whether the send scenario NAME is in --scenarios.
want() { [[ ",$SCENARIOS," == *",$1,"* ]]; }

# run_compare: the SMS scenario for this checkout and for COMPARE_REV (built into $rev_ctl), alternating,
# COMPARE_ROUNDS times each, on the same sandbox binary (this checkout's), so that what moves between the
# two is the engine alone. The machine's speed drifts from run to run on a shared virtual machine (the
# same binary measured 10-25 % apart within minutes); CPU per message is the steadier figure, and the
# workers' CPU over the sandbox's (which does the same work a message in both) steadier still.
run_compare() {
  say "compare: SMS, $SMS_N recipients a run, $COMPARE_ROUNDS rounds of HEAD ($commit) and $COMPARE_REV, alternating"
  "$ctl" codes generate --pool send --count $((SMS_N * COMPARE_ROUNDS * 2)) >/dev/null
  rcli -n "$REDIS_DB" FLUSHDB >/dev/null
  psql_bench -qc "UPDATE campaigns SET state = 'cancelled'" >/dev/null
  settle_db
  local off=0 r side bin label out="$work/compare.runs"
  : >"$out"
  for r in $(seq 1 "$COMPARE_ROUNDS"); do
    for side in head rev; do
      if [ "$side" = head ]; then bin=$ctl label="HEAD ($commit)"; else bin=$rev_ctl label="$COMPARE_REV ($rev_commit)"; fi
      if run_ctl=$bin send_scenario "cmp-$side-$r" sms "$off" "$SMS_N" "$SEND_WORKERS" "$SEND_CONC" 0 && [ "$s_dups" = 0 ]; then
        # side rate pg redis workers sandbox (µs a message) rss
        printf '%s %.0f %s %d\n' "$side" "$s_rate" "$s_us" "$s_rss" >>"$out"
        notes+=("compare, round $r, $label: $(fmt_rate "$s_rate") msg/s; $s_cpu")
      else
        notes+=("compare, round $r, $label: failed ($s_dups duplicates; worker logs in $work)")
        KEEP_WORK=1
      fi
      off=$((off + SMS_N))
    done
  done
  for side in head rev; do
    if [ "$side" = head ]; then label="HEAD ($commit)"; else label="$COMPARE_REV ($rev_commit)"; fi
    # Medians of the runs: msg/s, µs a message of Postgres, Redis, the workers and the sandbox, all in, and
    # the workers over the sandbox.
    local m
    m=$(awk -v s="$side" '$1 == s { n++; for (i = 2; i <= 7; i++) v[i, n] = $i; ratio[n] = ($6 > 0 ? $5 / $6 : 0); all[n] = $3 + $4 + $5 }
      function med(a, n,   i, j, t, b) { for (i = 1; i <= n; i++) b[i] = a[i]; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
        return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2 }
      END { if (!n) { print "-"; exit } for (i = 2; i <= 7; i++) { for (k = 1; k <= n; k++) c[k] = v[i, k]; m[i] = med(c, n) }
        printf "%d|%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|%.2f|%d\n", n, m[2], m[3], m[4], m[5], med(all, n), m[6], med(ratio, n), m[7] }' "$out")
    if [ "$m" = - ]; then
      rows+=("compare: SMS, $label|$(fmt_n "$SMS_N") recipients a run|—|—|—|failed (see notes)")
      continue
    fi
    IFS='|' read -r cn crate cpg crd cwk call csb cratio crss <<<"$m"
    rows+=("compare: SMS, $label, median of $cn|$(fmt_n "$SMS_N") recipients a run|—|$crss|side by side|$(fmt_rate "$crate") msg/s; µs a message: Postgres $cpg, Redis $crd, workers $cwk (all in $call), sandbox $csb; workers / sandbox $cratio")
  done
}

# run_peer: the SMS scenario and another sender (PEER_CMD, see bench.sh's --peer), alternating,
# COMPARE_ROUNDS times each, against the same sandbox binary. The peer sends through the sandbox's POST
# /postback; its rate is taken the same way (from the sandbox's first to its last acceptance), and so is its
# Postgres (the server's processes and the backends of its database). Its own CPU is the machine's less the
# sandbox's, Postgres's and Redis's over its `send`; the same machine-wide figure is given for campaignctl
# ("all but the sandbox"), so that what the two cost the machine is compared on the same terms.
run_peer() {
  local peer_db="${BENCH_DB}_peer" out="$work/peer.runs" r off=0
  say "peer: SMS, $SMS_N recipients a run, $COMPARE_ROUNDS rounds of HEAD ($commit) and '$PEER_CMD', alternating"
  "$ctl" codes generate --pool send --count $((SMS_N * COMPARE_ROUNDS)) >/dev/null
  rcli -n "$REDIS_DB" FLUSHDB >/dev/null
  psql_bench -qc "UPDATE campaigns SET state = 'cancelled'" >/dev/null
  settle_db
  : >"$out"
  for r in $(seq 1 "$COMPARE_ROUNDS"); do
    if send_scenario "peer-head-$r" sms "$off" "$SMS_N" "$SEND_WORKERS" "$SEND_CONC" 0 && [ "$s_dups" = 0 ]; then
      # side rate µs-a-message: postgres redis engine sandbox all-but-sandbox; rss
      printf 'head %.0f %s %s %d\n' "$s_rate" "$s_us" \
        "$(awk -v m="$s_machine" -v sb="$s_sb" -v n="$s_planned" 'BEGIN { printf "%.1f", (m - sb) * 1e6 / n }')" "$s_rss" >>"$out"
      notes+=("peer, round $r, HEAD ($commit): $(fmt_rate "$s_rate") msg/s; $s_cpu; the machine $s_machine s")
    else
      notes+=("peer, round $r, HEAD ($commit): failed ($s_dups duplicates; worker logs in $work)")
      KEEP_WORK=1
    fi
    off=$((off + SMS_N))
    if peer_round "peer-$r" "$peer_db"; then
      printf 'peer %.0f %s %s %d\n' "$s_rate" "$s_us" "$s_rest" "$s_rss" >>"$out"
      notes+=("peer, round $r, '$PEER_CMD': $(fmt_rate "$s_rate") msg/s; $s_cpu")
    else
      notes+=("peer, round $r, '$PEER_CMD': failed ($s_dups duplicates, $s_sent of $SMS_N accepted; its output in $work/peer-$r.*)")
      KEEP_WORK=1
    fi
  done
  local side label m
  for side in head peer; do
    if [ "$side" = head ]; then label="campaignctl HEAD ($commit), $SEND_WORKERS workers × $SEND_CONC"; else label="peer '$PEER_CMD'"; fi
    m=$(awk -v s="$side" '$1 == s { n++; for (i = 2; i <= 8; i++) v[i, n] = $i }
      function med(a, n,   i, j, t, b) { for (i = 1; i <= n; i++) b[i] = a[i]; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
        return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2 }
      END { if (!n) { print "-"; exit } for (i = 2; i <= 8; i++) { for (k = 1; k <= n; k++) c[k] = v[i, k]; m[i] = med(c, n) }
        printf "%d|%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|%d\n", n, m[2], m[3], m[4], m[5], m[6], m[7], m[8] }' "$out")
    if [ "$m" = - ]; then
      rows+=("peer: SMS, $label|$(fmt_n "$SMS_N") recipients a run|—|—|—|failed (see notes)")
      continue
    fi
    local pn prate ppg prd peng psb prest prss
    IFS='|' read -r pn prate ppg prd peng psb prest prss <<<"$m"
    rows+=("peer: SMS, $label, median of $pn|$(fmt_n "$SMS_N") recipients a run|—|$prss|side by side|$(fmt_rate "$prate") msg/s; µs a message: Postgres $ppg, Redis $prd, the sender $peng; all but the sandbox $prest; sandbox $psb")
  done
}

# peer_round NAME DB: one run of PEER_CMD (prepare, then send measured, then stop) on a fresh sandbox and
# a fresh database DB. Sets s_rate, s_dups, s_sent, s_us ("postgres redis sender sandbox"), s_rest (µs a
# message of the machine but the sandbox), s_cpu, s_rss.
peer_round() {
  local name=$1 db=$2
  s_rate=0 s_dups='?' s_sent=0 s_us="0 0 0 0" s_rest=0 s_rss=0 s_cpu=""
  psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  psql_admin -c "CREATE DATABASE $db" >/dev/null
  start_sandbox || return 1
  local url="http://127.0.0.1:$sb_port/postback"
  if ! $PEER_CMD prepare "$SMS_N" "$db" "$url" >"$work/$name.prepare.out" 2>&1; then
    echo "--- $name: '$PEER_CMD prepare' failed; last lines:" >&2; tail -n 5 "$work/$name.prepare.out" >&2
    $PEER_CMD stop >/dev/null 2>&1 || true
    stop_pids "$sb_pid"
    return 1
  fi
  local pg_pids redis_pid m_before t_start rc=0
  pg_pids=$(BENCH_DB=$db bench_pg_pids | tr '\n' ' ')
  redis_pid=$(pgrep -x redis-server | tr '\n' ' ' || true)
  cpu_ticks $pg_pids >"$work/$name.cpu.pg"
  cpu_ticks $redis_pid >"$work/$name.cpu.redis"
  cpu_ticks "$sb_pid" >"$work/$name.cpu.sandbox"
  m_before=$(machine_ticks) t_start=$EPOCHREALTIME
  timeout "$SEND_TIMEOUT" $PEER_CMD send "$SMS_N" "$url" >"$work/$name.send.out" 2>&1 || rc=$?
  local m pg rd sb secs
  m=$(machine_used "$m_before")
  secs=$(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  pg=$(cpu_used "$work/$name.cpu.pg" $(BENCH_DB=$db bench_pg_pids)) rd=$(cpu_used "$work/$name.cpu.redis" $redis_pid)
  sb=$(cpu_used "$work/$name.cpu.sandbox" "$sb_pid")
  # MB, whole or not ("353.4"): rounded to a whole MB.
  s_rss=$($PEER_CMD stop 2>/dev/null | tail -n 1 | tr -dc '0-9.' | awk '{ printf "%d", $1 + 0.5 }')
  s_rss=${s_rss:-0}
  local st
  st=$(sandbox_get /_sandbox/stats)
  echo "$st" >"$work/$name.stats.json"
  stop_pids "$sb_pid"
  psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  s_dups=$(jq -r '.duplicates' <<<"$st") s_sent=$(jq -r '.accepted' <<<"$st")
  read -r _ s_rate < <(accept_span "$st")
  local sender
  sender=$(awk -v m="$m" -v pg="$pg" -v rd="$rd" -v sb="$sb" 'BEGIN { v = m - pg - rd - sb; printf "%.2f", v < 0 ? 0 : v }')
  s_us=$(awk -v n="$SMS_N" -v pg="$pg" -v rd="$rd" -v se="$sender" -v sb="$sb" 'BEGIN { printf "%.1f %.1f %.1f %.1f", pg * 1e6 / n, rd * 1e6 / n, se * 1e6 / n, sb * 1e6 / n }')
  s_rest=$(awk -v n="$SMS_N" -v m="$m" -v sb="$sb" 'BEGIN { printf "%.1f", (m - sb) * 1e6 / n }')
  s_cpu="postgres $pg s, redis $rd s, the sender (the machine less the others) $sender s, sandbox $sb s over $secs s; the machine $m s"
  [ "$rc" = 0 ] && [ "$s_dups" = 0 ] && [ "$s_sent" = "$SMS_N" ]
}
