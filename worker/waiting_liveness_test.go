package worker

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// A worker killed outright (kill -9) leaves its heartbeat in Redis for up to state.WorkerTTL, but its
// liveness lock in Postgres goes with its connection: status says no_worker at once, not half a minute
// later. A worker that has just started and not taken its lock yet still counts.
func TestStatusSaysNoWorkerAsSoonAsAWorkerIsKilled(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	if _, _, err := Enqueue(ctx, client, f.store, f.campaign(t), true); err != nil {
		t.Fatal(err)
	}
	waiting := func(step string) string {
		t.Helper()
		s, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
		if err != nil {
			t.Fatal(err)
		}
		if s.Waiting == nil {
			return ""
		}
		return s.Waiting.Reason
	}
	conn, err := pgx.ConnectConfig(ctx, f.db.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	const key = 7_000_000_001
	if err := campaign.HoldLiveness(ctx, conn, key); err != nil {
		t.Fatal(err)
	}
	beat := func(started time.Time) {
		t.Helper()
		if err := state.PublishWorker(ctx, f.rdb, state.WorkerInfo{Owner: "w1", Providers: map[string]string{"sms": f.provider.Name()},
			Commercial: map[string]bool{"sms": true}, Started: started, Holder: key}); err != nil {
			t.Fatal(err)
		}
	}
	beat(time.Now().Add(-time.Minute))
	if got := waiting("a live worker"); got != "" {
		t.Fatalf("a worker holding its liveness lock: waiting %q, want none", got)
	}
	conn.Close(ctx) // the process dies: Postgres lets its lock go once its backend sees the connection end
	killed := time.Now()
	for got := waiting("killed"); got != WaitNoWorker; got = waiting("killed") {
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("a worker whose liveness lock is gone, its heartbeat still in Redis (for %v): waiting %q after %v, want %s",
				state.WorkerTTL, got, time.Since(killed).Round(time.Millisecond), WaitNoWorker)
		}
		time.Sleep(20 * time.Millisecond)
	}
	beat(time.Now())
	if got := waiting("just started"); got != "" {
		t.Fatalf("a worker that started a moment ago and holds no lock yet: waiting %q, want none", got)
	}
}
