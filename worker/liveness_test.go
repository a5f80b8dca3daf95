package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testpg"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// startLiveness starts a Liveness on f's database that checks its lock every 50 ms, until stop or the
// test's end.
func startLiveness(t *testing.T, f *fixture) (l *Liveness, stop func()) {
	t.Helper()
	l = NewLiveness(f.db, nil)
	l.every = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := l.Start(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return l, cancel
}

// sweepsWithLock gives f's handler, whose sweeps the tests run, a liveness lock of its own held for grace
// (LivenessGrace): a sweep judges other holders gone only while its own lock has been held that long.
func sweepsWithLock(t *testing.T, f *fixture, grace time.Duration) *Liveness {
	t.Helper()
	l, _ := startLiveness(t, f)
	f.h.cfg.Liveness, f.h.cfg.LivenessGrace = l, grace
	waitUntil(t, grace+5*time.Second, "the sweeper's lock held for its grace", func() bool { return l.HeldFor() >= grace })
	return l
}

// leaseAs leases users of batch b for a minute under holder, as a run of the process holding that
// liveness lock does.
func (f *fixture) leaseAs(t *testing.T, b int, users []string, holder int64) {
	t.Helper()
	ctx := context.Background()
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.LeaseChunk(ctx, f.campaign(t), users, campaign.Lease{Batch: b, Token: "run" + string(rune('a'+b)), Epoch: epoch, TTL: time.Minute, Holder: holder}); err != nil {
		t.Fatal(err)
	}
}

// processes is two worker processes' liveness locks, and the chunks in hand their runs leased: the first
// three recipients of batch 0 under dead's, of batch 1 under live's.
type processes struct {
	live, dead           *Liveness
	kill                 func() // ends dead's lock, as a killed process's connection does
	deadUsers, liveUsers []string
}

func twoProcesses(t *testing.T, f *fixture) processes {
	t.Helper()
	if f.batches < 2 {
		t.Fatalf("%d batches, want 2 or more", f.batches)
	}
	var p processes
	p.live, _ = startLiveness(t, f)
	p.dead, p.kill = startLiveness(t, f)
	p.deadUsers, p.liveUsers = f.batchUsers(t, 0)[:3], f.batchUsers(t, 1)[:3]
	f.leaseAs(t, 0, p.deadUsers, p.dead.Key())
	f.leaseAs(t, 1, p.liveUsers, p.live.Key())
	return p
}

// lockedOut is a campaign of one batch (eligible u1 u2 u4 u7 u8) on a database of its own, a worker W1
// whose liveness lock (checked every 50 ms) is on a pool of one connection, which a test holds so that W1
// cannot take its lock back at once, and a sweeper (its faults store in faults) that judges at once.
type lockedOut struct {
	f       *fixture
	l       *Liveness
	pool    *pgxpool.Pool
	w1      *Handler
	w1State *faults.State // W1's Redis state, for rules
	sweeper *Handler
	faults  *faults.Store
}

func lockedOutWorker(t *testing.T) lockedOut {
	t.Helper()
	db, url := testdb.New(t)
	rdb, _ := testredis.New(t)
	lw := lockedOut{f: planOn(t, db, rdb, 10, nil, nil)}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	if lw.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lw.pool.Close)
	lw.l = NewLiveness(lw.pool, nil)
	lw.l.every = 50 * time.Millisecond
	lctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	if err := lw.l.Start(lctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	lw.w1, lw.w1State, _ = lw.f.faulty(t, func(c *Config) { c.Liveness = lw.l; c.Owner = "w1" })
	lw.sweeper, _, lw.faults = lw.f.faulty(t, nil)
	sl, _ := startLiveness(t, lw.f)
	lw.sweeper.cfg.Liveness, lw.sweeper.cfg.LivenessGrace = sl, 0
	return lw
}

// judgedGone ends W1's lock session (its pool held by the caller, so that it cannot take the lock back)
// and sweeps once, then waits goneAfter: the next sweep judges W1 gone and takes its chunk.
func (lw lockedOut) judgedGone(t *testing.T) {
	t.Helper()
	lw.f.endLockSession(t, lw.l.Key())
	lw.f.waitMissing(t, lw.l.Key())
	if _, err := lw.sweeper.Sweep(context.Background()); err != nil {
		t.Error(err)
	}
	time.Sleep(goneAfter)
}

// takeOver is judgedGone and the sweep that takes W1's chunk.
func (lw lockedOut) takeOver(t *testing.T) {
	t.Helper()
	lw.judgedGone(t)
	if n, err := lw.sweeper.Sweep(context.Background()); err != nil || n == 0 {
		t.Errorf("the sweep did not take W1's chunk (settled %d, %v)", n, err)
	}
}

// freeThenSentOnce checks that f's batch 0 (eligible u1 u2 u4 u7 u8) is free after the sweeps, no lease
// on it and nothing in hand, then runs it: all five end sent, once.
func (f *fixture) freeThenSentOnce(t *testing.T) {
	t.Helper()
	var inHand []string
	var token *string
	if err := f.db.QueryRow(context.Background(), `SELECT lease_users, lease_token FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&inHand, &token); err != nil {
		t.Fatal(err)
	}
	if len(inHand) != 0 || token != nil {
		t.Fatalf("after the sweeps the batch is held (token %v, in hand %v), want it free for the follow-up", token, inHand)
	}
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent != 5 {
		t.Fatalf("counts %+v, want all 5 sent", c)
	}
}

// endLockSession terminates the session that holds key's liveness lock, as a broken connection ends it.
func (f *fixture) endLockSession(t *testing.T, key int64) {
	t.Helper()
	var ok bool
	if err := f.db.QueryRow(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295`,
		key).Scan(&ok); err != nil || !ok {
		t.Errorf("the session of lock %d was not terminated: %v, %v", key, ok, err)
	}
}

// waitMissing waits until the sweep's query finds holder's lock missing, or fails after 5 s.
func (f *fixture) waitMissing(t *testing.T, holder int64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; {
		gone, err := f.store.GoneHolders(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(gone, holder) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("holder %d still found alive 5 s after its lock was let go (found gone: %v)", holder, gone)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A worker process killed outright lets its liveness lock go with its connection. The sweep of the
// workers left takes its chunk once two sweeps goneAfter apart found the lock missing, nearly a minute
// before the chunk's lease expires: a claim with an answer is recorded, one without is unknown (the
// process that made the call is dead), and the rest of the batch is queued at once. The chunk of a live
// process, under a lease as long, is left alone.
func TestTheChunkOfADeadProcessIsTakenWithinSeconds(t *testing.T) {
	t.Parallel()
	f := plan(t, 40)
	ctx := context.Background()
	p := twoProcesses(t, f)
	dead, kill, deadUsers, liveUsers := p.dead, p.kill, p.deadUsers, p.liveUsers
	sweepsWithLock(t, f, 200*time.Millisecond)
	n := Nonce(f.campaign(t)) + "/"
	f.rdb.Set(ctx, ClaimKey(f.id, deadUsers[0]), n+state.SentValue("SM1", 1), 0)
	f.rdb.Set(ctx, ClaimKey(f.id, deadUsers[1]), n+state.InFlightValue(time.Now(), "dead"), 0)
	f.rdb.Set(ctx, ClaimKey(f.id, liveUsers[0]), n+state.InFlightValue(time.Now(), "live"), 0)

	if settled, err := f.h.Sweep(ctx); err != nil || settled != 0 {
		t.Fatalf("with both processes alive the sweep settled %d (%v), want none", settled, err)
	}
	kill()
	f.waitMissing(t, dead.Key())
	start := time.Now()
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 0 {
		t.Fatalf("the sweep that first found the lock missing settled %d (%v), want none: a live process whose connection broke takes it back within a second", settled, err)
	}
	time.Sleep(goneAfter)
	if settled, err := f.h.Sweep(ctx); err != nil || settled != len(deadUsers) {
		t.Fatalf("a sweep %v after the lock went missing settled %d (%v), want the dead process's %d", time.Since(start).Round(time.Millisecond), settled, err, len(deadUsers))
	}
	status := func(u string) string {
		var s string
		if err := f.db.QueryRow(ctx, `SELECT status FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, f.id, u).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for u, want := range map[string]string{deadUsers[0]: "sent", deadUsers[1]: "unknown", deadUsers[2]: "pending", liveUsers[0]: "pending"} {
		if got := status(u); got != want {
			t.Errorf("%s: %s, want %s", u, got, want)
		}
	}
	var inHand []string
	if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 1`, f.id).Scan(&inHand); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(inHand, liveUsers) {
		t.Errorf("the live process's chunk in hand is %v after the sweeps, want %v", inHand, liveUsers)
	}
	if ids := followUps(t, f); len(ids) != 1 {
		t.Errorf("follow-ups queued: %v, want one, for the dead process's batch", ids)
	}
	if f.provider.total() != 0 {
		t.Fatalf("the sweep sent %d messages", f.provider.total())
	}
}

// A live process whose lock's session ended (its connection to Postgres broke, or was terminated) takes
// the lock again at its next check: sweeps on either side of the gap, goneAfter apart, leave its chunk
// alone.
func TestALiveProcessTakesItsLockBackBeforeItsChunkIsTaken(t *testing.T) {
	t.Parallel()
	f := plan(t, 40)
	ctx := context.Background()
	live, _ := startLiveness(t, f)
	users := f.batchUsers(t, 0)[:3]
	f.leaseAs(t, 0, users, live.Key())
	sweepsWithLock(t, f, 200*time.Millisecond)
	f.endLockSession(t, live.Key())
	f.waitMissing(t, live.Key())
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 0 {
		t.Fatalf("sweep settled %d (%v), want none", settled, err)
	}
	for end := time.Now().Add(5 * time.Second); !live.Held(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the lock was not taken back within 5 s")
		}
	}
	time.Sleep(goneAfter)
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 0 {
		t.Fatalf("a sweep %v later, the lock held again, settled %d (%v), want none", goneAfter, settled, err)
	}
	if gone, err := f.store.GoneHolders(ctx); err != nil || slices.Contains(gone, live.Key()) {
		t.Fatalf("holders gone: %v (%v); the live one's lock is held again", gone, err)
	}
}

// A run whose lease names its process's lock sends nothing while the lock is lost: another worker's
// sweep may be taking its chunk. It waits a second for the lock to come back (a terminated session is
// replaced within a fraction of that), then hands its batch back.
func TestARunSendsNothingWhileItsProcessHasLostItsLock(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	l := NewLiveness(f.db, nil) // never started: not held
	f.h.cfg.Liveness = l
	// A lease taken without the lock (it was not held then) does not depend on it.
	if h := f.h.holder(); h != 0 {
		t.Fatalf("the process's leases carry holder %d while its lock is not held, want 0", h)
	}
	// The run's lease on the batch, not due for renewal: only the lock's loss can stop the run here.
	f.leaseAs(t, 0, nil, l.Key())
	run := &batchRun{c: f.campaign(t), lease: campaign.Lease{Token: "runa", TTL: time.Minute, Holder: l.Key()}, renewAt: time.Now().Add(time.Hour)}
	start := time.Now()
	err := f.h.renew(context.Background(), run)
	var re *RetryError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "liveness lock") {
		t.Fatalf("renew with the lock lost: %v, want the run handed back until the lock is held", err)
	}
	if waited := time.Since(start); waited < regainLiveness {
		t.Fatalf("the run gave up after %v, before the lock had %v to come back", waited, regainLiveness)
	}
	// Back within the wait: the run confirms its lease, still its own, and goes on.
	go func() { time.Sleep(200 * time.Millisecond); l.lastOK.Store(time.Now().UnixNano()) }()
	if err := f.h.renew(context.Background(), run); err != nil {
		t.Fatalf("renew with the lock back after 200 ms: %v", err)
	}
}

// onPrivateServers plans a campaign of 30 customers in batches of 8 on a Postgres and a Redis of the
// test's own, which it may crash and restart.
func onPrivateServers(t *testing.T) (*testpg.Server, *fixture) {
	t.Helper()
	pg, _, f := privateServers(t, 8)
	return pg, f
}

// privateServers is onPrivateServers in batches of batchSize, with the Redis server too.
func privateServers(t *testing.T, batchSize int) (*testpg.Server, *testredis.Server, *fixture) {
	t.Helper()
	pg := testpg.Start(t)
	db, _ := pg.Migrated("campaignctl")
	red := testredis.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: red.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return pg, red, planOn(t, db, rdb, 30, func(s *campaign.Spec) { s.BatchSize = batchSize }, nil)
}

// A Postgres crash lets every liveness lock go, the sweeping worker's own, the live workers' and a dead
// one's alike. Nothing is judged gone until the sweeper has held its own lock again for LivenessGrace (10 s
// by default): the live worker takes its lock back meanwhile and its chunk is never taken, while the chunk
// of the worker that died during the outage is taken once that time is over.
func TestAfterAPostgresCrashOnlyTheDeadWorkersChunkIsTaken(t *testing.T) {
	t.Parallel()
	pg, f := onPrivateServers(t)
	ctx := context.Background()
	p := twoProcesses(t, f)
	live, kill, liveUsers := p.live, p.kill, p.liveUsers
	sweeper, _ := startLiveness(t, f)
	f.h.cfg.Liveness = sweeper // the default grace
	grace := f.h.cfg.LivenessGrace

	pg.Crash()
	kill() // the worker dies while Postgres is down
	pg.Restart()
	restarted := time.Now()
	inHand := func(b int) []string {
		var users []string
		if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = $2`, f.id, b).Scan(&users); err != nil {
			t.Fatal(err)
		}
		return users
	}
	var taken time.Duration
	for taken == 0 {
		if since := time.Since(restarted); since > grace+3*goneAfter {
			t.Fatalf("the dead worker's chunk was not taken %v after the restart", since.Round(time.Millisecond))
		}
		time.Sleep(250 * time.Millisecond)
		if _, err := f.h.Sweep(ctx); err != nil {
			continue // the pool's connections from before the crash fail once each
		}
		if got := inHand(1); !slices.Equal(got, liveUsers) {
			t.Fatalf("%v after the restart the live worker's chunk in hand is %v, want %v", time.Since(restarted).Round(time.Millisecond), got, liveUsers)
		}
		if len(inHand(0)) == 0 {
			taken = time.Since(restarted)
		}
	}
	if !live.Held() {
		t.Fatal("the live worker's lock is not held again")
	}
	if taken < grace {
		t.Fatalf("the dead worker's chunk was taken %v after Postgres started: before any live worker was sure to hold its lock again", taken.Round(time.Millisecond))
	}
	t.Logf("the dead worker's chunk was taken %v after the restart", taken.Round(time.Millisecond))
}

// The sweeps of all workers find a dead process in the same second: one settles its chunk and queues the
// rest of the batch, and the other, whose list of dead chunks was read before that, finds the chunk no
// longer a dead run's. It settles nothing, queues nothing and leaves the batch free for the follow-up.
func TestTwoSweepsOfOneDeadChunkQueueOneFollowUp(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	f.deadChunkOneSent(t, 3)
	late, _, fs := f.faulty(t, nil)
	// The late sweep has read the dead chunks and waits past the next second to lease one.
	stall := fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Kind: faults.Stall, Delay: 1100 * time.Millisecond, Times: 1})
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() { n, err := late.Sweep(ctx); done <- result{n, err} }()
	for stall.Hits() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if settled, err := f.h.Sweep(ctx); err != nil || settled != 3 {
		t.Fatalf("the first sweep settled %d (%v), want the dead run's 3", settled, err)
	}
	r := <-done
	if r.err != nil || r.n != 0 {
		t.Fatalf("the late sweep settled %d (%v), want none: the chunk was settled already", r.n, r.err)
	}
	if ids := followUps(t, f); len(ids) != 1 {
		t.Fatalf("follow-ups queued: %v, want one", ids)
	}
	f.freeThenSentOnce(t)
}

// A worker killed between two chunks of a batch leaves nothing in hand but its lease on the batch, and
// its batch task active in the queue until the queue's own recovery gives it back, a minute later. Once
// its lock is found gone, the sweep lets the batch go and queues its rest at once.
func TestABatchWhoseWorkerDiedBetweenChunksIsQueuedAgain(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	dead, kill := startLiveness(t, f)
	f.leaseAs(t, 0, nil, dead.Key()) // the batch leased, no chunk in hand
	sweepsWithLock(t, f, 200*time.Millisecond)
	kill()
	f.waitMissing(t, dead.Key())
	if _, err := f.h.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(goneAfter)
	if _, err := f.h.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := followUps(t, f); len(ids) != 1 {
		t.Fatalf("follow-ups queued: %v, want one for the dead worker's batch", ids)
	}
	f.freeThenSentOnce(t)
}

// A live worker whose lock's session ended cannot get it back for a while (its pool has no free
// connection) and is judged gone; the sweep that judged it is slow to reach the chunk, and the worker holds
// its lock again first. The sweep must then leave the chunk alone: were it to take it over, free the
// recipients without a claim and queue the batch again, the worker, not told, would go on claiming them,
// and after a Redis loss the follow-up would send them a second time. And a worker that lost its lock
// confirms its lease before it claims again.
func TestALockTakenBackBeforeTheTakeoverKeepsTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lw := lockedOutWorker(t)
	f, l, lpool, w1, sweeper, fs := lw.f, lw.l, lw.pool, lw.w1, lw.sweeper, lw.faults
	follow := f.handler(f.rdb)
	var mu sync.Mutex
	step := 0
	swept := make(chan int, 1)
	f.provider.before = func(m providers.Message) {
		mu.Lock()
		step++
		s := step
		mu.Unlock()
		switch s {
		case 1: // W1 is sending u1
			hold, err := lpool.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			lw.judgedGone(t)
			stall := fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Kind: faults.Stall, Delay: 800 * time.Millisecond, Times: 1})
			go func() {
				n, err := sweeper.Sweep(ctx)
				if err != nil {
					t.Error(err)
				}
				swept <- n
			}()
			for stall.Hits() == 0 {
				time.Sleep(2 * time.Millisecond)
			}
			hold.Release() // W1 takes its lock back while the sweep is on its way to the chunk
			waitUntil(t, 3*time.Second, "W1's lock held again", l.Held)
		case 2:
			if n := <-swept; n != 0 {
				t.Errorf("the sweep took W1's chunk (settled %d) though W1 held its lock again", n)
			}
		case 3: // Redis loses its data while W1 sends; a follow-up run of the batch starts
			if err := f.rdb.FlushDB(ctx).Err(); err != nil {
				t.Error(err)
			}
			_ = follow.RunBatch(ctx, f.id, 0) // W1 still holds the batch: the follow-up waits
		}
	}
	_ = w1.RunBatch(ctx, f.id, 0) // ends on the Redis loss
	f.provider.before = nil
	f.assertOnce(t)
	if step < 3 {
		t.Fatalf("W1 sent %d messages, want 3 or more: the test did not get to the Redis loss", step)
	}
}

// A live worker whose lock's session ended is judged gone while it cannot take the lock back, and its
// chunk is taken over; when it holds the lock again, it confirms its lease before it claims anything more,
// finds it lost, and stops: it sends nobody the sweep freed.
func TestAWorkerThatLostItsChunkWhileItsLockWasGoneStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lw := lockedOutWorker(t)
	f, lpool, w1 := lw.f, lw.pool, lw.w1
	var mu sync.Mutex
	var sent []string
	f.provider.before = func(m providers.Message) {
		mu.Lock()
		sent = append(sent, m.To)
		first := len(sent) == 1
		mu.Unlock()
		if !first {
			return
		}
		// W1 is sending its first recipient: its lock's session ends and its pool is held.
		hold, err := lpool.Acquire(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer hold.Release() // then W1 takes its lock back
		lw.takeOver(t)
	}
	err := w1.RunBatch(ctx, f.id, 0)
	f.provider.before = nil
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("W1's run: %v, want it handed back (its lease lost)", err)
	}
	if len(sent) != 1 {
		t.Fatalf("W1 sent %v: after its chunk was taken over it sent %d more", sent, len(sent)-1)
	}
}

// W1's claim stalls on Redis; meanwhile its lock's session ends, it is judged gone and its chunk taken
// over, and it takes its lock back. When the claim returns, W1 confirms its lease before the send leaves,
// finds it lost, sends nothing and gives the claim back: the follow-up sends that recipient, once.
func TestAClaimThatStalledWhileTheChunkWasTakenIsNotSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lw := lockedOutWorker(t)
	f, l := lw.f, lw.l
	stall := lw.w1State.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 6 * time.Second})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for stall.Hits() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		hold, err := lw.pool.Acquire(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		lw.takeOver(t)
		hold.Release()
		waitUntil(t, 3*time.Second, "W1's lock held again", l.Held)
	}()
	err := lw.w1.RunBatch(ctx, f.id, 0)
	<-done
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("W1's run: %v, want it handed back (its lease lost)", err)
	}
	if n := f.provider.total(); n != 1 {
		t.Fatalf("W1 sent %d messages, want only the one before the stall", n)
	}
	waitUntil(t, 5*time.Second, "W1's stalled claim given back", func() bool {
		keys, err := f.rdb.Keys(ctx, ClaimKey(f.id, "*")).Result()
		if err != nil {
			return false
		}
		for _, k := range keys {
			if v, err := f.rdb.Get(ctx, k).Result(); err != nil || strings.HasSuffix(v, "w1") {
				return false // an in-flight claim of W1's
			}
		}
		return len(keys) > 0
	})
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent+c.Unknown != 5 {
		t.Fatalf("counts %+v, want everyone settled", c)
	}
}

// liveRun is a campaign planned on a private Postgres and Redis whose batch 1 has three users leased, for a
// second, to a run (token "live-run") of a live worker: one whose liveness lock (live) is held.
type liveRun struct {
	pg    *testpg.Server
	f     *fixture
	live  *Liveness
	stop  func() // ends the live worker's liveness: its lock is not taken again
	users []string
	epoch string // the lease's Redis epoch
}

// leaseOfALiveRun returns a liveRun.
func leaseOfALiveRun(t *testing.T) liveRun {
	t.Helper()
	r := liveRun{}
	r.pg, r.f = onPrivateServers(t)
	ctx := context.Background()
	r.live, r.stop = startLiveness(t, r.f)
	r.users = r.f.batchUsers(t, 1)[:3]
	var err error
	if r.epoch, err = Epoch(ctx, r.f.rdb); err != nil {
		t.Fatal(err)
	}
	if _, err := r.f.store.LeaseChunk(ctx, r.f.campaign(t), r.users, campaign.Lease{Batch: 1, Token: "live-run", Epoch: r.epoch, TTL: time.Second, Holder: r.live.Key()}); err != nil {
		t.Fatal(err)
	}
	return r
}

// outliveTheLease crashes pg for longer than leaseOfALiveRun's lease, so that it runs out while nobody
// can renew it, and restarts it. It returns when the restart began: Postgres, and every session, started
// after that.
func outliveTheLease(pg *testpg.Server) time.Time {
	pg.Crash()
	time.Sleep(1500 * time.Millisecond)
	restarted := time.Now()
	pg.Restart()
	return restarted
}

// A Postgres outage longer than a live run's lease: no run could renew its lease meanwhile, so when
// Postgres is back the lease has run out, though its run lives (it renews or records within seconds). No
// sweep takes that chunk until the sweeper's own lock has been held again for LivenessGrace: taken at once,
// it was settled from its claims, and after a Redis wipe during the outage the run's recipients never sent
// became unknown (a live worker's chunk, 30 to 40 recipients a run in an outside check). A lease nobody
// renews is still taken once that time is over.
func TestAfterAPostgresOutageALiveRunsExpiredLeaseWaitsForTheGrace(t *testing.T) {
	t.Parallel()
	r := leaseOfALiveRun(t)
	pg, f, users := r.pg, r.f, r.users
	ctx := context.Background()
	sweeper, _ := startLiveness(t, f)
	const grace = 2 * time.Second
	f.h.cfg.Liveness, f.h.cfg.LivenessGrace = sweeper, grace

	restarted := outliveTheLease(pg)
	inHand := func() []string {
		var got []string
		if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 1`, f.id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	var taken time.Duration
	for taken == 0 {
		since := time.Since(restarted)
		if since > grace+3*time.Second {
			t.Fatalf("the expired lease nobody renewed was not taken %v after the restart", since.Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := f.h.Sweep(ctx); err != nil {
			continue // the pool's connections from before the crash fail once each
		}
		if got := inHand(); !slices.Equal(got, users) {
			taken = time.Since(restarted)
		}
	}
	if taken < grace {
		t.Fatalf("the live run's expired lease was taken %v after Postgres was back, before the sweeper's lock was held for %v", taken.Round(time.Millisecond), grace)
	}
}

// A lease of a batch run of this very process is never taken over here, even once it ran out: the run is
// alive (its lease ran out while Postgres was away, and it is writing its chunk's outcomes). Another run of
// the same batch (queued again by `resume` right after Postgres was back) and this process's sweep find
// the chunk busy and leave it. Before, the new run fenced the live run's lease and took its chunk; after a
// Redis wipe during the outage the chunk's recipients never sent became unknown (25 to 40 a run in an
// outside check). A lease of a run this process does not hold is taken over as before.
func TestALiveRunsExpiredLeaseIsNotTakenOverByItsOwnProcess(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch
	ctx := context.Background()
	users := f.batchUsers(t, 0)[:3]
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	take := func(token string, live bool) campaign.Chunk {
		t.Helper()
		if _, err := f.store.LeaseChunk(ctx, f.campaign(t), users, campaign.Lease{Batch: 0, Token: token, Epoch: epoch, TTL: 50 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		f.h.leaseLive(token, live)
		time.Sleep(100 * time.Millisecond) // the lease runs out
		c := f.campaign(t)
		run := &batchRun{c: c, nonce: Nonce(c), batch: 0, counts: map[string]int64{}, snapshots: map[string]campaign.ConsentRecord{},
			lease: campaign.Lease{Batch: 0, Token: "next-" + token, Epoch: epoch, TTL: time.Minute}}
		got, err := f.h.leaseChunk(ctx, run, users)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := take("live-run", true); got.TookOver || got.Busy != len(users) {
		t.Fatalf("a live run's expired lease: took over %v, busy %d; want it left alone, the chunk busy", got.TookOver, got.Busy)
	}
	var token string
	if err := f.db.QueryRow(ctx, `SELECT lease_token FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&token); err != nil || token != "live-run" {
		t.Fatalf("the batch's lease is %q (%v), want the live run's", token, err)
	}
	f.h.leaseLive("live-run", false)
	if got := take("dead-run", false); !got.TookOver {
		t.Fatalf("the expired lease of a run that is not live here: took over %v, want it taken", got.TookOver)
	}
}

// The same outage seen from another worker process: one started after Postgres was back (its lock's first
// hold, so its sweep is not held back by its own restart) or one whose next run of the batch comes first.
// The live run's lease ran out while nobody could renew it. Neither that sweep nor that run takes the chunk
// until LivenessGrace after Postgres came back (Lease.HolderGrace): the holder's lock is held again by a
// session a moment old, or not held again yet (a live worker takes it back within about 100 ms of
// Postgres's return, and a sweep in that moment took its chunk: 60 to 120 recipients unknown in 6 of 59
// runs of an outside check). Taken at once, the live run's recipients never sent became unknown after a
// Redis wipe during the outage. A lease its holder does not renew is taken once that time is over.
func TestAfterAPostgresOutageAnotherWorkerLeavesALiveRunsExpiredLeaseForTheGrace(t *testing.T) {
	t.Parallel()
	for _, back := range []bool{true, false} {
		name := map[bool]string{true: "holder-back", false: "holder-not-back-yet"}[back]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := leaseOfALiveRun(t)
			f := r.f
			ctx := context.Background()
			if !back {
				r.stop() // its lock is lost with Postgres and not taken again: as in the moment before it is
			}
			restarted := outliveTheLease(r.pg)
			if back {
				waitUntil(t, 10*time.Second, "the live worker's lock held again", r.live.Held)
			}
			const grace = 2 * time.Second
			other, _ := startLiveness(t, f) // a worker started now: its lock's first hold
			f.h.cfg.Liveness, f.h.cfg.LivenessGrace = other, grace
			if other.Gen() != 1 {
				t.Fatalf("the other worker's lock is in its hold %d, want its first", other.Gen())
			}
			var token string
			var taken time.Duration
			by := ""
			for taken == 0 {
				since := time.Since(restarted)
				if since > grace+5*time.Second {
					t.Fatalf("the expired lease its holder never renewed was not taken %v after the restart", since.Round(time.Millisecond))
				}
				time.Sleep(50 * time.Millisecond)
				c := f.campaign(t)
				run := &batchRun{c: c, nonce: Nonce(c), batch: 1, counts: map[string]int64{}, snapshots: map[string]campaign.ConsentRecord{},
					lease: campaign.Lease{Batch: 1, Token: state.Token(), Epoch: r.epoch, TTL: time.Minute, Holder: other.Key(), HolderGrace: grace}}
				got, err := f.h.leaseChunk(ctx, run, r.users)
				if err != nil {
					t.Fatal(err)
				}
				if got.TookOver {
					taken, by = time.Since(restarted), "a run of the batch"
					break
				}
				if _, err := f.h.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
				if err := f.db.QueryRow(ctx, `SELECT coalesce(lease_token, '') FROM campaign_batches WHERE campaign_id = $1 AND batch = 1`, f.id).Scan(&token); err != nil {
					t.Fatal(err)
				}
				if token != "live-run" {
					taken, by = time.Since(restarted), "the sweep"
				}
			}
			if taken < grace {
				t.Fatalf("%s of another worker took the live run's expired lease %v after Postgres was back, before %v", by, taken.Round(time.Millisecond), grace)
			}
		})
	}
}

// A worker whose own liveness lock is not held (lost, not taken again yet) sweeps nothing, not even a
// dead process's expired lease: Postgres may have come back a moment ago, before the live workers took
// their locks back, when their leases that ran out look like a dead process's. Once it holds its lock
// again, it waits LivenessGrace, then takes the dead process's lease.
func TestASweeperWithoutItsLockSweepsNothing(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	ctx := context.Background()
	users := f.batchUsers(t, 1)[:3]
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.LeaseChunk(ctx, f.campaign(t), users, campaign.Lease{Batch: 1, Token: "dead-run", Epoch: epoch, TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	sweeper, stop := startLiveness(t, f)
	f.h.cfg.Liveness, f.h.cfg.LivenessGrace = sweeper, 0
	stop()
	waitUntil(t, 5*time.Second, "the sweeper's lock no longer held", func() bool { return !sweeper.Held() })
	time.Sleep(100 * time.Millisecond) // the dead run's lease runs out
	if n, err := f.h.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("a sweeper without its lock settled %d (%v), want 0", n, err)
	}
	var token string
	if err := f.db.QueryRow(ctx, `SELECT coalesce(lease_token, '') FROM campaign_batches WHERE campaign_id = $1 AND batch = 1`, f.id).Scan(&token); err != nil || token != "dead-run" {
		t.Fatalf("the batch's lease is %q (%v), want the dead run's, untouched", token, err)
	}
	again, _ := startLiveness(t, f)
	f.h.cfg.Liveness = again
	if n, err := f.h.Sweep(ctx); err != nil || n != len(users) {
		t.Fatalf("a sweeper holding its lock settled %d (%v), want the dead run's %d", n, err, len(users))
	}
}
