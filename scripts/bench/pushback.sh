# Pushback scenarios of scripts/bench.sh (sourced after scripts/bench/send.sh; uses send_scenario and its
# helpers). Each reads the sandbox's timeline of the run ($work/NAME.timeline.json: per second, the
# requests, acceptances and refusals) and the campaign's status.
#   faults   15,000 SMS at --rate 1500 over 2 workers, with no fault, then with 5 % 503 + 2 % 429 (with
#            Retry-After: 1): ≥ 0.8 of the no-fault throughput, 0 duplicates
#   hidden   24,000 SMS, a hidden limit of 800/s (429 without Retry-After), no cap, 3 workers: the steady
#            rate ≥ 0.85 × 800, refused requests ≤ 5 % of all
#   outage   40,000 SMS at --rate 1000 over 2 workers, a 20 s hard outage (503) from 15 s after the workers
#            start: nobody failed or in the DLQ, sending back within 5 s of the provider's return

# status_of ID: the campaign's `status --json`.
status_of() { "$ctl" status "$1" --json; }

# timeline_seconds FILE: "unix_second requests accepted refused" per second of the timeline.
timeline_seconds() {
  jq -r '.seconds[] | "\(.second | sub("\\.[0-9]+"; "") | fromdateiso8601) \(.requests) \(.accepted) \(.refused)"' "$1"
}

# outage_during: 15 s after the workers start, a 20 s hard outage of Twilio (SEND_DURING of the outage
# scenario).
outage_during() {
  sleep 15
  curl -fsS -X POST -d '{"only":"twilio","mode":"503","duration_ms":20000}' "http://127.0.0.1:$sb_port/_sandbox/outages" >/dev/null
}

run_pushback_scenarios() {
  local off=$1
  # One segment (UCS-2, 68 characters with the longest name and code): the caps below are messages too.
  local SEND_MESSAGE='Kampanya A.Ş.: {{.first_name}}, kodunuz {{.code}}. RET yazıp 3338e gönderin'

  if want faults; then
    local fn=15000 base_rate=0
    say "pushback: $fn SMS at --rate 1500 over 2 workers, no fault (the reference)"
    if send_scenario faults-none sms "$off" "$fn" 2 "$SEND_CONC" 1500; then base_rate=$s_rate; fi
    off=$((off + fn))
    say "pushback: $fn SMS at --rate 1500 over 2 workers, 5 % 503 + 2 % 429 (Retry-After: 1)"
    if [ "$base_rate" != 0 ] && send_scenario faults sms "$off" "$fn" 2 "$SEND_CONC" 1500 --fail-503 0.05 --fail-429 0.02; then
      local ratio met=no st
      ratio=$(awk -v r="$s_rate" -v b="$base_rate" 'BEGIN { printf "%.2f", r / b }')
      st=$(status_of "$s_id")
      if ge "$ratio" 0.8 && [ "$s_dups" = 0 ] && [ "$(jq -r '.failed + .dlq' <<<"$st")" = 0 ]; then met=yes; fi
      rows+=("pushback: 5 % 503 + 2 % 429 at --rate 1500 (2 workers)|$(fmt_n "$s_planned") recipients|$(printf %.2f "$s_secs")|$s_rss|≥ 0.8 of the no-fault run, 0 duplicates|$met: $(fmt_rate "$s_rate") msg/s against $(fmt_rate "$base_rate") without faults ($ratio), $s_dups duplicates, $(jq -r '.failed' <<<"$st") failed, $(jq -r '.dlq' <<<"$st") in the DLQ")
      notes+=("faults: provider requests $(jq -r '.total.requests' "$work/faults.timeline.json"), refused by kind $(jq -c '.total.refused_by' "$work/faults.timeline.json")")
    else
      rows+=("pushback: 5 % 503 + 2 % 429 at --rate 1500|$(fmt_n "$fn") recipients|—|—|≥ 0.8 of the no-fault run|failed (see notes)")
    fi
    off=$((off + fn))
  fi

  if want hidden; then
    local hn=24000 limit=800
    say "pushback: $hn SMS, a hidden limit of $limit/s, no cap, 3 workers"
    if send_scenario hidden sms "$off" "$hn" 3 "$SEND_CONC" 0 --limit "twilio=$limit"; then
      # The steady rate: the whole seconds from the third to the one before the last (the campaign's
      # ramp and tail left out).
      local steady refused requests share met=no
      steady=$(timeline_seconds "$work/hidden.timeline.json" | sed '1,2d;$d' | sed '$d' |
        awk '{ n++; s += $3 } END { printf "%.0f", n ? s / n : 0 }')
      requests=$(jq -r '.total.requests' "$work/hidden.timeline.json")
      refused=$(jq -r '.total.refused' "$work/hidden.timeline.json")
      share=$(awk -v r="$refused" -v q="$requests" 'BEGIN { printf "%.1f", q ? 100 * r / q : 0 }')
      if ge "$steady" $((limit * 85 / 100)) && ge 5 "$share" && [ "$s_dups" = 0 ]; then met=yes; fi
      rows+=("pushback: hidden limit $limit/s, no cap (3 workers)|$(fmt_n "$s_planned") recipients, $(fmt_n "$requests") requests|$(printf %.2f "$s_secs")|$s_rss|steady ≥ $((limit * 85 / 100))/s, refused ≤ 5 %|$met: steady $steady/s, $refused refused ($share %), $s_dups duplicates")
      notes+=("hidden limit, accepted per second: $(timeline_seconds "$work/hidden.timeline.json" | awk '{ print $3 }' | paste -sd ' ' -); refused per second: $(timeline_seconds "$work/hidden.timeline.json" | awk '{ print $4 }' | paste -sd ' ' -)")
    else
      rows+=("pushback: hidden limit $limit/s|$(fmt_n "$hn") recipients|—|—|steady ≥ 0.85 × $limit/s, refused ≤ 5 %|failed (see notes)")
    fi
    off=$((off + hn))
  fi

  if want outage; then
    local on=40000
    say "pushback: $on SMS at --rate 1000 over 2 workers, a 20 s outage from 15 s in"
    if SEND_DURING=outage_during send_scenario outage sms "$off" "$on" 2 "$SEND_CONC" 1000; then
      local st start end before back resume met=no
      st=$(status_of "$s_id")
      start=$(jq -r '.outages[0].start | sub("\\.[0-9]+"; "") | fromdateiso8601' "$work/outage.timeline.json")
      end=$(jq -r '.outages[0].end | sub("\\.[0-9]+"; "") | fromdateiso8601' "$work/outage.timeline.json")
      # The pace before (the whole seconds from the third to the outage's), and the first second after
      # the outage that reaches half of it.
      before=$(timeline_seconds "$work/outage.timeline.json" | awk -v s="$start" 'NR > 2 && $1 < s { n++; a += $3 } END { printf "%.0f", n ? a / n : 0 }')
      back=$(timeline_seconds "$work/outage.timeline.json" | awk -v e="$end" -v b="$before" '$1 >= e && $3 >= b / 2 { print $1; exit }')
      resume=$(( ${back:-0} > 0 ? back - end : -1 ))
      if [ "$(jq -r '.failed + .dlq + .unknown' <<<"$st")" = 0 ] && [ "$s_dups" = 0 ] && [ "$resume" -ge 0 ] && [ "$resume" -le 5 ]; then met=yes; fi
      rows+=("pushback: 20 s outage mid-campaign at --rate 1000 (2 workers)|$(fmt_n "$s_planned") recipients|$(printf %.2f "$s_secs")|$s_rss|none failed or in the DLQ, back within 5 s|$met: $(jq -r '.failed' <<<"$st") failed, $(jq -r '.dlq' <<<"$st") in the DLQ, $(jq -r '.unknown' <<<"$st") unknown, $s_dups duplicates; $before/s before, back to half of it $resume s after the provider's return")
      notes+=("outage: $(jq -r '.outages[0].refused' "$work/outage.timeline.json") requests refused by the outage; requests per second: $(timeline_seconds "$work/outage.timeline.json" | awk '{ print $2 }' | paste -sd ' ' -)")
    else
      rows+=("pushback: 20 s outage mid-campaign|$(fmt_n "$on") recipients|—|—|none failed or in the DLQ, back within 5 s|failed (see notes)")
    fi
  fi
}
