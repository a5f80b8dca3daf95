package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// A launch killed after its plan committed and before any batch was queued: resume queues every batch,
// once, however often it runs.
func TestResumeQueuesWhatALaunchDidNotAndIsIdempotent(t *testing.T) {
	t.Parallel()
	env, _ := badInputEnv(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
		Name: "killed", Channel: campaign.ChannelSMS, BatchSize: 1,
		AudienceSQL: "SELECT user_id, phone, first_name FROM customers", Message: "Merhaba {{.first_name}}",
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Batches != 3 {
		t.Fatalf("planned %d batches, want 3", rep.Batches)
	}
	id := strconv.FormatInt(rep.ID, 10)
	out, stderr, code := cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(out, "3 batches re-enqueued, 0 already queued") {
		t.Fatalf("first resume: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(out, "0 batches re-enqueued, 3 already queued") {
		t.Fatalf("second resume: exit %d\n%s%s", code, out, stderr)
	}
	opt, _ := redis.ParseURL(env["REDIS_URL"])
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(worker.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if info.Pending != 3 {
		t.Fatalf("%d batch tasks queued after two resumes, want 3", info.Pending)
	}

	_, stderr, code = cli(t, env, "resume", "424242")
	if code != 2 || !strings.Contains(stderr, "no campaign has id 424242") {
		t.Fatalf("resume of an unknown campaign: exit %d, %s", code, stderr)
	}
}
