package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// A recipient whose send was ambiguous (unknown: the provider may have, and here did, accept it) keeps
// its campaign's frequency mark, so another capped campaign does not reach the person within the cap.
// After `resume --resend-unknown`, the provider refuses the resend transiently: the release of its mark
// keeps the mark of the first, possibly delivered, send. Before, ReleaseMarks matched the campaign, not
// the send: the first send's mark went with it, and the second campaign sent within the cap.
func TestATransientFailureOfAResendKeepsTheMarkOfTheUnknownSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, second := planTwoCapped(t)
	f.runWithUnknown(t, 1) // the provider accepted u1's message, its answer was lost
	if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
		t.Fatal(err)
	}
	// The resend meets 429s (nothing accepted): the claim and the mark are released, the batch waits.
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			return &providers.Error{Provider: "test", Status: 429, Code: 20429, RetryAfter: 10 * time.Millisecond, Class: providers.Transient}
		}
		return nil
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	t.Logf("resend run: %v", err)
	if got := len(f.provider.sentTo(phone(1))); got != 1 {
		t.Fatalf("u1 reached %d times before the second campaign, want 1", got)
	}
	// The second campaign, same people, cap 1h (the provider is fine again).
	f.provider.fail = nil
	if err := f.h.RunBatch(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.sentTo(phone(1)); len(got) > 1 {
		t.Fatalf("u1 got %d messages within the 1h frequency cap: %q", len(got), got)
	}
}
