package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// status --json says why a campaign does not move (here: no worker runs), with its times and reasons;
// with Redis down it still answers from Postgres and says so.
func TestStatusExplainsItselfAndAnswersWithoutRedis(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	out, stderr, code := cli(t, env, "launch", "--name", "w", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: exit %d %s", code, stderr)
	}
	var rep struct{ ID int64 }
	json.Unmarshal([]byte(out), &rep) //nolint:errcheck
	id := jsonNumber(rep.ID)
	var st struct {
		State     string `json:"state"`
		StartedAt string `json:"started_at"`
		Waiting   *struct {
			Reason, Detail, Since string
		} `json:"waiting"`
		SkippedByReason  map[string]int64 `json:"skipped_by_reason"`
		FailedByReason   map[string]int64 `json:"failed_by_reason"`
		RedisUnavailable bool             `json:"redis_unavailable"`
	}
	out, stderr, code = cli(t, env, "status", id, "--json")
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status: exit %d %s %s", code, out, stderr)
	}
	// No worker has run a batch of it: running, not started (started_at null).
	if st.Waiting == nil || st.Waiting.Reason != "no_worker" || !strings.Contains(st.Waiting.Detail, "campaignctl worker") || st.StartedAt != "" ||
		st.State != "running" || st.SkippedByReason == nil || st.FailedByReason == nil {
		t.Fatalf("status %s: want running, waiting no_worker naming the fix, started_at null until a worker runs a batch, reason maps", out)
	}
	if out, _, _ = cli(t, env, "status", id, "--tz", "UTC"); !strings.Contains(out, "waiting") || !strings.Contains(out, "no_worker") || !strings.Contains(out, "UTC") {
		t.Fatalf("status table: %s", out)
	}
	if _, stderr, code = cli(t, env, "status", id, "--tz", "Mars/Olympus"); code != 2 || !strings.Contains(stderr, "--tz") {
		t.Fatalf("status --tz Mars/Olympus: exit %d %s", code, stderr)
	}
	env["REDIS_URL"] = "redis://127.0.0.1:1/0"
	out, stderr, code = cli(t, env, "status", id, "--json")
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || !st.RedisUnavailable || st.State == "" {
		t.Fatalf("status with Redis down: exit %d %s %s; want the Postgres figures with redis_unavailable", code, out, stderr)
	}
	if !strings.Contains(stderr, "Redis is unreachable") {
		t.Fatalf("status with Redis down does not say so: %s", stderr)
	}
	// The DLQ is in Redis: unknown, not an all-clear 0.
	if !strings.Contains(out, `"dlq":null`) {
		t.Fatalf("status --json with Redis down: %s; want \"dlq\":null", out)
	}
	if out, _, _ = cli(t, env, "status", id); !strings.Contains(out, "dlq batches") || !strings.Contains(out, "unknown") {
		t.Fatalf("status table with Redis down: %s; want the DLQ unknown", out)
	}
}

func jsonNumber(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
