package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// A receiver that answers 401, 403 or 404 for one user (an in-house webhook that does not take that user)
// refuses that user, not the account: the run's next send probes, is accepted, and the batch goes on; the
// refused user waits for a later run, its attempt counted. Here two neighbours of the batch are refused
// (the probe after the first is refused too, which held the batch in an outside check run). Before, such a refusal of the first recipient
// a worker sent to held the whole batch as provider_auth for good (an outside run: 360 recipients pending
// for minutes, until the campaign was cancelled). A refusal of every send is still the account's: the
// batch waits for the fix, and nobody's attempts are used.
func TestAnAccountLevelRefusalOfOneRecipientIsProbed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		window int
	}{{401, 8}, {403, 8}, {404, 8}, {401, 1}, {404, 1}} {
		t.Run(fmt.Sprintf("%d window %d", tc.status, tc.window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8, one chunk
			h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = tc.window })
			f.provider.fail = func(_ int, m providers.Message) error {
				// u1 and u2, neighbours in the batch: the probe after u1 is refused too.
				if m.To == phone(1) || m.To == phone(2) {
					return &providers.Error{Provider: "test", Status: tc.status, Class: providers.Permanent, Message: "unknown user"}
				}
				return nil
			}
			err := h.RunBatch(context.Background(), f.id, 0)
			var re *RetryError
			if !errors.As(err, &re) || strings.Contains(err.Error(), "refuses the account") {
				t.Fatalf("the run returned %v; want the batch back for u1 alone, not an account refusal", err)
			}
			for _, u := range []int{4, 7, 8} {
				if n := len(f.provider.accepted[phone(u)]); n != 1 {
					t.Errorf("u%d got %d messages, want 1", u, n)
				}
			}
			for _, u := range []string{"u1", "u2"} {
				st, _, _ := f.status(t, u)
				var attempts int
				if err := f.db.QueryRow(context.Background(), `SELECT attempts FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, f.id, u).Scan(&attempts); err != nil {
					t.Fatal(err)
				}
				if st != campaign.StatusPending || attempts != 1 {
					t.Fatalf("%s: %s after %d attempts; want pending for a later run, its attempt counted", u, st, attempts)
				}
			}
		})
	}
	t.Run("every send refused", func(t *testing.T) {
		t.Parallel()
		f := planWith(t, 8, nil)
		h, _, _ := f.faulty(t, nil)
		f.provider.fail = func(int, providers.Message) error {
			return &providers.Error{Provider: "test", Status: 401, Class: providers.Permanent, Message: "bad secret"}
		}
		err := h.RunBatch(context.Background(), f.id, 0)
		if err == nil || !strings.Contains(err.Error(), "refuses the account") {
			t.Fatalf("the run returned %v; want the account refused, the batch waiting for the fix", err)
		}
		if c := f.counts(t); c.Pending != 5 || c.Failed != 0 {
			t.Fatalf("counts %+v; want all 5 pending, none failed", c)
		}
		var attempts int
		if err := f.db.QueryRow(context.Background(), `SELECT coalesce(sum(attempts), 0) FROM campaign_recipients WHERE campaign_id = $1`, f.id).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		if attempts != 0 {
			t.Fatalf("%d attempts counted for a refused account; want none", attempts)
		}
		// The batch waits for the fix without using up its retries (it used them, and after about two
		// hours of wrong credentials it was in the dead-letter queue), and comes back soon after a
		// refusal that began moments ago, every 2 minutes after a long one.
		var re *RetryError
		if !errors.As(err, &re) || isFailure(err) || re.After != accountRetryMin {
			t.Fatalf("the run returned %#v; want a retry in %v that uses none of the batch's retries", err, accountRetryMin)
		}
		h.born = h.born.Add(-time.Hour)
		err = h.RunBatch(context.Background(), f.id, 0)
		if !errors.As(err, &re) || isFailure(err) || re.After != accountRetryMax {
			t.Fatalf("an hour into the refusal the run returned %#v; want a retry in %v that uses none of the batch's retries", err, accountRetryMax)
		}
	})
	// A batch of three recipients or fewer (a campaign's last, often) is all set aside for probes that
	// never come: nothing tells the account from the recipients, and the batch waits as for the account.
	// Before, it used up its retries under wrong credentials and went to the dead-letter queue, and status
	// never said provider_auth.
	for _, size := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("every send of a batch of %d refused", size), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 8, func(s *campaign.Spec) { s.BatchSize = size })
			h, _, _ := f.faulty(t, nil)
			var sends atomic.Int32
			f.provider.fail = func(int, providers.Message) error {
				sends.Add(1)
				return &providers.Error{Provider: "test", Status: 401, Class: providers.Permanent, Message: "bad secret"}
			}
			ctx := context.Background()
			for run := 1; run <= 3; run++ {
				err := h.RunBatch(ctx, f.id, 0)
				var re *RetryError
				if !errors.As(err, &re) || isFailure(err) || !strings.Contains(err.Error(), "refuses the account") {
					t.Fatalf("run %d returned %#v; want the account refused, a retry that uses none of the batch's retries", run, err)
				}
			}
			if n := sends.Load(); n != int32(3*size) {
				t.Fatalf("%d requests in 3 runs; want %d (each recipient once a run)", n, 3*size)
			}
			var attempts, pending int
			if err := f.db.QueryRow(ctx, `SELECT coalesce(sum(attempts), 0), count(*) FILTER (WHERE status = 'pending')
				FROM campaign_recipients WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&attempts, &pending); err != nil {
				t.Fatal(err)
			}
			if attempts != 0 || pending != size {
				t.Fatalf("%d attempts, %d of %d pending; want no attempt counted and all pending", attempts, pending, size)
			}
			// What status shows once the batches are queued and a worker runs.
			if notes, err := state.Waits(ctx, f.rdb, f.id); err != nil || notes[WaitProviderAuth].Reason != WaitProviderAuth {
				t.Fatalf("waiting notes %+v (%v); want provider_auth", notes, err)
			}
		})
	}
}
