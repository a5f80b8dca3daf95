package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// batchUsers returns the pending users of one batch.
func (f *fixture) batchUsers(t *testing.T, batch int) (users []string) {
	t.Helper()
	rs, err := f.store.LoadBatch(context.Background(), f.id, batch)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		users = append(users, r.UserID)
	}
	return users
}

func (f *fixture) campaign(t *testing.T) *campaign.Campaign {
	t.Helper()
	c, err := f.store.Get(context.Background(), f.id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// assertOnce fails when any address got more than one message.
func (f *fixture) assertOnce(t *testing.T) {
	t.Helper()
	f.provider.mu.Lock()
	defer f.provider.mu.Unlock()
	for to, bodies := range f.provider.accepted {
		if len(bodies) > 1 {
			t.Errorf("%s got %d messages: %q", to, len(bodies), bodies)
		}
	}
}

// Redis is emptied while a batch is half sent (its claims, queue and counters gone) and the batch is
// queued again at once, as `resume` does: the second run must leave alone the chunk the first run is
// sending, whose claims are gone, and the first run must not claim anything under the lost epoch.
func TestRedisEmptiedMidBatchSendsNobodyTwice(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	f.h.cfg.ChunkSize = 2
	second := f.handler(f.rdb)
	second.cfg.ChunkSize = 2
	var secondErr error
	f.provider.before = func(m providers.Message) {
		if m.To != phone(2) {
			return
		}
		// u1 was sent and its claim said so; u2 is being sent now. Redis loses everything.
		if err := f.rdb.FlushDB(context.Background()).Err(); err != nil {
			t.Error(err)
		}
		secondErr = second.RunBatch(context.Background(), f.id, 0)
	}
	// The first run may find the rest done by the second, or stop on the lost epoch; either way it must not
	// count as the batch's failure.
	err := f.h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if err != nil && (!errors.As(err, &re) || re.Failure) {
		t.Fatalf("first run: err = %v, want nil or a RetryError that is not a failure", err)
	}
	if !errors.As(secondErr, &re) || re.Failure {
		t.Fatalf("second run: err = %v, want a RetryError that is not a failure (a live run held a chunk)", secondErr)
	}
	f.provider.before = nil
	f.runAll(t)
	f.assertOnce(t)
	c := f.counts(t)
	if c.Sent != 5 || c.Pending != 0 || c.Unknown != 0 {
		t.Fatalf("counts %+v; want the 5 eligible sent once each, none unknown", c)
	}
}

// A run that died holding a chunk: once its lease expires the chunk is taken over. Under the same Redis
// epoch a missing claim means never sent; under another epoch it proves nothing, so the recipient is
// unknown, not sent again. A claim that holds an answer wins either way.
func TestDeadRunsChunkIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		sameEpoch bool
	}{{"same epoch", true}, {"redis lost its data", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			ctx := context.Background()
			c := f.campaign(t)
			epoch, err := Epoch(ctx, f.rdb)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.sameEpoch {
				epoch = "lost"
			}
			users := f.batchUsers(t, 0)
			if _, err := f.store.LeaseChunk(ctx, c, users, campaign.Lease{Token: "dead", Epoch: epoch, TTL: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			// The dead run had u2 answered.
			f.rdb.Set(ctx, ClaimKey(f.id, "u2"), Nonce(c)+"/"+state.SentValue("SMdead", 1), 0)
			time.Sleep(5 * time.Millisecond)
			if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
				t.Fatal(err)
			}
			f.assertOnce(t)
			if len(f.provider.accepted[phone(2)]) != 0 {
				t.Fatal("u2 was answered before the crash and was sent again")
			}
			want, wantProvider := campaign.StatusSent, 4
			if !tc.sameEpoch {
				want, wantProvider = campaign.StatusUnknown, 0
			}
			if got := f.provider.total(); got != wantProvider {
				t.Fatalf("provider got %d messages, want %d", got, wantProvider)
			}
			for _, u := range []string{"u1", "u4", "u7", "u8"} {
				if st, _, _ := f.status(t, u); st != want {
					t.Errorf("%s: %s, want %s", u, st, want)
				}
			}
			if st, _, _ := f.status(t, "u2"); st != campaign.StatusSent {
				t.Errorf("u2: %s, want sent (its claim says so)", st)
			}
		})
	}
}

// A batch under a live lease of another run (its chunk in hand: the first 3 users) is left alone: the
// other run sends it, this one comes back later.
func TestLiveLeaseIsLeftAlone(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	users := f.batchUsers(t, 0)
	epoch, err := Epoch(ctx, f.rdb) // the run's own: a lease under another would mean Redis lost data since
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.LeaseChunk(ctx, f.campaign(t), users[:3], campaign.Lease{Token: "live", Epoch: epoch, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	err = f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("err = %v, want a RetryError that is not a failure", err)
	}
	for _, u := range users {
		if st, _, _ := f.status(t, u); st != campaign.StatusPending {
			t.Errorf("%s is in a batch under another run's live lease but became %s", u, st)
		}
	}
	if got := f.provider.total(); got != 0 {
		t.Fatalf("provider got %d messages from a batch another run holds", got)
	}
	if !strings.Contains(err.Error(), "another run") {
		t.Fatalf("err = %v, want it to say another run holds the batch", err)
	}
}

// pause reaches running batches through Redis before their next claim, not at the next chunk.
func TestPauseStopsBeforeTheNextClaim(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one chunk of 25 holds the whole batch
	ctx := context.Background()
	f.provider.before = func(providers.Message) {
		if f.provider.total() == 0 {
			if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning}, campaign.StatePaused); err != nil {
				t.Error(err)
			}
			if err := Halt(ctx, f.rdb, f.id, "paused", 0); err != nil {
				t.Error(err)
			}
		}
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("err = %v, want a RetryError saying the campaign is paused", err)
	}
	if got := f.provider.total(); got != 1 {
		t.Fatalf("%d messages after the pause, want only the one in flight", got)
	}
	if c := f.counts(t); c.Sent != 1 || c.Pending != 4 {
		t.Fatalf("counts %+v", c)
	}
}

// cancel mid-batch: the send in flight is recorded, the rest become skipped (cancelled) and give their
// codes back, and a recipient whose claim holds an answer keeps it.
func TestCancelClosesTheBatch(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	c := f.campaign(t)
	f.rdb.Set(ctx, ClaimKey(f.id, "u8"), Nonce(c)+"/"+state.SentValue("SMelsewhere", 1), 0)
	f.provider.before = func(providers.Message) {
		if f.provider.total() == 0 {
			if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
				t.Error(err)
			}
			if err := Halt(ctx, f.rdb, f.id, "cancelled", time.Hour); err != nil {
				t.Error(err)
			}
		}
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.total(); got != 1 {
		t.Fatalf("%d messages, want only the one in flight", got)
	}
	st1, _, code1 := f.status(t, "u1")
	if st1 != campaign.StatusSent || code1 == "" {
		t.Fatalf("u1 (in flight at the cancel): %s, code %q", st1, code1)
	}
	if st, _, _ := f.status(t, "u8"); st != campaign.StatusSent {
		t.Fatalf("u8 (claim says sent): %s", st)
	}
	for _, u := range []string{"u2", "u4", "u7"} {
		st, reason, code := f.status(t, u)
		if st != campaign.StatusSkipped || reason != campaign.ReasonCancelled || code != "" {
			t.Errorf("%s: %s/%s code %q, want skipped/cancelled without a code", u, st, reason, code)
		}
	}
	var released int
	f.db.QueryRow(ctx, `SELECT count(*) FROM released_codes`).Scan(&released) //nolint:errcheck
	if released != 3 {
		t.Fatalf("%d codes back in the pool, want 3", released)
	}
}

// A recipient the provider always answers 5xx for does not hold its batch back: the others are sent,
// and after MaxRecipientAttempts runs it fails for good with the provider's last reason.
func TestPoisonRecipientDoesNotBlockItsBatch(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.h.cfg.SendAttempts = 1
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			return &providers.Error{Provider: "test", Status: 500, Class: providers.Transient, Message: "internal error for this number"}
		}
		return nil
	}
	ctx := context.Background()
	for run := 1; run <= MaxRecipientAttempts; run++ {
		err := f.h.RunBatch(ctx, f.id, 0)
		if run == 1 {
			if c := f.counts(t); c.Sent != 4 || c.Pending != 1 {
				t.Fatalf("after the first run: %+v; want the 4 others sent, u1 pending", c)
			}
		}
		var re *RetryError
		if run < MaxRecipientAttempts && (!errors.As(err, &re) || !re.Failure) {
			t.Fatalf("run %d: err = %v, want a RetryError counted as failure", run, err)
		}
		if run == MaxRecipientAttempts && err != nil {
			t.Fatalf("last run: %v", err)
		}
	}
	st, reason, code := f.status(t, "u1")
	if st != campaign.StatusFailed || !strings.Contains(reason, "gave up after 5 runs") || code != "" {
		t.Fatalf("u1: %s/%q code %q; want failed after 5 runs, code released", st, reason, code)
	}
	if got := f.provider.total(); got != 4 {
		t.Fatalf("provider accepted %d, want 4", got)
	}
}

// Two recipients in a row failing means the provider is in trouble: the batch stops and nobody is held
// responsible.
func TestProviderOutageStopsTheBatchWithoutBlamingRecipients(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.h.cfg.SendAttempts = 1
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
	}
	err := f.h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || !re.Failure {
		t.Fatalf("err = %v, want a RetryError counted as failure", err)
	}
	var attempts int
	f.db.QueryRow(context.Background(), `SELECT coalesce(sum(attempts), 0) FROM campaign_recipients WHERE campaign_id = $1`, f.id).Scan(&attempts) //nolint:errcheck
	if attempts != 0 || f.provider.calls != 2 {
		t.Fatalf("attempts %d, provider calls %d; want the batch stopped after 2 calls, nobody charged", attempts, f.provider.calls)
	}
}

// The sweeper settles a dead run's chunk from its claims, before its batch runs again: answered claims are
// recorded, a claim without an answer is unknown, a recipient without a claim is freed. A Redis loss after
// the sweep then costs nothing: the freed recipients are plain pending, and are sent once.
func TestSweepSettlesADeadRunsChunk(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	users := f.batchUsers(t, 0)
	n := f.leaseDead(t, users)
	f.rdb.Set(ctx, ClaimKey(f.id, "u1"), n+state.SentValue("SM1", 1), 0)
	f.rdb.Set(ctx, ClaimKey(f.id, "u2"), n+state.InFlightValue(time.Now(), "dead"), 0)
	time.Sleep(5 * time.Millisecond)
	settled, err := f.h.Sweep(ctx)
	if err != nil || settled != len(users) {
		t.Fatalf("sweep settled %d, err %v; want %d", settled, err, len(users))
	}
	for u, want := range map[string]string{"u1": campaign.StatusSent, "u2": campaign.StatusUnknown, "u4": campaign.StatusPending, "u7": campaign.StatusPending} {
		if st, _, _ := f.status(t, u); st != want {
			t.Errorf("%s: %s, want %s", u, st, want)
		}
	}
	var leased int
	f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE lease_token IS NOT NULL OR lease_users <> '{}'`).Scan(&leased) //nolint:errcheck
	if leased != 0 {
		t.Fatalf("%d rows still leased after the sweep", leased)
	}
	// Redis loses its data; the batch runs again.
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	if got := f.provider.total(); got != 3 {
		t.Fatalf("provider got %d, want the 3 freed recipients (u4 u7 u8) once each", got)
	}
	if c := f.counts(t); c.Pending != 0 || c.Unknown != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// A run that died under another Redis epoch held the last chunk of its batch (u7 u8); the run that takes
// the batch over sends in chunks of 2, so that chunk is not its first. The dead run's chunk is settled
// first all the same (unknown: a missing claim proves nothing), and only the others are sent.
func TestTakenOverChunkOutsideTheFirstChunkIsSettledFirst(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	c := f.campaign(t)
	users := f.batchUsers(t, 0)
	if _, err := f.store.LeaseChunk(ctx, c, users[3:], campaign.Lease{Token: "dead", Epoch: "lost", TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	h := NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "test", ChunkSize: 2,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}, ProviderRates: map[string]float64{}})
	if err := h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	for _, u := range users[3:] {
		if st, _, _ := f.status(t, u); st != campaign.StatusUnknown {
			t.Errorf("%s (the dead run's chunk, Redis lost since): %s, want unknown", u, st)
		}
	}
	for _, u := range users[:3] {
		if st, _, _ := f.status(t, u); st != campaign.StatusSent {
			t.Errorf("%s: %s, want sent", u, st)
		}
	}
	if got := f.provider.total(); got != 3 {
		t.Fatalf("provider got %d messages, want 3", got)
	}
}

// A lease taken while a cancel is being written waits for it and sees what it wrote: the chunk's rows the
// cancel skipped are not leased (and so not sent). The cancel locks the campaign's batch rows first, as
// CancelUnleased does; LeaseChunk locks its batch row before it reads anything.
func TestLeaseWaitsForACancelInProgress(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	c := f.campaign(t)
	users := f.batchUsers(t, 0)
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	for _, sql := range []string{
		`SELECT 1 FROM campaign_batches WHERE campaign_id = $1 FOR UPDATE`,
		`UPDATE campaigns SET state = 'cancelled' WHERE id = $1`,
		`UPDATE campaign_recipients SET status = 'skipped', reason = 'cancelled' WHERE campaign_id = $1 AND status = 'pending'`,
	} {
		if _, err := tx.Exec(ctx, sql, f.id); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		ch  campaign.Chunk
		err error
	}
	done := make(chan result, 1)
	go func() {
		ch, err := f.store.LeaseChunk(ctx, c, users, campaign.Lease{Token: "run", Epoch: "e", TTL: time.Minute})
		done <- result{ch, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the lease did not wait for the cancel's locks: %+v %v", r.ch, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.ch.State != campaign.StateCancelled || len(r.ch.Leased) != 0 {
		t.Fatalf("after the cancel: state %s, leased %v; want cancelled and nothing leased (every row was skipped)", r.ch.State, r.ch.Leased)
	}
}

// A dead run's chunk that held the last pending recipients of the campaign, all answered: the sweep
// records them and completes the campaign, whether or not the batch's task ever comes back.
func TestSweepCompletesTheCampaignOfALastChunk(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	users := f.batchUsers(t, 0)
	n := f.leaseDead(t, users)
	for _, u := range users {
		f.rdb.Set(ctx, ClaimKey(f.id, u), n+state.SentValue("SM"+u, 1), 0)
	}
	time.Sleep(5 * time.Millisecond)
	if settled, err := f.h.Sweep(ctx); err != nil || settled != len(users) {
		t.Fatalf("sweep settled %d, err %v; want %d", settled, err, len(users))
	}
	if c := f.counts(t); c.Sent != int64(len(users)) || c.Pending != 0 {
		t.Fatalf("counts %+v, want all %d sent", c, len(users))
	}
	if st := f.campaign(t).State; st != campaign.StateCompleted {
		t.Fatalf("campaign %s after the sweep of its last chunk, want completed", st)
	}
	if f.provider.total() != 0 {
		t.Fatalf("the sweep sent %d messages", f.provider.total())
	}
	if ids := followUps(t, f); len(ids) != 0 {
		t.Fatalf("the sweep of the batch's last chunk queued %v", ids)
	}
}

// followUps returns the IDs of the sweep's follow-up tasks of f's campaign in the queue.
func followUps(t *testing.T, f *fixture) []string {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	var ids []string
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){insp.ListPendingTasks, insp.ListScheduledTasks} {
		tasks, err := list(Queue)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		for _, ti := range tasks {
			if cid, _, ok := parseTaskID(ti.ID); ok && cid == f.id && strings.Contains(ti.ID, "/swept-") {
				ids = append(ids, ti.ID)
			}
		}
	}
	return ids
}

// A dead run held a chunk of a batch that has more pending recipients: the sweep settles the chunk and
// queues the batch again at once (the dead run's task stays active in Asynq until Asynq gives it back, a
// minute or more later, while the workers that are left sit idle). The follow-up is a batch task like
// any other: the DLQ and the status read it, and its run sends the rest once.
func TestSweepQueuesTheRestOfADeadRunsBatchAtOnce(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	f.deadChunkOneSent(t, 2)
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 2 {
		t.Fatalf("sweep settled %d, err %v; want the dead run's 2", settled, err)
	}
	ids := followUps(t, f)
	if len(ids) != 1 {
		t.Fatalf("follow-ups queued: %v, want one for batch 0", ids)
	}
	if cid, b, ok := parseTaskID(ids[0]); !ok || cid != f.id || b != 0 {
		t.Fatalf("follow-up %q read as campaign %d batch %d (%v)", ids[0], cid, b, ok)
	}
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent != 5 {
		t.Fatalf("counts %+v, want all 5 sent (u1 by the dead run)", c)
	}
}

// A campaign cancelled while a run held a chunk, the run then dead (a worker SIGSTOPped at the cancel, then
// killed): the cancel left the chunk to its run, and the sweep that settles it queues the batch at once,
// whose run sends nothing and closes the rest as cancelled. Before, the sweep queued nothing for a
// campaign that was not running: the rows stayed pending, with no waiting reason, until Asynq gave the dead
// run's task back 80 s later.
func TestSweepOfACancelledCampaignsDeadRunClosesItsBatchAtOnce(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	f.deadChunkOneSent(t, 2)
	if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CancelUnleased(ctx, f.id); err != nil { // the cancel's own closing: the dead run's chunk is leased
		t.Fatal(err)
	}
	if c := f.counts(t); c.Pending != 2 {
		t.Fatalf("counts %+v after the cancel, want the dead run's 2 pending", c)
	}
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 2 {
		t.Fatalf("sweep settled %d, err %v; want the dead run's 2", settled, err)
	}
	ids := followUps(t, f)
	if len(ids) != 1 {
		t.Fatalf("follow-ups queued: %v, want one for batch 0 of the cancelled campaign", ids)
	}
	f.runAll(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent != 1 || c.Skipped != 4 {
		t.Fatalf("counts %+v, want u1 sent (by the dead run) and the other 4 skipped (cancelled)", c)
	}
	if f.provider.total() != 0 {
		t.Fatalf("%d messages sent for a cancelled campaign", f.provider.total())
	}
}
