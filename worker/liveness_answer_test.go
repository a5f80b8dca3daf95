package worker

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// Without a cap, u1's answer is held for u2's claim. Before u2's claim, readyToSend renews
// the lease; W1's liveness lock was lost meanwhile (its session ended, its pool busy), so renew waits up to
// regainLiveness (1 s) for it. u1's answer must be in its claim before that wait: a worker killed during it
// would leave u1 in flight, made unknown by the sweep and sent a second time by `resume --resend-unknown`.
func TestAnAnswerIsWrittenBeforeTheWaitForALostLivenessLock(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 2} {
		t.Run("window "+strconv.Itoa(window), func(t *testing.T) {
			t.Parallel()
			answerBeforeLivenessAwait(t, window)
		})
	}
}

func answerBeforeLivenessAwait(t *testing.T, window int) {
	ctx := context.Background()
	lw := lockedOutWorker(t)
	f := lw.f
	w1, w1State, w1Store := f.faulty(t, func(c *Config) { c.Liveness = lw.l; c.Owner = "w1"; c.SendWindow = window })
	var once sync.Once
	release := func() {}
	f.provider.before = func(m providers.Message) {
		if m.To != phone(1) {
			return
		}
		once.Do(func() {
			// W1's lock session ends while u1's request is out; its pool is held, so it cannot retake it.
			hold, err := lw.pool.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			release = hold.Release
			f.endLockSession(t, lw.l.Key())
			waitUntil(t, 3*time.Second, "W1's lock seen lost", func() bool { return !lw.l.Held() })
		})
	}
	wctx, kill := context.WithCancel(ctx)
	defer kill()
	done := make(chan error, 1)
	go func() { done <- w1.RunBatch(wctx, f.id, 0) }()
	waitUntil(t, 10*time.Second, "u1 accepted", func() bool { return len(f.provider.sentTo(phone(1))) == 1 })
	time.Sleep(300 * time.Millisecond) // W1 now waits in renew for its lock (regainLiveness)
	nonce := Nonce(f.campaign(t))
	v, err := f.rdb.Get(ctx, ClaimKey(f.id, "u1")).Result()
	inFlight := err == nil && state.ParseValue(strings.TrimPrefix(v, nonce+"/")).Kind != state.Sent
	if inFlight {
		t.Errorf("u1 was accepted, and while W1 waits for its liveness lock its claim says %q: the answer is not in it", v)
	}
	// W1 is killed during the wait: nothing more of it reaches Redis or Postgres.
	all := func(faults.Call) bool { return true }
	w1State.Add(&faults.Rule{Match: all, Kind: faults.Fail})
	w1Store.Add(&faults.Rule{Match: all, Kind: faults.Fail})
	kill()
	<-done
	defer release() // a dead process never takes its lock back
	// The sweep judges W1 gone (its lock missing twice, goneAfter apart) and settles its chunk in hand;
	// the operator resends the unknown.
	f.waitMissing(t, lw.l.Key())
	if _, err := lw.sweeper.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(goneAfter)
	if _, err := lw.sweeper.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusSent {
		t.Errorf("u1 is %s (%s) after the sweep, want sent (the provider accepted it)", st, reason)
	}
	// The operator resends the unknown later than ResendGrace: the claim is aged as that much time would.
	if v, err := f.rdb.Get(ctx, ClaimKey(f.id, "u1")).Result(); err == nil {
		parts := strings.Split(v, "|")
		if len(parts) == 3 && strings.HasSuffix(parts[0], "/c") {
			parts[1] = strconv.FormatInt(time.Now().Add(-2*ResendGrace).UnixMilli(), 10)
			f.rdb.SetArgs(ctx, ClaimKey(f.id, "u1"), strings.Join(parts, "|"), redis.SetArgs{KeepTTL: true})
		}
	}
	if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	t.Logf("u1 was sent %d times", len(f.provider.sentTo(phone(1))))
	f.assertOnce(t)
}
