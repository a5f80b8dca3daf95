package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// u4 and u7 are unknown (their answers were lost) and `resume --resend-unknown` makes them pending again.
// The resend's chunk is leased with no receipt yet; its first request is refused with a 429 asking for
// 1.5 s, and meanwhile the delivery receipt of u7's first message comes in. When the chunk goes on, more
// than a second after its lease, it reads its recipients again (consents, lease) with the same statement
// that reports receipts that arrived while pending (Chunk.Accepted): u7's first message is proven
// accepted, and u7 must not be sent a second time.
func TestAReceiptSeenByAReReadStopsTheResend(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			ctx := context.Background()
			h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = window })
			f.resentAfterLostAnswers(t, h)
			// The resend: its requests are refused (429, 1.5 s) until u7's receipt has come in, during the
			// first wait.
			var recorded atomic.Bool
			var receipt sync.Once
			f.provider.before = func(providers.Message) {
				receipt.Do(func() {
					go func() {
						time.Sleep(200 * time.Millisecond)
						if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u7",
							Address: phone(7), MessageID: "SMfirst-u7", Status: campaign.DeliveryDelivered}}); err != nil {
							t.Error(err)
						}
						recorded.Store(true)
					}()
				})
			}
			f.provider.fail = func(_ int, m providers.Message) error {
				if !recorded.Load() {
					return &providers.Error{Provider: "test", Status: 429, Throttled: true, RetryAfter: 1500 * time.Millisecond, Class: providers.Transient}
				}
				return nil
			}
			start := time.Now()
			notFailure(t, h.RunBatch(ctx, f.id, 0))
			if time.Since(start) < 1500*time.Millisecond {
				t.Fatalf("the resend took %v: no wait, this tests nothing", time.Since(start))
			}
			var delivery string
			if err := f.db.QueryRow(ctx, `SELECT coalesce(delivery, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u7'`, f.id).Scan(&delivery); err != nil {
				t.Fatal(err)
			}
			if delivery != campaign.DeliveryDelivered {
				t.Fatalf("u7's receipt was not recorded (delivery %q)", delivery)
			}
			if n := len(f.provider.sentTo(phone(7))); n != 1 {
				t.Errorf("u7's first message was proven delivered by a receipt the chunk's re-read saw, yet u7 reached the provider %d times", n)
			}
			if n := len(f.provider.sentTo(phone(4))); n != 2 {
				t.Errorf("u4 reached the provider %d times, want 2 (no evidence: resent)", n)
			}
			if st, _, _ := f.status(t, "u7"); st != campaign.StatusSent {
				t.Errorf("u7: %s, want sent", st)
			}
		})
	}
}

// The same on the e-mail path: a request of 4 is lost (unknown), resent by `resume --resend-unknown`;
// the resend's request is refused with a 429 asking for 1.5 s, user3's receipt for the first request
// arrives during the wait, and the request read again after the wait still carries user3.
func TestAReceiptSeenByAnEmailRequestsReReadStopsTheResend(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, store, id, p, h := planEmailDB(t, 4, 10, rdb)
	ctx := context.Background()
	p.fail = func(n int) error {
		switch n {
		case 1:
			return &providers.Error{Provider: "batch", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		case 2:
			return &providers.Error{Provider: "batch", Status: 429, Throttled: true, RetryAfter: 1500 * time.Millisecond, Class: providers.Transient}
		}
		return nil
	}
	notFailure(t, h.RunBatch(ctx, id, 0))
	unknown, err := store.Unknown(ctx, id)
	if err != nil || len(unknown) != 4 {
		t.Fatalf("unknown %v (%v), want the 4 of the lost request", unknown, err)
	}
	c, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForgetUnanswered(ctx, rdb, c, unknown, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := store.Resend(ctx, id, unknown); err != nil || n != 4 {
		t.Fatalf("resend moved %d (%v), want 4", n, err)
	}
	p.before = func(n int) {
		if n == 2 {
			go func() {
				time.Sleep(200 * time.Millisecond)
				if _, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "sendgrid", CampaignID: id, UserID: "u3",
					Address: "user3@example.com", MessageID: "Xfirst", Status: campaign.DeliveryDelivered}}); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	start := time.Now()
	notFailure(t, h.RunBatch(ctx, id, 0))
	if time.Since(start) < 1500*time.Millisecond {
		t.Fatalf("no wait (%v): this tests nothing", time.Since(start))
	}
	var delivery, st string
	if err := db.QueryRow(ctx, `SELECT coalesce(delivery, ''), status FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u3'`, id).Scan(&delivery, &st); err != nil {
		t.Fatal(err)
	}
	if delivery != campaign.DeliveryDelivered {
		t.Fatalf("u3's receipt not recorded (delivery %q)", delivery)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, req := range p.requests {
		for _, m := range req {
			if m.To == "user3@example.com" {
				n++
			}
		}
	}
	// Request 1 (lost, maybe accepted), request 2 (429, nothing accepted); a third would be a second e-mail.
	last := p.requests[len(p.requests)-1]
	for _, m := range last {
		if m.To == "user3@example.com" && len(p.requests) >= 3 {
			t.Errorf("u3's first e-mail was proven delivered by a receipt the request's re-read saw, yet the resend's request %d carried u3 again (u3 in %d requests; status %s)", len(p.requests), n, st)
		}
	}
}

// The same when the receipt comes in while the resend's claim is held up (Redis slow, 1.5 s): the
// consents, read with the chunk before the claim, are read again after it, with the recipients claimed,
// and the receipt read with them proves u7's first message: u7's claim says sent, and nothing is sent.
func TestAReceiptSeenAfterTheClaimStopsTheResend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		claim        string
		skip, window int
	}{{"ClaimSend", 1, 1}, {"ClaimWindow", 0, 8}} {
		t.Run(tc.claim, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			ctx := context.Background()
			h, fr, _ := f.faulty(t, func(c *Config) { c.SendWindow = tc.window })
			f.resentAfterLostAnswers(t, h)
			// u7's claim (the resend's second one a send, its first a window) is held 1.5 s, and u7's
			// receipt comes in meanwhile.
			stall := fr.Add(&faults.Rule{Match: faults.Method(tc.claim), Skip: tc.skip, Times: 1, Kind: faults.Stall, Delay: 1500 * time.Millisecond})
			go func() {
				waitUntil(t, 5*time.Second, "u7's claim held", func() bool { return stall.Hits() > 0 })
				time.Sleep(200 * time.Millisecond)
				if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u7",
					Address: phone(7), MessageID: "SMfirst-u7", Status: campaign.DeliveryDelivered}}); err != nil {
					t.Error(err)
				}
			}()
			notFailure(t, h.RunBatch(ctx, f.id, 0))
			if n := len(f.provider.sentTo(phone(7))); n != 1 {
				t.Errorf("u7's first message was proven delivered by a receipt read after its claim, yet u7 reached the provider %d times", n)
			}
			if n := len(f.provider.sentTo(phone(4))); n != 2 {
				t.Errorf("u4 reached the provider %d times, want 2 (no evidence: resent)", n)
			}
			if st, _, _ := f.status(t, "u7"); st != campaign.StatusSent {
				t.Errorf("u7: %s, want sent", st)
			}
		})
	}
}

// resentAfterLostAnswers runs batch 0 with h while the answers of u4's and u7's sends are lost (the
// provider accepted them), then does what `resume --resend-unknown` does: u4 and u7 are pending again,
// their claims forgotten. The provider accepts everything from then on.
func (f *fixture) resentAfterLostAnswers(t *testing.T, h *Handler) {
	t.Helper()
	ctx := context.Background()
	ambiguous := &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(4) || m.To == phone(7) {
			return ambiguous
		}
		return nil
	}
	notFailure(t, h.RunBatch(ctx, f.id, 0))
	unknown, err := f.store.Unknown(ctx, f.id)
	if err != nil || len(unknown) != 2 {
		t.Fatalf("unknown %v (%v), want u4 and u7", unknown, err)
	}
	if _, err := ForgetUnanswered(ctx, f.rdb, f.campaign(t), unknown, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.Resend(ctx, f.id, unknown); err != nil || n != 2 {
		t.Fatalf("resend moved %d (%v), want 2", n, err)
	}
	f.provider.fail = nil
}
