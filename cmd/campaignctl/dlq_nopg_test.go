package main

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/worker"
)

// The DLQ is in Redis: dlq list shows it while Postgres is unreachable (an incident is when ops look), and
// says the campaign was not checked. Before, it exited 1, "Postgres is not reachable".
func TestDLQListWorksWhilePostgresIsAway(t *testing.T) {
	t.Parallel()
	rdb, redisURL := testredis.New(t)
	task, err := worker.NewBatchTask(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(rdb)
	if _, err := client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
	if err := asynq.NewInspectorFromRedisClient(rdb).ArchiveTask(worker.Queue, worker.TaskID(7, 3)); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2", "REDIS_URL": redisURL}
	out, stderr, code := cli(t, env, "dlq", "list", "--json")
	if code != 0 || !strings.Contains(out, `"campaign_id":7`) || !strings.Contains(stderr, "Postgres is unreachable") {
		t.Fatalf("dlq list with Postgres away: exit %d\nstdout: %s\nstderr: %s\nwant the archived batch listed from Redis, and the outage said", code, out, stderr)
	}

}
