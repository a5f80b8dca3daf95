package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/providers"
)

// A pause (or cancel) issued while Redis stalls lands in Redis behind the window's claims: the claims are
// granted, the halt is written, and the pause returns, all before the worker gets the claims' reply. The
// sends must not leave then: Pause promises that no new send starts once it returned. The claims' guard
// is read again before sends whose claims are that old; the recipients stay pending, their claims given
// back, and the batch reads the campaign's state (paused) and stops.
func TestAPauseWrittenBehindStalledClaimsStopsTheirSends(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		how    string
		window int
	}{{"pause", 1}, {"cancel", 1}, {"pause", 8}, {"cancel", 8}} {
		how := c.how
		t.Run(fmt.Sprintf("%s, window of %d", c.how, c.window), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 20)
			ctx := context.Background()
			h, fr, _ := f.faulty(t, func(cfg *Config) { cfg.SendWindow = c.window })
			slow := fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow", "ClaimSend"), Times: 1, Kind: faults.SlowReply, Delay: 400 * time.Millisecond})
			stopped := make(chan time.Time, 1)
			go func() {
				for end := time.Now().Add(10 * time.Second); slow.Hits() == 0; time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Error("no claim was taken")
						stopped <- time.Now()
						return
					}
				}
				time.Sleep(50 * time.Millisecond) // the claims ran; their reply is held
				var err error
				if how == "pause" {
					_, err = Pause(ctx, PauseOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
				} else {
					_, err = Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
				}
				if err != nil {
					t.Error(err)
				}
				stopped <- time.Now()
			}()
			err := h.RunBatch(ctx, f.id, 0)
			at := <-stopped
			if sent := f.provider.total(); sent != 0 {
				t.Fatalf("%d messages sent after the %s returned (at %s; batch: %v); want none", sent, how, at.Format("15:04:05.000"), err)
			}
			if slow.Hits() != 1 {
				t.Fatalf("the claims' reply was held %d times, want 1", slow.Hits())
			}
			var sentRows int
			if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = $2`, f.id, campaign.StatusSent).Scan(&sentRows); err != nil {
				t.Fatal(err)
			}
			if sentRows != 0 {
				t.Fatalf("%d recipients recorded sent", sentRows)
			}
		})
	}
}

// A send whose checks passed just before a pause or cancel wrote its halt may leave a little later on a
// loaded machine (its goroutine waits for a core). Pause and cancel return only once such a send has left:
// no new send starts after they return. Here each send leaves 30 ms after its checks; an outside run with
// Redis stalled saw sends start up to 26 ms after the pause had returned.
func TestNoSendStartsAfterAPauseReturns(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"pause", "cancel"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 20)
			ctx := context.Background()
			var mu sync.Mutex
			var left []time.Time
			first := make(chan struct{})
			var once sync.Once
			f.provider.before = func(providers.Message) {
				once.Do(func() { close(first) })
				time.Sleep(30 * time.Millisecond) // descheduled between the checks and the request
				mu.Lock()
				left = append(left, time.Now())
				mu.Unlock()
			}
			stopped := make(chan time.Time, 1)
			done := make(chan struct{})
			defer func() { <-done }()
			go func() {
				defer close(done)
				<-first
				var err error
				if how == "pause" {
					_, err = Pause(ctx, PauseOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
				} else {
					_, err = Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, Recorded: func(CancelReport) { stopped <- time.Now() }})
				}
				if err != nil {
					t.Error(err)
				}
				if how == "pause" {
					stopped <- time.Now()
				}
			}()
			h := f.h
			h.RunBatch(ctx, f.id, 0) //nolint:errcheck // the pause or cancel stops it
			at := <-stopped
			mu.Lock()
			defer mu.Unlock()
			if len(left) == 0 {
				t.Fatal("nothing was sent: this tests nothing")
			}
			for _, l := range left {
				if l.After(at) {
					t.Fatalf("a send left %v after the %s said no new send starts", l.Sub(at).Round(time.Millisecond), how)
				}
			}
		})
	}
}

// The second read of the claims' guard fails closed: when Redis does not answer it, the window is not sent
// (its claims are given back once Redis answers), the batch waits without using up its retries, and its
// next run sends every recipient once. (Mutation: sending on a failed guard read. Caught: the window went
// out with the guard unread.)
func TestAFailedSecondReadOfTheGuardSendsNothing(t *testing.T) {
	t.Parallel()
	f := plan(t, 20)
	ctx := context.Background()
	h, fr, _ := f.faulty(t, func(cfg *Config) { cfg.SendWindow = 8 })
	fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Times: 1, Kind: faults.SlowReply, Delay: 200 * time.Millisecond})
	guard := fr.Add(&faults.Rule{Match: faults.Method("StillGuarded"), Times: 1, Kind: faults.Fail})
	err := h.RunBatch(ctx, f.id, 0)
	notFailure(t, err)
	if err == nil {
		t.Fatal("the batch ended as if sent, with the guard unread")
	}
	if guard.Hits() != 1 {
		t.Fatalf("the guard was read again %d times, want 1", guard.Hits())
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent with the claims' guard unread", n)
	}
	for b := 0; b < f.batches; b++ {
		notFailure(t, h.RunBatch(ctx, f.id, b))
	}
	for to, bodies := range f.provider.accepted {
		if len(bodies) != 1 {
			t.Fatalf("%s got %d messages", to, len(bodies))
		}
	}
	var pending int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'pending'`, f.id).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || f.provider.total() == 0 {
		t.Fatalf("after the retry: %d pending, %d sent", pending, f.provider.total())
	}
}
