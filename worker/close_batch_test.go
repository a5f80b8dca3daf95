package worker

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// resendDuringRun is the store of a batch run during which `resume --resend-unknown` moves one of the
// batch's recipients, sent and recorded by that run, back to pending: just before the run's closing check.
type resendDuringRun struct {
	*campaign.Store
	batch  int
	once   sync.Once
	resend func()
}

func (s *resendDuringRun) CloseBatch(ctx context.Context, id int64, batch int) (done, open bool, err error) {
	if batch == s.batch {
		s.once.Do(s.resend)
	}
	return s.Store.CloseBatch(ctx, id, batch)
}

// A recipient made pending again while its batch's run was sending, after the run loaded the batch, is
// not left behind: the resume's enqueue of the batch was refused (its task was running), so the run ends
// with a retry, and the next run sends it. The campaign completes only then.
func TestBatchMadePendingDuringItsRunRunsAgain(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	ctx := context.Background()
	last := f.batches - 1
	var user, address string
	if err := f.db.QueryRow(ctx, `SELECT user_id, address FROM campaign_recipients WHERE campaign_id = $1 AND batch = $2 ORDER BY user_id LIMIT 1`,
		f.id, last).Scan(&user, &address); err != nil {
		t.Fatal(err)
	}
	store := &resendDuringRun{Store: f.store, batch: last}
	store.resend = func() {
		// Its answer was lost, as far as Postgres knows: unknown, then resent (claims cleared first).
		if _, err := f.db.Exec(ctx, `UPDATE campaign_recipients SET status = 'unknown' WHERE campaign_id = $1 AND user_id = $2`, f.id, user); err != nil {
			t.Error(err)
		}
		if err := f.rdb.Del(ctx, ClaimKey(f.id, user)).Err(); err != nil {
			t.Error(err)
		}
		if n, err := f.store.Resend(ctx, f.id, []string{user}); err != nil || n != 1 {
			t.Errorf("resend moved %d (%v), want 1", n, err)
		}
	}
	h := NewHandler(Config{Store: store, Redis: f.rdb, Owner: "test", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}, ProviderRates: map[string]float64{}})
	for b := 0; b < last; b++ {
		if err := h.RunBatch(ctx, f.id, b); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
	}
	err := h.RunBatch(ctx, f.id, last)
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("the run during which %s was made pending again ended with %v, want a retry", user, err)
	}
	if c, err := f.store.Get(ctx, f.id); err != nil || c.State != campaign.StateRunning {
		t.Fatalf("campaign %+v (%v) with %s pending, want running", c, err, user)
	}
	if err := h.RunBatch(ctx, f.id, last); err != nil {
		t.Fatalf("the batch's next run: %v", err)
	}
	if n := len(f.provider.accepted[address]); n != 2 {
		t.Fatalf("%s reached the provider %d times, want 2 (the send, and the resend asked for)", user, n)
	}
	if st, _, _ := f.status(t, user); st != campaign.StatusSent {
		t.Fatalf("%s is %s, want sent", user, st)
	}
	if c, err := f.store.Get(ctx, f.id); err != nil || c.State != campaign.StateCompleted {
		t.Fatalf("campaign %+v (%v), want completed", c, err)
	}
}
