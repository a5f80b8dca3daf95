package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// opsEnv is a migrated database with an audience of customers u1..uN, all with consent, a code pool "p"
// of 3N codes, and a Redis.
type opsEnv struct {
	db    *pgxpool.Pool
	rdb   redis.UniversalClient
	store *campaign.Store
	insp  *asynq.Inspector
}

// newOpsEnv builds an opsEnv of n customers on a leased Redis DB, or on rdb when it is not nil.
func newOpsEnv(t *testing.T, n int, rdb redis.UniversalClient) *opsEnv {
	t.Helper()
	db, _ := testdb.New(t)
	if rdb == nil {
		rdb, _ = testredis.New(t)
	}
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE customers (user_id text, phone text, first_name text)`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		fmt.Sprintf(`INSERT INTO customers SELECT 'u' || i, '+90532' || lpad(i::text, 7, '0'), 'Name' || i FROM generate_series(1, %d) i`, n),
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO code_pools (name) VALUES ('p')`,
		fmt.Sprintf(`INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, %d) i`, 3*n),
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return &opsEnv{db: db, rdb: rdb, store: campaign.NewStore(db), insp: asynq.NewInspectorFromRedisClient(rdb)}
}

func (e *opsEnv) spec(name string, batchSize int) campaign.Spec {
	return campaign.Spec{
		Name: name, Channel: campaign.ChannelSMS, CodePool: "p", BatchSize: batchSize,
		AudienceSQL: `SELECT user_id, phone, first_name FROM customers`,
		Message:     `Merhaba {{.first_name}}, kodunuz {{.code}}`,
	}
}

func (e *opsEnv) planner() *campaign.Planner { return &campaign.Planner{Engine: e.db, Audience: e.db} }

// plan plans a campaign of every customer in batches of batchSize, as a launch killed after its commit
// and before queueing would leave it: nothing is queued.
func (e *opsEnv) plan(t *testing.T, name string, batchSize int) *campaign.Campaign {
	t.Helper()
	rep, err := e.planner().Plan(context.Background(), e.spec(name, batchSize))
	if err != nil {
		t.Fatal(err)
	}
	return e.campaign(t, rep.ID)
}

// launch plans a campaign and queues every batch.
func (e *opsEnv) launch(t *testing.T, name string, batchSize int) *campaign.Campaign {
	t.Helper()
	rep, err := worker.Launch(context.Background(), worker.LaunchOptions{Planner: e.planner(), Redis: e.rdb, Spec: e.spec(name, batchSize)})
	if err != nil {
		t.Fatal(err)
	}
	return e.campaign(t, rep.ID)
}

func (e *opsEnv) campaign(t *testing.T, id int64) *campaign.Campaign {
	t.Helper()
	c, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *opsEnv) counts(t *testing.T, id int64) campaign.Counts {
	t.Helper()
	c, err := e.store.Counts(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *opsEnv) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// ageUnknown makes the unknown recipients of campaign id look recorded an hour ago: the operator resends
// them past worker.ResendGrace, as `resume --resend-unknown` holds back those recorded less than that ago.
func (e *opsEnv) ageUnknown(t *testing.T, id int64) {
	t.Helper()
	e.exec(t, `UPDATE campaign_recipients SET updated_at = updated_at - interval '1 hour' WHERE campaign_id = $1 AND status = 'unknown'`, id)
}

// statuses maps each recipient of campaign id to status[/reason].
func (e *opsEnv) statuses(t *testing.T, id int64) map[string]string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT user_id, status || coalesce('/' || reason, '') FROM campaign_recipients WHERE campaign_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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

// pending is how many batch tasks wait in the queue.
func (e *opsEnv) pending(t *testing.T) int {
	t.Helper()
	info, err := e.insp.GetQueueInfo(worker.Queue)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return info.Pending
}

// progress reads campaign id's progress counters.
func (e *opsEnv) progress(t *testing.T, id int64) map[string]string {
	t.Helper()
	m, err := e.rdb.HGetAll(context.Background(), worker.ProgressKey(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// gatedProvider accepts every message, but holds the first until release is closed; started is closed
// when the first call arrives.
type gatedProvider struct {
	started, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	sent             []string
}

func newGatedProvider() *gatedProvider {
	return &gatedProvider{started: make(chan struct{}), release: make(chan struct{})}
}

func (p *gatedProvider) Name() string { return "gated" }

func (p *gatedProvider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	first := false
	p.once.Do(func() { first = true; close(p.started) })
	if first {
		select {
		case <-p.release:
		case <-ctx.Done():
			return providers.Result{}, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, m.To)
	return providers.Result{MessageID: fmt.Sprintf("SM%d", len(p.sent)), Segments: 1}, nil
}

func (p *gatedProvider) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

// liveWorker starts a batch run of a worker that sends through p, and returns a channel that gets its
// result.
func (e *opsEnv) liveWorker(id int64, batch int, p providers.Provider) <-chan error {
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "live", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	done := make(chan error, 1)
	go func() { done <- h.RunBatch(context.Background(), id, batch) }()
	return done
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Launch plans, then queues one task per batch; a dry run writes and queues nothing; a launch that is
// not confirmed writes nothing.
func TestLaunchPlansThenQueuesEveryBatch(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 5, nil)
	ctx := context.Background()

	dry := e.spec("dry", 2)
	dry.DryRun = true
	rep, err := worker.Launch(ctx, worker.LaunchOptions{Planner: e.planner(), Spec: dry})
	if err != nil || !rep.DryRun || rep.ID != 0 || rep.Eligible != 5 || rep.Batches != 3 {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	var previewed campaign.Report
	rep, err = worker.Launch(ctx, worker.LaunchOptions{Planner: e.planner(), Redis: e.rdb, Spec: e.spec("declined", 2),
		Confirm: func(p campaign.Report) bool { previewed = p; return false }})
	if !errors.Is(err, worker.ErrLaunchDeclined) || !previewed.DryRun || previewed.Eligible != 5 {
		t.Fatalf("declined launch: %+v, %v; preview %+v", rep, err, previewed)
	}
	if list, _ := e.store.List(ctx); len(list) != 0 || e.pending(t) != 0 {
		t.Fatalf("a dry run or a declined launch wrote %d campaigns, queued %d tasks", len(list), e.pending(t))
	}

	rep, err = worker.Launch(ctx, worker.LaunchOptions{Planner: e.planner(), Redis: e.rdb, Spec: e.spec("yaz", 2),
		Confirm: func(campaign.Report) bool { return true }})
	if err != nil || rep.ID == 0 || rep.DryRun || rep.Batches != 3 || rep.Enqueued != 3 {
		t.Fatalf("launch: %+v, %v", rep, err)
	}
	if got := e.pending(t); got != 3 {
		t.Fatalf("%d tasks queued, want 3", got)
	}
	for b := range 3 {
		if _, err := e.insp.GetTaskInfo(worker.Queue, worker.TaskID(rep.ID, b)); err != nil {
			t.Errorf("batch %d: %v", b, err)
		}
	}
}

// A launch whose plan committed but whose queue is unreachable says so with a *NotQueuedError holding
// the campaign; Resume queues it later.
func TestLaunchThatCannotQueueIsFinishedByResume(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })

	rep, err := worker.Launch(ctx, worker.LaunchOptions{Planner: e.planner(), Redis: down, Spec: e.spec("half", 1)})
	var nq *worker.NotQueuedError
	if !errors.As(err, &nq) || nq.CampaignID != rep.ID || rep.ID == 0 || nq.Queued != 0 || nq.Batches != 3 || rep.Enqueued != 0 {
		t.Fatalf("launch without a queue: %+v, %v", rep, err)
	}
	r, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: rep.ID})
	if err != nil || r.Enqueued != 3 || e.pending(t) != 3 {
		t.Fatalf("resume: %+v, %v; %d queued", r, err, e.pending(t))
	}
}

// Pause records the pause in Postgres and sets the halt mark every worker reads before a claim; only a
// running or scheduled campaign can be paused.
func TestPause(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "p", 1)

	rep, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil || rep.Was != campaign.StateRunning || !rep.Halted {
		t.Fatalf("pause: %+v, %v", rep, err)
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StatePaused {
		t.Fatalf("state %s, want paused", st)
	}
	if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != "paused" {
		t.Fatalf("halt mark %q, want paused", v)
	}
	// Pausing again is done already: no error, the halt set again.
	e.rdb.Del(ctx, worker.HaltKey(c.ID))
	if rep, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil || rep.Was != campaign.StatePaused || !rep.Halted {
		t.Fatalf("pause of a paused campaign: %+v, %v; want done already", rep, err)
	}
	if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != "paused" {
		t.Fatalf("halt mark %q after the second pause, want paused", v)
	}
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: 987654}); !errors.Is(err, campaign.ErrNotFound) {
		t.Fatalf("pause of no campaign: %v, want ErrNotFound", err)
	}
}

// After a pause, Resume runs the campaign again, clears the halt mark and leaves the queued batches as
// they are.
func TestResumeAfterAPause(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "p", 1)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}

	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil || rep.Was != campaign.StatePaused || rep.To != campaign.StateRunning || rep.Found == nil || rep.Found.Pending != 3 {
		t.Fatalf("resume: %+v, %v", rep, err)
	}
	if rep.Enqueued != 0 || rep.AlreadyQueued != 3 || rep.FromDLQ != 0 || rep.Completed {
		t.Fatalf("resume queued %d, found %d queued, %d from the DLQ; want 0, 3, 0", rep.Enqueued, rep.AlreadyQueued, rep.FromDLQ)
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StateRunning {
		t.Fatalf("state %s, want running", st)
	}
	if n := e.rdb.Exists(ctx, worker.HaltKey(c.ID)).Val(); n != 0 {
		t.Fatal("the halt mark is still set: every worker would refuse to claim")
	}
	// A running campaign resumes as it is: nothing moves.
	if rep, err = worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil || rep.To != "" {
		t.Fatalf("second resume: %+v, %v", rep, err)
	}
}

// Redis restarted empty (queue, counters, claims gone): Resume rebuilds the queue and the progress
// counters from Postgres, and takes the dead-lettered batches back.
func TestResumeAfterRedisLostItsData(t *testing.T) {
	t.Parallel()
	srv := testredis.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	e := newOpsEnv(t, 4, rdb)
	ctx := context.Background()
	c := e.launch(t, "lost", 1)
	// u1 was sent and u2 failed before Redis lost everything.
	e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u1' THEN 'sent' ELSE 'failed' END,
		segments = CASE user_id WHEN 'u1' THEN 2 END
		WHERE campaign_id = $1 AND user_id IN ('u1', 'u2')`, c.ID)
	if err := srv.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: rdb, CampaignID: c.ID})
	if err != nil || rep.Enqueued != 2 || rep.AlreadyQueued != 0 || rep.Counts.Pending != 2 || rep.Completed {
		t.Fatalf("resume: %+v, %v; want the 2 batches still pending queued", rep, err)
	}
	if got := e.pending(t); got != 2 {
		t.Fatalf("%d tasks queued, want 2", got)
	}
	want := map[string]string{campaign.StatusSent: "1", campaign.StatusFailed: "1", campaign.StatusSkipped: "0", campaign.StatusUnknown: "0", state.ProgressSegments: "2"}
	if got := e.progress(t, c.ID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("progress counters %v, want %v (from Postgres)", got, want)
	}

	// One of them used up its retries meanwhile: the next resume takes it back from the DLQ.
	batches, err := e.store.PendingBatches(ctx, c.ID, false)
	if err != nil || len(batches) != 2 {
		t.Fatalf("pending batches %v, %v", batches, err)
	}
	if err := e.insp.ArchiveTask(worker.Queue, worker.TaskID(c.ID, batches[0])); err != nil {
		t.Fatal(err)
	}
	rep, err = worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: rdb, CampaignID: c.ID})
	if err != nil || rep.FromDLQ != 1 || rep.Enqueued != 0 || rep.AlreadyQueued != 1 {
		t.Fatalf("resume with a batch in the DLQ: %+v, %v", rep, err)
	}
	if info, err := e.insp.GetQueueInfo(worker.Queue); err != nil || info.Archived != 0 || info.Pending != 2 {
		t.Fatalf("queue after resume: %+v, %v; want 2 pending, none archived", info, err)
	}
}

// Unknown recipients stay unknown unless ResendUnknown: then they go back to pending with their
// claims forgotten, except a claim that says the provider accepted. A completed campaign resumes only
// for that.
func TestResumeResendUnknown(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "unknown", 1)
	e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u3' THEN 'sent' ELSE 'unknown' END WHERE campaign_id = $1`, c.ID)
	e.exec(t, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, c.ID)
	n := worker.Nonce(c) + "/"
	e.rdb.Set(ctx, worker.ClaimKey(c.ID, "u1"), n+"u|timeout after the request was written", 0)
	e.rdb.Set(ctx, worker.ClaimKey(c.ID, "u2"), n+"s|SMu2|1", 0)

	_, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if !errors.Is(err, campaign.ErrWrongState) {
		t.Fatalf("resume of a completed campaign without ResendUnknown: %v, want ErrWrongState", err)
	}
	e.ageUnknown(t, c.ID)
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, ResendUnknown: true})
	if err != nil || rep.Was != campaign.StateCompleted || rep.To != campaign.StateRunning || rep.Resent != 2 ||
		rep.Found.Unknown != 2 || rep.Counts.Unknown != 0 || rep.Counts.Pending != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v", rep, err)
	}
	if got := e.statuses(t, c.ID); got["u1"] != "pending" || got["u2"] != "pending" || got["u3"] != "sent" {
		t.Fatalf("statuses %v", got)
	}
	if e.rdb.Exists(ctx, worker.ClaimKey(c.ID, "u1")).Val() != 0 {
		t.Fatal("u1's unanswered claim was kept: u1 would be found unknown again")
	}
	if v := e.rdb.Get(ctx, worker.ClaimKey(c.ID, "u2")).Val(); v != n+"s|SMu2|1" {
		t.Fatalf("u2's claim (accepted) = %q; it must stay so that u2 is recorded sent, not resent", v)
	}
}

// Cancel with a batch in flight that its worker does not let go of within Wait: Cancel waits that long,
// the rest is cancelled at once, the held batch is queued (its task was gone) so that a worker closes
// it, and when the worker lets go the send in flight is recorded and nothing more is sent.
func TestCancelWithABatchInFlight(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 6, nil)
	ctx := context.Background()
	c := e.plan(t, "inflight", 3)
	p := newGatedProvider()
	done := e.liveWorker(c.ID, 0, p)
	wait(t, p.started, "the first send")

	var recorded *worker.CancelReport
	var told []int // Waiting's batches held, once told: the command says what it waits for
	start := time.Now()
	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 3 * time.Second,
		Recorded: func(r worker.CancelReport) { recorded = &r },
		Waiting:  func(held int, upTo time.Duration) { told = append(told, held) }})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 3*time.Second {
		t.Fatalf("cancel returned after %v, before its Wait (3s) while a worker held a batch", took)
	}
	if len(told) != 1 || told[0] != 1 {
		t.Fatalf("Waiting told %v; want once, of the 1 batch held", told)
	}
	if recorded == nil || recorded.Was != campaign.StateRunning || !recorded.Halted {
		t.Fatalf("Recorded got %+v", recorded)
	}
	if rep.Was != campaign.StateRunning || rep.Cancelled != 3 || rep.Counts.Pending != 3 || rep.CodePool != "p" || rep.Requeued != 1 {
		t.Fatalf("cancel: %+v; want batch 1 cancelled, batch 0 (3 held) queued again", rep)
	}
	if _, err := e.insp.GetTaskInfo(worker.Queue, worker.TaskID(c.ID, 0)); err != nil {
		t.Fatalf("the held batch is not queued: %v", err)
	}

	close(p.release)
	if err := wait(t, done, "the live batch run"); err != nil {
		t.Fatalf("live batch run: %v", err)
	}
	if got := p.calls(); got != 1 {
		t.Fatalf("%d messages sent, want only the one in flight at the cancel", got)
	}
	if got := e.counts(t, c.ID); got.Sent != 1 || got.Skipped != 5 || got.Pending != 0 {
		t.Fatalf("counts %+v; want 1 sent, 5 skipped (cancelled)", got)
	}
}

// A worker that lets go of its batch once the cancel is recorded (before Cancel looks at the batch, or
// while Cancel waits for it): Cancel reports nothing pending and queues nothing.
func TestCancelWaitsForTheWorkerToLetGo(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 6, nil)
	ctx := context.Background()
	c := e.launch(t, "wait", 3)
	p := newGatedProvider()
	done := e.liveWorker(c.ID, 0, p)
	wait(t, p.started, "the first send")

	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 5 * time.Second,
		Recorded: func(worker.CancelReport) { close(p.release) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done, "the live batch run"); err != nil {
		t.Fatalf("live batch run: %v", err)
	}
	if rep.Counts.Pending != 0 || rep.Counts.Sent != 1 || rep.Cancelled != 5 || rep.Requeued != 0 {
		t.Fatalf("cancel: %+v; want 1 sent, 5 cancelled, nothing pending or queued", rep)
	}
	want := 0
	for u, st := range e.statuses(t, c.ID) {
		if st == "skipped/cancelled" {
			want++
		} else if st != "sent" {
			t.Errorf("%s: %s", u, st)
		}
	}
	if want != 5 {
		t.Fatalf("%d recipients cancelled, want 5", want)
	}
	// A second cancel finds nothing left to close, and changes nothing.
	if again, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil ||
		again.Was != campaign.StateCancelled || again.Counts != rep.Counts || again.Cancelled != 5 {
		t.Fatalf("second cancel: %+v, %v; want the same figures, nothing changed", again, err)
	}
	if _, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); !errors.Is(err, campaign.ErrWrongState) {
		t.Fatalf("resume of a cancelled campaign: %v, want ErrWrongState", err)
	}
}

// A batch that met the pause waits for its retry, 30 s later; resume makes it run now rather than leave
// the campaign still for up to half a minute after it said it was running again.
func TestResumeRunsTheBatchesWaitingToRetryNow(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "p", 1)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	// Batch 0 met the pause: its task waits for a later run, as a retry after 30 s would.
	id := worker.TaskID(c.ID, 0)
	if err := e.insp.DeleteTask(worker.Queue, id); err != nil {
		t.Fatal(err)
	}
	task, err := worker.NewBatchTask(c.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asynq.NewClientFromRedisClient(e.rdb).Enqueue(task, asynq.ProcessIn(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// And a follow-up of the same batch (a sweep's, another resume's), waiting too: one batch all the same
	// (tasks were counted: "101 of the queued batches" of a campaign of 34).
	if _, err := asynq.NewClientFromRedisClient(e.rdb).Enqueue(task, asynq.ProcessIn(30*time.Second), asynq.TaskID(id+"/swept-1")); err != nil {
		t.Fatal(err)
	}
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil || rep.AlreadyQueued != 3 || rep.Hastened != 1 {
		t.Fatalf("resume: %+v, %v; want 3 already queued, 1 of them run now (one batch, two tasks)", rep, err)
	}
	info, err := e.insp.GetTaskInfo(worker.Queue, id)
	if err != nil || info.State != asynq.TaskStatePending {
		t.Fatalf("batch 0 after resume: %+v, %v; want pending (to run now)", info, err)
	}
}

// An operator pauses (or cancels) a campaign while another resumes it: the pause lands between the
// resume's transition to running and its clearing of the halt mark. The campaign stays paused, and its
// halt mark must stay too; without it every worker would go on claiming until its next chunk.
func TestAPauseDuringAResumeKeepsItsHaltMark(t *testing.T) {
	t.Parallel()
	for _, to := range []campaign.State{campaign.StatePaused, campaign.StateCancelled} {
		t.Run(string(to), func(t *testing.T) {
			t.Parallel()
			e := newOpsEnv(t, 3, nil)
			ctx := context.Background()
			c := e.launch(t, "p", 1)
			if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
				t.Fatal(err)
			}
			if _, err := state.UnhaltIf(ctx, e.rdb, -c.ID, ""); err != nil { // loaded: see TestAResumeRacingACancelKeepsTheCancelsHalt
				t.Fatal(err)
			}
			resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
			defer resumer.Close()
			resumer.AddHook(&aroundUnhalt{key: worker.HaltKey(c.ID), after: func() {}, before: func() {
				var err error
				if to == campaign.StatePaused {
					_, err = worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
				} else {
					_, err = worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
				}
				if err != nil {
					t.Error(err)
				}
			}})
			rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID})
			if !errors.Is(err, campaign.ErrWrongState) || !strings.Contains(err.Error(), "while it was being resumed") {
				t.Errorf("resume: %v, want it to say the campaign was %s meanwhile", err, to)
			}
			// The report says no more than the error: `resume` printed "was paused and is running again"
			// above "it stays paused".
			if rep.To != "" {
				t.Errorf("resume's report: moved to %q, beside an error saying the campaign stays %s", rep.To, to)
			}
			if st := e.campaign(t, c.ID).State; st != to {
				t.Fatalf("state %s, want %s", st, to)
			}
			if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != string(to) {
				t.Fatalf("halt mark %q, want %q: the workers would go on claiming", v, to)
			}
		})
	}
}

// A cancel that leaves nothing pending takes the campaign's batches still queued out of the queue: each
// would only run to find nothing to do, ahead of other campaigns' batches (1,610 left by a cancelled
// campaign of a million held a new campaign back for minutes). Another campaign's batches stay queued.
func TestCancelTakesTheCampaignsQueuedBatchesOutOfTheQueue(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 12, nil)
	ctx := context.Background()
	c := e.launch(t, "big", 2)       // 6 batches queued
	other := e.launch(t, "other", 6) // 2 batches queued
	if got := e.pending(t); got != 8 {
		t.Fatalf("%d tasks queued, want 8", got)
	}
	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Dequeued != 6 || rep.Counts.Pending != 0 {
		t.Fatalf("cancel: %+v; want its 6 queued batches taken out, nothing pending", rep)
	}
	tasks, err := e.insp.ListPendingTasks(worker.Queue)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if !strings.HasPrefix(task.ID, fmt.Sprintf("%d:", other.ID)) {
			t.Errorf("task %s still queued after its campaign was cancelled", task.ID)
		}
	}
	if len(tasks) != 2 {
		t.Errorf("%d tasks queued after the cancel, want the other campaign's 2", len(tasks))
	}
}
