package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// opsEnv plans a campaign of 3 batches (one recipient each) and queues it.
func opsEnv(t *testing.T) (env map[string]string, id string, db *pgxpool.Pool, insp *asynq.Inspector) {
	t.Helper()
	env, id, db, insp = plannedEnv(t)
	if _, stderr, code := cli(t, env, "resume", id); code != 0 {
		t.Fatalf("resume: %s", stderr)
	}
	return env, id, db, insp
}

// plannedEnv plans a campaign of 3 batches (one recipient each), as a launch killed after its commit
// and before queueing would leave it.
func plannedEnv(t *testing.T) (env map[string]string, id string, db *pgxpool.Pool, insp *asynq.Inspector) {
	t.Helper()
	env, _ = badInputEnv(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
		Name: "ops", Channel: campaign.ChannelSMS, BatchSize: 1,
		AudienceSQL: "SELECT user_id, phone, first_name FROM customers", Message: "Merhaba {{.first_name}}",
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Batches != 3 {
		t.Fatalf("planned %d batches, want 3", rep.Batches)
	}
	id = strconv.FormatInt(rep.ID, 10)
	opt, _ := redis.ParseURL(env["REDIS_URL"])
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return env, id, db, asynq.NewInspectorFromRedisClient(rdb)
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	env, id, db, _ := opsEnv(t)
	state := func() string {
		var st string
		db.QueryRow(context.Background(), `SELECT state FROM campaigns WHERE id = $1`, id).Scan(&st) //nolint:errcheck
		return st
	}
	if out, stderr, code := cli(t, env, "pause", id); code != 0 || !strings.Contains(out, "paused (was running)") || state() != "paused" {
		t.Fatalf("pause: exit %d, %s%s, state %s", code, out, stderr, state())
	}
	// Pausing again is done already (a script that repeats it does not fail), and the halt is set again.
	rdb := redisFor(t, env)
	rdb.Del(context.Background(), worker.HaltKey(loadCampaign(t, db, id).ID))
	if out, stderr, code := cli(t, env, "pause", id); code != 0 || !strings.Contains(out, "is paused already") || state() != "paused" {
		t.Fatalf("pause of a paused campaign: exit %d, %s%s", code, out, stderr)
	}
	if v, _ := rdb.Get(context.Background(), worker.HaltKey(loadCampaign(t, db, id).ID)).Result(); v != "paused" {
		t.Fatalf("the repeated pause left the halt mark %q", v)
	}
	if out, stderr, code := cli(t, env, "resume", id); code != 0 || !strings.Contains(out, "is running again") || state() != "running" {
		t.Fatalf("resume: exit %d, %s%s, state %s", code, out, stderr, state())
	}
	if _, stderr, code := cli(t, env, "pause", "98765"); code != 2 || !strings.Contains(stderr, "no campaign has id 98765") {
		t.Fatalf("pause of an unknown campaign: exit %d, %s", code, stderr)
	}
}

func TestDLQListRetryPurge(t *testing.T) {
	t.Parallel()
	env, id, db, insp := opsEnv(t)
	for _, b := range []string{"0", "2"} {
		if err := insp.ArchiveTask(worker.Queue, id+":"+b); err != nil {
			t.Fatal(err)
		}
	}
	// --campaign 0 names no campaign (it listed every campaign's batches, as no --campaign does).
	for _, action := range []string{"list", "retry", "purge"} {
		if out, stderr, code := cli(t, env, "dlq", action, "--campaign", "0"); code != 2 || out != "" || !strings.Contains(stderr, "--campaign 0") {
			t.Fatalf("dlq %s --campaign 0: exit %d, %s%s; want exit 2 naming the flag", action, code, out, stderr)
		}
	}
	out, stderr, code := cli(t, env, "dlq", "list", "--campaign", id, "--json")
	var entries []worker.DLQEntry
	if code != 0 || json.Unmarshal([]byte(out), &entries) != nil {
		t.Fatalf("dlq list: exit %d, %s%s", code, out, stderr)
	}
	if len(entries) != 2 || entries[0].TaskID == entries[1].TaskID || strconv.FormatInt(entries[0].CampaignID, 10) != id {
		t.Fatalf("dlq list: %+v", entries)
	}
	if st, _, _ := cli(t, env, "status", id, "--json"); !strings.Contains(st, `"dlq":2`) {
		t.Fatalf("status does not count the DLQ: %s", st)
	}
	if out, stderr, code := cli(t, env, "dlq", "retry", "--campaign", id); code != 0 || !strings.Contains(out, "2 batches queued again") {
		t.Fatalf("dlq retry: exit %d, %s%s", code, out, stderr)
	}
	info, err := insp.GetQueueInfo(worker.Queue)
	if err != nil || info.Archived != 0 || info.Pending != 3 {
		t.Fatalf("after retry: %+v, %v; want 3 pending, 0 archived", info, err)
	}
	// An empty DLQ: nothing queued, and a note of where batches lost with Redis's data come back from.
	if out, stderr, code := cli(t, env, "dlq", "retry", "--campaign", id); code != 0 || !strings.Contains(out, "0 batches queued again") ||
		!strings.Contains(stderr, "the DLQ holds no batch of campaign "+id) || !strings.Contains(stderr, "campaignctl resume "+id) {
		t.Fatalf("dlq retry of an empty DLQ: exit %d, %s%s; want the resume named", code, out, stderr)
	}
	if err := insp.ArchiveTask(worker.Queue, id+":1"); err != nil {
		t.Fatal(err)
	}
	// A cancelled campaign's batches are not retried, and the refusal says why.
	if _, err := db.Exec(context.Background(), `UPDATE campaigns SET state = 'cancelled' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, env, "dlq", "retry", "--campaign", id); code != 2 || !strings.Contains(stderr, "the campaign is cancelled") {
		t.Fatalf("dlq retry of a cancelled campaign: exit %d, %s", code, stderr)
	}
	// dlq retry --json's report: nothing queued, batch 1 refused for its campaign's state.
	type retryReport struct {
		Queued  []worker.DLQEntry `json:"queued"`
		Refused []struct {
			CampaignID int64  `json:"campaign_id"`
			Batch      int    `json:"batch"`
			State      string `json:"state"`
		} `json:"refused"`
	}
	refusedBatchOne := func(out string) bool {
		var rep retryReport
		return json.Unmarshal([]byte(out), &rep) == nil && rep.Queued != nil && len(rep.Queued) == 0 &&
			len(rep.Refused) == 1 && rep.Refused[0].Batch == 1 && rep.Refused[0].State == "cancelled"
	}
	// With --json too: the refused batches on stdout (it printed nothing), the reason on stderr, exit 2.
	if out, stderr, code := cli(t, env, "dlq", "retry", "--campaign", id, "--json"); code != 2 || !strings.Contains(stderr, "the campaign is cancelled") || !refusedBatchOne(out) {
		t.Fatalf("dlq retry --json of a cancelled campaign: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	// Retrying the whole DLQ skips it and says why, in JSON too.
	if out, stderr, code := cli(t, env, "dlq", "retry", "--json"); code != 0 || !refusedBatchOne(out) {
		t.Fatalf("dlq retry --json: exit %d, %s%s", code, out, stderr)
	}
	if out, stderr, code := cli(t, env, "dlq", "retry"); code != 0 || !strings.Contains(out, "0 batches queued again") ||
		!strings.Contains(out, "batch 1 of campaign "+id+" not retried: the campaign is cancelled") {
		t.Fatalf("dlq retry of everything: exit %d, %s%s", code, out, stderr)
	}
	if info, err := insp.GetQueueInfo(worker.Queue); err != nil || info.Archived != 1 {
		t.Fatalf("a refused retry moved the batch: %+v, %v", info, err)
	}
	var purged struct {
		Dropped []worker.DLQEntry `json:"dropped"`
	}
	if out, stderr, code := cli(t, env, "dlq", "purge", "--campaign", id, "--json"); code != 0 || json.Unmarshal([]byte(out), &purged) != nil ||
		len(purged.Dropped) != 1 || purged.Dropped[0].Batch != 1 {
		t.Fatalf("dlq purge --json: exit %d, %s%s", code, out, stderr)
	}
	if info, err := insp.GetQueueInfo(worker.Queue); err != nil || info.Archived != 0 {
		t.Fatalf("after purge: %+v, %v", info, err)
	}
}
