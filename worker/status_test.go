package worker_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/worker"
)

// Status reads Postgres's counts and the campaign's dead-lettered batches; ListStatus does it for every
// campaign, each with its own DLQ count.
func TestStatusCountsEachCampaignsDLQ(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	opts := worker.StatusOptions{Store: e.store, Redis: e.rdb}
	if list, err := worker.ListStatus(ctx, opts); err != nil || len(list) != 0 {
		t.Fatalf("no campaign yet: %+v, %v", list, err)
	}
	a, b := e.launch(t, "a", 1), e.launch(t, "b", 1)
	e.archive(t, a, 0, 1)
	e.archive(t, b, 2)
	e.exec(t, `UPDATE campaign_recipients SET status = 'sent' WHERE campaign_id = $1 AND user_id = 'u1'`, a.ID)

	opts.CampaignID = a.ID
	s, err := worker.Status(ctx, opts)
	if err != nil || s.ID != a.ID || s.Name != "a" || s.State != campaign.StateRunning || s.Planned != 3 || s.Sent != 1 ||
		s.Pending != 2 || s.DLQText() != "2" || s.Over() {
		t.Fatalf("status of a: %+v, %v", s, err)
	}
	want := []string{"id", "name", "channel", "state", "audience", "eligible", "excluded", "planned", "pending", "sent",
		"failed", "skipped", "unknown", "delivered", "undelivered", "dlq", "created_at", "start_at", "started_at", "finished_at", "failed_by_reason", "skipped_by_reason",
		"waiting", "reason", "detail", "since", "until"} // no worker runs: waiting says so, since the launch (until null)
	if keys := jsonKeys(t, s); !reflect.DeepEqual(keys, want) {
		t.Fatalf("status --json keys %v, want %v", keys, want)
	}

	list, err := worker.ListStatus(ctx, opts)
	if err != nil || len(list) != 2 || list[0].ID != b.ID || list[1].ID != a.ID {
		t.Fatalf("list: %+v, %v; want b then a", list, err)
	}
	if list[0].DLQText() != "1" || list[1].DLQText() != "2" || list[1].Sent != 1 {
		t.Fatalf("list: b has %s in the DLQ (want 1), a %s (want 2), a sent %d", list[0].DLQText(), list[1].DLQText(), list[1].Sent)
	}
	// Redis unreachable: the DLQ, which Redis holds, is unknown (null), not an all-clear 0.
	opts.Redis = nil
	if s, err := worker.Status(ctx, opts); err != nil || s.DLQ != nil || !s.RedisUnavailable || s.DLQText() != "unknown" {
		t.Fatalf("status of a without Redis: dlq %v (%s), redis_unavailable %v, %v; want null", s.DLQ, s.DLQText(), s.RedisUnavailable, err)
	}
	if b, _ := json.Marshal(s); !strings.Contains(string(b), `"dlq":2`) {
		t.Fatalf("status --json with Redis: %s; want \"dlq\":2", b)
	}
	e.exec(t, `UPDATE campaigns SET state = 'cancelled' WHERE id = $1`, a.ID)
	if s, err = worker.Status(ctx, opts); err != nil || !s.Over() {
		t.Fatalf("a cancelled campaign is not over: %+v, %v", s, err)
	}
}

// The observer reads the queue through the Inspector (pending, due soon, paused), the running campaigns
// from Postgres (their caps) and their provider calls from the progress counters.
func TestQueueObserverReadsTheQueueAndTheCaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// An empty Redis: no queue yet, nothing queued, no error.
	empty := newOpsEnv(t, 1, nil)
	q := &worker.QueueObserver{Store: empty.store, Redis: empty.rdb, Caps: map[string]float64{"sms": 100}, Lookahead: 10 * time.Second, DueLimit: 100}
	o, err := q.Observe(ctx)
	if err != nil || o.Pending+o.Active+o.Due != 0 || o.RateCap != 0 || o.Uncapped || o.Sends != nil {
		t.Fatalf("empty: %+v, %v", o, err)
	}

	// A running campaign of 3 batches queued, 1 batch due in a second, 1 in an hour.
	e := newOpsEnv(t, 3, nil)
	c := e.launch(t, "observed", 1)
	client := asynq.NewClientFromRedisClient(e.rdb)
	for batch, in := range map[int]time.Duration{10: time.Second, 11: time.Hour} {
		task, err := worker.NewBatchTask(c.ID, batch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task, asynq.ProcessIn(in)); err != nil {
			t.Fatal(err)
		}
	}
	e.rdb.HSet(ctx, worker.ProgressKey(c.ID), campaign.StatusSent, 5, campaign.StatusFailed, 2, campaign.StatusUnknown, 1, campaign.StatusSkipped, 9)
	q = &worker.QueueObserver{Store: e.store, Redis: e.rdb, Caps: map[string]float64{"sms": 100}, Lookahead: 10 * time.Second, DueLimit: 100}
	if o, err = q.Observe(ctx); err != nil {
		t.Fatal(err)
	}
	if o.Pending != 3 || o.Active != 0 || o.Due != 1 || o.Paused || o.RateCap != 100 || o.Uncapped || o.Sends[c.ID] != 8 {
		t.Errorf("observed %+v; want 3 pending, 1 due, rate cap 100, 8 provider calls", o)
	}
	// A provider cap in SMS segments: the campaign's messages have taken 3 segments each (15 for 5 sent),
	// so its 100 segments a second are 33.3 messages.
	e.rdb.HSet(ctx, worker.ProgressKey(c.ID), state.ProgressSegments, 15)
	if o, err = q.Observe(ctx); err != nil || o.RateCap != 100 {
		t.Errorf("observed %+v, %v; want rate cap 100 (the cap counts messages)", o, err)
	}
	seg := *q
	seg.CapsInSegments = map[string]bool{"sms": true}
	if o, err = seg.Observe(ctx); err != nil || math.Abs(o.RateCap-100.0/3) > 1e-9 || o.Sends[c.ID] != 8 {
		t.Errorf("observed %+v, %v; want rate cap 33.3 messages (100 segments, 3 a message), 8 provider calls", o, err)
	}
	// The workers whose heartbeat lives, by process ID, of this machine only (a worker's owner is
	// "<host name>:<pid>", as cmd's worker writes it): the supervisor kills its own children that have none.
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{host + ":4242", host + ":4343", "elsewhere:4444", "not-a-pid"} {
		if err := state.PublishWorker(ctx, e.rdb, state.WorkerInfo{Owner: owner, Providers: map[string]string{"sms": "twilio"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := state.RemoveWorker(ctx, e.rdb, host+":4343"); err != nil {
		t.Fatal(err)
	}
	if o, err = q.Observe(ctx); err != nil || !reflect.DeepEqual(o.Beating, map[int]bool{4242: true}) {
		t.Errorf("heartbeats observed %v, %v; want this machine's live one, process 4242", o.Beating, err)
	}

	// The due count stops at the limit; an uncapped provider leaves the rate unbounded.
	q.DueLimit, q.Lookahead, q.Caps = 1, 2*time.Hour, map[string]float64{"sms": 0}
	if o, err = q.Observe(ctx); err != nil || o.Due != 1 || !o.Uncapped || o.RateCap != 0 {
		t.Errorf("observed %+v, %v; want 1 due (the limit), uncapped", o, err)
	}

	// A paused campaign is not running: no cap, no counters. Its batches that come back soon only to
	// find it paused call for no worker (under --min 0 the supervisor started one for each such return);
	// another campaign's batch due as soon still counts. A paused queue says so.
	other, err := worker.NewBatchTask(c.ID+1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(other, asynq.ProcessIn(time.Second)); err != nil {
		t.Fatal(err)
	}
	q.DueLimit = 100
	if o, err = q.Observe(ctx); err != nil || o.Due != 3 {
		t.Fatalf("observed %+v, %v; want 3 due before the pause", o, err)
	}
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	if o, err = q.Observe(ctx); err != nil || o.Due != 1 {
		t.Errorf("observed %+v, %v; want 1 due (the other campaign's batch), none of the paused campaign's", o, err)
	}
	if err := e.insp.PauseQueue(worker.Queue); err != nil {
		t.Fatal(err)
	}
	if o, err = q.Observe(ctx); err != nil || o.RateCap != 0 || o.Uncapped || o.Sends != nil || !o.Paused {
		t.Errorf("observed %+v, %v; want no running campaign and a paused queue", o, err)
	}
}

// Supervisors on one queue see each other through the observer: each looks with its name, a second one
// counts from its first look, one that leaves no longer counts, and one without a name is taken to be alone.
func TestQueueObserverCountsTheSupervisorsOnTheQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t, 1, nil)
	obs := func(name string) *worker.QueueObserver {
		return &worker.QueueObserver{Store: e.store, Redis: e.rdb, Caps: map[string]float64{}, Lookahead: time.Second, DueLimit: 10, Name: name, Alive: time.Minute}
	}
	a, b, alone := obs("host-a:1:x"), obs("host-b:2:y"), obs("")
	look := func(q *worker.QueueObserver, want int) {
		t.Helper()
		o, err := q.Observe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if o.Supervisors != want {
			t.Errorf("%q sees %d supervisors, want %d", q.Name, o.Supervisors, want)
		}
	}
	look(a, 1)
	look(b, 2)
	look(a, 2)
	look(alone, 1)
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	look(a, 1)
}

// Supervisors started together count each other from their first look: the first look counts itself in,
// waits JoinWait and counts again. Three started in one instant ran 22 workers where their shares were 18,
// each first look counting fewer supervisors than there were, until their next looks.
func TestSupervisorsStartedTogetherCountEachOtherFromTheFirstLook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newOpsEnv(t, 1, nil)
	obs := func(name string) *worker.QueueObserver {
		return &worker.QueueObserver{Store: e.store, Redis: e.rdb, Caps: map[string]float64{}, Lookahead: time.Second, DueLimit: 10,
			Name: name, Alive: time.Minute, JoinWait: 500 * time.Millisecond}
	}
	a, b := obs("host-a:1:x"), obs("host-b:2:y")
	seen := make(chan int, 1)
	go func() {
		o, err := a.Observe(ctx)
		if err != nil {
			t.Error(err)
		}
		seen <- o.Supervisors
	}()
	time.Sleep(100 * time.Millisecond) // b starts while a's first look waits
	start := time.Now()
	o, err := b.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); o.Supervisors != 2 || took < 500*time.Millisecond {
		t.Errorf("the second supervisor's first look counted %d supervisors after %v; want 2, after its JoinWait", o.Supervisors, took)
	}
	if n := <-seen; n != 2 {
		t.Errorf("the first supervisor's first look counted %d supervisors; want 2 (the other started while it waited)", n)
	}
	// Later looks do not wait.
	start = time.Now()
	if o, err = a.Observe(ctx); err != nil || o.Supervisors != 2 || time.Since(start) >= 500*time.Millisecond {
		t.Errorf("a later look: %d supervisors, %v, after %v; want 2 at once", o.Supervisors, err, time.Since(start))
	}
}

// ProviderCalls adds up sent, failed and unknown (the provider was called), not skipped; a campaign
// without counters made none.
func TestProviderCalls(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 1, nil)
	ctx := context.Background()
	e.rdb.HSet(ctx, worker.ProgressKey(7), campaign.StatusSent, 3, campaign.StatusFailed, 1, campaign.StatusUnknown, 2, campaign.StatusSkipped, 50)
	got, err := worker.ProviderCalls(ctx, e.rdb, []int64{7, 8})
	if err != nil || !reflect.DeepEqual(got, map[int64]int64{7: 6, 8: 0}) {
		t.Fatalf("provider calls %v, %v; want 7: 6, 8: 0", got, err)
	}
}

// Ready answers while Redis and Postgres both do, and names the one that does not.
func TestReady(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 1, nil)
	ctx := context.Background()
	if err := worker.Ready(e.rdb, e.db)(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })
	if err := worker.Ready(down, e.db)(ctx); err == nil || err.Error()[:6] != "redis:" {
		t.Fatalf("ready with Redis down: %v, want a redis: error", err)
	}
}
