package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

func redisFor(t *testing.T, env map[string]string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(env["REDIS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func loadCampaign(t *testing.T, db *pgxpool.Pool, id string) *campaign.Campaign {
	t.Helper()
	n, _ := strconv.ParseInt(id, 10, 64)
	c, err := campaign.NewStore(db).Get(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func statuses(t *testing.T, db *pgxpool.Pool, id string) map[string]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT user_id, status || coalesce('/' || reason, '') FROM campaign_recipients WHERE campaign_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var u, s string
		if err := rows.Scan(&u, &s); err != nil {
			t.Fatal(err)
		}
		out[u] = s
	}
	return out
}

// cancel: recipients nobody holds are skipped (cancelled) at once; a chunk left by a dead worker is closed
// from its claims (a = answered before the crash stays sent); the campaign is over for every command.
func TestCancel(t *testing.T) {
	t.Parallel()
	env, id, db, _ := opsEnv(t)
	ctx := context.Background()
	rdb := redisFor(t, env)
	c := loadCampaign(t, db, id)
	epoch, err := worker.Epoch(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	// A worker leased a and b, had a answered, and died.
	if _, err := campaign.NewStore(db).LeaseChunk(ctx, c, []string{"a", "b"},
		campaign.Lease{Token: "dead", Epoch: epoch, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, worker.ClaimKey(c.ID, "a"), worker.Nonce(c)+"/s|SMa|1", 0)
	time.Sleep(5 * time.Millisecond)

	out, stderr, code := cli(t, env, "cancel", id)
	if code != 0 || !strings.Contains(out, "cancelled (was running)") || !strings.Contains(out, "2 recipients skipped (cancelled)") {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, stderr)
	}
	// The batch runs that close the chunks are a worker's business: their log lines are for debug.
	if strings.Contains(stderr, "batch run") {
		t.Errorf("cancel printed the log of its batch runs:\n%s", stderr)
	}
	want := map[string]string{"a": "sent", "b": "skipped/cancelled", "c": "skipped/cancelled"}
	if got := statuses(t, db, id); len(got) != 3 || got["a"] != want["a"] || got["b"] != want["b"] || got["c"] != want["c"] {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if v, _ := rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != "cancelled" {
		t.Fatalf("halt mark %q, want cancelled", v)
	}
	// Cancelling again finishes what is left (nothing here) and says so.
	// What the first cancel did is said as that: "their codes back in pool" read as if the codes went back
	// again.
	if out, stderr, code := cli(t, env, "cancel", id); code != 0 || !strings.Contains(out, "cancelled already") ||
		!strings.Contains(out, "2 recipients skipped (cancelled) in all") || strings.Contains(out, "back in pool") {
		t.Errorf("cancel of a cancelled campaign: exit %d, %s%s; want 0, closing what is left, the first cancel's work said as that", code, out, stderr)
	}
	for _, args := range [][]string{{"resume", id}, {"pause", id}, {"cancel", "777"}} {
		if _, stderr, code := cli(t, env, args...); code != 2 || !(strings.Contains(stderr, "is cancelled") || strings.Contains(stderr, "no campaign has id 777")) {
			t.Errorf("%v: exit %d, %s; want exit 2 naming the state", args, code, stderr)
		}
	}
}

// Unknown recipients are reported and left alone by resume; --resend-unknown puts them back, unless their
// claim shows the provider had accepted (then the next run records sent, and nothing is resent). A
// completed campaign resumes only for that.
func TestResumeResendUnknown(t *testing.T) {
	t.Parallel()
	env, id, db, _ := opsEnv(t)
	ctx := context.Background()
	rdb := redisFor(t, env)
	c := loadCampaign(t, db, id)
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'c' THEN 'sent' ELSE 'unknown' END,
		updated_at = now() - interval '1 hour' WHERE campaign_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	n := worker.Nonce(c) + "/"
	rdb.Set(ctx, worker.ClaimKey(c.ID, "a"), n+"u|timeout after the request was written", 0)
	rdb.Set(ctx, worker.ClaimKey(c.ID, "b"), n+"s|SMb|1", 0)

	_, stderr, code := cli(t, env, "resume", id)
	if code != 2 || !strings.Contains(stderr, "is completed") || !strings.Contains(stderr, "2 recipients are unknown") || !strings.Contains(stderr, "--resend-unknown") {
		t.Fatalf("resume of a completed campaign: exit %d, %s", code, stderr)
	}
	out, stderr, code := cli(t, env, "resume", id, "--resend-unknown")
	if code != 0 || !strings.Contains(out, "2 unknown recipients will be sent again") || !strings.Contains(out, "is running again") {
		t.Fatalf("resume --resend-unknown: exit %d\n%s%s", code, out, stderr)
	}
	if got := statuses(t, db, id); got["a"] != "pending" || got["b"] != "pending" || got["c"] != "sent" {
		t.Fatalf("statuses %v", got)
	}
	if rdb.Exists(ctx, worker.ClaimKey(c.ID, "a")).Val() != 0 {
		t.Fatal("a's unknown claim was kept: it would be found unknown again")
	}
	if v := rdb.Get(ctx, worker.ClaimKey(c.ID, "b")).Val(); v != n+"s|SMb|1" {
		t.Fatalf("b's claim (provider accepted) = %q; it must be kept so that b is recorded sent, not resent", v)
	}
	if got := strings.Count(out, "batches re-enqueued"); got != 1 {
		t.Fatalf("resume output lacks its summary:\n%s", out)
	}
}

// A command about a campaign that does not exist is refused (exit 2) before it opens Redis: the first
// connection to a Redis without an epoch writes one, and a refused command writes nothing anywhere.
// Before, pause, resume, cancel and status of a missing campaign left campaignctl:epoch behind.
func TestACommandAboutNoCampaignWritesNothingToRedis(t *testing.T) {
	t.Parallel()
	env, _ := badInputEnv(t)
	rdb := redis.NewClient(mustParseRedisURL(t, env["REDIS_URL"]))
	defer rdb.Close()
	ctx := context.Background()
	for _, args := range [][]string{{"pause", "777"}, {"resume", "777"}, {"resume", "777", "--resend-unknown"}, {"cancel", "777"},
		{"status", "777"}, {"status", "777", "--json"}, {"status", "777", "--watch"}} {
		if _, stderr, code := cli(t, env, args...); code != 2 || !strings.Contains(stderr, "no campaign has id 777") {
			t.Errorf("%v: exit %d, %s; want 2 naming the missing campaign", args, code, stderr)
		}
		if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
			t.Fatalf("%v was refused, and Redis holds %v (%v); want nothing written", args, keys, err)
		}
	}
	// What a command that goes on writes, this test sees: the epoch of the first connection.
	if _, stderr, code := cli(t, env, "status"); code != 0 {
		t.Fatalf("status: exit %d, %s", code, stderr)
	}
	if n, err := rdb.Exists(ctx, worker.EpochKey).Result(); err != nil || n != 1 {
		t.Fatalf("status of every campaign left no epoch (%d, %v): the check above could not see a write", n, err)
	}
}

func mustParseRedisURL(t *testing.T, raw string) *redis.Options {
	t.Helper()
	opt, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	return opt
}
