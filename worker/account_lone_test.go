package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// One recipient the provider refuses with an account-level code (a 401 of an in-house receiver, a
// Twilio 21606 for one destination) while it accepts the rest. The first run sets it aside, the next send
// is accepted, and its attempt counts. Each later run has it alone: nothing left to probe with. Its
// attempts never moved, and its batch came back every minute, its refused request each time, until the
// dead-letter queue (an outside run: 25 requests in 27 minutes). An earlier run having shown the refusal
// to be its own, each later one counts too, and it fails after its attempts. Last in its batch, it had no
// send after it in the first run either, and its attempts never moved at all: the run's sends answered
// before it show the account worked.
func TestARecipientRefusedAloneAtTheAccountLevelFailsAfterItsAttempts(t *testing.T) {
	t.Parallel()
	// u2 has a send after it in the first run; u8, last in its batch, has none: the provider answered
	// the run's sends before it, which shows the account worked.
	for _, i := range []int{2, 8} {
		t.Run(fmt.Sprintf("u%d", i), func(t *testing.T) {
			t.Parallel()
			refusedAloneFails(t, i)
		})
	}
}

func refusedAloneFails(t *testing.T, i int) {
	f := plan(t, 10) // batch 0: u1, u2, u4, u7, u8 eligible
	user := fmt.Sprintf("u%d", i)
	var refused atomic.Int32
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(i) {
			refused.Add(1)
			return &providers.Error{Provider: "test", Status: 401, Class: providers.Permanent, Message: "unknown user"}
		}
		return nil
	}
	runs := 0
	for ; runs < MaxRecipientAttempts+3; runs++ {
		err := f.h.RunBatch(context.Background(), f.id, 0)
		if err == nil {
			break
		}
		var re *RetryError
		if !errors.As(err, &re) {
			t.Fatalf("run %d: %v", runs+1, err)
		}
	}
	st, reason, _ := f.status(t, user)
	if st != campaign.StatusFailed {
		t.Fatalf("%s after %d runs: %s (%q), %d refused requests; want failed after %d", user, runs+1, st, reason, refused.Load(), MaxRecipientAttempts)
	}
	if n := refused.Load(); n != MaxRecipientAttempts {
		t.Errorf("%s's refused requests: %d, want %d (one a run)", user, n, MaxRecipientAttempts)
	}
	if c := f.counts(t); c.Sent != 4 || c.Pending != 0 {
		t.Errorf("counts %+v; want the 4 others sent, none pending", c)
	}
}
