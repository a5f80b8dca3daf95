package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
)

// deadRunUnderLostEpoch leases batch 0's chunk as a run that then died under a Redis epoch since lost
// (Redis lost its data), after the provider accepted the messages of sent (the users' numbers, by index):
// their claims are gone with the epoch, and only the chunk's suspicion says they may have been sent.
func (f *fixture) deadRunUnderLostEpoch(t *testing.T, sent ...int) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.store.LeaseChunk(ctx, f.campaign(t), f.batchUsers(t, 0), campaign.Lease{Token: "dead", Epoch: "lost", TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	f.provider.mu.Lock()
	for _, i := range sent {
		f.provider.accepted[phone(i)] = []string{"sent by the dead run"}
	}
	f.provider.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // its lease runs out
}

// A run dies holding a chunk under a Redis epoch since lost, after sending some of it. The run that takes
// the chunk over marks its pending recipients suspect (their messages may have gone out), and stops before
// it settles them: a Redis call fails (Redis still flapping after its restart), the reply of its lease
// statement is lost, or its worker is stopped (SIGTERM: a deploy, a scale-down). Its lease recorded the new
// epoch, and the mark must outlive that: the next run must settle them as unknown, not send them again.
func TestASuspectChunkStaysSuspectWhenItsTakeoverStops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stop func(*Handler, *faults.State, *faults.Store) *faults.Rule
	}{
		{"its first claim write fails", func(_ *Handler, st *faults.State, _ *faults.Store) *faults.Rule {
			return st.Add(&faults.Rule{Match: faults.Method("Take"), Times: 1, Kind: faults.Fail})
		}},
		{"its lease statement's reply is lost", func(_ *Handler, _ *faults.State, sto *faults.Store) *faults.Rule {
			return sto.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Skip: 1, Times: 1, Kind: faults.LoseReply})
		}},
		{"its worker is stopped while it leases", func(h *Handler, _ *faults.State, sto *faults.Store) *faults.Rule {
			go func() { time.Sleep(20 * time.Millisecond); h.Stop() }()
			return sto.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 50 * time.Millisecond})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			f.deadRunUnderLostEpoch(t, 1, 2)
			r1, st, sto := f.faulty(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
			rule := tc.stop(r1, st, sto)
			_ = r1.RunBatch(ctx, f.id, 0)
			if rule.Hits() != 1 {
				t.Fatalf("the fault hit %d calls, want 1: this tests nothing", rule.Hits())
			}
			if n := f.provider.total(); n != 2 {
				t.Fatalf("%d messages after the takeover stopped, want the dead run's 2", n)
			}
			f.leaseExpired(t)
			r2, _, _ := f.faulty(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
			notFailure(t, r2.RunBatch(ctx, f.id, 0))
			f.runAll(t)
			f.assertOnce(t)
			for _, u := range []string{"u1", "u2"} {
				if st, _, _ := f.status(t, u); st != campaign.StatusUnknown {
					t.Errorf("%s, sent by the dead run, is %s, want unknown", u, st)
				}
			}
		})
	}
}

// The same through the sweep: its first claim write fails, and the next sweep must not free the chunk as
// never claimed.
func TestASweepThatCannotSettleASuspectChunkLeavesItSuspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	f.deadRunUnderLostEpoch(t, 1)
	h, st, _ := f.faulty(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
	rule := st.Add(&faults.Rule{Match: faults.Method("Take"), Times: 1, Kind: faults.Fail})
	_, _ = h.Sweep(ctx)
	if rule.Hits() != 1 {
		t.Fatalf("the fault hit %d claim writes, want 1: this tests nothing", rule.Hits())
	}
	f.leaseExpired(t)
	if _, err := h.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusUnknown {
		t.Errorf("u1, sent by the dead run, is %s, want unknown", st)
	}
}

// The same, then the campaign is cancelled: the suspect recipients are not closed as skipped with their
// codes back in the pool (a dead run may have sent u1 its code); a run settles them as unknown, and they
// keep their codes.
func TestACancelLeavesASuspectRecipientItsCode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	_, _, code1 := f.status(t, "u1")
	f.deadRunUnderLostEpoch(t, 1)
	r1, st, _ := f.faulty(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
	st.Add(&faults.Rule{Match: faults.Method("Take"), Times: 1, Kind: faults.Fail})
	_ = r1.RunBatch(ctx, f.id, 0)
	f.leaseExpired(t)
	if _, err := Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	status, reason, code := f.status(t, "u1")
	var released int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM released_codes rc JOIN promo_codes p ON p.id = rc.code_id WHERE p.code = $1`, code1).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if status != campaign.StatusUnknown || code != code1 || released != 0 {
		t.Fatalf("u1 (sent %s by the dead run) is %s (%s) holding %q, %s back in the pool: %v; want unknown, keeping it",
			code1, status, reason, code, code1, released > 0)
	}
	if c := f.counts(t); c.Pending != 0 {
		t.Errorf("counts %+v, want everyone settled", c)
	}
}

// Suspect recipients settled as unknown leave the chunk's suspects: `resume --resend-unknown` then sends
// them once more, as the operator asked, rather than finding them suspect again and settling them as
// unknown for ever. (The dead run had the whole chunk in hand: all five eligible are unknown.) Not within
// the in-flight grace of their settling, though: with their claims gone with Redis's data, the time they
// were recorded unknown is all that says how old the dead run's calls are, and a run that was only
// stopped may still be waiting for their answers. (Mutation: resending them at once, as before, resends
// the five within the grace.)
func TestAResendSendsASuspectRecipientOnceSettled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	f.deadRunUnderLostEpoch(t, 1)
	f.runAll(t)
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusUnknown || reason != campaign.Unverifiable {
		t.Fatalf("u1, sent by the dead run, is %s (%q), want unknown", st, reason)
	}
	rep, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
	if err != nil || rep.Resent != 0 || rep.StillInFlight != 5 {
		t.Fatalf("resume --resend-unknown right after the takeover: %+v, %v; want the 5 held back", rep, err)
	}
	if _, err := f.db.Exec(ctx, `UPDATE campaign_recipients SET updated_at = updated_at - interval '31 seconds' WHERE campaign_id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	// Past the in-flight grace, a receipt naming them may still come (ReceiptGrace): still held back.
	rep, err = Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
	if err != nil || rep.Resent != 0 || rep.StillInFlight != 0 || rep.AwaitingReceipts != 5 {
		t.Fatalf("resume --resend-unknown 31 s after the takeover: %+v, %v; want the 5 awaiting their receipts", rep, err)
	}
	if _, err := f.db.Exec(ctx, `UPDATE campaign_recipients SET updated_at = updated_at - $2 * interval '1 millisecond' WHERE campaign_id = $1`, f.id, ReceiptGrace.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	rep, err = Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
	if err != nil || rep.Resent != 5 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want the 5 unknown resent", rep, err)
	}
	f.runAll(t)
	if c := f.counts(t); c.Sent != 5 || c.Unknown != 0 || c.Pending != 0 {
		t.Errorf("counts %+v after the resend, want the 5 sent", c)
	}
	if n := len(f.provider.sentTo(phone(1))); n != 2 {
		t.Errorf("u1 got %d messages, want 2: the dead run's, and the resend the operator chose", n)
	}
}

// Each outcome the worker records names the provider it went through, for the report: the one-send path,
// and the path of windows of sends.
func TestOutcomesNameTheirProvider(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		f := plan(t, 10)
		h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = window })
		notFailure(t, h.RunBatch(context.Background(), f.id, 0))
		var sent, named int
		if err := f.db.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE provider = 'test')
			FROM campaign_recipients WHERE campaign_id = $1 AND status = 'sent'`, f.id).Scan(&sent, &named); err != nil {
			t.Fatal(err)
		}
		if sent == 0 || named != sent {
			t.Errorf("window %d: %d of %d sent recipients name their provider", window, named, sent)
		}
	}
}

// A run that leased a batch with a suspect still unsettled (not through a takeover: its lease was free)
// stops before settling it: the suspect is in none of its chunk in hand, and the batch's lease is let go,
// the suspect still marked. A cancel then must leave it to a run, which settles it as unknown with its
// code, rather than close it as cancelled and give back a code a dead run may have sent.
func TestACancelLeavesASuspectNoLeaseHoldsToARun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	_, _, code1 := f.status(t, "u1")
	if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET suspect_users = '{u1}', lease_users = '{}',
			lease_token = NULL, lease_until = NULL, lease_epoch = NULL
		WHERE campaign_id = $1 AND batch = 0`, f.id); err != nil {
		t.Fatal(err)
	}
	if _, err := Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	status, reason, code := f.status(t, "u1")
	if status != campaign.StatusUnknown || code != code1 {
		t.Fatalf("u1, suspect, is %s (%s) holding %q after the cancel; want unknown, keeping %s", status, reason, code, code1)
	}
	if n := f.provider.total(); n != 0 {
		t.Errorf("%d messages sent for a cancelled campaign", n)
	}
}
